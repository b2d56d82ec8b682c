"""Greedy decoding on the GPU with vLLM, for ``spec-repro collect --engine vllm`` and ``train eagle --engine vllm``.

vLLM decodes, the package's profiler then teacher-forces the proposers over vLLM's own outputs (torch, same GPU).
The engine is vLLM's default (continuous batching of every prompt at once, CUDA graphs, async scheduling), greedy,
bf16, prefix caching off; prompts are token ids (the chat template was applied by the workload loader), so vLLM's
tokenizer is never used. Outputs end with the end-of-sequence token when the model stopped (as the torch
engine's), else after ``max_new_tokens`` tokens.

:func:`check_engine` says in one line why ``--engine vllm`` cannot run (no vLLM, no GPU) before any model loads.
The weights vLLM loads are the package's converted folder (``spec_repro.models.converted_dir``); their tensor
digest is recorded beside the traces, so both engines are seen to run the same weights.
"""
from __future__ import annotations

import gc
import time
from typing import Sequence

__all__ = ["ENGINES", "EngineError", "check_engine", "vllm_greedy"]

ENGINES = ("torch", "vllm")


class EngineError(ValueError):
    """``--engine`` cannot run here (one clear line)."""


def check_engine(engine: str, device: str = "cuda") -> None:
    """Refuse an engine that cannot run on this machine, before anything loads."""
    if engine not in ENGINES:
        raise EngineError(f"unknown --engine {engine!r}; choose from {', '.join(ENGINES)}")
    if engine != "vllm":
        return
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise EngineError("--engine vllm needs vLLM (pip install 'spec-repro[vllm]' on a GPU host); the torch engine "
                          "(--engine torch, the default) runs anywhere")
    import torch

    if not torch.cuda.is_available():
        raise EngineError("--engine vllm needs a CUDA GPU and none is visible; use --engine torch on this machine")
    if str(device).split(":")[0] != "cuda":
        raise EngineError(f"--engine vllm decodes on the GPU; --device {device} would profile elsewhere: use "
                          "--device cuda")


def vllm_greedy(model_dir: str, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                eos_token_ids: Sequence[int], extra: Sequence[tuple[Sequence[Sequence[int]], int]] = (),
                max_model_len: int | None = None, gpu_memory_utilization: float = 0.35, max_num_seqs: int = 512,
                seed: int = 0, progress: bool = True, on_extra_done=None) -> tuple[list[list[int]], dict]:
    """Greedy outputs of ``prompts`` (token ids) from vLLM, all submitted at once; returns (outputs, stats).

    ``stats``: output tokens, wall seconds of the decode alone, output tokens/s, engine start seconds, the vLLM
    version and settings. ``extra``: (prompts, max_new_tokens) runs timed first on the same engine (e.g. an
    engine comparison on a subset); their outputs and stats are ``stats["extra"]`` (and go to ``on_extra_done``
    as soon as they are known). The engine is shut down
    before returning (its GPU memory goes back to the profiler or the trainer that runs next in the process)."""
    import vllm
    from vllm import LLM, SamplingParams

    eos = sorted({int(t) for t in eos_token_ids})
    longest = max([len(p) for p in prompts] + [len(p) for ps, _ in extra for p in ps] + [1]) + int(max_new_tokens)
    t0 = time.perf_counter()
    kw = dict(model=str(model_dir), dtype="bfloat16", max_model_len=int(max_model_len or longest),
              gpu_memory_utilization=gpu_memory_utilization, max_num_seqs=max_num_seqs, seed=seed,
              enable_prefix_caching=False, skip_tokenizer_init=True)
    # CUDA graphs for every batch size the decode runs: vLLM captures up to min(2 * max_num_seqs, 512) by default,
    # so with max_num_seqs 1024 most decode steps ran without graphs, launch-bound (the GPU ~23% busy)
    graphs = {"max_cudagraph_capture_size": int(max_num_seqs)} if max_num_seqs > 256 else None
    try:
        llm = LLM(**kw, **({"compilation_config": graphs} if graphs else {}))
    except Exception as e:          # a vLLM that refuses the setting still decodes with its default
        if not graphs:
            raise
        print(f"[decode] vLLM refused CUDA graphs up to {max_num_seqs} ({type(e).__name__}: {e}); its default")
        graphs = None
        llm = LLM(**kw)
    t_start = time.perf_counter() - t0

    def run(ps, n_new):
        sp = SamplingParams(temperature=0.0, max_tokens=int(n_new), stop_token_ids=eos, detokenize=False)
        t1 = time.perf_counter()
        res = llm.generate([{"prompt_token_ids": [int(x) for x in p]} for p in ps], sp, use_tqdm=progress)
        wall = time.perf_counter() - t1
        outs = []
        for r in res:
            o = r.outputs[0]
            ids = [int(x) for x in o.token_ids]
            # a stop on a stop_token_id: keep the token in the output (as the torch engine does)
            if o.finish_reason == "stop" and isinstance(o.stop_reason, int) and (not ids or ids[-1] != o.stop_reason):
                ids.append(int(o.stop_reason))
            outs.append(ids)
        n_out = sum(len(o) for o in outs)
        return outs, {"requests": len(ps), "max_new_tokens": int(n_new), "output_tokens": n_out,
                      "decode_wall_s": round(wall, 3), "output_tokens_per_s": round(n_out / wall, 1) if wall else None}

    try:
        extras = [run(ps, n) for ps, n in extra]
        if on_extra_done is not None:
            on_extra_done(extras)
        outs, st = run(prompts, max_new_tokens) if len(prompts) else \
            ([], {"requests": 0, "max_new_tokens": int(max_new_tokens), "output_tokens": 0, "decode_wall_s": 0.0,
                  "output_tokens_per_s": None})     # only the extra runs (an engine comparison)
    finally:
        _shutdown(llm)
    stats = {"engine": "vllm", "vllm_version": vllm.__version__, "dtype": "bfloat16", **st,
             "engine_start_s": round(t_start, 1), "max_num_seqs": max_num_seqs,
             "gpu_memory_utilization": gpu_memory_utilization, "max_model_len": kw["max_model_len"],
             "prefix_caching": False, "seed": seed, "extra": extras,
             "max_cudagraph_capture_size": graphs["max_cudagraph_capture_size"] if graphs else "vLLM default"}
    return outs, stats


def _shutdown(llm) -> None:
    import torch

    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:  # older/newer layouts: deleting the object shuts the engine core down too
        pass
    del llm
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
