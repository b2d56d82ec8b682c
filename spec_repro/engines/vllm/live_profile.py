"""The hybrid task's requests profiled on no SD's live outputs (``profile_hybrid_task``, ``hybrid_trace*.jsonl``):
per request and output position the tokens n-gram and the EAGLE head would yield, the step model's input
(``load_profiles``)."""
from __future__ import annotations

import json
import re
from pathlib import Path

from .live_runs import COMMITTED, OUT, QWEN


def profile_hybrid_task(raw: str | Path | None, out: str | Path = OUT / "hybrid_trace.jsonl",
                        head: str | Path | None = None, workload: str = "code-edit", n: int = 64, k_max: int = 8,
                        max_tokens: int = 256, max_model_len: int = 4096, progress=print,
                        trace: str | Path | None = None, device: str = "cpu") -> Path:
    """The hybrid task's ``workload`` requests (as ``jobs._hybrid_task`` loads them: the first ``n`` by the
    workload's seeded order, Qwen's chat template) profiled with n-gram and the EAGLE head (torch, float32 on the
    CPU; ``device="cuda"`` on a GPU host) on no SD's outputs (bs 64, repeat 0, from the raw folder ``raw``; or
    ``trace=``: the outputs of an earlier ``hybrid_trace.jsonl``, e.g. to profile them with another head): one
    JSON line per request, appended (a killed run resumes)."""
    import time

    import torch
    from transformers import AutoTokenizer

    from ... import models
    from ... import workloads as W
    from ...collect import build_proposers
    from .agreement import profile_outputs

    outs = {}
    if trace is not None:
        outs = {d["key"]: d["output"] for d in load_profiles(trace)}
    for f in (sorted(Path(raw).rglob("results*.jsonl")) if raw is not None else []):
        for line in open(f):
            d = json.loads(line)
            if (d.get("task") == "hybrid" and re.search(r"-none(-|$)", d.get("spec", "")) and d.get("repeat") == 0
                    and d.get("workload") == workload and d.get("batch_size") == n):
                outs.update(zip(d["keys"], d["outputs"]))
    if not outs:
        raise SystemExit(f"live profile: no no-SD hybrid run at bs {n} on {workload} under {raw or trace}")
    out = Path(out)
    done = {json.loads(x)["key"] for x in open(out) if x.strip()} if out.exists() else set()
    tok = AutoTokenizer.from_pretrained(models.converted_dir(QWEN))
    reqs = W.load(workload, n=n, seed=0, tokenizer=tok, max_prompt_tokens=max_model_len - max_tokens)
    todo = [r for r in reqs if r.id in outs and r.id not in done]
    if not todo:
        return out
    torch.set_num_threads(max(1, torch.get_num_threads()))
    target, _ = models.load(QWEN, device=device)
    props = build_proposers(["ngram", "eagle"], target, eagle_head=str(head or default_head()))
    for r in todo:
        t0 = time.time()
        prof = profile_outputs({r.id: list(r.prompt_token_ids)}, {r.id: outs[r.id]}, props, k_max=k_max)
        rec = {"key": r.id, "prompt_len": len(r.prompt_token_ids), "output": list(map(int, outs[r.id])),
               "acc": {m: prof[m][r.id][0] for m in props}, "draft_len": {m: prof[m][r.id][1] for m in props},
               "seconds": time.time() - t0, "device": device}
        with open(out, "a") as f:
            f.write(json.dumps(rec) + "\n")
        progress(f"{r.id} {rec['seconds']:.1f}s")
    return out


def default_head() -> Path:
    """The EAGLE head committed for Qwen2.5-Coder-1.5B (``data/heads/``), joined and verified from its parts (on
    the device machine: the copy ``gpu/stage_cache.sh`` staged in the cache)."""
    from ...proposers.eagle_files import committed_head

    return committed_head(QWEN)


def load_profiles(path: str | Path | None = None) -> list[dict]:
    """``hybrid_trace.jsonl``: per request its prompt length, the greedy output (no SD, bs 64) and, per proposer,
    ``acc[p-1]`` (tokens one step yields from output position p, k_max 8) and ``draft_len[p-1]`` (n-gram's match
    length, 0 = no match), in the hybrid task's request order."""
    return [json.loads(x) for x in open(path or COMMITTED / "hybrid_trace.jsonl") if x.strip()]
