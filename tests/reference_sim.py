"""A deliberately plain reference simulator, written straight from FACTS.md's description of the study's method.

One Python loop per step and per request; no vectorisation, no shortcuts (a duplicated batch really holds B
request objects). It exists only to check ``spec_repro.simulate`` (which must match it to 1e-9) and to time the
plain method in ``benchmarks/bench_simulate.py``. The few rules FACTS.md leaves open are fixed by
``spec_repro.simulate``'s docstring (tie -> first proposer listed, the seeded n-gram match draw, mixed batching);
they are re-implemented here from that text, not imported.
"""
from __future__ import annotations

import random
import zlib

import numpy as np
import pandas as pd

MATCH_PROB = {"sharegpt": 0.2, "cnn": 0.4, "cnndailymail": 0.4, "cnndm": 0.4, "gsm8k": 0.2, "instructcoder": 0.8}


def request_table(trace, proposers):
    """[(request_id, P, {proposer: acc list}, {proposer: draft_len list or None})] in file order, L = shortest."""
    out = []
    for rid in trace.requests["request_id"]:
        rows = trace.acc[trace.acc["request_id"] == rid]
        per, dls = {}, {}
        for q in proposers:
            r = rows[rows["proposer"] == q].sort_values("position")
            if len(r) == 0:
                break
            per[q] = [int(x) for x in r["acc_len"]]
            dls[q] = [None if pd.isna(x) else int(x) for x in r["draft_len"]]
        if len(per) < len(proposers):
            continue
        L = min(len(v) for v in per.values())
        P = int(trace.requests.loc[trace.requests["request_id"] == rid, "prompt_len"].iloc[0])
        out.append((rid, P, {q: v[:L] for q, v in per.items()}, {q: v[:L] for q, v in dls.items()}))
    return out


def drafting_time(cost_model, proposer, kv, n, F, m, proposal, always=False):
    """One request's drafting seconds at one step, by the drafter's kind (costmodel's docstring rules)."""
    d = cost_model.drafters.get(proposer) or cost_model.drafter(proposer)
    if d.kind == "fraction":
        if always or proposal > 0:
            return d.fraction * F
        return 0.0
    if d.kind == "linear":
        return d.c_kv * kv + d.c_tok * n + d.c0
    return proposal * (d.c_kv * kv + d.c_tok * m + d.c0)


def forward(cm, kv, n, ragged=False):
    """F(kv, n); at a ragged decode step (some request verifies other than K + 1 tokens, fixed-K only) the cost
    model's ragged forward where it has one (costmodel's docstring)."""
    r = getattr(cm, "ragged_target", None)
    if ragged and r is not None:
        return r.c_kv * kv + r.c_tok * n + r.c0
    return cm.c_kv * kv + cm.c_tok * n + cm.c0


def is_ragged(reqs_and_inputs):
    """[(req, i)] of the requests decoding in one step: ragged iff a fixed-K request verifies i != K + 1."""
    return any(r.policy == "fixed" and i != r.K + 1 for r, i in reqs_and_inputs)


def graph_less(cm, reqs_and_inputs, speculative):
    """[(req, i)] of the requests decoding in one step: priced with the ragged forward iff it is ragged or its
    decoding requests verify more than the cost model's graph_cap tokens in all (fixed-K and the no-SD baseline;
    the oracles are idealised bounds)."""
    cap = getattr(cm, "graph_cap", None)
    over = cap is not None and sum(i for _, i in reqs_and_inputs) > cap
    if not speculative:
        return over
    return is_ragged(reqs_and_inputs) or (over and any(r.policy == "fixed" for r, _ in reqs_and_inputs))


class Req:
    def __init__(self, rid, P, accs, dls, proposers, policy, K, match):
        self.rid, self.P, self.accs, self.dls = rid, P, accs, dls
        self.proposers, self.policy, self.K, self.match = proposers, policy, K, match
        self.L = len(accs[proposers[0]])
        self.p = 0
        self.tie_order = proposers

    def decide(self):
        """(input length i, tokens produced g, [(proposer, proposal, always)] charges input) at the current p."""
        j = self.p - 1
        if self.policy == "fixed":
            q = self.proposers[0]
            a = self.accs[q][j]
            if self.dls[q][j] is not None:
                proposal = min(self.K, self.dls[q][j])
            elif q.startswith("ngram") and a == 1 and not self.match[j]:
                proposal = 0
            else:
                proposal = self.K
            i = proposal + 1
            return i, min(a, i), a
        if self.policy == "oracle":
            a = self.accs[self.proposers[0]][j]
            return a, a, a
        a = max(self.accs[q][j] for q in self.proposers)
        return a, a, a


def charges(req, i, cost_key):
    """[(proposer, proposal, always)] whose drafting the request pays this step."""
    j = req.p - 1
    if req.policy != "oracle-combine":
        return [(req.proposers[0], i - 1, False)]
    if cost_key == "ngram-only":
        return [("ngram", i - 1, True)]
    if cost_key == "winner":  # ties go to the cheapest drafter: req.tie_order
        a = max(req.accs[q][j] for q in req.proposers)
        for q in req.tie_order:
            if req.accs[q][j] == a:
                return [(q, i - 1, False)]
    return [(q, req.accs[q][j] - 1, False) for q in req.proposers]


def make_requests(table, proposers, policy, K, dataset, seed, match_prob):
    reqs = []
    for rid, P, accs, dls in table:
        L = len(accs[proposers[0]])
        match = [True] * L
        if policy == "fixed" and proposers[0].startswith("ngram") and any(x is None for x in dls[proposers[0]]):
            prob = match_prob if match_prob is not None else MATCH_PROB[dataset.lower().replace("_", "")]
            u = np.random.default_rng([seed, zlib.crc32(str(rid).encode())]).random(L)
            match = [bool(x < prob) for x in u]
        reqs.append(Req(rid, P, accs, dls, proposers, policy, K, match))
    return reqs


def duplicate_batch(cm, req_template, B, cost_key, speculative):
    """One batch of B copies, simulated step by step. Returns (mean latency, verify, draft, overhead, steps, gen)."""
    copies = [Req(req_template.rid, req_template.P, req_template.accs, req_template.dls, req_template.proposers,
                  req_template.policy, req_template.K, req_template.match) for _ in range(B)]
    for c in copies:
        c.tie_order = req_template.tie_order
    prompt_total = sum(c.P for c in copies)
    prefill = forward(cm, 0, prompt_total)
    lat = {k: prefill + cm.overhead for k in range(B)}
    parts = {k: [prefill, 0.0, cm.overhead] for k in range(B)}
    kv = prompt_total + B
    for c in copies:
        c.p = 1
    unfinished = [k for k in range(B) if copies[k].p < copies[k].L]
    steps = gen = 0
    while unfinished:
        decisions = {}
        n = 0
        for k in unfinished:
            if speculative:
                decisions[k] = copies[k].decide()
            else:
                decisions[k] = (1, 1, 1)
            n += decisions[k][0]
        F = forward(cm, kv, n, graph_less(cm, [(copies[k], decisions[k][0]) for k in unfinished], speculative))
        m = len(unfinished)
        still = []
        produced_total = 0
        freed = 0
        for k in unfinished:
            i, g, _ = decisions[k]
            d = 0.0
            if speculative:
                for q, proposal, always in charges(copies[k], i, cost_key):
                    d += drafting_time(cm, q, kv, i, F, m, proposal, always)
            lat[k] += F + d + cm.overhead
            parts[k][0] += F
            parts[k][1] += d
            parts[k][2] += cm.overhead
            copies[k].p += g
            produced_total += g
            if k == unfinished[0]:
                steps += 1
                gen += g
            if copies[k].p >= copies[k].L:
                freed += copies[k].P + copies[k].p
            else:
                still.append(k)
        kv += produced_total - freed
        unfinished = still
    mean_lat = sum(lat.values()) / B
    mean_parts = [sum(parts[k][x] for k in range(B)) / B for x in range(3)]
    return mean_lat, mean_parts, steps, gen


def mixed_run(cm, reqs, B, cost_key, speculative):
    """Continuous batching over reqs in order, at most B at once. Returns (makespan, [verify, draft, overhead])."""
    queue = list(reqs)
    running = []  # [req, fresh]
    t = [0.0, 0.0, 0.0]
    while running or queue:
        while len(running) < B and queue:
            r = queue.pop(0)
            r.p = 0
            running.append([r, True])
        kv = sum(r.P + r.p for r, fresh in running if not fresh)
        n = 0
        m = 0
        dec = {}
        for idx, (r, fresh) in enumerate(running):
            if fresh:
                n += r.P
            else:
                dec[idx] = r.decide() if speculative else (1, 1, 1)
                n += dec[idx][0]
                m += 1
        F = forward(cm, kv, n, graph_less(cm, [(running[x][0], d[0]) for x, d in dec.items()], speculative))
        per_proposer = {}
        if speculative:
            for idx, (r, fresh) in enumerate(running):
                if fresh:
                    continue
                for q, proposal, always in charges(r, dec[idx][0], cost_key):
                    dt = drafting_time(cm, q, kv, dec[idx][0], F, m, proposal, always)
                    per_proposer[q] = max(per_proposer.get(q, 0.0), dt)
        t[0] += F
        t[1] += sum(per_proposer.values())
        t[2] += cm.overhead
        nxt = []
        for idx, (r, fresh) in enumerate(running):
            if fresh:
                r.p = 1
            else:
                r.p += dec[idx][1]
            if r.p < r.L:
                nxt.append([r, False])
        running = nxt
    return sum(t), t


def reference_simulate(trace, cm, proposers, policy, draft_cost="ngram-only", batch_size=1, batching="duplicate",
                       sample=None, seed=42, ngram_match_prob=None):
    """Plain simulation of ONE (dataset, model) trace; returns the simulator's numeric result fields."""
    proposers = list(proposers)
    if policy.startswith("fixed"):
        kind, K = "fixed", int(policy.split("-")[1])
    else:
        kind, K = policy, 0
    table = request_table(trace, proposers)
    if sample is not None:
        ids = random.Random(seed).sample([t[0] for t in table], sample)
        by_id = {t[0]: t for t in table}
        table = [by_id[i] for i in ids]
    dataset = trace.requests["dataset"].iloc[0]
    reqs = make_requests(table, proposers, kind, K, dataset, seed, ngram_match_prob)
    # Oracle Combine's ties go to the cheapest drafter: one drafted token at a 1024-token KV, one request
    tie_order = sorted(proposers, key=lambda q: drafting_time(cm, q, 1024, 2, forward(cm, 1024, 2), 1, 1))
    for r in reqs:
        r.tie_order = tie_order
    tokens = [r.L for r in reqs]
    if batching == "duplicate":
        sd_tp, base_tp, sd_lat, base_lat = [], [], [], []
        parts = [0.0, 0.0, 0.0]
        steps = gen = 0
        for r in reqs:
            lat, pr, s, g = duplicate_batch(cm, r, batch_size, draft_cost, True)
            blat, _, _, _ = duplicate_batch(cm, r, batch_size, draft_cost, False)
            sd_tp.append(batch_size * r.L / lat)
            base_tp.append(batch_size * r.L / blat)
            sd_lat.append(lat)
            base_lat.append(blat)
            parts = [parts[x] + pr[x] for x in range(3)]
            steps += s
            gen += g
        total = sum(sd_lat)
        sd_mean = sum(sd_tp) / len(sd_tp)
        base_mean = sum(base_tp) / len(base_tp)
        return dict(speedup=sd_mean / base_mean, sd_tokens_per_s=sd_mean, base_tokens_per_s=base_mean,
                    mean_tokens_per_step=gen / steps, verify_share=parts[0] / total, draft_share=parts[1] / total,
                    overhead_share=parts[2] / total, sd_time_s=total / len(reqs),
                    base_time_s=sum(base_lat) / len(reqs), n_tokens=sum(tokens))
    sd, parts = mixed_run(cm, reqs, batch_size, draft_cost, True)
    base, _ = mixed_run(cm, reqs, batch_size, draft_cost, False)
    # tokens per step from one request at a time (batch independent)
    steps = gen = 0
    for r in reqs:
        _, _, s, g = duplicate_batch(cm, r, 1, draft_cost, True)
        steps += s
        gen += g
    return dict(speedup=base / sd, sd_tokens_per_s=sum(tokens) / sd, base_tokens_per_s=sum(tokens) / base,
                mean_tokens_per_step=gen / steps, verify_share=parts[0] / sd, draft_share=parts[1] / sd,
                overhead_share=parts[2] / sd, sd_time_s=sd, base_time_s=base, n_tokens=sum(tokens))
