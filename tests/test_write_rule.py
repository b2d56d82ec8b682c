"""What a run may write (spec_repro.writerule), held against the data-loss cases a probe from clean clones found:
each is refused before anything is written, or harmless, and the committed files stay byte-identical.

(a) ``reproduce -p ... --out .`` from the checkout's root; (b) a ``-p k=5`` run's rows merged by a later plain
``--only`` run into the committed table; (c) ``-p ... --figures figures``; (d) ``--figures DIR`` over a user's own
``summary.csv``/``SUMMARY.md``; (e) ``vllm summarize`` failing half-way over ``data/gpu``; and ``--raw``/``--out``
overlapping. Notebook execution is a stub here (no kernel): it writes what a notebook writes, a figure in
``figures_dir`` and summary rows in ``summary_path``, both naming the parameters it got."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import nbformat as nbf
import pytest

from spec_repro import reproduce as R
from spec_repro import writerule

from _cli import run_cli

NB = "05_oracle_bound"
FIXTURES = Path(__file__).parent / "fixtures" / "vllm"
REPO = Path(__file__).resolve().parent.parent


def _notebook(path: Path) -> None:
    n = nbf.v4.new_notebook()
    n.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    p = nbf.v4.new_code_cell("figures_dir = None\nsummary_path = None\nk = 3\nmax_fixed_k = 7")
    p.metadata["tags"] = ["parameters"]
    n.cells = [p, nbf.v4.new_code_cell("x = 1")]
    nbf.write(n, str(path))


@pytest.fixture()
def root(tmp_path, monkeypatch):
    """A checkout in miniature: the seven notebooks, committed figures and summaries, a README with the results
    markers, a data/ folder; SPEC_REPRO_ROOT points at it and the current folder is it."""
    r = tmp_path / "root"
    (r / "notebooks").mkdir(parents=True)
    (r / "figures").mkdir()
    (r / "data").mkdir()
    for n in R.NOTEBOOKS:
        _notebook(r / "notebooks" / f"{n}.ipynb")
        (r / "figures" / f"{n}.png").write_bytes(b"committed figure " + n.encode())
    (r / "figures" / f"{NB}.pdf").write_bytes(b"committed pdf")
    (r / "figures" / "SUMMARY.md").write_text("committed summary\n")
    (r / "figures" / "summary.csv").write_text("committed,csv\n")
    (r / "data" / "x.csv").write_text("a\n1\n")
    (r / "README.md").write_text(f"# toy\n\n{R.README_MARKERS[0]}\n\ncommitted table\n{R.README_MARKERS[1]}\n")
    monkeypatch.setenv("SPEC_REPRO_ROOT", str(r))
    monkeypatch.chdir(r)
    return r


@pytest.fixture()
def stub(monkeypatch):
    """papermill's execution replaced: the executed notebook (with an injected cell naming the parameters), a
    figure NAME.png and NAME.pdf in figures_dir and one summary row, each saying which parameters made it."""
    import papermill as pm

    from spec_repro.findings import SummaryRow, write_summary

    calls = []

    def execute(src, dst, parameters=None, **kw):
        name = Path(dst).stem
        calls.append((name, dict(parameters)))
        made = {k: v for k, v in parameters.items() if k not in R.RUNNER_PARAMETERS}
        nb = nbf.read(src, as_version=4)
        cell = nbf.v4.new_code_cell(f"# injected {parameters}")
        cell.metadata["tags"] = ["injected-parameters"]
        nb.cells.insert(1, cell)
        nbf.write(nb, dst)
        fig = Path(parameters["figures_dir"])
        for ext in ("png", "pdf"):
            (fig / f"{name}.{ext}").write_bytes(f"figure made with {made}".encode())
        write_summary([SummaryRow(f"{name[1]} test", f"q {name}", "paper", f"run with {made}", "stub", 1.0)],
                      parameters["summary_path"])

    monkeypatch.setattr(pm, "execute_notebook", execute)
    return calls


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


cli = run_cli


def _refused(code: int, err: str, *needles: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code != 0 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], lines[0]


# ---- (a) --out . from the checkout's root --------------------------------------------------------------------
@pytest.mark.parametrize("out", [".", "..", "notebooks", "figures", "figures/published", "data/gpu"])
def test_a_run_with_parameters_never_writes_into_the_checkout(root, stub, capsys, out):
    before = snapshot(root)
    code, _out, err = cli(["reproduce", "-p", "max_fixed_k=3", "--only", NB, "--out", out], capsys)
    _refused(code, err, f"--out {out}")
    assert not stub and snapshot(root) == before


def test_a_plain_run_refuses_an_out_on_the_checkout_too(root, stub, capsys):
    """--out . would put the executed notebooks (injected cell, absolute paths) over notebooks/NAME.ipynb."""
    before = snapshot(root)
    code, _out, err = cli(["reproduce", "--only", NB, "--out", "."], capsys)
    _refused(code, err, "--out .", "checkout")
    assert not stub and snapshot(root) == before


# ---- (b) a plain --only run after a -p run into the same --out ----------------------------------------------
def test_b_rows_made_with_parameters_never_reach_the_committed_table(root, stub, capsys, tmp_path):
    out = tmp_path / "O"
    before = snapshot(root)
    code, printed, err = cli(["reproduce", "-p", "k=5", "--out", out], capsys)
    assert code == 0, err
    assert snapshot(root) == before                           # a -p run leaves every committed file alone
    assert "--figures" not in printed and f"wrote under --out" in printed   # and says where it wrote
    assert (out / "figures" / f"{NB}.png").exists() and "'k': 5" in (out / "figures" / "SUMMARY.md").read_text()
    assert "`k` = `5`" in (out / "summary.md").read_text()
    code, printed, err = cli(["reproduce", "--only", NB, "--out", out], capsys)
    assert code == 0, err
    for f in ("README.md", "figures/SUMMARY.md", "figures/summary.csv"):
        assert (root / f).read_bytes() == before[f], f      # the k=5 rows of the other six were not merged
    assert "left as they were" in printed
    md = (out / "summary.md").read_text()
    assert "'k': 5" not in md and "q 05_oracle_bound" in md    # the plain table holds this run's rows only
    # what a plain run does refresh: the notebook it ran (cleaned) and its figures
    assert b"injected" not in (root / "notebooks" / f"{NB}.ipynb").read_bytes()
    assert (root / "figures" / f"{NB}.png").read_bytes() == b"figure made with {}"


def test_b_a_run_with_parameters_merges_no_other_run(root, stub, capsys, tmp_path):
    out = tmp_path / "O"
    assert cli(["reproduce", "-p", "k=5", "--out", out], capsys)[0] == 0
    assert cli(["reproduce", "-p", "k=4", "--only", NB, "--out", out], capsys)[0] == 0
    md = (out / "summary.md").read_text()
    assert "'k': 5" not in md and "`k` = `4`" in md
    assert len((out / "summary.csv").read_text().splitlines()) == 2       # header + this run's one row


# ---- (c) -p with --figures figures ---------------------------------------------------------------------------
@pytest.mark.parametrize("figures", ["figures", "./figures/", "figures/published", "notebooks", "."])
def test_c_figures_never_names_the_committed_folders(root, stub, capsys, tmp_path, figures):
    before = snapshot(root)
    code, _out, err = cli(["reproduce", "-p", "max_fixed_k=3", "--figures", figures, "--only", NB,
                           "--out", tmp_path / "O"], capsys)
    _refused(code, err, f"--figures {figures}")
    assert not stub and snapshot(root) == before


# ---- (d) --figures DIR holding the user's own summaries -------------------------------------------------------
@pytest.mark.parametrize("name", writerule.SUMMARY_FILES)
def test_d_a_figures_folder_keeps_summaries_it_did_not_get_from_us(root, stub, capsys, tmp_path, name):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / name).write_text("my own notes\n")
    code, _out, err = cli(["reproduce", "--figures", mine, "--only", NB, "--out", tmp_path / "O"], capsys)
    _refused(code, err, "--figures", name, "did not write")
    assert not stub and snapshot(mine) == {name: b"my own notes\n"}


def test_d_a_figures_folder_the_package_wrote_is_written_again_until_edited(root, stub, capsys, tmp_path):
    figs = tmp_path / "figs"
    assert cli(["reproduce", "--figures", figs, "--only", NB, "--out", tmp_path / "O"], capsys)[0] == 0
    assert (figs / "SUMMARY.md").exists() and (figs / writerule.MARKER).exists()
    assert cli(["reproduce", "--figures", figs, "--only", NB, "--out", tmp_path / "O"], capsys)[0] == 0
    (figs / "summary.csv").write_text("edited by hand\n")
    code, _out, err = cli(["reproduce", "--figures", figs, "--only", NB, "--out", tmp_path / "O"], capsys)
    _refused(code, err, "summary.csv")
    assert (figs / "summary.csv").read_text() == "edited by hand\n"


# ---- (e) vllm summarize failing half-way -----------------------------------------------------------------------
@pytest.fixture()
def gpu_root(tmp_path, monkeypatch):
    """A checkout holding a copy of data/gpu's own files (not its run folders)."""
    r = tmp_path / "root"
    gpu = r / "data" / "gpu"
    gpu.mkdir(parents=True)
    for p in (REPO / "data" / "gpu").iterdir():
        if p.is_file():
            shutil.copy2(p, gpu / p.name)
    shutil.copytree(REPO / "data" / "gpu" / "configs", gpu / "configs")
    monkeypatch.setenv("SPEC_REPRO_ROOT", str(r))
    monkeypatch.chdir(r)
    return r


def test_e_a_failed_summarize_leaves_data_gpu_untouched(gpu_root, capsys):
    gpu = gpu_root / "data" / "gpu"
    before = snapshot(gpu)
    code, _out, err = cli(["vllm", "summarize", "--raw", FIXTURES], capsys)   # default --out data/gpu
    assert code != 0 and "fit drafting" in err, err            # the fixture's steps cannot fit a drafting cost
    assert snapshot(gpu) == before                             # MANIFEST.json and its sha256s included
    assert sorted(p.name for p in gpu.iterdir()) == sorted({k.split("/")[0] for k in before})  # no stage left


def test_staged_dir_swaps_in_whole_or_not_at_all(tmp_path):
    from spec_repro.io import staged_dir

    out = tmp_path / "out"
    out.mkdir()
    (out / "a.csv").write_text("old a\n")
    (out / "keep.txt").write_text("kept\n")
    (out / "MANIFEST.json").write_text('{"a.csv": "old"}\n')
    with pytest.raises(RuntimeError):
        with staged_dir(out) as stage:
            assert json.loads((stage / "MANIFEST.json").read_text()) == {"a.csv": "old"}   # seeded
            (stage / "a.csv").write_text("new a\n")
            raise RuntimeError("a writer failed")
    assert snapshot(out) == {"a.csv": b"old a\n", "keep.txt": b"kept\n", "MANIFEST.json": b'{"a.csv": "old"}\n'}
    with staged_dir(out) as stage:
        (stage / "a.csv").write_text("new a\n")
        (stage / "MANIFEST.json").write_text('{"a.csv": "new"}\n')
    assert snapshot(out) == {"a.csv": b"new a\n", "keep.txt": b"kept\n", "MANIFEST.json": b'{"a.csv": "new"}\n'}
    with pytest.raises(RuntimeError):
        with staged_dir(tmp_path / "new"):
            raise RuntimeError("x")
    assert not (tmp_path / "new").exists()


# ---- --raw and --out overlapping ---------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["same", "inside", "holds"])
def test_raw_and_out_may_not_overlap(tmp_path, capsys, where):
    raw = tmp_path / "R"
    shutil.copytree(FIXTURES, raw)
    out = {"same": raw, "inside": raw / "summary", "holds": tmp_path}[where]
    before = snapshot(tmp_path)
    code, _out, err = cli(["vllm", "summarize", "--raw", raw, "--out", out], capsys)
    _refused(code, err, "overlap")
    assert snapshot(tmp_path) == before
    from spec_repro.engines.vllm.summary import summarize
    from spec_repro.io import OutputError

    with pytest.raises(OutputError, match="overlap"):
        summarize(raw, out)


# ---- the rule itself -----------------------------------------------------------------------------------------------
def test_is_plain_and_mergeable(tmp_path):
    assert writerule.is_plain("embedded", None, None) and writerule.is_plain("embedded", {}, None)
    assert not writerule.is_plain("embedded", {"k": 5}, None)
    assert not writerule.is_plain("embedded", {"traces": ["x.jsonl"]}, None)
    assert not writerule.is_plain("embedded", None, "figs")
    assert not writerule.is_plain("gpu", None, None)
    s = tmp_path / "n.json"
    s.write_text("[]")
    plain = writerule.config("embedded", None)
    assert not writerule.mergeable(s, plain, True)                  # of unknown origin
    writerule.record_config(s, writerule.config("embedded", {"k": 5}))
    assert not writerule.mergeable(s, plain, True)
    writerule.record_config(s, plain)
    assert writerule.mergeable(s, plain, True) and not writerule.mergeable(s, plain, False)


def test_a_summary_pair_is_swapped_in_whole(root, stub, tmp_path, monkeypatch):
    """summary.md/SUMMARY.md and summary.csv are written together: a failure writing the CSV leaves the earlier
    pair, never a new markdown beside an old CSV."""
    import pandas as pd

    out, figs = tmp_path / "O", tmp_path / "figs"
    R.reproduce("embedded", out, figures_dir=figs, notebooks=[NB], parameters={"k": 5}, progress=False)
    before = snapshot(out), snapshot(figs)

    def fail(self, *a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(pd.DataFrame, "to_csv", fail)
    with pytest.raises(OSError, match="disk full"):
        R.reproduce("embedded", out, figures_dir=figs, notebooks=[NB], parameters={"k": 4}, progress=False)
    for folder, old in zip((out, figs), before):
        new = snapshot(folder)
        for name in ("summary.md", "SUMMARY.md", "summary.csv"):
            assert new.get(name) == old.get(name), (folder, name)
        assert not [p for p in folder.iterdir() if p.name.startswith(".stage.")]
