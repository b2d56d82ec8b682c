"""n-gram (prompt-lookup) proposer with vLLM's semantics.

vLLM's ``NgramProposer`` (``vllm/v1/spec_decode/ngram_proposer.py``, ``prompt_lookup_min``/``_max``): find the
longest n-gram, ``min_n <= n <= max_n``, that ends the context (prompt + output so far) and occurs earlier in
it (an occurrence must end before the last token; overlapping the suffix is allowed). Among occurrences of that
longest n-gram take the EARLIEST one. Propose the up-to-k tokens that follow it, cut at the end of the context
(so fewer than k, or none when no n-gram of at least ``min_n`` tokens recurs). vLLM finds this with a KMP scan
of the reversed context; :func:`ngram_lookup` does the equivalent direct search, compiled with numba, and
:func:`ngram_lookup_batch` finds the drafts of every context of many sequences at once, in numpy.
"""
from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

from . import Proposer

__all__ = ["NgramProposer", "ngram_lookup", "ngram_lookup_all", "ngram_lookup_batch"]


def _match_py(tokens, total, min_n, max_n):
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


@functools.lru_cache(maxsize=None)
def _match():
    """``_match_py`` compiled by numba (cached on disk); numba is imported only where a single lookup runs."""
    try:
        from numba import njit
    except ImportError:  # pragma: no cover - numba is a dependency, but keep a slow path
        return _match_py
    return njit(cache=True)(_match_py)


def ngram_lookup(context: Sequence[int], k: int, min_n: int = 3, max_n: int = 7) -> list[int]:
    """Draft tokens for one context (vLLM prompt-lookup semantics, see module doc)."""
    if min_n < 1 or max_n < min_n:
        raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
    toks = np.asarray(context, dtype=np.int64)
    s, _ = _match()(toks, toks.shape[0], min_n, max_n)
    if s < 0 or k <= 0:
        return []
    return toks[s: s + k].tolist()


def ngram_lookup_all(tokens: Sequence[int], first: int, k: int, min_n: int = 3, max_n: int = 7):
    """Drafts for every context ``tokens[:i+1]``, i = first .. len-1: arrays (start, length) per i.

    The draft for context i is ``tokens[start:start+length]`` (length 0: no match)."""
    return ngram_lookup_batch([tokens], [first], k, min_n, max_n)[0]


def ngram_lookup_batch(seqs: Sequence[Sequence[int]], firsts: Sequence[int], k: int, min_n: int = 3,
                       max_n: int = 7) -> list[tuple[np.ndarray, np.ndarray]]:
    """``ngram_lookup_all(seqs[i], firsts[i], k, min_n, max_n)`` for every i, all at once in numpy.

    Every window of n tokens (n = 1 .. max_n) of every sequence gets an exact integer id (its sequence and its
    tokens; built from the (n-1)-token window before it and its last token, factorized in order of first
    appearance), so the earliest occurrence of each window is known. Context i's suffix of n tokens ends at i;
    it recurs, ending before i, iff its id's earliest occurrence ends before i, and that occurrence is the
    earliest one the direct search would find. The longest such n in min_n..max_n wins; its continuation
    starts right after that occurrence. Sequences of any length cost the same per token, with no compiler."""
    import pandas as pd

    if min_n < 1:
        raise ValueError(f"need min_n >= 1, got min_n={min_n}")
    toks = [np.asarray(x, dtype=np.int64).ravel() for x in seqs]
    T = np.array([len(x) for x in toks], np.int64)
    first = np.asarray(firsts, np.int64).reshape(len(toks))
    nq = np.maximum(T - first, 0)                       # contexts i = first .. T-1 of each sequence
    qoff = np.zeros(len(toks) + 1, np.int64)
    np.cumsum(nq, out=qoff[1:])
    starts = np.full(int(qoff[-1]), -1, np.int64)
    lens = np.zeros(int(qoff[-1]), np.int64)
    S = np.zeros(len(toks) + 1, np.int64)
    np.cumsum(T, out=S[1:])
    N = int(S[-1])
    if N and len(starts) and max_n >= min_n:
        seq = np.repeat(np.arange(len(toks)), T)
        local = np.arange(N) - S[:-1][seq]              # a token's index in its own sequence
        q_seq = np.repeat(np.arange(len(toks)), nq)
        i = first[q_seq] + np.arange(len(starts)) - qoff[:-1][q_seq]
        ok_q = i >= 0                                   # an empty context (i < 0) has no match
        E = np.where(ok_q, S[:-1][q_seq] + i, 0)        # where each context's suffix ends (joined tokens)
        G = np.concatenate(toks)
        G = G - G.min()
        if len(toks) * (float(G.max()) + 1) >= 2.0 ** 62:   # (sequence, token) as one integer would overflow
            G = pd.factorize(G)[0].astype(np.int64)
        one = pd.factorize(seq * (int(G.max()) + 1) + G)[0].astype(np.int64)   # 1 token: (sequence, token)
        width = int(one.max()) + 1
        ids = code = one                                # level n: the id of each window of n tokens, by end
        pos = np.arange(N)                              # the ends of the windows that have an id
        for n in range(1, max_n + 1):
            if n > 1:
                # a window whose first n-1 tokens occur once occurs once: only the others get an id (-1: once)
                nxt = pos[(np.bincount(code) > 1)[code]] + 1
                nxt = nxt[nxt < N]
                nxt = nxt[local[nxt] >= n - 1]          # inside one sequence
                if not len(nxt):                        # no n tokens occur twice, nor any more
                    break
                pos = nxt
                code = pd.factorize(ids[pos - 1] * width + one[pos])[0].astype(np.int64)
                ids = np.full(N, -1, np.int64)
                ids[pos] = code
            if n < min_n:
                continue
            # codes count up in order of first appearance: c first appears where the running maximum reaches c
            first_end = pos[np.r_[True, code[1:] > np.maximum.accumulate(code)[:-1]]]
            c = ids[E]
            e0 = first_end[np.maximum(c, 0)]            # where the suffix's earliest occurrence ends
            hit = ok_q & (c >= 0) & (e0 < E)
            # a longer n overwrites a shorter one: the longest match wins
            starts = np.where(hit, e0 + 1 - S[:-1][q_seq], starts)
            lens = np.where(hit, np.minimum(k, E - e0), lens)
    return [(starts[qoff[r]:qoff[r + 1]], lens[qoff[r]:qoff[r + 1]]) for r in range(len(toks))]


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
