"""The cost model's optional ragged-batch target forward (costmodel.CostModel.ragged_target): pricing, JSON, the
fit, the simulator's use of it (exactly at ragged steps, by hand and against the plain reference loop), the
adaptive rule, the unchanged outputs of models without one (sha256 of simulate rows pinned from the code before
the ragged forward existed) and the committed H200 preset (regenerated from
data/gpu/v1-runner/agreement/steps.parquet).
Traces and step tables here are SYNTHETIC (seeded) unless named otherwise."""
import copy
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from reference_sim import reference_simulate  # noqa: E402
from test_costmodel import synthetic_steps  # noqa: E402
from test_simulate import assert_matches, random_trace  # noqa: E402

from spec_repro import adaptive as AD  # noqa: E402
from spec_repro import costmodel as C  # noqa: E402
from spec_repro.costmodel import (PRESETS, CostModel, CostModelError, Drafter, TargetForward, fit,  # noqa: E402
                                  load_cost_model, ragged_steps)
from spec_repro.locations import v1_runner_dir  # noqa: E402
from spec_repro.simulate import _group_arrays, simulate  # noqa: E402
from spec_repro.traces import STEP_COLUMNS, Trace  # noqa: E402
from spec_repro.tracefiles import read_trace  # noqa: E402

ROOT = HERE.parent
REG = dict(c_kv=1e-6, c_tok=1e-4, c0=1e-3)
RAG = dict(c_kv=2e-6, c_tok=3e-4, c0=5e-3)
OVER, FRAC = 1e-4, 0.1


def model(ragged=True):
    return CostModel("hand", **REG, overhead=OVER,
                     drafters={"ngram": Drafter("fraction", fraction=FRAC),
                               "eagle": Drafter("linear", c_kv=1e-8, c_tok=1e-6, c0=2e-4)},
                     ragged_target=TargetForward(**RAG) if ragged else None)


def F(kv, n):
    return REG["c_kv"] * kv + REG["c_tok"] * n + REG["c0"]


def Fr(kv, n):
    return RAG["c_kv"] * kv + RAG["c_tok"] * n + RAG["c0"]


# ---- the model ----------------------------------------------------------------------------------------------------
def test_forward_ragged_where_asked_and_only_with_a_ragged_forward():
    m, flat = model(), model(False)
    assert m.has_ragged and not flat.has_ragged
    assert m.forward(1000, 4) == F(1000, 4) and m.forward(1000, 4, ragged=False) == F(1000, 4)
    assert m.forward(1000, 4, ragged=True) == pytest.approx(Fr(1000, 4), rel=1e-15)
    assert isinstance(m.forward(1000, 4, ragged=True), float)   # a scalar in, a scalar out (np.float64)
    kv, n, r = np.array([0, 10, 5000]), np.array([1, 3, 128]), np.array([True, False, True])
    np.testing.assert_allclose(m.forward(kv, n, r), [Fr(0, 1), F(10, 3), Fr(5000, 128)], rtol=1e-15)
    np.testing.assert_array_equal(flat.forward(kv, n, r), flat.forward(kv, n))   # no ragged F: F everywhere
    np.testing.assert_array_equal(m.forward(kv, n, np.zeros(3, bool)), flat.forward(kv, n))
    assert "ragged-batch forward" in m.summary() and "ragged" not in flat.summary()


def test_json_round_trip_and_errors(tmp_path):
    m = model()
    p = m.to_json(tmp_path / "m.json")
    d = json.loads(p.read_text())
    assert d["target"]["ragged"] == RAG
    m2 = load_cost_model(p)
    assert m2.ragged_target == TargetForward(**RAG) and m2.to_dict() == m.to_dict()
    # a model without one writes no "ragged" key: the existing presets read and write back as before
    for name in ("llama3.1-8b-h100", "llama3.1-8b-h100-per-token"):
        e = load_cost_model(name)
        assert e.ragged_target is None and set(e.to_dict()["target"]) == {"c_kv", "c_tok", "c0"}
        assert json.loads(PRESETS[name].read_text())["target"] == e.to_dict()["target"]
    for bad, msg in (({"c_kv": 1e-8, "c_tok": 1e-6}, "lacks"), ({"c_kv": -1e-8, "c_tok": 1e-6, "c0": 1e-3},
                                                               "negative"),
                     ({"c_kv": 1e-8, "c_tok": 0, "c0": 0}, "one-token ragged forward"), (3.0, "must be an object"),
                     ({"c_kv": "x", "c_tok": 1e-6, "c0": 1e-3}, "must be a number")):
        dd = copy.deepcopy(d)
        dd["target"]["ragged"] = bad
        with pytest.raises(CostModelError, match=msg):
            CostModel.from_dict(dd)
    dd = copy.deepcopy(d)
    dd["target"]["ragged"] = None
    assert CostModel.from_dict(dd).ragged_target is None


# ---- the fit ------------------------------------------------------------------------------------------------------
TRUE_RAG = dict(c_kv=9e-8, c_tok=5e-5, c0=9e-3)


def ragged_synthetic_steps(seed=0, noise=0.02, n=600):
    """SYNTHETIC steps from known coefficients: test_costmodel's, with n-gram steps where some request of the
    batch proposes nothing (ragged: uniform False) priced by a second, known forward."""
    from test_costmodel import TRUE

    rng = np.random.default_rng(seed)
    df = synthetic_steps(seed, noise, n)
    df["uniform"] = True
    df["phase"] = "decode"
    ng = np.flatnonzero((df["method"] == "ngram").to_numpy())
    b = df.loc[ng, "batch_size"].to_numpy()
    idle = np.minimum(rng.integers(0, 3, len(ng)) * rng.integers(1, 9, len(ng)), b)  # requests proposing 0
    idle = np.where(rng.random(len(ng)) < 0.5, 0, idle)
    nt = (b - idle) * 4 + idle
    kv = df.loc[ng, "kv_tokens"].to_numpy()
    rag = idle > 0
    tr = (TRUE_RAG["c_kv"] * kv + TRUE_RAG["c_tok"] * nt + TRUE_RAG["c0"]) * (1 + noise * rng.standard_normal(len(ng)))
    tu = (TRUE["c_kv"] * kv + TRUE["c_tok"] * nt + TRUE["c0"]) * (1 + noise * rng.standard_normal(len(ng)))
    tv = np.where(rag, tr, tu)
    td = TRUE["frac"] * tv * (1 + noise * rng.standard_normal(len(ng)))
    df.loc[ng, "batched_tokens"] = nt
    df.loc[ng, "num_draft_tokens"] = (b - idle) * 3
    df.loc[ng, "t_verify"] = tv
    df.loc[ng, "t_draft"] = td
    df.loc[ng, "uniform"] = ~rag
    df["t_total"] = df[["t_draft", "t_verify", "t_reject", "t_other"]].sum(axis=1)
    # a few prefill steps that are not uniform: they belong to the regular F (ragged means ragged DECODE steps)
    pre = df.iloc[:5].copy().assign(phase="prefill", uniform=False, kv_tokens=0, batched_tokens=[200, 400, 800, 60, 90])
    pre["t_verify"] = TRUE["c_tok"] * pre["batched_tokens"] + TRUE["c0"]
    pre["t_total"] = pre[["t_draft", "t_verify", "t_reject", "t_other"]].sum(axis=1)
    return pd.concat([df, pre], ignore_index=True)


def test_fit_recovers_both_forwards():
    from test_costmodel import TRUE

    steps = ragged_synthetic_steps()
    rag = ragged_steps(steps)
    assert 150 < rag.sum() < 400 and not rag[-5:].any()   # the non-uniform prefill steps are not ragged
    res = fit(steps, kinds={"draft_model": "per_token"})
    m = res.model
    assert m.c_kv == pytest.approx(TRUE["c_kv"], rel=0.03) and m.c0 == pytest.approx(TRUE["c0"], rel=0.03)
    r = m.ragged_target
    assert r.c_kv == pytest.approx(TRUE_RAG["c_kv"], rel=0.05) and r.c0 == pytest.approx(TRUE_RAG["c0"], rel=0.05)
    assert r.c_tok == pytest.approx(TRUE_RAG["c_tok"], rel=0.15)
    assert res.n_steps["target:ragged"] == rag.sum() and res.n_steps["target"] == len(steps) - rag.sum()
    assert res.r2["target"] > 0.98 and res.r2["target:ragged"] > 0.9
    assert set(m.fit["r2"]) >= {"target", "target:ragged"} and m.fit["n_steps"]["target:ragged"] == rag.sum()
    assert m.drafter("ngram").fraction == pytest.approx(TRUE["frac"], rel=0.02)
    # one F over all steps is pulled between the two (what costmodel.fit did before): worse at both
    one = fit(steps, ragged=False)
    assert one.model.ragged_target is None and "target:ragged" not in one.n_steps
    assert one.r2["target"] < res.r2["target"] - 0.05
    r1 = one.residuals.query("component == 'target'").set_index("row")["residual"]
    assert r1[rag].mean() > 2e-3 and r1[~rag].mean() < 0   # ragged steps priced too cheap, the others too dear


def test_fit_noise_free_is_exact_and_auto_without_the_column_is_unchanged():
    steps = ragged_synthetic_steps(seed=4, noise=0.0, n=200)
    r = fit(steps, ragged=True).model.ragged_target
    assert (r.c_kv, r.c_tok, r.c0) == (pytest.approx(TRUE_RAG["c_kv"], rel=1e-6),
                                       pytest.approx(TRUE_RAG["c_tok"], rel=1e-6),
                                       pytest.approx(TRUE_RAG["c0"], rel=1e-6))
    plain = synthetic_steps(seed=2)
    a, b = fit(plain), fit(plain, ragged=False)
    assert a.model.to_dict() == b.model.to_dict() and a.model.ragged_target is None
    with pytest.raises(CostModelError, match="needs a 'uniform' column"):
        fit(plain, ragged=True)
    # a uniform column with fewer than min_steps ragged decode steps: auto fits one F, True refuses
    few = plain.assign(uniform=True)
    few.loc[:1, "uniform"] = False
    assert fit(few).model.ragged_target is None
    assert fit(few).model.to_dict() == b.model.to_dict()
    with pytest.raises(CostModelError, match="at least 3 ragged"):
        fit(few, ragged=True)
    with pytest.raises(CostModelError, match="ragged must be"):
        fit(plain, ragged="yes")


# ---- the simulator: by hand -------------------------------------------------------------------------------------
PA, PB, L = 10, 20, 4


def two_requests():
    """Two requests, K = 2, nothing ever accepted (acc_len 1: one token per step, steps at p = 1, 2, 3). Request a's
    n-gram found no match at position 1 (draft_len 0): its step p = 2 verifies 1 token, not K + 1 = 3."""
    return Trace.from_arrays({"a": {"ngram": [1] * L}, "b": {"ngram": [1] * L}}, prompt_lens={"a": PA, "b": PB},
                             dataset="code-edit", model="m", k_max=2,
                             draft_lens={"a": {"ngram": [2, 0, 2, 2]}, "b": {"ngram": [2] * L}})


@pytest.mark.parametrize("B", [1, 3])
def test_ragged_forward_exactly_at_the_ragged_step_duplicate(B):
    t = two_requests()
    rag = simulate(t, model(), "ngram", "fixed-2", batch_sizes=[B], progress=False).iloc[0]
    flat = simulate(t, model(False), "ngram", "fixed-2", batch_sizes=[B], progress=False).iloc[0]
    # by hand: request a's steps p = 1, 3 and all of b's verify 3 tokens per copy (uniform), a's p = 2 one (ragged)
    va = F(0, B * PA) + F(B * (PA + 1), 3 * B) + Fr(B * (PA + 2), B) + F(B * (PA + 3), 3 * B)
    vb = F(0, B * PB) + sum(F(B * (PB + p), 3 * B) for p in (1, 2, 3))
    da = FRAC * (F(B * (PA + 1), 3 * B) + F(B * (PA + 3), 3 * B))   # no drafting where nothing was proposed
    db = FRAC * sum(F(B * (PB + p), 3 * B) for p in (1, 2, 3))
    o = 4 * OVER
    assert rag.sd_time_s == pytest.approx((va + da + vb + db + 2 * o) / 2, rel=1e-13)
    assert rag.verify_share * rag.sd_time_s * 2 == pytest.approx(va + vb, rel=1e-13)
    assert rag.draft_share * rag.sd_time_s * 2 == pytest.approx(da + db, rel=1e-13)
    # against the same model without a ragged forward: the difference is that one step's forward, nothing else
    assert (rag.sd_time_s - flat.sd_time_s) * 2 == pytest.approx(Fr(B * (PA + 2), B) - F(B * (PA + 2), B),
                                                                 rel=1e-9)
    assert rag.base_time_s == flat.base_time_s and rag.base_tokens_per_s == flat.base_tokens_per_s


def test_ragged_forward_exactly_at_the_ragged_step_mixed():
    t = two_requests()
    rag = simulate(t, model(), "ngram", "fixed-2", batch_sizes=[2], batching="mixed", progress=False).iloc[0]
    flat = simulate(t, model(False), "ngram", "fixed-2", batch_sizes=[2], batching="mixed", progress=False).iloc[0]
    # one batch of both: prefill, then three steps; the second is ragged for the whole batch (a verifies 1 token,
    # b 3: F_r over all 4 tokens) and b's n-gram drafting there is a fraction of that ragged forward
    kv = lambda p: PA + p + PB + p  # noqa: E731
    f1, f2, f3 = F(kv(1), 6), Fr(kv(2), 4), F(kv(3), 6)
    verify = F(0, PA + PB) + f1 + f2 + f3
    draft = FRAC * (f1 + f2 + f3)
    assert rag.sd_time_s == pytest.approx(verify + draft + 4 * OVER, rel=1e-13)
    assert rag.verify_share * rag.sd_time_s == pytest.approx(verify, rel=1e-13)
    assert flat.sd_time_s == pytest.approx(verify - f2 + F(kv(2), 4) + FRAC * (f1 + F(kv(2), 4) + f3) + 4 * OVER,
                                           rel=1e-13)
    # batch 1 (one request after the other): only a's second step is ragged
    one = simulate(t, model(), "ngram", "fixed-2", batch_sizes=[1], batching="mixed", progress=False).iloc[0]
    flat1 = simulate(t, model(False), "ngram", "fixed-2", batch_sizes=[1], batching="mixed", progress=False).iloc[0]
    assert one.sd_time_s - flat1.sd_time_s == pytest.approx(Fr(PA + 2, 1) - F(PA + 2, 1), rel=1e-9)


def test_oracles_prefill_and_baseline_keep_the_regular_forward():
    t = two_requests()
    for pol in ("oracle",):
        a = simulate(t, model(), "ngram", pol, batch_sizes=[1, 4], batching=["duplicate", "mixed"], progress=False)
        b = simulate(t, model(False), "ngram", pol, batch_sizes=[1, 4], batching=["duplicate", "mixed"],
                     progress=False)
        pd.testing.assert_frame_equal(a, b)
    # a fixed-K run where every step verifies K + 1 tokens is uniform throughout: the same as without a ragged F
    full = Trace.from_arrays({"a": {"ngram": [1] * L}}, prompt_lens={"a": PA}, dataset="code-edit", model="m",
                             k_max=2, draft_lens={"a": {"ngram": [2] * L}})
    a = simulate(full, model(), "ngram", "fixed-2", batch_sizes=[1, 4], batching=["duplicate", "mixed"],
                 progress=False)
    b = simulate(full, model(False), "ngram", "fixed-2", batch_sizes=[1, 4], batching=["duplicate", "mixed"],
                 progress=False)
    pd.testing.assert_frame_equal(a, b)


# ---- the simulator: against the plain reference loop, which re-implements the rule from the docstring ----------
@pytest.mark.parametrize("seed,known", [(1, False), (2, True), (3, True)])
@pytest.mark.parametrize("batching", ["duplicate", "mixed"])
def test_exact_against_reference_loop_with_a_ragged_forward(seed, known, batching):
    cm = copy.deepcopy(load_cost_model("llama3.1-8b-h100"))
    cm.drafters["draft"] = Drafter("per_token", c_kv=1.1e-9, c_tok=3e-6, c0=7e-4)
    cm.ragged_target = TargetForward(c_kv=7e-8, c_tok=4e-5, c0=1.4e-2)
    flat = copy.deepcopy(cm)
    flat.ragged_target = None
    trace = random_trace(seed, known_draft_len=known)
    differs = 0
    cases = ((["ngram"], "fixed-1"), (["ngram"], "fixed-3"), (["eagle"], "fixed-2"), (["draft"], "fixed-4"),
             (["ngram"], "oracle"), (["ngram", "eagle"], "oracle-combine"))
    for props, policy, row, row0 in rows_against_reference(trace, cm, flat, cases, batching, seed):
        differs += row.sd_time_s != row0.sd_time_s
        if policy.startswith("oracle") or props != ["ngram"]:   # no ragged step: the regular F throughout
            assert row.sd_time_s == row0.sd_time_s
    assert differs >= 6   # every n-gram fixed-K row has steps with no (or a shorter) match


def rows_against_reference(trace, cm, other, cases, batching, seed, batch_sizes=(1, 2, 5)):
    """(props, policy, row, row of ``other``) for every (props, policy) in ``cases`` and batch size, after checking
    that ``cm``'s row matches the plain reference loop."""
    for props, policy in cases:
        kw = dict(batch_sizes=list(batch_sizes), batching=batching, progress=False, seed=seed)
        df, df0 = simulate(trace, cm, props, policy, **kw), simulate(trace, other, props, policy, **kw)
        for (_, row), (_, row0) in zip(df.iterrows(), df0.iterrows()):
            assert_matches(row, reference_simulate(trace, cm, props, policy, "ngram-only", row.batch_size, batching,
                                                   seed=seed))
            yield props, policy, row, row0


# ---- the adaptive policies --------------------------------------------------------------------------------------
def test_rule_prices_ragged_choices_and_simulate_prices_its_steps():
    from test_adaptive import group, structured_trace

    kmax = 8
    t = structured_trace(5, n=6, proposers=("ngram", "eagle"))
    reqs, requests = group(t, ["ngram", "eagle"])
    cm = copy.deepcopy(load_cost_model("llama3.1-8b-h100"))
    flat = copy.deepcopy(cm)
    cm.ragged_target = TargetForward(cm.c_kv, cm.c_tok, 0.5)   # a ragged step costs 0.5 s: avoid it at any price
    assert len(AD._costs(cm, ["ngram", "eagle"])["tcost"]) == 8 and len(AD._costs(flat, ["ngram", "eagle"])["tcost"]) == 4
    st = AD.adaptive_steps(reqs, requests, ["ngram", "eagle"], "adaptive-rule", 1, cm, kmax)
    st0 = AD.adaptive_steps(reqs, requests, ["ngram", "eagle"], "adaptive-rule", 1, flat, kmax)
    assert (st.inp == kmax + 1).all()              # only uniform steps (k = kmax) are chosen
    assert (st0.inp != kmax + 1).any()             # which the regular F alone does not do
    # the learned policy's labels: an action with k != kmax is priced with the ragged forward
    inp = AD._inputs(reqs, requests, ["ngram", "eagle"], cm, kmax)
    Y = AD._labels(reqs, inp, 1, st.req, st.p, st.idx)
    acts = [tuple(a) for a in inp.acts]
    assert Y[:, acts.index((-1, 0))].max() < 2 / 0.5 and Y[:, acts.index((1, kmax))].min() > 10
    # simulate prices the steps adaptive-rule takes: at batch 1 under the flat model's choices, a ragged forward
    # where k != kmax. Drafting and overhead as simulate charges them (the flat model's own row minus its F).
    row = simulate(t, flat, "ngram,eagle", "adaptive-rule", batch_sizes=[1], progress=False).iloc[0]
    mixed = copy.deepcopy(flat)
    mixed.ragged_target = TargetForward(2 * flat.c_kv, 3 * flat.c_tok, 2 * flat.c0)   # cheap enough to use
    st2 = AD.adaptive_steps(reqs, requests, ["ngram", "eagle"], "adaptive-rule", 1, mixed, kmax)
    assert (st2.inp != kmax + 1).any() and (st2.inp == kmax + 1).any()
    r2 = simulate(t, mixed, "ngram,eagle", "adaptive-rule", batch_sizes=[1], progress=False).iloc[0]
    kv = reqs.P[st2.req] + st2.p
    verify = mixed.forward(0, reqs.P).sum() + mixed.forward(kv, st2.inp, st2.inp - 1 != kmax).sum()
    assert r2.verify_share * r2.sd_time_s * len(reqs.P) == pytest.approx(verify, rel=1e-12)
    assert row.sd_time_s != r2.sd_time_s


# ---- unchanged outputs without a ragged forward ------------------------------------------------------------------
def _digest(df):
    return hashlib.sha256(df.to_csv(index=False, float_format="%.17g").encode()).hexdigest()


# sha256 of simulate's rows (CSV, %.17g) computed with the code BEFORE the ragged forward existed (commit 047a117,
# this package's venv: numpy 2.4, numba); a model without a ragged forward must give them to the bit. (A different
# numpy / numba may move low bits of the sums: recompute them at that commit before suspecting the simulator.)
# llama3.1-8b-h200's five rows that price EAGLE were re-pinned when the drafting-time sweep
# (data/gpu/v1-runner/draft-k,
# ``costmodel.enter_drafting``) replaced that preset's EAGLE drafter: its other rows are still the 047a117 ones.
# Every row that reads the Qwen trace's ``eagle`` column was re-pinned when that column was profiled again with the
# committed head (941910f7, the same simulator code): the n-gram rows and the published fixture's are 047a117's.
PINNED = {
    "llama3.1-8b-h100|qwen|ngram|fixed-1,fixed-3,fixed-5,oracle":
        "1dbd318fcc64b57649dc65bf396b1227da70dd9e7d0805ffa0f9d55bfc567787",
    "llama3.1-8b-h100|qwen|eagle|fixed-3,oracle":
        "a2cddc63eb47e069c5532d89bb729d6cac6c7d0a44f5ec87d555777ba81841d9",
    "llama3.1-8b-h100|qwen|ngram,eagle|oracle-combine":
        "17570d687b621952c7ea0fc4b7d9c3c7b379566cbe0252626548a786bb784e16",
    "llama3.1-8b-h100|qwen|ngram,eagle|ngram-else-eagle-5-5,ngram-else-eagle-skip-3-3":
        "bb4f575c3d2b931cfaf45e822a1f848a4332ee877ca88d743611fff56dbc5f94",
    "llama3.1-8b-h100|qwen|ngram,eagle|adaptive-rule":
        "af6a09a40ca0b2d62b0232c6568e6680e88adfa8d463d0c174da984054657f26",
    "llama3.1-8b-h100|qwen|ngram|dynamic-k":
        "3ec96482ac4572b1dfa5181b976da32ba15277a6ecdb11e56be6c56a63db3010",
    "llama3.1-8b-h100|sharegpt|ngram|fixed-3,oracle":
        "f4b9334883b66d15aa117009e309ad7c762ab25cf44495c9314b7042d2bd0487",
    "llama3.1-8b-h100|sharegpt|ngram,eagle|oracle-combine":
        "a42c069b020fb03258404c8767965e50d92cbff3d01ea2fce907ce69461e16a2",
    "llama3.1-8b-h200|qwen|ngram|fixed-1,fixed-3,fixed-5,oracle":
        "30777597924d02240504b711daa263d5d7a7f14f78737a5b9669ad38e9dbbb9e",
    "llama3.1-8b-h200|qwen|eagle|fixed-3,oracle":
        "73bc4659ded6118c5e1ea6f46a1c37c1d597aa9f268b8b14a8ef2a6ee50749b1",
    "llama3.1-8b-h200|qwen|ngram,eagle|oracle-combine":
        "4f52b01b4e82a8c97d0627ccce64000de192868f412d328d4d9e76ca3cf5bcd0",
    "llama3.1-8b-h200|qwen|ngram,eagle|ngram-else-eagle-5-5,ngram-else-eagle-skip-3-3":
        "579af4e283506f094ee802c7fe51062c684bf167156f1803e5b320d7942e14c7",
    "llama3.1-8b-h200|qwen|ngram,eagle|adaptive-rule":
        "b2109ff502ae421e7a9b219a2e2d36635790782f03fc97d15e5c51a32a24ad50",
    "llama3.1-8b-h200|qwen|ngram|dynamic-k":
        "e9d648c5e6855fb187406047a1401cd07c109fd0dd757cda22530ae867d6abba",
    "llama3.1-8b-h200|sharegpt|ngram|fixed-3,oracle":
        "2dc7718233938ce83091f15ff9a366f4af090089947833cc7423f68355fa7c8c",
    "llama3.1-8b-h200|sharegpt|ngram,eagle|oracle-combine":
        "464ff385717bd09049bcd386647974a599f02bc3b27c6abf600a119e018bad88",
    "llama3.1-8b-h100-per-token|qwen|ngram|fixed-1,fixed-3,fixed-5,oracle":
        "1dbd318fcc64b57649dc65bf396b1227da70dd9e7d0805ffa0f9d55bfc567787",
    "llama3.1-8b-h100-per-token|qwen|eagle|fixed-3,oracle":
        "48ad339319d5762790d4d1ffa6e96b4343952b39af98d0b1681e5348ec4050d2",
    "llama3.1-8b-h100-per-token|qwen|ngram,eagle|oracle-combine":
        "4692bff32427bf1182b6dfd2c2c1d7d64dec25d270f97a5a69979842d6d12d37",
    "llama3.1-8b-h100-per-token|qwen|ngram,eagle|ngram-else-eagle-5-5,ngram-else-eagle-skip-3-3":
        "2e3e359c6fc824621b1016f84184f5b87dbd41084805281031743d22ab76052d",
    "llama3.1-8b-h100-per-token|qwen|ngram,eagle|adaptive-rule":
        "570b033cf61733e448d21f263360a78bca21d135bd061fa0244a3250b6927696",
    "llama3.1-8b-h100-per-token|qwen|ngram|dynamic-k":
        "3ec96482ac4572b1dfa5181b976da32ba15277a6ecdb11e56be6c56a63db3010",
    "llama3.1-8b-h100-per-token|sharegpt|ngram|fixed-3,oracle":
        "f4b9334883b66d15aa117009e309ad7c762ab25cf44495c9314b7042d2bd0487",
    "llama3.1-8b-h100-per-token|sharegpt|ngram,eagle|oracle-combine":
        "c715e2864e1414a9998de562aaa0a561c45bbc5cd98c814b6205624cf741bd69",
    "llama3.1-8b-h100|qwen|ngram,eagle|adaptive-learned":
        "2f872438da2ad0144b9d4b3b86c195278da5b86d59eaf8aa2945358e518bcfec",
}


#: the adaptive rows were pinned with the rule's estimate from the request's own counts alone: RuleParams(pool_w=0,
#: lcb=0) gives them to the bit (the defaults' population prior and lower bound change them by design)
_OLD_RULE = {"adaptive-rule": dict(adaptive_params=AD.RuleParams(pool_w=0, lcb=0))}


def _pinned_runs():
    """(key, thunk): every policy kind, both batchings, the committed Qwen trace (recorded draft_len) and a
    published-format fixture (n-gram's seeded random match), the presets without a ragged forward."""
    qwen = read_trace(ROOT / "data" / "traces" / "qwen2.5-coder-1.5b__code-edit.parquet")
    fix = read_trace(HERE / "fixtures" / "published" / "combined_sharegpt.jsonl")
    Bs, modes, accts = [1, 8, 32, 64], ["duplicate", "mixed"], ["ngram-only", "winner", "all"]
    for preset in ("llama3.1-8b-h100", "llama3.1-8b-h200", "llama3.1-8b-h100-per-token"):
        for props, pols in (("ngram", ["fixed-1", "fixed-3", "fixed-5", "oracle"]), ("eagle", ["fixed-3", "oracle"]),
                            ("ngram,eagle", ["oracle-combine"]),
                            ("ngram,eagle", ["ngram-else-eagle-5-5", "ngram-else-eagle-skip-3-3"]),
                            ("ngram,eagle", ["adaptive-rule"])):
            yield (f"{preset}|qwen|{props}|{','.join(pols)}",
                   lambda p=preset, q=props, k=pols: simulate(qwen, p, q, k, accts, Bs, modes, sample=60,
                                                              progress=False, **_OLD_RULE.get(k[0], {})))
        yield (f"{preset}|qwen|ngram|dynamic-k",
               lambda p=preset: simulate(qwen, p, "ngram", "dynamic-k", "ngram-only", Bs, "duplicate", sample=60,
                                         progress=False, dynamic_k={1: 5, 32: 2}))
        yield (f"{preset}|sharegpt|ngram|fixed-3,oracle",
               lambda p=preset: simulate(fix, p, "ngram", ["fixed-3", "oracle"], accts, Bs, modes, progress=False))
        yield (f"{preset}|sharegpt|ngram,eagle|oracle-combine",
               lambda p=preset: simulate(fix, p, "ngram,eagle", "oracle-combine", accts, Bs, modes, progress=False))
    yield ("llama3.1-8b-h100|qwen|ngram,eagle|adaptive-learned",
           lambda: simulate(qwen, "llama3.1-8b-h100", "ngram,eagle", "adaptive-learned", "ran", [1, 32], modes,
                            sample=60, progress=False, **_OLD_RULE["adaptive-rule"]))


def test_models_without_a_ragged_forward_give_the_pinned_rows():
    got = {key: _digest(run()) for key, run in _pinned_runs()}
    assert set(got) == set(PINNED)
    assert {k: v for k, v in got.items() if PINNED[k] != v} == {}


# ---- the committed H200 preset ----------------------------------------------------------------------------------
LIVE = v1_runner_dir("agreement") / "steps.parquet"


def test_live_preset_is_listed_and_round_trips(tmp_path):
    assert PRESETS["qwen2.5-coder-1.5b-h200"] == C.LIVE_PRESET
    m = load_cost_model("qwen2.5-coder-1.5b-h200")
    assert m.has_ragged and m.ragged_target.c0 > 2 * m.c0    # the ragged forward is the dearer one
    assert m.drafter("eagle").kind == "per_token" and m.drafter("ngram").kind == "fraction"
    for words in ("vLLM 0.25.0", "H200", "V1", "async scheduling", "synchronous for n-gram", "bf16",
                  "real weights", "2026-12-01", "code-edit", "hybrid-default-none", "hybrid-default-eagle",
                  "hybrid-default-ngram", "left out", "out of sample"):
        assert words in m.source, words
    assert json.loads(C.LIVE_PRESET.read_text()) == m.to_dict()
    m2 = load_cost_model(m.to_json(tmp_path / "p.json"))
    assert m2.to_dict() == m.to_dict() and m2.ragged_target == m.ragged_target


@pytest.mark.skipif(not LIVE.exists(), reason="data/gpu/v1-runner/agreement/steps.parquet not in this checkout")
def test_live_preset_regenerates_from_the_committed_steps(tmp_path):
    committed = json.loads(C.LIVE_PRESET.read_text())
    res = C.fit_live(LIVE, out=tmp_path / "refit.json")
    got = json.loads((tmp_path / "refit.json").read_text())
    t, g = committed["target"], got["target"]
    for key in ("c_kv", "c_tok", "c0"):
        assert g[key] == pytest.approx(t[key], rel=1e-9, abs=1e-18)
        assert g["ragged"][key] == pytest.approx(t["ragged"][key], rel=1e-9, abs=1e-18)
    assert got["overhead"] == pytest.approx(committed["overhead"], rel=1e-12)
    for q, d in committed["drafters"].items():
        assert got["drafters"][q].keys() == d.keys()
        for key, v in d.items():
            assert got["drafters"][q][key] == (v if isinstance(v, str) else pytest.approx(v, rel=1e-9, abs=1e-18))
    assert got["fit"]["n_steps"] == committed["fit"]["n_steps"]
    assert got["fit"]["r2"] == pytest.approx(committed["fit"]["r2"], abs=2e-6)
    assert {k: v for k, v in got.items() if k not in ("target", "overhead", "drafters", "fit")} == \
        {k: v for k, v in committed.items() if k not in ("target", "overhead", "drafters", "fit")}
    # what it was fitted on: the code-edit decode steps of the three single-method specs, nothing else
    steps = C.live_steps(LIVE)
    assert set(steps["spec"]) == set(C.LIVE_SPECS) and (steps["phase"] == "decode").all()
    assert steps["run_id"].str.startswith("code-edit").all()
    assert res.n_steps["target"] + res.n_steps["target:ragged"] == len(steps)
    assert res.n_steps["target:ragged"] == int((~steps["uniform"]).sum()) > 1000
    # the ragged steps are n-gram's only (EAGLE always drafts k; no SD is uniform for a no-SD engine)
    assert set(steps.loc[~steps["uniform"].to_numpy(bool), "spec"]) == {"hybrid-default-ngram"}
    # and the two forwards explain the measured steps far better than one F over them all
    one = fit(steps, kinds=C.LIVE_KINDS, ragged=False)
    pred = res.model.forward(steps["kv_tokens"], steps["batched_tokens"], ragged_steps(steps))
    sse_two = float(((steps["t_verify"] - pred) ** 2).sum())
    sse_one = float((one.residuals.query("component == 'target'")["residual"] ** 2).sum())
    assert sse_two < 0.6 * sse_one
    assert C.main(["fit-live", "--steps", str(LIVE), "--out", str(C.LIVE_PRESET), "--check"]) == 0


def test_path_overhead_puts_each_engine_paths_host_work_on_its_drafter():
    """fit(path_overhead=True): the overhead is no SD's; each method's excess per step goes to its drafter's
    c_step, charged where it drafts (per_token and fraction alike), so no SD is no longer priced at the mean of
    every path's host work."""
    steps = synthetic_steps(noise=0.0)
    extra = {"ngram": 0.002, "eagle": 0.003, "draft_model": 0.0}
    add = steps["method"].map(lambda m: extra.get(m, 0.0))
    steps["t_other"] += add
    steps["t_total"] += add
    plain = fit(steps, ragged=False).model
    m = fit(steps, ragged=False, path_overhead=True).model
    base = float(steps.loc[steps["method"] == "none", "t_other"].mean())
    assert m.overhead == pytest.approx(base) and plain.overhead > base + 0.001
    for q, e in extra.items():
        assert m.drafter(q).c_step - plain.drafter(q).c_step == pytest.approx(e, abs=1e-12)
    # charged once per step where the drafter drafts, for a fraction drafter too
    fr = m.drafter("ngram")
    assert fr.kind == "fraction"
    t = fr.time(np.array([100.0, 100.0]), 4, np.array([0.01, 0.01]), 1, np.array([3, 0]))
    assert t.tolist() == pytest.approx([fr.fraction * 0.01 + fr.c_step, 0.0])
    assert CostModel.from_dict(m.to_dict()).drafter("ngram").c_step == fr.c_step
    with pytest.raises(CostModelError, match="no-SD steps"):
        fit(steps[steps["method"] != "none"], ragged=False, path_overhead=True)


def test_the_live_preset_prices_no_sd_at_its_own_host_work():
    m = load_cost_model("qwen2.5-coder-1.5b-h200")
    steps = C.live_steps(LIVE) if LIVE.exists() else None
    assert m.drafter("eagle").c_step > 0.0015 and m.drafter("ngram").c_step > 0.0015     # ~2 ms each path
    if steps is not None:
        none = steps[steps["spec"] == "hybrid-default-none"]
        assert m.overhead == pytest.approx(float((none["t_other"] + none["t_reject"]).mean()))
