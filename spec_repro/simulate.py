"""Oracle / fixed-K speculative-decoding simulator over acceptance traces (the study's method, made fast).

Method (the study's released simulator). Per request: prompt length P, output length L and, per proposer
q, ``a_q[p]`` = tokens one step would produce if speculation started at output position p (accepted + 1).

Per request, the *step sequence* depends only on its own arrays and the policy. A request that has produced p
tokens (p = 1 right after prefill) reads ``a = a[p - 1]`` and proposes

- ``fixed-K`` (one proposer): ``K`` tokens, or ``min(K, draft_len[p-1])`` where the trace records what the
  proposer really proposed (``draft_len`` 0 = n-gram found no match: it verifies one token and drafts for free).
  Where ``draft_len`` is unknown (published traces) an n-gram proposer is modelled as the released code does: at
  positions with a = 1 it matches with a per-dataset probability (ShareGPT 0.2, CNN/DailyMail 0.4, GSM8K 0.2,
  InstructCoder 0.8; ``ngram_match_prob=`` overrides or adds). The draw for request ``rid`` is
  ``numpy.random.default_rng([seed, zlib.crc32(rid.encode())]).random(L) < prob``, one draw per position shared by
  all copies of a duplicated request (the released code draws per copy, so its copies drift apart; identical
  prompts would really match identically). Other proposers always propose K.
- ``oracle`` (one proposer): exactly ``a - 1`` tokens; ``oracle-combine`` (any set): ``a = max_q a_q[p]``, the
  *winner* is the proposer reaching that max; on a tie, the one with the cheapest drafter (``combine_order``:
  drafting time of one drafted token at a reference step), so the accounting never depends on the order the
  proposers were listed in.

It verifies ``i = proposal + 1`` tokens and produces ``g = min(a, i)``; it is done once p >= L.

Cost per step (``spec_repro.costmodel``): target forward ``F(kv, n)``, n = the batch's tokens, kv = the KV cache
before the pass; a fixed overhead; drafting per request. One proposer: its own rule with its proposal (n-gram's
fraction of F is 0 where it proposes nothing; a linear drafter like EAGLE is charged every step; a per-token
drafter pays per drafted token). ``oracle-combine`` accounting (``draft_cost``):

- ``ngram-only``: what the released simulator charges: the ``ngram`` drafter's rule at EVERY step (also where
  nothing is proposed), whichever proposer wins;
- ``winner``: only the winner's rule, with the step's proposal;
- ``all``: every proposer in the set ran: the sum of their rules, each with its own oracle proposal a_q - 1;
- ``ran``: every proposer the policy ran pays, at each step, its rule with its proposal. For ``oracle-combine``
  every proposer runs at every step, so ``ran`` is ``all``; fixed-K and oracle pay their one proposer's rule under
  every accounting.

Ragged batches (a cost model with a ragged forward, ``CostModel.ragged_target``; see :mod:`spec_repro.costmodel`:
vLLM 0.25's V1 runner replays its full CUDA graph only when every request verifies exactly K + 1 tokens). A decode
step is *ragged* when some decoding request in it verifies other than K + 1 tokens, K = the engine's
``num_speculative_tokens``: fixed-K's K (a step whose proposal is cut by ``draft_len``, e.g. n-gram's 0 where it
found no match, is ragged), ``dynamic-k``'s k of the batch size, ``ngram-else-eagle[-skip]-KN-KE``'s max(KN, KE),
the adaptive policies' k_max of the trace. A ragged step's target forward (and an n-gram drafter's fraction of it)
is the ragged one. ``duplicate``: a request's B copies are identical, so a step is ragged for all of them iff the
request's proposal there differs from K; the affine sums price that exactly (separate sums over the ragged steps,
no fallback needed). ``mixed``: a batch step is ragged iff any running request that decodes in it is (the
compiled loop checks each step); newcomers' prefill tokens do not make a step ragged. The regular F prices
prefill, the no-SD baseline (one token per request: uniform for a no-SD engine) and every step of ``oracle`` /
``oracle-combine`` (idealised bounds that verify exactly the tokens that will be accepted; pricing them ragged
would make them no bound of the fixed-K rows). A cost model without a ragged forward prices every step as before,
to the bit.

The CUDA-graph cap (``CostModel.graph_cap``, with a ragged forward only): a decode step whose decoding requests verify
more than graph_cap tokens in all runs without vLLM's graphs and is priced with the ragged forward too, uniform or
not; this holds for every policy with an engine K and for the no-SD baseline (B > graph_cap), not for the oracles
(their idealised F everywhere, as above) nor prefill. ``duplicate``: a step of a request's B copies verifies B * i
tokens, so which steps pass the cap depends on B (the affine sums are taken once per distinct floor(cap / B)).
``mixed``: the decode tokens of each batch step (newcomers' prefill tokens excluded, as for raggedness).

``adaptive-rule`` / ``adaptive-learned`` (any proposer set): causal selectors of the proposers to run, the proposal
to verify and its length, see :mod:`spec_repro.adaptive`; they are always charged ``ran`` (their rows say so,
whatever accountings were asked for) and, since batch size is one of their signals, their step sequence is computed
per batch size.

Batching (``batching``):

- ``duplicate`` (the study's): each request is one batch of B identical copies. Prefill F(0, B*P) + overhead, then
  every step costs F(B*(P+p), B*i) + drafting + overhead for every copy. Baseline: F(B*(P+p), B) + overhead for
  p = 1..L-1. Batch throughput = B*L / (mean request latency); speedup = mean over batches of SD throughput /
  mean of baseline throughput (ratio of means). Copies are identical, so the step sequence is computed once per
  request and only its cost depends on B.
- ``mixed``: continuous batching over the requests in order (file order, or the sample's order): at most B
  run at once; a finished request's slot is refilled from the queue at the next step, whose single forward pass
  also prefills the newcomers (chunked prefill: n = sum of running requests' inputs + newcomers' prompts, and each
  newcomer gets its first token). kv = sum of P + p over running requests. A step's drafting time is, per
  charged proposer, the largest per-request drafting time among the requests it drafts for (the drafter runs once
  for the batch), summed over proposers; with identical requests this is the duplicated batch's cost. Throughput
  = all requests' tokens (sum of L) / makespan (first prefill to last token); speedup = SD / baseline throughput.

Result columns: dataset, model, proposers ('+'-joined), policy, draft_cost, batch_size, batching, n_requests,
speedup, sd_tokens_per_s, base_tokens_per_s, mean_tokens_per_step (tokens produced per SD decode step, the
simulated acceptance length), verify_share / draft_share / overhead_share (shares of SD time in target forwards,
prefill included, in drafting, in per-step overhead; they sum to 1), sd_time_s / base_time_s (duplicate: mean
over batches of the request latency; mixed: makespan), n_tokens (sum of L).

Known differences from the released simulator (github.com/SpecDecode-Bench/simulator), all deliberate:
n-gram match draws are per (request, position) from a per-request seed, shared by a duplicated batch's copies
(released: Python's global ``random`` stream, one draw per copy and step); EAGLE's drafting uses the KV size at
the start of the step for every copy (released: the running count, already raised by earlier copies in the same
step; the difference is below c_kv_draft * B * 21 tokens, < 0.3% of D_e at B = 128); L = the shortest proposer
array also for one-proposer runs on combined files (released: that proposer's own array). Every eligible
request is used unless ``sample`` is given (released: 300 sampled with seed 42).
"""
from __future__ import annotations

import functools
import random
import re
import zlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from .costmodel import CostModel, CostModelError, load_cost_model
from .simcore import KIND_CODE as _KIND_CODE
from .simcore import Requests as _Requests
from .simcore import SimulationError, group_arrays as _group_arrays, is_ngram as _is_ngram, ngram_match
from .simcore import norm_name as _norm
from .simcore import catch_up_charges, walk as _walk
from .baselines import CONF, SWITCH, conf_steps, dynamic_k_for, parse_conf, parse_switch, switch_steps
from .traces import Trace, TraceError

__all__ = ["simulate", "SimulationError", "POLICIES", "DRAFT_COSTS", "BATCHING", "NGRAM_MATCH_PROB",
           "parse_policy", "parse_proposers", "ngram_match_prob_for", "RESULT_COLUMNS"]

POLICIES = ("fixed-K", "oracle", "oracle-combine", "adaptive-rule", "adaptive-learned", "ngram-else-eagle[-KN-KE]",
            "ngram-else-eagle-skip[-KN-KE]", "dynamic-k", "conf-stop[-T-K]", "ngram-else-eagle-skip-conf[-KN-T-K]")
DRAFT_COSTS = ("ngram-only", "winner", "all", "ran")
_ADAPTIVE = ("adaptive-rule", "adaptive-learned")
BATCHING = ("duplicate", "mixed")
#: the released code's n-gram match probabilities at positions with acc_len = 1 (fixed-K, no recorded draft_len)
NGRAM_MATCH_PROB = {"sharegpt": 0.2, "cnn": 0.4, "cnndailymail": 0.4, "cnndm": 0.4, "gsm8k": 0.2,
                    "instructcoder": 0.8}
RESULT_COLUMNS = ["dataset", "model", "proposers", "policy", "draft_cost", "batch_size", "batching", "n_requests",
                  "speedup", "sd_tokens_per_s", "base_tokens_per_s", "mean_tokens_per_step", "verify_share",
                  "draft_share", "overhead_share", "sd_time_s", "base_time_s", "n_tokens"]
MAX_K = 32767                 # int16, the schema's k_max
MAX_BATCH = 1_000_000         # far above any engine's batch; keeps B * tokens exact in int64 and float64


def parse_policy(policy: str) -> tuple[str, int]:
    """'fixed-3' -> ('fixed', 3); 'oracle' -> ('oracle', 0); 'oracle-combine' -> ('oracle-combine', 0);
    'adaptive-rule' / 'adaptive-learned' / 'dynamic-k' -> (that name, 0); 'ngram-else-eagle[-skip]-KN-KE' -> (that
    name without the k's, (KN, KE)) (see :mod:`spec_repro.baselines`)."""
    p = str(policy).strip().lower()
    if p in ("oracle", "oracle-combine", "dynamic-k") + _ADAPTIVE:
        return p, 0
    sw = parse_switch(p)
    if sw is not None:
        return sw[0], (sw[1], sw[2])
    cf = parse_conf(p)
    if cf is not None:
        return cf
    close = re.fullmatch(r"fixed_?(\d+)", p)
    if close:
        raise SimulationError(f"unknown policy {policy!r}; did you mean fixed-{close.group(1)}?")
    m = re.fullmatch(r"fixed-(-?\d+)", p)
    if m:
        k = int(m.group(1))
        if k < 1:
            raise SimulationError(f"policy {policy!r}: K must be >= 1")
        if k > MAX_K:
            raise SimulationError(f"policy {policy!r}: K must be <= {MAX_K} (the largest k_max a trace holds)")
        return "fixed", k
    raise SimulationError(f"unknown policy {policy!r}; expected fixed-K (K >= 1, e.g. fixed-3), oracle, "
                          f"oracle-combine, adaptive-rule, adaptive-learned, ngram-else-eagle[-skip][-KN-KE], "
                          f"dynamic-k, conf-stop[-T-K] or ngram-else-eagle-skip-conf[-KN-T-K] (T a number in "
                          f"[0, 1] or 'oracle')")


def ngram_match_prob_for(dataset: str, override=None) -> float:
    """Match probability of the released code's n-gram "no match" model for ``dataset`` (case-insensitive)."""
    if isinstance(override, (int, float)):
        prob = float(override)
    else:
        table = {**NGRAM_MATCH_PROB, **{_norm(k): v for k, v in dict(override or {}).items()}}
        key = _norm(dataset)
        if key not in table:
            raise SimulationError(
                f"dataset {dataset!r}: no n-gram match probability for fixed-K on a trace without recorded "
                f"draft_len; known: sharegpt, cnn/cnn_dailymail, gsm8k, instructcoder. Pass ngram_match_prob=p "
                f"(or {{dataset: p}}), or use a trace that records draft_len")
        prob = float(table[key])
    if not 0.0 <= prob <= 1.0:
        raise SimulationError(f"ngram_match_prob must lie in [0, 1], got {prob}")
    return prob


@dataclass
class _Steps:
    req: np.ndarray
    p: np.ndarray
    inp: np.ndarray
    gen: np.ndarray
    charges: list      # [(Drafter, active bool array | None, proposal int array, always bool)]
    ragged: np.ndarray | None = None   # per step: the request verifies other than K + 1 tokens (None: never)


def _ragged(st: _Steps, cm: CostModel, K) -> _Steps:
    """``st`` with its ragged steps marked (verified proposal != the engine's K), where the cost model has a
    ragged forward and the policy an engine K (None: the oracles; see the module docstring)."""
    if not cm.has_ragged or K is None:
        return st
    return _Steps(st.req, st.p, st.inp, st.gen, st.charges, np.asarray(st.inp) - 1 != int(K))


def combine_order(cm: CostModel, proposers) -> list[str]:
    """Oracle Combine's tie-break order: cheapest drafter first, priced for one drafted token at a reference step
    (one request, 1024 KV tokens); equal costs keep the given order."""
    kv, F = 1024, float(cm.forward(1024, 2))
    return sorted(proposers, key=lambda q: float(cm.drafter(q).time(kv, 2, F, 1, 1)))


def _steps(reqs: _Requests, proposers, kind: str, K: int, draft_cost: str, cm: CostModel, dataset: str,
           seed: int, match_prob, ng_lens=None) -> _Steps:
    a = reqs.acc.max(axis=0) if kind == "oracle-combine" else reqs.acc[0]
    prop = np.zeros(0, np.int64)
    if kind == "fixed":
        q = proposers[0]
        dl = reqs.dlen[0]
        prop = np.full(len(a), K, np.int64)
        known = dl >= 0
        prop[known] = np.minimum(K, dl[known])
        if _is_ngram(q) and not known.all() and ng_lens is not None:   # the real lookup, from the token ids
            prop[~known] = np.minimum(K, ng_lens[~known])
        elif _is_ngram(q) and not known.all():
            p_match = ngram_match_prob_for(dataset, match_prob)
            u = np.concatenate([np.random.default_rng([seed, zlib.crc32(str(rid).encode())]).random(L)
                                for rid, L in zip(reqs.ids, reqs.L)])
            no_match = ~known & (a == 1) & ~(u < p_match)
            prop[no_match] = 0
    req, p, idx, inp, gen = _walk(a, prop, reqs.off, kind != "fixed")
    proposal = inp - 1
    if kind != "oracle-combine":
        charges = [(cm.drafter(proposers[0]), None, proposal, False)]
    elif draft_cost == "ngram-only":
        charges = [(cm.drafter("ngram"), None, proposal, True)]
    elif draft_cost == "winner":
        rank = np.array([list(proposers).index(q) for q in combine_order(cm, proposers)])
        acc_here = reqs.acc[rank][:, idx]
        winner = rank[np.argmax(acc_here == acc_here.max(axis=0), axis=0)]  # cheapest proposer reaching the max
        charges = [(cm.drafter(q), winner == k, proposal, False) for k, q in enumerate(proposers)]
    else:  # all
        charges = [(cm.drafter(q), None, reqs.acc[k, idx] - 1, False) for k, q in enumerate(proposers)]
    return _Steps(req, p, inp, gen, charges)


# ---- duplicate batching: costs are closed sums over each request's steps -----------------------------------
def _affine_sums(st: _Steps, cm: CostModel, n: int, P_req: np.ndarray):
    """Per request, the SD step times as affine functions of the batch size B (kv = B*(P+p), n = B*i): target
    forwards V1*B + V0 and drafting D1*B + D0 summed over its steps. Every drafter kind is affine in B at fixed
    steps (see costmodel), so the sums are taken once and each batch size costs a few vector operations. Ragged
    steps (``st.ragged``) are exact here too: the B copies of a request are identical, so a step is ragged for all
    of them or for none, whatever B, and its forward is the ragged one's affine function of B (separate sums)."""
    x = (P_req + st.p).astype(float)
    inp = st.inp.astype(float)

    def bc(w, mask=None):
        return np.bincount(st.req, weights=w if mask is None else np.where(mask, w, 0.0), minlength=n)

    one = np.ones(len(x))
    rg = st.ragged
    if rg is None:
        V1 = cm.c_kv * bc(x) + cm.c_tok * bc(inp)
        V0 = cm.c0 * bc(one)
    else:   # ragged steps (a copy's proposal != K: then every copy's) are priced with the ragged forward
        R, u = cm.ragged_target, ~rg
        V1 = cm.c_kv * bc(x, u) + cm.c_tok * bc(inp, u) + R.c_kv * bc(x, rg) + R.c_tok * bc(inp, rg)
        V0 = cm.c0 * bc(one, u) + R.c0 * bc(one, rg)
    D1, D0 = np.zeros(n), np.zeros(n)
    for dr, active, proposal, always in st.charges:
        prop = np.asarray(proposal, float)
        if dr.kind == "linear":
            m = active
            D1 += dr.c_kv * bc(x, m)
            D0 += dr.c_tok * bc(inp, m) + dr.c0 * bc(one, m)
        elif dr.kind == "fraction":
            on = np.ones(len(x), bool) if always else prop > 0
            m = on if active is None else on & active
            if rg is None:
                D1 += dr.fraction * (cm.c_kv * bc(x, m) + cm.c_tok * bc(inp, m))
                D0 += dr.fraction * cm.c0 * bc(one, m)
            else:   # a fraction of the step's own forward, ragged or not
                mu, mr = m & u, m & rg
                D1 += dr.fraction * (cm.c_kv * bc(x, mu) + cm.c_tok * bc(inp, mu) + R.c_kv * bc(x, mr)
                                     + R.c_tok * bc(inp, mr))
                D0 += dr.fraction * (cm.c0 * bc(one, mu) + R.c0 * bc(one, mr))
            D0 += dr.c_step * bc(one, m)            # the path's own host work per step it drafts (0 unless fitted)
        else:
            m = active
            D1 += dr.c_kv * bc(prop * x, m) + dr.c_tok * bc(prop, m)
            drafts = bc((prop > 0).astype(float), m)   # the steps where it drafts
            D0 += dr.c0 * bc(prop, m) + dr.c_step * drafts
            if dr.c_step_req:                      # per request in the step (m = B copies) where it drafts
                D1 += dr.c_step_req * drafts
    return V1, V0, D1, D0


def _duplicate(reqs: _Requests, st: _Steps, cm: CostModel, Bs: np.ndarray) -> list[dict]:
    st = _Steps(st.req, st.p, st.inp, st.gen, catch_up_charges(st.req, st.charges), st.ragged)
    n = len(reqs.ids)
    P, L = reqs.P.astype(float), reqs.L.astype(float)
    S = np.bincount(st.req, minlength=n).astype(float)
    sums = {None: _affine_sums(st, cm, n, P[st.req])}
    cap = cm.graph_cap if st.ragged is not None else None   # the oracles: no cap (see the module docstring)
    out = []
    for B in Bs:
        key = None
        if cap is not None and cm.graph_less(B * st.inp.max(initial=0)):   # some step passes the cap at this B
            key = cap // int(B)          # B copies verifying i tokens each pass it iff i > cap // B: one mask per key
            if key not in sums:
                sums[key] = _affine_sums(_Steps(st.req, st.p, st.inp, st.gen, st.charges,
                                                st.ragged | cm.graph_less(B * np.asarray(st.inp))), cm, n, P[st.req])
        V1, V0, D1, D0 = sums[key]
        pre = cm.forward(0.0, B * P)
        verify = pre + B * V1 + V0
        draft = B * D1 + D0
        over = cm.overhead * (1.0 + S)
        sd = verify + draft + over
        # baseline: steps p = 1..L-1 with kv = B*(P+p), n = B (past the graph cap: the ragged forward)
        m = L - 1
        T = cm.ragged_target if bool(cm.graph_less(B)) else cm
        base = pre + cm.overhead + T.c_kv * B * (m * P + m * L / 2.0) + (T.c_tok * B + T.c0 + cm.overhead) * m
        sd_tp, base_tp = B * L / sd, B * L / base
        out.append(dict(batch_size=int(B), speedup=sd_tp.mean() / base_tp.mean(), sd_tokens_per_s=sd_tp.mean(),
                        base_tokens_per_s=base_tp.mean(), verify_share=verify.sum() / sd.sum(),
                        draft_share=draft.sum() / sd.sum(), overhead_share=over.sum() / sd.sum(),
                        sd_time_s=sd.mean(), base_time_s=base.mean()))
    return out


# ---- mixed batching: continuous batching over all requests ------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _mixed_kernel():
    """``_mixed_run_py`` compiled by numba on first use (numba is imported only here: a duplicate-batching run
    never pays for it); plain Python where numba is missing."""
    try:
        from numba import njit
    except ImportError:  # pragma: no cover - numba is a dependency; plain Python still works, only slower
        return _mixed_run_py
    return njit(cache=True)(_mixed_run_py)


def _mixed_run_py(P, L, step_off, inp, gen, active, proposal, kind, dk, dt, d0, frac, always, cstep, creq,
               c_kv, c_tok, c0, overhead, B, ragged, r_kv, r_tok, r0, cap):
    """One continuous-batching run. Returns (makespan, target-forward time, drafting time, overhead time).
    A charge's drafter: ``kind`` (``KIND_CODE``), c_kv ``dk``, c_tok ``dt``, c0 ``d0``, ``frac``, c_step ``cstep``,
    c_step_req ``creq`` (per_token: ``cstep + creq * m`` where it drafts, m = the decoding requests).
    ``ragged`` (per step record): that request's step verifies other than K + 1 tokens; a batch step where any
    decoding request's step is ragged, or whose decoding requests verify more than ``cap`` tokens in all (the
    CUDA-graph cap; inf: none), costs the ragged forward r_kv*kv + r_tok*n + r0 instead of F (newcomers' prefill
    does not make a step ragged nor counts toward the cap)."""
    n = len(P)
    C = len(kind)
    running = np.empty(B, np.int64)   # request ids in the batch
    cur = np.empty(B, np.int64)       # their next step record
    pos = np.empty(B, np.int64)       # tokens produced so far
    fresh = np.empty(B, np.bool_)     # admitted this step (prefilling)
    nrun = 0
    nxt = 0
    t_f = 0.0
    t_d = 0.0
    t_o = 0.0
    dmax = np.empty(C, np.float64)
    while nrun > 0 or nxt < n:
        while nrun < B and nxt < n:       # refill free slots from the queue
            running[nrun] = nxt
            cur[nrun] = step_off[nxt]
            pos[nrun] = 0
            fresh[nrun] = True
            nrun += 1
            nxt += 1
        kv = 0.0
        ntok = 0.0
        dtok = 0.0
        m = 0
        rag = False
        for b in range(nrun):
            r = running[b]
            if fresh[b]:
                ntok += P[r]
            else:
                kv += P[r] + pos[b]
                ntok += inp[cur[b]]
                dtok += inp[cur[b]]
                m += 1
                if ragged[cur[b]]:
                    rag = True
        if rag or dtok > cap:
            F = r_kv * kv + r_tok * ntok + r0
        else:
            F = c_kv * kv + c_tok * ntok + c0
        for c in range(C):
            dmax[c] = 0.0
        for b in range(nrun):
            if fresh[b]:
                continue
            j = cur[b]
            for c in range(C):
                if not active[c, j]:
                    continue
                if kind[c] == 0:
                    t = dk[c] * kv + dt[c] * inp[j] + d0[c]
                elif kind[c] == 1:
                    t = frac[c] * F + cstep[c] if (always[c] or proposal[c, j] > 0) else 0.0
                else:
                    t = proposal[c, j] * (dk[c] * kv + dt[c] * m + d0[c]) + \
                        ((cstep[c] + creq[c] * m) if proposal[c, j] > 0 else 0.0)
                if t > dmax[c]:
                    dmax[c] = t
        t_f += F
        t_d += dmax.sum()
        t_o += overhead
        keep = 0
        for b in range(nrun):             # advance, drop finished requests, compact the slots
            r = running[b]
            if fresh[b]:
                pos[b] = 1
                fresh[b] = False
            else:
                pos[b] += gen[cur[b]]
                cur[b] += 1
            if pos[b] < L[r]:
                running[keep] = r
                cur[keep] = cur[b]
                pos[keep] = pos[b]
                fresh[keep] = False
                keep += 1
        nrun = keep
    return t_f + t_d + t_o, t_f, t_d, t_o


def _mixed(reqs: _Requests, st: _Steps | None, cm: CostModel, Bs: np.ndarray) -> list[dict]:
    n = len(reqs.ids)

    def run(st, B):
        if st is None:  # baseline: L-1 plain decode steps per request, no drafting
            S = reqs.L - 1
            inp = np.ones(int(S.sum()), np.int64)
            gen = inp
            charges = []
        else:
            S = np.bincount(st.req, minlength=n)
            inp, gen, charges = st.inp, st.gen, catch_up_charges(st.req, st.charges)
        rag = np.zeros(len(inp), np.bool_) if st is None or st.ragged is None else np.asarray(st.ragged, np.bool_)
        R = cm.ragged_target if cm.ragged_target is not None else cm   # unused where no step is ragged
        # the graph cap: the policies with an engine K and the baseline; not the oracles (st.ragged None)
        cap = float(cm.graph_cap) if cm.graph_cap is not None and (st is None or st.ragged is not None) else np.inf
        step_off = np.zeros(n + 1, np.int64)
        np.cumsum(S, out=step_off[1:])
        C, T = len(charges), len(inp)
        active = np.ones((C, T), np.bool_)
        proposal = np.zeros((C, T), np.int64)
        kind, dk, dt, d0, frac, always = (np.zeros(C, np.int64), np.zeros(C), np.zeros(C), np.zeros(C),
                                          np.zeros(C), np.zeros(C, np.bool_))
        cstep = np.array([dr.c_step for dr, *_ in charges], float)
        creq = np.array([dr.c_step_req for dr, *_ in charges], float)
        for c, (dr, act, prop, alw) in enumerate(charges):
            if act is not None:
                active[c] = act
            proposal[c] = prop
            kind[c], dk[c], dt[c], d0[c], frac[c], always[c] = (_KIND_CODE[dr.kind], dr.c_kv, dr.c_tok, dr.c0,
                                                                dr.fraction, alw)
        # at most n requests ever run at once: slots beyond n are never used (and B = 10^6 would allocate them)
        return _mixed_kernel()(reqs.P, reqs.L, step_off, inp.astype(np.int64), gen.astype(np.int64), active,
                          proposal, kind, dk, dt, d0, frac, always, cstep, creq, cm.c_kv, cm.c_tok, cm.c0, cm.overhead,
                          int(min(B, n)), rag, float(R.c_kv), float(R.c_tok), float(R.c0), cap)

    tokens = float(reqs.L.sum())
    out = []
    for B in Bs:
        sd, t_f, t_d, t_o = run(st, B)
        base = run(None, B)[0]
        out.append(dict(batch_size=int(B), speedup=base / sd, sd_tokens_per_s=tokens / sd,
                        base_tokens_per_s=tokens / base, verify_share=t_f / sd, draft_share=t_d / sd,
                        overhead_share=t_o / sd, sd_time_s=sd, base_time_s=base))
    return out


# ---- adaptive policies (spec_repro.adaptive): the step sequence depends on the batch size ----------------------
def _adaptive_rows(reqs: _Requests, req: pd.DataFrame, kmax: int, key, props, pname: str, cm: CostModel,
                   Bs: np.ndarray, modes, seed: int, params, cache: dict) -> list[dict]:
    """(req: the group's requests; kmax: the largest k_max of its rows.)"""
    from . import adaptive

    ds, model = key
    if key not in cache:  # the n-gram match signal (recomputed from token ids on published traces) once per group
        cache[key] = adaptive._inputs(reqs, req, list(props), cm, kmax)
    inputs = cache[key]
    rows = []
    for mode in modes:
        for B in Bs:
            a = adaptive.adaptive_steps(reqs, req, props, pname, int(B), cm, kmax, params, seed=seed, inputs=inputs)
            charges = [(cm.drafter(q), a.ran[c], a.proposal[c], False) for c, q in enumerate(props)]
            st = _ragged(_Steps(a.req, a.p, a.inp, a.gen, charges), cm, kmax)   # the engine's k: k_max
            res = _duplicate(reqs, st, cm, np.array([B])) if mode == "duplicate" else _mixed(reqs, st, cm,
                                                                                             np.array([B]))
            rows += [dict(dataset=ds, model=model, proposers="+".join(props), policy=pname, draft_cost="ran",
                          n_requests=len(reqs.ids), mean_tokens_per_step=float(a.gen.sum() / max(len(a.gen), 1)),
                          n_tokens=int(reqs.L.sum()), batching=mode, **r) for r in res]
    return rows


def _group_confidence(trace: Trace, reqs: _Requests, props, key, kmax: int) -> np.ndarray:
    """The model proposer's confidence [positions, kmax] of one group, in ``reqs``' order (NaN where absent)."""
    q = next(q for q in props if not _is_ngram(q))
    conf = trace.confidence(q)
    out = np.full((int(reqs.off[-1]), kmax), np.nan, np.float32)
    for r, rid in enumerate(reqs.ids):
        c = conf.get((key[0], key[1], rid))
        if c is None:
            continue
        n = min(int(reqs.L[r]), len(c))
        out[reqs.off[r]:reqs.off[r] + n, :c.shape[1]] = c[:n]
    if np.isnan(out[:, 0]).all():
        raise SimulationError(f"{key[0]!r}/{key[1]!r}: the trace has no confidence for {q!r} on these requests")
    return out


class _NoBar:
    """What a progress bar is asked for when none is drawn (tqdm not even imported)."""

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


# ---- public entry ------------------------------------------------------------------------------------------------
def parse_proposers(proposers) -> list[str]:
    """'ngram', 'ngram,eagle', 'ngram+eagle' or a list -> the proposer names, as ``simulate`` reads them."""
    return _as_list(proposers, "proposers")


def _as_list(x, what) -> list:
    if isinstance(x, str):
        x = [s for s in re.split(r"[,+\s]+", x) if s] if what == "proposers" else [x]
    x = list(x)
    if not x:
        raise SimulationError(f"no {what} given")
    return x


def simulate(trace: Trace, cost_model, proposers, policy, draft_cost="ngram-only", batch_sizes=(1,),
             batching="duplicate", sample: int | None = None, seed: int = 42, progress: bool = True,
             **options) -> pd.DataFrame:
    """Simulate SD speedups over an acceptance trace; one row per (dataset, model, proposers, policy, draft_cost,
    batch_size, batching). See the module docstring for the method and the columns.

    trace: a ``spec_repro.traces.Trace`` (``read_trace``/``read_traces``), one or several (dataset, model) groups.
    cost_model: a ``CostModel``, a preset name or a preset file. proposers: 'ngram', 'ngram,eagle' or a list (one
    set). policy: 'fixed-K' / 'oracle' / 'oracle-combine', or a list of them. draft_cost: 'ngram-only' /
    'winner' / 'all' (or a list; it only changes ``oracle-combine``). batching: 'duplicate' / 'mixed' (or a list).
    sample=N: N requests per group chosen as the released code does, ``random.Random(seed).sample(ids, N)`` over
    the eligible request ids in file order; default: every eligible request. Options: ``ngram_match_prob`` (a
    float, or {dataset: prob}) for fixed-K n-gram on traces without ``draft_len``; ``adaptive_params`` (a
    ``spec_repro.adaptive.RuleParams``) for the adaptive policies; ``ngram_match`` ('lookup', the default: fixed-K
    n-gram on a trace without draft_len proposes what the prompt lookup recomputed from its token ids proposes,
    where those ids reproduce its acc_len; 'random': the released code's random match model); ``dynamic_k``
    ({batch size: k}) for ``dynamic-k``."""
    allowed = ("ngram_match_prob", "adaptive_params", "ngram_match", "dynamic_k")
    unknown = set(options) - set(allowed)
    if unknown:
        raise SimulationError(f"unknown option(s) {sorted(unknown)}; the options are {', '.join(allowed)}")
    if options.get("ngram_match", "lookup") not in ("lookup", "random"):
        raise SimulationError(f"ngram_match must be 'lookup' or 'random', got {options['ngram_match']!r}")
    match_prob = options.get("ngram_match_prob")
    cm = load_cost_model(cost_model).validate()
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise SimulationError(f"seed must be an integer >= 0, got {seed!r}")
    if sample is not None and (isinstance(sample, bool) or not isinstance(sample, (int, np.integer))):
        raise SimulationError(f"sample must be an integer >= 1, got {sample!r}")
    props = trace.check_proposers(parse_proposers(proposers))
    if len(set(props)) != len(props):
        raise SimulationError(f"proposer listed twice in {props}")
    policies = [(p, *parse_policy(p)) for p in _as_list(policy, "policies")]
    accountings = _as_list(draft_cost, "draft_cost values")
    for a in accountings:
        if a not in DRAFT_COSTS:
            raise SimulationError(f"unknown draft_cost accounting {a!r}; expected one of {DRAFT_COSTS}")
    modes = _as_list(batching, "batching modes")
    for b in modes:
        if b not in BATCHING:
            raise SimulationError(f"unknown batching {b!r}; expected one of {BATCHING}")
    try:
        Bs = np.array([int(b) for b in _as_list(batch_sizes, "batch sizes")], dtype=np.int64)
    except (TypeError, ValueError) as e:
        raise SimulationError(f"batch sizes must be integers >= 1, got {batch_sizes!r}") from e
    if (Bs < 1).any() or (Bs > MAX_BATCH).any():
        raise SimulationError(f"batch sizes must be >= 1 and <= {MAX_BATCH:,}, got {Bs.tolist()}")
    for name, kind, K in policies:
        if kind in SWITCH and (len(props) != 2 or sum(map(_is_ngram, props)) != 1):
            raise SimulationError(f"policy {name!r} takes n-gram and one model proposer (e.g. ngram,eagle), got "
                                  f"{props}")
        if kind == "dynamic-k":
            if options.get("dynamic_k") is None:
                raise SimulationError(f"policy {name!r} needs a table of batch size -> k (dynamic_k={{1: 5, 32: 2}}"
                                      f"; CLI --dynamic-k 1:5 32:2)")
            if "mixed" in modes:
                raise SimulationError(f"policy {name!r} runs under duplicate batching only (a batch of one size)")
            dynamic_k_for(options["dynamic_k"], 1)
        if kind == "ngram-else-eagle-skip-conf" and (len(props) != 2 or sum(map(_is_ngram, props)) != 1):
            raise SimulationError(f"policy {name!r} takes n-gram and one model proposer (e.g. ngram,eagle), got "
                                  f"{props}")
        if kind == "conf-stop" and (len(props) != 1 or _is_ngram(props[0])):
            raise SimulationError(f"policy {name!r} takes one model proposer (e.g. eagle), got {props}")
        if kind in CONF and K[1] is not None:
            q = next(q for q in props if not _is_ngram(q))
            if q not in trace.confidence_proposers:
                raise SimulationError(f"policy {name!r} reads {q!r}'s confidence, but the trace has no confidence "
                                      f"for {q!r} (it has it for {trace.confidence_proposers or 'no proposer'}); "
                                      f"T = oracle (the ceiling) needs none")
        if kind not in ("oracle-combine",) + _ADAPTIVE + SWITCH + CONF and len(props) > 1:
            raise SimulationError(f"policy {name!r} takes one proposer, got {props}; use oracle-combine to "
                                  f"combine several")
    combine = any(k == "oracle-combine" for _, k, _ in policies)
    if combine and "ngram-only" in accountings and not any(_is_ngram(q) for q in props):
        raise SimulationError(f"draft_cost 'ngram-only' charges n-gram's drafting cost at every step, but the "
                              f"proposers {props} include no n-gram proposer; use --draft-cost winner or all")
    needed = set(props) | ({"ngram"} if combine and "ngram-only" in accountings else set())
    for q in sorted(needed):
        try:
            cm.drafter(q)
        except CostModelError as e:
            raise SimulationError(str(e)) from e

    # the requests that have every proposer, their rows of those proposers (a mask: nothing copied)
    keep, sub_req = trace.selection(proposers=props)
    sub_req = sub_req.reset_index(drop=True)
    fixed_k = [(name, K) for name, kind, K in policies if kind == "fixed"]
    fixed_k += [(name, max(K)) for name, kind, K in policies if kind in SWITCH]
    fixed_k += [(name, max(K[0], K[2])) for name, kind, K in policies if kind in CONF]
    fixed_k += [(name, max(dict(options["dynamic_k"]).values())) for name, kind, K in policies
                if kind == "dynamic-k"]
    if fixed_k and keep.any():
        k_max = int(trace.acc["k_max"].to_numpy()[keep].min())
        name, K = max(fixed_k, key=lambda x: x[1])
        if K > k_max:  # acceptance beyond k_max was never measured: a longer draft would be priced blind
            raise SimulationError(f"policy {name!r} drafts {K} tokens but the trace measured acceptance only up to "
                                  f"k_max = {k_max} (acc_len <= {k_max + 1}); use K <= {k_max}")
    groups = sub_req[["dataset", "model"]].drop_duplicates().itertuples(index=False)
    groups = [tuple(g) for g in groups]
    if not groups:
        raise TraceError(f"no request has every proposer of {props}")
    units = [(g, pol, acct) for g in groups for pol in policies if pol[1] not in _ADAPTIVE + SWITCH + CONF
             for acct in accountings]
    units += [(g, pol, "ran") for g in groups for pol in policies if pol[1] in _ADAPTIVE + SWITCH + CONF]
    rows = []
    if progress:
        from .progress import tqdm

        bar = tqdm(total=len(units) * len(modes), desc="simulate", unit="config")
    else:
        bar = _NoBar()
    cache: dict = {}
    acache: dict = {}
    group_req: dict = {}   # (dataset, model) -> its requests
    group_kmax: dict = {}  # (dataset, model) -> the largest k_max of its rows
    for (ds, model), (pname, kind, K), acct in units:
        key = (ds, model)
        if key not in cache:
            req = sub_req[((sub_req["dataset"] == ds) & (sub_req["model"] == model))
                          .to_numpy(dtype=np.bool_, na_value=False)]
            ids = req["request_id"].tolist()
            if sample is not None:
                if not 1 <= int(sample) <= len(ids):
                    raise SimulationError(f"sample={sample}: {ds!r}/{model!r} has {len(ids)} eligible requests")
                ids = random.Random(seed).sample(ids, int(sample))
            rows_g = keep & ((trace.acc["dataset"] == ds) & (trace.acc["model"] == model)).to_numpy(
                dtype=np.bool_, na_value=False)
            # only the rows and columns group_arrays reads are copied (none when they are the whole trace), column
            # by column: a mask filters each chunk of an arrow column in place (a DataFrame row selection would
            # join them first)
            cols = ["request_id", "proposer", "position", "acc_len", "draft_len"]
            acc = trace.acc if rows_g.all() else pd.DataFrame({c: trace.acc[c].array[rows_g] for c in cols})
            cache[key] = _group_arrays(acc, req, props, ids)
            group_req[key] = req
            group_kmax[key] = int(trace.acc["k_max"].to_numpy()[rows_g].max())
        reqs = cache[key]
        if kind in _ADAPTIVE:
            rows += _adaptive_rows(reqs, group_req[key], group_kmax[key], key, props, pname, cm, Bs, modes,
                                   seed, options.get("adaptive_params"), acache)
            bar.update(len(modes))
            continue
        ng_lens = None
        ng_kind = kind in SWITCH or kind == "ngram-else-eagle-skip-conf"
        if ng_kind or (kind == "fixed" and _is_ngram(props[0]) and options.get("ngram_match") != "random"):
            if ("ngm",) + key not in acache:
                q_ngram = [_is_ngram(q) for q in props].index(True)
                acache[("ngm",) + key] = ngram_match(reqs, group_req[key], q_ngram, group_kmax[key])
            ngm = acache[("ngm",) + key]
            if ng_kind and ngm.lens is None:
                raise SimulationError(f"policy {pname!r} needs n-gram's match at each position: {ngm.why}")
            ng_lens = ngm.lens
        if kind in SWITCH:
            req_, p_, idx_, inp_, gen_, charges, _ = switch_steps(reqs, props, ng_lens, K[0], K[1],
                                                                   kind.endswith("skip"), cm)
            st = _ragged(_Steps(req_, p_, inp_, gen_, charges), cm, max(K))   # the engine's k: the larger
            acct = "ran"
        elif kind in CONF:
            conf = None
            if K[1] is not None:
                if ("conf",) + key not in acache:
                    acache[("conf",) + key] = _group_confidence(trace, reqs, props, key, group_kmax[key])
                conf = acache[("conf",) + key]
            req_, p_, idx_, inp_, gen_, charges = conf_steps(reqs, props, ng_lens, conf, K[0], K[1], K[2], cm, kind)
            st = _ragged(_Steps(req_, p_, inp_, gen_, charges), cm, max(K[0], K[2]))   # the engine's k
            acct = "ran"
        elif kind == "dynamic-k":
            for B in Bs:
                Kb = dynamic_k_for(options["dynamic_k"], int(B))
                st = _ragged(_steps(reqs, props, "fixed", Kb, acct, cm, ds, seed, match_prob, ng_lens), cm, Kb)
                rows += [dict(dataset=ds, model=model, proposers="+".join(props), policy=f"{pname} (k={Kb})",
                              draft_cost=acct, n_requests=len(reqs.ids), n_tokens=int(reqs.L.sum()),
                              mean_tokens_per_step=float(st.gen.sum() / max(len(st.gen), 1)), batching="duplicate",
                              **r) for r in _duplicate(reqs, st, cm, np.array([B]))]
            bar.update(len(modes))
            continue
        else:
            st = _steps(reqs, props, kind, K, acct, cm, ds, seed, match_prob, ng_lens)
            st = _ragged(st, cm, K if kind == "fixed" else None)   # the oracles: F everywhere (an idealised bound)
        common = dict(dataset=ds, model=model, proposers="+".join(props), policy=pname, draft_cost=acct,
                      n_requests=len(reqs.ids),
                      mean_tokens_per_step=float(st.gen.sum() / max(len(st.gen), 1)),
                      n_tokens=int(reqs.L.sum()))
        for mode in modes:
            res = _duplicate(reqs, st, cm, Bs) if mode == "duplicate" else _mixed(reqs, st, cm, Bs)
            rows += [{**common, "batching": mode, **r} for r in res]
            bar.update(1)
    bar.close()
    return pd.DataFrame(rows)[RESULT_COLUMNS]
