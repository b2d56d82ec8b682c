"""Speed of the reference engine (spec_repro.engines.torch) against transformers' own generate, in one run.

Same prompts (real code-edit requests through SmolLM2's chat template), same CPU, same thread count, batch
size 1, greedy. Methods, run round-robin over prompts and repeats so background load hits all alike:

  hf-greedy      transformers  model.generate(do_sample=False)
  ours-greedy    spec_repro    generate(proposer=None)
  hf-pld         transformers  model.generate(prompt_lookup_num_tokens=k)   (its n-gram: max_matching_ngram_size 2)
  ours-ngram     spec_repro    generate(proposer=ngram(min_n, max_n), k)    (vLLM semantics, study's 3/7)

Targets: ours-greedy within 10% of hf-greedy; ours-ngram at least as fast as hf-pld. Also prints the
CPU's measured memory bandwidth (a large tensor copy) and the decode bound it implies: one greedy step must
read every weight once, so tok/s <= bandwidth / weight bytes.

    python benchmarks/bench_engine.py [--n 4] [--max-new-tokens 128] [--k 3] [--threads 1] [--repeats 2]
"""
from __future__ import annotations

import argparse
import os
import platform
import time

import torch


def memory_bandwidth_gbs(mb: int = 512, repeats: int = 5) -> float:
    """Best-of copy bandwidth (bytes read + written per second) of a large float32 tensor."""
    n = mb * (1 << 20) // 4
    a, b = torch.ones(n), torch.empty(n)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        b.copy_(a)
        best = min(best, time.perf_counter() - t)
    return 2 * n * 4 / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--workload", default="code-edit")
    ap.add_argument("--n", type=int, default=4, help="prompts")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--min-n", type=int, default=3)
    ap.add_argument("--max-n", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from spec_repro import models, workloads
    from spec_repro.engines.torch import eos_ids_of, generate, weight_bytes
    from spec_repro.proposers import make_proposer

    model, tok = models.load(args.model, quiet=True)
    reqs = workloads.load(args.workload, n=args.n, seed=0, tokenizer=tok)
    prompts = [r.prompt_token_ids for r in reqs]
    eos = sorted(eos_ids_of(model, tok))

    def hf(p, **kw):
        ids = torch.tensor([p])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens,
                             do_sample=False, eos_token_id=eos, pad_token_id=tok.pad_token_id or eos[0], **kw)
        return out[0, len(p):].tolist()

    def ours(p, prop=None):
        return generate(model, [p], max_new_tokens=args.max_new_tokens, eos_token_ids=eos, proposer=prop,
                        k=args.k).output_ids[0]

    ngram = make_proposer("ngram", min_n=args.min_n, max_n=args.max_n)
    methods = {
        "hf-greedy": lambda p: hf(p),
        "ours-greedy": lambda p: ours(p),
        "hf-pld": lambda p: hf(p, prompt_lookup_num_tokens=args.k),
        "ours-ngram": lambda p: ours(p, ngram),
    }
    for f in methods.values():  # warm-up (numba compile, allocator)
        f(prompts[0][:32])
    tokens = {m: 0 for m in methods}
    secs = {m: 0.0 for m in methods}
    outs: dict[str, list] = {m: [] for m in methods}
    order = list(methods)
    with torch.no_grad():
        for rep in range(args.repeats):
            for i, p in enumerate(prompts):
                seq = order if (rep + i) % 2 == 0 else order[::-1]
                for m in seq:
                    t = time.perf_counter()
                    o = methods[m](p)
                    secs[m] += time.perf_counter() - t
                    tokens[m] += len(o)
                    if rep == 0:
                        outs[m].append(o)

    bw = memory_bandwidth_gbs()
    wb = weight_bytes(model)
    bound = bw * 1e9 / wb
    tps = {m: tokens[m] / secs[m] for m in methods}
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch threads "
          f"{torch.get_num_threads()}, load avg {os.getloadavg()[0]:.1f}; model {args.model} "
          f"({wb / 1e6:.0f} MB {model.dtype}); {len(prompts)} {args.workload} prompts x {args.repeats} repeats, "
          f"<= {args.max_new_tokens} new tokens, k = {args.k}")
    print(f"memory bandwidth (copy): {bw:.1f} GB/s -> decode bound {bound:.1f} tok/s (weights read once per step)")
    for m in methods:
        print(f"  {m:12s} {tps[m]:7.2f} tok/s  ({tokens[m]} tokens in {secs[m]:.1f} s; "
              f"{100 * tps[m] / bound:.0f}% of the bandwidth bound)")
    same_g = outs["ours-greedy"] == outs["hf-greedy"]
    same_n = outs["ours-ngram"] == outs["ours-greedy"]
    r1 = tps["ours-greedy"] / tps["hf-greedy"]
    r2 = tps["ours-ngram"] / tps["hf-pld"]
    print(f"ours-greedy / hf-greedy = {r1:.3f}  (target >= 0.90: {'PASS' if r1 >= 0.9 else 'FAIL'}); "
          f"identical tokens: {same_g}")
    print(f"ours-ngram  / hf-pld    = {r2:.3f}  (target >= 1.00: {'PASS' if r2 >= 1.0 else 'FAIL'}); "
          f"ours-ngram tokens identical to greedy: {same_n}")
    print(f"ours-ngram / ours-greedy = {tps['ours-ngram'] / tps['ours-greedy']:.3f} (n-gram SD speedup at bs 1)")


if __name__ == "__main__":
    main()
