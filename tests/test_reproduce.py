"""spec-repro reproduce: runs notebooks through papermill, names a failing cell, keeps going, writes the summary;
and the real notebooks give the same summary numbers when re-run on the same committed inputs."""
import json
import os
import subprocess
import sys

import nbformat as nbf
import pandas as pd
import pytest

from spec_repro import reproduce as R
from spec_repro import writerule
from spec_repro.analysis import repo_root


def _notebook(path, cells):
    n = nbf.v4.new_notebook()
    n.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    p = nbf.v4.new_code_cell("figures_dir = None\nsummary_path = None")
    p.metadata["tags"] = ["parameters"]
    n.cells = [p] + [nbf.v4.new_code_cell(c) for c in cells]
    nbf.write(n, path)


@pytest.fixture()
def toy_root(tmp_path, monkeypatch):
    """A throw-away repo root with two tiny notebooks: one fails in its third cell, one succeeds."""
    (tmp_path / "notebooks").mkdir()
    _notebook(tmp_path / "notebooks" / "01_proposers_vs_batch.ipynb",
              ["x = 1", "raise ValueError('deliberate failure for the test')", "print('never')"])
    _notebook(tmp_path / "notebooks" / "03_acceptance_behavior.ipynb",
              ["from spec_repro.analysis import SummaryRow, write_summary",
               "write_summary([SummaryRow('3 test', 'q', 'paper', 'run', 'toy notebook', 1.0)], summary_path)"])
    monkeypatch.setenv("SPEC_REPRO_ROOT", str(tmp_path))
    return tmp_path


def test_failure_names_cell_and_others_still_run(toy_root, tmp_path):
    out = tmp_path / "out"
    results, table = R.reproduce("embedded", out, figures_dir=tmp_path / "figs",
                                 notebooks=["01_proposers_vs_batch", "03_acceptance_behavior"], progress=False)
    bad, good = results
    assert not bad.ok and good.ok
    assert "cell 2" in bad.error and "ValueError" in bad.error and "deliberate failure" in bad.error
    assert (out / "notebooks" / "01_proposers_vs_batch.ipynb").exists()  # the partial notebook is kept
    assert table["finding"].tolist() == ["3 test"]
    md = (out / "summary.md").read_text()
    assert "| q | — | run |  | B1 |" in md and "- **B1**: toy notebook" in md
    assert "Failed notebooks" in md and "01_proposers_vs_batch" in md
    assert pd.read_csv(out / "summary.csv")["this_run"].tolist() == ["run"]


def test_cli_exit_code_nonzero_on_failure(toy_root, tmp_path):
    env = {**os.environ, "SPEC_REPRO_ROOT": str(toy_root)}
    r = subprocess.run([sys.executable, "-m", "spec_repro.cli", "reproduce", "--out", str(tmp_path / "o"),
                        "--figures", str(tmp_path / "f"), "--only", "01_proposers_vs_batch"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    assert "FAILED" in r.stdout and "cell 2" in r.stdout


def test_a_partial_publishing_run_keeps_the_committed_table(toy_root, tmp_path):
    """`reproduce --only X` into a fresh --out has no summary of the other notebooks: it refreshes X's notebook
    and figures but leaves figures/SUMMARY.md, summary.csv and the README's table as they were (they would lose
    every other notebook's rows), and says so; once --out holds every other notebook's summary, it writes them."""
    figs = toy_root / "figures"
    figs.mkdir()
    (figs / "SUMMARY.md").write_text("KEEP\n")
    (figs / "summary.csv").write_text("KEEP\n")
    out = tmp_path / "fresh"
    results, table = R.reproduce("embedded", out, notebooks=["03_acceptance_behavior"], progress=False)
    assert results[0].ok, results[0].error
    assert (figs / "SUMMARY.md").read_text() == "KEEP\n" and (figs / "summary.csv").read_text() == "KEEP\n"
    assert "left as they were" in table.attrs["kept"] and "01_proposers_vs_batch" in table.attrs["kept"]
    assert (out / "summary.md").read_text().count("toy notebook") == 1          # --out has this run's table
    assert not any(p.endswith("SUMMARY.md") for _k, p in table.attrs["written"])
    for n in R.NOTEBOOKS:                  # an earlier full run into the same --out left every other summary
        if n != "03_acceptance_behavior":
            (out / "summary" / f"{n}.json").write_text("[]")
    _results, table = R.reproduce("embedded", out, notebooks=["03_acceptance_behavior"], progress=False)
    assert "left as they were" in table.attrs["kept"]           # ... but not recorded as made by a plain run
    for n in R.NOTEBOOKS:
        if n != "03_acceptance_behavior":
            writerule.record_config(out / "summary" / f"{n}.json", writerule.config("embedded", None))
    _results, table = R.reproduce("embedded", out, notebooks=["03_acceptance_behavior"], progress=False)
    assert table.attrs["kept"] == "" and "toy notebook" in (figs / "SUMMARY.md").read_text()


def test_a_run_on_other_traces_skips_the_notebooks_that_read_none(toy_root, tmp_path):
    """With traces=, a notebook declaring no `traces` parameter (02) is not run: its figures and rows would be the
    default run's, copied beside the traces' own (as figures/published/02_* once were)."""
    _notebook(toy_root / "notebooks" / "02_verification_bottleneck.ipynb",
              ["from spec_repro.analysis import SummaryRow, write_summary",
               "write_summary([SummaryRow('2 test', 'q2', 'paper', 'run', 'no traces', 1.0)], summary_path)"])
    nb3 = toy_root / "notebooks" / "03_acceptance_behavior.ipynb"
    n = nbf.read(nb3, as_version=4)
    n.cells[0].source += "\ntraces = None"
    nbf.write(n, nb3)
    out = tmp_path / "o"
    results, table = R.reproduce("embedded", out, figures_dir=tmp_path / "f", parameters={"traces": ["x.jsonl"]},
                                 notebooks=["02_verification_bottleneck", "03_acceptance_behavior"], progress=False)
    assert [r.name for r in results] == ["03_acceptance_behavior"]
    assert table["finding"].tolist() == ["3 test"]
    assert not (out / "summary" / "02_verification_bottleneck.json").exists()
    assert "02_verification_bottleneck" in R.TRACE_FREE


def test_unknown_profile_and_notebook(toy_root, tmp_path):
    with pytest.raises(ValueError, match="unknown profile"):
        R.reproduce("cloud", tmp_path)
    with pytest.raises(FileNotFoundError, match="no such notebook"):
        R.reproduce("embedded", tmp_path, notebooks=["99_nope"])


def test_real_notebook_is_deterministic(tmp_path):
    """Notebook 05 (simulation over a committed real trace) twice: identical summary rows and values."""
    if os.environ.get("SPEC_REPRO_ROOT"):
        pytest.skip("SPEC_REPRO_ROOT points elsewhere")
    name = "05_oracle_bound"
    trace = repo_root() / "data" / "traces" / "smollm2-135m__code-edit.parquet"  # recorded: SmolLM2, torch engine
    runs = []
    for i in range(2):
        results, table = R.reproduce("embedded", tmp_path / f"run{i}", figures_dir=tmp_path / f"fig{i}",
                                     notebooks=[name], progress=False, parameters={"traces": str(trace)})
        assert results[0].ok, results[0].error
        runs.append(table)
    assert len(runs[0]) > 0
    pd.testing.assert_frame_equal(runs[0], runs[1])
    rows = json.loads((tmp_path / "run0" / "summary" / f"{name}.json").read_text())
    assert all(r["source"] for r in rows) and any(r["value"] is not None for r in rows)


@pytest.mark.parametrize("name", R.NOTEBOOKS)
def test_notebooks_are_parameterized(name):
    """Each notebook has a papermill `parameters` cell declaring what `reproduce` injects, and ends by writing its
    summary rows (outputs and the jupytext pairing: tests/test_notebooks_paired.py)."""
    path = repo_root() / "notebooks" / f"{name}.ipynb"
    nb = nbf.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    params = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1
    for var in ("figures_dir = None", "summary_path = None", "backend = "):
        assert var in params[0].source
    assert "write_summary(" in code[-1].source
    md = nb.cells[0].source
    assert "**Paper**" in md and "**This notebook**" in md
