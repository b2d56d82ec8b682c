"""``spec-repro reproduce --profile gpu``: the V2-runner grid run live on this GPU host with vLLM, then the notebooks
on what it measured (``reproduce`` calls :func:`run` before the notebooks and passes them its
:func:`notebook_parameters`).

The grid, in the order it runs (what the notebooks most need first; every stage resumable: an engine spec, a gate,
a profile or a trace file that finished under ``out`` is never run again, so a killed run, or one stopped by
``deadline_s``, continues where it stopped):

  lossless  ``v2hybrid``'s lossless stage (bs 1, 3 prompts a workload): no SD and one EAGLE engine rotating EAGLE
            alone and the device-side hybrids; ``check_lossless`` gates the rest (a hybrid whose outputs part
            from no SD's more often than vLLM's own EAGLE's stops the GPU stages); the same two engines then time
            the V2 step timer installed vs removed, interleaved, bs 1/8/32/64   -> out/raw/v2hybrid/lossless
  grid      Qwen2.5-Coder-1.5B-Instruct, real weights (the package's q4_k_m GGUF, run in bf16), the package's
            EAGLE head at k = 5 on vLLM's V2 runner (forced, as vLLM 0.25 picks it for EAGLE; its own async
            scheduling): one engine rotating EAGLE alone, ``gpu-eagle-only``, ``gpu-pr24344``,
            ``gpu-pr24344-skip``; no SD on V2; vLLM's n-gram on V1 (its only runner for n-gram), code-edit and
            sharegpt, bs 1/8/32/64                                                 -> out/raw/v2hybrid/grid
  profile   each workload's no-SD outputs profiled with n-gram and the head on the GPU (the predictor's input)
                                                                                   -> out/live/hybrid_trace*.jsonl
  tables    ``v2summary.summarize`` over out/raw/v2hybrid (runs, steps, lossless, overhead, ratios, predicted)
                                                                                   -> out/live
  traces    vLLM decodes code-edit and sharegpt requests greedily (EOS stops them); n-gram and the EAGLE head are
            profiled over its outputs on the GPU (``collect --engine vllm``)       -> out/traces
  llama     Llama-3.1-8B dimensions, dummy weights (real timing, artificial acceptance), vLLM's default engine: no
            SD and n-gram (k = 3, the study's) at bs 1/16/64/256, 512-token prompts, 256 tokens, 3 repeats
                                                                                   -> out/raw/llama8b2

One GPU suffices (the 1.5B target and the 8B dims each fit one); larger targets go through vLLM's own tensor or
pipeline parallelism (``VLLMConfig(tensor_parallel_size=...)`` in a job of ``data/gpu/jobs.json``).

    python -m spec_repro.engines.vllm.gpu_profile run --out DIR [--head DIR] [--deadline S] [--only STAGE ...]
    python -m spec_repro.engines.vllm.gpu_profile status --out DIR
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .jobs import done_specs

__all__ = ["STAGES", "TRACE_WORKLOADS", "grid_specs", "run", "notebook_parameters", "status"]

V2_STAGES = ("lossless", "grid")          # v2hybrid's stages, in its order
STAGES = V2_STAGES + ("profile", "tables", "traces", "llama")
SPEC_SUFFIX = "-s2"          # the Llama specs' names (run identifiers: a resumed run skips the specs it finished)
TRACE_WORKLOADS = ("code-edit", "sharegpt")
PROFILE_NAMES = {"code-edit": "hybrid_trace_s1.jsonl", "sharegpt": "hybrid_trace_sharegpt_s1.jsonl"}
PROFILE_N = 64               # the grid's largest batch: the no-SD run whose outputs are profiled
TRACE_N, TRACE_TOKENS, TRACE_K_MAX = 24, 256, 16
V2_DIR, LLAMA_DIR = "v2hybrid", "llama8b2"
#: the preset fitted on the H200's live Qwen steps (data/gpu/v1-runner/agreement)
LIVE_COST_MODEL = "qwen2.5-coder-1.5b-h200"
NOTEBOOK_RESERVE_S = 240     # deadline_s: seconds kept for the notebooks after the last stage started
TRACES_S = 200               # the traces stage: engine start + decode + profiling (H200: 114 s, v1-runner/reproduce-grid)
PROFILE_S = 90               # the profile stage: the target and head loaded on the GPU, 2 x 64 requests (~7 s each)
STAGE_S = {"profile": PROFILE_S, "traces": TRACES_S}     # the stages that start only with this many seconds left


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


def grid_specs(head: str | Path, model_dir: str | Path) -> dict[str, list[dict]]:
    """The engine specs of the V2 stages (``v2hybrid.stage_specs``) and the llama stage (pure: nothing is loaded)."""
    from .v2hybrid import stage_specs

    return {**{st: stage_specs(st, str(head), model_dir=str(model_dir)) for st in V2_STAGES}, "llama": llama_specs()}


def _gate(out: Path) -> bool | None:
    """The lossless gate's verdict (``out/raw/v2hybrid/lossless/lossless.jsonl``'s last line), None: not checked."""
    f = out / "raw" / V2_DIR / "lossless" / "lossless.jsonl"
    if not f.exists():
        return None
    last = [json.loads(x) for x in f.read_text().splitlines() if x.strip()][-1:]
    return bool(last[0].get("lossless")) if last and "lossless" in last[0] else None


def status(out: str | Path, head: str | Path = "HEAD", model_dir: str | Path = "MODEL") -> dict[str, bool]:
    """Which stages have finished under ``out`` (no vLLM needed); the lossless stage only once its gate passed."""
    out = Path(out)
    g = grid_specs(head, model_dir)
    from ...collect import trace_path
    from .live_runs import QWEN

    done = {st: {s["name"] for s in g[st]} <= done_specs(out / "raw" / V2_DIR / st / "results.jsonl")
            for st in V2_STAGES}
    done["lossless"] = done["lossless"] and bool(_gate(out))
    done["profile"] = all((out / "live" / PROFILE_NAMES[w]).exists() for w in TRACE_WORKLOADS)
    done["tables"] = (out / "live" / "runs.csv").exists()
    done["traces"] = all(trace_path(out / "traces", QWEN, w).exists() for w in TRACE_WORKLOADS)
    done["llama"] = {s["name"] for s in g["llama"]} <= done_specs(out / "raw" / LLAMA_DIR / "results.jsonl")
    return {st: done[st] for st in STAGES}


def _need_gpu() -> None:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise SystemExit("error: --profile gpu runs vLLM: install it on a GPU host (pip install 'spec-repro[vllm]'); "
                         "the embedded profile (the default) runs anywhere")
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("error: --profile gpu needs a CUDA GPU and none is visible; the embedded profile runs here")


def run(out: str | Path, *, head: str | Path | None = None, deadline_s: float | None = None,
        timeout_s: float = 600, progress=print, reserve_s: float = NOTEBOOK_RESERVE_S,
        only: list[str] | None = None) -> dict:
    """Run the grid's unfinished stages into ``out``; returns :func:`status` after. ``deadline_s``: seconds from
    now after which no stage starts (an engine spec needs 120 s left, the profile ``PROFILE_S``, the traces stage
    ``TRACES_S``), keeping ``reserve_s`` for the notebooks; what did not run is named in the log and
    ``out/gpu_profile.json``. A lossless gate that fails stops every GPU stage after it (the tables still show
    it). ``deadline_s`` = 0: nothing starts, no GPU is needed: the notebooks then run on what ``out`` holds (a
    GPU run's folder copied to a laptop). ``only``: the stages to run (default all; the tables always)."""
    from ... import models
    from .jobs import run_specs
    from .live_profile import default_head, profile_hybrid_task
    from .live_runs import QWEN
    from .v2hybrid import check_lossless
    from .v2summary import summarize

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    head = Path(head) if head else default_head()
    t_end = None if deadline_s is None else time.time() + deadline_s - reserve_s

    def left() -> float | None:
        return None if t_end is None else t_end - time.time()

    if only and set(only) - set(STAGES):
        raise SystemExit(f"error: unknown stages {sorted(set(only) - set(STAGES))}: {', '.join(STAGES)}")
    before = status(out)
    gpu_stages = [s for s in STAGES if s != "tables" and (not only or s in only)]
    starts = deadline_s is None or deadline_s > reserve_s    # else nothing can start: no GPU needed
    if starts and not all(before[s] for s in gpu_stages):
        _need_gpu()
        if not (head / "model.safetensors").exists():
            raise SystemExit(f"error: no EAGLE head at {head} (spec-repro train eagle, or --head DIR)")
    log = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "deadline_s": deadline_s, "stages": {}}
    model_dir = models.convert(QWEN) if starts and not before["grid"] else models.converted_dir(QWEN)
    specs = grid_specs(head, model_dir)
    raw = out / "raw" / V2_DIR
    stop = None             # why the GPU stages after the lossless gate do not run
    for stage in STAGES:
        t0 = time.time()
        if before.get(stage) and stage != "tables":
            log["stages"][stage] = "finished before"
            progress(f"[gpu profile] {stage}: finished before, skipped")
            continue
        if not starts and stage != "tables":
            log["stages"][stage] = "not started (deadline 0)"
            continue
        if stage not in gpu_stages and stage != "tables":
            log["stages"][stage] = "not asked"
            continue
        if stop and stage != "tables":
            log["stages"][stage] = f"not started: {stop}"
            progress(f"[gpu profile] {stage}: not started ({stop})")
            continue
        lf, need = left(), STAGE_S.get(stage, 0)
        if lf is not None and lf < need and stage != "tables":      # the tables: seconds on the CPU, always
            log["stages"][stage] = f"not started: {lf:.0f} s left"
            progress(f"[gpu profile] {stage}: not started ({lf:.0f} s left before the deadline, {need} s needed)")
            continue
        if stage in V2_STAGES or stage == "llama":
            sub = raw / stage if stage != "llama" else out / "raw" / LLAMA_DIR
            fails = run_specs(specs[stage], sub, timeout_s, deadline_s=left())
            log["stages"][stage] = {"failed_specs": fails, "seconds": round(time.time() - t0)}
            if stage == "lossless":
                res = sub / "results.jsonl"
                ok, rows = check_lossless([json.loads(x) for x in res.read_text().splitlines() if x.strip()]
                                          if res.exists() else [])
                (sub / "lossless.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows)
                                                    + json.dumps({"lossless": ok, "runs": len(rows)}) + "\n")
                log["stages"][stage]["lossless"] = ok
                if not ok:
                    stop = "the lossless gate failed (out/raw/v2hybrid/lossless/lossless.jsonl)"
        elif stage == "profile":
            for w in TRACE_WORKLOADS:
                try:
                    profile_hybrid_task(raw / "grid", out / "live" / PROFILE_NAMES[w], head=head, workload=w,
                                        n=PROFILE_N, device="cuda", progress=lambda *_: None)
                except SystemExit as e:      # no no-SD run of this workload at bs 64 (the grid stopped early)
                    progress(f"[gpu profile] profile {w}: {e}")
            log["stages"][stage] = {"seconds": round(time.time() - t0)}
        elif stage == "traces":
            from ...collect import collect

            collect(QWEN, list(TRACE_WORKLOADS), n=TRACE_N, max_new_tokens=TRACE_TOKENS,
                    proposers=["ngram", "eagle"], eagle_head=str(head), engine="vllm", device="cuda",
                    k_max=TRACE_K_MAX, out=out / "traces", quiet=False)
            log["stages"][stage] = {"seconds": round(time.time() - t0)}
        elif raw.is_dir() and any('"kind": "run"' in line for f in raw.rglob("results*.jsonl") for line in open(f)):
            # the tables of what the raw outputs hold (a copied folder without its raw outputs keeps its tables)
            summarize(raw, out / "live", command="spec-repro reproduce --profile gpu")
            log["stages"][stage] = {"seconds": round(time.time() - t0)}
        progress(f"[gpu profile] {stage}: {log['stages'].get(stage)}")
    log["status"] = status(out, head, model_dir)
    with open(out / "gpu_profile.json", "a") as f:
        f.write(json.dumps(log) + "\n")
    return log["status"]


def notebook_parameters(out: str | Path) -> dict:
    """What the notebooks read from a GPU profile's ``out``: its live tables (``live_dir``), its Llama-dims runs
    (``vllm_results``) and its traces with the cost model fitted on the same model's live steps; each only when
    that stage left something (else the notebook shows the committed data, and says so: ``backend`` is "vllm" only
    when both the traces and the Llama runs came)."""
    from ...collect import trace_path
    from .live_runs import QWEN

    out = Path(out)
    p: dict = {"backend": "embedded"}
    if (out / "live" / "runs.csv").exists():
        p["live_dir"] = str(out / "live")
    res = out / "raw" / LLAMA_DIR / "results.jsonl"
    if done_specs(res):
        p["vllm_results"] = str(res)
    traces = [trace_path(out / "traces", QWEN, w) for w in TRACE_WORKLOADS]
    if any(t.exists() for t in traces):
        p["traces"] = [str(t) for t in traces if t.exists()]
        p["cost_model"] = LIVE_COST_MODEL
    if "traces" in p and "vllm_results" in p:
        # every live input came: backend "vllm" (else a notebook would collect or run what a stage skipped,
        # live in the kernel: "embedded" shows the committed data for it instead)
        p["backend"] = "vllm"
    return p


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spec_repro.engines.vllm.gpu_profile",
                                 description="the GPU part of reproduce --profile gpu (no notebooks)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True, help="the profile's folder (reproduce's OUT/gpu)")
    r.add_argument("--head", help="the EAGLE head (default: the package's, in the cache)")
    r.add_argument("--deadline", type=float, help="seconds from now after which no stage starts")
    r.add_argument("--timeout", type=float, default=600, help="seconds per engine spec")
    r.add_argument("--only", nargs="+", choices=STAGES, help="these stages only (the tables always)")
    s = sub.add_parser("status")
    s.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if a.cmd == "status":
        print(json.dumps(status(a.out)))
        return 0
    st = run(a.out, head=a.head, deadline_s=a.deadline, timeout_s=a.timeout, reserve_s=0, only=a.only)
    print(json.dumps(st))
    return 0


if __name__ == "__main__":
    sys.exit(main())
