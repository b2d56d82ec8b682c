"""Speed of spec_repro.simulate on the study's whole grid, against the plain per-step reference loop.

Grid (as in the study): 4 datasets x {ngram, eagle: fixed-1, fixed-3, fixed-5, oracle; ngram+eagle: oracle-combine}
x batch sizes 1, 8, 16, 32, 64, 128, 500 requests per dataset, ~300 output tokens, duplicate batching,
ngram-only accounting, cost model llama3.1-8b-h100.

The traces are SYNTHETIC (seeded generator tests/fixtures/published/make_fixtures.py), written in the published
JSON-lines format and read back with spec_repro.tracefiles.read_trace; only timings are measured here.
The reference loop (tests/reference_sim.py) is timed on a few requests per dataset for every grid configuration
and extrapolated linearly to 500 requests (its cost is a sum over independent batches).

    python benchmarks/bench_simulate.py [--ref-requests 2] [--requests 500] [--tokens 300]
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
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "published"))

from make_fixtures import make_records, write_jsonl  # noqa: E402
from reference_sim import duplicate_batch, make_requests  # noqa: E402

from spec_repro.costmodel import load_cost_model  # noqa: E402
from spec_repro.simulate import simulate  # noqa: E402
from spec_repro.traces import Trace  # noqa: E402
from spec_repro.tracefiles import read_trace  # noqa: E402

DATASETS = ("instructcoder", "cnn", "sharegpt", "gsm8k")
GRID = [(["ngram"], ["fixed-1", "fixed-3", "fixed-5", "oracle"]),
        (["eagle"], ["fixed-1", "fixed-3", "fixed-5", "oracle"]),
        (["ngram", "eagle"], ["oracle-combine"])]
BATCH = [1, 8, 16, 32, 64, 128]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--ref-requests", type=int, default=2, help="requests per dataset timed with the plain loop")
    args = ap.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores visible, "
          f"load average {os.getloadavg()[0]:.2f}, python {platform.python_version()}")
    print(f"traces: SYNTHETIC, seeded ({args.requests} requests x {len(DATASETS)} datasets, "
          f"~{args.tokens} output tokens, published JSON-lines format)")
    cm = load_cost_model("llama3.1-8b-h100")
    records = {ds: make_records(ds, args.requests, mean_output=args.tokens, seed=42) for ds in DATASETS}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        trace = Trace.concat(read_trace(write_jsonl(Path(tmp) / f"combined_{ds}.jsonl", recs))
                             for ds, recs in records.items())
        t_read = time.perf_counter() - t0
    n_pos = int(trace.requests["output_len"].sum())
    print(f"read {len(trace.requests)} requests, {n_pos} output positions in {t_read:.1f} s (not counted below)")

    def run_grid():
        rows = []
        for props, policies in GRID:
            rows.append(simulate(trace, cm, props, policies, "ngram-only", BATCH, progress=False))
        return rows

    t0 = time.perf_counter()
    first = run_grid()
    t_first = time.perf_counter() - t0
    t0 = time.perf_counter()
    run_grid()
    t_fast = time.perf_counter() - t0
    n_rows = sum(len(r) for r in first)
    print(f"fast simulator, whole grid ({n_rows} result rows): first call {t_first:.2f} s (numba load/compile "
          f"included), repeat {t_fast:.2f} s   [target < 30 s]")

    # plain reference loop on a subset, every grid configuration, extrapolated to all requests
    t_ref_sub = 0.0
    t_fast_sub = 0.0
    extrapolated = 0.0
    worst = 0.0
    for ds in DATASETS:
        recs = records[ds][:args.ref_requests]
        table = [(r["id"], len(r["prompt_token_ids"]),
                  {q: r[f"acc_{q}"]["acc_len"][:min(len(r["acc_ngram"]["acc_len"]), len(r["acc_eagle"]["acc_len"]))]
                   for q in ("ngram", "eagle")},
                  {q: [None] * len(r["acc_ngram"]["acc_len"]) for q in ("ngram", "eagle")}) for r in recs]
        sub = trace.select(dataset=ds)
        ids = [r["id"] for r in recs]
        sub = Trace(sub.acc[sub.acc["request_id"].isin(ids)], sub.requests[sub.requests["request_id"].isin(ids)])
        t_ds = 0.0
        for props, policies in GRID:
            for pol in policies:
                kind, K = ("fixed", int(pol.split("-")[1])) if pol.startswith("fixed") else (pol, 0)
                reqs = make_requests(table, props, kind, K, ds, 42, None)
                t0 = time.perf_counter()
                sd_tp = {B: [] for B in BATCH}
                base_tp = {B: [] for B in BATCH}
                for B in BATCH:
                    for r in reqs:
                        lat = duplicate_batch(cm, r, B, "ngram-only", True)[0]
                        blat = duplicate_batch(cm, r, B, "ngram-only", False)[0]
                        sd_tp[B].append(B * r.L / lat)
                        base_tp[B].append(B * r.L / blat)
                t_ds += time.perf_counter() - t0
                t0 = time.perf_counter()
                fast = simulate(sub, cm, props, pol, "ngram-only", BATCH, progress=False)
                t_fast_sub += time.perf_counter() - t0
                for B, s in zip(fast["batch_size"], fast["speedup"]):
                    ref = (sum(sd_tp[B]) / len(reqs)) / (sum(base_tp[B]) / len(reqs))
                    worst = max(worst, abs(s - ref) / ref)
        t_ref_sub += t_ds
        extrapolated += t_ds * args.requests / len(recs)
    n_sub = args.ref_requests * len(DATASETS)
    print(f"plain reference loop: {t_ref_sub:.1f} s for {n_sub} requests x the whole grid "
          f"-> extrapolated {extrapolated:.0f} s ({extrapolated / 60:.1f} min) for {args.requests} requests/dataset")
    print(f"agreement on that subset: max relative speedup difference {worst:.1e}")
    print(f"per request and grid: reference {t_ref_sub / n_sub * 1e3:.0f} ms, "
          f"fast (whole grid) {t_fast / (args.requests * len(DATASETS)) * 1e3:.3f} ms")
    print(f"RATIO reference / fast on the whole grid: {extrapolated / t_fast:.0f}x (repeat call), "
          f"{extrapolated / t_first:.0f}x (first call)   [target >= 50x]")


if __name__ == "__main__":
    main()
