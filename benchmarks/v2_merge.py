"""Where the V2 hybrid's per-step cost goes: its merge (the n-gram lookup over the device copy of the tokens and the
mix with EAGLE's drafts, ``hybrid_v2.MergeStep``) timed alone per batch size and lookup width, eager and as a
CUDA-graph replay: the host's seconds to issue it and the GPU's to run it (CUDA events; where the host is the slower
the GPU's time is the host's), and the graph's replays alone, back to back (the GPU's own time a merge).

    python benchmarks/v2_merge.py [--steps 200]          # on a CUDA GPU (on a CPU: eager only, host = GPU)

On an H100 with the lookup's match lengths from a cumulative product (data/gpu/raw/v2hybrid-h100-driver/bench/
v2_merge.txt) the host issued a replayed merge in 0.036 ms at every shape and the GPU ran it in 0.11 ms at bs 1 and
0.34 / 0.56 / 1.01 / 1.89 ms at bs 64, widths 512 / 1,024 / 2,048 / 4,096: the idle machinery's extra drafting in
the grid (data/gpu/live) was the merge's GPU time, and that the cumulative product's (``gpu_hybrid.ngram_propose``).
"""
from __future__ import annotations

import argparse
import sys
import time

BATCHES, WIDTHS, K = (1, 8, 32, 64), (512, 1024, 2048, 4096), 5


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200, help="merges timed a shape and path (default 200)")
    a = ap.parse_args(argv)
    if a.steps < 1:
        print(f"v2_merge: --steps must be at least 1, got {a.steps}", file=sys.stderr)
        return 2
    import torch

    from spec_repro.engines.vllm.hybrid_v2 import MergeStep

    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    g = torch.Generator().manual_seed(0)
    print(f"{torch.cuda.get_device_name() if cuda else 'CPU'}, torch {torch.__version__}, k = {K}, "
          f"{a.steps} merges a shape; ms a step: host to issue it / GPU to run it")
    for B in BATCHES:
        cells = []
        for W in WIDTHS:
            # each request repeats a 50-token phrase: the lookup matches (the rule's path, not only the idle one's)
            tok = torch.randint(0, 151936, (B, 50), generator=g).repeat(1, W // 50 + 1)[:, :W]
            tok = tok.to(torch.int32).to(dev)
            total = torch.full((B,), W - K - 1, dtype=torch.int32, device=dev)
            rows = torch.arange(B, dtype=torch.int32, device=dev)
            eagle = torch.randint(0, 151936, (B, K), generator=g).to(dev)
            src = tok.clone()            # vLLM's buffer (host memory mapped to the device there): the tail's source
            out = []
            for graphs in ((False, True) if cuda else (False,)):
                m = MergeStep(use_ngram=True, graphs=graphs)
                for _ in range(4):                              # capture and the checked replays first
                    m(tok, total, rows, eagle, W, src=src, tail=K + 1)
                if cuda:
                    torch.cuda.synchronize()
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    e0.record()
                t0 = time.perf_counter()
                for _ in range(a.steps):
                    m(tok, total, rows, eagle, W, src=src, tail=K + 1)
                host = (time.perf_counter() - t0) / a.steps * 1e3
                if cuda:
                    e1.record()
                    torch.cuda.synchronize()
                    gpu = e0.elapsed_time(e1) / a.steps
                else:
                    gpu = host
                out.append(f"{'graph' if graphs else 'eager'} {host:.3f}/{gpu:.3f}")
                if graphs and m._g:             # the graph's replays alone, back to back: the GPU's time a merge
                    replay = next(iter(m._g.values()))["replay"]
                    torch.cuda.synchronize()
                    e0.record()
                    for _ in range(a.steps):
                        replay()
                    e1.record()
                    torch.cuda.synchronize()
                    out.append(f"replay alone {e0.elapsed_time(e1) / a.steps:.3f}")
            cells.append(f"W {W}: " + ", ".join(out))
        print(f"bs {B}: " + "; ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
