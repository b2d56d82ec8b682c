"""The baselines a vLLM user would run instead of a learned selector, as simulator policies.

``ngram-else-eagle`` (vLLM PR #24344's rule): both proposers run at every step; n-gram's proposal is verified where
its prompt lookup matched (its match length at the position > 0, capped at its own k, ``KN``), else the model
proposer's ``KE`` tokens. "eagle" names the set's model proposer (EAGLE, EAGLE-3, a draft model, early-exit):
the proposer set is n-gram + exactly one other. Policy strings: ``ngram-else-eagle`` (KN = KE = 3, the study's
k) or ``ngram-else-eagle-KN-KE`` (e.g. ``ngram-else-eagle-16-10``).

``ngram-else-eagle-skip[-KN-KE]``: the same choice, but the model proposer drafts only at the steps n-gram does not
serve; each time it comes back after skipped steps of a request it pays its cost model's catch-up forward(s)
(``Drafter.catch_up``: the head must process the tokens it skipped before it drafts again).

Charges (drafting): n-gram's lookup at every step (its rule: a fraction of F where it matched); the model proposer
every step (``ngram-else-eagle``: ``KE`` tokens, also where its proposal is not verified) or only where it is
verified (``-skip``). Rows carry ``draft_cost = ran``. n-gram's match comes from the trace's recorded draft_len
or, on the study's files, from the token ids (``simcore.ngram_match``); without either the policy cannot run.

``dynamic-k`` (one proposer): k read off a table of batch size -> k, as vLLM's dynamic speculative decoding sets
``num_speculative_tokens`` per batch size (option ``dynamic_k={batch_size: k}``: a batch of size B uses the entry of
the largest key <= B). Under duplicate batching a batch has one size, so ``dynamic-k`` at B is ``fixed-k`` with the
table's k; a table read off the fixed-k rows (best k per batch size) is the "best fixed k per batch size" line.
"""
from __future__ import annotations

import re

import numpy as np

from .simcore import SimulationError, is_ngram, walk_compiled

__all__ = ["SWITCH", "parse_switch", "switch_steps", "dynamic_k_for"]

SWITCH = ("ngram-else-eagle", "ngram-else-eagle-skip")
_RE = re.compile(r"ngram-else-eagle(?P<skip>-skip)?(?:-(?P<kn>\d+)-(?P<ke>\d+))?")


def parse_switch(policy: str):
    """'ngram-else-eagle-skip-16-10' -> ('ngram-else-eagle-skip', 16, 10); None if not a switch policy."""
    m = _RE.fullmatch(str(policy).strip().lower())
    if not m:
        return None
    kn, ke = int(m.group("kn") or 3), int(m.group("ke") or 3)
    if kn < 1 or ke < 1:
        raise SimulationError(f"policy {policy!r}: both k must be >= 1")
    return ("ngram-else-eagle-skip" if m.group("skip") else "ngram-else-eagle"), kn, ke


def switch_steps(reqs, proposers, ngdl: np.ndarray, kn: int, ke: int, skip: bool, cm):
    """Steps and charges of ``ngram-else-eagle[-skip]`` over ``reqs`` (a ``simcore.Requests`` with rows in the
    order of ``proposers``). Returns (req, p, idx, inp, gen, charges, verified_ngram)."""
    ng = next(i for i, q in enumerate(proposers) if is_ngram(q))
    mo = 1 - ng
    kmax_n = np.minimum(ngdl, kn)
    served = kmax_n > 0
    a = np.where(served, reqs.acc[ng], reqs.acc[mo])
    prop = np.where(served, kmax_n, ke).astype(np.int64)
    req, p, idx, inp, gen = walk_compiled(a, prop, reqs.off, False)
    on = served[idx]
    charges = [(cm.drafter(proposers[ng]), None, ngdl[idx].astype(np.int64), False),
               (cm.drafter(proposers[mo]), ~on if skip else None, np.full(len(idx), ke, np.int64), False)]
    return req, p, idx, inp, gen, charges, on


def dynamic_k_for(table, B: int) -> int:
    """k of a batch of size B: the entry of the largest key <= B (the smallest key's below every key)."""
    try:
        items = sorted((int(b), int(k)) for b, k in dict(table).items())
    except (TypeError, ValueError) as e:
        raise SimulationError(f"dynamic_k must map batch sizes to k (ints), got {table!r}") from e
    if not items or any(k < 1 for _, k in items):
        raise SimulationError(f"dynamic_k needs at least one entry and every k >= 1, got {table!r}")
    k = items[0][1]
    for b, kk in items:
        if b <= B:
            k = kk
    return k
