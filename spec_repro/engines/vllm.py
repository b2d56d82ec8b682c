"""The study's configurations in vLLM (0.25.x), with per-step phase timing from ``vllm_plugin``.

``VLLMEngine(VLLMConfig(model=..., method="ngram", k=3))`` builds ``vllm.LLM`` for a speculative method
(``none`` = no SD, ``ngram``, ``eagle``, ``eagle3``, ``draft_model``, ``mtp``), ``run_batch`` runs the study's
batching (ONE prompt copied B times), ``run_prompts`` a mixed batch, and both return a ``RunResult``: output
tokens/s, wall time and vLLM's own spec-decode counters (drafts, draft tokens, accepted tokens, accepted per
position) taken as the difference of ``llm.get_metrics()`` around the run. With ``step_log=PATH`` every engine
step's phases (drafting, verification, rejection sampling, the rest) go to PATH as JSON lines
(``spec_repro.traces.read_steps`` reads them). ``profile`` sweeps batch size x prompt length on any
architecture from its ``config.json`` with ``load_format="dummy"`` and token-id prompts, for
``spec_repro.costmodel.fit``.

Importing this module needs neither vLLM nor a GPU; building an engine does, and says so clearly.
Defaults follow the study's engine (vLLM 0.10.1): prefix caching off, chunked prefill on, greedy decoding,
synchronous scheduling (vLLM 0.25 would overlap scheduling with the GPU for some methods only, which would
make the methods incomparable) and the V1 GPU model runner (0.25 picks its V2 runner for some methods only).
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from .vllm_plugin import prompt_hash

__all__ = [
    "METHODS", "VLLMConfig", "VLLMEngine", "VLLMEngineError", "RunResult", "speculative_config",
    "engine_kwargs", "parse_spec_metrics", "diff_spec_metrics", "require_vllm", "model_dims", "add_physical_limits",
    "ngram_propose", "predict_ngram_steps", "streamed_bytes", "ngram_agreement", "load_step_records", "H200_HBM_BYTES_PER_S",
    "study_prompt", "random_prompts", "agreement", "request_steps", "torch_profiler_predictor", "phase_breakdown",
    "overhead_table", "limit_table", "flag_jit_outliers", "load_smollm2_steps",
]

METHODS = ("none", "ngram", "eagle", "eagle3", "draft_model", "mtp")
SUPPORTED_VLLM = "0.25"
H200_HBM_BYTES_PER_S = 4.8e12   # vendor datasheet; measured device-to-device copy on the lent H200: ~4.3e12
H100_HBM_BYTES_PER_S = 3.35e12


class VLLMEngineError(RuntimeError):
    """vLLM / GPU missing, unknown method, bad configuration, or a batch that does not fit in memory."""


# ---- configuration -------------------------------------------------------------------------------------------
@dataclass
class VLLMConfig:
    model: str                                  # HF id or a local dir with config.json (+ weights unless dummy)
    method: str = "none"                        # one of METHODS
    k: int = 3                                  # draft tokens per step (num_speculative_tokens)
    draft: str | None = None                    # EAGLE/EAGLE-3 head or draft model (dir or HF id)
    prompt_lookup_min: int = 3                  # n-gram, as the study
    prompt_lookup_max: int = 7
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    draft_tensor_parallel_size: int | None = None
    dtype: str = "bfloat16"
    gpu_memory_utilization: float = 0.85
    max_model_len: int = 4096
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = 8192
    load_format: str = "auto"                   # "dummy": random weights, real timing
    enforce_eager: bool = False
    async_scheduling: bool | None = False       # None: vLLM's default
    model_runner: str = "v1"                    # "v1" (instrumented) | "default" (vLLM's choice)
    synthetic_acceptance_length: float | None = None   # vLLM's synthetic rejection sampler (dummy weights)
    draft_cudagraphs: bool = False              # draft_model only: replay its CUDA graphs (vLLM PR #47460, plugin)
    step_log: str | None = None                 # JSON-lines path for per-step phase timing (the plugin)
    seed: int = 0
    name: str | None = None                     # label for results; defaults to the model dir's name
    extra: dict = field(default_factory=dict)   # passed to vllm.LLM as is

    def label(self) -> str:
        return self.name or Path(self.model.rstrip("/")).name


def speculative_config(cfg: VLLMConfig) -> dict | None:
    """vLLM's ``speculative_config`` dict for ``cfg.method`` (None for ``none``)."""
    m = cfg.method
    if m not in METHODS:
        raise VLLMEngineError(f"unknown method {m!r}; choose one of {', '.join(METHODS)}")
    if m == "none":
        return None
    if cfg.k < 1:
        raise VLLMEngineError(f"k must be >= 1 for method {m!r}, got {cfg.k}")
    sc: dict = {"method": m, "num_speculative_tokens": int(cfg.k)}
    if m == "ngram":
        if not 1 <= cfg.prompt_lookup_min <= cfg.prompt_lookup_max:
            raise VLLMEngineError("need 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                                  f"{cfg.prompt_lookup_min}, {cfg.prompt_lookup_max}")
        sc.update(prompt_lookup_min=cfg.prompt_lookup_min, prompt_lookup_max=cfg.prompt_lookup_max)
    elif m in ("eagle", "eagle3", "draft_model"):
        if not cfg.draft:
            raise VLLMEngineError(f"method {m!r} needs draft= (the {'head' if 'eagle' in m else 'draft model'}: "
                                  "a local dir with config.json or an HF id)")
        sc["model"] = cfg.draft
    # mtp: the target's own MTP layers (e.g. GLM-4.5's); vLLM finds them in the target's config
    if cfg.draft_tensor_parallel_size:
        sc["draft_tensor_parallel_size"] = cfg.draft_tensor_parallel_size
    if cfg.synthetic_acceptance_length is not None:
        sc.update(rejection_sample_method="synthetic",
                  synthetic_acceptance_length=float(cfg.synthetic_acceptance_length))
    return sc


def engine_kwargs(cfg: VLLMConfig) -> dict:
    """Keyword arguments for ``vllm.LLM`` (pure: testable without vLLM)."""
    kw = dict(model=cfg.model, dtype=cfg.dtype, tensor_parallel_size=cfg.tensor_parallel_size,
              pipeline_parallel_size=cfg.pipeline_parallel_size, gpu_memory_utilization=cfg.gpu_memory_utilization,
              max_model_len=cfg.max_model_len, max_num_seqs=cfg.max_num_seqs, seed=cfg.seed,
              enable_prefix_caching=False, enable_chunked_prefill=True, disable_log_stats=False,
              enforce_eager=cfg.enforce_eager, load_format=cfg.load_format)
    if cfg.max_num_batched_tokens:
        kw["max_num_batched_tokens"] = cfg.max_num_batched_tokens
    if cfg.async_scheduling is not None:
        kw["async_scheduling"] = cfg.async_scheduling
    if cfg.load_format == "dummy":
        kw["skip_tokenizer_init"] = True     # prompts are token ids; a config.json dir has no tokenizer
    sc = speculative_config(cfg)
    if sc is not None:
        kw["speculative_config"] = sc
    kw.update(cfg.extra)
    return kw


def engine_env(cfg: VLLMConfig) -> dict[str, str]:
    env = {"VLLM_USE_FLASHINFER_SAMPLER": os.environ.get("VLLM_USE_FLASHINFER_SAMPLER", "0")}
    if cfg.model_runner == "v1":
        env["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    if cfg.step_log:
        env["SPEC_REPRO_STEP_LOG"] = str(Path(cfg.step_log).resolve())
    if cfg.draft_cudagraphs:
        if cfg.method != "draft_model":
            raise VLLMEngineError("draft_cudagraphs=True is for method='draft_model' (vLLM already replays "
                                  f"EAGLE/MTP drafters' graphs), not {cfg.method!r}")
        env["SPEC_REPRO_DRAFT_CUDAGRAPHS"] = "1"
    return env


def require_vllm():
    """Import vLLM and check for a CUDA GPU; raise VLLMEngineError saying what is missing."""
    try:
        import vllm
    except ImportError as e:
        raise VLLMEngineError(
            "vLLM is not installed: the vLLM engine needs a CUDA GPU host with `pip install 'spec-repro[vllm]'` "
            f"(vLLM {SUPPORTED_VLLM}.x). Without a GPU use the torch engine (spec_repro.engines.torch) or the "
            f"simulator over recorded traces. ({e})") from e
    try:
        import torch

        has_gpu = torch.cuda.is_available() and torch.cuda.device_count() > 0
    except Exception:
        has_gpu = False
    if not has_gpu:
        raise VLLMEngineError("vLLM is installed but no CUDA GPU is visible (torch.cuda.is_available() is False); "
                              "the vLLM engine needs one. Use the torch engine on CPU instead.")
    ver = getattr(vllm, "__version__", "?")
    if not ver.startswith(SUPPORTED_VLLM + "."):
        import warnings

        warnings.warn(f"vLLM {ver}: spec_repro's step timing supports {SUPPORTED_VLLM}.x only; it will stay off.")
    return vllm


_OOM_MARKS = ("out of memory", "no available memory for the cache blocks", "larger than the available kv cache",
              "not enough kv cache", "cuda error: out of memory", "insufficient memory")


def _is_oom(e: BaseException) -> bool:
    s = f"{type(e).__name__}: {e}".lower()
    return "outofmemory" in s.replace(" ", "") or any(m in s for m in _OOM_MARKS)


def _oom_error(e: BaseException, cfg: VLLMConfig, what: str) -> VLLMEngineError:
    return VLLMEngineError(
        f"{what} does not fit in GPU memory ({type(e).__name__}: {str(e)[:300]}). Try: a smaller batch or "
        f"max_num_seqs (now {cfg.max_num_seqs}), a shorter max_model_len (now {cfg.max_model_len}), a smaller "
        f"max_num_batched_tokens (now {cfg.max_num_batched_tokens}), a higher gpu_memory_utilization (now "
        f"{cfg.gpu_memory_utilization}), or more GPUs with tensor_parallel_size (now {cfg.tensor_parallel_size}).")


# ---- metrics -------------------------------------------------------------------------------------------------
_SPEC_KEYS = {"num_drafts": "spec_decode_num_drafts", "num_draft_tokens": "spec_decode_num_draft_tokens",
              "num_accepted_tokens": "spec_decode_num_accepted_tokens"}
_PER_POS = "spec_decode_num_accepted_tokens_per_pos"


def parse_spec_metrics(metrics: Iterable) -> dict:
    """vLLM's spec-decode counters from ``llm.get_metrics()`` (Metric objects or their dicts), summed over label
    sets: num_drafts, num_draft_tokens, num_accepted_tokens, accepted_per_pos (list)."""
    out = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "accepted_per_pos": []}
    for m in metrics:
        d = m if isinstance(m, dict) else {"name": getattr(m, "name", ""), "value": getattr(m, "value", None),
                                           "values": getattr(m, "values", None)}
        name = str(d.get("name", "")).removesuffix("_total")
        if name.endswith(_PER_POS):
            vals = [int(v) for v in (d.get("values") or [])]
            acc = out["accepted_per_pos"]
            acc.extend([0] * (len(vals) - len(acc)))
            for i, v in enumerate(vals):
                acc[i] += v
            continue
        for key, suffix in _SPEC_KEYS.items():
            if name.endswith(suffix):
                out[key] += int(d.get("value") or 0)
    return out


def diff_spec_metrics(after: dict, before: dict) -> dict:
    n = max(len(after["accepted_per_pos"]), len(before["accepted_per_pos"]))
    a = after["accepted_per_pos"] + [0] * (n - len(after["accepted_per_pos"]))
    b = before["accepted_per_pos"] + [0] * (n - len(before["accepted_per_pos"]))
    d = {k: after[k] - before[k] for k in _SPEC_KEYS}
    d["accepted_per_pos"] = [x - y for x, y in zip(a, b)]
    return d


def metrics_to_dicts(metrics: Iterable) -> list[dict]:
    """Plain dicts of the spec-decode metrics (what the jobs record, so results can be re-parsed later)."""
    out = []
    for m in metrics:
        name = getattr(m, "name", "")
        if "spec_decode" not in name:
            continue
        out.append({"name": name, "labels": dict(getattr(m, "labels", {}) or {}),
                    "value": getattr(m, "value", None), "values": list(getattr(m, "values", []) or []) or None})
    return out


@dataclass
class RunResult:
    run_id: str
    model: str
    method: str
    k: int
    batch_size: int
    n_requests: int
    prompt_len: int              # of the first request
    output_tokens: int           # generated, all requests
    wall_s: float
    output_tok_per_s: float
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list = field(default_factory=list)
    acceptance_length: float | None = None       # 1 + accepted / drafts (tokens per step, bonus included)
    acceptance_rate: float | None = None         # accepted / draft tokens
    per_position_rate: list = field(default_factory=list)
    instrumented: bool = False
    label: str = ""
    outputs: list | None = None                  # generated token ids per request (when kept)

    @classmethod
    def from_counts(cls, *, spec: dict, **kw) -> "RunResult":
        r = cls(**kw, num_drafts=spec["num_drafts"], num_draft_tokens=spec["num_draft_tokens"],
                num_accepted_tokens=spec["num_accepted_tokens"], accepted_per_pos=list(spec["accepted_per_pos"]))
        if r.num_drafts > 0:
            r.acceptance_length = 1 + r.num_accepted_tokens / r.num_drafts
            r.per_position_rate = [a / r.num_drafts for a in r.accepted_per_pos]
        if r.num_draft_tokens > 0:
            r.acceptance_rate = r.num_accepted_tokens / r.num_draft_tokens
        return r

    def to_dict(self, with_outputs: bool = False) -> dict:
        d = asdict(self)
        if not with_outputs:
            d.pop("outputs")
        return d


# ---- the engine ----------------------------------------------------------------------------------------------
class VLLMEngine:
    """One ``vllm.LLM`` for one configuration. Run each configuration in its own process (vLLM keeps GPU
    memory until the process ends)."""

    def __init__(self, cfg: VLLMConfig):
        self.cfg = cfg
        engine_kwargs(cfg)                       # validates method/k before the slow imports
        env = engine_env(cfg)
        for key in ("SPEC_REPRO_STEP_LOG", "SPEC_REPRO_DRAFT_CUDAGRAPHS"):
            if key not in env:
                os.environ.pop(key, None)       # left by an earlier engine of this process
        os.environ.update(env)
        vllm = require_vllm()
        self.vllm_version = vllm.__version__
        t0 = time.perf_counter()
        try:
            self.llm = vllm.LLM(**engine_kwargs(cfg))
        except Exception as e:
            if _is_oom(e):
                raise _oom_error(e, cfg, f"model {cfg.model!r} with max_num_seqs={cfg.max_num_seqs}") from e
            if "engine core initialization failed" in str(e).lower():
                raise VLLMEngineError(
                    f"vLLM could not start {cfg.model!r} ({e}); the engine process printed the cause above. If it "
                    "says 'No available memory for the cache blocks', 'larger than the available KV cache memory' "
                    "or 'out of memory', the model does not fit: " + _oom_error(e, cfg, "it").args[0].split(
                        "Try: ", 1)[1]) from e
            raise
        self.start_s = time.perf_counter() - t0
        self.instrumented = False
        if cfg.step_log:
            st = self.steps("status")
            self.instrumented = bool(st and st[0].get("patched"))

    # -- step-log control (the plugin's RPC in the worker) --
    def steps(self, op: str, **kw) -> list[dict] | None:
        if not self.cfg.step_log:
            return None
        try:
            return self.llm.collective_rpc("spec_repro_steps", kwargs={"op": op, **kw})
        except Exception as e:  # plugin not loaded (not installed as an entry point, or disabled)
            return [{"error": f"{type(e).__name__}: {e}", "patched": False}]

    def _sampling(self, max_tokens: int, ignore_eos: bool = True, stop_token_ids=None):
        from vllm import SamplingParams

        kw = {"stop_token_ids": [int(t) for t in stop_token_ids]} if stop_token_ids else {}
        return SamplingParams(temperature=0.0, max_tokens=int(max_tokens), ignore_eos=ignore_eos, detokenize=False,
                              **kw)

    def generate(self, prompts: Sequence[Sequence[int]], max_tokens: int, *, run_id: str, batch_size: int,
                 label: str = "", keep_outputs: bool = False, detail: bool = False, record: bool = True,
                 ignore_eos: bool = True, stop_token_ids: Sequence[int] | None = None) -> RunResult:
        """Generate greedily from token-id prompts, all submitted at once; time it; diff vLLM's counters."""
        cfg = self.cfg
        self.steps("context", run_id=run_id, model=cfg.label(), method=cfg.method,
                   k=cfg.k if cfg.method != "none" else 0, batch_size=int(batch_size), detail=detail, record=record)
        sp = self._sampling(max_tokens, ignore_eos, stop_token_ids)
        before = parse_spec_metrics(self.llm.get_metrics())
        t0 = time.perf_counter()
        try:
            outs = self.llm.generate([{"prompt_token_ids": list(map(int, p))} for p in prompts], sp, use_tqdm=False)
        except Exception as e:
            if _is_oom(e):
                raise _oom_error(e, cfg, f"a batch of {len(prompts)} requests") from e
            raise
        wall = time.perf_counter() - t0
        after = parse_spec_metrics(self.llm.get_metrics())
        st = self.steps("flush")
        gen = [list(o.outputs[0].token_ids) for o in outs]
        n_out = sum(len(g) for g in gen)
        return RunResult.from_counts(
            spec=diff_spec_metrics(after, before), run_id=run_id, model=cfg.label(), method=cfg.method,
            k=cfg.k if cfg.method != "none" else 0, batch_size=int(batch_size), n_requests=len(prompts),
            prompt_len=len(prompts[0]) if prompts else 0, output_tokens=n_out, wall_s=wall,
            output_tok_per_s=n_out / wall if wall > 0 else float("nan"),
            instrumented=bool(record and st and st[0].get("patched")), label=label,
            outputs=gen if keep_outputs else None)

    def run_batch(self, prompt: Sequence[int], batch_size: int, max_tokens: int, *, run_id: str | None = None,
                  **kw) -> RunResult:
        """The study's batching: ONE prompt copied ``batch_size`` times."""
        run_id = run_id or f"{self.cfg.label()}-{self.cfg.method}-k{self.cfg.k}-b{batch_size}"
        return self.generate([list(prompt)] * int(batch_size), max_tokens, run_id=run_id, batch_size=batch_size, **kw)

    def run_prompts(self, prompts: Sequence[Sequence[int]], max_tokens: int, *, run_id: str | None = None,
                    **kw) -> RunResult:
        """A mixed batch: different prompts, submitted together (continuous batching does the rest)."""
        run_id = run_id or f"{self.cfg.label()}-{self.cfg.method}-mixed{len(prompts)}"
        return self.generate(prompts, max_tokens, run_id=run_id, batch_size=len(prompts), **kw)

    def profile(self, batch_sizes: Sequence[int], prompt_lens: Sequence[int], decode_tokens: int = 32, *,
                max_kv_tokens: int = 262_144, vocab_size: int = 32000, seed: int = 0, progress=None) -> list[RunResult]:
        """Cost surface: for each (B, P) with B*P <= max_kv_tokens, B random-token prompts of length P decode
        ``decode_tokens`` tokens; the step log holds each step's batched tokens, KV tokens and times."""
        out = []
        grid = [(b, p) for p in prompt_lens for b in batch_sizes if b * (p + decode_tokens) <= max_kv_tokens]
        for b, p in (progress(grid) if progress else grid):
            prompts = random_prompts(b, p, vocab_size, seed=seed + 7919 * b + p)
            out.append(self.generate(prompts, decode_tokens, run_id=f"profile-{self.cfg.label()}-b{b}-p{p}",
                                     batch_size=b, label="profile"))
        return out

    def close(self) -> None:
        self.steps("flush")


# ---- prompts -------------------------------------------------------------------------------------------------
def random_prompts(n: int, length: int, vocab_size: int, seed: int = 0) -> list[list[int]]:
    """Seeded random token ids in [100, vocab_size) (distinct prompts; timing only)."""
    rng = np.random.default_rng(seed)
    return rng.integers(100, max(101, vocab_size), size=(n, length)).tolist()


def study_prompt(length: int, vocab_size: int, seed: int = 0) -> list[int]:
    """One seeded random prompt (the study copies one prompt B times)."""
    return random_prompts(1, length, vocab_size, seed)[0]


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


# ---- n-gram acceptance: vLLM's proposer replayed on recorded outputs -----------------------------------------
def ngram_propose(context: Sequence[int], min_n: int, max_n: int, k: int, max_model_len: int | None = None) -> list[int]:
    """What vLLM 0.25's n-gram proposer drafts after ``context``: the package's lookup
    (``spec_repro.proposers.ngram.ngram_lookup``: the longest suffix n-gram, min_n <= n <= max_n, that occurred
    before; among equally long matches the EARLIEST occurrence; up to k tokens that followed it), with k capped
    as vLLM caps it at ``max_model_len``."""
    from ..proposers.ngram import ngram_lookup

    if max_model_len is not None:
        k = min(k, max_model_len - len(context))
    return ngram_lookup(context, k, min_n, max_n) if k > 0 else []


def predict_ngram_steps(prompt: Sequence[int], output: Sequence[int], positions: Iterable[int], *, k: int,
                        min_n: int = 3, max_n: int = 7) -> dict[int, tuple[int, int]]:
    """For each output position p (tokens generated before the step), (drafted, accepted) that vLLM's n-gram
    proposer would get on the greedy ``output``: draft from prompt + output[:p], accepted = leading matches
    with output[p:]."""
    res = {}
    for p in positions:
        ctx = list(prompt) + list(output[:p])
        d = ngram_propose(ctx, min_n, max_n, k)
        acc = 0
        for i, t in enumerate(d):
            if p + i < len(output) and output[p + i] == t:
                acc += 1
            else:
                break
        res[p] = (len(d), acc)
    return res


def load_step_records(path: str | Path) -> list[dict]:
    """The plugin's JSON lines as dicts, keeping every field (``traces.read_steps`` keeps the schema columns)."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def request_steps(records: Iterable[dict], prompts: dict[str, Sequence[int]]) -> dict[str, list[tuple]]:
    """Per prompt key, the steps vLLM ran for it: (position, drafted, accepted), in order. Requests are matched
    to ``prompts`` through the prompt hash the plugin records for new requests (needs detail on)."""
    by_hash = {prompt_hash(p): key for key, p in prompts.items()}
    rid_key: dict[tuple[str, str], str] = {}
    out: dict[str, list[tuple]] = {}
    for r in records:
        run = r.get("run_id", "")
        for rid, (plen, h) in (r.get("new_reqs") or {}).items():
            if h in by_hash:
                rid_key[(run, rid)] = by_hash[h]
        acc = r.get("accepted_per_req") or {}
        for rid, (pos, nsched, ndraft) in (r.get("req_info") or {}).items():
            key = rid_key.get((run, rid))
            if key is None or pos <= 0 or nsched != 1 + ndraft:
                continue              # prefill chunks and unmatched requests
            out.setdefault(key, []).append((int(pos), int(ndraft), int(acc.get(rid, 0))))
    return out


def ngram_agreement(records: Iterable[dict], prompts: dict[str, Sequence[int]], outputs: dict[str, Sequence[int]],
                    *, k: int, min_n: int = 3, max_n: int = 7, predictor=None) -> dict:
    """Compare vLLM's per-step (drafted, accepted), from the plugin's records, with a prediction from the same
    greedy outputs (see ``agreement``)."""
    return agreement(request_steps(records, prompts), prompts, outputs, k=k, min_n=min_n, max_n=max_n,
                     predictor=predictor)


def agreement(steps: dict[str, list[tuple]], prompts: dict[str, Sequence[int]], outputs: dict[str, Sequence[int]],
              *, k: int, min_n: int = 3, max_n: int = 7, predictor=None) -> dict:
    """``steps[key] = [(position, drafted, accepted), ...]`` as vLLM ran them, against
    ``predictor(prompt, output, positions, k=, min_n=, max_n=) -> {pos: (drafted, accepted)}`` (default
    ``predict_ngram_steps``; ``torch_profiler_predictor`` is the torch engine's profiler). Accepted counts are
    compared after capping at the tokens left to generate (vLLM stops at max_tokens). Returns counts, agreement
    rates (all steps, and steps that drafted) and the first mismatches."""
    predictor = predictor or predict_ngram_steps
    n = agree_acc = agree_both = nd_steps = nd_agree = 0
    mism = []
    for key, rows in steps.items():
        out = list(outputs[key])
        pred = predictor(prompts[key], out, [p for p, _, _ in rows], k=k, min_n=min_n, max_n=max_n)
        for pos, nd, na in rows:
            left = len(out) - pos          # tokens vLLM still had to produce at this step
            pd_, pa = pred[pos]
            pa_c, na_c = min(pa, max(left - 1, 0)), min(na, max(left - 1, 0))
            n += 1
            ok_acc = pa_c == na_c
            agree_acc += ok_acc
            agree_both += ok_acc and (pd_ == nd or left <= nd)
            if nd > 0:
                nd_steps += 1
                nd_agree += ok_acc and (pd_ == nd or left <= nd)
            if not ok_acc and len(mism) < 20:
                mism.append({"request": key, "position": pos, "vllm": [nd, na], "predicted": [pd_, pa]})
    return {"steps": n, "requests": len(steps), "accepted_agree": agree_acc, "drafted_and_accepted_agree": agree_both,
            "accepted_agreement_rate": agree_acc / n if n else math.nan,
            "full_agreement_rate": agree_both / n if n else math.nan,
            "steps_with_drafts": nd_steps, "drafted_steps_agree": nd_agree,
            "drafted_steps_agreement_rate": nd_agree / nd_steps if nd_steps else math.nan, "mismatches": mism}


def token_agreement(a: Sequence[int], b: Sequence[int]) -> dict:
    """Common-prefix length of two greedy outputs and whether they are identical over the shorter one."""
    m = min(len(a), len(b))
    i = 0
    while i < m and a[i] == b[i]:
        i += 1
    return {"common_prefix": i, "len_a": len(a), "len_b": len(b), "identical": i == m}


# ---- result handling: step tables -> the numbers the study reports ------------------------------------------
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
    """Time-weighted phase shares (sum of each phase / sum of step time) and mean ms per step, per group.
    Outliers (``flag_jit_outliers``) are left out; ``decode_only`` keeps steps where every request decodes."""
    import pandas as pd

    df = steps if "outlier" in steps.columns else flag_jit_outliers(steps)
    df = df[~df["outlier"]]
    if decode_only and "phase" in df.columns:
        df = df[df["phase"] == "decode"]
    cols = ["t_draft", "t_verify", "t_reject", "t_other", "t_total"]
    extra = ["t_sched"] if "t_sched" in df.columns else []
    g = df.groupby(list(by), observed=True)
    sums = g[cols + extra].sum()
    out = pd.DataFrame({"steps": g.size()})
    for c in cols + extra:
        out[c.replace("t_", "") + "_ms"] = g[c].mean() * 1e3
    for c in ("t_draft", "t_verify", "t_reject", "t_other"):
        out[c.replace("t_", "") + "_share"] = sums[c] / sums["t_total"]
    if extra:
        out["sched_share"] = sums["t_sched"] / sums["t_total"]
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


def torch_profiler_predictor(prompt, output, positions, *, k, min_n=3, max_n=7):
    """The torch engine's profiler (``spec_repro.profiler.ngram_acceptance``) on the same outputs, read the
    way the simulator reads it: the step at position p uses acc_len[p - 1]; drafts capped at k."""
    from ..profiler import ngram_acceptance

    acc, lens = ngram_acceptance(prompt, output, k_max=k, min_n=min_n, max_n=max_n)
    return {p: (int(min(lens[p - 1], k)), int(acc[p - 1]) - 1) for p in positions if 1 <= p <= len(output)}


def load_smollm2_steps(data_dir: str | Path = "data/gpu") -> tuple[dict, dict, dict]:
    """(steps, prompts, outputs) of the committed SmolLM2 run: ``smollm2_vllm_steps.csv`` (vLLM's per-request
    steps), ``smollm2_prompts.jsonl`` and ``smollm2_vllm_outputs.jsonl``, keyed by ``dataset/request_id``."""
    import pandas as pd

    d = Path(data_dir)
    df = pd.read_csv(d / "smollm2_vllm_steps.csv")
    steps = {key: list(zip(g["position"], g["drafted"], g["accepted"])) for key, g in df.groupby("key", sort=False)}
    prompts = {r["key"]: r["prompt_token_ids"] for r in map(json.loads, open(d / "smollm2_prompts.jsonl"))}
    outputs = {r["key"]: r["output_token_ids"] for r in map(json.loads, open(d / "smollm2_vllm_outputs.jsonl"))}
    return steps, prompts, outputs
