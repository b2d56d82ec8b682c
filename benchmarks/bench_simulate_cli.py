"""The study's nine-call `spec-repro simulate` grid over its four published files, as a user runs it: the
code after the grid was made fast again against the code before, timed in one run.

Nine CLI calls (n-gram and EAGLE each at fixed-1/3/5 and oracle, then Oracle Combine), each over all four
``combined_*.jsonl`` files of github.com/SpecDecode-Bench/simulator (``data/llama3.1-8B/``), batch sizes
1 8 16 32 64 128, cost model llama3.1-8b-h100. Two implementations run the same grid:

- before: ``spec_repro/`` at ``--before`` (default a42cf8c, the last commit before the parquet reader's id
  lists were vectorized and n-gram's match was kept on disk);
- after: ``spec_repro/`` at ``--after`` (default HEAD: what is committed, so that editing the checkout while
  the benchmark runs changes nothing).

Each is extracted with ``git archive`` into a temporary folder and put first on PYTHONPATH.

Each repetition runs the whole grid once per implementation (the order alternates between repetitions), each
with an empty cache (``SPEC_REPRO_CACHE``), so the first call's JSON parse, and the first n-gram call's lookup,
are inside the grid's time; the other calls read what the first ones kept, as a user's second call does. Each
call is a fresh process (import time counts). Before the timed repetitions, one untimed call per implementation
writes numba's compiled kernels to disk for both alike. Both read the checkout's ``data/``
(``SPEC_REPRO_ROOT``). Every call's CSV of the two implementations is compared byte for byte.

    python benchmarks/bench_simulate_cli.py --traces PATH/simulator/data/llama3.1-8B/combined_*.jsonl
"""
from __future__ import annotations

import argparse
import filecmp
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRID = ([("ngram", p) for p in ("fixed-1", "fixed-3", "fixed-5", "oracle")]
        + [("eagle", p) for p in ("fixed-1", "fixed-3", "fixed-5", "oracle")]
        + [("ngram,eagle", "oracle-combine")])
BEFORE = "a42cf8c"
CPU: dict[str, float] = {}   # PYTHONPATH -> CPU seconds of its timed calls


def call(traces: list[str], props: str, policy: str, out: Path, env: dict) -> float:
    """One `spec-repro simulate` call in a fresh process; its wall time in seconds (its CPU time is added to
    ``CPU``)."""
    cmd = [sys.executable, "-m", "spec_repro.cli", "simulate", "--traces", *traces, "--proposers", props,
           "--policy", policy, "--batch-sizes", "1", "8", "16", "32", "64", "128", "--out", str(out),
           "--no-progress"]
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    # run from the output folder: `python -m` puts the working directory first on sys.path, and a checkout's
    # own spec_repro/ there would shadow the one PYTHONPATH names
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, cwd=out.parent)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU[env["PYTHONPATH"]] = CPU.get(env["PYTHONPATH"], 0.0) + (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
    return wall


def grid(traces: list[str], out: Path, env: dict) -> list[float]:
    """The nine calls one after the other, from an empty cache; their wall times."""
    out.mkdir(parents=True)
    env = dict(env, SPEC_REPRO_CACHE=str(out / "cache"))
    return [call(traces, props, policy, out / f"{i}.csv", env) for i, (props, policy) in enumerate(GRID)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", nargs="+", required=True, help="the four published combined_*.jsonl files")
    ap.add_argument("--before", default=BEFORE, help=f"the commit to compare against (default {BEFORE})")
    ap.add_argument("--after", default="HEAD", help="the commit to time (default HEAD)")
    ap.add_argument("--repeats", type=int, default=3, help="grids per implementation (the median is reported)")
    args = ap.parse_args()
    args.traces = [str(Path(t).resolve()) for t in args.traces]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores visible, load average "
          f"{os.getloadavg()[0]:.2f}, python {platform.python_version()}")
    print(f"traces: {', '.join(Path(t).name for t in args.traces)} "
          f"({sum(Path(t).stat().st_size for t in args.traces) / 1e6:.1f} MB)")
    revs = {name: subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], check=True,
                                 capture_output=True, text=True).stdout.strip()
            for name, rev in (("before", args.before), ("after", args.after))}
    print(f"before: spec_repro/ at {revs['before']}; after: spec_repro/ at {revs['after']}")
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        for name, rev in revs.items():
            (d / name).mkdir()
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "spec_repro"], check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(d / name)], input=archive, check=True)
        envs = {name: dict(os.environ, PYTHONPATH=str(d / name), SPEC_REPRO_ROOT=str(ROOT)) for name in revs}
        for name, env in envs.items():   # each runs its own copy
            where = subprocess.run([sys.executable, "-c", "import spec_repro; print(spec_repro.__file__)"], env=env,
                                   cwd=d, check=True, capture_output=True, text=True).stdout.strip()
            assert Path(where).is_relative_to(d / name), f"{name} imports {where}"
        for name, env in envs.items():   # numba's kernels compiled and cached on disk, for both alike
            call(args.traces[:1], "ngram", "fixed-1", d / f"warm-{name}.csv", dict(env, SPEC_REPRO_CACHE=str(d)))
        CPU.clear()
        times: dict[str, list[list[float]]] = {name: [] for name in envs}
        same = True
        for r in range(args.repeats):
            for name in (("before", "after") if r % 2 == 0 else ("after", "before")):
                times[name].append(grid(args.traces, d / f"{name}{r}", envs[name]))
            same &= all(filecmp.cmp(d / f"before{r}" / f"{i}.csv", d / f"after{r}" / f"{i}.csv", shallow=False)
                        for i in range(len(GRID)))
    med = {name: [statistics.median(x) for x in zip(*t)] for name, t in times.items()}
    tot = {name: [sum(x) for x in t] for name, t in times.items()}
    print(f"\nper call, median of {args.repeats} (s):")
    print(f"{'call':<28}{'before':>9}{'after':>9}{'ratio':>8}")
    for (props, policy), a, b in zip(GRID, med["before"], med["after"]):
        print(f"{props + ' ' + policy:<28}{a:9.2f}{b:9.2f}{a / b:7.1f}x")
    for name, t in tot.items():
        print(f"nine calls, {name:<6}: {', '.join(f'{x:.2f}' for x in t)} s")
    b, a = statistics.median(tot["before"]), statistics.median(tot["after"])
    print(f"nine calls, median of {args.repeats}: before {b:.2f} s, after {a:.2f} s, ratio {b / a:.1f}x "
          f"(target: after < 10 s, >= 5x)")
    cpu = {name: CPU.get(envs[name]["PYTHONPATH"], 0.0) / args.repeats for name in envs}
    print(f"CPU time per grid (mean of {args.repeats}, user + system of the calls): before {cpu['before']:.2f} s, "
          f"after {cpu['after']:.2f} s, ratio {cpu['before'] / cpu['after']:.1f}x")
    print(f"outputs byte-identical: {same}")


if __name__ == "__main__":
    main()
