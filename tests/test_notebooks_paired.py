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
    c.outputs = [nbformat.v4.new_output("execute_result", {"text/plain": "2"}, execution_count=1)]
    nb.cells = [inj, c]
    nbformat.write(nb, str(tmp_path / "in.ipynb"))
    clean_executed(tmp_path / "in.ipynb", tmp_path / "out.ipynb")
    out = json.loads((tmp_path / "out.ipynb").read_text())
    assert ["".join(x["source"]) for x in out["cells"]] == ["1 + 1"]
    assert out["cells"][0]["metadata"] == {} and "".join(out["cells"][0]["outputs"][0]["data"]["text/plain"]) == "2"
    assert out["metadata"] == {"language_info": {"name": "python"}}


def test_unknown_parameter_is_one_line_before_anything_runs(tmp_path):
    from spec_repro.reproduce import reproduce

    with pytest.raises(ValueError, match=r"unknown notebook parameter\(s\) \['bogus'\]: the notebooks declare .*'k'"):
        reproduce("embedded", tmp_path / "out", figures_dir=tmp_path / "figs", notebooks=["05_oracle_bound"],
                  parameters={"bogus": 1}, progress=False)
    assert not list((tmp_path / "out" / "notebooks").glob("*")), "nothing left behind"
