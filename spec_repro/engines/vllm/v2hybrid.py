"""The n-gram + EAGLE hybrid and the step timer on vLLM 0.25's V2 model runner (``hybrid_v2``,
``runner_v2_patches``), as engine specs for ``jobs.run_specs``, in two resumable stages (``gpu/plans/v2hybrid.json``):

``lossless``  bs 1, a few requests of code-edit and sharegpt: a no-SD engine and one EAGLE engine rotating EAGLE
              alone (``off``) and the device-side policies (``gpu-pr24344``, ``gpu-pr24344-skip``,
              ``gpu-eagle-only``); ``check-lossless`` exits 1 unless every hybrid output equals no SD's token for
              token, or the hybrid equals no SD on as many requests as vLLM's own EAGLE does (bf16 near-ties;
              :func:`check_lossless`): the grid runs only after it passes.
``grid``      a no-SD V2 engine, then one EAGLE engine, each first timing the V2 step timer's cost (``jobs`` task
              ``overhead``: vLLM's own methods, the timer every run uses and that timer toggled in blocks inside
              each run, interleaved, bs 1 / 8 / 32 / 64, 512-token random prompts, 128 tokens, 12 repeats; the
              EAGLE engine on its ``off`` policy: EAGLE alone); then no SD runs code-edit and sharegpt at bs 1 /
              8 / 32 / 64, 3 repeats (the step model's no-SD term and the hybrids' no-SD reference), and the
              EAGLE engine rotates ``off``, ``gpu-eagle-only``, ``gpu-pr24344``, ``gpu-pr24344-skip`` shape by
              shape (a Latin square:
              ``hybrid_jobs.rotated_order``), code-edit then sharegpt, 4 repeats, every step timed; then EAGLE
              alone at its best fixed k (``EAGLE_BEST_K``) and ``gpu-pr24344-skip`` at that k, rotated in a V2
              engine of their own (``eagle-k3``, ``gpu-pr24344-skip-k3``), both workloads, 4 repeats; last, vLLM's
              n-gram on the V1 runner (its only runner in vLLM 0.25; ``v1-forced``, timed by the V1 hooks) at k =
              ``NGRAM_K``, both workloads, 3 repeats.

Every engine but the n-gram one forces the V2 runner (``engine_config`` ``v2-forced``: ``VLLM_USE_V2_MODEL_RUNNER=1``)
and vLLM's own scheduling (async for EAGLE), Qwen2.5-Coder-1.5B-Instruct (real weights) and the package's EAGLE head
at k = 5 (``rotate-k3``'s engine: k = 3). ``estimate`` prices a spec from the V2 grid's measured engine starts and
seconds per run (``gpu/plans/v2hybrid.json``'s ``engine_seconds``). ``summarize`` writes the raw folder's tables
(``v2summary``), ``verdict`` prints what they show (``v2verdict``).

    python -m spec_repro.engines.vllm.v2hybrid plan [--stage S]                # CPU: specs and estimated seconds
    python -m spec_repro.engines.vllm.v2hybrid run --stage S --head DIR --out DIR [--deadline S]
    python -m spec_repro.engines.vllm.v2hybrid check-lossless --out DIR          # rc 1 unless lossless
    python -m spec_repro.engines.vllm.v2hybrid summarize --raw DIR [--out data/gpu/live]
    python -m spec_repro.engines.vllm.v2hybrid verdict [--out data/gpu/live]     # rc 1 unless every line passes
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PLAN = ROOT / "gpu" / "plans" / "v2hybrid.json"
STAGES = ("lossless", "grid")
ROTATE = ("off", "gpu-eagle-only", "gpu-pr24344", "gpu-pr24344-skip")
ENGINE_CONFIG = "v2-forced"
K = 5
# vLLM's n-gram at k = 5: every committed n-gram run (data/gpu/v1-runner, the V1 runner; data/gpu/v2grid) ran k = 5,
# so the grid's is comparable to them; the live step model fitted on data/gpu/v1-runner/rotated-code-edit, walked
# over its profile (hybrid_trace_s5.jsonl) at k = 1..7, prices k = 5 within 3% of the fastest k (k = 7: +3% at
# bs 1, +1-2% at bs 8-64) and 25% above k = 1 at bs 1: no k is measurably better
NGRAM_K = 5
#: EAGLE alone at its best fixed k (what a user would run instead of the hybrid) and the hybrid at that k, rotated
#: in an engine of their own beside the grid's k = 5 (configurations ``eagle-k3``, ``gpu-pr24344-skip-k3``): on
#: vLLM's default engine on the H200 (data/gpu/v2grid, engines resident together) k = 3 ran fastest at every
#: code-edit batch size, 1.14-1.15x k = 5, and 1.03x / 1.03x / 1.35x / 1.37x k = 5 on sharegpt at bs 1 / 8 / 32 / 64
#: (within 1% and 7% of k = 2 and k = 1 at bs 1 and 8); on an H100 (data/gpu/live) k = 3 ran 1.02x k = 5 at
#: code-edit bs 1 and 1.13-1.17x at bs 8-64 (sharegpt 1.11x, then 1.20-1.27x)
EAGLE_BEST_K = 3
ROTATE_BEST_K = ("off", "gpu-pr24344-skip")
OVERHEAD_TASK = {"type": "overhead", "prompt_len": 512, "max_tokens": 128, "batch_sizes": [1, 8, 32, 64],
                 "repeats": 12, "vocab_size": 151936}
#: the timer variants both engines time (any of common.TIMER_VARIANTS): vLLM's own method and the timer every run
#: uses (the diagnostic variants hooks / step / drain were timed in data/gpu/live/timer), and the timer toggled in
#: blocks inside each run. A pair of 128-token runs on a lent H100 differs by up to 5-17% (sd) with the host's
#: speed, whose drift over tens of steps moves a run's median step 4-12% (data/gpu/live/slower-host; other hosts
#: drift less): 12 repeats of whole runs resolve about +-6% there; inside a toggle run, 4-step blocks timed and
#: untimed in drawn turns meet the same host speed (v2summary.toggle_table: the estimate the 3% line holds where
#: toggle runs exist); and the same timer toggled with its events recorded by torch's Event.record (toggle-torch),
#: which releases the GIL on each call: on one H100 both cost +0.2-0.6% inside runs (data/gpu/live), on the slower
#: host torch's cost no SD +3.1-3.8%, what the timer's own host time a step was there (0.09-0.13 ms)
OVERHEAD_VARIANTS = ["off", "timer", "toggle", "toggle-torch"]


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
    else:
        best = rotated_spec(head, policies=ROTATE_BEST_K, repeats=4, **{**kw, "k": EAGLE_BEST_K})
        best["config"]["config_suffix"] = f"-k{EAGLE_BEST_K}"
        specs = [hybrid_specs(head, methods=("none",), repeats=3, **kw)[0],
                 rotated_spec(head, policies=ROTATE, repeats=len(ROTATE), **kw), best,
                 hybrid_specs(head, methods=("ngram",), repeats=3, model_dir=model_dir, k=NGRAM_K,
                              engine_config="v1-forced")[0]]
        names = ("none", "rotate", f"rotate-k{EAGLE_BEST_K}", "ngram")
        for s in specs[:2]:       # the step timer's cost first, in the engines the grid then runs
            s["tasks"].insert(0, {**OVERHEAD_TASK, "variants": list(OVERHEAD_VARIANTS)})
            s["config"]["max_num_seqs"] = max(max(OVERHEAD_TASK["batch_sizes"]), s["config"]["max_num_seqs"])
    for s, n in zip(specs, names):
        s["name"] = f"v2hybrid-{stage}-{n}"
        # the n-gram engine runs V1 (vLLM 0.25's V2 runner does not take it); every engine is timed
        assert s["config"]["model_runner"] == ("v1" if n == "ngram" else "v2") and s.get("instrumented", True), s
    return specs


def load_plan(path: str | Path = PLAN) -> dict:
    return json.loads(Path(path).read_text())


def _run_s(es: dict, method: str, workload: str, b: int, max_tokens: int) -> float:
    """Seconds of one timed run of ``b`` requests (``es["run_s"]``: measured at 256 tokens; scaled to
    ``max_tokens``); the hybrid policies take EAGLE's."""
    per = es["run_s"]["eagle" if method not in es["run_s"] else method]
    return per[workload if workload in per else next(iter(per))][str(b)] * max_tokens / 256


def estimate(spec: dict, plan: dict | None = None) -> float:
    """A spec's seconds from the V2 grid's measurements (the plan's ``engine_seconds``: engine start, seconds per
    run per method, workload and batch size at 256 tokens, per workload the prompts' loading): per workload and
    batch size, chunks x (repeats + 1 warm-up pass) x the run's seconds, times the policies a rotated engine
    switches between. An overhead task: a run per timer variant, batch size and repeat, one step a token (a
    random prompt: EAGLE's drafts are rejected, one token a step), priced by the V2 cost model fitted on the same
    grid (``v2fit.step_time``, preset ``qwen2.5-coder-1.5b-h200-v2``)."""
    from ...costmodel import load_cost_model
    from .v2fit import NAME, step_time

    es = (plan or load_plan())["engine_seconds"]
    t = es["start_s"]
    method = spec["config"]["method"]
    pols = len(spec["config"].get("hybrid_rotate") or ()) or 1
    for task in spec["tasks"]:
        if task["type"] == "hybrid":
            for w in task["workloads"]:
                t += es["per_workload_s"]
                for b in task["batch_sizes"]:
                    chunks = -(-max(b, task["prompts_per_bs"]) // b)
                    t += pols * (task["repeats"] + 1) * chunks * _run_s(es, method, w, b, task["max_tokens"])
        elif task["type"] == "overhead":
            cm = load_cost_model(NAME)
            k = spec["config"]["k"] if method == "eagle" else 0
            n = len(task.get("variants") or ("off", "timer"))
            t += sum(n * task["repeats"] * task["max_tokens"] * float(step_time(cm, b, k)) for b in task["batch_sizes"])
    return t


def check_lossless(records: list[dict], slack: int = 1) -> tuple[bool, list[dict]]:
    """(the gate, the report rows). Greedy verification keeps the target's output, but bf16 numerics do not: a
    speculative step's target forward (1 + k query tokens) can flip a near-tie that no SD's 1-token step resolves
    the other way, and vLLM's own EAGLE parts from no SD on some requests for that reason alone (on the V1 runner,
    28 of 32 code-edit requests equal at bs 1, ``data/gpu/v1-runner``). So a hybrid passes where every output equals
    no SD's, or where it equals no SD's on at least as many requests as EAGLE alone (``eagle``, the same engine's
    ``off`` runs) at the same workload and batch size, less ``slack``: a bug in how drafts reach the verifier
    changes far more. EAGLE alone is reported, not gated; no compared run at all is no pass."""
    from .hybrid_jobs import lossless_report
    from .live_runs import latest

    rows = lossless_report(latest(records))      # a restarted spec's runs: the last measurement
    eagle = {}
    for r in rows:
        if r["config"] == "eagle":
            key = (r["workload"], r["batch_size"])
            eagle[key] = min(eagle.get(key, r["equal"]), r["equal"])
    ok = bool(rows)
    for r in rows:
        ref = eagle.get((r["workload"], r["batch_size"]))
        r["eagle_equal"] = ref
        r["gate"] = (r["config"] == "eagle" or r["equal"] == r["total"]
                     or (ref is not None and r["equal"] >= ref - slack))
        ok = ok and r["gate"]
    return ok, rows


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
    sm = sub.add_parser("summarize", help="the raw folder's tables into --out (v2summary), swapped in whole")
    sm.add_argument("--raw", required=True, help="the job's results folder (v2hybrid/: one folder per stage)")
    sm.add_argument("--out", default=None, help="default: data/gpu/live")
    v = sub.add_parser("verdict", help="each line the V2 run must show, PASS / FAIL (v2verdict)")
    v.add_argument("--out", default=None, help="a summarized folder (default: data/gpu/live)")
    a = ap.parse_args(argv)
    if a.cmd in ("summarize", "verdict"):
        return _summary_cmd(a)
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


def _summary_cmd(a) -> int:
    """``summarize`` / ``verdict``: bad input (no folder, --out overlapping --raw) is one line on stderr, rc 2."""
    from ...io import OutputError
    from .live_runs import OUT

    out = Path(a.out) if a.out else OUT
    if a.cmd == "verdict":
        if not out.is_dir():
            print(f"v2hybrid verdict: no folder {out}", file=sys.stderr)
            return 2
        from .v2verdict import verdict

        ok, lines = verdict(out)
        print("\n".join(lines))
        return 0 if ok else 1
    if not Path(a.raw).is_dir():
        print(f"v2hybrid summarize: no folder {a.raw}", file=sys.stderr)
        return 2
    from .v2summary import summarize

    try:
        print(json.dumps(summarize(a.raw, out, command=" ".join(["python -m spec_repro.engines.vllm.v2hybrid",
                                                                 *sys.argv[1:]]))))
    except OutputError as e:          # --out overlapping --raw
        print(f"v2hybrid summarize: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
