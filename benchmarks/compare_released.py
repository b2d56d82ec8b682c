"""Fidelity on REAL data: spec_repro.simulate vs the study's released simulator, on the study's published traces.

Needs a checkout of https://github.com/SpecDecode-Bench/simulator (its ``data/llama3.1-8B/combined_*.jsonl`` are
the published, measured acceptance traces of Llama-3.1-8B-Instruct on H100). Nothing of it is copied into this
package: the released modules are imported from the checkout at run time.

Compared: the oracle policies (deterministic in the released code; its fixed-K runs draw n-gram matches from
Python's global random stream, which cannot be replayed per request), 300 requests sampled with seed 42 as the
released code does, cost model llama3.1-8b-h100. Oracle Combine uses the combined files as they are; the one-
proposer runs use one-proposer copies, because the released code takes L from that proposer's own array while a
combined trace here has L = the shortest array (see spec_repro.simulate's docstring).

    python benchmarks/compare_released.py --released PATH/TO/simulator [--datasets instructcoder cnn]
           [--batch-sizes 1 8 32]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path

from spec_repro.simulate import simulate
from spec_repro.tracefiles import read_trace


def _read(path: Path, tmp: Path, proposer: str | None = None):
    """Read a published file, or a one-proposer copy of it (the released code takes L from that proposer's own
    array, while a combined trace here has L = the shortest array)."""
    src = path
    if proposer is not None:
        src = tmp / f"{proposer}_{path.name}"
        with open(path) as f, open(src, "w") as g:
            for line in f:
                r = json.loads(line)
                g.write(json.dumps({"id": r["id"], "prompt_token_ids": r["prompt_token_ids"],
                                    "generated_token_ids": r["generated_token_ids"], "acc": r[f"acc_{proposer}"]})
                        + "\n")
    kw = {"dataset": path.stem.removeprefix("combined_"), "model": "Llama-3.1-8B-Instruct"}
    if proposer:
        kw["proposer"] = proposer
    return read_trace(src, **kw), ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--released", required=True, type=Path, help="checkout of SpecDecode-Bench/simulator")
    ap.add_argument("--datasets", nargs="+", default=["instructcoder", "cnn", "gsm8k", "sharegpt"])
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8, 32])
    args = ap.parse_args()
    sys.path.insert(0, str(args.released))
    from predictor import AccLenPredictMethod  # the released code, imported from the checkout
    from simulator import AccLenGroundTruth, SpecSimulator

    runs = [("ngram,eagle", "oracle-combine", AccLenGroundTruth.COMBINE_NGRAM_EAGLE),
            ("ngram", "oracle", AccLenGroundTruth.NGRAM), ("eagle", "oracle", AccLenGroundTruth.EAGLE)]
    worst = 0.0
    print("dataset        proposers    policy          B   released     spec_repro   rel.diff   released s  ours s")
    with tempfile.TemporaryDirectory() as tmp:
        for ds in args.datasets:
            path = args.released / "data" / "llama3.1-8B" / f"combined_{ds}.jsonl"
            for props, pol, gt in runs:
                trace, note = _read(path, Path(tmp), None if "," in props else props)
                sim = SpecSimulator(str(path), AccLenPredictMethod.ORACLE, gt, ds)
                t0 = time.perf_counter()
                ours = simulate(trace, "llama3.1-8b-h100", props, pol, "ngram-only", args.batch_sizes, sample=300,
                                seed=42, progress=False)
                t_ours = time.perf_counter() - t0
                for B, s in zip(ours["batch_size"], ours["speedup"]):
                    t0 = time.perf_counter()
                    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                        rel = sim.simulate_like_experiment(int(B))
                    t_rel = time.perf_counter() - t0
                    diff = abs(s - rel) / rel
                    worst = max(worst, diff)
                    print(f"{ds:14s} {props:12s} {pol:15s} {B:3d}  {rel:10.6f}  {s:10.6f}  {diff:9.1e}  {t_rel:9.1f}"
                          f"  {t_ours:6.2f}{note}")
    print(f"max relative difference: {worst:.1e} (EAGLE runs differ by the released code's within-step KV count "
          f"in EAGLE's drafting time; everything else should agree to rounding)")


if __name__ == "__main__":
    main()
