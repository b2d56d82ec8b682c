"""What the Qwen EAGLE head's continuation (``gpu/head_job.sh`` with ``INIT=data/heads/qwen2.5-coder-1.5b-eagle``
and the committed decodes file) trains on, computed on the CPU with the tokenizer alone (no model, no decode).

The run's split (:func:`spec_repro.train.split_by_source` with head_job.sh's arguments: seed 0, the evaluation sets
of :data:`spec_repro.train.EVAL_SETS`, 1,024-token prompts, ``sharegpt sharegpt-turns py-functions py-write``,
20,000 prompts each, ``sharegpt-turns`` 5,000) is compared with the decodes file's prompt keys: how many of the
split's prompts the file holds and lacks. Then :func:`spec_repro.train.decodes_training`, what such a run trains
on: the file's decodes whose prompts the current workloads rebuild, less those now in an evaluation source. The
decodes whose prompts no current workload builds are rebuilt as the head's split built them (ShareGPT parts' first
human turns, no history) and checked against the evaluation sources too.

    PYTHONPATH=. python benchmarks/continuation_decodes.py     # a few minutes on 2 cores (~65k prompts tokenized)

Prints one JSON object and writes it to ``benchmarks/results/continuation_decodes.json``.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DECODES = ROOT / "data" / "heads" / "decodes" / "qwen2.5-coder-1.5b" / "decodes.parquet.parts.json"
TARGET = "qwen2.5-coder-1.5b"
WORKLOADS = ["sharegpt", "sharegpt-turns", "py-functions", "py-write"]
TRAIN_N, TRAIN_N_FOR = 20000, {"sharegpt-turns": 5000}
META = {"target": TARGET, "max_new_tokens": 1024, "seed": 0, "engine": "vllm", "max_prompt_tokens": 1024}


def not_rebuilt(keys: set, tok) -> dict:
    """The decodes whose prompts no current workload builds, rebuilt as the head's split built them (ShareGPT
    parts' first human turns, :func:`benchmarks.sharegpt_pool.trained_prompts`), and how many of those share a
    source or normalized messages with an evaluation request now."""
    import importlib.util

    from spec_repro.train import _said, eval_requests
    from spec_repro.workloads import sharegpt

    spec = importlib.util.spec_from_file_location("sharegpt_pool", ROOT / "benchmarks" / "sharegpt_pool.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    raw = mod.raw_parts()
    found = mod.trained_prompts(raw, tok, keys)
    src = sharegpt.source_keys(sharegpt.conversations(raw))
    ev = eval_requests(tokenizer=tok)
    ev_src = {r.meta.get("source") for r in ev if r.dataset == "sharegpt"}
    said = {_said(r) for r in ev}
    in_eval = [p for p, m in found if src.get(sharegpt.base_id(p.split("#", 1)[0])) in ev_src
               or tuple(sharegpt.norm(x["content"]) for x in m) in said]
    from spec_repro.train import _prompt_key

    texts = [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for _, m in found]
    hit = {_prompt_key(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]} if texts else set()
    return {"decodes": len(keys), "rebuilt_as_sharegpt_parts_first_turns": len(hit & keys),
            "part_prompts_matching_them": len(found),
            "later_parts": sum(not p.endswith("_0") for p, _ in found), "in_an_evaluation_source": len(in_eval)}


def main() -> int:
    from transformers import AutoTokenizer

    from spec_repro import models
    from spec_repro.train import _decodes_table, _prompt_key, decodes_training, split_by_source

    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(models.convert(TARGET, quiet=True))
    keys = _decodes_table(DECODES, META)[0]
    split, facts = split_by_source(WORKLOADS, train_n=TRAIN_N, tokenizer=tok, seed=0, max_prompt_tokens=1024,
                                   train_n_for=TRAIN_N_FOR)
    t_split = time.time() - t0
    have = set(keys)
    per_w = {w: {"train_requests": len(split[w]),
                 "in_decodes": sum(_prompt_key(r.prompt_token_ids) in have for r in split[w])} for w in WORKLOADS}
    n = sum(v["train_requests"] for v in per_w.values())
    n_in = sum(v["in_decodes"] for v in per_w.values())
    prompts, outs, held, _, dfacts = decodes_training(DECODES, WORKLOADS, META, tokenizer=tok, seed=0,
                                                      max_prompt_tokens=1024)
    out = {"decodes_rows": len(keys), "split": {"train_requests": n, "in_decodes": n_in, "not_in_decodes": n - n_in,
                                                "per_workload": per_w},
           "decodes_training": {k: v for k, v in dfacts.items() if k not in ("why", "workload_versions")},
           "trained_output_tokens": sum(len(o) for o, h in zip(outs, held) if not h),
           "split_s": round(t_split, 1), "wall_s": round(time.time() - t0, 1)}
    out["not_rebuilt"] = not_rebuilt(set(keys) - {_prompt_key(x) for x in prompts}, tok)
    out["wall_s"] = round(time.time() - t0, 1)
    dest = ROOT / "benchmarks" / "results" / "continuation_decodes.json"
    dest.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
