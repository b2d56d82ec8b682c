"""Speed of the adaptive policies (spec_repro.adaptive) on the study's grid: 4 datasets x 6 batch sizes, both
adaptive-rule and adaptive-learned (5-fold request-level cross-validation, one set of trees per batch size).

Two inputs, both timed in this one run:

1. COMMITTED study-scale traces (the study's published traces are not in the repo): the four measured
   Qwen2.5-Coder-1.5B files data/traces/qwen2.5-coder-1.5b__{code-edit,sharegpt,gsm-symbolic,mt-bench}.parquet
   (300 / 300 / 300 / 80 requests, outputs up to 1,024 tokens), n-gram + the trained EAGLE head.
2. SYNTHETIC study-scale traces (seeded generator tests/fixtures/published/make_fixtures.py, NOT measured):
   500 requests x ~300 output tokens per dataset, n-gram + EAGLE, written in the published JSON-lines format and
   read back, so the n-gram match signal is recomputed from the token ids (draft_len is unknown there).

Batch sizes 1, 8, 16, 32, 64, 128; duplicate batching; cost model llama3.1-8b-h100. "first call" includes
loading numba's cached machine code (or compiling it); "repeat" is the steady state.

    python benchmarks/bench_adaptive.py [--requests 500] [--tokens 300]
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "published"))

from make_fixtures import make_records, write_jsonl  # noqa: E402

from spec_repro.analysis import cost_model_for  # noqa: E402
from spec_repro.simulate import simulate  # noqa: E402
from spec_repro.traces import Trace  # noqa: E402
from spec_repro.tracefiles import read_trace  # noqa: E402

COMMITTED = ["code-edit", "sharegpt", "gsm-symbolic", "mt-bench"]
SYNTHETIC = ("instructcoder", "cnn", "sharegpt", "gsm8k")
BATCH = [1, 8, 16, 32, 64, 128]
POLICIES = ["adaptive-rule", "adaptive-learned"]


def timed(trace, cm, props):
    out = {}
    for label in ("first call", "repeat"):
        t0 = time.perf_counter()
        df = simulate(trace, cm, props, POLICIES, batch_sizes=BATCH, progress=False)
        out[label] = time.perf_counter() - t0
    per = {}
    for pol in POLICIES:
        t0 = time.perf_counter()
        simulate(trace, cm, props, pol, batch_sizes=BATCH, progress=False)
        per[pol] = time.perf_counter() - t0
    return df, out, per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=500, help="synthetic requests per dataset")
    ap.add_argument("--tokens", type=int, default=300, help="synthetic mean output tokens")
    args = ap.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores visible, "
          f"load average {os.getloadavg()[0]:.2f}, python {platform.python_version()}")

    files = [ROOT / "data" / "traces" / f"qwen2.5-coder-1.5b__{d}.parquet" for d in COMMITTED]
    trace = Trace.concat(read_trace(f) for f in files)
    cm, _ = cost_model_for(trace, "llama3.1-8b-h100")
    n_pos = int(trace.requests["output_len"].sum())
    df, t, per = timed(trace, cm, ["ngram", "eagle"])
    print(f"\n[1] committed traces, {len(COMMITTED)} datasets ({', '.join(COMMITTED)}; Qwen2.5-Coder-1.5B, n-gram + "
          f"EAGLE), {len(trace.requests)} requests, {n_pos} output positions, x {len(BATCH)} batch sizes")
    print(f"    both adaptive policies, whole grid ({len(df)} rows): first call {t['first call']:.2f} s, "
          f"repeat {t['repeat']:.2f} s   [target < 10 s]")
    print("    per policy (repeat): " + ", ".join(f"{p} {s:.2f} s" for p, s in per.items()))

    records = {ds: make_records(ds, args.requests, mean_output=args.tokens, seed=42) for ds in SYNTHETIC}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        syn = Trace.concat(read_trace(write_jsonl(Path(tmp) / f"combined_{ds}.jsonl", recs))
                           for ds, recs in records.items())
        t_read = time.perf_counter() - t0
    n_pos = int(syn.requests["output_len"].sum())
    cm2, _ = cost_model_for(syn, "llama3.1-8b-h100")
    df, t, per = timed(syn, cm2, ["ngram", "eagle"])
    print(f"\n[2] SYNTHETIC study-scale traces (published JSON lines, read in {t_read:.1f} s, not counted), "
          f"{len(SYNTHETIC)} datasets x {args.requests} requests, {n_pos} output positions, x {len(BATCH)} "
          f"batch sizes, n-gram + EAGLE, n-gram match recomputed from token ids on every call")
    print(f"    both adaptive policies, whole grid ({len(df)} rows): first call {t['first call']:.2f} s, "
          f"repeat {t['repeat']:.2f} s")
    print("    per policy (repeat): " + ", ".join(f"{p} {s:.2f} s" for p, s in per.items()))


if __name__ == "__main__":
    main()
