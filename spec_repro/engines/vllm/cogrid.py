"""Engines resident together, runs rotated: several vLLM configurations (no SD, EAGLE at each k) started side by
side on one GPU in one process, then every shape run on each in turn, the order rotated from repeat to repeat
(``hybrid_jobs.rotated_order``). Separately started engines of one configuration ran 0.65-0.81x apart on the lent
H200 while the hypervisor stole CPU time from one of them; rotated on resident engines, a host epoch falls on every
configuration alike, and each run keeps its steal share (``data/gpu/v2grid``: an EAGLE engine started alone agrees
with its co-resident ratio at code-edit bs 1, 2.08x and 2.11x).

A group spec (:func:`group_spec`) holds its member specs; ``jobs spec`` runs it with :func:`run_group`. Each member
writes the records its own engine would (``engine``, ``run`` with its spec name, ``done``), so ``v2grid``'s tables
read a group's results as they read separate engines'; a run record adds ``group`` and ``slot`` (its place in the
rotation). Each engine's counters are read from its own stat logger (``engine.own_counters``); where they cannot
be, only the last-started engine's are (the registry's), and the others' runs say so (``UNREAD``). A group that
fails to start leaves its members undone: ``v2grid run --co-resident`` lists the members after the group, so they
then run one engine at a time."""
from __future__ import annotations

import time
from pathlib import Path

#: ``llm.get_metrics()`` reads vLLM's process-wide Prometheus registry, and vLLM 0.25's PrometheusStatLogger
#: unregisters every earlier engine's collectors when an engine starts (``vllm/v1/metrics/loggers.py``): there only
#: the last-started engine's counters are its own. Where an engine's own logger cannot be read (``own_counters``
#: None), the other engines' runs keep throughput (output tokens over wall time) and leave the counters unread.
UNREAD = {"num_drafts": None, "num_draft_tokens": None, "num_accepted_tokens": None, "accepted_per_pos": None,
          "acceptance_length": None, "acceptance_rate": None, "vllm_generation_tokens": None,
          "counters": "not read: vLLM's registry holds the last-started engine's counters only"}


def group_spec(members: list[dict], memory_each: float = 0.15) -> dict:
    """One spec that runs ``members`` (uninstrumented specs with one ``hybrid`` task of the same shapes) on
    resident engines, each given ``memory_each`` of the GPU's memory (vLLM's gpu_memory_utilization)."""
    if len(members) < 2:
        raise ValueError("a co-resident group needs at least two member specs")
    if not 0 < memory_each * len(members) <= 0.9:
        raise ValueError(f"{len(members)} engines x gpu_memory_utilization {memory_each} do not fit one GPU (<= 0.9)")
    tasks = [m["tasks"] for m in members]
    if any(t != tasks[0] for t in tasks) or [t["type"] for t in tasks[0]] != ["hybrid"]:
        raise ValueError("co-resident members must share one hybrid task (the same workloads, shapes and repeats)")
    if any(m.get("instrumented", True) for m in members):
        raise ValueError("co-resident members run uninstrumented (no step log): vLLM as its users run it")
    ms = [{**m, "config": {**m["config"], "gpu_memory_utilization": memory_each}} for m in members]
    return {"name": "cogroup-" + "+".join(m["name"] for m in members), "members": ms, "instrumented": False,
            "tasks": [dict(t) for t in tasks[0]]}


def run_group(group: dict, out: Path, *, append, environment, make_engine=None, load_requests=None) -> None:
    """Start every member's engine, then per workload and batch size: one untimed warm-up pass on each engine,
    then ``repeats`` rounds in which every engine runs the shape's chunks, in rotated order (the shapes:
    ``hybrid_jobs.task_shapes``, ``load_requests`` its loader). ``make_engine``: the vLLM engine (default
    ``engine.VLLMEngine``); ``append`` / ``environment``: the results writer and the environment record (``jobs``
    passes its own)."""
    from .hybrid_jobs import rotated_order, task_shapes

    if make_engine is None:
        from .engine import VLLMConfig, VLLMEngine

        def make_engine(cfg: dict):
            return VLLMEngine(VLLMConfig(**cfg, step_log=None))
    out.mkdir(parents=True, exist_ok=True)
    res = out / "results.jsonl"
    task = group["tasks"][0]
    t0 = time.time()
    engines, bases = {}, {}
    try:
        for m in group["members"]:
            eng = engines[m["name"]] = make_engine(m["config"])
            bases[m["name"]] = {"spec": m["name"], "config": dict(vars(eng.cfg)), "group": group["name"],
                                **({"engine_config": m["engine_config"]} if m.get("engine_config") else {})}
            append(res, {"kind": "engine", **bases[m["name"]], "start_s": eng.start_s, "instrumented": False,
                         "resolved": getattr(eng, "resolved", None) or {}, "vllm": eng.vllm_version,
                         "co_resident": [x["name"] for x in group["members"]], "env": environment()})
            print(f"[{group['name']}] {m['name']} up in {eng.start_s:.1f}s", flush=True)
        names = list(engines)
        first = engines[names[0]].cfg
        for w, b, chunks in task_shapes(task, first.model, first.max_model_len, load_requests):
            for n in names:                   # this shape once on each engine, untimed
                engines[n].run_prompts([q.prompt_token_ids for q in chunks[0]], task["max_tokens"],
                                       run_id=f"{w}-b{b}-c0@{n}-r-1", record=False, label="warmup")
            for slot, (rep, n) in enumerate(rotated_order(names, task["repeats"])):
                for c, ch in enumerate(chunks):
                    r = engines[n].run_prompts([q.prompt_token_ids for q in ch], task["max_tokens"],
                                               run_id=f"{w}-b{b}-c{c}-r{rep}", keep_outputs=True, label="hybrid")
                    r.batch_size = b
                    append(res, {"kind": "run", **bases[n], **r.to_dict(with_outputs=True), "task": "hybrid",
                                 "workload": w, "repeat": rep, "chunk": c, "keys": [q.id for q in ch],
                                 "slot": slot % len(names),
                                 **({} if n == names[-1] or r.counters == "engine" else UNREAD)})
            print(f"[{group['name']}] {w} bs {b}: {task['repeats']} rotated rounds", flush=True)
    finally:
        for eng in engines.values():
            eng.close()
    for n in names:
        append(res, {"kind": "done", "spec": n, "group": group["name"], "seconds": time.time() - t0})
    append(res, {"kind": "done", "spec": group["name"], "seconds": time.time() - t0})
