"""vLLM's acceptance checked against this package's: vLLM's n-gram proposer replayed on recorded greedy outputs, the
plugin's per-request steps, and step-by-step agreement with a predictor (the replay or the torch engine's
profiler) and with the committed torch traces; the agreement runs on real weights (Qwen2.5-Coder-1.5B with the
package's EAGLE head, n-gram and the 0.5B draft model, each engine decoding the committed prompts with per-request
step logs): the prompts, the profiler's predictions on vLLM's outputs and the report.

    python -m spec_repro.engines.vllm.agreement prepare-prompts [--out F]   # CPU: the committed prompts file
    python -m spec_repro.engines.vllm.agreement predict --out DIR --head H  # GPU: DIR/predictions.json
    python -m spec_repro.engines.vllm.agreement report --out DIR            # CPU or GPU: DIR/qwen_agreement.json
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Iterable, Sequence

from ...paths import data_dir
from .common import prompt_hash

__all__ = ["ngram_propose", "predict_ngram_steps", "load_step_records", "request_steps", "ngram_agreement",
           "agreement", "token_agreement", "torch_profiler_predictor", "load_smollm2_steps", "compare_torch_traces",
           "AGREEMENT_PROMPTS", "prepare_prompts", "load_prompts", "agreement_outputs", "profile_outputs",
           "predictor_from_acc", "predict", "agreement_report"]

AGREEMENT_PROMPTS = Path(__file__).resolve().parents[3] / "data" / "gpu" / "qwen_agreement_prompts.jsonl"
AGREEMENT_MODEL, AGREEMENT_DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"
AGREEMENT_K = 5                  # the agreement engines' k (the hybrid's: the same engines run both)


# ---- n-gram acceptance: vLLM's proposer replayed on recorded outputs -----------------------------------------
def ngram_propose(context: Sequence[int], min_n: int, max_n: int, k: int, max_model_len: int | None = None) -> list[int]:
    """What vLLM 0.25's n-gram proposer drafts after ``context``: the package's lookup
    (``spec_repro.proposers.ngram.ngram_lookup``: the longest suffix n-gram, min_n <= n <= max_n, that occurred
    before; among equally long matches the EARLIEST occurrence; up to k tokens that followed it), with k capped
    as vLLM caps it at ``max_model_len``."""
    from ...proposers.ngram import ngram_lookup

    if max_model_len is not None:
        k = min(k, max_model_len - len(context))
    return ngram_lookup(context, k, min_n, max_n) if k > 0 else []


def predict_ngram_steps(prompt: Sequence[int], output: Sequence[int], positions: Iterable[int], *, k: int,
                        min_n: int = 3, max_n: int = 7) -> dict[int, tuple[int, int]]:
    """For each output position p (tokens generated before the step), (drafted, accepted) that vLLM's n-gram
    proposer would get on the greedy ``output``: draft from prompt + output[:p], accepted = leading matches
    with output[p:]."""
    res = {}
    for p in positions:
        ctx = list(prompt) + list(output[:p])
        d = ngram_propose(ctx, min_n, max_n, k)
        acc = 0
        for i, t in enumerate(d):
            if p + i < len(output) and output[p + i] == t:
                acc += 1
            else:
                break
        res[p] = (len(d), acc)
    return res


def load_step_records(path: str | Path) -> list[dict]:
    """The plugin's JSON lines as dicts, keeping every field (``traces.read_steps`` keeps the schema columns)."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def request_steps(records: Iterable[dict], prompts: dict[str, Sequence[int]]) -> dict[str, list[tuple]]:
    """Per prompt key, the steps vLLM ran for it: (position, drafted, accepted), in order. Requests are matched
    to ``prompts`` through the prompt hash the plugin records for new requests (needs detail on).

    Under async scheduling (records with ``outputs_known`` false) a step is logged before the previous step's
    tokens are known: its position is the scheduler's optimistic one (the previous step's true position plus the
    tokens it scheduled) and its accepted count is not in the record. Both are read back from the next steps:
    the true position of step i is ``pos[i + 1] - scheduled[i]`` and its accepted count ``q[i + 1] - q[i] - 1``,
    so a request's last two steps have no row (checked on the H200 run of data/gpu/v1-runner/agreement: 98% of
    EAGLE's steps agree
    with the profiler this way)."""
    by_hash = {prompt_hash(p): key for key, p in prompts.items()}
    rid_key: dict[tuple[str, str], str] = {}
    per: dict[tuple, list[tuple]] = {}    # per (run, request): (position, scheduled, drafted, accepted, known)
    for r in records:
        run = r.get("run_id", "")
        for rid, (plen, h) in (r.get("new_reqs") or {}).items():
            if h in by_hash:
                rid_key[(run, rid)] = by_hash[h]
        acc = r.get("accepted_per_req") or {}
        known = r.get("outputs_known", True)
        for rid, (pos, nsched, ndraft) in (r.get("req_info") or {}).items():
            key = rid_key.get((run, rid))
            if key is None or pos <= 0 or nsched != 1 + ndraft:
                continue              # prefill chunks and unmatched requests
            per.setdefault((run, rid, key), []).append((int(pos), int(nsched), int(ndraft), int(acc.get(rid, 0)),
                                                        bool(known)))
    out: dict[str, list[tuple]] = {}
    for (_, _, key), rows in per.items():
        if all(x[4] for x in rows):           # synchronous: positions and accepted counts as logged
            out.setdefault(key, []).extend((p, d, a) for p, _, d, a, _ in rows)
            continue
        # async (a request's last step may be logged with its outputs known, its position still optimistic)
        q = [rows[i + 1][0] - rows[i][1] for i in range(len(rows) - 1)]
        out.setdefault(key, []).extend((q[i], rows[i][2], q[i + 1] - q[i] - 1) for i in range(len(q) - 1))
    return out


def ngram_agreement(records: Iterable[dict], prompts: dict[str, Sequence[int]], outputs: dict[str, Sequence[int]],
                    *, k: int, min_n: int = 3, max_n: int = 7, predictor=None) -> dict:
    """Compare vLLM's per-step (drafted, accepted), from the plugin's records, with a prediction from the same
    greedy outputs (see ``agreement``)."""
    return agreement(request_steps(records, prompts), prompts, outputs, k=k, min_n=min_n, max_n=max_n,
                     predictor=predictor)


def agreement(steps: dict[str, list[tuple]], prompts: dict[str, Sequence[int]], outputs: dict[str, Sequence[int]],
              *, k: int, min_n: int = 3, max_n: int = 7, predictor=None) -> dict:
    """``steps[key] = [(position, drafted, accepted), ...]`` as vLLM ran them, against
    ``predictor(prompt, output, positions, k=, min_n=, max_n=) -> {pos: (drafted, accepted)}`` (default
    ``predict_ngram_steps``; ``torch_profiler_predictor`` is the torch engine's profiler). Accepted counts are
    compared after capping at the tokens left to generate (vLLM stops at max_tokens). Returns counts, agreement
    rates (all steps, and steps that drafted) and the first mismatches."""
    predictor = predictor or predict_ngram_steps
    n = agree_acc = agree_both = nd_steps = nd_agree = unpredicted = 0
    mism = []
    for key, rows in steps.items():
        out = list(outputs[key])
        pred = predictor(prompts[key], out, [p for p, _, _ in rows], k=k, min_n=min_n, max_n=max_n)
        for pos, nd, na in rows:
            left = len(out) - pos          # tokens vLLM still had to produce at this step
            if pos not in pred:            # a position the output does not reach: counted, not compared
                unpredicted += 1
                continue
            pd_, pa = pred[pos]
            pa_c, na_c = min(pa, max(left - 1, 0)), min(na, max(left - 1, 0))
            n += 1
            ok_acc = pa_c == na_c
            agree_acc += ok_acc
            agree_both += ok_acc and (pd_ == nd or left <= nd)
            if nd > 0:
                nd_steps += 1
                nd_agree += ok_acc and (pd_ == nd or left <= nd)
            if not ok_acc and len(mism) < 20:
                mism.append({"request": key, "position": pos, "vllm": [nd, na], "predicted": [pd_, pa]})
    return {"steps": n, "requests": len(steps), "unpredicted_steps": unpredicted, "accepted_agree": agree_acc,
            "drafted_and_accepted_agree": agree_both,
            "accepted_agreement_rate": agree_acc / n if n else math.nan,
            "full_agreement_rate": agree_both / n if n else math.nan,
            "steps_with_drafts": nd_steps, "drafted_steps_agree": nd_agree,
            "drafted_steps_agreement_rate": nd_agree / nd_steps if nd_steps else math.nan, "mismatches": mism}


def token_agreement(a: Sequence[int], b: Sequence[int]) -> dict:
    """Common-prefix length of two greedy outputs and whether they are identical over the shorter one."""
    m = min(len(a), len(b))
    i = 0
    while i < m and a[i] == b[i]:
        i += 1
    return {"common_prefix": i, "len_a": len(a), "len_b": len(b), "identical": i == m}


def torch_profiler_predictor(prompt, output, positions, *, k, min_n=3, max_n=7):
    """The torch engine's profiler (``spec_repro.profiler.ngram_acceptance``) on the same outputs, read the
    way the simulator reads it: the step at position p uses acc_len[p - 1]; drafts capped at k."""
    from ...profiler import ngram_acceptance

    acc, lens = ngram_acceptance(prompt, output, k_max=k, min_n=min_n, max_n=max_n)
    return {p: (int(min(lens[p - 1], k)), int(acc[p - 1]) - 1) for p in positions if 1 <= p <= len(output)}


def load_smollm2_steps(data_dir: str | Path = "data/gpu") -> tuple[dict, dict, dict]:
    """(steps, prompts, outputs) of the committed SmolLM2 run: ``smollm2_vllm_steps.csv`` (vLLM's per-request
    steps), ``smollm2_prompts.jsonl`` and ``smollm2_vllm_outputs.jsonl``, keyed by ``dataset/request_id``."""
    import pandas as pd

    d = Path(data_dir)
    df = pd.read_csv(d / "smollm2_vllm_steps.csv")
    steps = {key: list(zip(g["position"], g["drafted"], g["accepted"])) for key, g in df.groupby("key", sort=False)}
    prompts = {r["key"]: r["prompt_token_ids"] for r in map(json.loads, open(d / "smollm2_prompts.jsonl"))}
    outputs = {r["key"]: r["output_token_ids"] for r in map(json.loads, open(d / "smollm2_vllm_outputs.jsonl"))}
    return steps, prompts, outputs


def compare_torch_traces(outputs: dict, prompts: dict, per: dict, k: int, traces_dir: str | Path | None = None) -> dict:
    """vLLM's outputs and accepted counts against the torch engine's committed traces (data/traces/): greedy
    outputs agree up to the first differing token (numerics: vLLM float32 on the H200 vs torch float32 on a CPU);
    on the common prefix, the step at position p should accept min(acc_len[p-1] - 1, k) tokens."""
    from ...tracefiles import read_trace

    traces_dir = Path(traces_dir or data_dir() / "traces")
    files = sorted(traces_dir.glob("smollm2-135m__*.parquet"))
    if not files:
        return {"note": f"no torch traces under {traces_dir}"}
    n_req = identical = 0
    prefix_frac = []
    steps = agree = dsteps = dagree = 0
    for f in files:
        t = read_trace(f)
        if "ngram" not in t.proposers:
            continue
        arrays = t.arrays("ngram")
        req = t.requests.set_index("request_id")
        for (ds, model, rid), acc in arrays.items():
            key = f"{ds}/{rid}"
            if key not in outputs or "output_token_ids" not in req.columns:
                continue
            tout = list(req.loc[rid, "output_token_ids"])
            vout = outputs[key]
            ta = token_agreement(tout, vout)
            n_req += 1
            identical += ta["identical"]
            prefix_frac.append(ta["common_prefix"] / max(1, min(len(tout), len(vout))))
            for p, d, a in per.get(key, []):
                if p + d >= ta["common_prefix"] or p - 1 >= len(acc):
                    continue
                steps += 1
                ok = min(int(acc[p - 1]) - 1, k) == a
                agree += ok
                if d > 0:
                    dsteps += 1
                    dagree += ok
    return {"trace_files": [f.name for f in files], "requests": n_req, "identical_outputs": identical,
            "mean_common_prefix_fraction": sum(prefix_frac) / len(prefix_frac) if prefix_frac else None,
            "steps_on_common_prefix": steps, "accepted_agree": agree,
            "accepted_agreement_rate": agree / steps if steps else None,
            "steps_with_drafts": dsteps, "drafted_steps_agree": dagree,
            "drafted_steps_agreement_rate": dagree / dsteps if dsteps else None}


# ---- vLLM's own agreement runs: the prompts, the profiler's predictions on vLLM's outputs, the report ---------
def prepare_prompts(out: str | Path = AGREEMENT_PROMPTS, model: str = AGREEMENT_MODEL, workloads=("code-edit", "sharegpt",
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
    by_hash = {prompt_hash(p): key for key, p in prompts.items()}

    def predict(prompt, output, positions, *, k, min_n=3, max_n=7):
        acc, lens = acc_by_key[by_hash[prompt_hash(prompt)]]
        return {p: (int(min(lens[p - 1], k)) if lens else k, int(min(acc[p - 1] - 1, k)))
                for p in positions if 1 <= p <= len(acc)}
    return predict


AGREE_SPECS = {"hybrid-default-eagle": "eagle", "hybrid-default-ngram": "ngram", "agree-draft": "draft"}


def predict(out: str | Path, head: str, model: str = AGREEMENT_MODEL, draft_model: str = AGREEMENT_DRAFT,
            device: str = "cuda", k_max: int = 16) -> Path:
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
        k = AGREEMENT_K
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spec_repro.engines.vllm.agreement", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("prepare-prompts")
    pp.add_argument("--out", default=str(AGREEMENT_PROMPTS))
    pr = sub.add_parser("predict")
    pr.add_argument("--out", required=True)
    pr.add_argument("--head", required=True)
    ag = sub.add_parser("report")
    ag.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if a.cmd == "prepare-prompts":
        print(prepare_prompts(a.out))
    elif a.cmd == "predict":
        print(predict(a.out, a.head))
    else:
        for spec, r in agreement_report(a.out).items():
            v = r.get("vs_profiler") or {}
            print(spec, r["proposer"], "steps", v.get("steps"), "agree", v.get("accepted_agree"),
                  "rate", v.get("accepted_agreement_rate"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
