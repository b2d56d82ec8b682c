"""Every parameter a notebook declares acts: each notebook is run with each of its parameters changed, one at a
time, and some output (printed text, displayed values, figures, the summary rows, files written) differs from the
run without the change. ``figures_dir`` and ``summary_path`` act only by writing files, each its own: they share
one run per notebook, and each is checked by the files it wrote.

The notebooks run in this process (IPython's shell, the Agg backend), not in a kernel per run: the same code cells
as papermill runs, with papermill's rule for parameters (the values are assigned after the parameters cell), on
the committed traces narrowed to one small workload so that a run takes about a second. Parameters that act only
on a live run (``backend``, ``live_*``) are changed on a live baseline (the torch engine decoding SmolLM2 on the
CPU, one request of a few tokens); ``backend="vllm"`` needs a GPU host with vLLM and is not run here."""
from __future__ import annotations

import functools
import hashlib
import io
import json
import re

import jupytext
import matplotlib
import pytest

from spec_repro import reproduce as R
from spec_repro.paths import data_dir, repo_root, v1_runner_dir

matplotlib.use("Agg")

NB = repo_root() / "notebooks"
TRACE = "smollm2-135m__code-edit.parquet"

# The baseline: the committed SmolLM2 code-edit trace (40 requests), small grids.
BASE = {"model": "smollm2", "datasets": ["code-edit"], "batch_sizes": [1, 8], "max_fixed_k": 4,
        "also_h200_fit": False}
# A live baseline for the parameters that act only on a live run.
# (mt-bench: short prompts, so a live run decodes in about half the time code-edit's prompts take; what a live
# parameter changes does not depend on the workload)
LIVE = {"backend": "torch", "model": "smollm2-135m", "datasets": ["mt-bench"], "proposers": ["ngram", "early-exit"],
        "live_requests": 1, "live_max_new_tokens": 6, "batch_sizes": [1, 8], "max_fixed_k": 4,
        "also_h200_fit": False, "other_proposer": "early-exit"}
LIVE_ONLY = {"backend", "live_requests", "live_max_new_tokens"}
# adaptive-learned cross-validates over requests: it needs at least 10 per workload
LIVE_FOR = {"07_adaptive": {"live_requests": 10}}
# notebook 07 takes n-gram and the EAGLE-class proposer by default: another pair changes its proposers
CHANGED_FOR = {"07_adaptive": {"proposers": ["ngram", "early-exit"]}}
# out-of-sample thresholds need a second model to tune on (with one model and the committed traces they are off)
BASE_FOR = {("07_adaptive", "out_of_sample"): {"model": None, "seeds": [42]}}


def _base(name: str, live: bool) -> dict:
    d = _declared(name)
    return {k: v for k, v in ({**LIVE, **LIVE_FOR.get(name, {})} if live else BASE).items() if k in d}


def _changed(tmp_path) -> dict:
    """The changed value of each parameter (``figures_dir`` / ``summary_path``: None -> a path)."""
    import pandas as pd

    from spec_repro.tracefiles import read_trace

    sub = tmp_path / "sub"
    sub.mkdir(exist_ok=True)
    t = read_trace(data_dir() / "traces" / TRACE)
    keep = sorted(t.requests["request_id"].unique())[:12]
    _subset(t, keep).to_parquet(sub / TRACE)
    steps = pd.read_parquet(data_dir() / "gpu" / "steps.parquet")
    steps[steps["model"].astype(str).str.startswith("llama31-8b")].to_parquet(tmp_path / "steps.parquet")
    # a GPU profile's outputs (reproduce --profile gpu): vLLM batch runs with a step log beside them (the
    # committed Llama-dims runs of `3-plugin-v3`), and another live folder (the committed GPU profile's)
    vr = tmp_path / "vllm"
    vr.mkdir(exist_ok=True)
    keep_specs = {"llama8b-none-s3", "llama8b-ngram-s3"}
    with open(vr / "results.jsonl", "w") as f:
        for line in open(data_dir() / "gpu" / "results.jsonl"):
            if json.loads(line).get("spec") in keep_specs:
                f.write(line)
    st = steps[steps["spec"].isin(keep_specs)] if "spec" in steps.columns else steps.head(0)
    st.head(400).to_json(vr / "steps_llama8b-ngram-s3.jsonl", orient="records", lines=True)
    vc = pd.read_csv(data_dir() / "cpu" / "verify_cost.csv")
    vc[vc["k"] <= 4].to_csv(tmp_path / "verify_cost.csv", index=False)
    return {
        "traces": str(sub), "model": "qwen", "datasets": ["humaneval"], "proposers": ["ngram", "eagle"],
        "k": 5, "cost_model": "llama3.1-8b-h200", "batch_sizes": [1, 16], "max_fixed_k": 3,
        "also_h200_fit": True, "vllm_job": "s3-tp2", "bin_size": 32, "other_proposer": "early-exit",
        "combine": ["ngram", "early-exit"], "proposer_sets": [["ngram", "early-exit"]],
        "steps_files": str(tmp_path / "steps.parquet"), "verify_cost_file": str(tmp_path / "verify_cost.csv"),
        "figures_dir": str(tmp_path / "figs"), "summary_path": str(tmp_path / "summary.json"),
        "backend": "torch", "live_requests": 2, "live_max_new_tokens": 10,
        "seeds": [1], "out_of_sample": False,
        "vllm_results": str(vr / "results.jsonl"), "live_dir": str(v1_runner_dir("reproduce-grid") / "live"),
    }


def _subset(t, keep):
    from spec_repro.traces import Trace

    acc = t.acc[t.acc["request_id"].isin(keep)].reset_index(drop=True)
    req = t.requests[t.requests["request_id"].isin(keep)].reset_index(drop=True)
    return Trace(acc, req, dict(t.meta))


@functools.lru_cache(maxsize=None)
def _declared(name: str) -> dict:
    """The parameters the notebook's source (``NAME.py``) declares, as papermill reads them."""
    from papermill.translators import PythonTranslator

    cell = next(c for c in jupytext.read(NB / f"{name}.py").cells if "parameters" in c.metadata.get("tags", []))
    return {p.name: p.default for p in PythonTranslator.inspect(cell)}


def run_notebook(name: str, params: dict, tmp_path) -> str:
    """Run notebook ``name`` here with ``params`` (papermill's rule: assigned after the parameters cell); returns
    a digest of everything it produced: text and displayed values per cell (run numbers masked), each figure's
    PNG, and the files written under ``figures_dir`` / ``summary_path``."""
    import matplotlib.pyplot as plt
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    from traitlets.config import Config

    cfg = Config()
    cfg.HistoryManager.enabled = False  # no history database (the session's IPYTHONDIR is removed at exit)
    shell = InteractiveShell.instance(config=cfg)
    shell.reset(new_session=True)
    shell.run_cell("import matplotlib; matplotlib.use('Agg')")
    nb = jupytext.read(NB / f"{name}.py")
    out = []
    with _cwd(NB):
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            src = cell.source
            if "parameters" in cell.metadata.get("tags", []):
                src += "\n" + "\n".join(f"{k} = {v!r}" for k, v in params.items())
            with capture_output() as cap:
                res = shell.run_cell(src, store_history=False)
            res.raise_error()
            shown = [o.data.get("text/html") or o.data.get("text/plain") for o in cap.outputs]
            out.append(re.sub(r"Out\[\d+\]", "Out", cap.stdout) + repr(shown))
            for n in plt.get_fignums():
                buf = io.BytesIO()
                plt.figure(n).savefig(buf, format="png", dpi=40)
                out.append(hashlib.sha256(buf.getvalue()).hexdigest())
            plt.close("all")
    for key in ("figures_dir", "summary_path"):
        p = params.get(key)
        if p:
            from pathlib import Path

            files = sorted(Path(p).rglob("*.png")) if Path(p).is_dir() else [Path(p)] if Path(p).exists() else []
            if files:   # nothing written adds nothing (an empty list would make any run differ from the base)
                out.append(json.dumps([f.name for f in files]))
    return hashlib.sha256("\n".join(out).encode()).hexdigest()


class _cwd:
    def __init__(self, path):
        self.path = path

    def __enter__(self):
        import os

        self.old = os.getcwd()
        os.chdir(self.path)

    def __exit__(self, *exc):
        import os

        os.chdir(self.old)


@functools.lru_cache(maxsize=None)
def _base_digest(name: str, live: bool, tmp: str) -> str:
    from pathlib import Path

    return run_notebook(name, _base(name, live), Path(tmp))


CASES = [(n, p) for n in R.NOTEBOOKS for p in sorted(_declared(n)) if p != "backend" or n != "02_verification_bottleneck"]


def test_every_parameter_has_a_change():
    """Each declared parameter is changed by a case here (a new parameter needs its changed value above), and the
    one not run (notebook 02's ``backend``: only "vllm" changes it, on a GPU host) is named."""
    names = {p for n in R.NOTEBOOKS for p in _declared(n)}
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        assert names <= set(_changed(Path(d))), names - set(_changed(Path(d)))
    assert ("02_verification_bottleneck", "backend") not in CASES
    assert "backend" in _declared("02_verification_bottleneck")


@pytest.fixture(scope="module")
def shared_tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("params")


@pytest.fixture(scope="module")
def changed_values(shared_tmp):
    """``_changed`` once for the module (it reads and writes the changed inputs: traces, steps, vLLM results)."""
    return _changed(shared_tmp)


FILE_PARAMS = ("figures_dir", "summary_path")   # they act by writing files, nothing else: one run checks both


@functools.lru_cache(maxsize=None)
def _files_run(name: str, tmp: str) -> dict:
    """Notebook ``name`` run once on its base with both ``figures_dir`` and ``summary_path`` set (each under its
    own folder): what each one wrote, by parameter."""
    from pathlib import Path

    d = Path(tmp) / "files" / name
    where = {"figures_dir": d / "figures_dir", "summary_path": d / "summary_path" / "summary.json"}
    run_notebook(name, {**_base(name, False), **{k: str(v) for k, v in where.items()}}, d)
    figs = where["figures_dir"]
    return {"figures_dir": sorted(f.name for f in figs.rglob("*.png")) if figs.is_dir() else [],
            "summary_path": where["summary_path"]}


@pytest.mark.parametrize("name,param", CASES)
def test_parameter_acts(name, param, shared_tmp, changed_values, tmp_path):
    if param in FILE_PARAMS:
        # separable: each parameter's own files, written in one run with both set (the base run, without them,
        # writes none)
        wrote = _files_run(name, str(shared_tmp))[param]
        if param == "figures_dir":
            assert wrote, f"{name}: changing figures_dir writes no figure"
        else:
            assert wrote.exists(), f"{name}: changing summary_path writes no summary"
            assert isinstance(json.loads(wrote.read_text()), list)
        return
    changed = {**changed_values, **CHANGED_FOR.get(name, {})}
    live = param in LIVE_ONLY
    base = _base(name, live)
    params = {**base, param: changed[param]}
    if param == "live_requests":
        params[param] = base[param] + 1
    if (name, param) in BASE_FOR:
        base = {**base, **BASE_FOR[name, param]}
        params = {**base, param: changed[param]}
        base_digest = run_notebook(name, base, tmp_path)
    elif param == "backend":  # embedded -> a live run of the same model, workload and proposers
        base_digest = run_notebook(name, {**base, "backend": "embedded"}, tmp_path)
    else:
        base_digest = _base_digest(name, live, str(shared_tmp))
    if param == "backend":
        # the changed run is the live base itself (its backend is the changed value): its digest, made once for
        # this case and the live_* cases
        assert params == _base(name, True) and params["backend"] == changed["backend"]
        got = _base_digest(name, True, str(shared_tmp))
    else:
        got = run_notebook(name, params, tmp_path)
    assert got != base_digest, f"{name}: changing {param} changes no output"
