"""Issue 18's GPU session on one leased H200 (``gpu/live_job.sh``): the engine specs of each part in priority
order, their estimated seconds against the device budget, and the steps after the engines (the profiler's
predictions on vLLM's own outputs, agreement, lossless).

Parts, in the order they run (what a later session cannot recover, and what the issue's Must show needs, first):
  a  agreement on real weights: Qwen2.5-Coder-1.5B with the package's EAGLE head, n-gram and the 0.5B draft model,
     each engine decoding the committed agreement prompts with per-request step logs; the EAGLE and n-gram engines
     then run the hybrid task too (one engine start serves both); ``predict`` profiles vLLM's outputs with the
     package's profiler (torch, on the GPU), ``agreement`` compares step by step
  b  the live hybrid: no SD (plain greedy: the lossless reference), PR #24344's rule, its EAGLE-skipping variant
  c  Llama-3.1-8B dimensions, dummy weights, no SD: vLLM's default engine (its choice of runner: V2) vs the
     study-like one (bs 1/16/64/256, 512-token prompt, 256 tokens, every shape warmed, 3 repeats)
  d  EAGLE drafting time: the Qwen head at k = 1 and 12 (k = 5 from part a's engine)

The second session (``SESSION_PARTS[2]``; the first showed vLLM 0.25's V1 runner fast only on uniform 1 + k decode
batches, which the hybrid's short n-gram drafts break), priced with the seconds the first session's engines took
(``MEASURED_S``):
  e  the padded hybrids (every draft padded to k: ``hybrid`` module docstring, "Padding"): pr24344-pad,
     pr24344-skip-pad, ngram-pad, beside no SD (the lossless reference), code-edit bs 1/8/32/64; lossless
  f  what a user runs: EAGLE alone on vLLM's true default (its own runner choice: V2; untimed) and no SD without
     the plugin (the instrumentation's overhead beside e's timed no SD), code-edit bs 1/8/32/64
  g  sharegpt: the best padded hybrid of e (``best_padded``), EAGLE, no SD
  h  EAGLE drafting time: the Qwen head at k = 1, 3, 8, 12, bs 1/8/32/64
  i  the idle hybrid's overhead: the hybrid loaded with every request on EAGLE (``eagle-only``) vs EAGLE alone
``plan --session 2`` drops the lowest-priority parts until the plan fits (they join its deferred list).

    python -m spec_repro.engines.vllm.session plan [--budget 1650] [--session 2]  # CPU: the plan; rc 1 if over
    python -m spec_repro.engines.vllm.session run PART --out DIR --deadline S --head H --model-dir M --draft-dir D
    python -m spec_repro.engines.vllm.session predict --out DIR --head H     # GPU: the profiler's predictions
    python -m spec_repro.engines.vllm.session agreement --out DIR           # CPU or GPU: DIR/qwen_agreement.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .hybrid_jobs import ADAPTIVE_COST, DRAFT_SWEEP
from .jobs import (LLAMA8B, config_label, estimate_seconds, hybrid_plan, hybrid_specs, rotated_spec,
                   run_specs)

__all__ = ["PARTS", "PARTS_2", "SESSION_PARTS", "STAGING", "STAGING_2", "STAGING_3", "STAGING_4", "MEASURED_S", "AGREEMENT_PROMPTS",
           "part_specs", "plan", "best_padded", "prepare_prompts", "predictor_from_acc", "agreement_report"]

BUDGET_S = 1800                  # the session's device seconds, staging included
PLAN_LIMIT_S = 1650              # what the plan may take (margin for polls and slow calls)
QWEN, QWEN_DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"
K = 5                            # the hybrid's k; the agreement runs at the same k (same engines)
HYBRID_WORKLOADS = ("code-edit",)   # sharegpt: the second session (+5 engine starts' worth of runs)

# Fixed costs before the run stage, measured in earlier sessions (gpu/traces_job.sh's header): (stage, calls, s)
STAGING = [
    ("first call (machine start)", 1, 30),
    ("vllm c1..c7 (c6+c7 in one call)", 6, 40),
    ("cache pieces p00..p26 (60 MiB: 1,582 MiB gzip -1; data/ notebooks/ figures/ moved aside)", 27, 140),
    ("setup: install vLLM, reassemble + verify the cache, convert both GGUFs, plugin entry point", 1, 195),
]
PACK_S = 10                      # one pack call after each part
PREDICT_S = 90                   # part a: load the 1.5B (float32), the head and the 0.5B; teacher-forced passes


def _agreement_task(max_tokens: int = 256) -> dict:
    return {"type": "prompts", "prompts_file": str(AGREEMENT_PROMPTS), "max_tokens": max_tokens, "chunk": 40,
            "detail": True, "ignore_eos": False}


def part_specs(part: str, head: str = "HEAD", model_dir: str = "MODEL", draft_dir: str = "DRAFT",
               best: str | None = None) -> list[dict]:
    """The engine specs of one part (pure: nothing is loaded). ``best``: part g's padded hybrid (default
    ``DEFAULT_BEST``; ``session run g`` picks it from part e's results, :func:`best_padded`)."""
    if part in PARTS_2:
        return _second_session_specs(part, head, model_dir, best)
    if part in ("a", "b"):
        hy = {s["config"].get("hybrid") or s["config"]["method"]: s for s in hybrid_specs(
            head, model_dir=model_dir, k=K, workloads=HYBRID_WORKLOADS,
            methods=("none", "ngram", "eagle", "pr24344", "pr24344-skip"))}
        if part == "b":
            return [hy["none"], hy["pr24344"], hy["pr24344-skip"]]
        eagle, ngram = ({**hy[m], "tasks": [_agreement_task()] + hy[m]["tasks"]} for m in ("eagle", "ngram"))
        draft = {"name": "agree-draft", "engine_config": "v1-forced",
                 "config": {**hy["none"]["config"], "method": "draft_model", "k": K,
                            "draft": draft_dir},
                 "tasks": [_agreement_task()]}
        return [eagle, ngram, draft]
    if part == "c":
        task = {"type": "batches", "batch_sizes": [1, 16, 64, 256], "prompt_len": 512, "max_tokens": 256,
                "vocab_size": 128256, "repeats": 3, "warm_each": True}
        base = {"model": LLAMA8B, "method": "none", "load_format": "dummy", "max_model_len": 4096,
                "max_num_seqs": 256, "name": "llama31-8b", "gpu_memory_utilization": 0.85}
        return [{"name": "llama8b-none-default", "engine_config": "default", "tasks": [task],
                 "config": {**base, "async_scheduling": None, "model_runner": "default"}},
                {"name": "llama8b-none-study-like", "engine_config": "study-like", "tasks": [task],
                 "config": {**base, "async_scheduling": False, "model_runner": "v1"}}]
    if part == "d":
        task = {"type": "batches", "batch_sizes": [1, 8, 32, 64], "prompt_len": 512, "max_tokens": 128,
                "vocab_size": 151936, "repeats": 1, "warm_each": True}
        cfg = {"model": model_dir, "name": QWEN, "method": "eagle", "draft": head, "max_model_len": 4096,
               "max_num_seqs": 64, "async_scheduling": None, "gpu_memory_utilization": 0.85}
        return [{"name": f"draftk-qwen-eagle-k{k}", "engine_config": "v1-forced", "tasks": [task],
                 "config": {**cfg, "k": k}} for k in (1, 12)]
    raise ValueError(f"unknown part {part!r}; parts: {', '.join(PARTS)}, {', '.join(PARTS_2)}")


S2 = "-s2"     # the second session's engines: names distinct from the first's (summaries key runs by spec name)
PADDED = ("pr24344-pad", "pr24344-skip-pad", "ngram-pad")   # part e, in this order
DEFAULT_BEST = "pr24344-pad"      # part g's padded hybrid when part e's results do not say


def _s2(specs: list[dict], suffix: str = "") -> list[dict]:
    return [{**s, "name": s["name"] + suffix + S2} for s in specs]


def _second_session_specs(part: str, head: str, model_dir: str, best: str | None) -> list[dict]:
    kw = dict(model_dir=model_dir, k=K, workloads=HYBRID_WORKLOADS)
    if part == "e":
        return _s2(hybrid_specs(head, methods=("none",) + PADDED, **kw))
    if part == "f":
        return _s2(hybrid_specs(head, methods=("eagle",), engine_config="default", **kw)
                   + hybrid_specs(head, methods=("none",), instrumented=False, **kw))
    if part == "g":
        best = best or DEFAULT_BEST
        if best not in PADDED:
            raise ValueError(f"part g's hybrid must be one of part e's {', '.join(PADDED)}, got {best!r}")
        return _s2(hybrid_specs(head, methods=(best, "eagle", "none"), **{**kw, "workloads": ("sharegpt",)}),
                   "-sharegpt")
    if part == "h":
        d = part_specs("d", head, model_dir)[0]          # part d's task and engine at more k
        return _s2([{**d, "name": f"draftk-qwen-eagle-k{k}", "config": {**d["config"], "k": k}}
                    for k in (1, 3, 8, 12)])
    if part == "i":
        return _s2(hybrid_specs(head, methods=("eagle-only", "eagle"), **kw))
    if part == "j":         # after the GPU profile's run: the idle hybrid as a pass-through (hybrid.PASSTHROUGH)
        return _s2(hybrid_specs(head, methods=("idle",), **kw))
    if part == "n":         # the third session: e's padded n-gram alone, after `reproduce --profile gpu`
        return _s2(hybrid_specs(head, methods=("ngram-pad",), **kw))
    if part == "k":         # the fourth session: the device-side hybrid (gpu_hybrid), no host round trip
        return [{**s, "name": s["name"] + S4} for s in hybrid_specs(head, methods=GPU_HYBRID_ENGINES, **kw)]
    if part == "w":         # EAGLE's drafting time per k: both targets' dims, dummy weights (DRAFT_SWEEP)
        return [_drafting_spec(m, k) for k in DRAFT_ORDER for m in DRAFT_SWEEP]
    if part in ("m", "s"):  # the fifth session: EAGLE alone, idle and the device-side hybrids in ONE engine
        wl = ("code-edit",) if part == "m" else ("sharegpt",)
        kw = {**kw, "workloads": wl, "repeats": ROTATED_REPEATS}
        specs = [rotated_spec(head, **kw)] + hybrid_specs(head, methods=("none", "ngram"), **kw)
        return [{**s, "name": s["name"] + ("" if part == "m" else "-sharegpt") + S5} for s in specs]
    if part == "x":         # the seventh session: adaptive-rule's first live run (host-side, padded), sharegpt
        specs = hybrid_specs(head, **{**kw, "workloads": ("sharegpt",), "repeats": 1}, methods=("adaptive-rule-pad",),
                             cost_model=ADAPTIVE_COST)
        return [{**s, "name": s["name"] + "-sharegpt" + S8} for s in specs]
    if part in ("u", "v"):  # the eighth session: adaptive-rule live in the rotated engine, beside no SD
        wl = ("code-edit",) if part == "u" else ("sharegpt",)
        kw = {**kw, "workloads": wl, "repeats": REPEATS_9}
        specs = [rotated_spec(head, policies=ROTATE_POLICIES_9, pad=True, cost_model=ADAPTIVE_COST, **kw)] + \
            hybrid_specs(head, methods=("none",), **kw)
        return [{**s, "name": s["name"] + ("" if part == "u" else "-sharegpt") + S9} for s in specs]
    if part in ("y", "l", "q"):   # no SD first, then ONE engine rotating five policies (the device-side machinery
        # idle too): y, the ninth and tenth sessions' (part v again, sharegpt); l, q the eleventh's (code-edit,
        # sharegpt; the engine probe around every run)
        wl = "code-edit" if part == "l" else "sharegpt"
        kw = {**kw, "workloads": (wl,), "repeats": REPEATS_9}
        specs = hybrid_specs(head, methods=("none",), **kw) + \
            [rotated_spec(head, policies=ROTATE_POLICIES_10, pad=True, cost_model=ADAPTIVE_COST, **kw)]
        tag = ("" if part == "l" else "-sharegpt") + (S10 if part == "y" else S11)
        return [{**s, "name": s["name"] + tag} for s in specs]
    if part == "o":         # the ninth session: vLLM's n-gram beside no SD on code-edit, then n-gram on sharegpt
        kw = {**kw, "repeats": REPEATS_9}
        ce = hybrid_specs(head, methods=("none", "ngram"), **{**kw, "workloads": ("code-edit",)})
        sg = hybrid_specs(head, methods=("ngram",), **{**kw, "workloads": ("sharegpt",)})
        return [{**s, "name": s["name"] + S10} for s in ce] + [{**s, "name": s["name"] + "-sharegpt" + S10} for s in sg]
    if part == "z":         # the eighth session, time left: vLLM's n-gram on code-edit (bs 1's best single)
        kw = {**kw, "workloads": ("code-edit",), "repeats": REPEATS_9}
        return [{**s, "name": s["name"] + S9} for s in hybrid_specs(head, methods=("ngram",), **kw)]
    raise ValueError(f"unknown part {part!r}")


# part w: EAGLE's drafting time at each k, per target (its dims, its head's dims; dummy weights): vLLM 0.25's EAGLE
# drafts one head forward per token, the first over every token the step verified (the padded drafter batch: the
# same count whatever was accepted), so its time does not depend on the weights; the step log's t_draft per k
# fits costmodel's per_token drafter with its d0 (c_step), separable once k varies
DRAFT_KS = (1, 3, 5, 8, 12)
DRAFT_ORDER = (1, 12, 5, 3, 8)     # run order: both targets' end points first (d0, d1 from two k), if the deadline cuts
S6 = "-s6"     # the sixth session's engines (part w)
S8 = "-s8"     # the seventh session's (part x)
S9 = "-s9"     # the eighth session's (parts u, v, z)
# parts u, v: EAGLE alone, the device-side rule, the host-side machinery idle (eagle-only: the hybrid term the
# predictor fits for adaptive-rule, out of sample) and the simulator's best causal policy, host-side, padded
ROTATE_POLICIES_9 = ("off", "gpu-pr24344", "eagle-only", "adaptive-rule")
REPEATS_9 = 3     # not the full square (4): the session's budget, after two refusals and a lost machine, fits 3
S10 = "-s10"   # the ninth session's (parts y, o)
# part y: part v's four policies and the device-side machinery idle (gpu-eagle-only: gpu-pr24344's hybrid term, so
# both hybrids are predicted out of sample in one run)
ROTATE_POLICIES_10 = ("off", "gpu-pr24344", "gpu-eagle-only", "eagle-only", "adaptive-rule")
S11 = "-s11"   # the eleventh session's (parts l, q: part y's engines on both workloads, engine probes recorded)


def _drafting_spec(target: str, k: int) -> dict:
    t = DRAFT_SWEEP[target]
    task = {"type": "batches", "batch_sizes": [1, 8, 32, 64], "prompt_len": 512, "max_tokens": 128,
            "vocab_size": t["vocab_size"], "repeats": 2, "warm_each": True}
    cfg = {"model": t["model"], "name": t["name"], "method": "eagle", "draft": t["draft"], "k": k,
           "load_format": "dummy", "max_model_len": 4096, "max_num_seqs": 64, "async_scheduling": None,
           "gpu_memory_utilization": 0.85}
    return {"name": f"draftk-{target}-eagle-k{k}{S6}", "engine_config": "v1-forced", "tasks": [task], "config": cfg}


def best_padded(results: str | Path) -> str:
    """Part e's padded hybrid with the highest mean speedup over no SD across batch sizes (each batch size's
    output tokens over wall seconds, all its repeats and chunks, over the timed no SD's), from ``results.jsonl``;
    ``DEFAULT_BEST`` when no padded hybrid or no SD finished there."""
    tok: dict = {}
    path = Path(results)
    if not path.exists():
        return DEFAULT_BEST
    for line in open(path):
        d = json.loads(line)
        if d.get("kind") != "run" or d.get("task") != "hybrid" or d.get("workload") != "code-edit":
            continue
        if not d.get("config", {}).get("step_log"):    # untimed engines (part f): not like for like
            continue
        t = tok.setdefault(config_label(d.get("config", {})), {}).setdefault(d["batch_size"], [0, 0.0])
        t[0] += d["output_tokens"]
        t[1] += d["wall_s"]
    base = {b: n / w for b, (n, w) in tok.get("none", {}).items() if w > 0}
    score = {m: sum(n / w / base[b] for b, (n, w) in tok[m].items()) / len(tok[m])
             for m in PADDED if m in tok and tok[m] and all(b in base and w > 0 for b, (n, w) in tok[m].items())}
    return max(score, key=score.get) if score else DEFAULT_BEST


PARTS = {"a": "EAGLE / n-gram / draft-model agreement on real weights (+ EAGLE and n-gram alone, hybrid task)",
         "b": "live hybrid: no SD, pr24344, pr24344-skip (code-edit, bs 1/8/32/64, k 5, 3 repeats); lossless",
         "c": "Llama-3.1-8B dims, dummy weights: default vs study-like engine, no SD, bs 1/16/64/256",
         "d": "EAGLE drafting time: the Qwen head at k = 1 and 12 (k = 5 from part a), bs 1/8/32/64"}
PARTS_2 = {"e": "padded hybrids pr24344-pad, pr24344-skip-pad, ngram-pad + no SD (code-edit, bs 1/8/32/64); lossless",
           "f": "vLLM's true default: EAGLE alone (V2 runner, untimed) + no SD untimed (V1: the timer's overhead)",
           "g": "sharegpt: the best padded hybrid of e, EAGLE, no SD (bs 1/8/32/64); lossless",
           "h": "EAGLE drafting time: the Qwen head at k = 1, 3, 8, 12, bs 1/8/32/64",
           "i": "idle-hybrid overhead: hybrid loaded, every request on EAGLE (eagle-only) vs EAGLE alone",
           "j": "the idle hybrid as a pass-through (idle: vLLM's own EAGLE step, counted) beside i's EAGLE alone",
           "n": "padded n-gram alone (ngram-pad; part e's last engine), run after `reproduce --profile gpu`",
           "k": "the device-side hybrid (gpu-pr24344; gpu-eagle-only: its machinery idle) beside EAGLE alone, the "
                "pass-through idle hybrid, no SD and vLLM's n-gram (code-edit, bs 1/8/32/64, k 5, 3 repeats); lossless",
           "m": "ONE EAGLE engine rotating EAGLE alone (off), idle, gpu-pr24344, gpu-eagle-only (Latin square, "
                "4 repeats), beside no SD and vLLM's n-gram (code-edit, bs 1/8/32/64, k 5); lossless",
           "s": "part m on sharegpt",
           "x": "the adaptive-rule hybrid's first live run (host-side, padded; priced with qwen2.5-coder-1.5b-h200) "
                "on sharegpt, bs 1/8/32/64, 1 repeat, after part s (lossless against its no SD); only in time left",
           "u": "ONE EAGLE engine rotating EAGLE alone (off), gpu-pr24344, eagle-only and adaptive-rule (host-side, "
                "drafts padded to k, priced with qwen2.5-coder-1.5b-h200; rotated, 3 repeats) beside no SD "
                "(code-edit, bs 1/8/32/64, k 5); lossless",
           "v": "part u on sharegpt",
           "z": "vLLM's n-gram alone on code-edit (bs 1's best single proposer in part m), 3 repeats; lossless",
           "y": "sharegpt: no SD, then ONE EAGLE engine rotating EAGLE alone (off), gpu-pr24344, gpu-eagle-only, "
                "eagle-only and adaptive-rule (host-side padded; 3 repeats), bs 1/8/32/64, k 5; lossless",
           "o": "vLLM's n-gram alone beside no SD on code-edit, then n-gram alone on sharegpt (3 repeats); lossless",
           "l": "code-edit: no SD, then part y's rotated engine (EAGLE alone, gpu-pr24344, gpu-eagle-only, "
                "eagle-only, adaptive-rule; 3 repeats), bs 1/8/32/64, k 5, the engine probe around every run; lossless",
           "q": "part l on sharegpt (part y again, with the engine probe)",
           "w": "EAGLE drafting time at k = 1, 3, 5, 8, 12: Qwen2.5-Coder-1.5B and Llama-3.1-8B dims with their "
                "heads' dims, dummy weights, bs 1/8/32/64, 2 repeats (costmodel's d0 + k*d1)"}
S4 = "-s4"     # the fourth session's engines (part k, with the head that session trained)
S5 = "-s5"     # the fifth's (parts m, s: the rotated engine, with the fourth session's head from the cache)
ROTATED_REPEATS = 4       # one per position of the Latin square over jobs.ROTATE_POLICIES
GPU_HYBRID_ENGINES = ("eagle", "gpu-pr24344", "idle", "none", "gpu-eagle-only", "ngram")   # part k, in priority
# order: the Must shows first (the hybrid vs EAGLE, idle vs EAGLE, the predictor's no SD and its hybrid term), vLLM's
# n-gram alone last (the first live session measured it far below EAGLE at every batch size)
# each session's parts, in priority order; session 2: the Must show first (padded hybrids >= the best single
# proposer; the idle hybrid's overhead), then vLLM's true default, sharegpt, the drafting-time sweep
SESSION_PARTS = {1: tuple(PARTS), 2: ("e", "i", "f", "g", "h"), 3: ("w",), 4: ("s", "x"), 5: ("u", "v", "z"),
                 6: ("y", "o"), 7: ("l", "q"), 8: ("q", "l"), 9: ("q", "l")}
# session 3 (gpu/live_job.sh start7): no model staged (dummy weights), so no cache pieces and no conversion
STAGING_3 = [("machine start + vllm c1..c7 (measured in the fifth GPU session: 130 s)", 6, 130),
             ("setup7: install vLLM, the plugin entry point (no cache, no conversion)", 1, 110)]
DEFERRED = ["hybrid and agreement on sharegpt (the hybrid specs' second workload)",
            "adaptive-rule hybrid (needs an H200 cost model fitted on this run's Qwen steps)",
            "EAGLE drafting time at k = 3, 8 (Qwen) and k = 1, 5, 8, 12 (Llama-3.1-8B dims)",
            "plugin overhead with the hybrid loaded but idle",
            "`spec-repro reproduce --profile gpu` end to end (its llama8b job: 3 engines, ~450 s)"]
DEFERRED_3 = ["part s (sharegpt: the rotated engine, no SD, n-gram) and part m again with the host's steal time "
              "recorded: real weights and a head (retrained: ~530 s)"]
# session 4 (gpu/live_job.sh start8): part s on sharegpt with a head trained in the run (no checkout keeps one),
# priced by what the fifth GPU session measured (its staging, setup, training; part m's engines)
STAGING_4 = [("machine start + vllm c1..c7 (measured in the fifth GPU session: 130 s)", 6, 130),
             ("18 cache pieces: Qwen 1.5B + the workloads, no head (measured: 129 s)", 18, 130),
             ("setup: install vLLM, reassemble + verify the cache, convert the GGUF (measured: 178 s)", 1, 180),
             ("in the run: train a head (run6's recipe, 520 s budget; measured 530 s), then after part s the "
              "sharegpt profile of its no-SD outputs with that head (code-edit's measured 34 s)", 0, 570)]
DEFERRED_4 = ["the adaptive-rule hybrid live (the simulator's best causal policy, host-side: `hybrid.LiveHybrid`, "
              "priced with qwen2.5-coder-1.5b-h200) beside gpu-pr24344 on code-edit, and part m again, each run "
              "predicted at its own host speed (`live.host_index`): a head again (~530 s)",
              "the code-edit profile with this session's head (~35 s), if the run has time left"]
# session 5 (gpu/live_job.sh start9): the seventh session's head staged from the cache (no training), parts u, v;
# the profiles of both workloads' no-SD outputs with that head on the GPU (the predictor's input), then part z
STAGING_5 = [("machine start + vllm c1..c7 (measured in the seventh GPU session: ~180 s)", 6, 180),
             ("20 cache pieces: Qwen 1.5B + the head + code-edit, sharegpt (the seventh's 18 took ~100 s)", 20, 120),
             ("setup: install vLLM, reassemble + verify the cache, convert the GGUF (measured: 141 s)", 1, 150),
             ("in the run, after parts u and v: each workload's no-SD outputs profiled with the head (part m's "
              "measured 34 s each)", 0, 70)]
DEFERRED_5 = ["n-gram on sharegpt at bs 32 / 64 (the seventh session's deadline cut it; 0.20-0.23x of no SD "
              "where it ran)", "the idle hybrid (pass-through) again: its overhead stays inside the repeat spread"]
# session 6 (gpu/live_job.sh start10): the seventh session's head from the cache again; part y (sharegpt, no SD first,
# then the rotated engine), sharegpt's no-SD outputs profiled with the head, part o (n-gram and no SD on code-edit,
# n-gram on sharegpt); priced by what the eighth session measured
STAGING_6 = [("machine start + vllm c1..c7 (measured in the eighth GPU session: 125 s with the pieces, ~180 s "
              "with a slow first call)", 6, 180),
             ("19 cache pieces: Qwen 1.5B + the head + code-edit, sharegpt (the eighth's, in the same call run)",
              19, 110),
             ("setup: install vLLM, reassemble + verify the cache, convert the GGUF (measured: 142 s)", 1, 150),
             ("in the run, after part y: sharegpt's no-SD outputs profiled with the head (~20 s measured for "
              "code-edit's in the eighth session)", 0, 35)]
DEFERRED_6 = ["the adaptive rule on the device (its host-side machinery costs 21-41% of EAGLE's throughput from "
              "bs 8 on: eagle-only in the eighth session)",
              "code-edit's rotated engine with gpu-eagle-only beside adaptive-rule (the eighth session ran it without: "
              "gpu-pr24344 predicted there without its hybrid term)"]
# session 7 (gpu/live_job.sh start11): the seventh session's head from the cache; parts l (code-edit) and q (sharegpt),
# each no SD then the five-policy rotated engine, every run with the worker's host probe before and after
# (``VLLMEngine.engine_probe``: is it the host index that t_other was not in data/gpu/live9?); each part's no-SD
# outputs profiled on the H200 after it; priced by what the tenth session measured
STAGING_7 = [("machine start + vllm c1..c7 (measured in the tenth GPU session: ~120 s on a warm start)", 6, 180),
             ("19 cache pieces: Qwen 1.5B + the head + code-edit, sharegpt (the tenth's: ~7 s a call)", 19, 140),
             ("setup: install vLLM, reassemble + verify the cache, convert the GGUF (measured: 165 s)", 1, 170),
             ("in the run, after each part: its no-SD outputs profiled with the head on the H200 (the tenth "
              "session's: ~10 s)", 0, 30)]
DEFERRED_7 = [DEFERRED_6[0], "vLLM's n-gram alone again (the tenth session measured it beside no SD on both "
              "workloads: 0.29-0.71x)"]
# session 8 (gpu/live_job.sh start12): session 7's parts on a machine whose cache holds no head (the checkout is new:
# ff44a72f... is gone), so a head is trained in the run first (start8's recipe); sharegpt's part q first (live9's
# miss was there), its profile, then part l if the plan fits it (it does not: deferred)
STAGING_8 = [STAGING_7[0],
             ("18 cache pieces: Qwen 1.5B + the seven workloads training and its split need, no head (the seventh "
              "session's 18: ~100 s)", 18, 130),
             STAGING_7[2],
             ("in the run: train a head (start8's recipe, 520 s budget; the seventh session's took ~530 s), then "
              "after part q its no-SD outputs profiled with that head (~10 s)", 0, 560)]
DEFERRED_8 = DEFERRED_7 + ["the seventh session's head (ff44a72f...) again: no cache keeps it between checkouts"]
# session 9 (gpu/live_job.sh start12 with TRAIN_BUDGET): session 8's run on a lease of 1,500 device seconds, not
# 1,800 (`status`'s budget_left_s at the session's start): the head's training budget cut from 520 s to what the
# lease leaves (~450 s: its decoding and feature pass take ~300 s of it, so ~150 s of optimizer steps, not ~225)
TRAIN_BUDGET_9 = 450
LEASE_9 = 1500
STAGING_9 = STAGING_8[:3] + [
    (f"in the run: train a head (start8's recipe at a {TRAIN_BUDGET_9} s budget: TRAIN_BUDGET), then after part q "
     "its no-SD outputs profiled with that head (~10 s)", 0, TRAIN_BUDGET_9 + 40)]
DEFERRED_9 = DEFERRED_8 + [f"the head at start8's full training budget (520 s; this lease fits {TRAIN_BUDGET_9} s)"]
DEFERRED_2 = ["adaptive-rule hybrid, padded or not (its cost model: an H200 preset fitted on the first session's Qwen "
              "steps)",
              "agreement on sharegpt; no SD on vLLM's true default (V2) for Qwen (part c measured it for Llama dims)",
              "EAGLE drafting time on Llama-3.1-8B dims"]   # `reproduce --profile gpu` ran in the third session

# What the first session took on the H200 (device seconds per engine spec, from its log; staging and setup)
MEASURED_S = {"hybrid-default-eagle": 180, "hybrid-default-ngram": 158, "agree-draft": 145, "hybrid-default-none": 120,
              "hybrid-default-pr24344": 110, "hybrid-default-pr24344-skip": 78, "llama8b-none-default": 131,
              "llama8b-none-study-like": 126,
              # the fifth GPU session's part m (code-edit; part s runs the same engines on sharegpt)
              "hybrid-default-rotate-s5": 307, "hybrid-default-none-s5": 101, "hybrid-default-ngram-s5": 140,
              # the eighth GPU session's parts u, v (its results.jsonl: `done` seconds, engine start included;
              # u's rotated engine started first: 89 s of start, v's 46 with the compile cache warm)
              "hybrid-default-rotate-s9": 239, "hybrid-default-rotate-sharegpt-s9": 241, "hybrid-default-none-s9": 83,
              # the seventh session's n-gram on sharegpt: cut at 159 s in bs 32's first repeat (3.6 s a repeat
              # there, bs 64 assumed twice that): ~159 + 4 x 3.6 + 5 x 7
              "hybrid-default-ngram-sharegpt-s5": 210,
              # the ninth GPU session's first engine (part y's no SD, the machine's first: 85 s of cold start)
              "hybrid-default-none-sharegpt-s10": 128,
              # the tenth GPU session's parts y, o (its log; no SD on sharegpt 121 s there, the machine's first
              # engine again): the next plans' prices for these shapes
              "hybrid-default-rotate-sharegpt-s10": 327, "hybrid-default-none-s10": 81,
              "hybrid-default-ngram-s10": 140, "hybrid-default-ngram-sharegpt-s10": 122}
STAGING_2 = [("staging as the first session: machine start, vllm c1..c7, cache pieces p00..p26 (measured)", 34, 254),
             ("setup: install vLLM, reassemble + verify the cache, convert both GGUFs, plugin entry point (measured)",
              1, 255)]
# the agreement prompts' share of an engine that ran them before the hybrid task: EAGLE's spec with them less
# pr24344's (EAGLE every step too) without
AGREEMENT_TASK_S = MEASURED_S["hybrid-default-eagle"] - MEASURED_S["hybrid-default-pr24344"]
# a second-session engine (name less -sharegpt / -s2) -> (the first session's engine it is priced as, seconds
# added): the same model, engine and task shape (one workload, bs 1/8/32/64, 3 repeats, 256 tokens; sharegpt's
# requests decode as long, EOS ignored). Padding should make the padded engines faster, not slower.
ANALOGUE = {"hybrid-default-none": ("hybrid-default-none", 0),
            "hybrid-default-none-noinst": ("hybrid-default-none", 0),
            "hybrid-default-pr24344-pad": ("hybrid-default-pr24344", 0),
            "hybrid-default-pr24344-skip-pad": ("hybrid-default-pr24344-skip", 0),
            "hybrid-default-ngram-pad": ("hybrid-default-ngram", -AGREEMENT_TASK_S),
            "hybrid-default-eagle": ("hybrid-default-eagle", -AGREEMENT_TASK_S),
            "hybrid-vllm-default-eagle": ("hybrid-default-eagle", -AGREEMENT_TASK_S),
            "hybrid-default-eagle-only": ("hybrid-default-pr24344", 0),
            "hybrid-default-rotate-s5": ("hybrid-default-rotate-s5", 0),     # part s: part m's engines, sharegpt
            "hybrid-default-none-s5": ("hybrid-default-none-s5", 0),
            "hybrid-default-ngram-s5": ("hybrid-default-ngram-s5", 0),
            # parts u, v: part m's rotated engine with two host-side policies of four (the third GPU session's
            # eagle-only ran 110 s where EAGLE alone ran 91: ~+20% on half the runs), 3 repeats of part m's 4
            # (its engine start 83 s, the rest scaled by 3/4)
            "hybrid-default-rotate-s9": ("hybrid-default-rotate-s5", -56 + 20),
            "hybrid-default-none-s9": ("hybrid-default-none-s5", -20),
            "hybrid-default-ngram-s9": ("hybrid-default-ngram-s5", -30),
            # parts y, o: the rotated engine a fifth policy longer (its per-policy share (241 - 46) / 4 = 49 s) and
            # starting without the compile cache (+43 s: u's start over v's); the other engines as measured
            "hybrid-default-rotate-sharegpt-s10": ("hybrid-default-rotate-sharegpt-s9", 49 + 43),
            "hybrid-default-none-sharegpt-s10": ("hybrid-default-none-sharegpt-s10", 0),   # measured (ninth)
            "hybrid-default-none-s10": ("hybrid-default-none-s9", 0),
            "hybrid-default-ngram-s10": ("hybrid-default-ngram-s5", 0),
            "hybrid-default-ngram-sharegpt-s10": ("hybrid-default-ngram-sharegpt-s5", 0),
            # parts l, q: the tenth session's engines on both workloads (code-edit's rotated engine priced as
            # sharegpt's: the eighth session's four-policy pair ran 239 and 241 s); two probes a run (~10 ms each)
            "hybrid-default-none-s11": ("hybrid-default-none-s10", 0),
            "hybrid-default-rotate-s11": ("hybrid-default-rotate-sharegpt-s10", 0),
            "hybrid-default-none-sharegpt-s11": ("hybrid-default-none-sharegpt-s10", 0),
            "hybrid-default-rotate-sharegpt-s11": ("hybrid-default-rotate-sharegpt-s10", 0)}


def _batches_calibration() -> float:
    """Measured over modelled seconds of the first session's engines that ran only batches tasks (part c)."""
    specs = part_specs("c")
    return sum(MEASURED_S[s["name"]] for s in specs) / sum(spec_seconds(s) for s in specs)


def measured_seconds(spec: dict) -> tuple[float, str]:
    """(seconds, basis) of a second-session engine: its analogue's measured seconds (``ANALOGUE``), else (no
    analogue ran: part d's drafting-time engines) ``spec_seconds`` scaled by the first session's measured/modelled
    ratio for batches engines."""
    base = spec["name"] if spec["name"] in ANALOGUE else (
        spec["name"].removesuffix(S2).removesuffix("-sharegpt").replace("-sharegpt-s5", "-s5")
        .replace("-sharegpt-s9", "-s9"))
    if base in ANALOGUE:
        ref, add = ANALOGUE[base]
        return MEASURED_S[ref] + add, f"{ref} {MEASURED_S[ref]} s" + (f" {add:+d} s" if add else "")
    f = _batches_calibration()
    return spec_seconds(spec) * f, f"model x {f:.2f}"


def spec_seconds(spec: dict) -> float:
    """``jobs.estimate_seconds`` for hybrid tasks; prompts and batches tasks priced the same way."""
    t = estimate_seconds(spec)
    big = "llama" in spec["config"]["name"]
    step_s, per_seq_s = (0.005, 4e-5) if big else (0.006, 5e-5)
    tps = 1.0 if spec["config"]["method"] == "none" else 2.0
    for task in spec["tasks"]:
        if task["type"] == "prompts":       # chunks of `chunk` requests, max_tokens steps at most
            n = sum(1 for x in open(task["prompts_file"]) if x.strip()) if Path(task["prompts_file"]).exists() else 200
            c = task["chunk"]
            t += -(-n // c) * task["max_tokens"] / tps * (step_s + c * per_seq_s)
        elif task["type"] == "batches":
            passes = task.get("repeats", 1) + (1 if task.get("warm_each") else 0)
            for b in task["batch_sizes"]:
                prefill = b * task["prompt_len"] / 200_000          # ~200k prompt tokens/s
                t += passes * (prefill + task["max_tokens"] / tps * (step_s + b * per_seq_s))
    return t


def _part_row(part: str, session: int) -> dict:
    specs = part_specs(part)
    hp = {r["spec"]: r for r in hybrid_plan([s for s in specs if any(x["type"] == "hybrid" for x in s["tasks"])])}
    engines = []
    for s in specs:
        secs, basis = measured_seconds(s) if session >= 2 else (spec_seconds(s), "model")
        engines.append({"spec": s["name"], "method": s["config"]["method"], "hybrid": s["config"].get("hybrid"),
                        "pad": bool(s["config"].get("hybrid_pad")), "instrumented": s.get("instrumented", True),
                        "engine_config": s.get("engine_config"), "tasks": [x["type"] for x in s["tasks"]],
                        "workloads": sorted({w for x in s["tasks"] for w in x.get("workloads", [])}),
                        "hybrid_runs": hp.get(s["name"], {}).get("runs", 0), "seconds": round(secs), "basis": basis})
    secs = sum(e["seconds"] for e in engines) + (PREDICT_S if part == "a" else 0) + PACK_S
    desc = (PARTS if session == 1 else PARTS_2)[part]
    return {"stage": f"run part {part}: {desc}", "part": part, "calls": 1, "seconds": secs, "engines": engines}


def plan(budget: float = PLAN_LIMIT_S, session: int = 1) -> dict:
    """The session's stages in order, with the engine specs and seconds of each part, the total and whether it fits
    ``budget``. Session 1: its parts a-d priced by ``spec_seconds`` (``jobs hybrid --plan``'s model), as planned
    and run. Session 2: its parts e-i priced by the first session's measured seconds (``measured_seconds``); the
    lowest-priority parts are dropped (into ``deferred``, with their seconds) until the total fits; ``parts``: what
    the session runs (``PARTS="e i f" bash gpu/live_job.sh start``)."""
    if session not in SESSION_PARTS:
        raise ValueError(f"session must be one of {', '.join(map(str, SESSION_PARTS))}, got {session!r}")
    staging = {1: STAGING, 2: STAGING_2, 3: STAGING_3, 4: STAGING_4, 5: STAGING_5, 6: STAGING_6,
               7: STAGING_7, 8: STAGING_8, 9: STAGING_9}[session]
    rows = [{"stage": s, "calls": c, "seconds": t} for s, c, t in staging]
    parts = [_part_row(p, session) for p in SESSION_PARTS[session]]
    deferred = list({1: DEFERRED, 2: DEFERRED_2, 3: DEFERRED_3, 4: DEFERRED_4, 5: DEFERRED_5, 6: DEFERRED_6,
                     7: DEFERRED_7, 8: DEFERRED_8, 9: DEFERRED_9}[session])
    dropped = []
    if session >= 2:
        while parts and sum(r["seconds"] for r in rows + parts) > budget:
            r = parts.pop()
            dropped.insert(0, r["part"])
            deferred.insert(0, f"part {r['part']} (~{r['seconds']} s, over the plan limit): {PARTS_2[r['part']]}")
    rows += parts
    total = sum(r["seconds"] for r in rows)
    return {"session": session, "stages": rows, "total_s": total, "budget_s": budget, "device_budget_s": BUDGET_S,
            "fits": total <= budget and bool(parts), "parts": [r["part"] for r in parts], "dropped": dropped, "deferred": deferred}


from .agreement import (AGREE_SPECS, AGREEMENT_PROMPTS, agreement_outputs, agreement_report, load_prompts,  # noqa: F401
                        predict, predictor_from_acc, prepare_prompts, profile_outputs)


# ---- command line ---------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spec_repro.engines.vllm.session", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan")
    p.add_argument("--budget", type=float, default=PLAN_LIMIT_S)
    p.add_argument("--session", type=int, default=1, choices=sorted(SESSION_PARTS),
                   help="1: the first session's plan (a-d, as run); 2: the second's (e-i, measured seconds); "
                        "3: the drafting-time sweep (part w, dummy weights: gpu/live_job.sh start7); "
                        "4: part s on sharegpt with a head trained in the run (gpu/live_job.sh start8); 9: start12 "
                        "on a 1,500 s lease (--budget 1450), the head's training cut to TRAIN_BUDGET_9")
    p.add_argument("--json", action="store_true")
    r = sub.add_parser("run")
    r.add_argument("part", choices=sorted({**PARTS, **PARTS_2}))
    for a in ("--out", "--head", "--model-dir", "--draft-dir"):
        r.add_argument(a, required=True)
    r.add_argument("--deadline", type=float)
    r.add_argument("--timeout", type=float, default=600)
    pr = sub.add_parser("predict")
    pr.add_argument("--out", required=True)
    pr.add_argument("--head", required=True)
    ag = sub.add_parser("agreement")
    ag.add_argument("--out", required=True)
    pp = sub.add_parser("prepare-prompts")
    pp.add_argument("--out", default=str(AGREEMENT_PROMPTS))
    a = ap.parse_args(argv)
    if a.cmd == "plan":
        pl = plan(a.budget, a.session)
        if a.json:
            print(json.dumps(pl, indent=1))
        else:
            later = pl["session"] >= 2      # priced by measured seconds, parts dropped to fit
            for row in pl["stages"]:
                print(f"{row['seconds']:>6.0f} s  {row['calls']:>3} call(s)  {row['stage']}")
                for e in row.get("engines", []):
                    extra = (f"; {'timed' if e['instrumented'] else 'untimed'}; {', '.join(e['workloads'])}; "
                             f"priced as {e['basis']}") if later else ""
                    print(f"{'':>8}{e['seconds']:>6.0f} s  {e['spec']}  [{e['engine_config']}; "
                          f"{' + '.join(e['tasks'])}; {e['hybrid_runs']} hybrid runs{extra}]")
            print(f"{pl['total_s']:>6.0f} s  total (plan limit {pl['budget_s']:.0f} s of {pl['device_budget_s']} s)")
            if later:
                run = {3: "bash gpu/live_job.sh start7", 4: "bash gpu/live_job.sh start8",
                       8: "bash gpu/live_job.sh start12 (q, then l in the time left)",
                       9: f"TRAIN_BUDGET={TRAIN_BUDGET_9} bash gpu/live_job.sh start12 (q, then l in the time left)"}
                print(f"parts run: {run.get(pl['session'], 'bash gpu/live_job.sh start')}" if pl["session"] in run
                      else f"parts run: PARTS=\"{' '.join(pl['parts'])}\" bash gpu/live_job.sh start"
                      + (f"   (dropped to fit: {' '.join(pl['dropped'])})" if pl["dropped"] else ""))
            print(f"deferred to {'a later' if later else 'a second'} session:", *pl["deferred"], sep="\n  - ")
        if not pl["fits"]:
            why = (f"{pl['total_s']:.0f} s > {pl['budget_s']:.0f} s" if pl["parts"] else
                   f"no part fits beside the staging ({pl['total_s']:.0f} s of {pl['budget_s']:.0f} s)")
            print(f"OVER BUDGET: {why}", file=sys.stderr)
            return 1
        return 0
    if a.cmd == "run":
        best = best_padded(Path(a.out) / "results.jsonl") if a.part == "g" else None
        if best:
            print(f"part g: padded hybrid {best} (best of part e in {a.out})", flush=True)
        specs = part_specs(a.part, a.head, a.model_dir, a.draft_dir, best=best)
        return run_specs(specs, Path(a.out), a.timeout, False, None, a.deadline)
    if a.cmd == "predict":
        print(predict(a.out, a.head))
        return 0
    if a.cmd == "agreement":
        rep = agreement_report(a.out)
        for spec, r in rep.items():
            v = r.get("vs_profiler") or {}
            print(spec, r["proposer"], "steps", v.get("steps"), "agree", v.get("accepted_agree"),
                  "rate", v.get("accepted_agreement_rate"))
        return 0
    if a.cmd == "prepare-prompts":
        print(prepare_prompts(a.out))
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
