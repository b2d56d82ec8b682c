"""From the device's raw outputs to ``data/gpu``: ``load_raw`` reads the job records and step logs, one
``write_*`` function per output file, ``summarize`` runs them all and records each file in ``MANIFEST.json``.
When and how the device runs were made (dates, commands, superseded runs) is data: ``data/gpu/sessions.json``."""
from __future__ import annotations

import json
from pathlib import Path

from ...io import atomic_write, write_via
from ...paths import data_dir

__all__ = ["FILE_DOCS", "sessions", "load_raw", "write_steps", "write_runs", "write_results", "write_phase_breakdown",
           "write_overhead", "write_verify_limits", "fit_cost_models", "write_cost_model", "write_cost_model_compare",
           "write_smollm2", "write_manifest", "summarize"]

FILE_DOCS = {
    "runs.csv": "one row per timed generate() call: throughput, wall time, vLLM spec-decode counters",
    "results.jsonl": "the device jobs' raw records (engine start, environment, config, each run), outputs left out",
    "steps.parquet": "every engine step timed by the plugin (STEP_COLUMNS + phase, t_sched, outlier, spec, session, "
                     "run_kind, and the forward's HBM floor: verify_bytes, verify_floor_s, achieved_GBps, bw_util)",
    "phase_breakdown.csv": "time-weighted phase shares per model/method/batch (decode steps, and all steps)",
    "overhead.csv": "throughput with the step timer on vs off (interleaved repeats, two plugin versions)",
    "verify_limits.csv": "median decode target-forward time next to its HBM floor (weights + KV bytes / 4.8 TB/s)",
    "costmodel_llama31_8b_h200.json": "fitted cost model (spec_repro.costmodel preset format)",
    "costmodel_compare.csv": "H200 fits (all steps, decode steps) beside the published H100 coefficients",
    "smollm2_prompts.jsonl": "SmolLM2 chat-template token ids of the 5 embedded workloads (n=40, seed 0)",
    "smollm2_vllm_outputs.jsonl": "vLLM greedy outputs (SmolLM2-135M real weights, float32, n-gram k=8)",
    "smollm2_vllm_steps.csv": "vLLM's steps per request: output position, drafted, accepted",
    "smollm2_agreement.json": "vLLM accepted counts vs predictions from the same outputs, and vs the torch traces",
    "jobs.json": "the device jobs: engine specs (configuration + tasks) per job, read by spec_repro.engines.vllm.jobs",
    "sessions.json": "how and when the device runs were made (dates, commands, plugin versions, superseded runs)",
}


def sessions(path: str | Path | None = None) -> dict:
    """``data/gpu/sessions.json``: dates and commands of the device runs, the ``session`` label of each plugin
    version (``plugin_sessions``), runs re-made later with a newer plugin (``superseded``), step logs with imposed
    acceptance (``steps_secondary``), model configs under ``data/gpu/configs``."""
    return json.loads(Path(path or data_dir() / "gpu" / "sessions.json").read_text())


def _session(spec: str, plugin_status=None, plugin_sessions: dict | None = None) -> str:
    st = plugin_status[0] if isinstance(plugin_status, list) and plugin_status else plugin_status
    v = st.get("version") if isinstance(st, dict) else None
    if v:
        return (plugin_sessions or sessions()["plugin_sessions"]).get(str(int(v)), f"{v}-plugin-v{v}")
    return "2-plugin-v2" if "overhead2" in spec else "1-plugin-v1"


def _raw_files(raws, pattern: str) -> list[Path]:
    return sorted({f for r in raws for f in Path(r).rglob(pattern)}, key=lambda p: (p.name, str(p)))


def load_raw(raw):
    """(runs, steps, engines) DataFrames from one or more folders (searched recursively) of the device's
    ``results*.jsonl`` and ``steps_*.jsonl``. Each spec's ``session`` label comes from its engine record's plugin
    version; ``primary`` is False for runs re-made later (``superseded`` in ``sessions()``) and for step logs
    whose acceptance was imposed (``steps_secondary``)."""
    import pandas as pd

    from ...traces import read_step_records

    meta = sessions()
    superseded, secondary, plugin = meta["superseded"], set(meta["steps_secondary"]), meta["plugin_sessions"]
    raws = [raw] if isinstance(raw, (str, Path)) else list(raw)
    recs = [json.loads(line) for f in _raw_files(raws, "results*.jsonl") for line in open(f) if line.strip()]
    session = {d["spec"]: _session(d["spec"], d.get("plugin"), plugin) for d in recs if d["kind"] == "engine"}
    specs = {d.get("spec") for d in recs}

    def primary(spec: str) -> bool:
        return not (spec in superseded and superseded[spec] in specs)

    runs, engines = [], []
    for d in recs:
        if d["kind"] == "run":
            d = dict(d)
            d.pop("outputs", None)
            d.pop("keys", None)
            cfg = d.pop("config")
            d.update({"session": session.get(d["spec"], _session(d["spec"])), "dtype": cfg["dtype"],
                      "load_format": cfg["load_format"], "tensor_parallel_size": cfg.get("tensor_parallel_size", 1),
                      "synthetic_acceptance_length": cfg.get("synthetic_acceptance_length"),
                      "draft_cudagraphs": bool(cfg.get("draft_cudagraphs", False)),
                      "draft": Path(cfg["draft"]).name if cfg.get("draft") else None,
                      "per_position_rate": json.dumps(d["per_position_rate"]),
                      "accepted_per_pos": json.dumps(d["accepted_per_pos"]), "primary": primary(d["spec"])})
            runs.append(d)
        elif d["kind"] == "engine":
            engines.append({"spec": d["spec"], "session": session[d["spec"]], "start_s": d["start_s"],
                            "instrumented": d["instrumented"], "vllm": d["vllm"], **d["env"], "config": d["config"]})
    parts = []
    for f in _raw_files(raws, "steps_*.jsonl"):
        spec = f.stem[len("steps_"):]
        df, extra = read_step_records(f)
        df["t_sched"] = [x.get("t_sched", float("nan")) for x in extra]
        df["spec"], df["session"] = spec, session.get(spec, _session(spec))
        df["primary"] = primary(spec) and spec not in secondary
        parts.append(df)
    steps = pd.concat(parts, ignore_index=True)
    return pd.DataFrame(runs), steps, engines


def _run_kind(run_id: str) -> str:
    if run_id.startswith("profile-"):
        return "profile"
    if run_id.startswith("overhead-"):
        return "overhead"
    if run_id.startswith("prompts-"):
        return "prompts"
    return "study"


def write_steps(llm, dims: dict, out: Path):
    """``steps.parquet``: every step, next to its memory floor ((streamed weights + KV read) / (GPUs x 4.8 TB/s))
    and the GB/s it achieved. Returns the table written."""
    import pandas as pd

    from .steps import add_physical_limits

    llm = pd.concat([add_physical_limits(g, dims[m]) if m in dims else g for m, g in llm.groupby("model")])
    llm = llm.sort_index()
    keep = [c for c in llm.columns if c not in ("accepted_per_req",)]
    write_via(llm[keep].to_parquet, out / "steps.parquet", compression="zstd", index=False)
    return llm


def write_runs(runs, out: Path) -> None:
    """``runs.csv``: one row per timed generate() call."""
    write_via(runs.to_csv, out / "runs.csv", index=False)


def write_results(raws, out: Path) -> None:
    """``results.jsonl``: the device's own result records, every device run in one file (generated token ids left out;
    the SmolLM2 outputs are in smollm2_vllm_outputs.jsonl): what ``measured.gpu_speedups`` reads."""
    with atomic_write(out / "results.jsonl") as f:
        for src in _raw_files(raws, "results*.jsonl"):
            for line in open(src):
                d = json.loads(line)
                d.pop("outputs", None)
                f.write(json.dumps(d, default=str) + "\n")


def write_phase_breakdown(llm, out: Path):
    """``phase_breakdown.csv``: phase shares of the study runs, decode steps and all steps."""
    import pandas as pd

    from .steps import phase_breakdown

    study = llm[llm["run_kind"] == "study"]
    by = ("session", "spec", "primary", "model", "method", "k", "batch_size")
    pb = pd.concat([phase_breakdown(study, decode_only=True, by=by).assign(steps_kind="decode"),
                    phase_breakdown(study, decode_only=False, by=by).assign(steps_kind="all")], ignore_index=True)
    write_via(pb.to_csv, out / "phase_breakdown.csv", index=False, float_format="%.6g")
    return pb


def write_overhead(runs, out: Path):
    """``overhead.csv``: throughput with the step timer on vs off."""
    from .steps import overhead_table

    ov = overhead_table(runs)
    write_via(ov.to_csv, out / "overhead.csv", index=False, float_format="%.6g")
    return ov


def write_verify_limits(llm, dims: dict, out: Path) -> None:
    """``verify_limits.csv``: median decode target forward of the primary study and profile runs beside its floor."""
    from .steps import limit_table

    lim = limit_table(llm[llm["run_kind"].isin(["study", "profile"]) & llm["primary"]], dims)
    write_via(lim.to_csv, out / "verify_limits.csv", index=False, float_format="%.6g")


def fit_cost_models(llm) -> dict:
    """Cost models of the target forward on the H200 (Llama-3.1-8B dims, the ``1-plugin-v1`` runs, every timed step but JIT
    outliers): ``all`` steps and ``decode`` steps only."""
    from ... import costmodel

    l8 = llm[(llm["model"] == "llama31-8b") & (~llm["outlier"]) & (llm["session"] == "1-plugin-v1")]
    fr = costmodel.fit(l8.reset_index(drop=True), name="llama3.1-8b-h200", hardware="1x NVIDIA H200 (141 GB), vLLM 0.25.0, "
                       "V1 runner, sync scheduling, CUDA graphs, bf16, dummy weights",
                       target_model="Llama-3.1-8B dimensions (meta-llama/Llama-3.1-8B-Instruct config)",
                       source="spec_repro vLLM plugin step timings on the lent H200, data/gpu/steps.parquet "
                              "(study + profile runs, all phases, JIT outliers removed)",
                       kinds={"eagle": "per_token", "ngram": "fraction"})
    dec = l8[l8["phase"] == "decode"].reset_index(drop=True)
    fd = costmodel.fit(dec, name="llama3.1-8b-h200-decode", kinds={"eagle": "per_token", "ngram": "fraction"})
    return {"all": fr, "decode": fd}


def write_cost_model(fits: dict, out: Path) -> None:
    """``costmodel_llama31_8b_h200.json``: the all-steps fit, in the cost-model preset format."""
    fits["all"].to_json(out / "costmodel_llama31_8b_h200.json")


def write_cost_model_compare(fits: dict, out: Path):
    """``costmodel_compare.csv``: the H200 fits beside the published H100 coefficients."""
    import pandas as pd

    from ... import costmodel

    h100 = costmodel.load_cost_model("llama3.1-8b-h100")
    cm = pd.DataFrame([{"fit": "H100 published", "c_kv": h100.c_kv, "c_tok": h100.c_tok, "c0": h100.c0,
                        "overhead": h100.overhead, "r2_target": None, "steps": None}] +
                      [{"fit": f"H200 {k} steps", "c_kv": f.model.c_kv, "c_tok": f.model.c_tok, "c0": f.model.c0,
                        "overhead": f.model.overhead, "r2_target": f.r2["target"], "steps": f.n_steps["target"]}
                       for k, f in fits.items()])
    write_via(cm.to_csv, out / "costmodel_compare.csv", index=False, float_format="%.6g")
    return cm


def write_smollm2(raws, out: Path) -> dict:
    """SmolLM2-135M, real weights: ``smollm2_vllm_outputs.jsonl`` (vLLM's greedy outputs),
    ``smollm2_vllm_steps.csv`` (its steps per request) and ``smollm2_agreement.json`` (vLLM's per-step acceptance
    vs predictions from the same outputs and vs the torch traces). Returns the agreement ({} without the run)."""
    import pandas as pd

    from .agreement import compare_torch_traces, ngram_agreement, request_steps, torch_profiler_predictor

    smol: dict = {}
    prompts_f = data_dir() / "gpu" / "smollm2_prompts.jsonl"
    sres = next(iter(_raw_files(raws, "results_smollm2.jsonl")), None)
    if sres is None or not prompts_f.exists():
        return smol
    prompts = {r["key"]: r["prompt_token_ids"] for r in map(json.loads, open(prompts_f))}
    outputs = {}
    k = None
    for line in open(sres):
        d = json.loads(line)
        if d["kind"] == "run":
            outputs.update(dict(zip(d["keys"], d["outputs"])))
            k = d["config"]["k"]
    with atomic_write(out / "smollm2_vllm_outputs.jsonl") as f:
        for key, o in outputs.items():
            f.write(json.dumps({"key": key, "output_token_ids": o}) + "\n")
    recs = [json.loads(x) for x in open(sres.parent / "steps_smollm2-ngram.jsonl") if x.strip()]
    per = request_steps(recs, prompts)
    write_via(pd.DataFrame([{"key": key, "position": p, "drafted": d, "accepted": a} for key, rows in per.items()
                            for p, d, a in rows]).to_csv, out / "smollm2_vllm_steps.csv", index=False)
    smol["k"] = k
    smol["vs_replica"] = ngram_agreement(recs, prompts, outputs, k=k)
    smol["vs_torch_profiler"] = ngram_agreement(recs, prompts, outputs, k=k, predictor=torch_profiler_predictor)
    smol["vs_torch_traces"] = compare_torch_traces(outputs, prompts, per, k)
    with atomic_write(out / "smollm2_agreement.json") as f:
        f.write(json.dumps(smol, indent=1, default=float) + "\n")
    return smol


def write_manifest(raws, engines: list, out: Path, command: str, final: Path | None = None) -> None:
    """``MANIFEST.json``: where and how the measurements were made (the device, from its engine records; dates and
    commands from ``sessions.json``), the SmolLM2 weights, and one entry per file with its sha256. ``out`` holds the
    files just written (a stage folder); ``final`` (default ``out``), the folder they will replace files in: its
    other files are recorded as they are."""
    from ...provenance import machine_info, package_versions, record, sha256_file

    meta = sessions()
    env = engines[0] if engines else {}
    # one GPU model throughout; how many GPUs an engine used, per ``session`` label
    counts: dict = {}
    for e in engines:
        counts.setdefault(int(e.get("gpu_count") or 1), set()).add(e["session"])
    smi = (env.get("nvidia_smi") or "").splitlines()[0].strip() if env.get("nvidia_smi") else None
    per = "; ".join(f"{n} GPU{'s' if n > 1 else ''} in " + ", ".join(sorted(v)) for n, v in sorted(counts.items()))
    gpu_desc = f"{smi} (per engine: {per})" if smi else None

    # where the numbers were measured (the device), not where this summary ran (recorded as summarized_on)
    dev = {"machine": {"gpu": gpu_desc or env.get("gpu"), "cuda": env.get("cuda"), "platform": env.get("platform"),
                       "python": env.get("python"), "gpu_mem_gib": env.get("gpu_mem_gib")},
           "versions": {"vllm": env.get("vllm"), "torch": env.get("torch"),
                        "spec-repro": package_versions().get("spec-repro")},
           "summarized_on": {"machine": machine_info(), "versions": package_versions()}}
    record(out / "MANIFEST.json", "_device_runs", kind="where and how the measurements were made", **dev,
           gpu=gpu_desc, device_torch=env.get("torch"), device_vllm=env.get("vllm"),
           device_python=env.get("python"), device_platform=env.get("platform"),
           dates_utc=meta["dates_utc"], device_command=meta["device_command"],
           jobs="data/gpu/jobs.json", summarize_command=command,
           engines=[{"spec": e["spec"], "session": e["session"], "start_s": round(e["start_s"], 1),
                     "instrumented": e["instrumented"], "gpu_count": e.get("gpu_count"),
                     "config": {k: v for k, v in e["config"].items() if v not in (None, {}, "")}} for e in engines])
    conv = next(iter(_raw_files(raws, "smollm2_convert.json")), None)
    if conv is not None:
        c = json.loads(conv.read_text())
        record(out / "MANIFEST.json", "_smollm2_weights", kind="the SmolLM2 weights vLLM ran",
               gguf=meta["smollm2_weights"]["gguf"], tensor_digest=c["digest"], params=c["params"], **dev,
               digest_method="spec_repro.engines.vllm.smollm2.tensor_digest(model.state_dict())",
               note=meta["smollm2_weights"]["note"])
    final = Path(final or out)
    files = {p.name: p for d in (final, out) for p in d.iterdir()   # out's (new) files win over final's
             if p.is_file() and not p.name.startswith(".")}          # not locks
    for name in sorted(files):
        if name in ("MANIFEST.json", "README.md"):
            continue
        record(out / "MANIFEST.json", name, file=name, description=FILE_DOCS.get(name, ""), **dev,
               kind="input (made on the CPU)" if name in ("smollm2_prompts.jsonl", "jobs.json", "sessions.json") else
               "measured on the lent H200 (see _device_runs), or computed from those measurements",
               sha256=sha256_file(files[name]))


def check_raw_out(raws, out) -> None:
    """Refuse (``OutputError``, one line) an ``out`` that is, holds or lies inside one of the ``raws``: the raw
    folders are searched recursively, so a second summary would read the first one's ``results.jsonl`` back."""
    import os

    from ...io import OutputError

    o = Path(os.path.realpath(Path(out).expanduser()))
    for r in raws:
        rr = Path(os.path.realpath(Path(r).expanduser()))
        if o == rr or o.is_relative_to(rr) or rr.is_relative_to(o):
            raise OutputError(f"--out {out} and --raw {r} overlap: the raw folders are searched recursively, "
                              f"so the summary's own files would be read back as device outputs; give an --out "
                              f"outside every --raw folder")


def summarize(raw, out: str | Path = "data/gpu", command: str = "") -> dict:
    """Write data/gpu's files from the raw device outputs (one folder or a list, searched recursively; see
    data/gpu/README.md), one ``write_*`` per file; returns headline numbers. The files are written into a stage
    folder and replace ``out``'s only once every one of them (MANIFEST.json included) was written: a failure
    leaves ``out`` as it was. ``out`` may not overlap a raw folder (``check_raw_out``)."""
    from ...io import staged_dir

    raws = [Path(raw)] if isinstance(raw, (str, Path)) else [Path(r) for r in raw]
    out = Path(out)
    check_raw_out(raws, out)
    with staged_dir(out) as stage:
        return _summarize(raws, stage, out, command)


def _summarize(raws: list[Path], out: Path, final: Path, command: str) -> dict:
    """``summarize`` writing into ``out`` (the stage) the files that will replace ``final``'s."""
    from .steps import flag_jit_outliers, model_dims

    runs, steps, engines = load_raw(raws)
    steps["run_kind"] = steps["run_id"].map(_run_kind)
    steps = flag_jit_outliers(steps)
    llm = steps[steps["spec"] != "smollm2-ngram"]
    tp = runs.groupby("model")["tensor_parallel_size"].max().to_dict()
    configs = data_dir() / "gpu" / "configs"
    dims = {m: {**model_dims(configs / d), "gpus": int(tp.get(m, 1))}
            for m, d in sessions()["model_configs"].items() if (configs / d).exists()}
    llm = write_steps(llm, dims, out)
    write_runs(runs, out)
    write_results(raws, out)
    pb = write_phase_breakdown(llm, out)
    ov = write_overhead(runs, out)
    write_verify_limits(llm, dims, out)
    fits = fit_cost_models(llm)
    write_cost_model(fits, out)
    cm = write_cost_model_compare(fits, out)
    smol = write_smollm2(raws, out)
    write_manifest(raws, engines, out, command, final)
    decode = pb[(pb.steps_kind == "decode") & pb.primary]
    return {"phase_breakdown_decode": decode[["model", "method", "batch_size", "total_ms", "drafting_share",
                                              "verification_share", "rejection_sampling_share",
                                              "overhead_share"]].round(4).to_dict("records"),
            "overhead": ov[["session", "batch_size", "overhead_mean", "overhead_median", "overhead_paired",
                            "overhead_paired_ci95"]].round(4).to_dict("records"),
            "costmodel": cm.to_dict("records"),
            "smollm2": {k2: {kk: v for kk, v in v2.items() if kk != "mismatches"} if isinstance(v2, dict) else v2
                        for k2, v2 in smol.items()}}
