"""Issue 18's GPU session on one leased H200 (``gpu/live_job.sh``): the engine specs of each part in priority
order, their estimated seconds against the device budget, and the steps after the engines (the profiler's
predictions on vLLM's own outputs, agreement, lossless).

Parts, in the order they run (what a later session cannot recover, and what the issue's Must show needs, first):
  a  agreement on real weights: Qwen2.5-Coder-1.5B with the package's EAGLE head, n-gram and the 0.5B draft model,
     each engine decoding the committed agreement prompts with per-request step logs; the EAGLE and n-gram engines
     then run the hybrid task too (one engine start serves both); ``predict`` profiles vLLM's outputs with the
     package's profiler (torch, on the GPU), ``agreement`` compares step by step
  b  the live hybrid: no SD (plain greedy: the lossless reference), PR #24344's rule, its EAGLE-skipping variant
  c  Llama-3.1-8B dimensions, dummy weights, no SD: vLLM's default engine vs the study-like one (bs 1/16/64/256,
     512-token prompt, 256 tokens, every shape warmed, 3 repeats)
  d  EAGLE drafting time: the Qwen head at k = 1 and 12 (k = 5 from part a's engine)

    python -m spec_repro.engines.vllm.session plan [--budget 1650]     # CPU: the plan, its total; rc 1 if over
    python -m spec_repro.engines.vllm.session run PART --out DIR --deadline S --head H --model-dir M --draft-dir D
    python -m spec_repro.engines.vllm.session predict --out DIR --head H     # GPU: the profiler's predictions
    python -m spec_repro.engines.vllm.session agreement --out DIR           # CPU or GPU: DIR/qwen_agreement.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .jobs import LLAMA8B, ROOT, estimate_seconds, hybrid_plan, hybrid_specs, run_specs

__all__ = ["PARTS", "STAGING", "AGREEMENT_PROMPTS", "part_specs", "plan", "prepare_prompts",
           "predictor_from_acc", "agreement_report"]

BUDGET_S = 1800                  # the session's device seconds, staging included
PLAN_LIMIT_S = 1650              # what the plan may take (margin for polls and slow calls)
AGREEMENT_PROMPTS = ROOT / "data" / "gpu" / "qwen_agreement_prompts.jsonl"
QWEN, QWEN_DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"
K = 5                            # the hybrid's k; the agreement runs at the same k (same engines)
HYBRID_WORKLOADS = ("code-edit",)   # sharegpt: the second session (+5 engine starts' worth of runs)

# Fixed costs before the run stage, measured in earlier sessions (gpu/traces_job.sh's header): (stage, calls, s)
STAGING = [
    ("first call (machine start)", 1, 30),
    ("vllm c1..c7 (c6+c7 in one call)", 6, 40),
    ("cache pieces p00..p26 (60 MiB: 1,582 MiB gzip -1; data/ notebooks/ figures/ moved aside)", 27, 140),
    ("setup: install vLLM, reassemble + verify the cache, convert both GGUFs, plugin entry point", 1, 195),
]
PACK_S = 10                      # one pack call after each part
PREDICT_S = 90                   # part a: load the 1.5B (float32), the head and the 0.5B; teacher-forced passes


def _agreement_task(max_tokens: int = 256) -> dict:
    return {"type": "prompts", "prompts_file": str(AGREEMENT_PROMPTS), "max_tokens": max_tokens, "chunk": 40,
            "detail": True, "ignore_eos": False}


def part_specs(part: str, head: str = "HEAD", model_dir: str = "MODEL", draft_dir: str = "DRAFT") -> list[dict]:
    """The engine specs of one part (pure: nothing is loaded)."""
    if part in ("a", "b"):
        hy = {s["config"].get("hybrid") or s["config"]["method"]: s for s in hybrid_specs(
            head, model_dir=model_dir, k=K, workloads=HYBRID_WORKLOADS,
            methods=("none", "ngram", "eagle", "pr24344", "pr24344-skip"))}
        if part == "b":
            return [hy["none"], hy["pr24344"], hy["pr24344-skip"]]
        eagle, ngram = ({**hy[m], "tasks": [_agreement_task()] + hy[m]["tasks"]} for m in ("eagle", "ngram"))
        draft = {"name": "agree-draft", "engine_config": "default",
                 "config": {**hy["none"]["config"], "method": "draft_model", "k": K,
                            "draft": draft_dir},
                 "tasks": [_agreement_task()]}
        return [eagle, ngram, draft]
    if part == "c":
        task = {"type": "batches", "batch_sizes": [1, 16, 64, 256], "prompt_len": 512, "max_tokens": 256,
                "vocab_size": 128256, "repeats": 3, "warm_each": True}
        base = {"model": LLAMA8B, "method": "none", "load_format": "dummy", "max_model_len": 4096,
                "max_num_seqs": 256, "name": "llama31-8b", "gpu_memory_utilization": 0.85}
        return [{"name": "llama8b-none-default", "engine_config": "default", "tasks": [task],
                 "config": {**base, "async_scheduling": None, "model_runner": "default"}},
                {"name": "llama8b-none-study-like", "engine_config": "study-like", "tasks": [task],
                 "config": {**base, "async_scheduling": False, "model_runner": "v1"}}]
    if part == "d":
        task = {"type": "batches", "batch_sizes": [1, 8, 32, 64], "prompt_len": 512, "max_tokens": 128,
                "vocab_size": 151936, "repeats": 1, "warm_each": True}
        cfg = {"model": model_dir, "name": QWEN, "method": "eagle", "draft": head, "max_model_len": 4096,
               "max_num_seqs": 64, "async_scheduling": None, "gpu_memory_utilization": 0.85}
        return [{"name": f"draftk-qwen-eagle-k{k}", "engine_config": "default", "tasks": [task],
                 "config": {**cfg, "k": k}} for k in (1, 12)]
    raise ValueError(f"unknown part {part!r}; parts: {', '.join(PARTS)}")


PARTS = {"a": "EAGLE / n-gram / draft-model agreement on real weights (+ EAGLE and n-gram alone, hybrid task)",
         "b": "live hybrid: no SD, pr24344, pr24344-skip (code-edit, bs 1/8/32/64, k 5, 3 repeats); lossless",
         "c": "Llama-3.1-8B dims, dummy weights: default vs study-like engine, no SD, bs 1/16/64/256",
         "d": "EAGLE drafting time: the Qwen head at k = 1 and 12 (k = 5 from part a), bs 1/8/32/64"}
DEFERRED = ["hybrid and agreement on sharegpt (the hybrid specs' second workload)",
            "adaptive-rule hybrid (needs an H200 cost model fitted on this run's Qwen steps)",
            "EAGLE drafting time at k = 3, 8 (Qwen) and k = 1, 5, 8, 12 (Llama-3.1-8B dims)",
            "plugin overhead with the hybrid loaded but idle",
            "`spec-repro reproduce --profile gpu` end to end (its llama8b job: 3 engines, ~450 s)"]


def spec_seconds(spec: dict) -> float:
    """``jobs.estimate_seconds`` for hybrid tasks; prompts and batches tasks priced the same way."""
    t = estimate_seconds(spec)
    big = "llama" in spec["config"]["name"]
    step_s, per_seq_s = (0.005, 4e-5) if big else (0.006, 5e-5)
    tps = 1.0 if spec["config"]["method"] == "none" else 2.0
    for task in spec["tasks"]:
        if task["type"] == "prompts":       # chunks of `chunk` requests, max_tokens steps at most
            n = sum(1 for x in open(task["prompts_file"]) if x.strip()) if Path(task["prompts_file"]).exists() else 200
            c = task["chunk"]
            t += -(-n // c) * task["max_tokens"] / tps * (step_s + c * per_seq_s)
        elif task["type"] == "batches":
            passes = task.get("repeats", 1) + (1 if task.get("warm_each") else 0)
            for b in task["batch_sizes"]:
                prefill = b * task["prompt_len"] / 200_000          # ~200k prompt tokens/s
                t += passes * (prefill + task["max_tokens"] / tps * (step_s + b * per_seq_s))
    return t


def plan(budget: float = PLAN_LIMIT_S) -> dict:
    """The session's stages in order, with the engine specs and seconds of each part, the total and whether it fits
    ``budget``. Each part's hybrid specs are priced by ``jobs.hybrid_plan`` (``jobs hybrid --plan``)."""
    rows = [{"stage": s, "calls": c, "seconds": t} for s, c, t in STAGING]
    for part in PARTS:
        specs = part_specs(part)
        hp = {r["spec"]: r for r in hybrid_plan([s for s in specs if any(x["type"] == "hybrid" for x in s["tasks"])])}
        engines = []
        for s in specs:
            engines.append({"spec": s["name"], "method": s["config"]["method"], "hybrid": s["config"].get("hybrid"),
                            "engine_config": s.get("engine_config"), "tasks": [x["type"] for x in s["tasks"]],
                            "hybrid_runs": hp.get(s["name"], {}).get("runs", 0),
                            "seconds": round(spec_seconds(s))})
        secs = sum(e["seconds"] for e in engines) + (PREDICT_S if part == "a" else 0) + PACK_S
        rows.append({"stage": f"run part {part}: {PARTS[part]}", "calls": 1, "seconds": secs, "engines": engines})
    total = sum(r["seconds"] for r in rows)
    return {"stages": rows, "total_s": total, "budget_s": budget, "device_budget_s": BUDGET_S,
            "fits": total <= budget, "deferred": DEFERRED}


# ---- prompts, predictions, agreement ------------------------------------------------------------------------
def prepare_prompts(out: str | Path = AGREEMENT_PROMPTS, model: str = QWEN, workloads=("code-edit", "sharegpt",
                    "humaneval", "mt-bench", "gsm-symbolic"), n: int = 40, seed: int = 0,
                    max_prompt_tokens: int = 1024) -> Path:
    """Token-id prompts through ``model``'s chat template (its converted folder's tokenizer): each workload's first
    ``n`` by its seeded order, as ``collect`` selects them; eos ids for vLLM's stop."""
    from transformers import AutoTokenizer, GenerationConfig

    from ... import models
    from ... import workloads as W
    from ...io import atomic_write

    d = models.converted_dir(model)
    tok = AutoTokenizer.from_pretrained(d)
    gc = GenerationConfig.from_pretrained(d)
    eos = gc.eos_token_id if isinstance(gc.eos_token_id, list) else [gc.eos_token_id]
    eos = sorted({int(x) for x in eos if x is not None} | ({int(tok.eos_token_id)} if tok.eos_token_id is not None
                                                             else set()))
    with atomic_write(Path(out)) as f:
        for w in workloads:
            for r in W.load(w, n=n, seed=seed, tokenizer=tok, max_prompt_tokens=max_prompt_tokens):
                f.write(json.dumps({"key": f"{w}/{r.id}", "dataset": w, "request_id": str(r.id),
                                    "prompt_token_ids": list(map(int, r.prompt_token_ids)), "eos": eos}) + "\n")
    return Path(out)


def load_prompts(path: str | Path = AGREEMENT_PROMPTS) -> dict[str, list[int]]:
    return {r["key"]: r["prompt_token_ids"] for r in map(json.loads, open(path)) if r}


def agreement_outputs(results: str | Path) -> dict[str, dict[str, list[int]]]:
    """Per spec, its agreement runs' greedy outputs by prompt key (``results.jsonl`` records of task prompts)."""
    out: dict = {}
    for line in open(results):
        d = json.loads(line)
        if d.get("kind") == "run" and d.get("task") == "prompts":
            out.setdefault(d["spec"], {}).update(dict(zip(d["keys"], d["outputs"])))
    return out


def profile_outputs(prompts: dict, outputs: dict, proposers: dict, k_max: int = 16) -> dict:
    """``profiler.profile_decoded`` on vLLM's outputs: {proposer: {key: [acc_len, draft_len] per position}}."""
    from ...profiler import profile_decoded

    keys = [k for k in outputs if k in prompts]
    profs = profile_decoded([prompts[k] for k in keys], [outputs[k] for k in keys], proposers, k_max=k_max)
    return {name: {k: [list(map(int, p.acc[name])), list(map(int, p.draft_len.get(name) or []))]
                   for k, p in zip(keys, profs)} for name in proposers}


def predictor_from_acc(acc_by_key: dict, prompts: dict):
    """A predictor for ``agreement.agreement`` from profiled acceptance: the step at position p accepts
    min(acc_len[p-1] - 1, k) and drafts min(draft_len[p-1], k) (k where the profile keeps no draft lengths: a
    model drafter always drafts k), as ``agreement.torch_profiler_predictor`` reads the n-gram profile."""
    from .plugin import prompt_hash

    by_hash = {prompt_hash(p): key for key, p in prompts.items()}

    def predict(prompt, output, positions, *, k, min_n=3, max_n=7):
        acc, lens = acc_by_key[by_hash[prompt_hash(prompt)]]
        return {p: (int(min(lens[p - 1], k)) if lens else k, int(min(acc[p - 1] - 1, k)))
                for p in positions if 1 <= p <= len(acc)}
    return predict


AGREE_SPECS = {"hybrid-default-eagle": "eagle", "hybrid-default-ngram": "ngram", "agree-draft": "draft"}


def predict(out: str | Path, head: str, model: str = QWEN, draft_model: str = QWEN_DRAFT, device: str = "cuda",
            k_max: int = 16) -> Path:
    """The package's profiler on each agreement engine's own outputs (GPU): ``out/predictions.json``."""
    from ... import models
    from ...collect import build_proposers

    out = Path(out)
    prompts = load_prompts()
    outs = agreement_outputs(out / "results.jsonl")
    target, _ = models.load(model, device=device)
    drafter = models.load(draft_model, device=device)[0] if "agree-draft" in outs else None
    res = {}
    for spec, proposer in AGREE_SPECS.items():
        if spec in outs:
            props = build_proposers([proposer], target, draft_model=drafter, eagle_head=head)
            res[spec] = profile_outputs(prompts, outs[spec], props, k_max=k_max)[next(iter(props))]
    path = out / "predictions.json"
    path.write_text(json.dumps({"model": model, "draft_model": draft_model, "head": str(head), "k_max": k_max,
                                "dtype": str(target.dtype), "specs": res}))
    return path


def agreement_report(out: str | Path, prompts: dict | None = None) -> dict:
    """vLLM's accepted tokens per step (the plugin's per-request steps) against the profiler's prediction on the
    same outputs (``predictions.json``), per agreement spec; n-gram also against vLLM's proposer replayed
    (``agreement.predict_ngram_steps``). Also vLLM's own counters beside the step log's sum."""
    from .agreement import agreement, load_step_records, predict_ngram_steps, request_steps

    out = Path(out)
    prompts = prompts or load_prompts()
    outs = agreement_outputs(out / "results.jsonl")
    pred_f = out / "predictions.json"
    preds = json.loads(pred_f.read_text())["specs"] if pred_f.exists() else {}
    counters: dict = {}
    for line in open(out / "results.jsonl"):
        d = json.loads(line)
        if d.get("kind") == "run" and d.get("task") == "prompts":
            c = counters.setdefault(d["spec"], {"num_accepted_tokens": 0, "num_drafts": 0})
            c["num_accepted_tokens"] += d["num_accepted_tokens"]
            c["num_drafts"] += d["num_drafts"]
    rep = {}
    for spec, proposer in AGREE_SPECS.items():
        if spec not in outs:
            continue
        recs = [r for r in load_step_records(out / f"steps_{spec}.jsonl") if r.get("req_info")]
        steps = request_steps(recs, prompts)
        k = K
        r = {"proposer": proposer, "k": k, "requests": len(outs[spec]), "vllm_counters": counters.get(spec),
             "step_log_accepted": sum(a for rows in steps.values() for _, _, a in rows)}
        sub = {key: steps[key] for key in steps if key in outs[spec]}
        if spec in preds:
            r["vs_profiler"] = agreement(sub, prompts, outs[spec], k=k,
                                         predictor=predictor_from_acc(preds[spec], prompts))
        if proposer == "ngram":
            r["vs_replica"] = agreement(sub, prompts, outs[spec], k=k, predictor=predict_ngram_steps)
        rep[spec] = r
    (out / "qwen_agreement.json").write_text(json.dumps(rep, indent=1, default=float) + "\n")
    return rep


# ---- command line ---------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spec_repro.engines.vllm.session", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan")
    p.add_argument("--budget", type=float, default=PLAN_LIMIT_S)
    p.add_argument("--json", action="store_true")
    r = sub.add_parser("run")
    r.add_argument("part", choices=sorted(PARTS))
    for a in ("--out", "--head", "--model-dir", "--draft-dir"):
        r.add_argument(a, required=True)
    r.add_argument("--deadline", type=float)
    r.add_argument("--timeout", type=float, default=600)
    pr = sub.add_parser("predict")
    pr.add_argument("--out", required=True)
    pr.add_argument("--head", required=True)
    ag = sub.add_parser("agreement")
    ag.add_argument("--out", required=True)
    pp = sub.add_parser("prepare-prompts")
    pp.add_argument("--out", default=str(AGREEMENT_PROMPTS))
    a = ap.parse_args(argv)
    if a.cmd == "plan":
        pl = plan(a.budget)
        if a.json:
            print(json.dumps(pl, indent=1))
        else:
            for row in pl["stages"]:
                print(f"{row['seconds']:>6.0f} s  {row['calls']:>3} call(s)  {row['stage']}")
                for e in row.get("engines", []):
                    print(f"{'':>8}{e['seconds']:>6.0f} s  {e['spec']}  [{e['engine_config']}; "
                          f"{' + '.join(e['tasks'])}; {e['hybrid_runs']} hybrid runs]")
            print(f"{pl['total_s']:>6.0f} s  total (plan limit {pl['budget_s']:.0f} s of {pl['device_budget_s']} s)")
            print("deferred to a second session:", *pl["deferred"], sep="\n  - ")
        if not pl["fits"]:
            print(f"OVER BUDGET: {pl['total_s']:.0f} s > {pl['budget_s']:.0f} s", file=sys.stderr)
            return 1
        return 0
    if a.cmd == "run":
        specs = part_specs(a.part, a.head, a.model_dir, a.draft_dir)
        return run_specs(specs, Path(a.out), a.timeout, False, None, a.deadline)
    if a.cmd == "predict":
        print(predict(a.out, a.head))
        return 0
    if a.cmd == "agreement":
        rep = agreement_report(a.out)
        for spec, r in rep.items():
            v = r.get("vs_profiler") or {}
            print(spec, r["proposer"], "steps", v.get("steps"), "agree", v.get("accepted_agree"),
                  "rate", v.get("accepted_agreement_rate"))
        return 0
    if a.cmd == "prepare-prompts":
        print(prepare_prompts(a.out))
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
