"""The n-gram + EAGLE hybrid and the step timer on vLLM 0.25's V2 model runner (``hybrid_v2``,
``runner_v2_patches``), as engine specs for ``jobs.run_specs``, in three resumable stages (``gpu/plans/v2hybrid.json``):

``lossless``  bs 1, a few requests of code-edit and sharegpt: a no-SD engine and one EAGLE engine rotating EAGLE
              alone (``off``) and the device-side policies (``gpu-pr24344``, ``gpu-pr24344-skip``,
              ``gpu-eagle-only``); ``check-lossless`` exits 1 unless every hybrid output equals no SD's token for
              token (``hybrid_jobs.lossless_report``): the later stages run only after it passes.
``overhead``  the V2 step timer's cost: one no-SD and one EAGLE engine, each run with the timing wrappers
              installed and removed (``op="instrument"``), interleaved (abba), bs 1 / 8 / 32 / 64, 512-token
              prompts, 256 tokens (``jobs`` task ``overhead``).
``grid``      one EAGLE engine rotating ``off``, ``gpu-eagle-only``, ``gpu-pr24344``, ``gpu-pr24344-skip`` shape by
              shape (a Latin square: ``hybrid_jobs.rotated_order``), code-edit then sharegpt, bs 1 / 8 / 32 / 64, 4
              repeats, every step timed on V2.

Every engine forces the V2 runner (``engine_config`` ``v2-forced``: ``VLLM_USE_V2_MODEL_RUNNER=1``) and vLLM's own
scheduling (async for EAGLE), Qwen2.5-Coder-1.5B-Instruct (real weights) and the package's EAGLE head at k = 5.

    python -m spec_repro.engines.vllm.v2hybrid plan [--stage S]                # CPU: specs and estimated seconds
    python -m spec_repro.engines.vllm.v2hybrid run --stage S --head DIR --out DIR [--deadline S]
    python -m spec_repro.engines.vllm.v2hybrid check-lossless --out DIR          # rc 1 unless lossless
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

STAGES = ("lossless", "overhead", "grid")
ROTATE = ("off", "gpu-eagle-only", "gpu-pr24344", "gpu-pr24344-skip")
ENGINE_CONFIG = "v2-forced"
K = 5
OVERHEAD_TASK = {"type": "overhead", "prompt_len": 512, "max_tokens": 256, "batch_sizes": [1, 8, 32, 64],
                 "repeats": 4, "order": "abba", "vocab_size": 151936}


def stage_specs(stage: str, head: str, *, model_dir: str | None = None) -> list[dict]:
    """The engine specs of one stage, in run order (names ``v2hybrid-<stage>-<what>``). Pure: no vLLM."""
    from .hybrid_jobs import hybrid_specs, rotated_spec

    if stage not in STAGES:
        raise ValueError(f"stage must be one of {', '.join(STAGES)}, got {stage!r}")
    kw = dict(model_dir=model_dir, k=K, engine_config=ENGINE_CONFIG)
    if stage == "lossless":
        small = dict(batch_sizes=(1,), prompts_per_bs=3, max_tokens=128)
        specs = [hybrid_specs(head, methods=("none",), repeats=1, **small, **kw)[0],
                 rotated_spec(head, policies=ROTATE, repeats=len(ROTATE), **small, **kw)]
        names = ("none", "rotate")
    elif stage == "overhead":
        specs = hybrid_specs(head, methods=("none", "eagle"), repeats=1, batch_sizes=(64,), **kw)
        for s in specs:
            s["tasks"] = [dict(OVERHEAD_TASK)]
        names = ("none", "eagle")
    else:
        specs = [rotated_spec(head, policies=ROTATE, repeats=len(ROTATE), **kw)]
        names = ("rotate",)
    for s, n in zip(specs, names):
        s["name"] = f"v2hybrid-{stage}-{n}"
        assert s["config"]["model_runner"] == "v2" and s.get("instrumented", True), s
    return specs


def estimate(spec: dict) -> float:
    """A spec's seconds: ``hybrid_jobs.estimate_seconds`` for hybrid tasks; an overhead task as 2 runs (on, off) of
    ``max_tokens`` steps per batch size and repeat, ~6 ms a step at bs 64 (a 1.5B target on an H200)."""
    from .hybrid_jobs import estimate_seconds

    t = estimate_seconds(spec, start_s=75.0)
    for task in spec["tasks"]:
        if task["type"] == "overhead":
            t += sum(2 * task["repeats"] * task["max_tokens"] * (0.004 + b * 3e-5) for b in task["batch_sizes"])
    return t


def check_lossless(records: list[dict]) -> tuple[bool, list[dict]]:
    """(every hybrid / EAGLE run's outputs equal no SD's, and there is at least one such run; the report rows)."""
    from .hybrid_jobs import lossless_report

    rows = lossless_report(records)
    return bool(rows) and all(r["equal"] == r["total"] for r in rows), rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spec_repro.engines.vllm.v2hybrid", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("plan", "run"):
        p = sub.add_parser(name)
        p.add_argument("--stage", choices=STAGES, **({"required": True} if name == "run" else {}))
        p.add_argument("--head", default="HEAD", help="the package's EAGLE head for Qwen2.5-Coder-1.5B (a dir)")
        p.add_argument("--model-dir", help="default: spec_repro.models.converted_dir('qwen2.5-coder-1.5b')")
        if name == "run":
            p.add_argument("--out", required=True)
            p.add_argument("--timeout", type=float, default=600, help="seconds per engine spec")
            p.add_argument("--deadline", type=float, help="seconds from now for the whole stage")
    c = sub.add_parser("check-lossless")
    c.add_argument("--out", required=True, help="the lossless stage's folder (its results.jsonl)")
    a = ap.parse_args(argv)
    if a.cmd == "check-lossless":
        res = Path(a.out) / "results.jsonl"
        if not res.is_file():
            print(f"v2hybrid check-lossless: no results.jsonl in {a.out}", file=sys.stderr)
            return 2
        ok, rows = check_lossless([json.loads(x) for x in res.read_text().splitlines() if x.strip()])
        for r in rows:
            print(json.dumps(r))
        print(json.dumps({"lossless": ok, "runs": len(rows)}))
        return 0 if ok else 1
    stages = [a.stage] if a.stage else list(STAGES)
    model_dir = a.model_dir or ("MODEL" if a.cmd == "plan" else None)
    if a.cmd == "plan":
        total = 0.0
        for st in stages:
            for s in stage_specs(st, a.head, model_dir=model_dir):
                sec = estimate(s)
                total += sec
                print(json.dumps({"stage": st, "spec": s["name"], "seconds": round(sec)}))
        print(json.dumps({"total_s": round(total)}))
        return 0
    from .jobs import run_specs

    return run_specs(stage_specs(a.stage, a.head, model_dir=model_dir), Path(a.out), a.timeout, False, None,
                     a.deadline)


if __name__ == "__main__":
    sys.exit(main())
