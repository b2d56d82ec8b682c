"""A summarized live folder's measured tables: tok/s per configuration and batch size beside the HBM ceiling
(``throughput``), the Llama no-SD baselines (``llama_baseline``) and the median phase times of the decode steps
(``step_split``)."""
from __future__ import annotations

from pathlib import Path

from ...paths import data_dir
from .live_runs import COMMITTED, read_runs, select_rows, whole_repeats

DIMS = {"qwen2.5-coder-1.5b": "qwen25_coder_1p5b", "llama31-8b": "llama31_8b"}


def _dims(model: str) -> dict:
    from .steps import model_dims

    return model_dims(data_dir() / "gpu" / "configs" / DIMS[model] / "config.json")


def step_floor_s(model: str, batch: int, context: float, hbm: float | None = None) -> float:
    """HBM floor of one decode step: streamed weights + the batch's KV cache read, over ``hbm`` bytes/s (default
    the H200's 4.8 TB/s; the floor ``steps.add_physical_limits`` puts beside every logged step, at a step of
    ``batch`` requests)."""
    from .steps import H200_HBM_BYTES_PER_S, streamed_bytes

    d = _dims(model)
    return float(streamed_bytes(d, batch) + batch * context * d["kv_bytes_per_token"]) / (hbm or H200_HBM_BYTES_PER_S)


def device_gpu(out: str | Path) -> str | None:
    """The GPU a summarized folder's runs were measured on (its MANIFEST.json's ``_device_runs``), or None."""
    import json

    f = Path(out) / "MANIFEST.json"
    if not f.exists():
        return None
    return ((json.loads(f.read_text()).get("_device_runs") or {}).get("machine") or {}).get("gpu")


def throughput(runs=None, out: str | Path = COMMITTED, workload: str = "code-edit", select: dict | None = None):
    """Per model, configuration and batch size: output tok/s per repeat (a repeat's tokens over its wall time;
    a repeat with fewer chunks than the others, cut by a deadline, left out), mean / min / max over repeats,
    vLLM's acceptance length, and the HBM ceiling (batch x tokens per step / the step floor at the run's mean
    context: its first prompt's length plus half the tokens each request generates) beside it, at the HBM
    bandwidth of the GPU ``out``'s manifest names (``steps.hbm_bytes_per_s``). ``workload``: the hybrid runs of
    that workload (the Llama batches have none: always kept); ``select``: only the runs it selects
    (``live_runs.select_rows``)."""
    from .steps import hbm_bytes_per_s

    runs = read_runs(out) if runs is None else runs
    runs = select_rows(runs[runs["task"].isin(["hybrid", "batches"])], select).copy()
    if "workload" in runs:
        runs = runs[runs["workload"].isna() | (runs["workload"] == workload)]
    runs["repeat"] = runs["repeat"].fillna(runs["run_id"].str.extract(r"-r(\d+)$")[0].astype(float))
    runs["tokens"] = runs["output_tokens"]                      # all requests' output tokens of the run
    runs["out_per_req"] = runs["output_tokens"] / runs["n_requests"]
    g = runs.groupby(["model", "engine_config", "config", "batch_size", "repeat"]).agg(
        tokens=("tokens", "sum"), wall=("wall_s", "sum"), acc=("num_accepted_tokens", "sum"),
        drafts=("num_drafts", "sum"), prompt_len=("prompt_len", "mean"), out=("out_per_req", "mean"),
        chunks=("tokens", "size")).reset_index()
    g = whole_repeats(g, ["model", "engine_config", "config", "batch_size"])
    g["tok_s"] = g["tokens"] / g["wall"]
    t = g.groupby(["model", "engine_config", "config", "batch_size"]).agg(
        tok_s=("tok_s", "mean"), tok_s_min=("tok_s", "min"), tok_s_max=("tok_s", "max"), repeats=("tok_s", "size"),
        acc=("acc", "sum"), drafts=("drafts", "sum"), prompt_len=("prompt_len", "mean"), out=("out", "mean")
    ).reset_index()
    t["acceptance_length"] = (1 + t["acc"] / t["drafts"]).where(t["drafts"] > 0, 1.0)
    hbm = hbm_bytes_per_s(device_gpu(out))
    t["floor_step_ms"] = [1e3 * step_floor_s(m, b, p + o / 2, hbm) for m, b, p, o in
                          zip(t["model"], t["batch_size"], t["prompt_len"], t["out"])]
    t["ceiling_tok_s"] = t["batch_size"] * t["acceptance_length"] / (t["floor_step_ms"] / 1e3)
    t["share_of_ceiling"] = t["tok_s"] / t["ceiling_tok_s"]
    return t.drop(columns=["acc", "drafts", "prompt_len", "out"])


def llama_baseline(out: str | Path = COMMITTED, committed: str | Path | None = None):
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


def step_split(out: str | Path = COMMITTED):
    """Median ms per phase of the Qwen decode steps, per configuration, batch size and whether the batch was
    uniform (every request scheduled 1 + k tokens: vLLM's full CUDA graph) or not."""
    import pandas as pd

    from ...manifests import verify_recorded

    s = pd.read_parquet(verify_recorded(Path(out) / "steps.parquet"))
    s = s[(s["phase"] == "decode") & s["run_id"].str.startswith("code-edit")]
    if "stage" in s.columns:          # a V2 hybrid folder: the grid's steps (not the lossless check's)
        s = s[s["stage"] == "grid"]
    g = s.groupby(["config", "batch_size", "uniform"]).agg(
        steps=("t_total", "size"), tokens=("batched_tokens", "mean"), draft_ms=("t_draft", "median"),
        verify_ms=("t_verify", "median"), reject_ms=("t_reject", "median"), other_ms=("t_other", "median"),
        total_ms=("t_total", "median")).reset_index()
    for c in ("draft_ms", "verify_ms", "reject_ms", "other_ms", "total_ms"):
        g[c] *= 1e3
    return g
