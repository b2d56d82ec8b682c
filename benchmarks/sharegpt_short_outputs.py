"""How many of the sharegpt workload's evaluation requests Qwen2.5-Coder-1.5B-Instruct answers in fewer than 32
tokens (``metrics.MIN_OUTPUT_LEN``): the check, before a GPU decode, that a draw of ``n`` requests leaves at least
300 outputs of 32+ tokens.

Each request of ``load("sharegpt", n, tokenizer=Qwen's, max_prompt_tokens=1024)`` gets its output length from
(1) the committed Qwen sharegpt trace (vLLM 0.25, bf16, greedy, to EOS) where a request there has the same prompt
token ids, else (2) a greedy decode of at most 32 new tokens on this machine's CPU (the de-quantized GGUF in
float32, Hugging Face ``generate``): ``short`` is whether it stopped before 32 tokens. ``--check K`` also decodes
K of the requests that (1) covers, on the CPU, and reports how often the two agree on ``short`` (float32 on a CPU
and bf16 on vLLM may part at near-ties).

    PYTHONPATH=. python benchmarks/sharegpt_short_outputs.py -n 400 --check 20    # 4-30 s a request on 2 cores

Resumable: each CPU decode is appended to ``benchmarks/results/sharegpt_short_outputs.jsonl`` (keyed by the
prompt's token ids, as ``spec_repro.train`` keys its decodes) as it finishes; the summary goes to
``benchmarks/results/sharegpt_short_outputs.json``.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RES = ROOT / "benchmarks" / "results"
MODEL, TRACE = "qwen2.5-coder-1.5b", ROOT / "data" / "traces" / "qwen2.5-coder-1.5b__sharegpt.parquet"
PROMPT_CAP = 1024
sys.path.insert(0, str(ROOT))
from spec_repro.metrics import MIN_OUTPUT_LEN as MIN_LEN  # noqa: E402  (32: shorter outputs are reported apart)
from spec_repro.train import _prompt_key as key  # noqa: E402  (a prompt's key, as the decodes files key them)


def traced() -> dict[str, dict]:
    """{prompt key: the committed trace's request (id, output_len)}."""
    import pandas as pd

    t = pd.read_parquet(TRACE, columns=["request_id", "proposer", "position", "prompt_token_ids", "output_len",
                                       "output_text"])
    t = t[(t["proposer"] == t["proposer"].iloc[0]) & (t["position"] == 0)]
    return {key(r.prompt_token_ids): {"id": r.request_id, "output_len": int(r.output_len),
                                      "output_text": r.output_text} for r in t.itertuples()}


KINDS = {"refusal": re.compile(r"(can't|cannot|not able to|unable to) (assist|help|provide)", re.I),
         "waits for the input": re.compile(r"please (provide|go ahead|proceed|let me know)|provide (me with )?(more|"
                                           r"the)|more (context|information)|how can i (assist|help)|ready", re.I),
         "acknowledgement": re.compile(r"^(acknowledged|yes, i understand|understood)", re.I)}


def kinds(texts: list[str]) -> dict[str, int]:
    """Short outputs by what they say (the first kind that matches; ``other``: a short answer, e.g. one word)."""
    out = dict.fromkeys([*KINDS, "other"], 0)
    for t in texts:
        out[next((k for k, rx in KINDS.items() if rx.search(t or "")), "other")] += 1
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=400, help="requests of the workload's draw (seed 0; default 400, the "
                    "Qwen trace's)")
    ap.add_argument("--check", type=int, default=0, help="also decode this many trace-covered requests")
    a = ap.parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from spec_repro import models, workloads

    src = models.convert(MODEL, quiet=True)
    tok = AutoTokenizer.from_pretrained(src)
    reqs = workloads.load("sharegpt", n=a.n, seed=0, tokenizer=tok, max_prompt_tokens=PROMPT_CAP)
    have = traced()
    log = RES / "sharegpt_short_outputs.jsonl"
    done = {}
    if log.exists():
        for line in log.read_text().splitlines():
            try:
                d = json.loads(line)
            except json.JSONDecodeError:      # a last line cut by a kill: that request is decoded again
                continue
            done[d["key"]] = d
    covered = [r for r in reqs if key(r.prompt_token_ids) in have]
    todo = [r for r in reqs if key(r.prompt_token_ids) not in have] + covered[:a.check]
    todo = [r for r in todo if key(r.prompt_token_ids) not in done]
    model = None
    t0 = time.time()
    for i, r in enumerate(todo):
        if model is None:
            model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
        ids = torch.tensor([r.prompt_token_ids])
        t = time.time()
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MIN_LEN,
                                 do_sample=False, pad_token_id=tok.pad_token_id or tok.eos_token_id)
        new = out[0, ids.shape[1]:].tolist()
        eos = set(model.generation_config.eos_token_id if isinstance(model.generation_config.eos_token_id, list)
                  else [model.generation_config.eos_token_id])
        n_out = next((j + 1 for j, x in enumerate(new) if x in eos), len(new))   # counted as vLLM counts: EOS in
        d = {"key": key(r.prompt_token_ids), "id": r.id, "prompt_tokens": len(r.prompt_token_ids),
             "cpu_tokens": n_out, "cpu_short": n_out < MIN_LEN, "cpu_text": tok.decode(new[:n_out]),
             "seconds": round(time.time() - t, 1)}
        with log.open("a") as f:
            f.write(json.dumps(d) + "\n")
        done[d["key"]] = d
        left = (time.time() - t0) / (i + 1) * (len(todo) - i - 1)
        print(f"[{i + 1}/{len(todo)}] {r.id}: {n_out} tokens ({d['seconds']} s; ~{left / 60:.0f} min left)",
              file=sys.stderr, flush=True)
    rows = []
    for r in reqs:
        k = key(r.prompt_token_ids)
        tr, cpu = have.get(k), done.get(k)
        short = tr["output_len"] < MIN_LEN if tr else cpu["cpu_short"] if cpu else None
        rows.append({"id": r.id, "later_turn": "#" in r.id, "short": short, "from": "vLLM trace" if tr else
                     "CPU decode" if cpu else "not decoded", "trace_id": tr["id"] if tr else None})
    both = [(have[k]["output_len"] < MIN_LEN, done[k]["cpu_short"]) for k in (key(r.prompt_token_ids) for r in reqs)
            if k in have and k in done]

    short_texts = [have[k]["output_text"] if k in have else done[k]["cpu_text"]
                   for r, x in zip(reqs, rows) if x["short"] for k in [key(r.prompt_token_ids)]]

    def share(sel):
        known = [x["short"] for x in sel if x["short"] is not None]
        return {"requests": len(sel), "known": len(known), "short": sum(known),
                "share": round(sum(known) / len(known), 3) if known else None}

    out = {"what": "sharegpt evaluation requests (the workload's draw, seed 0, Qwen chat template, prompt cap "
                   f"{PROMPT_CAP}) whose Qwen2.5-Coder-1.5B-Instruct greedy output is under {MIN_LEN} tokens",
           "n": a.n, "workload_version": workloads.version("sharegpt"),
           "all": share(rows), "first_turns": share([x for x in rows if not x["later_turn"]]),
           "later_turns_with_history": share([x for x in rows if x["later_turn"]]),
           "from": {s: sum(x["from"] == s for x in rows) for s in ("vLLM trace", "CPU decode", "not decoded")},
           "cpu_vs_vllm_on_short": {"requests": len(both), "agree": sum(x == y for x, y in both)},
           "long_outputs": sum(x["short"] is False for x in rows),
           "short_kinds": kinds(short_texts),
           "short_examples": short_texts[:12]}
    (RES / "sharegpt_short_outputs.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "short_examples"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
