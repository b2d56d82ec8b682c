"""Device jobs for the vLLM engine: the measurements committed under ``data/gpu/``.

A job is a list of engine specs; each spec runs in its own Python process (vLLM keeps GPU memory until its
process ends), with a time limit, appending to ``<out>/results.jsonl`` (one JSON line per run) and writing its
steps to ``<out>/steps_<spec>.jsonl``. A failed spec is recorded and the job goes on. Finished specs are skipped
when the job is run again on the same ``--out`` (resumable).

    python -m spec_repro.engines.vllm_jobs setup --site /root/site      # register the plugin's entry point
    python -m spec_repro.engines.vllm_jobs run llama8b --out $OUT       # one job (see JOBS)
    python -m spec_repro.engines.vllm_jobs list

On the lent H200 (see ../shared/gpu/README.md): install vLLM 0.25.0 into /root/site, ``source env.sh``,
``setup``, then ``run``. ``--dry-run`` prints the specs without vLLM.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "data" / "gpu" / "configs"
LLAMA8B = str(CONFIGS / "llama31_8b")
EAGLE8B = str(CONFIGS / "eagle_llama31_8b")
QWEN3_8B = str(CONFIGS / "qwen3_8b")
LLAMA70B = str(CONFIGS / "llama3_70b")
STUDY_BATCHES = [1, 4, 16, 64, 256]


def _llama(method, name, **kw):
    cfg = dict(model=LLAMA8B, method=method, k=3, load_format="dummy", max_model_len=4096, max_num_seqs=256,
               name="llama31-8b", gpu_memory_utilization=0.85)
    if method in ("eagle",):
        cfg["draft"] = EAGLE8B
    cfg.update(kw)
    return {"name": name, "config": cfg}


def _study(batch_sizes=STUDY_BATCHES, prompt_len=512, max_tokens=256, vocab=128256):
    return {"type": "batches", "batch_sizes": list(batch_sizes), "prompt_len": prompt_len, "max_tokens": max_tokens,
            "vocab_size": vocab}


JOBS: dict[str, list[dict]] = {
    # (a) Llama-3.1-8B dims, dummy weights: base (+ instrumentation overhead, + cost surface), n-gram, EAGLE
    "llama8b-base": [
        {**_llama("none", "llama8b-none"), "tasks": [
            _study(),
            {"type": "overhead", "batch_sizes": [1, 64], "repeats": 3, "prompt_len": 512, "max_tokens": 256,
             "vocab_size": 128256},
            {"type": "profile", "batch_sizes": [1, 8, 32, 128, 256], "prompt_lens": [128, 1024, 3072],
             "decode_tokens": 48, "max_kv_tokens": 400_000, "vocab_size": 128256},
        ]},
    ],
    # instrumentation overhead again, after moving event resolution off the step path (plugin v2)
    "overhead2": [
        {**_llama("none", "llama8b-none-overhead2"), "tasks": [
            {"type": "overhead", "batch_sizes": [1, 64], "repeats": 4, "prompt_len": 512, "max_tokens": 512,
             "vocab_size": 128256}]},
    ],
    "llama8b-sd": [
        {**_llama("ngram", "llama8b-ngram"), "tasks": [_study()]},
        {**_llama("eagle", "llama8b-eagle"), "tasks": [_study()]},
    ],
    "llama8b-eagle-synth": [
        # EAGLE with vLLM's synthetic rejection sampler: dummy weights accept ~nothing; AL 2.5 is an assumption
        {**_llama("eagle", "llama8b-eagle-al2.5", synthetic_acceptance_length=2.5), "tasks": [_study()]},
    ],
    # (b) SmolLM2-135M, real weights (GGUF converted on the device), n-gram on the embedded workloads
    "smollm2": [
        {"name": "smollm2-ngram", "config": dict(model="/root/smollm2_hf", method="ngram", k=8, dtype="float32",
                                                   max_model_len=4096, max_num_seqs=64, enforce_eager=True,
                                                   gpu_memory_utilization=0.5, name="smollm2-135m",
                                                   load_format="auto", extra={"skip_tokenizer_init": True}),
         "fallback": {"dtype": "float16"},
         "tasks": [{"type": "prompts", "prompts_file": "data/gpu/smollm2_prompts.jsonl", "max_tokens": 256,
                    "chunk": 64, "detail": True, "ignore_eos": False}]},
    ],
    # (c) other dimensions
    "qwen3-8b": [
        {"name": "qwen3-8b-none", "config": dict(model=QWEN3_8B, method="none", load_format="dummy", name="qwen3-8b",
                                                  max_model_len=4096, max_num_seqs=256),
         "tasks": [_study(vocab=151936),
                   {"type": "profile", "batch_sizes": [1, 32, 256], "prompt_lens": [128, 2048], "decode_tokens": 32,
                    "max_kv_tokens": 400_000, "vocab_size": 151936}]},
        {"name": "qwen3-8b-ngram", "config": dict(model=QWEN3_8B, method="ngram", k=3, load_format="dummy",
                                                   name="qwen3-8b", max_model_len=4096, max_num_seqs=256),
         "tasks": [_study(vocab=151936)]},
    ],
    "qwen3-8b-draft": [
        {"name": "qwen3-8b-draft", "config": dict(model=QWEN3_8B, method="draft_model", k=3, draft=str(CONFIGS / "qwen3_0_6b"),
                                                   load_format="dummy", name="qwen3-8b", max_model_len=4096,
                                                   max_num_seqs=256),
         "tasks": [_study(vocab=151936)]},
    ],
    "llama70b-tp2": [
        {"name": "llama70b-none-tp2", "config": dict(model=LLAMA70B, method="none", load_format="dummy",
                                                      name="llama3-70b", tensor_parallel_size=2, max_model_len=4096,
                                                      max_num_seqs=256),
         "tasks": [_study(batch_sizes=[1, 16, 64, 256], max_tokens=128)]},
        {"name": "llama70b-ngram-tp2", "config": dict(model=LLAMA70B, method="ngram", k=3, load_format="dummy",
                                                       name="llama3-70b", tensor_parallel_size=2, max_model_len=4096,
                                                       max_num_seqs=256),
         "tasks": [_study(batch_sizes=[1, 16, 64, 256], max_tokens=128)]},
    ],
}
JOBS["llama8b"] = JOBS["llama8b-base"] + JOBS["llama8b-sd"]


# ---- environment -----------------------------------------------------------------------------------------
def setup_entry_point(site: str | Path) -> Path:
    """Register ``spec_repro.engines.vllm_plugin:register`` in group ``vllm.general_plugins`` by writing a tiny
    dist-info into ``site`` (a directory on sys.path), so vLLM finds the plugin without installing the package."""
    d = Path(site) / "spec_repro_vllm_plugin-0.1.0.dist-info"
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: spec-repro-vllm-plugin\nVersion: 0.1.0\n")
    (d / "entry_points.txt").write_text(
        "[vllm.general_plugins]\nspec_repro_timing = spec_repro.engines.vllm_plugin:register\n")
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

    from .vllm import VLLMConfig, VLLMEngine, random_prompts, study_prompt

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
            prompt = study_prompt(task["prompt_len"], vocab, seed=1)
            for rep in range(task["repeats"]):
                for b in task["batch_sizes"]:
                    for on in (False, True):
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
        cmd = [sys.executable, "-m", "spec_repro.engines.vllm_jobs", "spec", "--spec", json.dumps(spec), "--out", str(out)]
        try:
            rc = subprocess.run(cmd, timeout=limit).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        if rc != 0:
            failures += 1
            _append(res, {"kind": "spec_failed", "spec": spec["name"], "rc": rc, "seconds": time.time() - t0})
        print(f"[{spec['name']}] rc={rc} in {time.time() - t0:.0f}s", flush=True)
    return failures


# ---- SmolLM2 with real weights -------------------------------------------------------------------------------
SMOL_WORKLOADS = ("code-edit", "sharegpt", "humaneval", "mt-bench", "gsm-symbolic")


def prepare_smollm2_prompts(out: str | Path, workloads=SMOL_WORKLOADS, n: int = 40, seed: int = 0,
                            max_prompt_tokens: int = 1024) -> Path:
    """Token-id prompts of the embedded workloads through SmolLM2's chat template: the same selection as the
    torch engine's collection (``spec_repro.collect``: n=40, seed 0, prompts <= 1024 tokens). Runs on the CPU."""
    from transformers import AutoTokenizer

    from .. import models
    from .. import workloads as wl

    models._convert("smollm2-135m", quiet=True)
    tok = AutoTokenizer.from_pretrained(models.converted_dir("smollm2-135m"))
    from transformers import GenerationConfig

    gc = GenerationConfig.from_pretrained(models.converted_dir("smollm2-135m"))
    eos = sorted({int(x) for x in ([gc.eos_token_id] if isinstance(gc.eos_token_id, int) else gc.eos_token_id or [])}
                 | ({int(tok.eos_token_id)} if tok.eos_token_id is not None else set()))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as f:
        for w in workloads:
            for r in wl.load(w, n=n, seed=seed, tokenizer=tok, max_prompt_tokens=max_prompt_tokens):
                f.write(json.dumps({"key": f"{w}/{r.id}", "dataset": w, "request_id": str(r.id),
                                    "prompt_token_ids": list(map(int, r.prompt_token_ids)), "eos": eos}) + "\n")
    return out


def tensor_digest(state: dict) -> str:
    """sha256 over (name, float32 bytes) of every tensor, in name order: the same weights give the same digest
    whatever file layout or library version wrote them."""
    import hashlib

    import torch

    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def convert_gguf(gguf: str | Path, out: str | Path) -> dict:
    """De-quantize a GGUF (transformers + gguf) to a float32 HF folder vLLM can load; returns its digest."""
    import torch
    from transformers import AutoModelForCausalLM

    gguf = Path(gguf)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.save_pretrained(out)
    return {"out": str(out), "digest": tensor_digest(model.state_dict()), "params": sum(p.numel() for p in model.parameters())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spec_repro.engines.vllm_jobs", description=__doc__.splitlines()[0])
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
    cg = sub.add_parser("convert-gguf")
    cg.add_argument("--gguf", required=True)
    cg.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if a.cmd == "prepare-smollm2":
        print(prepare_smollm2_prompts(a.out))
        return 0
    if a.cmd == "convert-gguf":
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
