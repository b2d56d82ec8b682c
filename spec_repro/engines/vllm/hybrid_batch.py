"""The batch forms the V1 runner speaks, for the hybrid's step (what ``hybrid_runner`` hands ``hybrid.LiveHybrid``
and back): the sampler's ``[B, k+1]`` output as valid tokens per request (``valid_tokens``), drafts as a padded
``[B, k]`` array and counts (``pack`` / ``unpack``), the scheduled slots cut to those counts (``trim_scheduled``),
a draft padded to the step's width (``pad_draft``) and the idle policy's step summary (``passthrough_summary``).
Pure numpy: nothing here imports vLLM.

The filler (:func:`pad_draft`), cheap, deterministic, ids from the context or EAGLE's row; the first that applies:

``eagle``   EAGLE's own tokens at those positions, when EAGLE drafted this step and its row starts with the chosen
            draft (its tokens there are then its continuation of exactly that prefix). A row that disagrees, is
            shorter than the width or holds an id outside ``[0, vocab_size)`` (a masked row) is not used.
``ngram``   n-gram's proposal of this step, continued: its tokens after the chosen ones (a rule's cut), then the
            proposal repeated. vLLM's lookup proposes fewer than k tokens only when the continuation runs into
            the context's end, and then the context ends with a stretch of period ``len(proposal)`` (the matched
            n-gram recurs ``len(proposal)`` tokens before the end): repeating the proposal continues that period.
            Used where the chosen draft is a prefix of it (no draft included).
``cycle``   the chosen draft repeated (a draft neither of the above continues; not expected).
``lookup``  no draft and no n-gram match: the lookup with ``min_n = 1, max_n = 2`` (what followed the last one or
            two tokens' earliest occurrence, vLLM's rule otherwise), repeated with its period.
``repeat``  the last context token repeated.

Padding never runs EAGLE: the policy alone decides whether it drafts (``ngram-only`` never does), so a padded
n-gram request's tail is ``ngram``/``lookup``/``repeat`` unless another request needed EAGLE at that step.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

FILLERS = ("eagle", "ngram", "cycle", "lookup", "repeat")   # pad_draft's fillers, in the order it tries them


class HybridError(ValueError):
    """Bad input to the hybrid's policy; the message says what is allowed."""


def valid_tokens(sampled: Any, discard: Sequence[int] = (), vocab_size: int | None = None) -> list[list[int]]:
    """This step's emitted tokens per request from the sampler's ``[B, k+1]`` output (numpy or a CPU tensor), as
    vLLM's ``RejectionSampler.parse_output``: placeholders (-1, after the first rejection) and ids >=
    ``vocab_size`` dropped, rows ``discard`` (partial prefill chunks: their sample is thrown away) empty."""
    a = np.asarray(sampled.numpy() if hasattr(sampled, "numpy") else sampled)
    if a.ndim != 2:
        raise HybridError(f"sampled tokens must be a [B, k+1] array, got shape {a.shape}")
    ok = a != -1
    if vocab_size is not None:
        ok &= a < int(vocab_size)
    ok[np.asarray(list(discard), dtype=np.int64)] = False
    return [row[m].tolist() for row, m in zip(a, ok)]


def pack(drafts: Sequence[Sequence[int]], width: int) -> tuple[np.ndarray, np.ndarray]:
    """Drafts as the async runner holds them: a ``[B, width]`` int32 array (rows zero-padded, as vLLM pads) and
    the valid count per request. A draft longer than ``width`` is an error (the policy cuts to k)."""
    ids = np.zeros((len(drafts), int(width)), np.int32)
    counts = np.zeros(len(drafts), np.int32)
    for i, d in enumerate(drafts):
        if len(d) > width:
            raise HybridError(f"draft {i} has {len(d)} tokens for {width} slots")
        ids[i, :len(d)] = d
        counts[i] = len(d)
    return ids, counts


def unpack(ids: Any, counts: Sequence[int]) -> list[list[int]]:
    """The inverse of :func:`pack`: each row cut to its valid count."""
    rows = ids.tolist() if hasattr(ids, "tolist") else [list(r) for r in ids]
    return [list(r[:int(c)]) for r, c in zip(rows, counts)]


def trim_scheduled(num_scheduled: dict, spec_tokens: dict, valid: dict) -> tuple[int, dict]:
    """Cut each request's scheduled draft slots to its valid count, in place (as vLLM's
    ``update_scheduler_for_invalid_drafts`` does for its GPU n-gram): ``num_scheduled`` {req: tokens this step},
    ``spec_tokens`` {req: scheduled draft ids}, ``valid`` {req: valid drafts}; requests without a count are left
    alone. Returns (tokens removed, {req: slots scheduled before}) (the runner restores ``prev_num_draft_len``
    from the latter, as for its GPU n-gram)."""
    removed, before = 0, {}
    for r, n in valid.items():
        toks = spec_tokens.get(r)
        if toks is None:
            continue
        k = len(toks)
        keep = max(0, min(int(n), k))
        before[r] = k
        removed += k - keep
        num_scheduled[r] -= k - keep
        if keep:
            spec_tokens[r] = toks[:keep]
        else:
            spec_tokens.pop(r)
    return removed, before


def _cycle(seq: Sequence[int], start: int, n: int) -> list[int]:
    """``n`` tokens of ``seq`` repeated, from position ``start`` of the repetition on."""
    return [int(seq[(start + i) % len(seq)]) for i in range(n)]


def pad_draft(draft: Sequence[int], width: int, tokens: np.ndarray, ngram: Sequence[int] = (),
              eagle: Sequence[int] | None = None, vocab_size: int | None = None) -> tuple[list[int], str]:
    """The padding that extends ``draft`` to ``width`` tokens, and its filler (one of :data:`FILLERS`; ``""``
    when the draft is already that long): see the module docstring, "Padding". ``tokens``: the request's
    context (prompt + output so far; not empty); ``ngram``: n-gram's proposal at this step; ``eagle``: EAGLE's
    row for the request when EAGLE drafted this step (None otherwise)."""
    d = [int(x) for x in draft]
    n = int(width) - len(d)
    if n <= 0:
        return [], ""
    if eagle is not None:
        e = [int(x) for x in list(eagle)[:int(width)]]
        tail = e[len(d):]
        if len(e) == int(width) and e[:len(d)] == d and all(0 <= x and (vocab_size is None or x < vocab_size)
                                                             for x in tail):
            return tail, "eagle"
    g = [int(x) for x in ngram]
    if g and (len(d) == 0 or _cycle(g, 0, len(d)) == d):
        return _cycle(g, len(d), n), "ngram"
    if d:
        return _cycle(d, len(d), n), "cycle"
    from ...proposers.ngram import ngram_lookup

    look = ngram_lookup(tokens, int(width), 1, 2)
    if look:
        return _cycle(look, 0, n), "lookup"
    return [int(tokens[-1])] * n, "repeat"


def passthrough_summary(n_reqs: int, k: int, req_ids: Sequence[str] | None = None) -> dict:
    """The step log's ``hybrid`` entry of a :data:`PASSTHROUGH` step (every request on EAGLE's ``k`` tokens, as
    vLLM drafted them), in :meth:`LiveHybrid.summary`'s form."""
    out = {"ngram": 0, "eagle": int(n_reqs), "none": 0, "ngram_tokens": 0, "eagle_tokens": int(n_reqs) * int(k),
           "eagle_needed": n_reqs > 0, "passthrough": True}
    if req_ids is not None:
        out["per_req"] = {r: ["eagle", int(k)] for r in req_ids}
    return out
