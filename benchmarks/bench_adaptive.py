"""Speed of the causal selectors and the baselines on a study-sized grid: 4 datasets x 6 batch sizes, n-gram +
EAGLE, every policy notebook 07 runs once: adaptive-rule, adaptive-learned (one seed; 5-fold request-level
cross-validation, trees per batch size), ngram-else-eagle and its -skip variant over the grid's k pairs
(grids.SWITCH_KN x SWITCH_KE), fixed k = 1..k_max of each proposer and Oracle Combine (winner, all).

Inputs, each timed in this one run:

1. the COMMITTED Qwen2.5-Coder-1.5B traces data/traces/qwen2.5-coder-1.5b__{code-edit,sharegpt,gsm-symbolic,
   mt-bench}.parquet (300 / 347 / 300 / 80 requests, outputs up to 2,048 tokens; n-gram's match recorded);
2. the study's PUBLISHED traces (combined_{instructcoder,cnn,sharegpt,gsm8k}.jsonl from
   github.com/SpecDecode-Bench/simulator, data/llama3.1-8B/; not in the repo), when --published DIR (or
   $SPEC_REPRO_PUBLISHED_TRACES) holds them: n-gram's match is recomputed from the token ids. "first call"
   includes that lookup (done once per file and kept in memory) and loading numba's cached code; "repeat" is the
   steady state.

Cost model llama3.1-8b-h100-per-token, duplicate batching. Target: the whole grid under 10 s on 2 cores.

    python benchmarks/bench_adaptive.py [--published DIR]
"""
from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

from spec_repro.grids import _switch_policies, cost_model_for
from spec_repro.simulate import simulate
from spec_repro.traces import Trace
from spec_repro.tracefiles import read_trace

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ["code-edit", "sharegpt", "gsm-symbolic", "mt-bench"]
PUBLISHED = ["instructcoder", "cnn", "sharegpt", "gsm8k"]
BATCH = (1, 8, 16, 32, 64, 128)


def grid(trace, cm):
    """Every policy once; seconds per part."""
    kmax = int(trace.acc["k_max"].max())
    fixed = [f"fixed-{k}" for k in range(1, kmax + 1)]
    parts = {
        "adaptive-rule": lambda: simulate(trace, cm, "ngram,eagle", "adaptive-rule", batch_sizes=BATCH, progress=False),
        "adaptive-learned": lambda: simulate(trace, cm, "ngram,eagle", "adaptive-learned", batch_sizes=BATCH,
                                             progress=False),
        f"ngram-else-eagle[-skip] ({len(_switch_policies(kmax))} k pairs)":
            lambda: simulate(trace, cm, "ngram,eagle", _switch_policies(kmax), batch_sizes=BATCH, progress=False),
        f"fixed-1..{kmax} x 2 proposers": lambda: [simulate(trace.select(proposers=[q]), cm, q, fixed,
                                                            batch_sizes=BATCH, progress=False)
                                                   for q in ("ngram", "eagle")],
        "oracle-combine winner, all": lambda: simulate(trace, cm, "ngram,eagle", "oracle-combine", ["winner", "all"],
                                                       batch_sizes=BATCH, progress=False),
    }
    out = {}
    for name, f in parts.items():
        t0 = time.perf_counter()
        f()
        out[name] = time.perf_counter() - t0
    return out


def report(label, trace, cm):
    n_pos = int(trace.requests["output_len"].sum())
    print(f"\n{label}: {trace.requests['dataset'].nunique()} datasets, {len(trace.requests)} requests, {n_pos} "
          f"output positions, x {len(BATCH)} batch sizes")
    for run in ("first call", "repeat"):
        t = grid(trace, cm)
        total = sum(t.values())
        print(f"    {run}: whole grid {total:.2f} s   [target < 10 s]   (" +
              ", ".join(f"{k} {v:.2f} s" for k, v in t.items()) + ")")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--published", type=Path, default=os.environ.get("SPEC_REPRO_PUBLISHED_TRACES"),
                    help="folder with the study's combined_<dataset>.jsonl")
    args = ap.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores visible, "
          f"load average {os.getloadavg()[0]:.2f}, python {platform.python_version()}")
    files = [ROOT / "data" / "traces" / f"qwen2.5-coder-1.5b__{d}.parquet" for d in COMMITTED]
    trace = Trace.concat(read_trace(f) for f in files).select(proposers=["ngram", "eagle"])
    cm, _ = cost_model_for(trace, "llama3.1-8b-h100-per-token")
    report("[1] committed traces (Qwen2.5-Coder-1.5B, n-gram + EAGLE)", trace, cm)
    if args.published and all((Path(args.published) / f"combined_{d}.jsonl").is_file() for d in PUBLISHED):
        t0 = time.perf_counter()
        pub = Trace.concat(read_trace(Path(args.published) / f"combined_{d}.jsonl") for d in PUBLISHED)
        print(f"\n(published files read in {time.perf_counter() - t0:.1f} s, not counted)")
        report("[2] the study's published traces (Llama-3.1-8B, n-gram + EAGLE)",
               pub.select(proposers=["ngram", "eagle"]), cost_model_for(pub, "llama3.1-8b-h100-per-token")[0])
    else:
        print("\n[2] the study's published traces: not given (--published DIR), skipped")


if __name__ == "__main__":
    main()
