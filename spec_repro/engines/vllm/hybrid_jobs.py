"""The live hybrid's measurement, as engine specs for ``jobs``: ``hybrid_specs`` makes one engine spec per
configuration (no SD, n-gram alone, EAGLE alone, EAGLE + each hybrid policy), ``rotated_spec`` one engine that
switches policies between runs (``rotated_order``, ``rotated_run_config``), ``estimate_seconds`` / ``hybrid_plan``
price them, ``_hybrid_task`` runs one spec's workloads inside the job's child process, ``lossless_report`` compares
every run's outputs with the no-SD engine's."""
from __future__ import annotations

from .labels import ENGINE_CONFIGS, UNTIMED_CONFIGS, canonical_config

HYBRID_MODEL = "qwen2.5-coder-1.5b"
HYBRID_WORKLOADS = ("code-edit", "sharegpt")
HYBRID_BATCH_SIZES = (1, 8, 32, 64)
HYBRID_METHODS = ("none", "ngram", "eagle", "pr24344", "pr24344-skip", "adaptive-rule")
PADDED_METHODS = ("pr24344-pad", "pr24344-skip-pad", "ngram-pad")   # the hybrid with every draft padded to k
ROTATE_POLICIES = ("off", "idle", "gpu-pr24344", "gpu-eagle-only")   # rotated_spec: EAGLE alone, idle, the hybrids
ADAPTIVE_COST = "qwen2.5-coder-1.5b-h200"   # adaptive-rule's cost model in the live runs (fitted on H200 Qwen steps)
# EAGLE's drafting time per k (data/gpu/v1-runner/draft-k): each target's dims and its head's dims, dummy weights
DRAFT_SWEEP = {
    "qwen": {"model": "data/gpu/configs/qwen25_coder_1p5b", "name": HYBRID_MODEL,
             "draft": "data/heads/qwen2.5-coder-1.5b-eagle", "vocab_size": 151936},
    "llama8b": {"model": "data/gpu/configs/llama31_8b", "name": "llama31-8b", "draft": "data/gpu/configs/eagle_llama31_8b",
                "vocab_size": 128256},
}
# engine configuration -> VLLMConfig fields (``labels``): "v1-forced": vLLM's own scheduling (async for EAGLE) on the
# V1 runner the plugin hooks; "study-like": synchronous, V1; "default": what a user runs, vLLM 0.25's own choice of
# runner too (the V2 runner for EAGLE and no SD on Qwen2, config/vllm.py:518-555; V1 for n-gram, :2068-2071),
# which the plugin does not time: its specs are uninstrumented and cannot run the hybrid

# the spec-name token of each configuration: spec names are run identifiers (resumed jobs, committed tables, the
# plans' measured seconds), so they keep the tokens they had when "default" meant the forced V1 runner
SPEC_TOKEN = {"v1-forced": "default", "study-like": "study-like", "default": "vllm-default", "v2-forced": "v2"}


def hybrid_method(m: str) -> tuple[str, str | None, bool]:
    """(vLLM method, hybrid policy or None, padded) of a ``hybrid_specs`` method: ``none``/``ngram``/``eagle``
    (vLLM's own), a hybrid policy (method ``eagle``, the plugin's hybrid), ``<policy>-pad`` (the same, every draft
    padded to k) or ``ngram-pad`` (n-gram alone padded: policy ``ngram-only``; vLLM's own n-gram cannot be)."""
    from .hybrid import POLICIES

    pad = m.endswith("-pad")
    base = m[:-len("-pad")] if pad else m
    if pad and base == "ngram":
        base = "ngram-only"
    if base in POLICIES:
        return "eagle", base, pad
    if pad:
        raise ValueError(f"method {m!r}: only a hybrid policy ({', '.join(POLICIES)}) or ngram can be padded")
    return m, None, False


def config_label(cfg: dict) -> str:
    """The ``hybrid_specs`` method an engine config runs (the inverse of :func:`hybrid_method`): vLLM's method, the
    hybrid's policy, ``<policy>-pad`` or ``ngram-pad``; with the engine's ``config_suffix`` after it (``-k3``: an
    engine at another k than its grid's, e.g. ``eagle-k3``; :func:`split_k` reads it back)."""
    if cfg.get("hybrid_rotate"):
        return "rotate"          # the engine; each of its runs names the policy it ran (rotated_run_config)
    lab = _label(cfg)
    return lab + cfg["config_suffix"] if lab and cfg.get("config_suffix") else lab


def split_k(config: str) -> tuple[str, int | None]:
    """(the configuration without its k suffix, that k) of a table's configuration name: ``eagle-k3`` ->
    (``eagle``, 3), ``gpu-pr24344-skip-k3`` -> (``gpu-pr24344-skip``, 3), ``eagle`` -> (``eagle``, None): the
    engine's own k (the grid's)."""
    import re

    m = re.fullmatch(r"(.+)-k(\d+)", str(config))
    return (m.group(1), int(m.group(2))) if m else (str(config), None)


def eagle_alone(config: str) -> str:
    """EAGLE alone in the engine that ran ``config`` (at its k): ``gpu-pr24344-skip-k3`` -> ``eagle-k3``,
    ``gpu-pr24344`` -> ``eagle``."""
    k = split_k(config)[1]
    return "eagle" + (f"-k{k}" if k else "")


def _label(cfg: dict) -> str:
    pol = cfg.get("hybrid")
    if not pol:
        return cfg.get("method")
    from .gpu_hybrid import GPU_POLICIES

    if cfg.get("hybrid_pad") and pol not in GPU_POLICIES:    # a device-side policy drafts k tokens always: no -pad
        return "ngram-pad" if pol == "ngram-only" else f"{pol}-pad"
    return pol


def hybrid_specs(head: str, *, model_dir: str | None = None, k: int = 5, max_tokens: int = 256,
                 prompts_per_bs: int = 8, repeats: int = 3, batch_sizes=HYBRID_BATCH_SIZES,
                 workloads=HYBRID_WORKLOADS, methods=HYBRID_METHODS, cost_model: str | None = None,
                 engine_config: str = "v1-forced", max_model_len: int = 4096, instrumented: bool = True) -> list[dict]:
    """One engine spec per configuration (``methods``: see :func:`hybrid_method`; a hybrid policy runs method
    ``eagle`` with the hybrid on, ``-pad`` with its drafts padded). Every spec runs the same task: per workload
    and batch size B, ``max(B, prompts_per_bs)`` prompts (the workload's first, by its seeded order) in chunks of
    B submitted together, ``repeats`` times, greedy, ``max_tokens`` tokens each (EOS ignored: every request
    decodes as long, so the batch stays at B), outputs kept. ``instrumented=False``: no step log (the plugin stays
    off: vLLM runs unchanged), spec names end in ``-noinst``; ``engine_config="default"`` (vLLM's choice of
    everything; ``vllm-default`` is read as it) specs are always uninstrumented. Spec names:
    ``hybrid-<SPEC_TOKEN[engine_config]>-<method>[-noinst]``. Pure: no vLLM, no model files read."""
    engine_config = canonical_config(engine_config)
    if engine_config not in ENGINE_CONFIGS:
        raise ValueError(f"engine_config must be one of {', '.join(ENGINE_CONFIGS)}, got {engine_config!r}")
    parsed = {m: hybrid_method(m) for m in methods}
    from .gpu_hybrid import GPU_POLICIES, V1_GPU_POLICIES

    on_v1 = ENGINE_CONFIGS[engine_config]["model_runner"] == "v1"
    host = [m for m, (_v, pol, _p) in parsed.items() if pol and pol not in GPU_POLICIES]
    v2only = [m for m, (_v, pol, _p) in parsed.items() if pol in GPU_POLICIES and pol not in V1_GPU_POLICIES]
    if not on_v1 and host:
        raise ValueError(f"engine_config {engine_config!r} runs the V2 runner for EAGLE: the host-side hybrid "
                         f"wraps the V1 runner, use 'v1-forced' or 'study-like' for {', '.join(host)} (V2 takes "
                         f"{', '.join(GPU_POLICIES)})")
    if on_v1 and v2only:
        raise ValueError(f"{', '.join(v2only)} runs on the V2 runner only: engine_config 'v2-forced' or 'default'")
    if any(pol == "adaptive-rule" for _m, pol, _p in parsed.values()) and not cost_model:
        raise ValueError("the adaptive-rule hybrid needs a cost model (--cost-model: an H200 preset fitted on "
                         "this model's measured steps, or its file)")
    if model_dir is None:
        from ... import models

        model_dir = str(models.converted_dir(HYBRID_MODEL))
    task = {"type": "hybrid", "workloads": list(workloads), "batch_sizes": [int(b) for b in batch_sizes],
            "prompts_per_bs": int(prompts_per_bs), "repeats": int(repeats), "max_tokens": int(max_tokens)}
    timed = instrumented and engine_config not in UNTIMED_CONFIGS
    specs = []
    for m, (method, pol, pad) in parsed.items():
        cfg = {"model": model_dir, "name": HYBRID_MODEL, "method": method,
               "k": int(k), "max_model_len": int(max_model_len), "max_num_seqs": max(int(b) for b in batch_sizes),
               **ENGINE_CONFIGS[engine_config], "gpu_memory_utilization": 0.85}
        if cfg["method"] == "eagle":
            cfg["draft"] = str(head)
        if pol:
            cfg["hybrid"] = pol
            if pol == "adaptive-rule":
                cfg["hybrid_cost_model"] = str(cost_model)
            if pad:
                cfg["hybrid_pad"] = True
        spec = {"name": f"hybrid-{SPEC_TOKEN[engine_config]}-{m}" + ("" if instrumented else "-noinst"), "config": cfg,
                "tasks": [task], "engine_config": engine_config}
        if not timed:
            spec["instrumented"] = False
        specs.append(spec)
    return specs


def estimate_seconds(spec: dict, start_s: float = 70.0, step_s: float = 0.006, per_seq_s: float = 5e-5,
                     tokens_per_step: float | None = None) -> float:
    """A rough budget for one spec: the engine start plus, per hybrid run, max_tokens / tokens_per_step steps of
    ``step_s + B * per_seq_s`` (defaults: a 1.5B target on an H200, ~2 tokens per step with SD, 1 without)."""
    t = start_s
    tps = tokens_per_step or (1.0 if spec["config"]["method"] == "none" else 2.0)
    pols = len(spec["config"].get("hybrid_rotate") or ()) or 1      # a rotated engine runs the task per policy
    for task in spec["tasks"]:
        if task["type"] != "hybrid":     # other tasks: priced by their caller
            continue
        for b in task["batch_sizes"]:
            chunks = -(-max(b, task["prompts_per_bs"]) // b)
            run = chunks * task["max_tokens"] / tps * (step_s + b * per_seq_s)
            t += pols * len(task["workloads"]) * (task["repeats"] + 1) * run    # + 1: the warm-up pass
    return t


def hybrid_plan(specs: list[dict], done: set | None = None) -> list[dict]:
    """The run list: per spec its configuration, runs and estimated seconds (``done``: finished specs)."""
    rows = []
    for s in specs:
        t = next(x for x in s["tasks"] if x["type"] == "hybrid")
        rows.append({"spec": s["name"], "method": s["config"]["method"],
                     "hybrid": s["config"].get("hybrid") or s["config"].get("hybrid_rotate"),
                     "pad": bool(s["config"].get("hybrid_pad")), "instrumented": s.get("instrumented", True),
                     "runs": len(t["workloads"]) * len(t["batch_sizes"]) * t["repeats"],
                     "seconds": round(estimate_seconds(s)), "done": s["name"] in (done or set())})
    return rows


def rotated_spec(head: str, policies=ROTATE_POLICIES, pad: bool = False, cost_model: str | None = None,
                 **kw) -> dict:
    """One EAGLE engine that runs every policy of ``policies`` (``off``: vLLM's EAGLE alone; ``idle``; the
    device-side hybrids; host-side ones too) on the same task, switched between runs (``VLLMEngine.set_hybrid``)
    in a Latin-square order (``rotated_order``): engine-to-engine host noise, measured larger than the effects
    (same code, two engines: 0.75x and 1.15x), falls on every policy alike. Spec
    name ``hybrid-<engine_config>-rotate``; ``kw`` as :func:`hybrid_specs` (repeats default 4: one per order).
    ``pad``: the host-side policies' drafts padded to k (the engine's ``hybrid_pad``; the device-side ones always
    draft k); ``cost_model``: adaptive-rule's (required when it rotates)."""
    if "adaptive-rule" in policies and not cost_model:
        raise ValueError("the adaptive-rule hybrid needs a cost model (cost_model=: an H200 preset fitted on this "
                         "model's measured steps, or its file)")
    spec = hybrid_specs(head, methods=("eagle",), **{"repeats": len(policies), **kw})[0]
    spec["config"]["hybrid_rotate"] = list(policies)
    if pad:
        spec["config"]["hybrid_pad"] = True
    if cost_model:
        spec["config"]["hybrid_cost_model"] = str(cost_model)
    spec["name"] = spec["name"].replace("-eagle", "-rotate")
    return spec


def rotated_order(policies, repeats: int) -> list[tuple[int, str]]:
    """(repeat, policy) in run order: repeat r starts at policy r mod n, so over n repeats every policy runs once
    in every position (drift within the engine, warm-up effects after a switch, fall on all alike)."""
    n = len(policies)
    return [(r, policies[(r + i) % n]) for r in range(repeats) for i in range(n)]


def rotated_run_config(cfg: dict, policy: str) -> dict:
    """A rotated engine's run, configured as the single-policy engine it stands for (``config_label`` gives
    ``eagle`` for ``off``, else the policy), with the rotation it was part of."""
    from .common import HYBRID_OFF

    return {**cfg, "hybrid": None if policy == HYBRID_OFF else policy, "hybrid_rotate": None,
            "rotated": list(cfg["hybrid_rotate"])}


def task_shapes(task: dict, model: str, max_model_len: int, load=None):
    """A hybrid task's shapes in run order: (workload, batch size B, chunks), the chunks the first max(B,
    ``prompts_per_bs``) requests of the workload's seeded order in runs of B. ``load(workload, n)``: the requests
    (default: ``workloads.load`` with ``model``'s tokenizer, prompts that leave ``max_tokens`` of
    ``max_model_len``)."""
    if load is None:
        from transformers import AutoTokenizer

        from ... import workloads as W

        tok = AutoTokenizer.from_pretrained(model)

        def load(w, n):
            return W.load(w, n=n, seed=0, tokenizer=tok, max_prompt_tokens=max_model_len - task["max_tokens"])
    for w in task["workloads"]:
        reqs = load(w, max(task["batch_sizes"] + [task["prompts_per_bs"]]))
        for b in task["batch_sizes"]:
            part = reqs[:max(b, task["prompts_per_bs"])]
            yield w, b, [part[i:i + b] for i in range(0, len(part), b)]


def _hybrid_task(eng, task: dict, record) -> None:
    """Every workload x batch size x repeat on one engine (a warm-up pass per shape first, not recorded); a
    rotated engine (``cfg.hybrid_rotate``) runs each policy in turn (``rotated_order``; run ids
    ``<w>-b<B>-c<chunk>@<policy>-r<repeat>``), its warm-up one chunk per shape and policy."""
    rot = list(eng.cfg.hybrid_rotate or ())
    for w, b, chunks in task_shapes(task, eng.cfg.model, eng.cfg.max_model_len):
        if rot:
            _rotated_runs(eng, task, record, w, b, chunks, rot)
            continue
        for rep in range(-1, task["repeats"]):
            for c, ch in enumerate(chunks):
                r = eng.run_prompts([q.prompt_token_ids for q in ch], task["max_tokens"],
                                    run_id=f"{w}-b{b}-c{c}-r{rep}", keep_outputs=True, record=rep >= 0,
                                    label="hybrid" if rep >= 0 else "warmup")
                if rep >= 0:
                    r.batch_size = b
                    record(r, task="hybrid", workload=w, repeat=rep, chunk=c, keys=[q.id for q in ch],
                           with_outputs=True)


def _rotated_runs(eng, task, record, w, b, chunks, rot) -> None:
    cfg = vars(eng.cfg)
    for p in rot:                                   # warm-up: this shape under each policy, untimed
        eng.set_hybrid(p)
        eng.run_prompts([q.prompt_token_ids for q in chunks[0]], task["max_tokens"], run_id=f"{w}-b{b}-c0@{p}-r-1",
                        record=False, label="warmup")
    for rep, p in rotated_order(rot, task["repeats"]):
        err = (eng.set_hybrid(p) or {}).get("hybrid_error")   # an earlier failure of some policy, kept with each run
        for c, ch in enumerate(chunks):
            r = eng.run_prompts([q.prompt_token_ids for q in ch], task["max_tokens"], run_id=f"{w}-b{b}-c{c}@{p}-r{rep}",
                                keep_outputs=True, label="hybrid")
            r.batch_size = b
            record(r, task="hybrid", workload=w, repeat=rep, chunk=c, keys=[q.id for q in ch], with_outputs=True,
                   hybrid_now=p, config=rotated_run_config(cfg, p), **({"hybrid_error": err} if err else {}))


def lossless_report(records: list[dict], baseline_method: str = "none") -> list[dict]:
    """Per run (results.jsonl ``run`` records with outputs and keys), whether every output equals the baseline
    engine's (plain greedy) on the same prompt and batch size: ``equal`` / ``total`` requests and, for the first
    differing request, its key and the first differing position (bf16 numerics can differ between batch shapes:
    the comparison is at the same batch size). Only requests the baseline ran are compared: a run with none
    (a no-SD engine the deadline cut) has no row."""
    def conf(r):
        return config_label(r.get("config", {}))

    base = {}
    for r in records:
        if r.get("kind") == "run" and r.get("task") == "hybrid" and conf(r) == baseline_method:
            for key, out in zip(r["keys"], r["outputs"]):
                base.setdefault((r["workload"], r["batch_size"], key), out)
    rows = []
    for r in records:
        if r.get("kind") != "run" or r.get("task") != "hybrid" or conf(r) == baseline_method:
            continue
        pairs = [(key, out, base[(r["workload"], r["batch_size"], key)]) for key, out in zip(r["keys"], r["outputs"])
                 if (r["workload"], r["batch_size"], key) in base]
        if not pairs:
            continue
        eq, first = 0, None
        for key, out, ref in pairs:
            if out == ref:
                eq += 1
            elif first is None:
                pos = next((i for i, (a, b) in enumerate(zip(out, ref)) if a != b), min(len(out), len(ref)))
                first = {"key": key, "position": pos}
        rows.append({"spec": r["spec"], "config": conf(r), "workload": r["workload"], "batch_size": r["batch_size"],
                     "repeat": r.get("repeat"), "chunk": r.get("chunk"), "equal": eq, "total": len(pairs),
                     "first_difference": first})
    return rows
