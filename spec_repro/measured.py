"""Readers of the committed measurements (``data/gpu``: vLLM on the H200; ``data/cpu``: the torch engine on a
CPU): each returns (table or None, a provenance line saying what was read or that nothing was found). A file
whose folder's MANIFEST.json records its sha256 is checked against it before it is read
(``manifests.verify_recorded``: a changed file is one line naming it)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from .locations import data_dir, repo_root, v1_runner_dir
from .provenance import check_manifest, manifest_line, verify_recorded
from .traces import TraceError

__all__ = ["drafting_sweep", "gpu_steps", "cpu_steps", "gpu_speedups", "gpu_cost_model_path", "acceptance_agreement", "gpu_job_specs",
           "gpu_verify_limits", "verify_cost", "stalled_runs", "flag_stalled_points", "gpu_stalls", "live_ks", "live_speedups",
           "live_step_split", "live_steps", "live_runners", "v2_speedups", "v2_table"]


def gpu_job_specs(job: str) -> list[str]:
    """The engine specs of vLLM device job ``job`` (``data/gpu/jobs.json``): the runs a notebook's ``vllm_job``
    keeps from the committed measurements."""
    jobs = json.loads(verify_recorded(data_dir() / "gpu" / "jobs.json").read_text())["jobs"]
    if job not in jobs:
        raise ValueError(f"unknown vLLM job {job!r}; data/gpu/jobs.json has {sorted(jobs)}")
    return list(jobs[job]["specs"])


def _keep_job(d: pd.DataFrame, job: str | None) -> pd.DataFrame:
    """Rows of job ``job``'s specs, plus the no-SD runs of the same models (the baselines its speedups need)."""
    if not job or "spec" not in d.columns:
        return d
    specs = gpu_job_specs(job)
    mine = d["spec"].astype(str).isin(specs)
    models = set(d.loc[mine, "model"].astype(str))
    return d[mine | ((d["method"].astype(str) == "none") & d["model"].astype(str).isin(models))]


def gpu_steps(files=None, run_kind: str | None = "study", job: str | None = None) -> tuple[pd.DataFrame | None, str]:
    """Step-timing logs (STEP_COLUMNS) from ``files`` or the committed ``data/gpu/steps.parquet`` (else every
    ``data/gpu/**/steps*.jsonl``). Steps flagged ``outlier`` (JIT compilations) or not ``primary`` (superseded
    by a later re-run, or with imposed acceptance) are dropped; with ``run_kind`` only those runs
    (``study``: the study's batching) when the table says.

    ``job``: only the steps of that vLLM device job (``gpu_job_specs``), with its models' no-SD runs.

    Returns (table or None, a provenance line saying what was read or that nothing was found)."""
    from .traces import read_steps, validate_steps

    folder = data_dir() / "gpu"
    if files is None:
        found = [folder / "steps.parquet"] if (folder / "steps.parquet").exists() else \
            sorted(p for p in folder.rglob("steps*.jsonl"))
    else:
        found = [Path(f) for f in ([files] if isinstance(files, (str, Path)) else files)]
    if not found:
        return None, f"measured: no step-timing logs under {folder} (the GPU runs have not been committed)"
    parts = []
    for f in found:
        if f.suffix == ".parquet":
            d = pd.read_parquet(verify_recorded(f))
            if "outlier" in d.columns:
                d = d[~d["outlier"].astype(bool)]
            if "primary" in d.columns:   # runs re-made later, or with imposed acceptance
                d = d[d["primary"].astype(bool)]
            if run_kind and "run_kind" in d.columns:
                d = d[d["run_kind"].astype(str) == run_kind]
            parts.append(validate_steps(d.reset_index(drop=True), str(f)))
        else:
            parts.append(read_steps(f))
    df = _keep_job(pd.concat(parts, ignore_index=True), job).reset_index(drop=True)
    engines = ", ".join(sorted(df["engine"].astype(str).unique()))
    specs = set(df["spec"].astype(str)) if "spec" in df.columns else \
        {f.stem[len("steps_"):] for f in found if f.stem.startswith("steps_")} or None
    return df, _labelled(f"measured ({engines} step logs{f', job {job}' if job else ''}): {_provenance(folder, found)}",
                         _engine_labels(found, specs=specs))


def cpu_steps(files=None) -> tuple[pd.DataFrame | None, str]:
    """Step timings of this package's torch engine on the CPU (``data/cpu/steps_*.parquet``), same schema."""
    from .traces import read_steps

    folder = data_dir() / "cpu"
    found = sorted(folder.glob("steps_*.parquet")) if files is None else \
        [Path(f) for f in ([files] if isinstance(files, (str, Path)) else files)]
    if not found:
        return None, f"measured: no torch-engine step logs under {folder}"
    df = pd.concat([read_steps(f) for f in found], ignore_index=True)
    df["method"] = df["method"].astype(str).str.replace("_", "-")  # one spelling: early-exit, as the proposer
    return df, f"measured (spec_repro torch engine step logs): {manifest_line(folder, found)}"


def _provenance(folder: Path, found: Sequence[Path]) -> str:
    """The provenance line of the files read: ``folder``'s manifest for the committed ones; for job outputs
    elsewhere (``reproduce --profile gpu``'s, a user's), what their own ``results.jsonl`` recorded (the engines'
    GPU, vLLM and torch versions) and the file's date, never the committed manifest's."""
    outside = [f for f in found if not Path(f).resolve().is_relative_to(folder.resolve())]
    if not outside:
        return manifest_line(folder, found)
    import datetime as dt

    gpus, vllms, torches, when = set(), set(), set(), []
    for f in outside:
        res = f if f.name.startswith("results") and f.suffix == ".jsonl" else f.parent / "results.jsonl"
        if not res.exists():
            continue
        when.append(res.stat().st_mtime)
        for line in open(res):
            if '"kind": "engine"' not in line:
                continue
            e = json.loads(line)
            env = e.get("env") or {}
            gpus.add(env.get("gpu"))
            vllms.add(e.get("vllm") or env.get("vllm"))
            torches.add(env.get("torch"))
    bits = [", ".join(sorted(x for x in gpus if x)),
            ", ".join(f"vllm {v}" for v in sorted(x for x in vllms if x)) +
            "".join(f", torch {t}" for t in sorted(x for x in torches if x))]
    if when:
        bits.append(dt.datetime.fromtimestamp(max(when), dt.timezone.utc).isoformat(timespec="seconds"))
    names = ", ".join(f.name for f in list(found)[:4]) + (" ..." if len(found) > 4 else "")
    bits = [b for b in bits if b]
    return f"{names} ({'; '.join(bits)})" if bits else f"{names} (no engine record beside them)"


def _engine_labels(found: Sequence[Path], specs=None, models=None, methods=None) -> str:
    """``rowlabels.label_text`` of the vLLM engines behind the files read: the engine records of their
    ``results.jsonl`` (the file itself, or the one beside it), those of ``specs`` (or of ``models`` x ``methods``),
    each labelled from its resolved vLLM config where recorded, else its config (``labels.run_labels``); weights
    ``dummy`` where the config loaded dummy weights. Empty when no engine record is found."""
    from .engines.vllm.labels import run_labels
    from .rowlabels import label_text

    res = {f if f.name.startswith("results") and f.suffix == ".jsonl" else f.parent / "results.jsonl" for f in found}
    specs, models, methods = (None if x is None else set(x) for x in (specs, models, methods))
    rows = []
    for f in sorted(res):
        if not f.exists():
            continue
        for line in open(verify_recorded(f)):
            if '"kind": "engine"' not in line:       # engine records only (as _provenance reads them)
                continue
            e = json.loads(line)
            cfg = e.get("config") or {}
            if e.get("kind") != "engine" or (specs is not None and e.get("spec") not in specs):
                continue
            if models is not None and cfg.get("name") not in models:
                continue
            if methods is not None and (cfg.get("method") or "none") not in methods:
                continue
            rows.append({"method": cfg.get("method") or "none", **run_labels(cfg, e),
                         "weights": "dummy" if cfg.get("load_format") == "dummy" else "real"})
    return label_text(rows)


def _labelled(source: str, labels: str) -> str:
    return f"{source} {labels}" if labels else source


def _gpu_runs(files) -> tuple[pd.DataFrame, list[Path]]:
    """Timed vLLM runs: the committed ``data/gpu/runs.csv`` (one row per run), or the ``kind == "run"`` records
    of job result files (``results.jsonl``, see engines/vllm/jobs.py)."""
    folder = data_dir() / "gpu"
    if files is None:
        found = [folder / "runs.csv"] if (folder / "runs.csv").exists() else sorted(folder.rglob("results.jsonl"))
    else:
        found = [Path(f) for f in ([files] if isinstance(files, (str, Path)) else files) if Path(f).exists()]
    recs = []
    for f in found:
        if f.suffix == ".csv":
            d = pd.read_csv(verify_recorded(f))
            if "primary" in d.columns:   # runs re-made later (data/gpu/README.md)
                d = d[d["primary"].astype(bool)]
            recs += d[d.get("kind", pd.Series("run", index=d.index)) == "run"].to_dict("records")
            continue
        for line in open(verify_recorded(f)):
            if line.strip():
                r = json.loads(line)
                if r.get("kind") == "run":
                    cfg = r.get("config") or {}
                    r["synthetic_acceptance_length"] = cfg.get("synthetic_acceptance_length")
                    r["load_format"] = cfg.get("load_format")
                    r["source_file"] = str(f)
                    recs.append(r)
    return pd.DataFrame(recs), found


def gpu_speedups(files=None, task: str = "batches", job: str | None = None) -> tuple[pd.DataFrame | None, str]:
    """Measured end-to-end vLLM speedups: output tokens/s of each SD run ÷ the no-SD run (method ``none``) of the
    same model and batch size, from the job results under ``data/gpu`` (``task='batches'``: the study's batching,
    one prompt copied B times).

    Returns (dataset, model, proposers, method, batch_size, speedup, tokens_per_s, base_tokens_per_s,
    acceptance_length, weights, stalled, stall_reason) or None, and a provenance line. ``stalled`` marks a point
    whose run or no-SD baseline hit a first-use compilation inside its timed window (``stalled_runs`` over the
    committed step logs). ``proposers`` labels each series with how its
    acceptance came about (dummy weights accept almost nothing; vLLM's synthetic sampler imposes a length)."""
    runs, found = _gpu_runs(files)
    folder = data_dir() / "gpu"
    if runs.empty or "task" not in runs or not (runs["task"] == task).any():
        return None, f"measured: no vLLM throughput runs (task {task!r}) under {folder}"
    d = _keep_job(runs[runs["task"] == task], job).copy()
    if not (d["method"] != "none").any():
        return None, f"measured: no vLLM SD throughput runs (task {task!r}, job {job!r}) under {folder}"
    d["tokens_per_s"] = d["output_tok_per_s"].astype(float)
    key = ["model", "batch_size"]
    base = (d[d["method"] == "none"].groupby(key, as_index=False)["tokens_per_s"].mean()
            .rename(columns={"tokens_per_s": "base_tokens_per_s"}))
    sd = d[d["method"] != "none"].copy()
    sd["weights"] = np.where(sd["load_format"].astype(str) == "dummy", "dummy", "real")

    sd["synthetic"] = pd.to_numeric(sd["synthetic_acceptance_length"], errors="coerce")
    grp = key + ["method", "weights", "synthetic"]
    sd = (sd.groupby(grp, as_index=False, dropna=False)
          .agg(tokens_per_s=("tokens_per_s", "mean"), acceptance_length=("acceptance_length", "mean")))
    al = sd.groupby(["model", "method", "weights", "synthetic"], dropna=False)["acceptance_length"].transform("mean")

    def label(r, al):
        if pd.notna(r["synthetic"]):
            return f"{r['method']} (synthetic AL {r['synthetic']:g})"
        return f"{r['method']} (AL {al:.2f}, {r['weights']} weights)"

    sd["proposers"] = [label(r, a) for (_, r), a in zip(sd.iterrows(), al)]
    sd["acceptance"] = np.where(sd["synthetic"].notna(), "assumed (vLLM synthetic sampler)", "as measured")
    out = sd.merge(base, on=key)
    out["speedup"] = out["tokens_per_s"] / out["base_tokens_per_s"]
    out["dataset"] = out["model"].astype(str) + " dims, random prompt"
    out = out.sort_values(key + ["proposers"]).reset_index(drop=True)
    stalls, stall_runs = gpu_stalls() if files is None else (None, None)
    if stalls is not None:
        out = flag_stalled_points(out, stalls, stall_runs)
    else:
        out = out.assign(stalled=False, stall_reason="")
    labels = _engine_labels(found, specs=set(d["spec"].astype(str))) if "spec" in d.columns else ""
    return out, _labelled(f"measured vLLM throughput{f' (job {job})' if job else ''}: {_provenance(folder, found)}",
                          labels)


def stalled_runs(steps: pd.DataFrame, runs: pd.DataFrame | None = None, *, jit_factor: float = 10.0,
                 verify_factor: float = 3.0, floor_s: float = 0.05, min_comparable: int = 3,
                 min_share: float = 0.05) -> pd.DataFrame:
    """Which timed vLLM runs contain a compilation / CUDA-graph-capture stall (a batch shape met for the first
    time inside the timed window), from their per-step timings (``data/gpu/steps.parquet``).

    A step stalls when (a) its time outside the target forward (t_total - t_verify) exceeds ``jit_factor`` x its
    run's median and ``floor_s`` (Triton JIT in drafting; the ``outlier`` column of the step logs, recomputed
    when absent), or (b) its target forward (t_verify) exceeds ``verify_factor`` x the median t_verify of the
    same model's steps of the same kind (decode / not) and about the same batched tokens (within a factor 1.25;
    at least ``min_comparable`` such steps), by more than ``floor_s`` (a new shape compiled in the forward).
    A run is ``stalled`` when its steps' excess time is at least ``min_share`` of its wall time (``runs``:
    spec, run_id, wall_s; else of the summed step time).

    Pure (tables in, table out). Returns spec, run_id, model, method, batch_size, stall_steps, stall_s, wall_s,
    stall_share, stalled."""
    key = [c for c in ("spec", "run_id") if c in steps.columns]
    df = steps.copy()
    nonv = df["t_total"] - df["t_verify"]
    med = nonv.groupby([df[c] for c in key]).transform("median")
    jit = (nonv > jit_factor * med) & (nonv > floor_s)
    if "outlier" in df.columns:
        jit |= df["outlier"].astype(bool)
    jit_excess = np.where(jit, nonv - med, 0.0)
    kind = (df["phase"].astype(str) == "decode") if "phase" in df.columns else pd.Series(True, index=df.index)
    tok_bin = np.floor(np.log(df["batched_tokens"].clip(lower=1).astype(float)) / np.log(1.25)).astype(int)
    grp = [df["model"].astype(str), kind, tok_bin]
    ref = df["t_verify"].groupby(grp).transform("median")
    cnt = df["t_verify"].groupby(grp).transform("size")
    slow = (cnt >= min_comparable) & (df["t_verify"] > verify_factor * ref) & (df["t_verify"] - ref > floor_s)
    ver_excess = np.where(slow, df["t_verify"] - ref, 0.0)
    df["_stall_s"] = np.maximum(jit_excess, 0) + np.maximum(ver_excess, 0)
    df["_stall"] = jit | slow
    out = (df.groupby(key, observed=True)
           .agg(model=("model", "first"), method=("method", "first"), batch_size=("batch_size", "first"),
                stall_steps=("_stall", "sum"), stall_s=("_stall_s", "sum"), step_s=("t_total", "sum"))
           .reset_index())
    if runs is not None and set(key) <= set(runs.columns) and "wall_s" in runs.columns:
        out = out.merge(runs[key + ["wall_s"]].drop_duplicates(key), on=key, how="left")
        out["wall_s"] = out["wall_s"].fillna(out["step_s"])
    else:
        out["wall_s"] = out["step_s"]
    out["stall_share"] = out["stall_s"] / out["wall_s"]
    out["stalled"] = out["stall_share"] >= min_share
    return out.drop(columns="step_s")


def flag_stalled_points(measured: pd.DataFrame, stalls: pd.DataFrame, runs: pd.DataFrame | None = None
                        ) -> pd.DataFrame:
    """Mark measured speedups (``gpu_speedups`` rows) whose SD run or whose no-SD baseline run (method
    ``none``, same model and batch size) is ``stalled`` in ``stalls`` (``stalled_runs``). ``runs`` (runs.csv:
    spec, run_id, synthetic_acceptance_length, primary, task) tells runs with an imposed acceptance apart;
    without it every run of that model, method and batch size counts. Adds ``stalled`` and ``stall_reason``."""
    st = stalls[stalls["stalled"]].copy()
    if runs is not None and {"spec", "run_id"} <= set(runs.columns):
        r = runs
        if "primary" in r.columns:
            r = r[r["primary"].astype(bool)]
        if "task" in r.columns:
            r = r[r["task"].astype(str) == "batches"]
        cols = ["spec", "run_id"] + [c for c in ("synthetic_acceptance_length",) if c in r.columns]
        st = st.merge(r[cols], on=["spec", "run_id"], how="inner")
    syn = pd.to_numeric(st["synthetic_acceptance_length"], errors="coerce") if "synthetic_acceptance_length" in st \
        else pd.Series(np.nan, index=st.index)
    bad = {(str(m), str(me), int(b), None if pd.isna(s) else float(s)): sh
           for m, me, b, s, sh in zip(st["model"], st["method"], st["batch_size"], syn, st["stall_share"])}
    flags, reasons = [], []
    msyn = (pd.to_numeric(measured["synthetic"], errors="coerce") if "synthetic" in measured.columns
            else pd.Series(np.nan, index=measured.index))
    for (_, r), s in zip(measured.iterrows(), msyn):
        s = None if pd.isna(s) else float(s)
        own = bad.get((str(r["model"]), str(r["method"]), int(r["batch_size"]), s))
        if own is None and runs is None:
            own = next((v for k, v in bad.items() if k[:3] == (str(r["model"]), str(r["method"]),
                                                              int(r["batch_size"]))), None)
        base = bad.get((str(r["model"]), "none", int(r["batch_size"]), None))
        why = ([f"SD run {own:.0%} stalled"] if own is not None else []) + \
              ([f"no-SD baseline {base:.0%} stalled"] if base is not None else [])
        flags.append(bool(why))
        reasons.append("; ".join(why))
    return measured.assign(stalled=flags, stall_reason=reasons)


def gpu_stalls() -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """(``stalled_runs`` over the committed ``data/gpu/steps.parquet``, runs.csv), or (None, None)."""
    folder = data_dir() / "gpu"
    if not (folder / "steps.parquet").exists() or not (folder / "runs.csv").exists():
        return None, None
    runs = pd.read_csv(verify_recorded(folder / "runs.csv"))
    return stalled_runs(pd.read_parquet(verify_recorded(folder / "steps.parquet")), runs), runs


def gpu_cost_model_path() -> Path | None:
    """The cost model fitted to the committed H200 step logs (``data/gpu/costmodel_*.json``), if any."""
    found = sorted((data_dir() / "gpu").glob("costmodel_*.json"))
    return found[0] if found else None


def acceptance_agreement(path=None) -> tuple[dict | None, str]:
    """How well the traces' acceptance matches a production engine's: ``data/gpu/smollm2_agreement.json``
    (SmolLM2-135M, real weights, n-gram in vLLM on the H200 vs this package's profiler and torch traces)."""
    p = Path(path) if path is not None else data_dir() / "gpu" / "smollm2_agreement.json"
    if not p.exists():
        return None, f"no engine-agreement record at {p}"
    rec = json.loads(verify_recorded(p).read_text())
    return rec, _labelled(f"measured (vLLM on GPU vs spec_repro torch traces): {manifest_line(p.parent, [p])}",
                          _engine_labels([p], models={"smollm2-135m"}))



def gpu_verify_limits(path=None) -> tuple[pd.DataFrame | None, str]:
    """Median decode target-forward (verification) time beside its HBM floor, per model, method and batch size
    (``data/gpu/verify_limits.csv``: floor = (weights streamed + KV read) / datasheet bandwidth). Adds
    ``vs_no_sd``: verification time ÷ the no-SD forward of the same model and batch size (k+1 tokens per
    request vs 1)."""
    p = Path(path) if path is not None else data_dir() / "gpu" / "verify_limits.csv"
    if not p.exists():
        return None, f"measured: no verification-vs-HBM-floor table at {p}"
    df = pd.read_csv(verify_recorded(p))
    base = df[df["method"] == "none"][["model", "batch_size", "t_verify_ms"]].rename(
        columns={"t_verify_ms": "base_ms"})
    df = df.merge(base, on=["model", "batch_size"], how="left")
    df["vs_no_sd"] = df["t_verify_ms"] / df["base_ms"]
    labels = _engine_labels([p], models=set(df["model"].astype(str)), methods=set(df["method"].astype(str)))
    return df.drop(columns="base_ms"), _labelled(f"measured (vLLM step logs): {manifest_line(p.parent, [p])}", labels)


def verify_cost(path=None) -> tuple[pd.DataFrame | None, str]:
    """The measured cost of verifying k drafts: forward time of k+1 tokens ÷ time of 1 token, per k.

    Reads ``data/cpu/verify_cost.csv`` by default; needs column ``k`` and either ``ratio`` or the two times
    (``t_k1``/``t_1`` or ``seconds_k1``/``seconds_1``)."""
    p = Path(path) if path is not None else data_dir() / "cpu" / "verify_cost.csv"
    if not p.exists():
        return None, f"measured: no verify-cost table at {p}"
    df = pd.read_csv(verify_recorded(p))
    if "ratio" not in df.columns and "ratio_to_1_token" in df.columns:
        df["ratio"] = df["ratio_to_1_token"]
    if "ratio" not in df.columns:
        pairs = [("t_k1", "t_1"), ("seconds_k1", "seconds_1"), ("t_kplus1", "t_1")]
        for a, b in pairs:
            if a in df.columns and b in df.columns:
                df["ratio"] = df[a] / df[b]
                break
        else:
            raise TraceError(f"{p}: need a 'ratio' column or time columns {pairs}, have {list(df.columns)}")
    if "k" not in df.columns:
        raise TraceError(f"{p}: need a 'k' column, have {list(df.columns)}")
    src = f"measured on CPU: {manifest_line(p.parent, [p])}"
    man = p.parent / "MANIFEST.json"
    if man.exists():
        e = check_manifest(man).get(p.name, {})
        if e.get("weight_bytes") and "median_s" in df and (df["k"] == 0).any():
            t1 = float(df.loc[df["k"] == 0, "median_s"].iloc[0])
            src += (f"; model {e.get('model', '?')}, KV cache {e.get('kv_len', '?')} tokens, "
                    f"{e.get('torch_threads', '?')} threads: a 1-token step ({t1 * 1e3:.1f} ms) reads "
                    f"{e['weight_bytes'] / 1e6:.0f} MB of weights = {e['weight_bytes'] / t1 / 1e9:.1f} GB/s")
    return df, src


# ---- vLLM live with real weights (data/gpu/v1-runner/agreement)
# ---------------------------------------------------------------
LIVE_CONFIGS = ("v1-forced", "v2-forced")     # the engine configurations the plugin times (labels.ENGINE_CONFIGS)


def _live_runs(folder: Path):
    """A live folder's runs.csv; a V2 hybrid folder's (with ``stage``) restricted to its grid stage."""
    from .engines.vllm import live

    runs = live.read_runs(folder)
    return runs[runs["stage"] == "grid"] if "stage" in runs.columns else runs


def _with_runner(frame: pd.DataFrame) -> pd.DataFrame:
    """A live table with its runner labels: one older than them (no ``engine_config``) ran on the V1 runner,
    forced, as every committed table of that age did."""
    if "engine_config" in frame.columns:
        return frame
    return frame.assign(engine_config="v1-forced", **({} if "runner" in frame.columns else {"runner": "v1"}))


def live_ks(frame: pd.DataFrame) -> list[int]:
    """The k of each configuration a live table's ``method`` names with a suffix (``eagle-k3``,
    ``gpu-pr24344-skip-k3``: an engine at another k than its grid's; ``hybrid_jobs.split_k``), sorted, each once."""
    from .engines.vllm.hybrid_jobs import split_k

    return sorted({k for _, k in map(split_k, frame["method"]) if k})


def live_runners(frame: pd.DataFrame) -> str:
    """How a live table's rows ran (``live_speedups``' or ``live_steps``' frame, or a runs table: its
    ``engine_config`` and ``method``, ``config`` or ``proposers``): ``V1 runner (forced)`` (the committed V1
    studies; a table without ``engine_config`` predates the runner labels and ran there too), or e.g. ``V2 runner
    (forced); ngram: V1 runner (forced)`` where configurations differ (vLLM 0.25 runs n-gram on V1 only)."""
    from .engines.vllm.labels import DISPLAY

    frame = _with_runner(frame)
    col = next(c for c in ("method", "config", "proposers") if c in frame.columns)
    r = frame[frame["engine_config"].isin(LIVE_CONFIGS)]
    by = r.groupby("engine_config")[col].unique()
    if not len(by):
        return "no timed runs"
    main = max(by.index, key=lambda c: len(by[c]))
    rest = [f"{', '.join(sorted(map(str, by[c])))}: {DISPLAY.get(c, c)}" for c in by.index if c != main]
    return "; ".join([DISPLAY.get(main, main), *rest])


def _live_labels(runs: pd.DataFrame) -> str:
    """``rowlabels.label_text`` of a live folder's timed runs (``_live_runs``: each configuration's runner, weights
    and engine configuration as recorded; a table older than the runner labels ran on the V1 runner, forced)."""
    from .rowlabels import label_text

    runs = _with_runner(runs)
    r = runs[runs["engine_config"].isin(LIVE_CONFIGS)]
    cols = [c for c in ("config", "runner", "weights", "engine_config") if c in r.columns]
    return label_text(r[cols].drop_duplicates().rename(columns={"config": "method"}).to_dict("records"))


def live_speedups(folder: Path | None = None) -> tuple[pd.DataFrame | None, str]:
    """Measured vLLM speedups with REAL weights (default ``data/gpu/v1-runner/agreement``: Qwen2.5-Coder-1.5B, the
    package's EAGLE head, code-edit, the V1 runner forced; or a V2 hybrid folder, ``reproduce --profile gpu``'s:
    its grid stage, the V2 runner): tokens/s of each configuration (EAGLE, n-gram, the live hybrids) ÷ no SD's at
    the same batch size, with the same columns as ``gpu_speedups`` plus ``engine_config`` (what ran, as recorded),
    ``tok_s_min`` / ``tok_s_max`` (over the repeats) and ``ceiling_tok_s`` (the HBM ceiling); where the folder's
    configurations ran on different runners, each proposer's label names its own."""
    from .engines.vllm import live
    from .engines.vllm.labels import DISPLAY

    folder = Path(folder or v1_runner_dir("agreement"))
    if not (folder / "runs.csv").exists():
        return None, f"measured (vLLM live): no runs under {folder}"
    runs = _live_runs(folder)
    t = live.throughput(runs, out=folder, workload="code-edit")
    t = t[(t["model"] == live.QWEN) & t["engine_config"].isin(LIVE_CONFIGS)]
    base = t[t["config"] == "none"].set_index("batch_size")["tok_s"]
    sd = t[t["config"] != "none"].copy()
    sd["base_tokens_per_s"] = sd["batch_size"].map(base)
    sd["speedup"] = sd["tok_s"] / sd["base_tokens_per_s"]
    al = sd.groupby("config")["acceptance_length"].transform("mean")
    mixed = sd["engine_config"].nunique() > 1      # e.g. n-gram on V1 beside EAGLE on V2: each names its runner
    sd["proposers"] = [f"{c} (AL {a:.2f}, real weights" + (f", {DISPLAY.get(e, e)})" if mixed else ")")
                       for c, a, e in zip(sd["config"], al, sd["engine_config"])]
    sd = sd.rename(columns={"tok_s": "tokens_per_s", "config": "method"}).assign(
        dataset="code-edit", weights="real", acceptance="as measured", stalled=False, stall_reason="")
    cols = ["dataset", "model", "proposers", "method", "batch_size", "speedup", "tokens_per_s", "base_tokens_per_s",
            "tok_s_min", "tok_s_max", "acceptance_length", "ceiling_tok_s", "weights", "engine_config", "acceptance",
            "stalled", "stall_reason"]
    return (sd[cols].sort_values(["batch_size", "method"]).reset_index(drop=True),
            _labelled(f"measured vLLM throughput, real weights, {live_runners(sd)}: "
                      f"{manifest_line(folder, [folder / 'runs.csv'])}", _live_labels(runs)))


V2_SOURCE = ("measured vLLM 0.25.0 throughput, its default engine, uninstrumented, real weights, one H200; no SD "
             "and EAGLE on the V2 runner with async scheduling, their engines resident together and runs rotated; "
             "n-gram on the V1 runner (synchronous)")


def _v2_context(folder: Path) -> pd.DataFrame | None:
    """Per workload and batch size, the timed runs' mean first-prompt length and output tokens per request (the
    raw records, ``results.jsonl.gz``): the context ``live.throughput`` prices its HBM ceiling at."""
    import gzip

    f = folder / "results.jsonl.gz"
    if not f.exists():
        return None
    with gzip.open(verify_recorded(f), "rt") as fh:
        recs = [r for r in map(json.loads, filter(str.strip, fh)) if r.get("kind") == "run"]
    if not recs:
        return None
    r = pd.DataFrame([{"workload": x.get("workload"), "batch_size": x.get("batch_size"),
                       "prompt_len": x.get("prompt_len"),
                       "out": x["output_tokens"] / x["n_requests"] if x.get("n_requests") else np.nan}
                      for x in recs])
    return r.groupby(["workload", "batch_size"]).agg(prompt_len=("prompt_len", "mean"), out=("out", "mean"))


def v2_speedups(folder: Path | None = None) -> tuple[pd.DataFrame | None, str]:
    """Measured vLLM speedups as vLLM runs by default (``data/gpu/v2grid``: vLLM 0.25.0, no forced runner, no
    plugin; Qwen2.5-Coder-1.5B, real weights, the package's EAGLE head at k = 1, 2, 3, 5 on the V2 runner with
    async scheduling, n-gram k = 5 on the V1 runner; code-edit and sharegpt; bs 1-64; 3 repeats): each
    configuration's tokens/s ÷ no SD's (``v2grid.ratio_table``: the no-SD engine resident beside it, else the least
    host-contended one started alone; a configuration measured both ways keeps the co-resident row), with the columns
    of ``live_speedups`` (``dataset`` = the workload, ``method`` e.g. ``eagle-k3``) plus ``runner`` and the
    host contention: ``steal_share`` (the hypervisor's steal time over the runs' wall time) and ``contended``
    (``v2grid.CLEAN_STEAL`` or more: the host took time from the run, so its speedup is a lower bound)."""
    from .engines.vllm import live

    folder = Path(folder or data_dir() / "gpu" / "v2grid")
    f = folder / "ratios.csv"
    if not f.exists():
        return None, f"measured (vLLM default engine, V2 grid): no ratios.csv under {folder}"
    t = pd.read_csv(verify_recorded(f))
    t = t[t["method"] != "none"].copy()
    if "baseline" in t:      # a configuration measured both co-resident (runs rotated) and alone: the co-resident
        t = (t.sort_values("baseline", key=lambda b: b != "co-resident", kind="stable")
             .drop_duplicates(["workload", "batch_size", "method", "k"]))
    t["k"] = t["k"].astype(int)
    t["method"] = t["method"] + "-k" + t["k"].astype(str)
    t["runner"] = t["runner"].astype(str).str.upper()
    t["acceptance_length"] = t["acceptance_length"].fillna(1.0)
    al = t.groupby(["workload", "method"])["acceptance_length"].transform("mean")
    t["proposers"] = [f"{m.rsplit('-k', 1)[0]} k={k} (AL {a:.2f}, real weights)"
                      for m, k, a in zip(t["method"], t["k"], al)]
    ctx = _v2_context(folder)
    if ctx is not None:
        c = ctx.reindex(list(zip(t["workload"], t["batch_size"])))
        floor = [live.step_floor_s(live.QWEN, int(b), p + o / 2) for b, p, o in
                 zip(t["batch_size"], c["prompt_len"], c["out"])]
        t["ceiling_tok_s"] = t["batch_size"] * t["acceptance_length"] / np.asarray(floor, dtype=float)
    else:
        t["ceiling_tok_s"] = np.nan
    t = t.rename(columns={"workload": "dataset", "ratio": "speedup", "tok_s": "tokens_per_s",
                          "none_tok_s": "base_tokens_per_s"}).assign(
        model=live.QWEN, weights="real", acceptance="as measured", stalled=False, stall_reason="")
    t["contended"] = t["contended"].astype(str).str.lower().isin(["true", "1"])
    cols = ["dataset", "model", "proposers", "method", "batch_size", "speedup", "tokens_per_s", "base_tokens_per_s",
            "tok_s_min", "tok_s_max", "acceptance_length", "ceiling_tok_s", "weights", "engine_config", "acceptance",
            "stalled", "stall_reason", "runner", "contended", "steal_share", "ratio_lo", "ratio_hi"]
    return (t[cols].sort_values(["dataset", "batch_size", "method"]).reset_index(drop=True),
            f"{V2_SOURCE}: {manifest_line(folder, [f])}")


def v2_table(v2: pd.DataFrame) -> pd.DataFrame:
    """``v2_speedups``' speedups as the notebook shows them: one row per workload and batch size, one column per
    configuration, each cell the speedup to two decimals, ``*`` after it where the run was host-contended (a lower
    bound)."""
    cell = v2["speedup"].map("{:.2f}".format) + np.where(v2["contended"].astype(bool), "*", "")
    t = v2.assign(speedup=cell).pivot(index=["dataset", "batch_size"], columns="method", values="speedup")
    return t.fillna("").rename_axis(columns=None)


def live_step_split(folder: Path | None = None) -> pd.DataFrame | None:
    """Median ms per phase of the live Qwen decode steps (``data/gpu/v1-runner/agreement``), per configuration,
    batch size and
    batch shape (``uniform``: every request verified 1 + k tokens)."""
    from .engines.vllm import live

    folder = Path(folder or v1_runner_dir("agreement"))
    return live.step_split(folder) if (folder / "steps.parquet").exists() else None


def live_rotated_runs(folder: Path | None = None) -> tuple[pd.DataFrame | None, str]:
    """The rotated EAGLE engine's timed code-edit runs (``data/gpu/v1-runner/rotated-code-edit``: one engine
    switching policy run by run,
    EAGLE alone = ``eagle``), in the order they ran: per run its policy, batch size, repeat, position within its
    batch size (``order``) and the median ms of each phase of its decode steps (verification, drafting, the rest:
    t_other + t_reject)."""
    folder = Path(folder or v1_runner_dir("rotated-code-edit"))
    f = folder / "steps.parquet"
    if not f.exists():
        return None, f"measured (vLLM live, one rotated engine): no step log under {folder}"
    s = pd.read_parquet(verify_recorded(f), columns=["run_id", "spec", "config", "batch_size", "phase", "t_verify", "t_draft",
                                    "t_other", "t_reject"])
    s = s[s["spec"].str.contains("-rotate", regex=False) & s["run_id"].str.startswith("code-edit")
          & (s["phase"] == "decode")]
    if s.empty:
        return None, f"measured (vLLM live, one rotated engine): no rotated engine's steps in {f}"
    s = s.assign(rest=s["t_other"] + s["t_reject"])
    g = s.groupby("run_id", sort=False).agg(config=("config", "first"), batch_size=("batch_size", "first"),
                                            verification=("t_verify", "median"), drafting=("t_draft", "median"),
                                            rest=("rest", "median")).reset_index()
    for c in ("verification", "drafting", "rest"):
        g[c] *= 1e3
    g["repeat"] = g["run_id"].str.extract(r"-r(\d+)$")[0].astype(int)
    g["order"] = g.groupby("batch_size").cumcount()
    return g, f"measured (vLLM step logs, real weights, V1 runner (forced), one engine): {manifest_line(folder, [f])}"


def drafting_sweep(folder: Path | None = None) -> tuple[pd.DataFrame | None, pd.DataFrame | None, str]:
    """EAGLE's drafting time per k on the H200 (``data/gpu/v1-runner/draft-k``: k = 1, 3, 5, 8, 12 x bs 1, 8, 32,
    64, two
    repeats, dummy weights, both targets' dims): per timed run its model, k, batch size, repeat and the median ms of
    its decode steps' drafting (``draft_ms``); and per model and batch size the fit ``costmodel.fit_drafting``
    enters into the H200 presets (``d0_ms``, ``d1_ms`` per drafted token, R²) beside the HBM floor of one head
    forward (``floor_ms``: ``steps.draft_forward_bytes`` / 4.8 TB/s) and ``floor_share`` = floor_ms / d1_ms (1: a
    drafted token at the HBM floor)."""
    from . import costmodel
    from .engines.vllm.hybrid_jobs import DRAFT_SWEEP
    from .engines.vllm.steps import H200_HBM_BYTES_PER_S, draft_forward_bytes

    folder = Path(folder or v1_runner_dir("draft-k"))
    f = folder / "steps.parquet"
    if not f.exists():
        return None, None, f"measured (vLLM, EAGLE drafting sweep): no step log under {folder}"
    st = costmodel.sweep_steps(f)
    runs = (st.groupby("run_id", sort=False)
            .agg(model=("model", "first"), k=("k", "first"), batch_size=("batch_size", "first"),
                 draft_ms=("t_draft", "median")).reset_index())
    runs["draft_ms"] *= 1e3
    runs["repeat"] = runs["run_id"].str.extract(r"-r(\d+)$")[0].astype(int)
    heads = {t["name"]: repo_root() / t["draft"] / "config.json" for t in DRAFT_SWEEP.values()}
    rows = []
    for model in sorted(runs["model"].unique()):
        dr, rec = costmodel.fit_drafting(st, model)
        floor = draft_forward_bytes(heads[model]) / H200_HBM_BYTES_PER_S * 1e3
        for b, d1 in rec["d1_s"].items():
            rows.append({"model": model, "batch_size": int(b), "d0_ms": rec["d0_s"] * 1e3, "d1_ms": d1 * 1e3,
                         "floor_ms": floor, "floor_share": floor / (d1 * 1e3), "r2": rec["r2"]})
    return runs, pd.DataFrame(rows), (f"measured (vLLM 0.25 step logs, dummy weights, V1 runner (forced), one H200): "
                                      f"{manifest_line(folder, [f])}")


def live_steps(folder: Path | None = None) -> tuple[pd.DataFrame | None, str]:
    """The live Qwen decode and prefill steps of the hybrid task (default
    ``data/gpu/v1-runner/agreement/steps.parquet``: code-edit, bs 1-64, the V1 runner forced; a V2 hybrid folder:
    its grid stage), ``method`` set to the configuration (the hybrids run vLLM's method eagle), ``model`` naming
    the weights and the runner each step ran on, for ``metrics.phase_shares``."""
    from .engines.vllm.labels import DISPLAY

    folder = Path(folder or v1_runner_dir("agreement"))
    f = folder / "steps.parquet"
    if not f.exists():
        return None, f"measured (vLLM step logs): no step log under {folder}"
    s = pd.read_parquet(verify_recorded(f))
    s = s[s["run_id"].str.startswith("code-edit")].copy()
    if "stage" in s.columns:
        s = s[s["stage"] == "grid"].copy()
    s["method"] = s["config"]
    if "engine_config" not in s.columns:      # a step log older than the runner labels: the V1 runner, forced
        s["engine_config"] = "v1-forced"
    s["model"] = [f"{m} (real weights, {DISPLAY.get(e, e)})"
                  for m, e in zip(s["model"].astype(str), s["engine_config"])]
    return s.reset_index(drop=True), _labelled(f"measured (vLLM step logs, real weights, {live_runners(s)}): "
                                               f"{manifest_line(folder, [f])}", _live_labels(_live_runs(folder)))
