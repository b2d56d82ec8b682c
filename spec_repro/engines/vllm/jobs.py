"""The runner of the vLLM device jobs (the measurements committed under ``data/gpu/``), and its command line.

The jobs are data: ``data/gpu/jobs.json`` (``load_jobs``). A job is a list of engine specs; each spec runs in
its own Python process (vLLM keeps GPU memory until its process ends), with a time limit, appending to ``<out>/results.jsonl`` (one JSON line per run) and writing its
steps to ``<out>/steps_<spec>.jsonl``. A failed spec is recorded and the job goes on. Finished specs are skipped
when the job is run again on the same ``--out`` (resumable).

    python -m spec_repro.engines.vllm.jobs setup --site /root/site      # register the plugin's entry point
    python -m spec_repro.engines.vllm.jobs run llama8b --out $OUT       # one job (see JOBS)
    python -m spec_repro.engines.vllm.jobs list

On a GPU host (``gpu/device.sh``): install vLLM 0.25.0, ``setup``, then ``run``. ``--dry-run`` prints the specs
without vLLM. ``summarize`` (``summary``) turns the raw outputs into ``data/gpu``; ``prepare-smollm2`` and
``convert-gguf`` (``smollm2``) prepare the real-weights run.

The live hybrid's measurement (issue 18, step 7) is built, not read from the table: ``hybrid_specs`` makes one
engine spec per configuration (no SD, n-gram alone, EAGLE alone, EAGLE + each hybrid policy) on the converted
Qwen2.5-Coder-1.5B-Instruct and the package's EAGLE head; each engine runs every workload, batch size and repeat
(engine starts cost 40-70 s), keeping the outputs; ``lossless_report`` compares every run's outputs with the
no-SD engine's (plain greedy) on the same prompts. Methods ``<policy>-pad`` / ``ngram-pad`` pad every draft to k
(``hybrid_method``); ``--engine-config default`` runs vLLM's own choice of model runner (V2 for EAGLE), untimed
(the default is ``v1-forced``: the V1 runner the plugin hooks); ``--no-instrument`` drops the step log (the
plugin's overhead reference). Every run row records the runner vLLM ran (``labels``).

    python -m spec_repro.engines.vllm.jobs hybrid --head DIR --out $OUT --plan      # the run list, seconds
    python -m spec_repro.engines.vllm.jobs hybrid --head DIR --out $OUT --deadline 1500
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path


ROOT = Path(__file__).resolve().parents[3]
JOBS_FILE = ROOT / "data" / "gpu" / "jobs.json"
CONFIGS = ROOT / "data" / "gpu" / "configs"
LLAMA8B = str(CONFIGS / "llama31_8b")


def load_jobs(path: str | Path = JOBS_FILE) -> dict[str, list[dict]]:
    """The job table (``data/gpu/jobs.json``): job name -> its engine specs, in order. Each spec is a plain record
    (name, ``config`` for ``VLLMConfig``, ``tasks``, optional ``fallback``); paths under ``data/`` in a config
    are resolved against the repository root."""
    table = json.loads(Path(path).read_text())

    def resolve(spec: dict) -> dict:
        cfg = {k: str(ROOT / v) if k in ("model", "draft") and str(v).startswith("data/") else v
               for k, v in spec["config"].items()}
        return {**spec, "config": cfg}

    specs = {name: resolve(s) for name, s in table["specs"].items()}
    return {job: [specs[n] for n in j["specs"]] for job, j in table["jobs"].items()}


JOBS: dict[str, list[dict]] = load_jobs()


# ---- environment -----------------------------------------------------------------------------------------
def setup_entry_point(site: str | Path) -> Path:
    """Register ``spec_repro.engines.vllm.plugin:register`` in group ``vllm.general_plugins`` by writing a tiny
    dist-info into ``site`` (a directory on sys.path), so vLLM finds the plugin without installing the package."""
    d = Path(site) / "spec_repro_vllm_plugin-0.1.0.dist-info"
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: spec-repro-vllm-plugin\nVersion: 0.1.0\n")
    (d / "entry_points.txt").write_text(
        "[vllm.general_plugins]\nspec_repro_timing = spec_repro.engines.vllm.plugin:register\n")
    (d / "RECORD").write_text("")
    return d


def environment() -> dict:
    info = {"python": sys.version.split()[0], "platform": platform.platform(), "host": platform.node()}
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpu_count"] = torch.cuda.device_count()
            info["cuda"] = torch.version.cuda
            info["gpu_mem_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    except Exception as e:
        info["torch_error"] = str(e)
    try:
        import vllm

        info["vllm"] = vllm.__version__
    except Exception as e:
        info["vllm_error"] = str(e)
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        info["nvidia_smi"] = smi.stdout.strip()
    except Exception:
        pass
    return info


# ---- one engine spec (child process) ---------------------------------------------------------------------
def _append(path: Path, rec: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(rec, default=str) + "\n")


def run_spec(spec: dict, out: Path) -> None:
    from tqdm import tqdm

    from .engine import VLLMConfig, VLLMEngine, study_prompt

    out.mkdir(parents=True, exist_ok=True)
    res_path = out / "results.jsonl"
    # "instrumented": False (vLLM's own choice of runner, or an overhead reference): no step log, so the plugin
    # stays off and vLLM runs unchanged
    step_log = str(out / f"steps_{spec['name']}.jsonl") if spec.get("instrumented", True) else None
    cfg = VLLMConfig(**spec["config"], step_log=step_log)
    t0 = time.time()
    try:
        eng = VLLMEngine(cfg)
    except Exception as e:
        if spec.get("fallback"):
            print(f"[{spec['name']}] engine failed ({type(e).__name__}: {str(e)[:300]}); fallback {spec['fallback']}",
                  flush=True)
            _append(res_path, {"kind": "engine_error", "spec": spec["name"], "error": f"{type(e).__name__}: {e}"[:2000]})
            for key, val in spec["fallback"].items():
                setattr(cfg, key, val)
            eng = VLLMEngine(cfg)
        else:
            raise
    base = {"spec": spec["name"], "config": {k: v for k, v in vars(cfg).items()},
            **({"engine_config": spec["engine_config"]} if spec.get("engine_config") else {})}
    resolved = getattr(eng, "resolved", None) or {}
    _append(res_path, {"kind": "engine", **base, "start_s": eng.start_s, "instrumented": eng.instrumented,
                       "resolved": resolved, "vllm": eng.vllm_version, "plugin": eng.steps("status"),
                       "env": environment()})
    print(f"[{spec['name']}] engine up in {eng.start_s:.1f}s, instrumented={eng.instrumented}, "
          f"runner={resolved.get('runner')}, async_scheduling={resolved.get('async_scheduling')}", flush=True)

    def record(r, **extra):
        _append(res_path, {"kind": "run", **base, **r.to_dict(with_outputs=extra.pop("with_outputs", False)),
                           **extra})
        print(f"[{spec['name']}] {r.run_id}: {r.output_tok_per_s:.0f} tok/s, wall {r.wall_s:.2f}s, "
              f"AL {r.acceptance_length}", flush=True)

    for task in spec["tasks"]:
        ty = task["type"]
        vocab = task.get("vocab_size", 32000)
        if ty == "batches":
            prompt = study_prompt(task["prompt_len"], vocab, seed=1)
            eng.run_batch(prompt, 1, 16, run_id="warmup", record=False)
            reps = task.get("repeats")      # None: one run per batch size, as the committed jobs ran
            for b in task["batch_sizes"]:
                if task.get("warm_each"):   # this shape once, untimed: no compilation or capture in a timed run
                    eng.run_batch(prompt, b, task["max_tokens"], run_id=f"warmup-b{b}", record=False)
                for rep in range(reps or 1):
                    r = eng.run_batch(prompt, b, task["max_tokens"], label="study",
                                      **({"run_id": f"{eng.cfg.label()}-{eng.cfg.method}-k{eng.cfg.k}-b{b}-r{rep}"}
                                         if reps else {}))
                    record(r, task="batches", **({"repeat": rep} if reps else {}))
        elif ty == "overhead":
            # the same engine, instrumentation removed (vLLM's own methods) vs installed and recording,
            # interleaved so drifts hit both
            # "abba": every other repeat measures on before off, so a drift within a pair cancels out
            prompt = study_prompt(task["prompt_len"], vocab, seed=1)
            for rep in range(task["repeats"]):
                for b in task["batch_sizes"]:
                    order = (True, False) if task.get("order") == "abba" and rep % 2 else (False, True)
                    for on in order:
                        eng.steps("instrument", on=on)
                        r = eng.run_batch(prompt, b, task["max_tokens"], run_id=f"overhead-b{b}-{'on' if on else 'off'}-{rep}",
                                          label="overhead", record=on)
                        r.instrumented = on
                        record(r, task="overhead", repeat=rep)
            eng.steps("instrument", on=True)
        elif ty == "profile":
            rs = eng.profile(task["batch_sizes"], task["prompt_lens"], task["decode_tokens"],
                             max_kv_tokens=task["max_kv_tokens"], vocab_size=vocab, progress=tqdm)
            for r in rs:
                record(r, task="profile")
        elif ty == "prompts":
            recs = [json.loads(x) for x in open(ROOT / task["prompts_file"]) if x.strip()]
            n = task.get("chunk", len(recs))
            for i in range(0, len(recs), n):
                part = recs[i:i + n]
                r = eng.run_prompts([p["prompt_token_ids"] for p in part], task["max_tokens"],
                                    run_id=f"prompts-{i // n}", label="prompts", keep_outputs=True,
                                    detail=task.get("detail", False), ignore_eos=task.get("ignore_eos", True),
                                    stop_token_ids=part[0].get("eos"))
                keys = [p["key"] for p in part]
                record(r, task="prompts", keys=keys, with_outputs=True)
        elif ty == "hybrid":
            _hybrid_task(eng, task, record)
        else:
            raise ValueError(f"unknown task type {ty!r}")
    eng.close()
    _append(res_path, {"kind": "done", "spec": spec["name"], "seconds": time.time() - t0})


# ---- the live hybrid's measurement (issue 18, step 7) ----------------------------------------------------------
HYBRID_MODEL = "qwen2.5-coder-1.5b"
HYBRID_WORKLOADS = ("code-edit", "sharegpt")
HYBRID_BATCH_SIZES = (1, 8, 32, 64)
HYBRID_METHODS = ("none", "ngram", "eagle", "pr24344", "pr24344-skip", "adaptive-rule")
PADDED_METHODS = ("pr24344-pad", "pr24344-skip-pad", "ngram-pad")   # the hybrid with every draft padded to k
ROTATE_POLICIES = ("off", "idle", "gpu-pr24344", "gpu-eagle-only")   # rotated_spec: EAGLE alone, idle, the hybrids
# engine configuration -> VLLMConfig fields (``labels``): "v1-forced": vLLM's own scheduling (async for EAGLE) on the
# V1 runner the plugin hooks; "study-like": synchronous, V1; "default": what a user runs, vLLM 0.25's own choice of
# runner too (the V2 runner for EAGLE and no SD on Qwen2, config/vllm.py:518-555; V1 for n-gram, :2068-2071),
# which the plugin does not time: its specs are uninstrumented and cannot run the hybrid
from .labels import ENGINE_CONFIGS, UNTIMED_CONFIGS, canonical_config  # noqa: E402

# the spec-name token of each configuration: spec names are run identifiers (resumed jobs, committed tables, the
# session planner's measured seconds), so they keep the tokens they had when "default" meant the forced V1 runner
SPEC_TOKEN = {"v1-forced": "default", "study-like": "study-like", "default": "vllm-default"}


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
    hybrid's policy, ``<policy>-pad`` or ``ngram-pad``."""
    pol = cfg.get("hybrid")
    if cfg.get("hybrid_rotate"):
        return "rotate"          # the engine; each of its runs names the policy it ran (rotated_run_config)
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
    if engine_config in UNTIMED_CONFIGS and any(pol for _m, pol, _p in parsed.values()):
        raise ValueError(f"engine_config {engine_config!r} lets vLLM pick its model runner (V2 for EAGLE): the "
                         f"hybrid wraps the V1 runner, use 'v1-forced' or 'study-like' for "
                         f"{', '.join(m for m, (_v, pol, _p) in parsed.items() if pol)}")
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
        if task["type"] != "hybrid":     # other tasks: priced by their caller (session.spec_seconds)
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
    in a Latin-square order (``rotated_order``): engine-to-engine host noise, which the fourth GPU session found
    larger than the effects measured (same code, two engines: 0.75x and 1.15x), falls on every policy alike. Spec
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


def _hybrid_task(eng, task: dict, record) -> None:
    """Every workload x batch size x repeat on one engine (a warm-up pass per shape first, not recorded); a
    rotated engine (``cfg.hybrid_rotate``) runs each policy in turn (``rotated_order``; run ids
    ``<w>-b<B>-c<chunk>@<policy>-r<repeat>``), its warm-up one chunk per shape and policy."""
    from transformers import AutoTokenizer

    from ... import workloads as W

    tok = AutoTokenizer.from_pretrained(eng.cfg.model)
    rot = list(eng.cfg.hybrid_rotate or ())
    for w in task["workloads"]:
        reqs = W.load(w, n=max(task["batch_sizes"] + [task["prompts_per_bs"]]), seed=0, tokenizer=tok,
                      max_prompt_tokens=eng.cfg.max_model_len - task["max_tokens"])
        for b in task["batch_sizes"]:
            part = reqs[:max(b, task["prompts_per_bs"])]
            chunks = [part[i:i + b] for i in range(0, len(part), b)]
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
    (sharegpt in the fifth GPU session, whose no-SD engine the deadline cut) has no row."""
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


def run_job(name: str, out: Path, timeout_s: float = 420, dry_run: bool = False, only: list[str] | None = None,
            deadline_s: float | None = None, min_spec_s: float = 120) -> int:
    """Run a job's specs in order, each in a child process; skip finished ones (resumable); with ``deadline_s``
    (seconds from now) start no spec with less than ``min_spec_s`` left and cut the last one at the deadline."""
    if name not in JOBS:
        raise SystemExit(f"unknown job {name!r}; jobs: {', '.join(sorted(JOBS))}")
    return run_specs(JOBS[name], out, timeout_s, dry_run, only, deadline_s, min_spec_s)


def run_group(cmd: list[str], timeout_s: float | None) -> int | str:
    """Run ``cmd`` in a process group of its own; on timeout end the whole group and return ``"timeout"``.
    vLLM starts its engine core as a child of the spec's process: killing only the spec's process (what
    ``subprocess.run(timeout=)`` does) leaves that child holding the GPU's memory, and the next engine then
    fails to start (seen on the H200: 18.7 of 139.8 GiB free after a timed-out n-gram spec)."""
    import signal

    p = subprocess.Popen(cmd, start_new_session=True)
    try:
        return p.wait(timeout=timeout_s)
    except KeyboardInterrupt:        # its own session does not get the terminal's Ctrl-C: pass it on, then go
        _end_group(p, signal.SIGINT)
        raise
    except subprocess.TimeoutExpired:
        _end_group(p, signal.SIGTERM)
        return "timeout"


def _end_group(p: subprocess.Popen, sig: int, grace_s: float = 20) -> None:
    """``sig`` to ``p``'s process group, ``grace_s`` for ``p`` to end, then SIGKILL to what is left of the group
    (the engine core can outlive its parent)."""
    import os
    import signal

    for s, wait in ((sig, grace_s), (signal.SIGKILL, 0)):
        try:
            os.killpg(p.pid, s)
        except (ProcessLookupError, PermissionError):
            pass
        if wait:
            try:
                p.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                pass
    p.poll()


def done_specs(results: str | Path) -> set[str]:
    """The engine specs that finished in a ``results.jsonl`` (their ``done`` records; none when it is missing)."""
    res = Path(results)
    if not res.exists():
        return set()
    return {json.loads(x).get("spec") for x in open(res) if '"kind": "done"' in x}


def run_specs(specs: list[dict], out: Path, timeout_s: float = 420, dry_run: bool = False,
              only: list[str] | None = None, deadline_s: float | None = None, min_spec_s: float = 120) -> int:
    """``run_job`` on a list of specs."""
    t_start = time.time()
    out.mkdir(parents=True, exist_ok=True)
    res = out / "results.jsonl"
    done = done_specs(res)
    failures = 0
    for spec in specs:
        if only and spec["name"] not in only:
            continue
        if spec["name"] in done:
            print(f"[{spec['name']}] already done, skipped", flush=True)
            continue
        if dry_run:
            print(json.dumps(spec))
            continue
        t0 = time.time()
        limit = timeout_s
        if deadline_s is not None:
            left = deadline_s - (t0 - t_start)
            if left < min_spec_s:
                print(f"[{spec['name']}] not started: {left:.0f}s left before the deadline", flush=True)
                _append(res, {"kind": "spec_skipped", "spec": spec["name"], "seconds_left": left})
                continue
            limit = min(timeout_s, left)
        cmd = [sys.executable, "-m", "spec_repro.engines.vllm.jobs", "spec", "--spec", json.dumps(spec), "--out", str(out)]
        rc = run_group(cmd, limit)
        if rc != 0:
            failures += 1
            _append(res, {"kind": "spec_failed", "spec": spec["name"], "rc": rc, "seconds": time.time() - t0})
        print(f"[{spec['name']}] rc={rc} in {time.time() - t0:.0f}s", flush=True)
    return failures


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spec_repro.engines.vllm.jobs", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("setup")
    s.add_argument("--site", required=True)
    r = sub.add_parser("run")
    r.add_argument("job")
    r.add_argument("--out", required=True)
    r.add_argument("--timeout", type=float, default=420, help="seconds per engine spec")
    r.add_argument("--only", nargs="*")
    r.add_argument("--dry-run", action="store_true")
    r.add_argument("--deadline", type=float, help="seconds from now for the whole job")
    sp = sub.add_parser("spec")
    sp.add_argument("--spec", required=True)
    sp.add_argument("--out", required=True)
    sub.add_parser("list")
    hy = sub.add_parser("hybrid", help="the live hybrid's measurement (issue 18 step 7)")
    hy.add_argument("--head", required=True, help="the package's EAGLE head for Qwen2.5-Coder-1.5B (a dir)")
    hy.add_argument("--out", required=True)
    hy.add_argument("--model-dir", help="default: spec_repro.models.converted_dir('qwen2.5-coder-1.5b')")
    hy.add_argument("--cost-model", help="adaptive-rule's cost model (preset name or file); without it that "
                    "policy is left out")
    hy.add_argument("--k", type=int, default=5)
    hy.add_argument("--max-tokens", type=int, default=256)
    hy.add_argument("--prompts-per-bs", type=int, default=8)
    hy.add_argument("--repeats", type=int, default=3)
    hy.add_argument("--batch-sizes", type=int, nargs="+", default=list(HYBRID_BATCH_SIZES))
    hy.add_argument("--methods", nargs="+", default=list(HYBRID_METHODS),
                    help=f"vLLM's none/ngram/eagle, hybrid policies, <policy>-pad, ngram-pad (e.g. "
                         f"{' '.join(PADDED_METHODS)})")
    hy.add_argument("--engine-config", choices=sorted([*ENGINE_CONFIGS, "vllm-default"]), default="v1-forced",
                    help="v1-forced: the V1 runner the plugin times; default: vLLM's choice (V2 for EAGLE), untimed")
    hy.add_argument("--no-instrument", action="store_true", help="no step log: vLLM runs without the plugin")
    hy.add_argument("--timeout", type=float, default=900, help="seconds per engine spec")
    hy.add_argument("--deadline", type=float, help="seconds from now for the whole job")
    hy.add_argument("--plan", action="store_true", help="print the run list and estimated seconds; run nothing")
    lr = sub.add_parser("lossless", help="compare a hybrid job's outputs with the no-SD engine's")
    lr.add_argument("--out", required=True)
    pp = sub.add_parser("prepare-smollm2")
    pp.add_argument("--out", default="data/gpu/smollm2_prompts.jsonl")
    sm = sub.add_parser("summarize")
    sm.add_argument("--raw", required=True, nargs="+",
                    help="folder(s) with the device's results*.jsonl / steps_*.jsonl (searched recursively)")
    sm.add_argument("--out", default="data/gpu")
    cg = sub.add_parser("convert-gguf")
    cg.add_argument("--gguf", required=True)
    cg.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if a.cmd == "prepare-smollm2":
        from .smollm2 import prepare_smollm2_prompts

        print(prepare_smollm2_prompts(a.out))
        return 0
    if a.cmd == "summarize":
        from .summary import summarize

        print(json.dumps(summarize(a.raw, a.out, " ".join(sys.argv)), indent=1, default=str))
        return 0
    if a.cmd == "convert-gguf":
        from .smollm2 import convert_gguf

        print(json.dumps(convert_gguf(a.gguf, a.out)))
        return 0
    if a.cmd == "setup":
        print(setup_entry_point(a.site))
        return 0
    if a.cmd == "list":
        for k, v in JOBS.items():
            print(k, [s["name"] for s in v])
        return 0
    if a.cmd == "hybrid":
        methods = [m for m in a.methods if not m.startswith("adaptive-rule") or a.cost_model]
        if len(methods) < len(a.methods):
            print("note: adaptive-rule left out: it needs --cost-model (an H200 preset fitted on this model's "
                  "measured steps, or its file)", file=sys.stderr)
        specs = hybrid_specs(a.head, model_dir=a.model_dir, k=a.k, max_tokens=a.max_tokens,
                             prompts_per_bs=a.prompts_per_bs, repeats=a.repeats, batch_sizes=a.batch_sizes,
                             methods=methods, cost_model=a.cost_model, engine_config=a.engine_config,
                             instrumented=not a.no_instrument)
        if a.plan:
            done = done_specs(Path(a.out) / "results.jsonl")
            rows = hybrid_plan(specs, done)
            for row in rows:
                print(json.dumps(row))
            print(json.dumps({"specs": len(rows), "runs": sum(r["runs"] for r in rows),
                              "seconds_left": sum(r["seconds"] for r in rows if not r["done"])}))
            return 0
        return run_specs(specs, Path(a.out), a.timeout, False, None, a.deadline)
    if a.cmd == "lossless":
        recs = [json.loads(x) for x in open(Path(a.out) / "results.jsonl") if x.strip()]
        for row in lossless_report(recs):
            print(json.dumps(row))
        return 0
    if a.cmd == "run":
        return run_job(a.job, Path(a.out), a.timeout, a.dry_run, a.only, a.deadline)
    if a.cmd == "spec":
        try:
            run_spec(json.loads(a.spec), Path(a.out))
        except Exception:
            traceback.print_exc()
            _append(Path(a.out) / "results.jsonl", {"kind": "error", "spec": json.loads(a.spec)["name"],
                                                    "error": traceback.format_exc()[-3000:]})
            return 1
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
