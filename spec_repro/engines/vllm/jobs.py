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
    cfg = VLLMConfig(**spec["config"], step_log=str(out / f"steps_{spec['name']}.jsonl"))
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
    base = {"spec": spec["name"], "config": {k: v for k, v in vars(cfg).items()}}
    _append(res_path, {"kind": "engine", **base, "start_s": eng.start_s, "instrumented": eng.instrumented,
                       "vllm": eng.vllm_version, "plugin": eng.steps("status"), "env": environment()})
    print(f"[{spec['name']}] engine up in {eng.start_s:.1f}s, instrumented={eng.instrumented}", flush=True)

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
            for b in task["batch_sizes"]:
                r = eng.run_batch(prompt, b, task["max_tokens"], label="study")
                record(r, task="batches")
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
        else:
            raise ValueError(f"unknown task type {ty!r}")
    eng.close()
    _append(res_path, {"kind": "done", "spec": spec["name"], "seconds": time.time() - t0})


def run_job(name: str, out: Path, timeout_s: float = 420, dry_run: bool = False, only: list[str] | None = None,
            deadline_s: float | None = None, min_spec_s: float = 120) -> int:
    """Run a job's specs in order, each in a child process; skip finished ones (resumable); with ``deadline_s``
    (seconds from now) start no spec with less than ``min_spec_s`` left and cut the last one at the deadline."""
    t_start = time.time()
    if name not in JOBS:
        raise SystemExit(f"unknown job {name!r}; jobs: {', '.join(sorted(JOBS))}")
    out.mkdir(parents=True, exist_ok=True)
    done = set()
    res = out / "results.jsonl"
    if res.exists():
        done = {json.loads(x).get("spec") for x in open(res) if '"kind": "done"' in x}
    failures = 0
    for spec in JOBS[name]:
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
        try:
            rc = subprocess.run(cmd, timeout=limit).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
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
