"""Live runs from a notebook: fresh acceptance traces (``live_trace``, seconds on a CPU with small settings) and
the vLLM device jobs (``live_vllm_job``, GPU hosts)."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .traces import Trace

from .tracefiles import read_trace

__all__ = ["live_trace", "live_vllm_job", "notebook_trace"]


def notebook_trace(traces=None, *, backend: str = "embedded", model: str | None = None,
                   datasets: Sequence[str] | None = None, proposers: Sequence[str] | None = None,
                   n_requests: int = 4, max_new_tokens: int = 64) -> Trace:
    """A notebook's traces, from its parameters: the committed (or given) trace files, or, with a live ``backend``
    and no ``traces``, fresh ones from the torch engine's exact profiler (``live_trace``), after which the same
    analysis follows. Prints their full provenance (model, engine, machine, date, files)."""
    from .paths import load_traces
    from .provenance import trace_provenance

    if backend == "embedded" or traces is not None:
        trace = load_traces(traces, model=model, datasets=datasets)
    else:
        trace = live_trace("torch", model=model, datasets=datasets, proposers=proposers, n_requests=n_requests,
                           max_new_tokens=max_new_tokens)
    print(trace_provenance(trace))
    return trace


def live_trace(backend: str, *, model: str | None = None, datasets: Sequence[str] | None = None,
               proposers: Sequence[str] | None = None, n_requests: int = 4, max_new_tokens: int = 64,
               k_max: int = 16, out: str | Path | None = None) -> Trace:
    """Collect fresh acceptance traces now (``spec_repro.collect``) and return them.

    ``backend="torch"`` (the only one) decodes with the package's engine on CUDA when available, else CPU:
    per-position acceptance under greedy decoding is a property of the target's outputs, not of the engine, so
    traces are profiled this exact way on any host; vLLM's timings come from ``live_vllm_job``, and vLLM's own
    acceptance counters are compared with these traces in ``data/gpu``. Collection is resumable: finished requests
    are kept under ``out`` (default: the cache)."""
    if backend != "torch":
        raise ValueError(f"unknown backend {backend!r} for live traces; use 'torch' (vLLM runs: live_vllm_job)")
    import torch

    from .collect import collect
    from .models import cache_root

    model = model or "smollm2-135m"
    datasets = list(datasets or ["code-edit", "sharegpt"])
    props = list(proposers or ["ngram", "early-exit"])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = Path(out) if out else cache_root() / "live_traces" / f"{model}_n{n_requests}_t{max_new_tokens}_k{k_max}"
    paths = collect(model, datasets, n=n_requests, max_new_tokens=max_new_tokens, proposers=props, out=out,
                    k_max=k_max, device=device, quiet=True)
    t = Trace.concat(read_trace(p) for p in paths)
    t.meta.update({"files": [str(p) for p in paths], "live": True})
    return t


def live_vllm_job(job: str, out: str | Path | None = None, timeout_s: float = 420) -> Path:
    """Run one of the vLLM device jobs (``spec_repro.engines.vllm.jobs``, e.g. ``llama8b``) now, each engine in
    its own process; returns the folder holding ``results.jsonl`` and ``steps_*.jsonl`` for ``gpu_speedups`` /
    ``gpu_steps``. Needs vLLM and a GPU (the job fails with a clear message otherwise)."""
    import subprocess
    import sys

    from .models import cache_root

    out = Path(out) if out else cache_root() / "live_vllm" / job
    out.mkdir(parents=True, exist_ok=True)
    rc = subprocess.run([sys.executable, "-m", "spec_repro.engines.vllm.jobs", "run", job, "--out", str(out),
                         "--timeout", str(timeout_s)]).returncode
    if rc != 0:
        print(f"vLLM job {job!r}: {rc} engine spec(s) failed; see {out / 'results.jsonl'}")
    return out
