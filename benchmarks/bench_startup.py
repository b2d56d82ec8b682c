"""Start-up of `spec-repro simulate` and `spec-repro collect` before and after the input checks (output guard,
full sha256 of every cached byte at every use, validation of every number), measured in ONE run, interleaved.

"before" is the package at a given commit (default f87dc66, the commit before those checks), extracted
with ``git archive`` into a temporary folder and put first on PYTHONPATH; "after" is this working tree. Each
call is a fresh process, as a user runs it, alternating before/after so that the shared machine's load drifts
over both alike. Commands:

- simulate-parquet: a committed trace (data/traces), n-gram oracle, batch sizes 1 16 64;
- simulate-jsonl: the synthetic published fixture, through the trace cache (warm; after: its sha256 checked);
- collect: SmolLM2-135M, one code-edit request, one new token, n-gram (model load with the full sha256 of its
  converted files, workload records with theirs, the finished-trace and manifest checks), ``--force``.

It also times the full sha256 of the converted SmolLM2 files on its own.
Prints medians per command and the after/before ratio.

    python benchmarks/bench_startup.py [--rounds 5] [--before f87dc66]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def commands(tmp: Path) -> dict[str, list[str]]:
    parquet = sorted((ROOT / "data" / "traces").glob("smollm2-*code-edit*.parquet"))[0]
    fixture = ROOT / "tests" / "fixtures" / "published" / "combined_instructcoder.jsonl"
    return {
        "simulate-parquet": ["simulate", "--traces", str(parquet), "--proposers", "ngram", "--policy", "oracle",
                             "--batch-sizes", "1", "16", "64", "--no-progress", "--out", str(tmp / "{tag}-p.csv")],
        "simulate-jsonl": ["simulate", "--traces", str(fixture), "--proposers", "ngram", "--policy", "oracle",
                           "fixed-3", "--batch-sizes", "1", "16", "64", "--no-progress",
                           "--out", str(tmp / "{tag}-j.csv")],
        "collect": ["collect", "--workloads", "code-edit", "-n", "1", "--max-new-tokens", "1", "--proposers",
                    "ngram", "--batch-size", "1", "--threads", "1", "--force", "--out", str(tmp / "{tag}-c")],
    }


CPU: dict = {}  # side -> command -> child CPU seconds (user + sys), the load-independent part of the cost


def timed(args: list[str], pythonpath: str, tag: str, cwd: Path) -> float:
    env = {**os.environ, "PYTHONPATH": pythonpath, "SPEC_REPRO_CACHE": os.environ.get("SPEC_REPRO_CACHE", "")}
    if not env["SPEC_REPRO_CACHE"]:
        env.pop("SPEC_REPRO_CACHE")
    cmd = [sys.executable, "-m", "spec_repro.cli", *[a.replace("{tag}", tag) for a in args]]
    import resource

    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=cwd)  # not the repo: -m puts cwd first
    dt = time.perf_counter() - t0
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    key = args[0] + ("-j" if "-j.csv" in args[-1] else "")
    cpu = c1.ru_utime - c0.ru_utime + c1.ru_stime - c0.ru_stime
    CPU.setdefault(tag.rstrip("0123456789"), {}).setdefault(key, []).append(cpu)
    if r.returncode != 0:
        raise SystemExit(f"{tag}: {' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
    return dt


def hash_cost() -> str:
    sys.path.insert(0, str(ROOT))
    from spec_repro import models
    from spec_repro.fetch import sha256_file

    d = models.converted_dir(models.DEFAULT)
    files = [p for p in d.iterdir() if p.is_file()]
    n = sum(p.stat().st_size for p in files)
    t0 = time.perf_counter()
    for p in files:
        sha256_file(p)
    dt = time.perf_counter() - t0
    return (f"full sha256 of the converted {models.DEFAULT} files: {n / 1e6:.0f} MB in {dt:.3f} s "
            f"({n / dt / 1e9:.2f} GB/s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--before", default="f87dc66")
    ap.add_argument("--only", nargs="+", default=None)
    args = ap.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores visible, load average "
          f"{os.getloadavg()[0]:.2f}, python {platform.python_version()}")
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        tmp = Path(tmp)
        before = tmp / "before"
        before.mkdir()
        arch = subprocess.run(["git", "-C", str(ROOT), "archive", args.before, "spec_repro"], capture_output=True,
                              check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(before)], input=arch, check=True)
        cmds = commands(tmp)
        names = args.only or list(cmds)
        for pp in (before, ROOT):                             # which package each side really imports
            got = subprocess.run([sys.executable, "-c", "import spec_repro; print(spec_repro.__file__)"], cwd=tmp,
                                 env={**os.environ, "PYTHONPATH": str(pp)}, capture_output=True, text=True)
            assert got.stdout.strip().startswith(str(pp)), (pp, got.stdout, got.stderr)
            print(f"imports {got.stdout.strip()}")
        for name in names:                                    # warm caches (trace cache, workloads, model)
            timed(cmds[name], str(before), "warm-b", tmp)
            timed(cmds[name], str(ROOT), "warm-a", tmp)
        res = {n: {"before": [], "after": []} for n in names}
        for r in range(args.rounds):
            for name in names:
                order = [("before", str(before)), ("after", str(ROOT))]
                if r % 2:
                    order.reverse()
                for tag, pp in order:
                    res[name][tag].append(timed(cmds[name], pp, f"{tag}{r}", tmp))
        print(f"{'command':18s} {'before s':>9s} {'after s':>9s} {'ratio':>6s} {'min b':>7s} {'min a':>7s} "
              f"{'ratio':>6s}   (median and min of {args.rounds} rounds)")
        for name in names:
            b, a = statistics.median(res[name]["before"]), statistics.median(res[name]["after"])
            mb, ma = min(res[name]["before"]), min(res[name]["after"])
            print(f"{name:18s} {b:9.3f} {a:9.3f} {a / b:6.3f} {mb:7.3f} {ma:7.3f} {ma / mb:6.3f}   before "
                  f"{['%.2f' % x for x in res[name]['before']]} after {['%.2f' % x for x in res[name]['after']]}")
    for name in ("simulate", "simulate-j", "collect"):
        b, a = CPU.get("before", {}).get(name), CPU.get("after", {}).get(name)
        if b and a:
            print(f"CPU seconds (user+sys, median) {name:11s} before {statistics.median(b):.3f} after "
                  f"{statistics.median(a):.3f} ratio {statistics.median(a) / statistics.median(b):.3f}")
    print(hash_cost())
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
