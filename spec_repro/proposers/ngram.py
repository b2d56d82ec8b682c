"""n-gram (prompt-lookup) proposer with vLLM's semantics.

vLLM's ``NgramProposer`` (``vllm/v1/spec_decode/ngram_proposer.py``, ``prompt_lookup_min``/``_max``): find the
longest n-gram, ``min_n <= n <= max_n``, that ends the context (prompt + output so far) and occurs earlier in
it (an occurrence must end before the last token; overlapping the suffix is allowed). Among occurrences of that
longest n-gram take the EARLIEST one. Propose the up-to-k tokens that follow it, cut at the end of the context
(so fewer than k, or none when no n-gram of at least ``min_n`` tokens recurs). vLLM finds this with a KMP scan
of the reversed context; :func:`ngram_lookup` does the equivalent direct search, compiled with numba.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from . import Proposer

__all__ = ["NgramProposer", "ngram_lookup", "ngram_lookup_all"]

try:
    from numba import njit
except ImportError:  # pragma: no cover - numba is a dependency, but keep a slow path
    def njit(*a, **kw):
        return (lambda f: f) if not (a and callable(a[0])) else a[0]


@njit(cache=True)
def _match(tokens, total, min_n, max_n):
    """(start of the continuation, n) for the context tokens[:total]; (-1, 0) without a match."""
    if total < min_n:
        return -1, 0
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        # earliest occurrence start j of the suffix tokens[total-n:total], with j + n <= total - 1
        for j in range(0, total - n):
            ok = True
            for t in range(n):
                if tokens[j + t] != tokens[total - n + t]:
                    ok = False
                    break
            if ok:
                return j + n, n
    return -1, 0


@njit(cache=True)
def _lookup_all(tokens, first, min_n, max_n, k, out_start, out_len):
    """For every context length total = first+1 .. len(tokens): continuation start and length (<= k)."""
    L = tokens.shape[0]
    for i in range(first, L):
        total = i + 1
        s, n = _match(tokens, total, min_n, max_n)
        if s < 0:
            out_start[i - first] = -1
            out_len[i - first] = 0
        else:
            out_start[i - first] = s
            out_len[i - first] = min(k, total - s)


def ngram_lookup(context: Sequence[int], k: int, min_n: int = 3, max_n: int = 7) -> list[int]:
    """Draft tokens for one context (vLLM prompt-lookup semantics, see module doc)."""
    if min_n < 1 or max_n < min_n:
        raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
    toks = np.asarray(context, dtype=np.int64)
    s, _ = _match(toks, toks.shape[0], min_n, max_n)
    if s < 0 or k <= 0:
        return []
    return toks[s: s + k].tolist()


def ngram_lookup_all(tokens: Sequence[int], first: int, k: int, min_n: int = 3, max_n: int = 7):
    """Drafts for every context ``tokens[:i+1]``, i = first .. len-1: arrays (start, length) per i.

    The draft for context i is ``tokens[start:start+length]`` (length 0: no match)."""
    toks = np.asarray(tokens, dtype=np.int64)
    n = toks.shape[0] - first
    starts = np.empty(max(n, 0), dtype=np.int64)
    lens = np.empty(max(n, 0), dtype=np.int64)
    if n > 0:
        _lookup_all(toks, first, min_n, max_n, k, starts, lens)
    return starts, lens


class NgramProposer(Proposer):
    """vLLM's prompt-lookup proposer: ``min_n``/``max_n`` = ``prompt_lookup_min``/``_max`` (study: 3/7)."""

    name = "ngram"
    method = "ngram"

    def __init__(self, min_n: int = 3, max_n: int = 7):
        if min_n < 1 or max_n < min_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.min_n, self.max_n = int(min_n), int(max_n)
        ngram_lookup([0, 1, 0, 1], 1, 1, 2)  # compile (or load the cached) numba code now, not in a timed step

    def propose(self, contexts, k):
        return [ngram_lookup(c, k, self.min_n, self.max_n) for c in contexts]
