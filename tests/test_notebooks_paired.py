"""The notebooks are jupytext pairs: ``notebooks/NAME.py`` (percent format, the source to edit) and ``NAME.ipynb``
(the same cells, with the outputs of the last `spec-repro reproduce`). Also the parameter plumbing of reproduce."""
from __future__ import annotations

import json
from pathlib import Path

import jupytext
import nbformat
import pytest

from spec_repro.reproduce import NOTEBOOKS, clean_executed, notebooks_dir, parse_parameters

NB = notebooks_dir()


def _cells(nb):
    return [(c.cell_type, c.source.strip(), sorted(c.metadata.get("tags", []))) for c in nb.cells]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_pair_in_sync(name):
    py, ipynb = NB / f"{name}.py", NB / f"{name}.ipynb"
    assert py.exists() and ipynb.exists(), f"{name}: both {py.name} and {ipynb.name} must be committed"
    a, b = jupytext.read(py), nbformat.read(str(ipynb), as_version=4)
    assert _cells(a) == _cells(b), (f"{name}.py and {name}.ipynb differ: after editing one, run "
                                    f"`jupytext --sync notebooks/{name}.ipynb` (or save in JupyterLab with jupytext)")
    assert b.metadata.get("jupytext", {}).get("formats") == "ipynb,py:percent"
    # the header names no jupytext version: a newer jupytext would rewrite the .py on every save in JupyterLab
    assert "jupytext_version:" not in py.read_text() and b.metadata["jupytext"].get(
        "notebook_metadata_filter") == "-jupytext.text_representation.jupytext_version"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_notebook_carries_outputs_and_checks_its_numbers(name):
    nb = nbformat.read(str(NB / f"{name}.ipynb"), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert any(c.get("outputs") for c in code), f"{name}.ipynb has no outputs: run `spec-repro reproduce`"
    checked = [c for c in code if "nbval-check-output" in c.metadata.get("tags", [])]
    assert checked and all(c.get("outputs") for c in checked), f"{name}: the findings cell must be tagged and ran"
    assert "papermill" not in nb.metadata and not any("injected-parameters" in c.metadata.get("tags", [])
                                                      for c in nb.cells)
    params = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1
    for line in params[0].source.splitlines():  # papermill cannot parse a comment holding '='
        assert "=" not in line.partition("#")[2], f"{name}: parameter comment with '=': {line!r}"


def test_parse_parameters_yaml_values():
    got = parse_parameters(["k=5", "batch_sizes=[1, 32]", "model=qwen", "traces=null", "also_h200_fit=false",
                            "cost_model=data/x=y.json"])
    assert got == {"k": 5, "batch_sizes": [1, 32], "model": "qwen", "traces": None, "also_h200_fit": False,
                   "cost_model": "data/x=y.json"}
    for bad, msg in (("k", "NAME=VALUE"), ("1k=2", "NAME=VALUE"), ("batch_sizes=[1, 32", "not a YAML value")):
        with pytest.raises(ValueError, match=msg):
            parse_parameters([bad])


def test_clean_executed_strips_what_changes_between_runs(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.metadata.update(papermill={"start_time": "x"}, language_info={"name": "python", "version": "3.11.7"})
    inj = nbformat.v4.new_code_cell("figures_dir = '/tmp/abc'")
    inj.metadata["tags"] = ["injected-parameters"]
    c = nbformat.v4.new_code_cell("1 + 1")
    c.metadata.update(papermill={"duration": 0.1}, execution={"iopub.status.busy": "t"})
    inj.execution_count = 1
    c.execution_count = 2
    c.outputs = [nbformat.v4.new_output("execute_result", {"text/plain": "2"}, execution_count=2)]
    nb.cells = [inj, c]
    nbformat.write(nb, str(tmp_path / "in.ipynb"))
    clean_executed(tmp_path / "in.ipynb", tmp_path / "out.ipynb")
    out = json.loads((tmp_path / "out.ipynb").read_text())
    assert ["".join(x["source"]) for x in out["cells"]] == ["1 + 1"]
    assert out["cells"][0]["metadata"] == {} and "".join(out["cells"][0]["outputs"][0]["data"]["text/plain"]) == "2"
    assert out["metadata"] == {"language_info": {"name": "python", "version": "3.11.7"}}
    assert out["cells"][0]["execution_count"] == 1 and out["cells"][0]["outputs"][0]["execution_count"] == 1


def test_unknown_parameter_is_one_line_before_anything_runs(tmp_path):
    from spec_repro.reproduce import reproduce

    with pytest.raises(ValueError, match=r"unknown notebook parameter\(s\) \['bogus'\]: the notebooks declare .*'max_fixed_k'"):
        reproduce("embedded", tmp_path / "out", figures_dir=tmp_path / "figs", notebooks=["05_oracle_bound"],
                  parameters={"bogus": 1}, progress=False)
    assert not list((tmp_path / "out" / "notebooks").glob("*")), "nothing left behind"


def test_a_run_in_jupyterlab_changes_only_outputs(tmp_path):
    """JupyterLab's side, without a browser: jupytext's contents manager (what `jupyter lab` uses with jupytext)
    opens a committed notebook, the kernel runs every cell, the contents manager saves it. The committed bytes
    come back unchanged: the .py (sources) and the .ipynb (outputs equal the committed ones on the same data)."""
    pytest.importorskip("jupyter_server")
    from jupyter_server.services.contents.largefilemanager import LargeFileManager
    from jupytext.sync_contentsmanager import build_sync_jupytext_contents_manager_class
    from nbclient import NotebookClient

    name = "04_ngram_overlap"
    for ext in (".py", ".ipynb"):
        (tmp_path / f"{name}{ext}").write_bytes((NB / f"{name}{ext}").read_bytes())
    cm = build_sync_jupytext_contents_manager_class(LargeFileManager)(root_dir=str(tmp_path))
    nb = nbformat.from_dict(cm.get(f"{name}.ipynb")["content"])
    NotebookClient(nb, record_timing=False, resources={"metadata": {"path": str(NB)}}).execute()
    cm.save({"type": "notebook", "content": nb}, f"{name}.ipynb")
    assert (tmp_path / f"{name}.py").read_bytes() == (NB / f"{name}.py").read_bytes()
    a, b = nbformat.read(str(NB / f"{name}.ipynb"), 4), nbformat.read(str(tmp_path / f"{name}.ipynb"), 4)
    assert [(c.cell_type, c.source, c.id, c.metadata) for c in a.cells] == \
        [(c.cell_type, c.source, c.id, c.metadata) for c in b.cells]
    for m in (a.metadata, b.metadata):  # the kernel writes its own Python version there
        m.get("language_info", {}).pop("version", None)
    assert a.metadata == b.metadata

    def text(n):  # outputs without images (a new matplotlib may draw other pixels; nbval leaves them lax too)
        return [[{k: (v if k != "data" else {m: d for m, d in v.items() if not m.startswith("image/")})
                  for k, v in o.items()} for o in c.get("outputs", [])] for c in n.cells]
    assert text(b) == text(a), "only outputs may change, and on the same data their text does not"


def test_jupyter_folders_are_isolated(jupyter_dirs):
    """Tests never write the user's Jupyter or IPython folders: the root conftest points them at a temporary
    tree, and Jupyter resolves its config and data paths there."""
    import os
    from pathlib import Path

    from jupyter_core.paths import jupyter_config_dir, jupyter_data_dir, jupyter_runtime_dir

    home = Path.home()
    for var, d in jupyter_dirs.items():
        assert os.environ[var] == str(d) and home not in d.parents and d.is_dir(), var
    assert Path(jupyter_config_dir()) == jupyter_dirs["JUPYTER_CONFIG_DIR"]
    assert Path(jupyter_data_dir()) == jupyter_dirs["JUPYTER_DATA_DIR"]
    assert Path(jupyter_runtime_dir()) == jupyter_dirs["JUPYTER_RUNTIME_DIR"]
