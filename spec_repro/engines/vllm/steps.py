"""vLLM step tables -> the numbers the study reports: JIT outliers flagged, phase breakdown (``metrics.phase_shares``
plus ms per phase), instrumentation overhead, and each decode step beside its memory-traffic floor (model
dimensions from ``config.json``)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ...metrics import SHARE_COLUMNS, phase_shares

__all__ = ["H200_HBM_BYTES_PER_S", "HBM_BYTES_PER_S", "hbm_bytes_per_s", "model_dims", "streamed_bytes",
           "add_physical_limits", "flag_jit_outliers", "phase_breakdown", "overhead_table", "limit_table"]

H200_HBM_BYTES_PER_S = 4.8e12   # vendor datasheet; measured device-to-device copy on the lent H200: ~4.3e12
#: HBM bandwidth by GPU (vendor datasheets: H200 HBM3e 4.8 TB/s, H100 SXM HBM3 3.35 TB/s)
HBM_BYTES_PER_S = {"H200": H200_HBM_BYTES_PER_S, "H100": 3.35e12}


def hbm_bytes_per_s(gpu: str | None) -> float:
    """The HBM bandwidth of the GPU a device record names (``"NVIDIA H100 80GB HBM3"``); the H200's where it names
    none (the committed single-GPU runs before the GPU was recorded ran on the H200)."""
    return next((v for k, v in HBM_BYTES_PER_S.items() if gpu and k in gpu), H200_HBM_BYTES_PER_S)


# ---- physical limits -----------------------------------------------------------------------------------------
def model_dims(config: dict | str | Path) -> dict:
    """Parameter count, weight bytes and KV bytes per token of a decoder from its config.json: dense, or a
    mixture of experts (``n_routed_experts``/``num_experts``; GLM-4.5/DeepSeek-style shared experts and
    ``first_k_dense_replace`` dense layers). MTP layers (``num_nextn_predict_layers``) are not part of the target
    forward and are left out."""
    if not isinstance(config, dict):
        config = json.loads(Path(config, "config.json").read_text() if Path(config).is_dir()
                            else Path(config).read_text())
    c = config.get("text_config", config)
    H, L, V = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    nh = c["num_attention_heads"]
    nkv = c.get("num_key_value_heads", nh)
    hd = c.get("head_dim") or H // nh
    inter = c["intermediate_size"]
    attn = H * nh * hd + 2 * H * nkv * hd + nh * hd * H
    if c.get("attention_bias"):
        attn += nh * hd + 2 * nkv * hd
    norms = 2 * H + (2 * hd if c.get("model_type", "").startswith("qwen3") or c.get("use_qk_norm") else 0)
    n_exp = int(c.get("n_routed_experts") or c.get("num_experts") or 0)
    moe = {}
    if n_exp:
        dense_layers = int(c.get("first_k_dense_replace", 0))
        moe_layers = L - dense_layers
        expert = 3 * H * int(c["moe_intermediate_size"])
        shared = int(c.get("n_shared_experts") or 0) * expert
        router = H * n_exp
        layers = L * (attn + norms) + dense_layers * 3 * H * inter + moe_layers * (shared + router + n_exp * expert)
        moe = {"experts": n_exp, "experts_per_tok": int(c["num_experts_per_tok"]), "moe_layers": moe_layers,
               "expert_params": expert}
    else:
        layers = L * (attn + 3 * H * inter + norms)
    emb = V * H
    params = emb + layers + H + (0 if c.get("tie_word_embeddings") else V * H)
    dtype = str(c.get("torch_dtype") or c.get("dtype") or "bfloat16")
    bpe = 4 if "float32" in dtype else 2
    out = {"params": int(params), "bytes_per_param": bpe, "weight_bytes": int(params * bpe),
           # the embedding table is gathered (a few rows), not streamed: a decode step reads the rest
           "streamed_weight_bytes": int((params - emb) * bpe),
           "kv_bytes_per_token": int(2 * L * nkv * hd * bpe), "layers": L, "hidden": H, "vocab": V}
    if moe:
        moe["expert_bytes"] = moe.pop("expert_params") * bpe
        out.update(moe)
    return out


def draft_forward_bytes(head_config: dict | str | Path) -> int:
    """Weight bytes one EAGLE-1 head forward must read (one drafted token): its decoder layer(s), the ``fc`` that maps
    [embedding, hidden state] (2H) to H, and the LM head (vLLM's head borrows the target's when it has none: the same
    bytes); the embedding rows are gathered, not streamed. Divided by the HBM bandwidth: the drafting floor d1."""
    d = model_dims(head_config)
    return int(d["streamed_weight_bytes"] + 2 * d["hidden"] * d["hidden"] * d["bytes_per_param"])


def streamed_bytes(dims: dict, batched_tokens, routing: str = "min"):
    """Weight bytes one target forward must read. Dense: all but the embedding table. Mixture of experts: the
    rest plus, per MoE layer, the experts the forward's tokens touch. ``routing="min"`` (the floor): only
    ``experts_per_tok`` experts, the least any forward reads (the study's batching, one prompt copied B times,
    routes every request alike, so it is also close to what those runs read); ``"uniform"``: T tokens routed
    uniformly at random to top-k of E touch E * (1 - (1 - k/E)^T) experts (what a mixed batch of real prompts
    approaches; real routers are skewed, which touches fewer)."""
    T = np.asarray(batched_tokens, dtype=float)
    if "experts" not in dims:
        return np.full(T.shape, float(dims["streamed_weight_bytes"]))
    e, k = dims["experts"], dims["experts_per_tok"]
    rest = dims["streamed_weight_bytes"] - dims["moe_layers"] * e * dims["expert_bytes"]
    if routing == "min":
        touched = np.full(T.shape, float(k))
    elif routing == "uniform":
        touched = e * (1.0 - (1.0 - k / e) ** T)
    else:
        raise ValueError(f"routing must be 'min' or 'uniform', not {routing!r}")
    return rest + dims["moe_layers"] * touched * dims["expert_bytes"]


def add_physical_limits(steps, dims: dict, hbm_bytes_per_s: float = H200_HBM_BYTES_PER_S):
    """Add each step's memory-traffic floor for the target forward and the bandwidth it achieved:
    bytes = streamed weights (``streamed_bytes``) + KV cache read (kv_tokens x bytes/token); floor_s = bytes /
    (GPUs x HBM bandwidth), GPUs = ``dims["gpus"]`` (tensor parallel: each GPU streams its shard);
    achieved_GBps = bytes / t_verify (all GPUs together); bw_util = floor_s / t_verify."""
    df = steps.copy()
    gpus = int(dims.get("gpus", 1))
    byts = streamed_bytes(dims, df["batched_tokens"].to_numpy()) + df["kv_tokens"].astype(float).to_numpy() * \
        dims["kv_bytes_per_token"]
    df["verify_bytes"] = byts
    df["verify_floor_s"] = byts / (hbm_bytes_per_s * gpus)
    tv = df["t_verify"].where(df["t_verify"] > 0)
    df["achieved_GBps"] = byts / tv / 1e9
    df["bw_util"] = df["verify_floor_s"] / tv
    return df


# ---- step tables ------------------------------------------------------------------------------------------------
def flag_jit_outliers(steps, factor: float = 10.0, floor_s: float = 0.05):
    """Mark steps whose non-verification time (t_total - t_verify) exceeds ``factor`` x its run's median and
    ``floor_s``: first-use Triton JIT compilations inside vLLM (seen at new batch shapes: 0.2-0.9 s in
    drafting) and the draft model's prompt prefill. Adds a boolean column ``outlier``."""
    df = steps.copy()
    nonv = df["t_total"] - df["t_verify"]
    med = nonv.groupby(df["run_id"]).transform("median")
    df["outlier"] = (nonv > factor * med) & (nonv > floor_s)
    return df


def phase_breakdown(steps, *, decode_only: bool = True, by=("model", "method", "k", "batch_size")):
    """``metrics.phase_shares`` (time-weighted shares, ``SHARE_COLUMNS``) beside mean ms per phase and per step,
    the scheduler's share and batched tokens per step, per group. Outliers (``flag_jit_outliers``, flagged here
    when the table has no ``outlier`` column) are left out; ``decode_only`` keeps steps where every request
    decodes."""
    import pandas as pd

    df = steps if "outlier" in steps.columns else flag_jit_outliers(steps)
    shares = phase_shares(df, by=by, decode_only=decode_only).set_index(list(by))
    df = df[~df["outlier"]]
    if decode_only and "phase" in df.columns:
        df = df[df["phase"] == "decode"]
    cols = ["t_draft", "t_verify", "t_reject", "t_other", "t_total"] + (["t_sched"] if "t_sched" in df.columns else [])
    g = df.groupby(list(by), observed=True)
    out = pd.DataFrame({"steps": shares["steps"]})
    for c in cols:
        out[c.replace("t_", "") + "_ms"] = g[c].mean() * 1e3
    for c in SHARE_COLUMNS:
        out[c] = shares[c]
    if "t_sched" in cols:
        out["sched_share"] = g["t_sched"].sum() / g["t_total"].sum()
    out["tokens_per_step"] = g["batched_tokens"].mean()
    return out.reset_index()


def overhead_table(runs):
    """Throughput with the timer installed and recording vs vLLM's own methods, per (session, engine spec, batch
    size): mean and median of the interleaved repeats, the overhead = 1 - on/off, and the paired estimate."""
    import pandas as pd

    r = runs[runs["task"] == "overhead"].copy()
    if "spec" not in r.columns:
        r["spec"] = ""
    rows = []
    for (sess, spec, b), g in r.groupby(["session", "spec", "batch_size"]):
        on, off = g[g["instrumented"]]["output_tok_per_s"], g[~g["instrumented"]]["output_tok_per_s"]
        row = {"session": sess, "spec": spec, "batch_size": b, "repeats": len(on),
               "output_tokens_per_req": int(g["output_tokens"].iloc[0] // b),
               "off_mean": off.mean(), "on_mean": on.mean(), "off_median": off.median(), "on_median": on.median(),
               "overhead_mean": 1 - on.mean() / off.mean(), "overhead_median": 1 - on.median() / off.median(),
               "off_min": off.min(), "off_max": off.max(), "overhead_paired": np.nan, "overhead_paired_ci95": np.nan}
        if "repeat" in g.columns:
            # each repeat's on/off pair ran back to back: 1 - mean(on/off) and a normal 95 % interval over pairs
            p = g.pivot_table(index="repeat", columns="instrumented", values="output_tok_per_s").dropna()
            if len(p) >= 2 and {True, False} <= set(p.columns):
                ratio = p[True] / p[False]
                row["overhead_paired"] = 1 - ratio.mean()
                row["overhead_paired_ci95"] = 1.96 * ratio.std(ddof=1) / np.sqrt(len(ratio))
        rows.append(row)
    return pd.DataFrame(rows)


def limit_table(steps, dims_by_model: dict, hbm_bytes_per_s: float = H200_HBM_BYTES_PER_S):
    """Decode steps next to their memory floor: per (model, method, batch size) the median target-forward time,
    KV tokens, bytes, floor (bytes / HBM bandwidth), achieved GB/s and the share of the floor reached."""
    import pandas as pd

    parts = []
    df = steps if "outlier" in steps.columns else flag_jit_outliers(steps)
    df = df[(~df["outlier"]) & (df["phase"] == "decode")]
    for model, g in df.groupby("model"):
        if model not in dims_by_model:
            continue
        parts.append(add_physical_limits(g, dims_by_model[model], hbm_bytes_per_s))
    d = pd.concat(parts, ignore_index=True)
    g = d.groupby(["model", "method", "batch_size"], observed=True)
    out = g[["t_verify", "kv_tokens", "batched_tokens", "verify_bytes", "verify_floor_s", "achieved_GBps",
             "bw_util"]].median().reset_index()
    out["t_verify_ms"] = out.pop("t_verify") * 1e3
    out["floor_ms"] = out.pop("verify_floor_s") * 1e3
    return out
