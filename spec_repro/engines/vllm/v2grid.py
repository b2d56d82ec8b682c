"""EAGLE on vLLM's own runner (V2 for EAGLE on a dense Qwen2 target), uninstrumented, beside no SD, n-gram and the
draft model: what a vLLM 0.25 user gets, with real weights.

The committed live runs timed EAGLE on the V1 runner, forced for the plugin's step log (``labels``: ``v1-forced``);
vLLM itself runs EAGLE on V2, which drafted 1.8-2.3x faster per step on one H200 (dummy weights). This job
measures vLLM's own choice (``engine_config="default"``: no forced runner, no forced async scheduling, no plugin)
on Qwen2.5-Coder-1.5B-Instruct (real weights) with the package's EAGLE head: no SD, EAGLE at k = 3, 1, 5, 2,
n-gram at one k (V1: V2 does not support it; prompt lookup 3..7 as the study) and the 0.5B draft model at one k.
One engine per configuration serves both workloads (engine starts cost 40-90 s): code-edit then sharegpt, bs 1 /
8 / 32 / 64, ``repeats`` timed passes after one warm-up pass per shape (``jobs._hybrid_task``). Every run records
tok/s (output tokens over wall time, and vLLM's own ``vllm:generation_tokens`` counter), vLLM's spec-decode
counters (drafts, draft tokens, accepted tokens, accepted per position: ``llm.get_metrics()`` diffed around the
run) and what ran (runner, async scheduling, instrumented: ``labels``).

    python -m spec_repro.engines.vllm.v2grid plan                        # CPU: the specs, seconds, what is deferred
    python -m spec_repro.engines.vllm.v2grid run --head DIR --out $OUT --deadline 1000
    python -m spec_repro.engines.vllm.v2grid run --co-resident ...     # no SD and EAGLE resident, runs rotated
    python -m spec_repro.engines.vllm.v2grid table --out $OUT            # per configuration, workload, batch size
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PLAN = ROOT / "gpu" / "plans" / "v2grid.json"
MODEL, DRAFT_MODEL = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"
WORKLOADS = ("code-edit", "sharegpt")        # in run order: code-edit first
BATCH_SIZES = (1, 8, 32, 64)                  # in run order: bs 1 first
EAGLE_KS = (3, 1, 5, 2)                       # k = 3 first (the study's), then the rest
NGRAM_K = 5                                   # as the committed V1 n-gram runs (data/gpu/v1-runner): comparable
DRAFT_K = 3
# a run is host-contended when the hypervisor stole at least this share of its wall time (summed over vCPUs):
# on the lent H200 the same no-SD engine configuration, started twice, ran 0.65-0.81x as fast at a steal share of
# 0.11-0.30 as at ~0
CLEAN_STEAL = 0.01


def grid_specs(head: str, *, model_dir: str | None = None, draft_dir: str | None = None, repeats: int = 3,
               max_tokens: int = 256, prompts_per_bs: int = 8, workloads=WORKLOADS, batch_sizes=BATCH_SIZES,
               eagle_ks=EAGLE_KS, ngram_k: int = NGRAM_K, draft_k: int | None = DRAFT_K) -> list[dict]:
    """The engine specs in priority order: no SD, EAGLE at ``eagle_ks[0]``, n-gram, EAGLE at the other k, the
    draft model (``draft_k=None``: left out). Every spec is vLLM's own configuration (``engine_config="default"``,
    uninstrumented) running ``jobs.hybrid_specs``'s task (the workloads' first prompts, chunks of B, a warm-up pass
    then ``repeats`` timed ones, greedy, EOS ignored, outputs kept). Names ``v2grid-<method>-k<k>``. Pure."""
    from .jobs import hybrid_specs

    if repeats < 3:
        raise ValueError(f"repeats must be >= 3 (a spread to read), got {repeats}")
    base = hybrid_specs(head, model_dir=model_dir, methods=("none",), repeats=repeats, max_tokens=max_tokens,
                        prompts_per_bs=prompts_per_bs, workloads=workloads, batch_sizes=batch_sizes,
                        engine_config="default")[0]
    if draft_dir is None and draft_k is not None:
        from ... import models

        draft_dir = str(models.converted_dir(DRAFT_MODEL))

    def spec(method: str, k: int, **cfg) -> dict:
        c = {**base["config"], "method": method, "k": int(k), **cfg}
        return {**base, "name": f"v2grid-{method}-k{k if method != 'none' else 0}", "config": c,
                "tasks": [dict(t) for t in base["tasks"]]}

    ks = [int(k) for k in eagle_ks]
    specs = [spec("none", 0), spec("eagle", ks[0], draft=str(head)), spec("ngram", ngram_k)]
    specs += [spec("eagle", k, draft=str(head)) for k in ks[1:]]
    if draft_k is not None:
        specs.append(spec("draft_model", draft_k, draft=str(draft_dir)))
    for s in specs:
        s["config"].pop("step_log", None)
        assert s["instrumented"] is False and s["config"]["model_runner"] == "default"
    return specs


# ---- the plan ---------------------------------------------------------------------------------------------------
def load_plan(path: str | Path = PLAN) -> dict:
    return json.loads(Path(path).read_text())


def engine_seconds(spec: dict, plan: dict) -> float:
    """A spec's device seconds: the engine start plus its runs per workload (the plan's measured prices)."""
    es = plan["engine_seconds"]
    t = next(x for x in spec["tasks"] if x["type"] == "hybrid")
    return es["start_s"] + len(t["workloads"]) * es["per_workload_s"][spec["config"]["method"]]


def plan_rows(specs: list[dict], plan: dict | None = None) -> dict:
    """The plan priced: per stage and engine its calls and seconds, the total of what runs and what the plan
    defers (``deferred``: specs left to a later run, with the cache pieces they need)."""
    plan = plan or load_plan()
    deferred = {d["spec"]: d for d in plan.get("deferred", [])}
    rows, total = [], 0.0
    for st in plan["stages"]:
        if st.get("engines"):
            for s in specs:
                sec = engine_seconds(s, plan)
                rows.append({"stage": f"engine {s['name']}", "calls": 0, "seconds": sec,
                             "deferred": s["name"] in deferred})
                total += 0 if s["name"] in deferred else sec
            continue
        sec = st.get("seconds", st.get("seconds_each", 0) * st["calls"])
        rows.append({"stage": st["stage"], "calls": st["calls"], "seconds": sec, "deferred": False})
        total += sec
    extra = sum(5 * d.get("pieces", 0) + engine_seconds(next(s for s in specs if s["name"] == n), plan)
                for n, d in deferred.items() if any(s["name"] == n for s in specs))
    return {"rows": rows, "total_s": total, "limit_s": plan["limit_s"], "fits": total <= plan["limit_s"],
            "deferred": sorted(deferred), "deferred_s": extra}


# ---- rows from the results --------------------------------------------------------------------------------------
def grid_rows(records: list[dict]) -> list[dict]:
    """One row per timed run of a results.jsonl (``run`` records) with what ran (``labels.run_labels`` from its
    engine's config and resolved settings), tok/s from the output tokens and wall time, vLLM's generation-token
    counter beside it, and acceptance from vLLM's spec-decode counters: acceptance length 1 + accepted / drafts,
    rate accepted / draft tokens, per-position rates accepted_per_pos / drafts. ``engine``: ``<spec>#<n>``, the
    n-th engine of that spec in the records (the same configuration started again); ``steal_share``: the
    hypervisor's steal time over the run (/proc/stat, all vCPUs) per second of its wall time."""
    from .labels import run_labels

    engines, seen, eng_of = {}, {}, {}
    rows = []
    for r in records:
        if r.get("kind") == "engine":               # an engine's runs follow its record: name it spec#n
            seen[r["spec"]] = seen.get(r["spec"], 0) + 1
            eng_of[r["spec"]] = f"{r['spec']}#{seen[r['spec']]}"
            engines[r["spec"]] = r
        if r.get("kind") != "run":
            continue
        e = engines.get(r["spec"], {})
        steal = r.get("host_steal_s")
        cfg = r.get("config") or e.get("config") or {}
        drafts = r.get("num_drafts") or 0
        rows.append({"engine": eng_of.get(r["spec"], f"{r['spec']}#1"), "spec": r["spec"],
                     "method": cfg.get("method"), "k": r.get("k"), "workload": r.get("workload"),
                     "batch_size": r.get("batch_size"), "repeat": r.get("repeat"), "chunk": r.get("chunk"),
                     "output_tokens": r.get("output_tokens"),
                     "vllm_generation_tokens": r.get("vllm_generation_tokens"), "wall_s": r.get("wall_s"),
                     "tok_s": r["output_tokens"] / r["wall_s"] if r.get("wall_s") else None,
                     "num_drafts": drafts, "num_draft_tokens": r.get("num_draft_tokens") or 0,
                     "num_accepted_tokens": r.get("num_accepted_tokens") or 0,
                     "accepted_per_pos": list(r.get("accepted_per_pos") or []),
                     "acceptance_length": 1 + (r.get("num_accepted_tokens") or 0) / drafts if drafts else None,
                     "acceptance_rate": ((r.get("num_accepted_tokens") or 0) / r["num_draft_tokens"]
                                         if r.get("num_draft_tokens") else None),
                     "per_position_rate": [a / drafts for a in r.get("accepted_per_pos") or []] if drafts else [],
                     "host_steal_s": steal,
                     "steal_share": steal / r["wall_s"] if steal is not None and r.get("wall_s") else None,
                     "instrumented": bool(r.get("instrumented")), "group": r.get("group"),
                     **run_labels(cfg, e)})
    return rows


def grid_table(rows: list[dict]):
    """Per engine (a configuration's n-th start), workload and batch size: tok/s per repeat (its chunks' tokens
    over their wall time), mean / min / max over repeats, the hypervisor's steal share (mean over repeats) and the
    repeats free of it (``clean_repeats``: steal under ``CLEAN_STEAL`` of the wall time), acceptance length over
    all its drafts, and the labels of what ran."""
    import pandas as pd

    df = pd.DataFrame(rows)
    if "engine" not in df:
        df["engine"] = df["spec"] + "#1"
    if "host_steal_s" not in df:
        df["host_steal_s"] = float("nan")
    if "group" not in df:
        df["group"] = None
    keys = ["engine", "spec", "method", "k", "workload", "batch_size"]
    lab = ["runner", "async_scheduling", "instrumented", "engine_config", "group"]
    g = df.groupby(keys + ["repeat"] + lab, dropna=False).agg(
        tokens=("output_tokens", "sum"), wall=("wall_s", "sum"), acc=("num_accepted_tokens", "sum"),
        drafts=("num_drafts", "sum"), steal=("host_steal_s", "sum")).reset_index()
    g["tok_s"] = g["tokens"] / g["wall"]
    g["steal_share"] = g["steal"] / g["wall"]
    g["clean"] = g["steal_share"] < CLEAN_STEAL
    t = g.groupby(keys + lab, dropna=False, sort=False).agg(
        tok_s=("tok_s", "mean"), tok_s_min=("tok_s", "min"), tok_s_max=("tok_s", "max"), repeats=("tok_s", "size"),
        steal_share=("steal_share", "mean"), clean_repeats=("clean", "sum"),
        acc=("acc", "sum"), drafts=("drafts", "sum")).reset_index()
    t["acceptance_length"] = (1 + t["acc"] / t["drafts"]).where(t["drafts"] > 0)
    return t.drop(columns=["acc", "drafts"])


def ratio_table(table):
    """Each engine's tok/s over no SD's (the same workload and batch size, one machine): the mean over repeats, and
    the extremes' ratio range (its min over no SD's max, its max over no SD's min). An engine resident in a group
    beside a no-SD engine (``cogrid``: runs rotated, a host epoch falls on both alike) is divided by that engine
    (``baseline`` "co-resident"); any other by the separately started no-SD engine with the least steal share
    (``baseline`` "separate"); ``none_steal_share``: the baseline's steal share at that point (rotation spreads
    the host's epochs over the group's runs, three repeats do not even them out). ``contended``: a separate
    engine's runs had a mean steal share of at least ``CLEAN_STEAL`` at that point (its ratio understates what an
    uncontended host gives)."""
    import pandas as pd

    nones = table[table["method"] == "none"]
    alone = nones[nones["group"].isna()]
    steal = (alone if len(alone) else nones).groupby("engine")["steal_share"].mean().sort_values()
    best = steal.index[0]
    in_group = {g: e for g, e in zip(nones["group"], nones["engine"]) if pd.notna(g)}
    t = table[table["method"] != "none"].copy().reset_index(drop=True)
    co = [pd.notna(g) and g in in_group for g in t["group"]]
    t["none_engine"] = [in_group[g] if c else best for g, c in zip(t["group"], co)]
    t["baseline"] = ["co-resident" if c else "separate" for c in co]
    base = nones.set_index(["engine", "workload", "batch_size"])
    b = base.reindex(list(zip(t["none_engine"], t["workload"], t["batch_size"])))
    t["none_tok_s"] = b["tok_s"].to_numpy()
    t["none_steal_share"] = b["steal_share"].to_numpy()
    t["ratio"] = t["tok_s"] / t["none_tok_s"]
    t["ratio_lo"] = t["tok_s_min"] / b["tok_s_max"].to_numpy()
    t["ratio_hi"] = t["tok_s_max"] / b["tok_s_min"].to_numpy()
    t["contended"] = (t["steal_share"] >= CLEAN_STEAL) & (t["baseline"] == "separate")
    return t


FILES = {"runs.csv": "one row per timed chunk: what ran (labels), tok/s, vLLM's counters, the hypervisor's steal",
         "table.csv": "per engine, workload and batch size: tok/s over repeats, steal share, acceptance length",
         "ratios.csv": "each engine's tok/s over the least-contended no-SD engine's, with the contended flag",
         "results.jsonl.gz": "the job's raw records (engines, runs with their outputs), in the order they ran"}


def summarize(raw, out: str | Path, command: str = "") -> dict:
    """``data/gpu/v2grid/`` from device folders holding the job's ``results.jsonl`` (in the order they ran):
    ``runs.csv`` (one row per timed run, ``grid_rows``), ``table.csv`` (``grid_table``), ``ratios.csv``
    (``ratio_table``), the raw records (``results.jsonl.gz``: every run's outputs kept) and ``MANIFEST.json`` (each
    file's sha256 and what it holds, the engines, the command). Written into a stage folder first: a failure
    leaves ``out`` as it was; ``out`` may not overlap a raw folder (``summary.check_raw_out``)."""
    import gzip

    from ...fetch import sha256_file
    from ...io import staged_dir
    from .summary import check_raw_out

    raws = [raw] if isinstance(raw, (str, Path)) else list(raw)
    check_raw_out(raws, out)
    srcs = [Path(r) / "results.jsonl" for r in raws]
    for src in srcs:
        if not src.is_file():
            raise FileNotFoundError(f"{src}: no such file (the v2grid job's results)")
    text = "".join(src.read_text() for src in srcs)          # in the order given: the engines' order
    recs = [json.loads(x) for x in text.splitlines() if x.strip()]
    rows = grid_rows(recs)
    if not rows:
        raise ValueError(f"{', '.join(map(str, srcs))}: no timed runs")
    import pandas as pd

    runs = pd.DataFrame(rows)
    for c in ("accepted_per_pos", "per_position_rate"):
        runs[c] = runs[c].map(json.dumps)
    table = grid_table(rows)
    ratios = ratio_table(table)
    with staged_dir(out) as st:
        runs.to_csv(st / "runs.csv", index=False)
        table.to_csv(st / "table.csv", index=False, float_format="%.6g")
        ratios.to_csv(st / "ratios.csv", index=False, float_format="%.6g")
        with gzip.GzipFile(st / "results.jsonl.gz", "wb", mtime=0) as f:
            f.write(text.encode())
        engines = [{k: r.get(k) for k in ("spec", "start_s", "instrumented", "resolved", "vllm", "env")}
                   for r in recs if r.get("kind") == "engine"]
        old = json.loads((st / "MANIFEST.json").read_text()) if (st / "MANIFEST.json").is_file() else {}
        kept = {k: v for k, v in old.items() if isinstance(v, dict) and "file" in v and k not in FILES
                and (Path(out) / v["file"]).is_file()}       # files others write beside (v2fit's predicted.csv)
        man = {"what": __doc__.splitlines()[0], "command": command, "sources": [str(x) for x in srcs], **kept,
               "engines": engines, "not_run": [r for r in recs if r.get("kind") in ("spec_skipped", "spec_failed",
                                                                                    "engine_error")],
               **{p.name: {"file": p.name, "sha256": sha256_file(p), "what": FILES[p.name]}
                  for p in sorted(st.iterdir()) if p.name in FILES}}
        (st / "MANIFEST.json").write_text(json.dumps(man, indent=1, default=str) + "\n")
    return {"runs": len(runs), "configurations": int(table["spec"].nunique())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spec_repro.engines.vllm.v2grid", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("plan", "run"):
        p = sub.add_parser(name)
        p.add_argument("--head", default="HEAD", help="the package's EAGLE head for Qwen2.5-Coder-1.5B (a dir)")
        p.add_argument("--model-dir", help="default: spec_repro.models.converted_dir('qwen2.5-coder-1.5b')")
        p.add_argument("--draft-dir", help="default: spec_repro.models.converted_dir('qwen2.5-coder-0.5b')")
        p.add_argument("--repeats", type=int, default=3)
        p.add_argument("--ngram-k", type=int, default=NGRAM_K)
        p.add_argument("--draft-k", type=int, default=DRAFT_K, help="0: no draft-model engine")
        p.add_argument("--only", nargs="*", help="these spec names only")
        if name == "run":
            p.add_argument("--out", required=True)
            p.add_argument("--timeout", type=float, default=600, help="seconds per engine spec")
            p.add_argument("--deadline", type=float, help="seconds from now for the whole job")
            p.add_argument("--co-resident", action="store_true", help="no SD and EAGLE's engines resident together, "
                           "runs rotated (cogrid); their specs again after, for a group that fails to start")
            p.add_argument("--memory-each", type=float, default=0.15, help="each resident engine's "
                           "gpu_memory_utilization")
    t = sub.add_parser("table")
    t.add_argument("--out", required=True, help="the job's folder (its results.jsonl)")
    sm = sub.add_parser("summarize")
    sm.add_argument("--raw", required=True, nargs="+", help="the job's folder(s) from the device (each with its "
                    "results.jsonl), in the order their engines ran")
    sm.add_argument("--out", default=str(ROOT / "data" / "gpu" / "v2grid"))
    a = ap.parse_args(argv)
    if a.cmd == "summarize":
        from ...io import OutputError

        missing = [r for r in a.raw if not (Path(r) / "results.jsonl").is_file()]
        if missing:
            print(f"v2grid summarize: no results.jsonl in --raw {' '.join(missing)}", file=sys.stderr)
            return 2
        command = " ".join(["python -m spec_repro.engines.vllm.v2grid", *sys.argv[1:]])
        try:
            print(json.dumps(summarize(a.raw, a.out, command)))
        except (OutputError, ValueError) as e:   # --out overlapping --raw or unwritable; raw without timed runs
            print(f"v2grid summarize: {e}", file=sys.stderr)
            return 2
        return 0
    if a.cmd == "table":
        if not (Path(a.out) / "results.jsonl").is_file():
            print(f"v2grid table: no results.jsonl in {a.out}", file=sys.stderr)
            return 2
        recs = [json.loads(x) for x in open(Path(a.out) / "results.jsonl") if x.strip()]
        print(grid_table(grid_rows(recs)).to_string(index=False))
        return 0
    specs = grid_specs(a.head, model_dir=a.model_dir or ("MODEL" if a.cmd == "plan" else None),
                       draft_dir=a.draft_dir or ("DRAFT" if a.cmd == "plan" else None), repeats=a.repeats,
                       ngram_k=a.ngram_k, draft_k=a.draft_k or None)
    if a.only:
        specs = [s for s in specs if s["name"] in a.only]
    if a.cmd == "plan":
        p = plan_rows(specs)
        for r in p["rows"]:
            print(json.dumps(r))
        print(json.dumps({k: v for k, v in p.items() if k != "rows"}))
        return 0 if p["fits"] else 1
    from .jobs import run_specs

    if a.co_resident:
        from .cogrid import group_spec

        co = [s for s in specs if s["config"]["method"] in ("none", "eagle")]
        try:
            group = {**group_spec(co, a.memory_each), "timeout_s": a.timeout * len(co)}
        except ValueError as e:
            print(f"v2grid run --co-resident: {e}", file=sys.stderr)
            return 2
        specs = [group] + specs            # members finished by the group are skipped (their done records)
    return run_specs(specs, Path(a.out), a.timeout, False, None, a.deadline)


if __name__ == "__main__":
    sys.exit(main())
