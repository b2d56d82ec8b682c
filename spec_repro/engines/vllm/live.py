"""vLLM live on the H200 (``gpu/live_job.sh``) -> ``data/gpu/live*/``: compact tables from the raw
device folder (its ``results.jsonl`` and the plugin's ``steps_*.jsonl``; the raw step logs stay out of the repo).

What ran: vLLM 0.25.0 on one H200. Qwen2.5-Coder-1.5B-Instruct, real weights (the package's q4_k_m GGUF,
de-quantized, run in bf16), with the package's EAGLE head, n-gram and the 0.5B draft model: agreement prompts
and the live hybrid's task (code-edit, bs 1/8/32/64, k = 5, 3 repeats). Llama-3.1-8B dimensions, dummy weights:
no SD on vLLM's default engine (async scheduling, the runner vLLM picks, no plugin) and the study-like one
(synchronous V1 runner, plugin on), bs 1/16/64/256.

    python -m spec_repro.engines.vllm.live summarize --raw DIR [--out data/gpu/live]
    python -m spec_repro.engines.vllm.live profile --raw DIR [--out data/gpu/live/hybrid_trace.jsonl]
        # CPU, resumable (~20 s a request on 2 cores): the hybrid task's requests profiled on no SD's outputs
    python -m spec_repro.engines.vllm.live tables [--out data/gpu/live]      # the tables the note and README use
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from ...io import write_via
from ...paths import data_dir
from .labels import engine_config_label, run_labels

__all__ = ["FILE_DOCS", "ENGINE_NOTES", "TIMED", "read_runs", "step_configs", "load", "summarize", "throughput",
           "llama_baseline", "step_split", "profile_hybrid_task", "load_profiles", "host_index", "fit_step_model", "predict", "predict_runs",
           "measured_vs_predicted", "predicted_padded", "device_hybrid_table", "main"]

OUT = data_dir() / "gpu" / "live"
DIMS = {"qwen2.5-coder-1.5b": "qwen25_coder_1p5b", "llama31-8b": "llama31_8b"}
FILE_DOCS = {
    "runs.csv": "one row per timed run (engine spec, engine_config, method, hybrid policy, batch size, repeat, "
                "tok/s, wall s, vLLM's spec-decode counters, weights; what ran: runner (v1/v2) beside runner_forced, "
                "async_scheduling beside async_scheduling_forced, instrumented, runner_source: labels module)",
    "steps.parquet": "every step the plugin timed (STEP_COLUMNS + spec, engine_config, uniform, hybrid counts), "
                     "per-request detail left out",
    "lossless.csv": "per hybrid-task run: requests whose greedy output equals no SD's at the same batch size",
    "qwen_agreement.json": "vLLM's accepted tokens per step vs the profiler's prediction on vLLM's own outputs "
                           "(EAGLE head, n-gram, 0.5B draft model)",
    "hybrid_trace.jsonl": "the hybrid task's code-edit requests profiled on no SD's outputs (n-gram, EAGLE head; "
                          "torch float32 on the CPU, `live profile`): the predictor's input",
    "predicted.csv": "measured tok/s of each live configuration beside three predictions over hybrid_trace.jsonl "
                     "(cost models fitted on the same run's steps; measured_vs_predicted)",
    "hybrid_trace_s4.jsonl": "the same 64 requests' committed no-SD outputs (data/gpu/live) profiled with the head "
                             "trained in data/gpu/live4's run (sha256 2dce8ecc, 2026-12-02; n-gram, EAGLE; bf16 on the "
                             "H200, `live profile --device cuda`)",
    "hybrid_trace_s5.jsonl": "the same, profiled with the head trained in data/gpu/live5's run (sha256 cae15564, "
                             "2026-12-02; bf16 on the H200)",
    "hybrid_trace_s9.jsonl": "this run's code-edit no-SD outputs (bs 64) profiled with the head ff44a72f "
                             "(trained in data/gpu/live6's run; n-gram, EAGLE; bf16 on the H200)",
    "host.txt": "the H200 host during the run: lscpu, CPU clocks, the GPU's clocks and performance state",
    "device_hybrid.csv": "the device-side hybrid's comparison per batch size: each configuration's tok/s over the "
                         "best single proposer and over EAGLE, its prediction, measured vs predicted decode steps "
                         "(device_hybrid_table)",
    "device_hybrid_sharegpt.csv": "the same on sharegpt (device_hybrid_table(workload='sharegpt'))",
    "hybrid_trace_sharegpt_s8.jsonl": "this run's sharegpt no-SD outputs (its bs 64 run) profiled with the head "
                                      "ff44a72f trained in the same run (n-gram, EAGLE; torch float32 on the CPU, "
                                      "`live profile --device cpu`, after the run)",
    "hybrid_trace_sharegpt_s10.jsonl": "this run's sharegpt no-SD outputs (bs 64) profiled with the head ff44a72f "
                                       "(trained in data/gpu/live6's run; n-gram, EAGLE), in the run's request "
                                       "order (the predictor walks the first B); the device is each record's "
                                       "`device`: in data/gpu/live8 the CPU in float32, 61 of its 64 records "
                                       "from data/gpu/live6's profile of equal outputs; in data/gpu/live9 bf16 on "
                                       "the H200",
    "hybrid_trace_s11.jsonl": "a run's code-edit no-SD outputs (bs 64) profiled with the head of the same run "
                              "(n-gram, EAGLE; bf16 on the H200)",
    "hybrid_trace_sharegpt_s11.jsonl": "this run's sharegpt no-SD outputs (bs 64) profiled with the head 38d37cbe "
                                       "trained in the same run (2026-12-04; n-gram, EAGLE; bf16 on the H200), in "
                                       "the run's request order",
    "head.sha256": "sha256 of the EAGLE head the run used: trained in it (`TRAIN=1 gpu/live_job.sh start`: "
                   "2dce8ecc in live4, cae15564 in live5, ff44a72f in live6, 38d37cbe in live10) or "
                   "staged from the cache (ff44a72f in live7, live8, live9)",
    "head_TRAINING.json": "that head's training record (data, split by source, steps, held-out tokens/step)",
    "head_config.json": "that head's config.json",
}
ENGINE_NOTES = {
    "v1-forced": "the V1 runner forced (VLLM_USE_V2_MODEL_RUNNER=0: the plugin's hooks live there; vLLM itself picks "
                 "V2 for EAGLE and no SD on a dense target), vLLM's own scheduling: async where vLLM allows it (off "
                 "for n-gram and the draft model). Labelled `default` in tables made before the runner was recorded",
    "study-like": "synchronous V1 runner (both forced), as the study's vLLM 0.10 ran",
    "default": "vLLM chose everything: its runner (V2 for EAGLE and no SD, V1 for n-gram) and async scheduling; "
               "timed only where vLLM ran V1 (the plugin's hooks are the V1 runner's). Labelled `vllm-default` in "
               "older specs",
}


TIMED = "v1-forced"      # the configuration the plugin timed the live runs on (the V1 runner, forced)


def read_runs(out: str | Path = OUT):
    """``out``'s runs.csv with the runner labels (``labels.relabel_runs``: a table written before they existed,
    its forced V1 runner called ``default``, reads as ``v1-forced``)."""
    import pandas as pd

    from .labels import relabel_runs

    from ...provenance import verify_recorded

    return relabel_runs(pd.read_csv(verify_recorded(Path(out) / "runs.csv")))


def _config(cfg: dict) -> str | None:
    """The configuration a run measured: vLLM's method, the hybrid policy, ``<policy>-pad``, ``ngram-pad``."""
    from .jobs import config_label

    return config_label(cfg) if cfg else None


def _cfg_fields(cfg: dict, engine: dict) -> dict:
    return {"config": _config(cfg), "hybrid": cfg.get("hybrid"), "hybrid_pad": bool(cfg.get("hybrid_pad")),
            "model_runner": cfg.get("model_runner"), "load_format": cfg.get("load_format"),
            "weights": "dummy" if cfg.get("load_format") == "dummy" else "real (q4_k_m GGUF, bf16)",
            "dtype": cfg.get("dtype"), "draft": Path(cfg["draft"]).name if cfg.get("draft") else None,
            "instrumented": bool(engine.get("instrumented")), "max_num_seqs": cfg.get("max_num_seqs"),
            **run_labels(cfg, engine)}      # runner, async scheduling (read from vLLM where recorded), engine_config


def step_configs(run_ids, ecfg: dict, spec: str = ""):
    """The configuration of each step row of an engine (``ecfg``: its config): the engine's, or for a rotated
    engine (``hybrid_rotate``) the policy its run id names (``<w>-b<B>-c<chunk>@<policy>-r<repeat>``)."""
    import pandas as pd

    run_ids = pd.Series(run_ids)
    if not ecfg.get("hybrid_rotate"):
        return pd.Series([_config(ecfg) or spec] * len(run_ids), index=run_ids.index)
    from .jobs import rotated_run_config

    pol = run_ids.str.extract(r"@(.+)-r-?\d+$")[0]
    return pol.map({p: _config(rotated_run_config(ecfg, p)) for p in ecfg["hybrid_rotate"]})


def load(raw: str | Path):
    """(runs, steps, engines) from a raw folder (searched recursively)."""
    import pandas as pd

    from ...traces import read_step_records

    raw = Path(raw)
    recs = [json.loads(x) for f in sorted(raw.rglob("results*.jsonl")) for x in open(f) if x.strip()]
    engines = {d["spec"]: d for d in recs if d.get("kind") == "engine"}
    runs = []
    for d in recs:
        if d.get("kind") != "run":
            continue
        e = engines.get(d["spec"], {})
        row = {k: v for k, v in d.items() if k not in ("outputs", "keys", "config", "kind")}
        row.pop("engine_config", None)       # the spec's own label: replaced by what its forced settings make
        row.update(_cfg_fields(d.get("config") or e.get("config") or {}, e))   # a rotated engine's run: its policy's
        for c in ("per_position_rate", "accepted_per_pos"):
            row[c] = json.dumps(row.get(c))
        runs.append(row)
    parts = []
    for f in sorted(raw.rglob("steps_*.jsonl")):
        spec = f.stem[len("steps_"):]
        df, extra = read_step_records(f)
        df["t_sched"] = [x.get("t_sched", 0.0) for x in extra]
        df["outputs_known"] = [x.get("outputs_known", True) for x in extra]
        for key in ("ngram", "eagle", "none", "ngram_tokens", "eagle_tokens", "pad_tokens", "pad_accepted"):
            df[f"hybrid_{key}"] = [(x.get("hybrid") or {}).get(key) for x in extra]
        df["spec"] = spec
        df["config"] = step_configs(df["run_id"], engines.get(spec, {}).get("config") or {}, spec)
        ecfg = engines.get(spec, {}).get("config") or {}
        df["engine_config"] = engine_config_label(ecfg.get("model_runner"), ecfg.get("async_scheduling"))
        parts.append(df)
    steps = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if len(steps):
        steps["uniform"] = (steps["k"] == 0) | (steps["batched_tokens"] == steps["num_reqs"] * (1 + steps["k"]))
    return pd.DataFrame(runs), steps, list(engines.values())


def summarize(raw: str | Path, out: str | Path = OUT, command: str = "") -> dict:
    """Write ``out``'s files (FILE_DOCS) from the raw folder; MANIFEST.json records each with its sha256."""
    import datetime as dt

    import pandas as pd

    from ...provenance import machine_info, package_versions, record, sha256_file
    from .agreement import agreement_report
    from .jobs import lossless_report
    from .summary import check_raw_out

    raw, out = Path(raw), Path(out)
    check_raw_out([raw], out)       # the raw folder is searched recursively: out may not overlap it
    out.mkdir(parents=True, exist_ok=True)
    runs, steps, engines = load(raw)
    write_via(runs.to_csv, out / "runs.csv", index=False)
    keep = [c for c in steps.columns if c not in ("accepted_per_req",)]
    write_via(steps[keep].to_parquet, out / "steps.parquet", compression="zstd", index=False)
    ll, agree = [], {}
    for qres in sorted(raw.rglob("qwen*/results.jsonl")):     # every Qwen results folder: qwen, qwen2, ...
        recs = [json.loads(x) for x in open(qres) if x.strip()]
        ll += lossless_report(recs)
        if any(d.get("task") == "prompts" for d in recs):       # the agreement engines
            agree.update(agreement_report(qres.parent))
    if ll:
        ll = pd.DataFrame(ll)
        ll["first_difference"] = ll["first_difference"].map(lambda v: json.dumps(v) if v else "")
        write_via(ll.to_csv, out / "lossless.csv", index=False)
    if agree:
        (out / "qwen_agreement.json").write_text(json.dumps(agree, indent=1, default=float) + "\n")
    if (out / "hybrid_trace.jsonl").exists():     # made on the CPU by `profile` (the predictor's input)
        write_via(measured_vs_predicted(out).to_csv, out / "predicted.csv", index=False, float_format="%.6g")
    ta = table_args(out)
    for name, wl in TABLES.items():   # where a workload's profile is here (copied from the raw folder: the GPU's)
        if device_trace(out, wl) is not None:
            _write_table(out, name, wl, ta)
    env = engines[0].get("env", {}) if engines else {}
    when = max((f.stat().st_mtime for f in raw.rglob("results*.jsonl")), default=None)
    # where the numbers were measured (the device), not where this summary ran (summarized_on)
    dev = {"machine": {k: env.get(k) for k in ("gpu", "gpu_mem_gib", "cuda", "platform", "python")},
           "versions": {"vllm": engines[0].get("vllm") if engines else None, "torch": env.get("torch"),
                        "spec-repro": package_versions().get("spec-repro")},
           "summarized_on": {"machine": machine_info(), "versions": package_versions()}}
    if when is not None:
        dev["date"] = dt.datetime.fromtimestamp(when, dt.timezone.utc).isoformat(timespec="seconds")
    record(out / "MANIFEST.json", "_device_runs", kind="where and how the measurements were made", **dev,
           summarize_command=command, engine_configs=ENGINE_NOTES,
           engines=[{"spec": e["spec"], "engine_config": run_labels(e.get("config") or {}, e)["engine_config"],
                     "start_s": round(e["start_s"], 1), "instrumented": e.get("instrumented"),
                     **({"resolved": e["resolved"]} if e.get("resolved") else {}),
                     "config": {k: (Path(v).name if k in ("model", "draft", "step_log") and isinstance(v, str)
                                    else v) for k, v in e["config"].items() if v not in (None, {}, "")}}
                    for e in engines])
    for name in sorted(p.name for p in out.iterdir() if p.is_file() and not p.name.startswith(".")):  # not locks
        if name in ("MANIFEST.json", "README.md"):
            continue
        cpu = name.startswith("hybrid_trace") and _profiled_on(out / name) != "cuda"    # `live profile` here
        kind = ("computed on the CPU from the H200's no-SD outputs (torch float32)" if cpu else
                "measured on the lent H200 (see _device_runs), or computed from those measurements")
        record(out / "MANIFEST.json", name, file=name, description=FILE_DOCS.get(name, ""),
               sha256=sha256_file(out / name), kind=kind, **({} if cpu else dev))
    return {"runs": len(runs), "steps": len(steps), "engines": len(engines)}


def _profiled_on(path: Path) -> str | None:
    """The device a ``live profile`` file was profiled on (its records' ``device``; None in files that predate it)."""
    with open(path) as f:
        first = f.readline()
    return json.loads(first).get("device") if first.strip() else None


# ---- tables ---------------------------------------------------------------------------------------------------
def _dims(model: str) -> dict:
    from .steps import model_dims

    return model_dims(data_dir() / "gpu" / "configs" / DIMS[model] / "config.json")


def step_floor_s(model: str, batch: int, context: float) -> float:
    """HBM floor of one decode step: streamed weights + the batch's KV cache read, over 4.8 TB/s (the floor
    ``steps.add_physical_limits`` puts beside every logged step, at a step of ``batch`` requests)."""
    from .steps import H200_HBM_BYTES_PER_S, streamed_bytes

    d = _dims(model)
    return float(streamed_bytes(d, batch) + batch * context * d["kv_bytes_per_token"]) / H200_HBM_BYTES_PER_S


def throughput(runs=None, out: str | Path = OUT, workload: str = "code-edit"):
    """Per model, configuration and batch size: output tok/s per repeat (a repeat's tokens over its wall time),
    mean / min / max over repeats, vLLM's acceptance length, and the HBM ceiling (batch x tokens per step / the
    step floor at the run's mean context: its first prompt's length plus half the tokens each request
    generates) beside it. ``workload``: the hybrid runs of that workload (the Llama batches have none: always
    kept)."""
    import pandas as pd

    runs = read_runs(out) if runs is None else runs
    runs = runs[runs["task"].isin(["hybrid", "batches"])].copy()
    if "workload" in runs:
        runs = runs[runs["workload"].isna() | (runs["workload"] == workload)]
    runs["repeat"] = runs["repeat"].fillna(runs["run_id"].str.extract(r"-r(\d+)$")[0].astype(float))
    runs["tokens"] = runs["output_tokens"]                      # all requests' output tokens of the run
    runs["out_per_req"] = runs["output_tokens"] / runs["n_requests"]
    g = runs.groupby(["model", "engine_config", "config", "batch_size", "repeat"]).agg(
        tokens=("tokens", "sum"), wall=("wall_s", "sum"), acc=("num_accepted_tokens", "sum"),
        drafts=("num_drafts", "sum"), prompt_len=("prompt_len", "mean"), out=("out_per_req", "mean")).reset_index()
    g["tok_s"] = g["tokens"] / g["wall"]
    t = g.groupby(["model", "engine_config", "config", "batch_size"]).agg(
        tok_s=("tok_s", "mean"), tok_s_min=("tok_s", "min"), tok_s_max=("tok_s", "max"), repeats=("tok_s", "size"),
        acc=("acc", "sum"), drafts=("drafts", "sum"), prompt_len=("prompt_len", "mean"), out=("out", "mean")
    ).reset_index()
    t["acceptance_length"] = (1 + t["acc"] / t["drafts"]).where(t["drafts"] > 0, 1.0)
    t["floor_step_ms"] = [1e3 * step_floor_s(m, b, p + o / 2) for m, b, p, o in
                          zip(t["model"], t["batch_size"], t["prompt_len"], t["out"])]
    t["ceiling_tok_s"] = t["batch_size"] * t["acceptance_length"] / (t["floor_step_ms"] / 1e3)
    t["share_of_ceiling"] = t["tok_s"] / t["ceiling_tok_s"]
    return t.drop(columns=["acc", "drafts", "prompt_len", "out"])


def llama_baseline(out: str | Path = OUT, committed: str | Path | None = None):
    """Llama-3.1-8B dims, no SD: the default engine beside the study-like one (both in ``out``) and the
    committed study-like baseline (data/gpu/runs.csv); the committed SD throughputs as speedups over
    each baseline."""
    import pandas as pd

    t = throughput(out=out)
    t = t[t["model"] == "llama31-8b"].pivot_table(index="batch_size", columns="engine_config", values="tok_s")
    c = pd.read_csv(committed or data_dir() / "gpu" / "runs.csv")
    c = c[(c["model"] == "llama31-8b") & c["primary"] & (c["task"] == "batches")]
    old = c.pivot_table(index="batch_size", columns="spec", values="output_tok_per_s")
    res = pd.DataFrame({"default": t["default"], "study_like": t["study-like"],
                        "committed_study_like": old["llama8b-none-s3"]})
    res["default_over_study_like"] = res["default"] / res["study_like"]
    res["floor_tok_s"] = [b / step_floor_s("llama31-8b", b, 512 + 128) for b in res.index]
    for spec, name in (("llama8b-ngram-s3", "ngram"), ("llama8b-eagle-al2.5", "eagle_al2.5")):
        res[f"{name}_vs_default"] = old[spec].reindex(res.index) / res["default"]
        res[f"{name}_vs_committed"] = old[spec].reindex(res.index) / res["committed_study_like"]
    return res.reset_index()


def step_split(out: str | Path = OUT):
    """Median ms per phase of the Qwen decode steps, per configuration, batch size and whether the batch was
    uniform (every request scheduled 1 + k tokens: vLLM's full CUDA graph) or not."""
    import pandas as pd

    from ...provenance import verify_recorded

    s = pd.read_parquet(verify_recorded(Path(out) / "steps.parquet"))
    s = s[(s["phase"] == "decode") & s["run_id"].str.startswith("code-edit")]
    g = s.groupby(["config", "batch_size", "uniform"]).agg(
        steps=("t_total", "size"), tokens=("batched_tokens", "mean"), draft_ms=("t_draft", "median"),
        verify_ms=("t_verify", "median"), reject_ms=("t_reject", "median"), other_ms=("t_other", "median"),
        total_ms=("t_total", "median")).reset_index()
    for c in ("draft_ms", "verify_ms", "reject_ms", "other_ms", "total_ms"):
        g[c] *= 1e3
    return g


# ---- the live configurations simulated over the run's own outputs ----------------------------------------------
FIT_CONFIGS = ("none", "eagle", "ngram")          # the cost model is fitted on these; the hybrids are predicted
LIVE_CONFIGS = ("none", "eagle", "ngram", "pr24344", "pr24344-skip")
K = 5


def profile_hybrid_task(raw: str | Path | None, out: str | Path = OUT / "hybrid_trace.jsonl",
                        head: str | Path | None = None, workload: str = "code-edit", n: int = 64, k_max: int = 8,
                        max_tokens: int = 256, max_model_len: int = 4096, progress=print,
                        trace: str | Path | None = None, device: str = "cpu") -> Path:
    """The hybrid task's ``workload`` requests (as ``jobs._hybrid_task`` loads them: the first ``n`` by the
    workload's seeded order, Qwen's chat template) profiled with n-gram and the EAGLE head (torch, float32 on the
    CPU; ``device="cuda"`` on a GPU host) on no SD's outputs (bs 64, repeat 0, from the raw folder ``raw``; or
    ``trace=``: the outputs of an earlier ``hybrid_trace.jsonl``, e.g. to profile them with another head): one
    JSON line per request, appended (a killed run resumes)."""
    import time

    import torch
    from transformers import AutoTokenizer

    from ... import models
    from ... import workloads as W
    from ...collect import build_proposers
    from .agreement import profile_outputs

    outs = {}
    if trace is not None:
        outs = {d["key"]: d["output"] for d in load_profiles(trace)}
    for f in (sorted(Path(raw).rglob("results*.jsonl")) if raw is not None else []):
        for line in open(f):
            d = json.loads(line)
            if (d.get("task") == "hybrid" and re.search(r"-none(-|$)", d.get("spec", "")) and d.get("repeat") == 0
                    and d.get("workload") == workload and d.get("batch_size") == n):
                outs.update(zip(d["keys"], d["outputs"]))
    if not outs:
        raise SystemExit(f"live profile: no no-SD hybrid run at bs {n} on {workload} under {raw or trace}")
    out = Path(out)
    done = {json.loads(x)["key"] for x in open(out) if x.strip()} if out.exists() else set()
    tok = AutoTokenizer.from_pretrained(models.converted_dir(QWEN))
    reqs = W.load(workload, n=n, seed=0, tokenizer=tok, max_prompt_tokens=max_model_len - max_tokens)
    todo = [r for r in reqs if r.id in outs and r.id not in done]
    if not todo:
        return out
    torch.set_num_threads(max(1, torch.get_num_threads()))
    target, _ = models.load(QWEN, device=device)
    props = build_proposers(["ngram", "eagle"], target, eagle_head=str(head or default_head()))
    for r in todo:
        t0 = time.time()
        prof = profile_outputs({r.id: list(r.prompt_token_ids)}, {r.id: outs[r.id]}, props, k_max=k_max)
        rec = {"key": r.id, "prompt_len": len(r.prompt_token_ids), "output": list(map(int, outs[r.id])),
               "acc": {m: prof[m][r.id][0] for m in props}, "draft_len": {m: prof[m][r.id][1] for m in props},
               "seconds": time.time() - t0, "device": device}
        with open(out, "a") as f:
            f.write(json.dumps(rec) + "\n")
        progress(f"{r.id} {rec['seconds']:.1f}s")
    return out


QWEN = "qwen2.5-coder-1.5b"


def default_head() -> Path:
    """The EAGLE head committed for Qwen2.5-Coder-1.5B (``data/heads/``), joined and verified from its parts (on
    the device machine: the copy ``gpu/stage_cache.sh`` staged in the cache)."""
    from ...proposers.eagle_files import committed_head

    return committed_head(QWEN)


def load_profiles(path: str | Path | None = None) -> list[dict]:
    """``hybrid_trace.jsonl``: per request its prompt length, the greedy output (no SD, bs 64) and, per proposer,
    ``acc[p-1]`` (tokens one step yields from output position p, k_max 8) and ``draft_len[p-1]`` (n-gram's match
    length, 0 = no match), in the hybrid task's request order."""
    return [json.loads(x) for x in open(path or OUT / "hybrid_trace.jsonl") if x.strip()]


def _lin(X, y, groups=None):
    """Least squares; with ``groups`` every group (a configuration's batch size) weighs alike, however many
    steps it has (bs 1 runs 8x the steps of bs 8 and would otherwise set every slope)."""
    import numpy as np

    X, y = np.asarray(X, float), np.asarray(y, float)
    if groups is not None:
        g = np.asarray(groups)
        _, inv, cnt = np.unique(g, return_inverse=True, return_counts=True)
        w = np.sqrt(1.0 / cnt[inv])
        X, y = X * w[:, None], y * w
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    return [float(c) for c in coef]


HOST_PHASES = ("t_draft", "t_other", "t_reject")    # the host's share of a step: all but the target's forward


def host_index(steps, phase: str = "t_other"):
    """The host's speed during each run, from the run's own steps: the median ``phase`` of its decode steps over
    the median of those run medians in the same engine (``spec``) at the same batch size; 1 = the engine's
    typical host at that size, 1.5 = its host phases take 1.5x as long. Indexed by (spec, run_id).

    Why a run's own phase: the lent H200's host (a KVM guest) runs in slow and fast epochs of ~10-60 s; inside one
    engine its host phases (EAGLE's drafting, t_other) rise 1.5-2.5x together for stretches of runs while the
    target's forward (t_verify) stays flat (data/gpu/live5: across the rotated engine's runs at one batch size
    the run medians of t_other and t_draft correlate at r = 0.93-0.99 within a policy; data/gpu/hostdrift: r =
    0.99-1.00 over 14-90 runs, where a CPU probe timed in the driver process does not, r = -0.1 to 0.1). The
    default, ``t_other`` (input preparation, bookkeeping, the engine core's scheduling and output processing), is
    what EAGLE alone, the idle hybrid and both device-side policies share: on a quiet host (the 10th percentile
    of a policy's steps) gpu-pr24344's is -6 / -4 / +24 / -6% of gpu-eagle-only's at bs 1 / 8 / 32 / 64 (EAGLE
    alone's 7-35% above both), against the 1.5-2x the epochs move it. ``predict_runs`` scales the step model's
    host terms by it; a batch size's reference cancels there (the host-scaled model is fitted on steps divided by
    the same index), so only the run-to-run ratio matters. The reference is per engine: it tells a policy's host
    apart only where it shares an engine with the configurations fitted (a rotated engine: data/gpu/live5), not
    between engines (one per policy: data/gpu/live4). The worker's probe read before and after each run
    (``engine_probe_ms``), tried as this index on data/gpu/live10, tracks a run's drafting less well than its own t_other and predicts no
    better; where one policy's t_other is not the host's (data/gpu/live9, gpu-pr24344 at bs 64) the index misses."""
    d = steps[steps["phase"] == "decode"]
    run = d.groupby(["spec", "batch_size", "run_id"])[phase].median()
    return (run / run.groupby(level=["spec", "batch_size"]).transform("median")).droplevel("batch_size")


def fit_step_model(out: str | Path = OUT, configs=FIT_CONFIGS, ragged: bool = True, hybrid_configs=(),
                   per_bs: bool = False, host_scaled: bool = False, workload: str = "code-edit") -> dict:
    """Step-time components fitted on the decode steps of ``configs`` (``workload``'s, in ``out``), in the package
    cost model's form, seconds: target forward ``F = c_kv*kv + c_tok*n + c0`` (``ragged``: a second F for batches
    that are not uniform, i.e. not every request scheduled 1 + k tokens: vLLM 0.25's V1 runner replays its full
    CUDA graph only for uniform decode batches; without ``ragged`` one F for all, as ``costmodel.fit`` does);
    EAGLE drafting per token ``k*(c_req*m + c0)``, m = requests drafted for; n-gram lookup per request; overhead
    (t_other + t_reject) per step ``o0 + o1*B`` per engine path (no SD; EAGLE, whose path the hybrids take;
    n-gram, synchronous); wall over summed step time per path (async scheduling hides part of a step behind the
    next); prefill ``c0 + c_tok * prompt tokens``; with ``hybrid_configs``, the hybrid's own per-step work
    ``h0 + h1*B`` (its drafting time beyond EAGLE's) fitted on those. Every fit weighs each configuration's batch
    size alike. ``per_bs``: the host terms (overhead, EAGLE's drafting per token, the hybrid's own work) also as
    one mean per batch size (``by_bs``), which ``_walk`` uses for a chunk of that size: the host's cost measured
    at the size predicted instead of a line through all sizes (the line misses bs 8 by 15-20% in sample on
    data/gpu/live5's steps); the target's forward stays the fit; and wall over summed step time per batch size
    and path, the hybrids' from their idle counterpart (``hybrid_configs``): async scheduling hides a share of
    no SD's step that grows with the batch, and of the device-side machinery's at bs 32 / 64 only.
    ``host_scaled`` (implies ``per_bs``): every step's host phases (``HOST_PHASES``) divided by its run's
    ``host_index`` first, so the host terms are those of the engine's typical host at each batch size, to be
    scaled back by the index of the run predicted (``_walk``'s ``host``, ``predict_runs``; the index of every run
    of the workload is kept as ``host_index``); the hybrid's own term is then its drafting beyond the
    per-batch-size EAGLE drafting (not beyond the line, which would fold the line's miss at that size into it)."""
    import numpy as np
    import pandas as pd

    s = pd.read_parquet(Path(out) / "steps.parquet")
    s = s[s["run_id"].str.startswith(workload) & (s["engine_config"] == TIMED)]
    missing = [c for c in configs if not (s["config"] == c).any()]
    if missing:
        raise ValueError(f"fit_step_model: no {workload} steps of {', '.join(missing)} on the forced V1 runner "
                         f"(v1-forced) in {Path(out) / 'steps.parquet'} (the fit needs every configuration of "
                         f"{list(configs)})")
    m = {"ragged": ragged, "fitted_on": list(configs), "host_scaled": host_scaled}
    if host_scaled:     # the index from every run of the engine (its reference cancels: host_index)
        per_bs = True
        m["host_index"] = host_index(s)
        h = pd.Series(list(zip(s["spec"], s["run_id"]))).map(m["host_index"]).fillna(1.0).to_numpy()
        s = s.assign(**{c: s[c] / h for c in HOST_PHASES})
    s = s[s["config"].isin(tuple(configs) + tuple(hybrid_configs))]
    dec = s[s["phase"] == "decode"]
    fit_dec = dec[dec["config"].isin(configs)]
    X = lambda d: np.column_stack([d["kv_tokens"], d["batched_tokens"], np.ones(len(d))])
    grp = lambda d: d["config"] + "/" + d["batch_size"].astype(str)
    if ragged:
        u, r = fit_dec[fit_dec["uniform"]], fit_dec[~fit_dec["uniform"]]
        m["F_uniform"], m["F_ragged"] = _lin(X(u), u["t_verify"], grp(u)), _lin(X(r), r["t_verify"], grp(r))
    else:
        m["F_uniform"] = m["F_ragged"] = _lin(X(fit_dec), fit_dec["t_verify"], grp(fit_dec))
    e = dec[dec["config"] == "eagle"]
    kk = e["num_draft_tokens"] / e["num_reqs"]
    m["eagle_draft"] = _lin(np.column_stack([kk * e["num_reqs"], kk]), e["t_draft"], grp(e))     # per token: c_req, c0
    n = dec[dec["config"] == "ngram"]
    # no n-gram run (the GPU profile's grid): its lookups are inside the hybrid's own term (hybrid_configs)
    m["ngram_draft"] = _lin(np.column_stack([n["num_reqs"]]), n["t_draft"], grp(n)) if len(n) else [0.0]
    path = dec["config"].map(lambda c: c if c in ("none", "ngram") else "eagle")
    for name in ("none", "eagle", "ngram"):
        g = dec[path == name]
        if len(g):
            m[f"overhead_{name}"] = _lin(np.column_stack([np.ones(len(g)), g["num_reqs"]]), g["t_other"] + g["t_reject"],
                                         grp(g))
    runs = read_runs(out)
    runs = runs[(runs["task"] == "hybrid") & (runs["engine_config"] == TIMED)]
    ratio = (runs.set_index(["config", "run_id"])["wall_s"] / s.groupby(["config", "run_id"])["t_total"].sum()).dropna()
    m["wall_over_steps"] = {c: float(ratio.loc[c].median()) for c in ("none", "eagle", "ngram") if c in configs}
    hy = dec[dec["config"].isin(hybrid_configs)]
    if len(hy):   # the hybrid's own per-step work (n-gram lookups, the policy, mixing): drafting beyond EAGLE's
        eag = np.where(hy["config"].isin(("pr24344", "pr24344-pad", "eagle-only")) | hy["config"].str.startswith("gpu-")
                       | (hy["hybrid_eagle"].fillna(0) > 0),
                       1.0, 0.0)                                                                   # EAGLE ran
        extra = hy["t_draft"] - K * (m["eagle_draft"][0] * hy["num_reqs"] + m["eagle_draft"][1]) * eag
        m["hybrid_overhead"] = _lin(np.column_stack([np.ones(len(hy)), hy["num_reqs"]]), extra, grp(hy))
    if per_bs:   # per batch size: each configuration's mean weighs alike (as the fits' groups do)
        mean_by_bs = lambda d, v: {int(b): float(x) for b, x in
                                   v.groupby([d["batch_size"], d["config"]]).mean().groupby(level=0).mean().items()}
        m["by_bs"] = {f"overhead_{name}": mean_by_bs(dec[path == name], (dec["t_other"] + dec["t_reject"])[path == name])
                      for name in ("none", "eagle", "ngram") if (path == name).any()}
        if len(e):
            m["by_bs"]["eagle_draft"] = mean_by_bs(e, e["t_draft"] / kk)        # per drafted token, whole batch
        if len(hy):
            # beyond the per-batch-size EAGLE drafting that _walk adds with it (not beyond the line: that folded
            # the line's miss at each size into the hybrid's own term, -0.6 ms a step at bs 8 in data/gpu/live5)
            extra = hy["t_draft"] - K * hy["batch_size"].map(m["by_bs"]["eagle_draft"]) * eag
            m["by_bs"]["hybrid_overhead"] = mean_by_bs(hy, pd.Series(extra, index=hy.index))
        # wall over summed step time per batch size: async scheduling hides a share of the step that grows with
        # the batch (no SD 0.89 at bs 1 to 0.77 at bs 64 in data/gpu/live9 and live10: one median for all sizes
        # predicted no SD 10-11% slow at bs 64 IN sample), and the device-side machinery overlaps ~5% of its step at
        # bs 32 / 64 where EAGLE alone overlaps none: the hybrids take their idle counterpart's (``hybrid_configs``)
        bs_of = runs.set_index(["config", "run_id"])["batch_size"]
        wos = pd.DataFrame({"ratio": ratio, "batch_size": bs_of.reindex(ratio.index)}).dropna()
        of = lambda cs: wos[wos.index.get_level_values("config").isin(cs)]
        per = lambda cs: {int(b): float(x) for b, x in of(cs).groupby("batch_size")["ratio"].median().items()}
        m["by_bs"]["wall_over_steps"] = {c: per((c,)) for c in ("none", "eagle", "ngram") if c in configs}
        if len(hy):
            m["by_bs"]["wall_over_steps"]["hybrid"] = per(tuple(hybrid_configs))
    pre = s[s["phase"] != "decode"]
    m["prefill"] = _lin(np.column_stack([np.ones(len(pre)), pre["batched_tokens"]]), pre["t_total"])
    return m


def rule_steps(reqs: list[dict], B: int, k: int = K, cost_model=None) -> list[list[tuple[int, int, bool]]]:
    """adaptive-rule's steps over profiled requests (``load_profiles`` records) at batch size ``B``, as the
    simulator takes them (``adaptive.adaptive_steps``, the decisions the live policy takes step for step:
    tests/test_hybrid.py): per request, per step, (draft tokens verified, tokens accepted, EAGLE drafted).
    ``cost_model``: the rule's (default: the one the live runs priced proposals with, ``hybrid_jobs.ADAPTIVE_COST``)."""
    from ... import adaptive as AD
    from ...costmodel import load_cost_model
    from ...simcore import group_arrays
    from ...traces import Trace
    from .hybrid_jobs import ADAPTIVE_COST

    props = ["ngram", "eagle"]
    t = Trace.from_arrays({r["key"]: {q: r["acc"][q] for q in props} for r in reqs},
                          prompt_lens={r["key"]: r["prompt_len"] for r in reqs}, dataset="live", model=QWEN,
                          draft_lens={r["key"]: {"ngram": r["draft_len"]["ngram"]} for r in reqs})
    ids = [r["key"] for r in reqs]
    g = group_arrays(t.acc, t.requests, props, ids)
    cm = load_cost_model(cost_model or ADAPTIVE_COST)
    st = AD.adaptive_steps(g, t.requests, props, "adaptive-rule", int(B), cm, int(k))
    out: list[list] = [[] for _ in reqs]
    for i, p, inp, gen, v, ea in zip(st.req.tolist(), st.p.tolist(), st.inp.tolist(), st.gen.tolist(),
                                     st.verified.tolist(), st.ran[props.index("eagle")].tolist()):
        out[i].append((p, int(inp) - 1 if v in (0, 1) else 0, int(gen) - 1, bool(ea)))
    return [[x[1:] for x in sorted(o)] for o in out]


def _walk(reqs: list[dict], config: str, model: dict, max_tokens: int = 256, k: int = K, host: float = 1.0) -> dict:
    """One chunk of requests decoded together, step by step, as the live engine runs ``config``: returns tokens,
    steps, seconds (the model's), ragged steps. ``host``: the host terms (overhead, drafting, the hybrid's own
    work; not the target's forward or the prefill) times this (a run's ``host_index``). ``adaptive-rule[-pad]``:
    each request's steps are the simulator's (``rule_steps``), its host machinery the hybrid's own term."""
    import numpy as np

    B = len(reqs)
    p = np.ones(B, int)                                  # tokens produced (1 after prefill)
    P = np.array([r["prompt_len"] for r in reqs])
    t = model["prefill"][0] + model["prefill"][1] * P.sum()
    steps = ragged_steps = 0
    path = config if config in ("none", "ngram") else "eagle"
    ov = model[f"overhead_{path}"]
    gpu = config.startswith("gpu-")                    # the device-side hybrid: k tokens per request, uniform
    pad = config.endswith("-pad") or gpu               # every draft padded to k: uniform batches
    base = config.removesuffix("-pad").removeprefix("gpu-")
    rule = base == "adaptive-rule"
    hov = model.get("hybrid_overhead") if base.startswith("pr24344") or base in ("eagle-only", "adaptive-rule") \
        else None
    by = model.get("by_bs", {})                        # per-batch-size host terms (fit_step_model(per_bs=True))
    plan = rule_steps(reqs, B, k) if rule else None
    at = np.zeros(B, int)                              # adaptive-rule: each request's next step in its plan
    while (p < max_tokens).any():
        act = p < max_tokens
        d = np.zeros(B, int)
        a = np.zeros(B, int)
        eagle_for = 0
        for i in np.flatnonzero(act):
            if rule:                                   # the simulator's step: its plan covers the output
                d[i], a[i], ea = plan[i][at[i]]
                eagle_for += ea
                at[i] += 1
                continue
            ng_dl = min(reqs[i]["draft_len"]["ngram"][p[i] - 1], k)
            use_ng = base == "ngram" or (base.startswith("pr24344") and ng_dl > 0)
            if config == "none":
                continue
            if use_ng:
                d[i] = ng_dl
                a[i] = min(reqs[i]["acc"]["ngram"][p[i] - 1] - 1, ng_dl)
            else:
                d[i] = k
                a[i] = min(reqs[i]["acc"]["eagle"][p[i] - 1] - 1, k)
                eagle_for += 1
        n_act = int(act.sum())
        T = int(act.sum()) * (1 + k) if pad else int((1 + d[act]).sum())
        kv = int((P[act] + p[act]).sum())
        uniform = config == "none" or pad or bool((d[act] == k).all())   # vLLM's uniform decode: 1 + k each
        F = model["F_uniform" if uniform else "F_ragged"]
        step = by.get(f"overhead_{path}", {}).get(B, ov[0] + ov[1] * n_act)        # the host's terms
        if base in ("eagle", "pr24344", "eagle-only", "idle") or (base in ("pr24344-skip", "adaptive-rule")
                                                                    and eagle_for):
            m_e = n_act                                  # EAGLE drafts for the whole batch when it runs
            step += k * by.get("eagle_draft", {}).get(B, model["eagle_draft"][0] * m_e + model["eagle_draft"][1])
        if base in ("ngram", "pr24344", "pr24344-skip") and not gpu:   # the device's lookup: in hov
            step += model["ngram_draft"][0] * n_act
        if hov is not None:
            step += by.get("hybrid_overhead", {}).get(B, hov[0] + hov[1] * n_act)
        t += F[0] * kv + F[1] * T + F[2] + host * step
        steps += 1
        ragged_steps += not uniform
        p[act] = np.minimum(p[act] + a[act] + 1, max_tokens)
    wos = by.get("wall_over_steps", {}).get("hybrid" if hov is not None else path, {}).get(B)   # per_bs: this size's
    wos = model["wall_over_steps"][path] if wos is None else wos
    return {"tokens": int(B * max_tokens), "steps": steps, "seconds": float(t * wos), "ragged_steps": ragged_steps}


def predict(profiles: list[dict], model: dict, configs=LIVE_CONFIGS, batch_sizes=(1, 8, 32, 64),
            prompts_per_bs: int = 8):
    """Predicted tok/s per configuration and batch size, the hybrid task's chunks (its first max(B, 8) requests
    in chunks of B)."""
    import pandas as pd

    rows = []
    for c in configs:
        for b in batch_sizes:
            part = profiles[:max(b, prompts_per_bs)]
            res = [_walk(part[i:i + b], c, model) for i in range(0, len(part), b)]
            tok, sec = sum(r["tokens"] for r in res), sum(r["seconds"] for r in res)
            rows.append({"config": c, "batch_size": b, "predicted_tok_s": tok / sec,
                         "predicted_steps": sum(r["steps"] for r in res),
                         "predicted_ragged_share": sum(r["ragged_steps"] for r in res) / sum(r["steps"] for r in res)})
    return pd.DataFrame(rows)


def predict_runs(profiles: list[dict], models: dict, runs, index, prompts_per_bs: int = 8):
    """Each measured run predicted at its own host speed: the chunk it ran (``-c<N>`` of its run id: requests
    ``[N*B, (N+1)*B)`` of the hybrid task's first max(B, 8)) walked with ``models[config]`` and ``host`` = the
    run's ``index`` ((spec, run_id) -> ``host_index``; 1 where missing), then per configuration and batch size
    as ``throughput`` aggregates the measured runs: a repeat's tokens over its seconds, the mean over repeats."""
    import pandas as pd

    rows = []
    for r in runs.itertuples(index=False):
        b, c = int(r.batch_size), int(re.search(r"-c(\d+)", r.run_id).group(1))
        w = _walk(profiles[:max(b, prompts_per_bs)][c * b:(c + 1) * b], r.config, models[r.config],
                  host=float(index.get((r.spec, r.run_id), 1.0)))
        rows.append({"config": r.config, "batch_size": b, "repeat": r.repeat, "tokens": w["tokens"],
                     "seconds": w["seconds"]})
    g = pd.DataFrame(rows).groupby(["config", "batch_size", "repeat"])[["tokens", "seconds"]].sum()
    return ((g["tokens"] / g["seconds"]).groupby(level=["config", "batch_size"]).mean()
            .rename("predicted_host_tok_s").reset_index())


def measured_vs_predicted(out: str | Path = OUT, profiles_path=None):
    """Measured tok/s (``throughput``, mean of 3 repeats, with min and max) beside three predictions over the
    run's own outputs (``hybrid_trace.jsonl``), every cost model fitted on the run's steps:
    ``one_F``: one target forward for every batch (the package's cost-model form, as ``costmodel.fit`` fits it),
    no SD / EAGLE / n-gram alone; ``ragged``: + a second forward for ragged batches; ``mended``: + the hybrid's
    own per-step work, fitted on the OTHER hybrid (pr24344's term predicts pr24344-skip and the reverse), so
    both hybrids stay out of sample. ``ratio_*`` = measured / predicted."""
    prof = load_profiles(profiles_path)
    t = throughput(out=out)
    res = t[t["model"] == "qwen2.5-coder-1.5b"][["config", "batch_size", "tok_s", "tok_s_min", "tok_s_max"]]
    parts = {"one_F": predict(prof, fit_step_model(out, ragged=False)),
             "ragged": predict(prof, fit_step_model(out, ragged=True))}
    mended = [predict(prof, fit_step_model(out, ragged=True), configs=FIT_CONFIGS)]
    for fit_on, pred in (("pr24344-skip", "pr24344"), ("pr24344", "pr24344-skip")):
        mended.append(predict(prof, fit_step_model(out, ragged=True, hybrid_configs=(fit_on,)), configs=(pred,)))
    import pandas as pd

    parts["mended"] = pd.concat(mended, ignore_index=True)
    for name, p in parts.items():
        p = p.rename(columns={"predicted_tok_s": f"pred_{name}"})[["config", "batch_size", f"pred_{name}"] +
                                                                    (["predicted_ragged_share"] if name == "ragged" else [])]
        res = res.merge(p, on=["config", "batch_size"])
        res[f"ratio_{name}"] = res["tok_s"] / res[f"pred_{name}"]
    return res.rename(columns={"predicted_ragged_share": "ragged_share"}).reset_index(drop=True)


def predicted_padded(out: str | Path, profiles_path=None, idle: str = "eagle-only",
                     hybrids=("pr24344-pad", "pr24344-skip-pad"), per_bs: bool = False, host_scaled: bool = False,
                     workload: str = "code-edit"):
    """The GPU profile's run (its ``live`` folder: no SD, EAGLE, the idle hybrid, the padded hybrids) beside the
    predictor over ``hybrid_trace.jsonl`` (the same 64 code-edit requests' no-SD outputs, data/gpu/live's):
    the step model fitted on this run's no SD and EAGLE steps, the hybrid's own per-step work fitted on the idle
    hybrid (``eagle-only``: the same lookups, bookkeeping and host reads, every request on EAGLE), so both padded
    hybrids are predicted out of sample. ``ratio`` = measured / predicted; ``per_bs``: also the prediction with
    per-batch-size host terms (``predicted_per_bs_tok_s``, ``ratio_per_bs``); ``host_scaled``: also each run
    predicted at its own host speed (``predict_runs`` with ``fit_step_model(host_scaled=True)``, the same split in
    sample / out of sample; ``predicted_host_tok_s``, ``ratio_host``): the hybrid's host index is read from its
    own runs' t_other, its drafting from the idle hybrid's fitted term. ``workload``: the runs, steps and fits of
    that workload (``profiles_path`` then the profile of its requests). ``idle`` may map each hybrid to its own
    idle configuration (None: no hybrid term, the EAGLE path's terms alone), e.g. data/gpu/live7's
    ``{"adaptive-rule-pad": "eagle-only-pad", "gpu-pr24344": None}``: the host-side machinery's term for the
    host-side policy, none for the device-side one (its idle counterpart did not run there)."""
    prof = load_profiles(profiles_path)
    t = throughput(out=out, workload=workload)
    res = t[t["model"] == QWEN][["config", "batch_size", "tok_s", "tok_s_min", "tok_s_max", "acceptance_length"]]
    # which idle configuration's hybrid term prices each hybrid (None: none, the EAGLE path's terms alone)
    idle_of = dict(idle) if isinstance(idle, dict) else {h: idle for h in hybrids}
    idles = sorted({i for i in idle_of.values() if i})
    # each model fitted once; per_bs only adds its ``by_bs`` terms, which the line prediction leaves out
    kw = dict(configs=("none", "eagle"), ragged=False, workload=workload)
    fits = {None: fit_step_model(out, per_bs=per_bs, **kw)}
    fits.update({i: fit_step_model(out, hybrid_configs=(i,), per_bs=per_bs, **kw) for i in idles})
    model_of = {"none": None, "eagle": None, **{i: i for i in idles}, **{h: idle_of.get(h) for h in hybrids}}
    import pandas as pd

    def pred(by_bs: bool):
        use = {k: m if by_bs else {x: v for x, v in m.items() if x != "by_bs"} for k, m in fits.items()}
        return pd.concat([predict(prof, use[m], configs=tuple(c for c, mm in model_of.items() if mm == m))
                          for m in use if any(mm == m for mm in model_of.values())], ignore_index=True)

    p = pred(False)
    res = res.merge(p[["config", "batch_size", "predicted_tok_s", "predicted_steps"]], on=["config", "batch_size"])
    res["ratio"] = res["tok_s"] / res["predicted_tok_s"]
    if per_bs:     # the mended form: host terms per batch size (fit_step_model's per_bs), the same split in/out
        q = pred(True).rename(columns={"predicted_tok_s": "predicted_per_bs_tok_s"})
        res = res.merge(q[["config", "batch_size", "predicted_per_bs_tok_s"]], on=["config", "batch_size"])
        res["ratio_per_bs"] = res["tok_s"] / res["predicted_per_bs_tok_s"]
    if host_scaled:
        hfits = {None: fit_step_model(out, host_scaled=True, **kw)}
        hfits.update({i: fit_step_model(out, hybrid_configs=(i,), host_scaled=True, **kw) for i in idles})
        runs = read_runs(out)
        runs = runs[(runs["task"] == "hybrid") & (runs["workload"] == workload) & (runs["engine_config"] == TIMED)
                    & (runs["model"] == QWEN) & runs["config"].isin(res["config"])]
        q = predict_runs(prof, {c: hfits[model_of.get(c)] for c in res["config"]}, runs,
                         hfits[None]["host_index"])      # every run of the workload: alike in every fit
        res = res.merge(q, on=["config", "batch_size"])
        res["ratio_host"] = res["tok_s"] / res["predicted_host_tok_s"]
    res["fitted_on"] = res["config"].map(lambda c: "in sample" if c in ("none", "eagle", *idles) else
                                         "out of sample")
    return res.reset_index(drop=True)


SINGLES = ("eagle", "ngram")       # the single proposers a hybrid is held against


def device_trace(out: str | Path, workload: str = "code-edit") -> Path | None:
    """The device-side hybrid's profile in ``out`` (``hybrid_trace_sN.jsonl``; another workload's
    ``hybrid_trace_<workload>_sN.jsonl``), the highest N, or None."""
    pat = re.compile(r"hybrid_trace_s(\d+)\.jsonl" if workload == "code-edit" else
                     rf"hybrid_trace_{re.escape(workload)}_s(\d+)\.jsonl")
    found = sorted((int(m.group(1)), p) for p in Path(out).glob("hybrid_trace_*.jsonl")
                   if (m := pat.fullmatch(p.name)))
    return found[-1][1] if found else None     # the highest N (s10 after s9)


def paired_ratios(out: str | Path, base: str = "eagle", workload: str = "code-edit"):
    """A rotated engine's policies against ``base`` (EAGLE alone: ``off``) REPEAT BY REPEAT: each repeat ran every
    policy back to back in one engine (a Latin-square order), so ``tok_s(policy, r) / tok_s(base, r)`` compares
    runs minutes apart on one process. Per configuration and batch size: the median and the min / max of those
    ratios over the repeats. Only the configurations of rotated runs (run ids ``...@policy-rN``)."""
    import pandas as pd

    none = pd.DataFrame(columns=["config", "batch_size", "paired_median", "paired_min", "paired_max", "pairs"])
    r = read_runs(out)
    r = r[(r["task"] == "hybrid") & (r["workload"] == workload) & r["run_id"].str.contains("@", regex=False)]
    if not (r["config"] == base).any():          # no rotated engine, or none with the base among its policies
        return none
    g = r.groupby(["config", "batch_size", "repeat"]).agg(tok=("output_tokens", "sum"), wall=("wall_s", "sum"))
    g = (g["tok"] / g["wall"]).rename("tok_s").reset_index()
    b = g[g["config"] == base].set_index(["batch_size", "repeat"])["tok_s"]
    g["ratio"] = g["tok_s"] / pd.Series(list(zip(g["batch_size"], g["repeat"]))).map(b).to_numpy()
    return (g[g["config"] != base].groupby(["config", "batch_size"])["ratio"]
            .agg(paired_median="median", paired_min="min", paired_max="max", pairs="count").reset_index())


def table_args(out: str | Path) -> dict:
    """``device_hybrid_table``'s hybrids and idle configurations for the run in ``out``: the device-side rule
    against its idle machinery, and where adaptive-rule ran (data/gpu/live7) also adaptive-rule
    against the host-side machinery idle (eagle-only), gpu-pr24344 then without a hybrid term unless its own idle
    counterpart ran beside it."""
    import pandas as pd

    cfgs = set(pd.read_csv(Path(out) / "runs.csv", usecols=["config"])["config"].astype(str))
    if "adaptive-rule-pad" not in cfgs:
        return {}
    return {"hybrid": ("gpu-pr24344", "adaptive-rule-pad"),
            "idle": {"gpu-pr24344": "gpu-eagle-only" if "gpu-eagle-only" in cfgs else None,
                     "adaptive-rule-pad": "eagle-only-pad"}}


def device_hybrid_table(out: str | Path, profiles_path=None, hybrid: str = "gpu-pr24344",
                        idle: str = "gpu-eagle-only", host_scaled: bool | None = None, workload: str = "code-edit"):
    """A device-side hybrid's run (``out``: no SD, EAGLE, n-gram, ``idle``, ``gpu-eagle-only``, ``gpu-pr24344``)
    per configuration and batch size: measured tok/s (mean, min, max of the repeats), ``vs_best_single`` (over the
    faster of EAGLE and n-gram at that batch size), ``vs_eagle`` (for ``idle``: the plugin's
    overhead), ``predicted_padded``'s prediction and ratio, and ``steps`` / ``predicted_steps``: decode steps per
    repeat, measured (the step log) over predicted (the profile of the same requests), which separates the
    acceptance half of a prediction from the cost half; a rotated engine's ``paired_*`` ratios over EAGLE
    alone (``paired_ratios``) and the prediction with per-batch-size host terms (``ratio_per_bs``); ``host_scaled``:
    each run predicted at its own host speed too (``ratio_host``: ``predicted_padded``); None: where the run has a
    rotated engine (its policies share one engine's host index), not where each policy ran in an engine of
    its own (where the index cannot tell engines' hosts apart). ``workload``: that workload's runs (e.g.
    sharegpt) against the profile of its requests (``device_trace(out, workload)``)."""
    import pandas as pd

    if host_scaled is None:
        host_scaled = bool(pd.read_csv(Path(out) / "runs.csv", usecols=["spec"])["spec"].astype(str)
                           .str.contains("-rotate", regex=False).any())

    profiles_path = profiles_path or device_trace(out, workload)
    hybrids = (hybrid,) if isinstance(hybrid, str) else tuple(hybrid)     # several: e.g. data/gpu/live7's
    res = predicted_padded(out, profiles_path, idle=idle, hybrids=hybrids, per_bs=True, host_scaled=host_scaled,
                           workload=workload)
    t = throughput(out=out, workload=workload)
    t = t[t["model"] == QWEN]
    extra = t[~t["config"].isin(res["config"])][["config", "batch_size", "tok_s", "tok_s_min", "tok_s_max",
                                                  "acceptance_length"]]
    res = pd.concat([res, extra.assign(fitted_on="not predicted")], ignore_index=True)
    best = res[res["config"].isin(SINGLES)].groupby("batch_size")["tok_s"].max()
    eagle = res[res["config"] == "eagle"].set_index("batch_size")["tok_s"]
    res["vs_best_single"] = res["tok_s"] / res["batch_size"].map(best)
    res["vs_eagle"] = res["tok_s"] / res["batch_size"].map(eagle)
    s = pd.read_parquet(Path(out) / "steps.parquet", columns=["config", "batch_size", "phase", "run_id"])
    s = s[(s["phase"] == "decode") & s["run_id"].str.startswith(workload)]
    by = [s["config"], s["batch_size"]]
    per_rep = s.groupby(by).size() / s["run_id"].str.extract(r"-r(\d+)$")[0].groupby(by).nunique()
    res["steps"] = [per_rep.get((c, b), float("nan")) for c, b in zip(res["config"], res["batch_size"])]
    res["steps_over_predicted"] = res["steps"] / res["predicted_steps"]
    res = res.merge(paired_ratios(out, workload=workload), on=["config", "batch_size"], how="left")   # rotated only
    return res.sort_values(["batch_size", "config"]).reset_index(drop=True)


TABLES = {"device_hybrid.csv": "code-edit", "device_hybrid_sharegpt.csv": "sharegpt"}   # file -> its workload


def _write_table(out: Path, name: str, workload: str, ta: dict) -> None:
    """``device_hybrid_table`` of ``workload`` into ``out / name`` (``summarize``, ``retable``)."""
    write_via(device_hybrid_table(out, workload=workload, **ta).to_csv, out / name, index=False, float_format="%.6g")


def retable(out: str | Path, why: str, command: str = "") -> list[str]:
    """Recompute a live folder's prediction tables (``TABLES``, those it has) from its committed measurements
    (runs.csv, steps.parquet, the profile) with this package's step model, after the model changed; each file's
    manifest entry keeps where and when it was measured and gains its new sha256 and ``recomputed`` (date, command,
    ``why``). Returns the files rewritten; a file whose bytes come out the same is left alone."""
    import datetime as dt

    from ...provenance import sha256_file, update_entry

    out = Path(out)
    ta = table_args(out)
    done = []
    for name, wl in TABLES.items():
        f = out / name
        if not f.exists():
            continue
        before = sha256_file(f)
        _write_table(out, name, wl, ta)
        if sha256_file(f) == before:
            continue
        update_entry(out / "MANIFEST.json", name, sha256=sha256_file(f), recomputed={
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "why": why,
            "command": command or "python -m spec_repro.engines.vllm.live retable"})
        done.append(name)
    return done


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spec_repro.engines.vllm.live", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("summarize")
    s.add_argument("--raw", required=True)
    s.add_argument("--out", default=str(OUT))
    pf = sub.add_parser("profile")
    pf.add_argument("--raw", help="a raw device folder (its no-SD outputs at bs 64)")
    pf.add_argument("--trace", help="or an earlier hybrid_trace.jsonl (its outputs)")
    pf.add_argument("--out", default=str(OUT / "hybrid_trace.jsonl"))
    pf.add_argument("--head")
    pf.add_argument("--device", default="cpu")
    pf.add_argument("--workload", default="code-edit", help="the hybrid task's workload (--raw: its no-SD run)")
    t = sub.add_parser("tables")
    t.add_argument("--out", default=str(OUT))
    rt = sub.add_parser("retable", help="recompute a folder's prediction tables from its committed measurements")
    rt.add_argument("--out", required=True)
    rt.add_argument("--why", required=True, help="what changed in the model (kept in the manifest)")
    a = ap.parse_args(argv)
    if a.cmd == "retable":
        if not (Path(a.out) / "runs.csv").is_file():
            print(f"live retable: no runs.csv in {a.out}", file=sys.stderr)
            return 2
        got = retable(a.out, a.why, " ".join(["python -m spec_repro.engines.vllm.live", *sys.argv[1:]]))
        print(f"{a.out}: " + (", ".join(got) + " recomputed" if got else "unchanged"))
        return 0
    if a.cmd == "summarize":
        if not Path(a.raw).is_dir():
            print(f"live summarize: no folder {a.raw}", file=sys.stderr)
            return 2
        print(summarize(a.raw, a.out, command=" ".join(["python -m spec_repro.engines.vllm.live", *sys.argv[1:]])))
        return 0
    if a.cmd == "profile":
        if not (a.raw or a.trace):
            print("live profile: give --raw DIR or --trace FILE (the no-SD outputs to profile)", file=sys.stderr)
            return 2
        print(profile_hybrid_task(a.raw, a.out, a.head, trace=a.trace, device=a.device, workload=a.workload))
        return 0
    import pandas as pd

    with pd.option_context("display.width", 200, "display.max_columns", 30):
        t = throughput(out=a.out)
        print(t.round(3).to_string(index=False))
        if (t["model"] == "llama31-8b").any():      # runs without Llama dims: no baseline
            print(llama_baseline(a.out).round(3).to_string(index=False))
        print(step_split(a.out).round(2).to_string(index=False))
        if (Path(a.out) / "hybrid_trace.jsonl").exists():
            print(measured_vs_predicted(a.out).round(3).to_string(index=False))
        if device_trace(a.out) is not None:                                 # the device-side hybrid's runs
            print(device_hybrid_table(a.out).round(3).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
