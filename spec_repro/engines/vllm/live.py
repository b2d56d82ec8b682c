"""Issue 18's live session on the H200 (``gpu/live_job.sh``) -> ``data/gpu/live/``: compact tables from the raw
device folder (its ``results.jsonl`` and the plugin's ``steps_*.jsonl``; the raw step logs stay out of the repo).

What ran: vLLM 0.25.0 on one H200. Qwen2.5-Coder-1.5B-Instruct, real weights (the package's q4_k_m GGUF,
de-quantized, run in bf16), with the package's EAGLE head, n-gram and the 0.5B draft model: agreement prompts
and the live hybrid's task (code-edit, bs 1/8/32/64, k = 5, 3 repeats). Llama-3.1-8B dimensions, dummy weights:
no SD on vLLM's default engine (async scheduling, the runner vLLM picks, no plugin) and the study-like one
(synchronous V1 runner, plugin on), bs 1/16/64/256.

    python -m spec_repro.engines.vllm.live summarize --raw DIR [--out data/gpu/live]
    python -m spec_repro.engines.vllm.live tables [--out data/gpu/live]      # the tables the note and README use
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ...io import write_via
from ...paths import data_dir

__all__ = ["FILE_DOCS", "ENGINE_NOTES", "load", "summarize", "throughput", "llama_baseline", "step_split", "main"]

OUT = data_dir() / "gpu" / "live"
DIMS = {"qwen2.5-coder-1.5b": "qwen25_coder_1p5b", "llama31-8b": "llama31_8b"}
FILE_DOCS = {
    "runs.csv": "one row per timed run (engine spec, engine_config, method, hybrid policy, batch size, repeat, "
                "tok/s, wall s, vLLM's spec-decode counters, weights, runner, async scheduling, instrumented)",
    "steps.parquet": "every step the plugin timed (STEP_COLUMNS + spec, engine_config, uniform, hybrid counts), "
                     "per-request detail left out",
    "lossless.csv": "per hybrid-task run: requests whose greedy output equals no SD's at the same batch size",
    "qwen_agreement.json": "vLLM's accepted tokens per step vs the profiler's prediction on vLLM's own outputs "
                           "(EAGLE head, n-gram, 0.5B draft model)",
    "hybrid_trace.jsonl": "the hybrid task's code-edit requests profiled on no SD's outputs (n-gram, EAGLE head; "
                          "torch on the CPU): the simulator's input",
}
ENGINE_NOTES = {
    "default": "vLLM's defaults as a user runs them: async scheduling on where vLLM allows it (off for n-gram and the "
               "draft model, which vLLM 0.25 runs synchronously); the Qwen specs keep the V1 runner (the plugin's "
               "hooks live there; vLLM itself would pick V2 for EAGLE), the Llama ones let vLLM pick (V2, no plugin)",
    "study-like": "synchronous V1 runner, as the study's vLLM 0.10 ran",
}


def _cfg_fields(cfg: dict, engine: dict) -> dict:
    return {"hybrid": cfg.get("hybrid"), "async_scheduling": cfg.get("async_scheduling"),
            "model_runner": cfg.get("model_runner"), "load_format": cfg.get("load_format"),
            "weights": "dummy" if cfg.get("load_format") == "dummy" else "real (q4_k_m GGUF, bf16)",
            "dtype": cfg.get("dtype"), "draft": Path(cfg["draft"]).name if cfg.get("draft") else None,
            "instrumented": bool(engine.get("instrumented")), "max_num_seqs": cfg.get("max_num_seqs")}


def load(raw: str | Path):
    """(runs, steps, engines) from a raw folder (searched recursively)."""
    import pandas as pd

    from ...traces import read_steps

    raw = Path(raw)
    recs = [json.loads(x) for f in sorted(raw.rglob("results*.jsonl")) for x in open(f) if x.strip()]
    engines = {d["spec"]: d for d in recs if d.get("kind") == "engine"}
    runs = []
    for d in recs:
        if d.get("kind") != "run":
            continue
        e = engines.get(d["spec"], {})
        row = {k: v for k, v in d.items() if k not in ("outputs", "keys", "config", "kind")}
        row.update(_cfg_fields(e.get("config") or {}, e))
        row["engine_config"] = d.get("engine_config") or e.get("engine_config")
        for c in ("per_position_rate", "accepted_per_pos"):
            row[c] = json.dumps(row.get(c))
        runs.append(row)
    parts = []
    for f in sorted(raw.rglob("steps_*.jsonl")):
        spec = f.stem[len("steps_"):]
        df = read_steps(f)
        extra = [json.loads(x) for x in open(f) if x.strip()]
        df["t_sched"] = [x.get("t_sched", 0.0) for x in extra]
        df["outputs_known"] = [x.get("outputs_known", True) for x in extra]
        for key in ("ngram", "eagle", "none", "ngram_tokens", "eagle_tokens"):
            df[f"hybrid_{key}"] = [(x.get("hybrid") or {}).get(key) for x in extra]
        df["spec"] = spec
        df["engine_config"] = engines.get(spec, {}).get("engine_config")
        parts.append(df)
    steps = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if len(steps):
        steps["uniform"] = (steps["k"] == 0) | (steps["batched_tokens"] == steps["num_reqs"] * (1 + steps["k"]))
    return pd.DataFrame(runs), steps, list(engines.values())


def summarize(raw: str | Path, out: str | Path = OUT, command: str = "") -> dict:
    """Write ``out``'s files (FILE_DOCS) from the raw folder; MANIFEST.json records each with its sha256."""
    from ...provenance import record, sha256_file
    from .jobs import lossless_report
    from .session import agreement_report

    raw, out = Path(raw), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs, steps, engines = load(raw)
    write_via(runs.to_csv, out / "runs.csv", index=False)
    keep = [c for c in steps.columns if c not in ("accepted_per_req",)]
    write_via(steps[keep].to_parquet, out / "steps.parquet", compression="zstd", index=False)
    qres = next(iter(sorted(raw.rglob("qwen/results.jsonl"))), None)
    if qres is not None:
        recs = [json.loads(x) for x in open(qres) if x.strip()]
        import pandas as pd

        ll = pd.DataFrame(lossless_report(recs))
        ll["first_difference"] = ll["first_difference"].map(lambda v: json.dumps(v) if v else "")
        write_via(ll.to_csv, out / "lossless.csv", index=False)
        rep = agreement_report(qres.parent)
        (out / "qwen_agreement.json").write_text(json.dumps(rep, indent=1, default=float) + "\n")
    env = engines[0].get("env", {}) if engines else {}
    dev = {"gpu": env.get("gpu"), "vllm": engines[0].get("vllm") if engines else None, "torch": env.get("torch"),
           "cuda": env.get("cuda"), "python": env.get("python")}
    record(out / "MANIFEST.json", "_device_runs", kind="where and how the measurements were made", **dev,
           command=command, engine_configs=ENGINE_NOTES,
           engines=[{"spec": e["spec"], "engine_config": e.get("engine_config"), "start_s": round(e["start_s"], 1),
                     "instrumented": e.get("instrumented"),
                     "config": {k: (Path(v).name if k in ("model", "draft", "step_log") and isinstance(v, str)
                                    else v) for k, v in e["config"].items() if v not in (None, {}, "")}}
                    for e in engines])
    for name in sorted(p.name for p in out.iterdir() if p.is_file()):
        if name in ("MANIFEST.json", "README.md"):
            continue
        record(out / "MANIFEST.json", name, file=name, description=FILE_DOCS.get(name, ""), sha256=sha256_file(out / name),
               kind="measured on the lent H200 (see _device_runs), or computed from those measurements")
    return {"runs": len(runs), "steps": len(steps), "engines": len(engines)}


# ---- tables ---------------------------------------------------------------------------------------------------
def _dims(model: str) -> dict:
    from .steps import model_dims

    return model_dims(data_dir() / "gpu" / "configs" / DIMS[model] / "config.json")


def step_floor_s(model: str, batch: int, context: float) -> float:
    """HBM floor of one decode step: streamed weights + the batch's KV cache read, over 4.8 TB/s."""
    from .steps import H200_HBM_BYTES_PER_S

    d = _dims(model)
    return (d["streamed_weight_bytes"] + batch * context * d["kv_bytes_per_token"]) / H200_HBM_BYTES_PER_S


def throughput(runs=None, out: str | Path = OUT):
    """Per model, configuration and batch size: output tok/s per repeat (a repeat's tokens over its wall time),
    mean / min / max over repeats, vLLM's acceptance length, and the HBM ceiling (batch x tokens per step / the
    step floor at the run's mean context: its first prompt's length plus half the tokens each request
    generates) beside it."""
    import pandas as pd

    runs = pd.read_csv(Path(out) / "runs.csv") if runs is None else runs
    runs = runs[runs["task"].isin(["hybrid", "batches"])].copy()
    runs["config"] = runs["hybrid"].fillna(runs["method"])
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
    """Llama-3.1-8B dims, no SD: the default engine beside the study-like one (both this session) and the
    committed study-like baseline (data/gpu/runs.csv, session 3); the committed SD throughputs as speedups over
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

    s = pd.read_parquet(Path(out) / "steps.parquet")
    s = s[(s["phase"] == "decode") & s["run_id"].str.startswith("code-edit")]
    s = s.assign(config=s["spec"].str.replace("hybrid-default-", "", regex=False))
    g = s.groupby(["config", "batch_size", "uniform"]).agg(
        steps=("t_total", "size"), tokens=("batched_tokens", "mean"), draft_ms=("t_draft", "median"),
        verify_ms=("t_verify", "median"), reject_ms=("t_reject", "median"), other_ms=("t_other", "median"),
        total_ms=("t_total", "median")).reset_index()
    for c in ("draft_ms", "verify_ms", "reject_ms", "other_ms", "total_ms"):
        g[c] *= 1e3
    return g


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spec_repro.engines.vllm.live", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("summarize")
    s.add_argument("--raw", required=True)
    s.add_argument("--out", default=str(OUT))
    t = sub.add_parser("tables")
    t.add_argument("--out", default=str(OUT))
    a = ap.parse_args(argv)
    if a.cmd == "summarize":
        if not Path(a.raw).is_dir():
            print(f"live summarize: no folder {a.raw}", file=sys.stderr)
            return 2
        print(summarize(a.raw, a.out, command=" ".join(["python -m spec_repro.engines.vllm.live", *sys.argv[1:]])))
        return 0
    import pandas as pd

    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(throughput(out=a.out).round(3).to_string(index=False))
        print(llama_baseline(a.out).round(3).to_string(index=False))
        print(step_split(a.out).round(2).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
