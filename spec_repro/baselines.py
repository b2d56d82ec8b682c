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

The default pair of ``ngram-else-eagle[-skip]`` (3, 3) is the study's k, not a tuned pair: the pair that wins
depends on the workload and the cost model (the study's InstructCoder at bs 1, per-token pricing: 20-2 gives
3.63x, 3-3 2.41x). ``grids.out_of_sample_policy`` picks a pair on other workloads; the CLI names the pair it ran.

The model proposer's length by its own confidence (``conf-stop[-T-K]``, one model proposer, and
``ngram-else-eagle-skip-conf[-KN-T-K]``, the skip rule with this stop in place of its fixed k; defaults
``CONF_KN``, ``CONF_T``, ``CONF_K``): the drafter computes draft d = 1, 2, ... and its softmax probability c_d of
its own token; it stops at the first d where the running product c_1 * ... * c_d falls below T, or after K. The
proposal is the drafts before the stop. A draft whose product fell below T was computed: its forward is paid
(per_token drafters pay computed drafts, not proposed ones; a step whose first draft is below T verifies one token
and still pays one draft). Causal: a stop reads the current chain's probabilities of the drafts it computed, never
the step's acceptance. The confidence is the trace's (``Trace.confidence``): teacher-forced as the acceptance, the
real chain's for d <= acc_len; beyond the first rejected draft it is read on the output's tokens where the real
drafter would continue its own chain: that changes only how many rejected drafts are computed (the charge), never
the tokens produced. A trace without confidence for the model proposer cannot run these (one SimulationError).
``T = oracle`` (``conf-stop-oracle-K``, ``ngram-else-eagle-skip-conf-KN-oracle-K``) is the ceiling of any stop
rule: a perfect confidence, proposing exactly min(acc_len - 1, K) and computing the rejected draft it reads to stop
(min(acc_len, K) drafts); it reads the step's acceptance (a look-ahead: a bound, not a policy) and needs no
confidence.
"""
from __future__ import annotations

import re

import numpy as np

from .simcore import SimulationError, is_ngram, walk_compiled

__all__ = ["SWITCH", "parse_switch", "switch_steps", "dynamic_k_for", "CONF", "parse_conf", "conf_name", "stop_lengths",
           "conf_steps"]

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
    return _switch_walk(reqs, proposers, ng, ngdl, kn, ke, np.full(len(reqs.acc[ng]), ke, np.int64), skip, cm)


def _switch_walk(reqs, proposers, ng: int, ngdl: np.ndarray, kn: int, model_k, model_paid: np.ndarray, skip: bool,
                 cm):
    """The switch's walk: n-gram's proposal (its match, at most ``kn``) where it matched, else the model
    proposer's ``model_k`` (a number or one per position); the model proposer is charged ``model_paid[position]``
    drafted tokens at every step (only where n-gram did not serve with ``skip``). Returns (req, p, idx, inp, gen,
    charges, verified_ngram)."""
    mo = 1 - ng
    kmax_n = np.minimum(ngdl, kn)
    served = kmax_n > 0
    a = np.where(served, reqs.acc[ng], reqs.acc[mo])
    prop = np.where(served, kmax_n, model_k).astype(np.int64)
    req, p, idx, inp, gen = walk_compiled(a, prop, reqs.off, False)
    on = served[idx]
    charges = [(cm.drafter(proposers[ng]), None, ngdl[idx].astype(np.int64), False),
               (cm.drafter(proposers[mo]), ~on if skip else None, model_paid[idx], False)]
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


# ---- the model proposer's length by its own confidence ----------------------------------------------------------
CONF = ("conf-stop", "ngram-else-eagle-skip-conf")
#: defaults of the confidence policies: n-gram's cap KN, the threshold T on the running product, EAGLE's cap K
CONF_KN, CONF_T, CONF_K = 16, 0.3, 8
_CONF_RE = re.compile(r"(?P<kind>ngram-else-eagle-skip-conf|conf-stop)(?:-(?P<kn>\d+))?"
                      r"(?:-(?P<t>oracle|\d*\.?\d+)-(?P<k>\d+))?")


def parse_conf(policy: str):
    """'conf-stop-0.3-8' -> ('conf-stop', (0, 0.3, 8)); 'ngram-else-eagle-skip-conf-16-0.3-8' ->
    ('ngram-else-eagle-skip-conf', (16, 0.3, 8)); T = 'oracle' gives T = None (the ceiling: a perfect stop);
    None if not a confidence policy."""
    m = _CONF_RE.fullmatch(str(policy).strip().lower())
    if not m:
        return None
    kind, kn, t, k = m.group("kind"), m.group("kn"), m.group("t"), m.group("k")
    if kind == "conf-stop" and kn is not None:
        raise SimulationError(f"policy {policy!r}: conf-stop takes T and K only (conf-stop-T-K, e.g. conf-stop-0.3-8)")
    if kind != "conf-stop" and (kn is None) != (t is None):
        raise SimulationError(f"policy {policy!r}: give all three of KN-T-K (e.g. {kind}-16-0.3-8) or none")
    kn = int(kn) if kn is not None else (0 if kind == "conf-stop" else CONF_KN)
    T = None if t == "oracle" else float(t) if t is not None else CONF_T
    k = int(k) if k is not None else CONF_K
    if k < 1 or (kind != "conf-stop" and kn < 1):
        raise SimulationError(f"policy {policy!r}: every k must be >= 1")
    if T is not None and not 0.0 <= T <= 1.0:
        raise SimulationError(f"policy {policy!r}: the threshold T must lie in [0, 1], got {T}")
    return kind, (kn, T, k)


def conf_name(kind: str, kn: int, T, k: int) -> str:
    """The policy string of (kind, KN, T, K) (T None: 'oracle')."""
    t = "oracle" if T is None else f"{T:g}"
    return f"conf-stop-{t}-{k}" if kind == "conf-stop" else f"{kind}-{kn}-{t}-{k}"


def stop_lengths(conf: np.ndarray, T: float | None, K: int, acc: np.ndarray | None = None):
    """Per position: (proposed, computed) drafts of the stop rule with cap K. ``conf`` [positions, >= K]: the
    drafter's probability of its own token at draft d = 1..K (NaN, absent, reads as 0: a stop). Drafts are computed
    in order; after draft d the running product c_1 * ... * c_d is compared with T; the first d where it falls below
    T is computed (its forward is paid) but not proposed, and drafting stops: proposed = d - 1, computed = d; no such
    d up to K: K and K. T None: the ceiling, a perfect stop (``acc``, the proposer's acc_len, needed): proposed =
    min(acc - 1, K), computed = min(acc, K), the rejected draft a stop must read to stop included."""
    if T is None:
        a = np.asarray(acc, np.int64)
        return np.minimum(a - 1, K), np.minimum(a, K)
    c = np.nan_to_num(np.asarray(conf, np.float64)[:, :K], nan=0.0)
    below = np.cumprod(c, axis=1) < T
    hit = below.any(axis=1)
    first = np.argmax(below, axis=1)
    return np.where(hit, first, K).astype(np.int64), np.where(hit, first + 1, K).astype(np.int64)


def conf_steps(reqs, proposers, ngdl, conf, kn: int, T, K: int, cm, kind: str):
    """Steps and charges of ``conf-stop`` (one model proposer) or ``ngram-else-eagle-skip-conf`` (n-gram where
    its lookup matched, capped at KN, else the model proposer's stop-rule proposal; the model proposer drafts only
    where n-gram does not serve and pays its catch-up on re-entry). ``conf``: the model proposer's confidence
    [total positions, >= K] in ``reqs``' order (None for T None). Returns (req, p, idx, inp, gen, charges)."""
    mo = next(i for i, q in enumerate(proposers) if not is_ngram(q))
    proposed, computed = stop_lengths(conf, T, K, reqs.acc[mo])
    if kind == "conf-stop":
        req, p, idx, inp, gen = walk_compiled(reqs.acc[mo], proposed, reqs.off, False)
        return req, p, idx, inp, gen, [(cm.drafter(proposers[mo]), None, computed[idx], False)]
    return _switch_walk(reqs, proposers, 1 - mo, ngdl, kn, proposed, computed, True, cm)[:6]
