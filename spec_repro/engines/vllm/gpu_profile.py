"""``spec-repro reproduce --profile gpu``: the study's grid run live on this GPU host with vLLM, then the notebooks
on what it measured (``reproduce`` calls :func:`run` before the notebooks and passes them its
:func:`notebook_parameters`).

The grid, in the order it runs (what the notebooks most need first; every stage resumable: an engine spec or a
trace file that finished under ``out`` is never run again, so a killed run, or one stopped by ``deadline_s``,
continues where it stopped):

  qwen    Qwen2.5-Coder-1.5B-Instruct, real weights (the package's q4_k_m GGUF, run in bf16), the package's EAGLE
          head, code-edit, bs 1/8/32/64, k = 5, 3 repeats, the V1 runner forced (vLLM's own async scheduling): no
          SD, the live hybrids with drafts padded to k (PR #24344's rule ``pr24344-pad``; the same rule skipping EAGLE for the
          requests n-gram serves, ``pr24344-skip-pad``), the hybrid's machinery with every request on EAGLE
          (``eagle-only``), EAGLE alone, and the hybrid loaded with nothing to decide (``idle``: a pass-through)
                                                                                     -> out/raw/qwen2
  traces  vLLM decodes code-edit and sharegpt requests greedily (EOS stops them); n-gram and the EAGLE head are
          profiled over its outputs on the GPU (``collect --engine vllm``)          -> out/traces
  llama   Llama-3.1-8B dimensions, dummy weights (real timing, artificial acceptance), vLLM's default engine: no SD
          and n-gram (k = 3, the study's) at bs 1/16/64/256, 512-token prompts, 256 tokens, 3 repeats
                                                                                     -> out/raw/llama8b2
  tables  ``live_summary.summarize`` over out/raw                                    -> out/live

One GPU suffices (the 1.5B target and the 8B dims each fit one); larger targets go through vLLM's own tensor or
pipeline parallelism (``VLLMConfig(tensor_parallel_size=...)`` in a job of ``data/gpu/jobs.json``).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from .jobs import done_specs

__all__ = ["STAGES", "TRACE_WORKLOADS", "grid_specs", "run", "notebook_parameters", "status"]

STAGES = ("qwen", "traces", "llama", "tables")
QWEN_METHODS = ("none", "pr24344-pad", "pr24344-skip-pad")    # then eagle-only, EAGLE alone and the idle hybrid
SPEC_SUFFIX = "-s2"          # the grid's spec names (run identifiers: a resumed run skips the specs it finished)
TRACE_WORKLOADS = ("code-edit", "sharegpt")
TRACE_N, TRACE_TOKENS, TRACE_K_MAX = 24, 256, 16
QWEN_DIR, LLAMA_DIR = "qwen2", "llama8b2"
#: the preset fitted on the H200's live Qwen steps (data/gpu/v1-runner/agreement)
LIVE_COST_MODEL = "qwen2.5-coder-1.5b-h200"
NOTEBOOK_RESERVE_S = 240     # deadline_s: seconds kept for the notebooks after the last stage started
TRACES_S = 200               # the traces stage: engine start + decode + profiling (H200: 114 s, v1-runner/reproduce-grid)


def llama_specs() -> list[dict]:
    """Llama-3.1-8B dims on vLLM's default engine (the runner vLLM picks, async where it allows): no SD and
    n-gram (k = 3, the study's), side by side in one run; dummy weights, bs 1/16/64/256, 512-token prompts, 256
    tokens, every shape warmed, 3 repeats."""
    from .jobs import LLAMA8B

    task = {"type": "batches", "batch_sizes": [1, 16, 64, 256], "prompt_len": 512, "max_tokens": 256,
            "vocab_size": 128256, "repeats": 3, "warm_each": True}
    none = {"name": "llama8b-none-default" + SPEC_SUFFIX, "engine_config": "default", "tasks": [task],
            "config": {"model": LLAMA8B, "method": "none", "load_format": "dummy", "max_model_len": 4096,
                       "max_num_seqs": 256, "name": "llama31-8b", "gpu_memory_utilization": 0.85,
                       "async_scheduling": None, "model_runner": "default"}}
    ngram = {**none, "name": "llama8b-ngram-default" + SPEC_SUFFIX,
             "config": {**none["config"], "method": "ngram", "k": 3}}
    return [none, ngram]


def qwen_specs(head: str | Path, model_dir: str | Path) -> list[dict]:
    """Qwen2.5-Coder-1.5B on code-edit, k = 5, the V1 runner forced: no SD, the padded hybrids (``QWEN_METHODS``),
    the hybrid's machinery with every request on EAGLE, EAGLE alone and the idle (pass-through) hybrid."""
    from .hybrid_jobs import hybrid_specs

    specs = hybrid_specs(str(head), model_dir=str(model_dir), k=5, workloads=("code-edit",),
                         methods=QWEN_METHODS + ("eagle-only", "eagle", "idle"))
    return [{**s, "name": s["name"] + SPEC_SUFFIX} for s in specs]


def grid_specs(head: str | Path, model_dir: str | Path) -> dict[str, list[dict]]:
    """The engine specs of the qwen and llama stages (pure: nothing is loaded)."""
    return {"qwen": qwen_specs(head, model_dir), "llama": llama_specs()}


def status(out: str | Path, head: str | Path = "HEAD", model_dir: str | Path = "MODEL") -> dict[str, bool]:
    """Which stages have finished under ``out`` (no vLLM needed)."""
    out = Path(out)
    g = grid_specs(head, model_dir)
    from ...collect import trace_path
    from .live_runs import QWEN

    return {"qwen": {s["name"] for s in g["qwen"]} <= done_specs(out / "raw" / QWEN_DIR / "results.jsonl"),
            "traces": all(trace_path(out / "traces", QWEN, w).exists() for w in TRACE_WORKLOADS),
            "llama": {s["name"] for s in g["llama"]} <= done_specs(out / "raw" / LLAMA_DIR / "results.jsonl"),
            "tables": (out / "live" / "runs.csv").exists()}


def _need_gpu() -> None:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise SystemExit("error: --profile gpu runs vLLM: install it on a GPU host (pip install 'spec-repro[vllm]'); "
                         "the embedded profile (the default) runs anywhere")
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("error: --profile gpu needs a CUDA GPU and none is visible; the embedded profile runs here")


def run(out: str | Path, *, head: str | Path | None = None, deadline_s: float | None = None,
        timeout_s: float = 600, progress=print) -> dict:
    """Run the grid's unfinished stages into ``out``; returns :func:`status` after. ``deadline_s``: seconds from
    now after which no stage starts (an engine spec needs 120 s left, the traces stage ``TRACES_S``), keeping
    ``NOTEBOOK_RESERVE_S`` for the notebooks; what did not run is named in the log and ``out/gpu_profile.json``.
    ``deadline_s`` = 0: nothing starts, no GPU is needed: the notebooks then run on what ``out`` holds (a GPU
    run's folder copied to a laptop)."""
    from ... import models
    from .jobs import run_specs
    from .live_profile import default_head
    from .live_runs import QWEN
    from .live_summary import summarize

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    head = Path(head) if head else default_head()
    t_end = None if deadline_s is None else time.time() + deadline_s - NOTEBOOK_RESERVE_S

    def left() -> float | None:
        return None if t_end is None else t_end - time.time()

    before = status(out)
    starts = deadline_s is None or deadline_s > NOTEBOOK_RESERVE_S    # else nothing can start: no GPU needed
    if starts and not all(before[s] for s in ("qwen", "traces", "llama")):
        _need_gpu()
        if not (head / "model.safetensors").exists():
            raise SystemExit(f"error: no EAGLE head at {head} (spec-repro train eagle, or --head DIR)")
    log = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "deadline_s": deadline_s, "stages": {}}
    model_dir = models.convert(QWEN) if starts and not before["qwen"] else models.converted_dir(QWEN)
    specs = grid_specs(head, model_dir)
    for stage in STAGES:
        t0 = time.time()
        if before.get(stage) and stage != "tables":
            log["stages"][stage] = "finished before"
            progress(f"[gpu profile] {stage}: finished before, skipped")
            continue
        if not starts and stage != "tables":
            log["stages"][stage] = "not started (deadline 0)"
            continue
        if stage in ("qwen", "llama"):
            sub = out / "raw" / (QWEN_DIR if stage == "qwen" else LLAMA_DIR)
            lf = left()
            fails = run_specs(specs[stage], sub, timeout_s, deadline_s=lf)
            log["stages"][stage] = {"failed_specs": fails, "seconds": round(time.time() - t0)}
        elif stage == "traces":
            lf = left()
            if lf is not None and lf < TRACES_S:
                log["stages"][stage] = f"not started: {lf:.0f} s left"
                progress(f"[gpu profile] traces: not started ({lf:.0f} s left before the deadline)")
                continue
            from ...collect import collect

            collect(QWEN, list(TRACE_WORKLOADS), n=TRACE_N, max_new_tokens=TRACE_TOKENS,
                    proposers=["ngram", "eagle"], eagle_head=str(head), engine="vllm", device="cuda",
                    k_max=TRACE_K_MAX, out=out / "traces", quiet=False)
            log["stages"][stage] = {"seconds": round(time.time() - t0)}
        elif any('"kind": "run"' in line for f in (out / "raw").rglob("results*.jsonl") for line in open(f)):
            # the tables of what the raw outputs hold (a copied folder without its raw outputs keeps its tables)
            summarize(out / "raw", out / "live", command="spec-repro reproduce --profile gpu")
            log["stages"][stage] = {"seconds": round(time.time() - t0)}
        progress(f"[gpu profile] {stage}: {log['stages'].get(stage)}")
    log["status"] = status(out, head, model_dir)
    with open(out / "gpu_profile.json", "a") as f:
        f.write(json.dumps(log) + "\n")
    return log["status"]


def notebook_parameters(out: str | Path) -> dict:
    """What the notebooks read from a GPU profile's ``out``: its live tables (``live_dir``), its Llama-dims runs
    (``vllm_results``) and its traces with the cost model fitted on the same model's live steps; each only when
    that stage left something (else the notebook shows the committed data, and says so)."""
    from ...collect import trace_path
    from .live_runs import QWEN

    out = Path(out)
    p: dict = {"backend": "vllm"}
    if (out / "live" / "runs.csv").exists():
        p["live_dir"] = str(out / "live")
    res = out / "raw" / LLAMA_DIR / "results.jsonl"
    if done_specs(res):
        p["vllm_results"] = str(res)
    traces = [trace_path(out / "traces", QWEN, w) for w in TRACE_WORKLOADS]
    if any(t.exists() for t in traces):
        p["traces"] = [str(t) for t in traces if t.exists()]
        p["cost_model"] = LIVE_COST_MODEL
    return p
