"""Causal proposer-and-length selectors for the simulator: ``adaptive-rule`` and ``adaptive-learned``.

The oracles of :mod:`spec_repro.simulate` read the future (``acc_len`` at the step's own position). A policy here
runs: at each step it reads only *causal signals*, chooses which proposers run, which proposal is verified and
its length k (<= the trace's k_max), and the simulator produces ``min(a_v, k + 1)`` tokens, ``a_v`` = the verified
proposer's acc_len at the position (k = 0: nothing is verified beyond the target's own token, one token).

Positions
---------
A request that has produced p tokens starts a step at output position ``j = p - 1`` (the simulator's array index:
the context is the prompt + output tokens ``0..j``; ``acc[j]`` counts how many proposed tokens match output
tokens ``j+1, j+2, ...`` plus one). "A step start q" below is such an index. The rule "acc[q] capped at
p - q" (p = tokens produced so far = j + 1) is ``min(acc[q], j - q + 1)``: the j - q tokens emitted after q show
how many of q's proposed tokens matched, and whether one failed.

Causal signals (exactly what a decision at position j reads; nothing else from the trace)
-----------------------------------------------------------------------------------------
1. The prompt length P, the tokens produced p = j + 1, the batch size B, the trace's k_max and the cost model.
   (Not the output length L.)
2. ``ng_dl``: n-gram's proposal length at j (0 = no match), from the tokens up to j: the trace's ``draft_len``
   for n-gram (recorded from the context) or, for the study's published files, recomputed from the token ids with
   ``spec_repro.proposers.ngram.ngram_lookup_all`` (prompt_lookup_min 3, max 7, k_max tokens).
3. ``ng_run``: the largest m in 1..min(k_max, j) with ``min(acc_ngram[j - m], ng_dl[j - m] + 1) >= m + 1``: the
   n-gram proposal made m positions ago matched all m tokens emitted since (0 if none). Any earlier n-gram proposal
   can be recomputed from the tokens, so its acc at q < j may be read, capped at j - q + 1 (here: at m + 1).
4. Per proposer, decayed counts (factor ``decay`` per update) over its *revealed* outcomes: at each step start q
   where the proposer ran (and was paid for) with proposal length d, the value ``v = min(acc[q], d + 1, j' - q +
   1)`` read at the next step start j' (so within the cap above), and whether a rejection was seen (acc[q] below
   that cap). n-gram's proposal is always observable (its lookup runs every step, d = ng_dl[q]); its counts are
   kept apart for "copy" steps (``ng_run >= copy_run`` at q) and "cold" ones. From the counts: ``alpha1``, the
   estimated chance that the first proposed token is accepted, and ``alpha2``, that a later one is, given the
   previous one was (n-gram: each from its own counts; a model proposer: one pooled rate for both), each =
   (accepted + a0 * pool_w) / (accepted + rejected + pool_w), the prior a0 the population's estimate: the same
   rate over the undecayed counts of every outcome revealed in the requests served before this one (the walk
   serves requests one after another, in the order of their ids, as the duplicated batch would; under ``mixed``
   batching an approximation), itself with prior_a worth prior_w tokens. A model proposer's rate is then lowered
   by ``lcb`` standard errors, sqrt(a (1 - a) / (its observed tokens + pool_w)): the rule drafts the k whose
   estimate is highest, and an estimate picked for being high is too high on average. ``last`` = the last revealed v;
   ``since`` = steps since the proposer was last verified.

A test (tests/test_adaptive.py) perturbs every value a decision may not see (all acc at positions >= j and n-gram's
draft_len after j, acc at earlier positions where a model proposer did not run, the part of revealed values above
their cap, the output length) and checks that no decision of that request, nor of the requests before it, changes;
another perturbs what a request never reveals and checks that no decision of any request, later ones included,
changes (the population's counts hold revealed outcomes only).

Policies
--------
``adaptive-rule`` (thresholds on the signals, costed with the simulator's own cost model): the n-gram lookup runs
every step (free of drafting cost where it finds no match, as the study's n-gram rule). For each proposer q and
each k in 1..k_q (k_q = ng_dl for n-gram, k_max otherwise) the expected tokens ``1 + alpha1 * (1 + alpha2 + ... +
alpha2^(k-1))`` (n-gram: the copy estimates when ``ng_run >= copy_run``, else the cold ones) is divided by the
step's cost (target forward of B*(k+1) tokens at kv = B*(P+p), q's drafting of k
tokens, the n-gram lookup, the overhead: the duplicated batch's step, an approximation under ``mixed`` batching);
k = 0 (no speculation) competes too. The best (q, k) is verified and only
q (and the n-gram lookup) runs: a step that verifies n-gram skips the model drafters' cost. A model proposer not
verified for ``probe`` steps is verified once at its best k so its estimate does not go stale. The rule's
per-decision pieces (``_reveal``, ``_estimates``, ``_rule_choice``, ``_advance``) are also what the live vLLM hybrid
(:mod:`spec_repro.engines.vllm.hybrid`) calls at each engine step, so the simulated and the live rule are one code.

Ragged batches: with a cost model that has a ragged forward (``CostModel.ragged_target``), the rule's step cost and
the learned policy's labels price a step that verifies k != k_max tokens per request (k = 0, no speculation,
included) with it, k_max being the engine's ``num_speculative_tokens`` (the trace's k_max here; vLLM's value in the
live hybrid, which builds the same arrays with ``_costs``, so the live rule prices alike when given such a model).
Like the rest of the rule's cost this is the duplicated batch's step (every copy chooses alike); under ``mixed``
batching whether the other requests make the step ragged is not known to the decision. The simulator prices the
steps the policies take (ragged where k != k_max) in :mod:`spec_repro.simulate`. A model without a ragged forward
gives the same decisions as before. With a CUDA-graph cap (``CostModel.graph_cap``) a step verifying more than the cap
(B * (k + 1) tokens, the duplicated batch's) is priced with the ragged forward too, k = k_max included.

``adaptive-learned``: a scikit-learn ``DecisionTreeRegressor`` (multi-output) maps the signal vector (ng_dl,
ng_run, log2 P, log2 p, and per proposer alpha1, alpha2, last, since) to the expected tokens-per-second of every action
(proposer, k in ``K_GRID``, or no speculation); the policy takes the best predicted action. Training states are
the steps ``adaptive-rule`` visits at the same batch size, labelled with each action's realised tokens ÷ step cost.
Request-level cross-validation: requests are split into ``folds`` groups (seeded); each request's decisions come
from the tree fitted on the other groups only. Needs at least ``MIN_LEARNED_REQUESTS`` requests per (dataset,
model).

Parameters (``RuleParams``): the rule's thresholds (copy_run, decay, prior, probe) and the tree's size (depth 3, 30
states per leaf) were chosen on the committed traces (small grids, judged by the worst ratio to the best fixed k
over all committed workloads): in-sample choices, whereas each tree's fit is cross-validated. pool_w = 10 and
lcb = 0.25 were chosen on the committed traces alone (``grids.tune_rule`` over pool_w 5 / 10 / 20 x lcb 0.25 / 0.5
/ 1, llama3.1-8b-h100-per-token, bs 1 / 16 / 64), so the study's published traces are out of sample for them.
``RuleParams(pool_w=0, lcb=0)`` is the rule on the request's own counts alone (no population, no lower bound).

Drafting charged (``draft_cost``): adaptive rows are always ``ran``: every proposer the policy ran at a step pays
its rule with its proposal (n-gram: its fraction of F where it found a match; a linear drafter every step it ran;
a per-token drafter per drafted token). A model proposer's proposal is k tokens (the trace's per-position
draft_len of model proposers is not read).
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from .simcore import SimulationError, is_ngram, ngram_match

try:
    from numba import njit
except ImportError:  # pragma: no cover - numba is a dependency; plain Python still works, only slower
    def njit(*a, **k):
        return a[0] if a and callable(a[0]) else (lambda f: f)

__all__ = ["ADAPTIVE_POLICIES", "RuleParams", "K_GRID", "MIN_LEARNED_REQUESTS", "adaptive_steps",
           "prev_ran_of", "decisions", "fold_of_requests"]

ADAPTIVE_POLICIES = ("adaptive-rule", "adaptive-learned")
#: proposal lengths the learned policy chooses among (capped at the trace's k_max; n-gram also at ng_dl)
K_GRID = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16)
MIN_LEARNED_REQUESTS = 10
from .simcore import KIND_CODE as _KIND_CODE  # noqa: E402


@dataclass(frozen=True)
class RuleParams:
    """Thresholds of ``adaptive-rule`` (and of the signals both policies read)."""

    copy_run: int = 2        # ng_run at or above this: n-gram is in a copy region (its "copy" estimate applies)
    decay: float = 0.9       # weight of older revealed outcomes per new one
    prior_a: float = 0.8     # prior per-token acceptance of the population's estimate (optimistic: a proposer is
                             # tried before it is judged; with pool_w = 0 the request's own prior) ...
    prior_w: float = 1.0     # ... worth this many observed tokens
    probe: int = 16          # verify a model proposer after this many steps without it
    pool_w: float = 10.0     # the population's estimate (earlier requests) is the request's prior, worth this many
                             # observed tokens (0: the request's own counts with prior_a, prior_w alone)
    lcb: float = 0.25        # a model proposer's estimate lowered by this many standard errors (winner's curse)
    folds: int = 5           # adaptive-learned: request-level cross-validation folds
    max_depth: int = 3       # adaptive-learned: tree depth
    min_leaf: int = 30       # adaptive-learned: samples per leaf
    max_train: int = 6000    # adaptive-learned: training states per fold (a seeded subsample beyond this)

    def array(self) -> np.ndarray:
        return np.array([self.copy_run, self.decay, self.prior_a, self.prior_w, self.probe, self.pool_w, self.lcb],
                        np.float64)


# ---- the step walk ---------------------------------------------------------------------------------------------
@njit(cache=True)
def _draft_time(kind, dk, dt, d0, frac, kv, inp, F, B, d, cs=0.0):
    if kind == 0:
        return dk * kv + dt * inp + d0
    if kind == 1:
        return frac * F + cs if d > 0 else 0.0
    return d * (dk * kv + dt * B + d0) + (cs if d > 0 else 0.0)


@njit(cache=True)
def _catch_up_time(kind, dk, dt, d0, frac, kv, F, B, cup):
    """``cup`` draft forwards of a drafter coming back after skipped steps (see costmodel.Drafter.catch_up)."""
    if cup <= 0.0:
        return 0.0
    if kind == 2:
        return cup * (dk * kv + dt * B + d0)
    return cup * _draft_time(kind, dk, dt, d0, frac, kv, 2, F, B, 1)


# The per-decision pieces, shared by the walk below and the live policy (spec_repro.engines.vllm.hybrid): one
# request's signal state is cnt (Q, 2, 4), last (Q,), since (Q,), prev_ran (Q,) and prev_d (Q,).
@njit(cache=True)
def _reveal(cnt, last, q, b, a, lim, decay):
    """Fold one revealed outcome of proposer q (bucket b) into its decayed counts: ``a`` its acceptance at the
    previous step start (exact when below ``lim``), ``lim`` = min(proposal + 1, tokens emitted since + 1)."""
    v = min(a, lim)   # revealed: acc exactly if below lim, else "at least lim"
    rej = a < lim
    for c in range(4):
        cnt[q, b, c] *= decay
    if v >= 2:
        cnt[q, b, 0] += 1.0
        cnt[q, b, 2] += v - 2
        if rej:
            cnt[q, b, 3] += 1.0
    elif rej:
        cnt[q, b, 1] += 1.0
    last[q] = v


@njit(cache=True)
def _alphas(cnt, ng, bucket, prior_a, prior_w, alpha1, alpha2):
    """alpha1 / alpha2 of every proposer from its counts (n-gram's from its ``bucket``: 1 copy, 0 cold)."""
    for q in range(cnt.shape[0]):
        if q == ng:   # n-gram: first token and the rest apart (its whole proposal is always observed)
            alpha1[q] = (cnt[q, bucket, 0] + prior_a * prior_w) / (cnt[q, bucket, 0] + cnt[q, bucket, 1]
                                                                    + prior_w)
            alpha2[q] = (cnt[q, bucket, 2] + prior_a * prior_w) / (cnt[q, bucket, 2] + cnt[q, bucket, 3]
                                                                    + prior_w)
        else:         # a model proposer: one pooled rate (short proposals reveal little about later tokens)
            acc_n = cnt[q, 0, 0] + cnt[q, 0, 2]
            alpha1[q] = (acc_n + prior_a * prior_w) / (acc_n + cnt[q, 0, 1] + cnt[q, 0, 3] + prior_w)
            alpha2[q] = alpha1[q]


@njit(cache=True)
def _estimates(cnt, pool, ng, bucket, prior_a, prior_w, pool_w, lcb, alpha1, alpha2, pa1, pa2):
    """alpha1 / alpha2 of every proposer as ``adaptive-rule`` reads them: the population's estimate (``_alphas`` of
    ``pool``, the undecayed counts of the requests served before this one, with prior_a, prior_w) is the prior of
    the request's own counts ``cnt``, worth ``pool_w`` tokens; a model proposer's estimate is then lowered by
    ``lcb`` standard errors (sqrt(a (1 - a) / n), n its observed tokens + pool_w), because the k chosen is the
    one whose estimate is highest and an estimate picked for being high is, on average, too high. pool_w = 0:
    ``_alphas`` of the request's counts alone (the lower bound with n + prior_w)."""
    if pool_w <= 0.0:
        _alphas(cnt, ng, bucket, prior_a, prior_w, alpha1, alpha2)
        w = prior_w
    else:
        _alphas(pool, ng, bucket, prior_a, prior_w, pa1, pa2)
        w = pool_w
    for q in range(cnt.shape[0]):
        if q == ng:
            if pool_w > 0.0:
                alpha1[q] = (cnt[q, bucket, 0] + pa1[q] * w) / (cnt[q, bucket, 0] + cnt[q, bucket, 1] + w)
                alpha2[q] = (cnt[q, bucket, 2] + pa2[q] * w) / (cnt[q, bucket, 2] + cnt[q, bucket, 3] + w)
            continue
        acc_n = cnt[q, 0, 0] + cnt[q, 0, 2]
        n = acc_n + cnt[q, 0, 1] + cnt[q, 0, 3] + w
        a = (acc_n + pa1[q] * w) / n if pool_w > 0.0 else alpha1[q]
        alpha1[q] = max(0.0, a - lcb * np.sqrt(a * (1.0 - a) / n))
        alpha2[q] = alpha1[q]


@njit(cache=True)
def _rule_choice(ng, ng_dl, kmax, kv, B, alpha1, alpha2, since, prev_ran, first, tcost, dkind, dk, dt, d0, frac,
                 cstep, creq, cup, probe):
    """``adaptive-rule``'s decision: (verified proposer, -1 = none; k). ``kv`` = B * (P + p); ``first``: the
    request's first step (no catch-up is charged). ``tcost`` = (c_kv, c_tok, c0, overhead[, ragged c_kv, c_tok,
    c0, graph cap]): with the ragged forward, a step verifying k != kmax tokens per request (no speculation
    included) or more than the cap in all (B * (k + 1) > cap; inf: none) is priced with it (the engine's k is
    kmax; see ``_costs``). A drafter's fixed work per step where it drafts: ``cstep + creq * B``."""
    c_kv, c_tok, c0, over = tcost[0], tcost[1], tcost[2], tcost[3]
    rag = tcost.shape[0] >= 7
    v = -1
    k = 0
    F = c_kv * kv + c_tok * B + c0
    if rag:
        F = tcost[4] * kv + tcost[5] * B + tcost[6]
    lk = _draft_time(dkind[ng], dk[ng], dt[ng], d0[ng], frac[ng], kv, 1, F, B, ng_dl) if ng >= 0 else 0.0
    best = 1.0 / (F + lk + over)
    force = -1
    fk = 0
    for q in range(alpha1.shape[0]):
        kq = ng_dl if q == ng else kmax
        e = 1.0
        term = alpha1[q]
        qbest = -1.0
        qk = 0
        for kk in range(1, kq + 1):
            e += term
            term *= alpha2[q]
            F = c_kv * kv + c_tok * B * (kk + 1) + c0
            if rag and (kk != kmax or B * (kk + 1) > tcost[7]):
                F = tcost[4] * kv + tcost[5] * B * (kk + 1) + tcost[6]
            t = F + over + _draft_time(dkind[q], dk[q], dt[q], d0[q], frac[q], kv, kk + 1, F, B, kk,
                                       cstep[q] + creq[q] * B)
            if q != ng and not first and not prev_ran[q]:   # it skipped the last step: catch up
                t += _catch_up_time(dkind[q], dk[q], dt[q], d0[q], frac[q], kv, F, B, cup[q])
            if ng >= 0 and q != ng:
                t += _draft_time(dkind[ng], dk[ng], dt[ng], d0[ng], frac[ng], kv, kk + 1, F, B, ng_dl)
            g = e / t
            if g > qbest:
                qbest = g
                qk = kk
        if qbest > best:
            best = qbest
            v = q
            k = qk
        if q != ng and since[q] >= probe and qk > 0 and force < 0:
            force = q
            fk = qk
    if force >= 0 and v != force:
        v = force
        k = fk
    return v, k


@njit(cache=True)
def _advance(v, k, ng, ng_dl, since, prev_ran, prev_d):
    """After a step that verified proposer v (-1: none) with k tokens: what ran, with which proposal length."""
    for q in range(since.shape[0]):
        prev_ran[q] = False
        prev_d[q] = 0
        since[q] += 1
    if v >= 0:
        prev_ran[v] = True
        prev_d[v] = k
        since[v] = 0
    if ng >= 0 and ng_dl > 0:   # the lookup ran; its whole proposal is recomputable from the tokens
        prev_ran[ng] = True
        prev_d[ng] = ng_dl


@njit(cache=True)
def _walk(acc, ngdl, ng, P, off, kmax, B, tcost, dkind, dk, dt, d0, frac, cstep, creq, cup, prm, mode,
          t_feat, t_thr, t_left, t_right, t_act, tree_of_req, act_q, act_k, record, order):
    """Walk every request under the policy (mode 0: rule, 1: tree), one after another in ``order``. Returns per
    step (in walk order): request, p before the step,
    array index, input length, tokens produced, verified proposer (-1: none), ran (Q, S), proposal (Q, S), and the
    signal vectors (S, 4 + 3Q) when ``record``."""
    Q = acc.shape[0]
    n = len(P)
    total = off[n]
    nfeat = 4 + 4 * Q
    copy_run, decay, prior_a, prior_w, probe, pool_w, lcb = prm[0], prm[1], prm[2], prm[3], prm[4], prm[5], prm[6]
    req = np.empty(total, np.int64)
    pb = np.empty(total, np.int64)
    idx = np.empty(total, np.int64)
    inp = np.empty(total, np.int64)
    gen = np.empty(total, np.int64)
    ver = np.empty(total, np.int64)
    ran = np.zeros((Q, total), np.bool_)
    prop = np.zeros((Q, total), np.int64)
    feats = np.zeros((total if record else 0, nfeat), np.float64)
    x = np.zeros(nfeat, np.float64)
    cnt = np.zeros((Q, 2, 4), np.float64)  # per proposer and bucket: first token accepted/rejected, later ones
    last = np.zeros(Q, np.float64)
    since = np.zeros(Q, np.int64)
    prev_ran = np.zeros(Q, np.bool_)
    prev_d = np.zeros(Q, np.int64)
    alpha1 = np.zeros(Q, np.float64)
    alpha2 = np.zeros(Q, np.float64)
    pool = np.zeros((Q, 2, 4), np.float64)   # every revealed outcome so far, undecayed (the population)
    pool0 = np.zeros((Q, 2, 4), np.float64)  # ... as it stood when the request started: its prior
    plast = np.zeros(Q, np.float64)
    pa1 = np.zeros(Q, np.float64)
    pa2 = np.zeros(Q, np.float64)
    s = 0
    for ri in range(n):
        r = order[ri]
        o = off[r]
        L = off[r + 1] - o
        cnt[:, :, :] = 0.0
        pool0[:, :, :] = pool
        last[:] = 0.0
        since[:] = 0
        prev_ran[:] = False
        prev_d[:] = 0
        prev_j = -1
        prev_bucket = 0
        p = 1
        while p < L:
            j = p - 1
            # 1. what the tokens emitted since the previous step start reveal about the proposals made there
            if prev_j >= 0:
                cap = j - prev_j + 1      # p - q: the tokens emitted after position prev_j, plus one
                for q in range(Q):
                    if prev_ran[q] and prev_d[q] > 0:
                        _reveal(cnt, last, q, prev_bucket if q == ng else 0, acc[q, o + prev_j],
                                min(prev_d[q] + 1, cap), decay)
                        _reveal(pool, plast, q, prev_bucket if q == ng else 0, acc[q, o + prev_j],
                                min(prev_d[q] + 1, cap), 1.0)
            # 2. n-gram signals from the tokens
            ng_dl = 0
            ng_run = 0
            if ng >= 0:
                ng_dl = min(ngdl[o + j], kmax)
                for m in range(min(kmax, j), 0, -1):
                    # the proposal at j - m (recomputable from the tokens) matched all m tokens emitted since
                    if min(acc[ng, o + j - m], ngdl[o + j - m] + 1) >= m + 1:
                        ng_run = m
                        break
            bucket = 1 if ng_run >= copy_run else 0
            _estimates(cnt, pool0, ng, bucket, prior_a, prior_w, pool_w, lcb, alpha1, alpha2, pa1, pa2)
            x[0] = ng_dl
            x[1] = ng_run
            x[2] = np.log2(P[r] + 1.0)
            x[3] = np.log2(p + 1.0)
            for q in range(Q):
                x[4 + 4 * q] = alpha1[q]
                x[5 + 4 * q] = alpha2[q]
                x[6 + 4 * q] = last[q]
                x[7 + 4 * q] = min(since[q], 64)
            if record:
                for f in range(nfeat):
                    feats[s, f] = x[f]
            # 3. decide: verified proposer v (-1: none) and k
            kv = B * (P[r] + p)
            v = -1
            k = 0
            if mode == 0:
                v, k = _rule_choice(ng, ng_dl, kmax, kv, B, alpha1, alpha2, since, prev_ran, prev_j < 0, tcost,
                                    dkind, dk, dt, d0, frac, cstep, creq, cup, probe)
            else:
                t_i = tree_of_req[r]
                node = 0
                while t_left[t_i, node] >= 0:
                    if np.float32(x[t_feat[t_i, node]]) <= t_thr[t_i, node]:
                        node = t_left[t_i, node]
                    else:
                        node = t_right[t_i, node]
                a_i = t_act[t_i, node]
                v = act_q[a_i]
                k = act_k[a_i]
                if v >= 0:
                    k = min(k, kmax)
                    if v == ng:
                        k = min(k, ng_dl)
                    if k <= 0:
                        v = -1
                        k = 0
            # 4. the step
            i = k + 1
            g = min(acc[v, o + j], i) if v >= 0 else 1
            req[s] = r
            pb[s] = p
            idx[s] = o + j
            inp[s] = i
            gen[s] = g
            ver[s] = v
            _advance(v, k, ng, ng_dl, since, prev_ran, prev_d)
            if v >= 0:
                ran[v, s] = True
                prop[v, s] = k
            if ng >= 0 and ng_dl > 0:   # the lookup ran; its whole proposal is recomputable from the tokens
                ran[ng, s] = True
                if v != ng:
                    prop[ng, s] = ng_dl
            prev_j = j
            prev_bucket = bucket
            s += 1
            p += g
    return (req[:s], pb[:s], idx[:s], inp[:s], gen[:s], ver[:s], ran[:, :s], prop[:, :s],
            feats[:s] if record else feats)


# ---- inputs ----------------------------------------------------------------------------------------------------
def prev_ran_of(req, ran) -> np.ndarray:
    """(Q, S): whether each proposer ran at the same request's previous step (True at a request's first step)."""
    first = np.r_[True, req[1:] != req[:-1]] if len(req) else np.zeros(0, bool)
    prev = np.concatenate([np.ones((ran.shape[0], 1), bool), ran[:, :-1]], axis=1) if len(req) else ran.copy()
    return prev | first


@dataclass
class _Inputs:
    acc: np.ndarray
    ngdl: np.ndarray
    ng: int
    kmax: int
    tcost: np.ndarray
    dkind: np.ndarray
    dk: np.ndarray
    dt: np.ndarray
    d0: np.ndarray
    frac: np.ndarray
    cstep: np.ndarray  # drafters' d0 (per step where they draft)
    creq: np.ndarray   # drafters' d0 per request in the step (per_token's c_step_req)
    cup: np.ndarray    # catch-up draft forwards on re-entry
    acts: np.ndarray   # (A, 2): proposer (-1: none), k
    alignment: str = "recorded"   # where n-gram's match came from (simcore.ngram_match)


def _inputs(reqs, requests, proposers, cm, kmax: int) -> _Inputs:
    Q = len(proposers)
    ngs = [i for i, q in enumerate(proposers) if is_ngram(q)]
    ng = ngs[0] if ngs else -1
    ngdl = np.zeros(int(reqs.off[-1]), np.int64)
    alignment = "none"
    if ng >= 0:
        m = ngram_match(reqs, requests, ng, kmax)
        if m.lens is None:
            raise SimulationError(f"adaptive policies need n-gram's match at each position: {m.why}")
        ngdl = reqs.dlen[ng].copy() if m.alignment == "recorded" else m.lens
        alignment = m.alignment
    acts = [(-1, 0)] + [(q, k) for q in range(Q) for k in K_GRID if k <= kmax]
    return _Inputs(acc=np.ascontiguousarray(reqs.acc, dtype=np.int64), ngdl=ngdl, ng=ng, kmax=int(kmax),
                   **_costs(cm, proposers), acts=np.array(acts, np.int64).reshape(-1, 2), alignment=alignment)


def _costs(cm, proposers) -> dict[str, np.ndarray]:
    """The cost model as the rule's arrays: target (c_kv, c_tok, c0, overhead, and where the model has a ragged
    forward its c_kv, c_tok, c0 and the CUDA-graph cap in tokens, inf for none) and per proposer its drafter."""
    drs = [cm.drafter(q) for q in proposers]
    rt = getattr(cm, "ragged_target", None)
    cap = getattr(cm, "graph_cap", None)
    ragged = [rt.c_kv, rt.c_tok, rt.c0, np.inf if cap is None else float(cap)] if rt is not None else []
    return {"tcost": np.array([cm.c_kv, cm.c_tok, cm.c0, cm.overhead] + ragged, float),
            "dkind": np.array([_KIND_CODE[d.kind] for d in drs], np.int64),
            "dk": np.array([d.c_kv for d in drs], float), "dt": np.array([d.c_tok for d in drs], float),
            "d0": np.array([d.c0 for d in drs], float), "frac": np.array([d.fraction for d in drs], float),
            "cstep": np.array([d.c_step for d in drs], float), "creq": np.array([d.c_step_req for d in drs], float),
            "cup": np.array([d.catch_up for d in drs], float)}


_NO_TREE = (np.zeros((1, 1), np.int64), np.zeros((1, 1), np.float64), np.full((1, 1), -1, np.int64),
            np.full((1, 1), -1, np.int64), np.zeros((1, 1), np.int64))


def _run(reqs, inp: _Inputs, B: int, prm: RuleParams, mode: int, trees=_NO_TREE, tree_of_req=None,
         record=False):
    """The walk, requests served in the order of their ids (so a trace's file order does not change the population's
    counts), its steps returned grouped by request in the order of ``reqs``."""
    tor = np.zeros(len(reqs.L), np.int64) if tree_of_req is None else tree_of_req
    ng = inp.ng
    order = np.argsort(np.asarray([str(i) for i in reqs.ids], dtype=object), kind="stable").astype(np.int64)
    out = _walk(inp.acc, inp.ngdl, ng, reqs.P.astype(np.int64), reqs.off, inp.kmax, int(B), inp.tcost,
                inp.dkind, inp.dk, inp.dt, inp.d0, inp.frac, inp.cstep, inp.creq, inp.cup, prm.array(), mode,
                *trees, tor, inp.acts[:, 0].copy(), inp.acts[:, 1].copy(), record, order)
    perm = np.argsort(out[0], kind="stable")
    return tuple(a[..., perm] if a.ndim == 2 and i in (6, 7) else a[perm] if (i < 8 or record) else a
                 for i, a in enumerate(out))


# ---- adaptive-learned -------------------------------------------------------------------------------------------
def _labels(reqs, inp: _Inputs, B: int, step_req, step_p, step_idx, prev_ran=None) -> np.ndarray:
    """Realised tokens ÷ step cost of every action at the given step states (S, A); ``prev_ran`` (Q, S): whether
    each proposer ran at the request's previous step (a model proposer that did not pays its catch-up)."""
    c_kv, c_tok, c0, over = inp.tcost[:4]
    rag = len(inp.tcost) >= 7   # the ragged forward where k != kmax or past the graph cap (see _costs)
    kv = B * (reqs.P[step_req] + step_p).astype(float)
    ng = inp.ng
    ngdl = np.minimum(inp.ngdl[step_idx], inp.kmax) if ng >= 0 else np.zeros(len(step_idx), np.int64)
    out = np.empty((len(step_idx), len(inp.acts)))

    def dtime(q, inp_len, F, d):
        kind = inp.dkind[q]
        if kind == 0:
            return inp.dk[q] * kv + inp.dt[q] * inp_len + inp.d0[q]
        if kind == 1:
            return np.where(d > 0, inp.frac[q] * F + inp.cstep[q], 0.0)
        fixed = inp.cstep[q] + inp.creq[q] * B     # per step where it drafts
        return d * (inp.dk[q] * kv + inp.dt[q] * B + inp.d0[q]) + np.where(d > 0, fixed, 0.0)

    def catch_up(q, F):
        if prev_ran is None or not inp.cup[q]:
            return 0.0
        fwd = (inp.dk[q] * kv + inp.dt[q] * B + inp.d0[q]) if inp.dkind[q] == 2 else dtime(q, 2, F, np.ones(len(F)))
        return np.where(prev_ran[q], 0.0, inp.cup[q] * fwd)

    for a, (q, k) in enumerate(inp.acts):
        if q < 0:
            kk = np.zeros(len(step_idx), np.int64)
        else:
            kk = np.full(len(step_idx), min(int(k), inp.kmax), np.int64)
            if q == ng:
                kk = np.minimum(kk, ngdl)
        F = c_kv * kv + c_tok * B * (kk + 1) + c0
        if rag:
            F = np.where((kk != inp.kmax) | (B * (kk + 1) > inp.tcost[7]),
                         inp.tcost[4] * kv + inp.tcost[5] * B * (kk + 1) + inp.tcost[6], F)
        t = F + over
        tok = np.ones(len(step_idx))
        on = kk > 0
        if q >= 0:
            tok = np.where(on, np.minimum(inp.acc[q, step_idx], kk + 1), 1.0)
            t = t + np.where(on, dtime(q, kk + 1, F, kk) + (catch_up(q, F) if q != ng else 0.0), 0.0)
        if ng >= 0:  # the lookup ran (charged where it matched), unless n-gram itself is verified (counted above)
            t = t + np.where((q == ng) & on, 0.0, dtime(ng, kk + 1, F, ngdl))
        out[:, a] = tok / t
    return out


def _fit_trees(X, Y, groups, folds, prm: RuleParams, seed: int):
    """One tree per fold, each fitted on the states of the requests outside that fold; packed as arrays."""
    from sklearn.tree import DecisionTreeRegressor

    trees = []
    for f in range(folds):
        m = np.flatnonzero(groups != f)
        if len(m) > prm.max_train:  # one random stream per fold: its subsample never depends on fold f's own states
            rng = np.random.default_rng([seed, 14, f])
            m = np.sort(rng.choice(m, prm.max_train, replace=False))
        t = DecisionTreeRegressor(max_depth=prm.max_depth, min_samples_leaf=prm.min_leaf, random_state=seed)
        t.fit(X[m].astype(np.float32), Y[m])
        trees.append(t.tree_)
    N = max(t.node_count for t in trees)
    feat = np.zeros((folds, N), np.int64)
    thr = np.zeros((folds, N), np.float64)
    left = np.full((folds, N), -1, np.int64)
    right = np.full((folds, N), -1, np.int64)
    act = np.zeros((folds, N), np.int64)
    for f, t in enumerate(trees):
        n = t.node_count
        feat[f, :n] = np.maximum(t.feature, 0)
        thr[f, :n] = t.threshold
        left[f, :n] = t.children_left
        right[f, :n] = t.children_right
        act[f, :n] = np.argmax(t.value[:, :, 0], axis=1)
    return feat, thr, left, right, act


def fold_of_requests(ids, folds: int, seed: int) -> np.ndarray:
    """Request-level fold assignment: requests ordered by a seeded hash of their id and dealt round-robin into
    ``folds`` groups (the same request gets the same fold whatever the file order)."""
    key = np.array([zlib.crc32(f"{seed}:{rid}".encode()) for rid in ids], np.int64)
    order = np.lexsort((np.arange(len(key)), key))
    out = np.empty(len(key), np.int64)
    out[order] = np.arange(len(key)) % folds
    return out


# ---- public ------------------------------------------------------------------------------------------------------
@dataclass
class AdaptiveSteps:
    req: np.ndarray
    p: np.ndarray
    idx: np.ndarray
    inp: np.ndarray
    gen: np.ndarray
    verified: np.ndarray
    ran: np.ndarray        # (Q, S) bool
    proposal: np.ndarray   # (Q, S)
    folds: np.ndarray | None = None


def adaptive_steps(reqs, requests, proposers, policy: str, B: int, cm, kmax: int, params: RuleParams | None = None,
                   seed: int = 42, inputs: _Inputs | None = None) -> AdaptiveSteps:
    """The step sequence of ``policy`` (``adaptive-rule`` / ``adaptive-learned``) at batch size ``B`` over the
    requests of one (dataset, model) group (``reqs``: ``simulate._Requests``; ``requests``: its request table)."""
    prm = params or RuleParams()
    inp = inputs or _inputs(reqs, requests, list(proposers), cm, kmax)
    if policy == "adaptive-rule":
        out = _run(reqs, inp, B, prm, 0)
        return AdaptiveSteps(*out[:8])
    if policy != "adaptive-learned":
        raise SimulationError(f"unknown adaptive policy {policy!r}; expected one of {ADAPTIVE_POLICIES}")
    n = len(reqs.L)
    if n < max(MIN_LEARNED_REQUESTS, prm.folds):
        raise SimulationError(f"adaptive-learned needs at least {max(MIN_LEARNED_REQUESTS, prm.folds)} requests "
                              f"per (dataset, model) for {prm.folds}-fold request-level cross-validation; got {n}")
    folds = fold_of_requests(reqs.ids, prm.folds, seed)
    req, p, idx, _i, _g, _v, ran, _pr, X = _run(reqs, inp, B, prm, 0, record=True)
    Y = _labels(reqs, inp, B, req, p, idx, prev_ran_of(req, ran))
    trees = _fit_trees(X, Y, folds[req], prm.folds, prm, seed)
    out = _run(reqs, inp, B, prm, 1, trees=trees, tree_of_req=folds)
    return AdaptiveSteps(*out[:8], folds=folds)


def decisions(st: AdaptiveSteps, reqs, proposers) -> "pd.DataFrame":
    """One row per step: request, position j, verified proposer ('' = none), k, and which proposers ran."""
    import pandas as pd

    names = np.array(list(proposers) + [""], dtype=object)
    d = pd.DataFrame({"request_id": np.asarray(reqs.ids, dtype=object)[st.req], "position": st.p - 1,
                      "verified": names[st.verified], "k": st.inp - 1})
    for i, q in enumerate(proposers):
        d[f"ran_{q}"] = st.ran[i]
    return d
