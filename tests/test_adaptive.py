"""Adaptive policies (spec_repro.adaptive): exact causality, request-level cross-validation, the `ran` accounting,
published-format traces and clear errors. Traces here are SYNTHETIC (seeded) unless named otherwise."""
import copy
import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from spec_repro import adaptive as AD
from spec_repro.costmodel import Drafter, load_cost_model
from spec_repro.simulate import SimulationError, _group_arrays, _Requests, simulate
from spec_repro.traces import Trace, TraceError
from spec_repro.tracefiles import read_trace

ROOT = Path(__file__).resolve().parents[1]
KMAX = 8


@pytest.fixture(scope="module")
def cm():
    m = copy.deepcopy(load_cost_model("llama3.1-8b-h100"))
    m.drafters["draft"] = Drafter("per_token", c_kv=1.1e-9, c_tok=3e-6, c0=7e-4)
    return m


def _acc_from_hits(hit, k_max):
    L = len(hit)
    run = np.zeros(L + 1, np.int64)
    for t in range(L - 1, -1, -1):
        run[t] = run[t + 1] + 1 if hit[t] else 0
    return 1 + np.minimum(run[1:L + 1], k_max)


def structured_trace(seed, n=12, k_max=KMAX, proposers=("ngram", "eagle", "draft")):
    """Copy regions (n-gram hits, with a recorded draft_len) and independent model hits, as real traces behave."""
    rng = np.random.default_rng(seed)
    arrays, prompts, dls = {}, {}, {}
    for r in range(n):
        L = int(rng.integers(20, 70))
        state, hit = False, np.zeros(L, bool)
        for t in range(L):
            state = rng.random() < (0.9 if state else 0.15)
            hit[t] = state and rng.random() < 0.95
        a_ng = _acc_from_hits(hit, k_max)
        dl = np.where(a_ng > 1, np.maximum(a_ng - 1, rng.integers(1, k_max + 1, L)),
                      np.where(rng.random(L) < 0.3, rng.integers(1, k_max + 1, L), 0))
        per = {"ngram": a_ng.tolist()}
        for q, h in (("eagle", 0.7), ("draft", 0.8)):
            per[q] = _acc_from_hits(rng.random(L) < h, k_max).tolist()
        arrays[f"r{r:02d}"] = {q: per[q] for q in proposers}
        prompts[f"r{r:02d}"] = int(rng.integers(10, 400))
        dls[f"r{r:02d}"] = {"ngram": np.minimum(dl, k_max).tolist()}
    return Trace.from_arrays(arrays, prompt_lens=prompts, dataset="code-edit", model="m", k_max=k_max,
                             draft_lens=dls)


def group(trace, props):
    sub = trace.select(proposers=props)
    ids = sub.requests["request_id"].tolist()
    return _group_arrays(sub.acc, sub.requests, props, ids), sub.requests


def one_request(reqs, r, acc=None, dlen=None):
    a, b = reqs.off[r], reqs.off[r + 1]
    acc = reqs.acc[:, a:b].copy() if acc is None else acc
    dlen = reqs.dlen[:, a:b].copy() if dlen is None else dlen
    L = acc.shape[1]
    return _Requests(ids=[reqs.ids[r]], P=reqs.P[r:r + 1].copy(), L=np.array([L]), off=np.array([0, L]),
                     acc=acc, dlen=dlen)


def first_requests(reqs, r, acc=None, dlen=None):
    """Requests 0..r of the group (request r's arrays replaced by ``acc``/``dlen`` where given)."""
    accs = [reqs.acc[:, reqs.off[i]:reqs.off[i + 1]] for i in range(r)]
    dls = [reqs.dlen[:, reqs.off[i]:reqs.off[i + 1]] for i in range(r)]
    one = one_request(reqs, r, acc, dlen)
    L = np.array([a.shape[1] for a in accs] + [one.acc.shape[1]])
    return _Requests(ids=list(reqs.ids[:r + 1]), P=reqs.P[:r + 1].copy(), L=L, off=np.r_[0, np.cumsum(L)],
                     acc=np.concatenate(accs + [one.acc], axis=1), dlen=np.concatenate(dls + [one.dlen], axis=1))


def decisions_of(reqs, inp, B, prm, mode, trees, folds):
    """Per request of ``reqs``: its decisions (position, verified, k, ran, proposal) in the walk."""
    st = AD._run(reqs, dataclasses.replace(inp, acc=np.ascontiguousarray(reqs.acc, dtype=np.int64),
                                           ngdl=reqs.dlen[inp.ng].copy() if inp.ng >= 0 else inp.ngdl),
                 B, prm, mode, trees=trees, tree_of_req=folds[:len(reqs.L)])
    req, p, idx, i, g, ver, ran, prop = st[:8]
    out = [[] for _ in range(len(reqs.L))]
    for s in range(len(p)):
        out[int(req[s])].append((int(p[s]) - 1, int(ver[s]), int(i[s]) - 1, tuple(ran[:, s]), tuple(prop[:, s])))
    return out


def perturb_invisible(acc, dlen, ng, j, steps, rng, k_max):
    """Fresh random values for everything a decision at position j may not see (see spec_repro.adaptive):
    every proposer's acc at positions >= j, n-gram's draft_len after j, acc at earlier positions where the
    proposer did not run (n-gram's is always visible), the uncapped part of revealed values, and the output
    length beyond j + 1. `steps`: the decisions before j as (position, verified, k, ran, proposal)."""
    Q, L = acc.shape
    newL = int(rng.integers(j + 2, j + 40))
    A = rng.integers(1, k_max + 2, (Q, newL))
    D = np.full((Q, newL), k_max)
    D[ng] = rng.integers(0, k_max + 1, newL)
    D[ng, :j + 1] = dlen[ng, :j + 1]                      # n-gram's match up to j: from the tokens
    for q in range(Q):
        for jp in range(j):
            if q == ng:                                   # recomputable from the tokens: always revealed
                lim = min(int(dlen[ng, jp]) + 1, j - jp + 1)
            else:
                runs = [s for s in steps if s[0] == jp and s[3][q] and s[4][q] > 0]
                if not runs:
                    continue
                lim = min(runs[0][4][q] + 1, j - jp + 1)
            a = int(acc[q, jp])
            A[q, jp] = a if a < lim else int(rng.integers(lim, k_max + 2))
    return A, D


@pytest.mark.parametrize("policy", ["adaptive-rule", "adaptive-learned"])
@pytest.mark.parametrize("B", [1, 64])
def test_no_decision_sees_what_it_may_not(cm, policy, B):
    """Perturb everything each decision may not see; no decision up to it changes, nor any decision of the requests
    walked before (they feed the population's counts the request reads), at every step of every request.
    Checked to fail, in all four cases, with a deliberate leak in spec_repro.adaptive: reading n-gram's acc at the
    decision's own position, or revealing one token more than the tokens emitted since a step start; and with the
    rule's population counts taking the decision's own outcome before it decides."""
    trace = structured_trace(3)
    props = ["ngram", "eagle", "draft"]
    reqs, requests = group(trace, props)
    prm = AD.RuleParams(max_train=60)    # below every fold's training states: the trees are fitted on subsamples
    inp = AD._inputs(reqs, requests, props, cm, KMAX)
    mode, trees, folds = 0, AD._NO_TREE, np.zeros(len(reqs.L), np.int64)
    if policy == "adaptive-learned":
        mode, folds = 1, AD.fold_of_requests(reqs.ids, prm.folds, 42)
        req, p, idx, _i, _g, _v, ran, _pr, X = AD._run(reqs, inp, B, prm, 0, record=True)
        assert min((folds[req] != f).sum() for f in range(prm.folds)) > prm.max_train
        trees = AD._fit_trees(X, AD._labels(reqs, inp, B, req, p, idx, AD.prev_ran_of(req, ran)), folds[req],
                              prm.folds, prm, 42)
    full = AD.adaptive_steps(reqs, requests, props, policy, B, cm, KMAX, prm)
    rng = np.random.default_rng(7)
    checked = 0
    for r in range(len(reqs.L)):
        one = one_request(reqs, r)
        before = decisions_of(first_requests(reqs, r), inp, B, prm, mode, trees, folds)
        base = before[r]
        # the walk of requests 0..r takes the group's decisions
        assert [d[:3] for d in base] == [(int(pp) - 1, int(v), int(i) - 1) for pp, v, i in
                                         zip(full.p[full.req == r], full.verified[full.req == r],
                                             full.inp[full.req == r])]
        for s, (j, *_rest) in enumerate(base):
            for _ in range(2):
                A, D = perturb_invisible(one.acc, one.dlen, inp.ng, j, base[:s], rng, KMAX)
                got = decisions_of(first_requests(reqs, r, A, D), inp, B, prm, mode, trees, folds)
                assert got[:r] == before[:r] and got[r][:s + 1] == base[:s + 1], (r, s, j)
                checked += 1
    assert checked > 200


@pytest.mark.parametrize("B", [1, 64])
def test_later_requests_read_only_what_was_revealed(cm, B):
    """The population's counts carry only revealed outcomes: perturbing what a request never reveals (acc above its
    caps once the request is done, a model proposer's acc where it did not run) changes no decision of any request,
    those walked after it included. Checked to fail with the counts fed the uncapped acc."""
    trace = structured_trace(5)
    props = ["ngram", "eagle", "draft"]
    reqs, requests = group(trace, props)
    prm = AD.RuleParams()
    inp = AD._inputs(reqs, requests, props, cm, KMAX)
    folds = np.zeros(len(reqs.L), np.int64)
    base = decisions_of(reqs, inp, B, prm, 0, AD._NO_TREE, folds)
    rng = np.random.default_rng(11)
    changed_acc = 0
    for r in range(len(reqs.L) - 1):
        one = one_request(reqs, r)
        L = one.acc.shape[1]
        A, D = perturb_invisible(one.acc, one.dlen, inp.ng, L - 1, base[r], rng, KMAX)
        A, D = A[:, :L], D[:, :L]
        changed_acc += int((A != one.acc).sum())
        acc, dlen = reqs.acc.copy(), reqs.dlen.copy()
        acc[:, reqs.off[r]:reqs.off[r + 1]], dlen[:, reqs.off[r]:reqs.off[r + 1]] = A, D
        pert = _Requests(ids=reqs.ids, P=reqs.P, L=reqs.L, off=reqs.off, acc=acc, dlen=dlen)
        assert decisions_of(pert, inp, B, prm, 0, AD._NO_TREE, folds) == base, r
    assert changed_acc > 100


@pytest.mark.parametrize("max_train", [6000, 100])
def test_learned_request_decided_by_a_model_that_never_saw_it(cm, max_train):
    """Changing every value of one request leaves the tree that decides for it unchanged (request-level CV), also
    when every fold's training states are subsampled (max_train below them: one random stream per fold, so the
    draws for fold f never depend on fold f's own states)."""
    trace = structured_trace(5)
    props = ["ngram", "eagle"]
    reqs, requests = group(trace, props)
    prm = AD.RuleParams(max_train=max_train)
    folds = AD.fold_of_requests(reqs.ids, prm.folds, 42)
    assert sorted(np.bincount(folds).tolist()) == [2, 2, 2, 3, 3]

    def trees_for(rq):
        inp = AD._inputs(rq, requests, props, cm, KMAX)
        req, p, idx, _i, _g, _v, ran, _pr, X = AD._run(rq, inp, 16, prm, 0, record=True)
        if max_train < 6000:
            assert min((folds[req] != f).sum() for f in range(prm.folds)) > prm.max_train
        return AD._fit_trees(X, AD._labels(rq, inp, 16, req, p, idx, AD.prev_ran_of(req, ran)), folds[req],
                             prm.folds, prm, 42)

    before = trees_for(reqs)
    r = int(np.flatnonzero(folds == prm.folds - 1)[0])   # the last fold: a shared stream would reach it last
    a, b = reqs.off[r], reqs.off[r + 1]
    rng = np.random.default_rng(1)
    acc = reqs.acc.copy()
    acc[:, a:b] = rng.integers(1, KMAX + 2, (acc.shape[0], b - a))
    dlen = reqs.dlen.copy()
    dlen[0, a:b] = rng.integers(0, KMAX + 1, b - a)
    after = trees_for(dataclasses.replace(reqs, acc=acc, dlen=dlen))
    f = folds[r]

    def tree(packed, g):   # one fold's tree without the padding that packing the folds together adds
        n = max(i + 1 for i in range(packed[1].shape[1]) if packed[1][g, i] != 0 or packed[2][g, i] >= 0)
        return [a[g, :n] for a in packed]

    for x, y in zip(tree(before, f), tree(after, f)):
        np.testing.assert_array_equal(x, y)
    assert any(any(a.shape != b.shape or not np.array_equal(a, b) for a, b in zip(tree(before, g), tree(after, g)))
               for g in range(prm.folds) if g != f)


def test_ran_accounting_charges_what_ran(cm):
    """Pure copying (n-gram always right, a long match everywhere): the rule verifies n-gram and never runs the
    model drafter, so drafting is n-gram's fraction of F only; Oracle Combine under `ran` equals `all`."""
    L = 200
    t = Trace.from_arrays({"x": {"ngram": [KMAX + 1] * L, "eagle": [2] * L}}, prompt_lens={"x": 300},
                          dataset="code-edit", model="m", k_max=KMAX,
                          draft_lens={"x": {"ngram": [KMAX] * L}})
    row = simulate(t, cm, "ngram,eagle", "adaptive-rule", batch_sizes=[1], progress=False).iloc[0]
    assert row.draft_cost == "ran" and row.mean_tokens_per_step > KMAX
    reqs, requests = group(t, ["ngram", "eagle"])
    st = AD.adaptive_steps(reqs, requests, ["ngram", "eagle"], "adaptive-rule", 1, cm, KMAX)
    # n-gram every step; EAGLE only on the probe steps that keep its estimate fresh (every RuleParams.probe steps)
    assert st.ran[0].all() and 0 < st.ran[1].sum() <= len(st.p) // AD.RuleParams().probe
    assert (st.verified[st.ran[1]] == 1).all() and (st.verified[~st.ran[1]] == 0).all()
    kv = st.p + 300
    F = cm.forward(kv, st.inp)
    e = cm.drafter("eagle")
    want = cm.drafter("ngram").fraction * F.sum() + (e.c_kv * kv + e.c_tok * st.inp + e.c0)[st.ran[1]].sum()
    assert row.draft_share * row.sd_time_s == pytest.approx(want, rel=1e-12)
    oc = simulate(t, cm, "ngram,eagle", "oracle-combine", ["all", "ran"], batch_sizes=[1, 8], progress=False)
    np.testing.assert_allclose(oc[oc.draft_cost == "all"].speedup, oc[oc.draft_cost == "ran"].speedup, rtol=0)


@pytest.mark.parametrize("batching", ["duplicate", "mixed"])
def test_rows_bounds_and_determinism(cm, batching):
    trace = structured_trace(11)
    df = simulate(trace, cm, "ngram,eagle,draft", ["adaptive-rule", "adaptive-learned", "oracle-combine"],
                  ["winner", "all"], batch_sizes=[1, 4, 32], batching=batching, progress=False)
    ad = df[df.policy.str.startswith("adaptive")]
    assert len(ad) == 6 and (ad.draft_cost == "ran").all() and (ad.batching == batching).all()
    assert len(df[df.policy == "oracle-combine"]) == 6
    assert np.isfinite(df.speedup).all() and (df.speedup > 0).all()
    again = simulate(trace, cm, "ngram,eagle,draft", ["adaptive-rule", "adaptive-learned"], batch_sizes=[1, 4, 32],
                     batching=batching, progress=False)
    pd.testing.assert_frame_equal(ad.reset_index(drop=True), again.reset_index(drop=True))
    reqs, requests = group(trace, ["ngram", "eagle", "draft"])
    for pol in AD.ADAPTIVE_POLICIES:
        st = AD.adaptive_steps(reqs, requests, ["ngram", "eagle", "draft"], pol, 4, cm, KMAX)
        k = st.inp - 1
        assert (k <= KMAX).all() and (st.gen <= st.inp).all()
        ngv = st.verified == 0
        assert (k[ngv] <= reqs.dlen[0][st.idx[ngv]]).all()         # n-gram never verifies beyond its match
        assert ((st.verified < 0) == (k == 0)).all()


def test_published_format_recomputes_the_ngram_match_from_token_ids(cm, tmp_path):
    """The committed SmolLM2 code-edit trace written in the study's JSON lines (no draft_len): the n-gram match
    recomputed from its token ids equals the recorded one, so every adaptive row is the same."""
    t = read_trace(ROOT / "data" / "traces" / "smollm2-135m__code-edit.parquet")
    t = t.select(proposers=["ngram", "early-exit"])
    keep = t.requests["request_id"].tolist()[:12]
    t = Trace(t.acc[t.acc.request_id.isin(keep)], t.requests[t.requests.request_id.isin(keep)], t.meta)
    pub = read_trace(t.to_published_jsonl(tmp_path / "combined_code-edit.jsonl"), model="m", k_max=16)
    assert pub.acc.draft_len.isna().all()
    cm2 = copy.deepcopy(cm)
    cm2.drafters["early-exit"] = cm2.drafter("eagle")
    kw = dict(batch_sizes=[1, 16], progress=False)
    a = simulate(t, cm2, "ngram,early-exit", ["adaptive-rule", "adaptive-learned"], **kw)
    b = simulate(pub, cm2, "ngram,early-exit", ["adaptive-rule", "adaptive-learned"], **kw)
    cols = ["speedup", "mean_tokens_per_step", "sd_time_s"]
    np.testing.assert_allclose(a[cols].to_numpy(), b[cols].to_numpy(), rtol=1e-12)
    no_ids = Trace(pub.acc, pub.requests.drop(columns=["prompt_token_ids", "output_token_ids"]), pub.meta)
    with pytest.raises(SimulationError, match="token ids"):
        simulate(no_ids, cm2, "ngram,early-exit", "adaptive-rule", progress=False)


def test_clear_errors(cm):
    small = structured_trace(2, n=6)
    with pytest.raises(SimulationError, match="at least 10 requests"):
        simulate(small, cm, "ngram,eagle", "adaptive-learned", progress=False)
    simulate(small, cm, "ngram,eagle", "adaptive-rule", progress=False)   # the rule needs no training
    with pytest.raises(TraceError, match="unknown proposer"):
        simulate(small, cm, "ngram,mtp", "adaptive-rule", progress=False)
    with pytest.raises(SimulationError, match="adaptive-rule"):
        simulate(small, cm, "ngram", "adaptive", progress=False)


def _cli(*args):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "spec_repro.cli", "simulate", *args, "--no-progress"],
                          capture_output=True, text=True, timeout=180, check=False)


def test_cli_adaptive_and_bad_input(tmp_path):
    """`--policy adaptive-rule adaptive-learned --draft-cost ran` on a committed trace; a missing proposer and
    adaptive-learned on too few requests fail with one line, exit code != 0, no traceback."""
    trace = ROOT / "data" / "traces" / "smollm2-135m__code-edit.parquet"
    out = tmp_path / "o.csv"
    cm = copy.deepcopy(load_cost_model("llama3.1-8b-h100"))
    cm.drafters["early-exit"] = cm.drafter("eagle")
    cm.to_json(tmp_path / "cm.json")
    r = _cli("--traces", str(trace), "--proposers", "ngram,early-exit", "--policy", "adaptive-rule",
             "adaptive-learned", "oracle-combine", "--draft-cost", "all", "ran", "--cost-model",
             str(tmp_path / "cm.json"), "--batch-sizes", "1", "64", "--out", str(out))
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(out)
    assert len(df) == 2 * 2 + 2 * 2
    assert set(df[df.policy.str.startswith("adaptive")].draft_cost) == {"ran"}
    bad = _cli("--traces", str(trace), "--proposers", "ngram,draft", "--policy", "adaptive-rule",
               "--draft-cost", "ran", "--out", str(out))
    few = structured_trace(2, n=6).to_parquet(tmp_path / "few.parquet")
    few_r = _cli("--traces", str(few), "--proposers", "ngram,eagle", "--policy", "adaptive-learned",
                 "--out", str(out))
    for res, msg in ((bad, "unknown proposer(s) ['draft']"), (few_r, "at least 10 requests")):
        assert res.returncode != 0
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and msg in lines[0], res.stderr
        assert "Traceback" not in res.stderr


def test_report_on_the_committed_code_edit_trace():
    """On the committed SmolLM2 code-edit trace (n-gram + EAGLE), bs 1 and 16, per-token EAGLE pricing: the table
    holds the rule, the causal policies and the oracle; the best causal policy stays within 2% of the best fixed
    k at any k and Oracle Combine (winner) bounds everything that runs."""
    from spec_repro.analysis import adaptive_report

    sim, table, summary = adaptive_report(ROOT / "data" / "traces" / "smollm2-135m__code-edit.parquet",
                                          batch_sizes=[1, 16], seeds=(42, 43))
    assert len(summary) == 1 and summary.set.iloc[0] == "ngram+eagle"
    r = summary.iloc[0]
    assert r.worst_vs_fixed >= 0.98 and r.rule_config.startswith("ngram-else-eagle")
    for col in ("rule", "best_causal", "best_fixed", "adaptive_rule", "learned_mean"):
        assert (table[col] <= table["combine_winner"] * 1.0001).all(), col
    assert (table["learned_seeds"] == 2).all() and np.isnan(table["adaptive_rule_oos"]).all()  # one model: no oos
    assert set(sim.loc[sim.policy.str.startswith(("adaptive", "ngram-else")), "draft_cost"]) == {"ran"}
