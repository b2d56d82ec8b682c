"""The study's configurations in vLLM (0.25.x), with per-step phase timing from ``plugin``.

``VLLMEngine(VLLMConfig(model=..., method="ngram", k=3))`` builds ``vllm.LLM`` for a speculative method
(``none`` = no SD, ``ngram``, ``eagle``, ``eagle3``, ``draft_model``, ``mtp``), ``run_batch`` runs the study's
batching (ONE prompt copied B times), ``run_prompts`` a mixed batch, and both return a ``RunResult``: output
tokens/s, wall time and vLLM's own spec-decode counters (drafts, draft tokens, accepted tokens, accepted per
position) taken as the difference of ``llm.get_metrics()`` around the run. With ``step_log=PATH`` every engine
step's phases (drafting, verification, rejection sampling, the rest) go to PATH as JSON lines
(``spec_repro.traces.read_steps`` reads them). ``profile`` sweeps batch size x prompt length on any
architecture from its ``config.json`` with ``load_format="dummy"`` and token-id prompts, for
``spec_repro.costmodel.fit``. ``hybrid=<policy>`` (method ``eagle``) turns on the plugin's live
n-gram + EAGLE hybrid (V1 runner: ``hybrid_runner.patch_hybrid``, every policy; V2 runner: ``hybrid_v2``, the
device-side ones, ``runner_policy_check``), ``hybrid_pad=True`` pads its drafts to k (uniform decode
batches, ``hybrid`` module docstring, "Padding"); the plugin's status (``plugin_status``, with a step log) says
whether it is on (``hybrid``, ``hybrid_pad``) or why not (``hybrid_error``).

Importing this module needs neither vLLM nor a GPU; building an engine does, and says so clearly.
Defaults follow the study's engine (vLLM 0.10.1): prefix caching off, chunked prefill on, greedy decoding,
synchronous scheduling (vLLM 0.25 would overlap scheduling with the GPU for some methods only, which would
make the methods incomparable) and the V1 GPU model runner (0.25 picks its V2 runner for some methods only).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from .common import (ENV_DRAFT_CG, ENV_HYBRID, ENV_HYBRID_COST, ENV_HYBRID_PAD, ENV_PATH, HYBRID_OFF,
                     host_probe as host_probe)
from .metrics import RunResult, cpu_steal_s, diff_spec_metrics, own_counters, parse_spec_metrics

__all__ = [
    "METHODS", "VLLMConfig", "VLLMEngine", "VLLMEngineError", "RunResult", "speculative_config", "engine_kwargs",
    "engine_env", "parse_spec_metrics", "diff_spec_metrics", "require_vllm", "study_prompt", "random_prompts",
]

METHODS = ("none", "ngram", "eagle", "eagle3", "draft_model", "mtp")
SUPPORTED_VLLM = "0.25"


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
    model_runner: str = "v1"                    # "v1" / "v2": forced (the plugin times either) | "default":
                                                # vLLM's choice (V2 for EAGLE / no SD on dense targets);
                                                # VLLMEngine.resolved says
    synthetic_acceptance_length: float | None = None   # vLLM's synthetic rejection sampler (dummy weights)
    draft_cudagraphs: bool = False              # draft_model only: replay its CUDA graphs (vLLM PR #47460, plugin)
    step_log: str | None = None                 # JSON-lines path for per-step phase timing (the plugin)
    hybrid: str | None = None                   # method eagle: a hybrid.POLICIES name, the live n-gram + EAGLE
    hybrid_cost_model: str | None = None        # hybrid "adaptive-rule": its cost model (preset name or file)
    hybrid_pad: bool = False                    # hybrid: pad every draft to k (uniform 1 + k decode batches)
    hybrid_rotate: list | None = None           # method eagle: policies one engine switches between runs
                                                # (set_hybrid; "off": vLLM's EAGLE alone), e.g. off, idle, gpu-*
    seed: int = 0
    name: str | None = None                     # label for results; defaults to the model dir's name
    config_suffix: str | None = None            # appended to the configuration's name in tables
                                                # (hybrid_jobs.config_label), e.g. "-k3": an engine at another k
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
        if "eagle" in m and Path(cfg.draft).expanduser().is_dir():  # a head committed in parts: its joined copy
            from ...proposers.eagle_files import EagleError, resolve_parts

            try:
                sc["model"] = str(resolve_parts(Path(cfg.draft).expanduser()))
            except EagleError as e:
                raise VLLMEngineError(str(e)) from None
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
    if cfg.model_runner not in ("v1", "v2", "default"):
        raise VLLMEngineError(f"model_runner must be 'v1', 'v2' or 'default', got {cfg.model_runner!r}")
    if cfg.model_runner in ("v1", "v2"):
        env["VLLM_USE_V2_MODEL_RUNNER"] = "0" if cfg.model_runner == "v1" else "1"
    if cfg.step_log:
        env[ENV_PATH] = str(Path(cfg.step_log).resolve())
    if cfg.draft_cudagraphs:
        if cfg.method != "draft_model":
            raise VLLMEngineError("draft_cudagraphs=True is for method='draft_model' (vLLM already replays "
                                  f"EAGLE/MTP drafters' graphs), not {cfg.method!r}")
        env[ENV_DRAFT_CG] = "1"
    hybrid = cfg.hybrid
    if cfg.hybrid_rotate:
        from .hybrid import POLICIES

        bad = [p for p in cfg.hybrid_rotate if p != HYBRID_OFF and p not in POLICIES]
        on = [p for p in cfg.hybrid_rotate if p != HYBRID_OFF]
        if bad or not on or not cfg.step_log or (hybrid and hybrid not in cfg.hybrid_rotate):
            raise VLLMEngineError(f"hybrid_rotate= takes {HYBRID_OFF!r} and hybrid policies ({', '.join(POLICIES)}),"
                                  f" at least one policy, and a step log (the switch is the plugin's RPC); got "
                                  f"{list(cfg.hybrid_rotate)!r}" + (f", step_log={cfg.step_log!r}" if not
                                                                     cfg.step_log else ""))
        hybrid = hybrid or on[0]               # installed at start; set_hybrid switches between runs
    if hybrid:
        from .hybrid import POLICIES

        if cfg.method != "eagle" or hybrid not in POLICIES:
            raise VLLMEngineError(f"hybrid= needs method='eagle' (got {cfg.method!r}) and one of "
                                  f"{', '.join(POLICIES)} (got {hybrid!r})")
        if "adaptive-rule" in (hybrid, *(cfg.hybrid_rotate or ())) and not cfg.hybrid_cost_model:
            raise VLLMEngineError("hybrid='adaptive-rule' prices proposals with a cost model: set "
                                  "hybrid_cost_model= (a preset name or file)")
        runner_policy_check(cfg.model_runner, [hybrid, *(cfg.hybrid_rotate or ())])
        env[ENV_HYBRID] = hybrid
        if cfg.hybrid_cost_model:
            env[ENV_HYBRID_COST] = str(cfg.hybrid_cost_model)
        if cfg.hybrid_pad:
            env[ENV_HYBRID_PAD] = "1"
    elif cfg.hybrid_pad:
        raise VLLMEngineError("hybrid_pad=True pads the live hybrid's drafts: set hybrid= too (e.g. 'ngram-only' "
                              "for n-gram alone, padded)")
    return env


def runner_policy_check(model_runner: str, policies) -> None:
    """The hybrid policies a runner takes: host-side ones wrap the V1 runner only (``hybrid_runner``); the V2 runner
    (``model_runner`` ``v2``, or ``default``: vLLM picks V2 for EAGLE) takes the device-side ones
    (``gpu_hybrid.GPU_POLICIES``, ``hybrid_v2``); ``gpu-pr24344-skip`` is V2's only."""
    from .gpu_hybrid import GPU_POLICIES, V1_GPU_POLICIES

    for p in policies:
        if not p or p == HYBRID_OFF:
            continue
        if model_runner == "v1" and p in GPU_POLICIES and p not in V1_GPU_POLICIES:
            raise VLLMEngineError(f"hybrid {p!r} runs on the V2 model runner only: set model_runner='v2'")
        if model_runner != "v1" and p not in GPU_POLICIES:
            raise VLLMEngineError(f"hybrid {p!r} (a host-side policy) wraps the V1 model runner: keep "
                                  f"model_runner='v1' (the V2 runner takes {', '.join(GPU_POLICIES)})")


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


# ---- the engine ----------------------------------------------------------------------------------------------
class VLLMEngine:
    """One ``vllm.LLM`` for one configuration. Run each configuration in its own process (vLLM keeps GPU
    memory until the process ends)."""

    def __init__(self, cfg: VLLMConfig):
        self.cfg = cfg
        engine_kwargs(cfg)                       # validates method/k before the slow imports
        env = engine_env(cfg)
        for key in ("SPEC_REPRO_STEP_LOG", "SPEC_REPRO_DRAFT_CUDAGRAPHS", "SPEC_REPRO_HYBRID", "SPEC_REPRO_HYBRID_COST",
                    "SPEC_REPRO_HYBRID_PAD"):
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
        from .labels import resolved_engine

        # what vLLM resolved: the runner (v1/v2) and async scheduling, recorded beside the forced settings
        self.resolved = resolved_engine(self.llm)
        self.instrumented = False
        self.plugin_status = None
        if cfg.step_log:
            st = self.steps("status")
            self.plugin_status = st[0] if st else None
            self.instrumented = bool(st and st[0].get("patched"))

    # -- step-log control (the plugin's RPC in the worker) --
    def steps(self, op: str, **kw) -> list[dict] | None:
        if not self.cfg.step_log:
            return None
        try:
            return self.llm.collective_rpc("spec_repro_steps", kwargs={"op": op, **kw})
        except Exception as e:  # plugin not loaded (not installed as an entry point, or disabled)
            return [{"error": f"{type(e).__name__}: {e}", "patched": False}]

    def counters(self) -> tuple[dict, dict | None]:
        """vLLM's counters now: this engine's own where they can be read (``own_counters``), else the registry's;
        and beside the own, the registry's, which hold the same numbers for an engine alone in its process."""
        reg = parse_spec_metrics(self.llm.get_metrics())
        own = own_counters(self.llm)
        return (reg, None) if own is None else (parse_spec_metrics(own), reg)

    def engine_probe(self) -> float | None:
        """``host_probe()`` timed in the engine's worker (the engine core's process under vLLM 0.25's default
        executor: where a step's t_draft and t_other accrue), in ms; None without the plugin. The driver's own probe
        (``host_probe_ms``) does not track that process's host speed on the lent H200
        (data/gpu/v1-runner/host-drift), and a run's t_other, which ``live.host_index`` reads instead, also holds
        the policy's own work (data/gpu/v1-runner/sharegpt-one-machine:
        one policy's t_other ran 35% above its idle counterpart's at bs 64 while their drafting agreed). Read just
        before and after each run, outside its timed window, beside both. Measured (data/gpu/v1-runner/host-probe):
        bimodal, and
        its two readings of one run agree on the mode in 64% of runs (the host flips inside a run); a run's drafting
        tracks its own t_other far better (r = 0.85-0.96 against 0.11-0.75 at bs 8-64), so the index stays t_other."""
        st = self.steps("probe")
        v = st[0].get("probe_ms") if st and isinstance(st[0], dict) else None
        return None if v is None else round(float(v), 3)

    def set_hybrid(self, policy: str) -> dict:
        """Switch the engine's hybrid to ``policy`` (one of ``cfg.hybrid_rotate``) for the runs that follow; returns
        the plugin's status (its ``hybrid_error``: a policy that went off, vLLM's EAGLE running in its place)."""
        if policy not in (self.cfg.hybrid_rotate or ()):
            raise VLLMEngineError(f"set_hybrid({policy!r}): this engine rotates {self.cfg.hybrid_rotate!r}")
        st = self.steps("hybrid", policy=policy)
        if not st or st[0].get("hybrid_now") != policy:
            raise VLLMEngineError(f"the plugin did not switch the hybrid to {policy!r}: {st}")
        return st[0]

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
        before, reg0 = self.counters()
        eprobe = self.engine_probe()
        probe = host_probe()
        steal0 = cpu_steal_s()
        t0 = time.perf_counter()
        try:
            outs = self.llm.generate([{"prompt_token_ids": list(map(int, p))} for p in prompts], sp, use_tqdm=False)
        except Exception as e:
            if _is_oom(e):
                raise _oom_error(e, cfg, f"a batch of {len(prompts)} requests") from e
            raise
        wall = time.perf_counter() - t0
        steal1 = cpu_steal_s()
        after, reg1 = self.counters()
        st = self.steps("flush")
        eprobe_end = self.engine_probe()
        gen = [list(o.outputs[0].token_ids) for o in outs]
        n_out = sum(len(g) for g in gen)
        return RunResult.from_counts(
            spec=diff_spec_metrics(after, before), run_id=run_id, model=cfg.label(), method=cfg.method,
            k=cfg.k if cfg.method != "none" else 0, batch_size=int(batch_size), n_requests=len(prompts),
            prompt_len=len(prompts[0]) if prompts else 0, output_tokens=n_out, wall_s=wall,
            output_tok_per_s=n_out / wall if wall > 0 else float("nan"),
            instrumented=bool(record and st and st[0].get("patched")), label=label,
            outputs=gen if keep_outputs else None,
            counters="registry" if reg0 is None else "engine",
            registry_agrees=(None if reg0 is None
                             else diff_spec_metrics(reg1, reg0) == diff_spec_metrics(after, before)),
            host_steal_s=None if steal0 is None or steal1 is None else round(steal1 - steal0, 3),
            host_probe_ms=round(probe, 3), engine_probe_ms=eprobe, engine_probe_end_ms=eprobe_end)

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
