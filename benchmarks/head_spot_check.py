"""A CPU spot check of the committed Qwen EAGLE head against the traces' head (``6a898652…``, whose acceptance is the
committed traces' ``eagle`` column), on the same positions of a seeded random sample of evaluation requests.

Each request's stored vLLM output is cut at 384 tokens; the committed head drafts by teacher forcing over it (bf16 on
the CPU, ``eagle_chain_acceptance``, k_max 8) and the traces' head's acceptance is read from the trace, capped alike
(at k_max 8 and at the cut). Printed and written: walked tokens per step at k = 3 and 5 (mean over requests).

    python benchmarks/head_spot_check.py 30 data/heads/spot_check_cpu.json     # ~25 min on one core
"""
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from spec_repro import models
from spec_repro.locations import data_dir
from spec_repro.metrics import walk_steps
from spec_repro.proposers.eagle import eagle_chain_acceptance, load_head
from spec_repro.proposers.eagle_files import committed_head
from spec_repro.tracefiles import read_trace

torch.set_num_threads(1)
N, CUT = int(sys.argv[1]), 384
target, tok = models.load("qwen2.5-coder-1.5b", device="cpu", dtype=torch.bfloat16)
head = load_head(committed_head("qwen2.5-coder-1.5b"), target, dtype=torch.bfloat16)
out = {"what": __doc__.split("\n\n")[0], "sample": N, "cut": CUT, "seed": 0}
for w in ("code-edit", "sharegpt"):
    t = read_trace(data_dir() / "traces" / f"qwen2.5-coder-1.5b__{w}.parquet")
    rq = t.requests[t.requests.output_len >= 16].sample(n=N, random_state=0)
    rows = []
    for _, r in rq.iterrows():
        t0 = time.time()
        o = list(r.output_token_ids)[:CUT]
        L = len(o)
        a_new = eagle_chain_acceptance(head, list(r.prompt_token_ids), o, 8)
        old = t.acc[(t.acc.request_id == r.request_id) & (t.acc.proposer == "eagle")].sort_values("position")
        a_old = np.minimum(np.minimum(old.acc_len.to_numpy()[:L], 9), L - np.arange(L))
        row = {"id": str(r.request_id), "L": L, "s": round(time.time() - t0, 1)}
        for k in (3, 5):
            row[f"new{k}"] = L / len(walk_steps(a_new, k))
            row[f"old{k}"] = L / len(walk_steps(a_old, k))
        rows.append(row)
        print(w, row, flush=True)
    out[w] = {"n": len(rows), **{f"{h}{k}": float(np.mean([x[f"{h}{k}"] for x in rows]))
                                 for h in ("new", "old") for k in (3, 5)}, "rows": rows}
    print(w, {k: v for k, v in out[w].items() if k != "rows"}, flush=True)
if len(sys.argv) > 2:
    Path(sys.argv[2]).write_text(json.dumps(out, indent=1) + "\n")
