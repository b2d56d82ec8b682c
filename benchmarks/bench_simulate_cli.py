"""Start-up of `spec-repro simulate`: the study's nine-call grid over its four published files, as a user runs it.

Nine CLI calls (n-gram and EAGLE each at fixed-1/3/5 and oracle, then Oracle Combine), each over all four
``combined_*.jsonl`` files of github.com/SpecDecode-Bench/simulator (``data/llama3.1-8B/``), batch sizes
1 8 16 32 64 128, cost model llama3.1-8b-h100. Timed in one run, one after the other:

- plain: every call parses the JSON lines again (``SPEC_REPRO_TRACE_CACHE=0``);
- cached: the first call parses each file once and keeps it as parquet (keyed by its sha256), the other eight
  read that; the cache starts empty, so the first call's parse is inside the total.

Each call is a fresh process, so import time counts as it does for a user. The CSVs of the two loops are
compared byte for byte.

    python benchmarks/bench_simulate_cli.py --traces PATH/simulator/data/llama3.1-8B/combined_*.jsonl
"""
from __future__ import annotations

import argparse
import filecmp
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GRID = ([("ngram", p) for p in ("fixed-1", "fixed-3", "fixed-5", "oracle")]
        + [("eagle", p) for p in ("fixed-1", "fixed-3", "fixed-5", "oracle")]
        + [("ngram,eagle", "oracle-combine")])


def loop(traces: list[str], out: Path, env: dict) -> list[float]:
    times = []
    for i, (props, policy) in enumerate(GRID):
        cmd = [sys.executable, "-m", "spec_repro.cli", "simulate", "--traces", *traces, "--proposers", props,
               "--policy", policy, "--batch-sizes", "1", "8", "16", "32", "64", "128",
               "--out", str(out / f"{i}.csv"), "--no-progress"]
        t0 = time.perf_counter()
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", nargs="+", required=True, help="the four published combined_*.jsonl files")
    args = ap.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores visible, load average "
          f"{os.getloadavg()[0]:.2f}, python {platform.python_version()}")
    print(f"traces: {', '.join(Path(t).name for t in args.traces)} "
          f"({sum(Path(t).stat().st_size for t in args.traces) / 1e6:.1f} MB)")
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        (d / "plain").mkdir()
        (d / "cached").mkdir()
        base = dict(os.environ, SPEC_REPRO_CACHE=str(d / "cache"))
        # one untimed call first, so that numba's compiled kernels are on disk for both loops alike
        subprocess.run([sys.executable, "-m", "spec_repro.cli", "simulate", "--traces", args.traces[0],
                        "--proposers", "ngram", "--policy", "fixed-1", "--out", str(d / "warm.csv"),
                        "--no-progress"], env=dict(base, SPEC_REPRO_TRACE_CACHE="0"), check=True,
                       stdout=subprocess.DEVNULL)
        plain = loop(args.traces, d / "plain", dict(base, SPEC_REPRO_TRACE_CACHE="0"))
        cached = loop(args.traces, d / "cached", base)
        same = all(filecmp.cmp(d / "plain" / f"{i}.csv", d / "cached" / f"{i}.csv", shallow=False)
                   for i in range(len(GRID)))
    print(f"{'call':<28}{'plain s':>9}{'cached s':>10}")
    for (props, policy), a, b in zip(GRID, plain, cached):
        print(f"{props + ' ' + policy:<28}{a:9.2f}{b:10.2f}")
    print(f"{'nine calls':<28}{sum(plain):9.2f}{sum(cached):10.2f}   ratio {sum(plain) / sum(cached):.2f}x "
          f"(target: cached < 20 s)")
    print(f"outputs byte-identical: {same}")


if __name__ == "__main__":
    main()
