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

The live hybrid's measurement is built, not read from the table (``hybrid_jobs``): ``hybrid_specs`` makes one
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

from .hybrid_jobs import (ENGINE_CONFIGS, HYBRID_BATCH_SIZES, HYBRID_METHODS, HYBRID_MODEL,  # noqa: F401
                          HYBRID_WORKLOADS, PADDED_METHODS, ROTATE_POLICIES, SPEC_TOKEN, UNTIMED_CONFIGS, _hybrid_task,
                          _rotated_runs,
                          canonical_config, config_label, estimate_seconds, hybrid_method, hybrid_plan, hybrid_specs,
                          lossless_report, rotated_order, rotated_run_config, rotated_spec)

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

    if spec.get("members"):                    # engines resident together, runs rotated (cogrid)
        from .cogrid import run_group

        return run_group(spec, out, append=_append, environment=environment)
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
            overhead_task(eng, task, record, study_prompt(task["prompt_len"], vocab, seed=1))
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


def overhead_task(eng, task: dict, record, prompt: list[int]) -> None:
    """The timer's cost in one engine: its variants (``common.TIMER_VARIANTS``; default vLLM's own methods,
    ``off``, and the installed timer) interleaved so drifts hit each: repeat r runs them rotated by r (a Latin
    square; for two variants abba), so every variant takes every place in the order. A rotated engine times EAGLE
    alone (its ``off`` policy, labelled eagle). The engine ends with the timer every run uses installed."""
    from .common import HYBRID_OFF, TIMER_VARIANTS

    extra = {}
    if eng.cfg.hybrid_rotate:
        eng.set_hybrid(HYBRID_OFF)
        extra = {"config": rotated_run_config(vars(eng.cfg), HYBRID_OFF)}
    names = list(task.get("variants") or ("off", "timer"))
    for b in task["batch_sizes"]:       # each shape once, untimed, before any variant is timed on it
        eng.run_batch(prompt, b, task["max_tokens"], run_id=f"warmup-overhead-b{b}", record=False)
    for rep in range(task["repeats"]):
        for b in task["batch_sizes"]:
            for name in names[rep % len(names):] + names[:rep % len(names)]:
                v = TIMER_VARIANTS[name]
                eng.steps("instrument", **_instrument_args(v))
                r = eng.run_batch(prompt, b, task["max_tokens"], run_id=f"overhead-b{b}-{name}-{rep}",
                                  label="overhead", record=v["record"])
                r.instrumented = v["on"] and v["record"]
                record(r, task="overhead", repeat=rep, timer=name, **extra, **(_toggle_stats(eng) if
                                                                                 v.get("toggle") else {}))
    eng.steps("instrument", **_instrument_args(TIMER_VARIANTS["timer"]))


def _instrument_args(variant: dict) -> dict:
    """A timer variant's ``op="instrument"`` arguments (its ``record`` goes to the run, not the plugin); its events
    through ``common.V2_EVENT_API`` unless it names another API."""
    from .common import V2_EVENT_API

    return {"event_api": V2_EVENT_API, **{k: variant[k] for k in ("on", "parts", "defer", "toggle", "event_api")
                                     if k in variant}}


def _toggle_stats(eng) -> dict:
    """The ``toggle`` run just made: its clock from the worker (``op="clock"``, outside the timed window) into
    ``common.toggle_periods``'s medians; {} without a clock."""
    from .common import toggle_periods

    st = eng.steps("clock")
    clock = st[0].get("clock") if st and isinstance(st[0], dict) else None
    return toggle_periods(clock) if clock else {}


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
    failures = 0
    for spec in specs:
        if only and spec["name"] not in only:
            continue
        if spec["name"] in done_specs(res):      # read again: a group spec finishes its members
            print(f"[{spec['name']}] already done, skipped", flush=True)
            continue
        if dry_run:
            print(json.dumps(spec))
            continue
        t0 = time.time()
        limit = spec.get("timeout_s") or timeout_s   # a spec of several engines (cogrid) carries its own
        if deadline_s is not None:
            left = deadline_s - (t0 - t_start)
            if left < min_spec_s:
                print(f"[{spec['name']}] not started: {left:.0f}s left before the deadline", flush=True)
                _append(res, {"kind": "spec_skipped", "spec": spec["name"], "seconds_left": left})
                continue
            limit = min(limit, left)
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
    hy = sub.add_parser("hybrid", help="the live hybrid's measurement")
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
