"""Simulator: exactness against the plain reference loop, fidelity on published-format fixtures, a closed form,
monotonicity and accounting order, determinism and clear errors. All traces here are SYNTHETIC (seeded)."""
import copy
import math
import random
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "fixtures" / "published"))

from make_fixtures import make_records, write_jsonl  # noqa: E402
from reference_sim import reference_simulate  # noqa: E402

from spec_repro.costmodel import Drafter, load_cost_model  # noqa: E402
from spec_repro.simulate import RESULT_COLUMNS, SimulationError, combine_order, simulate  # noqa: E402
from spec_repro.traces import Trace, TraceError  # noqa: E402
from spec_repro.tracefiles import read_trace, read_traces  # noqa: E402

FIX = HERE / "fixtures" / "published"
NUMERIC = ["speedup", "sd_tokens_per_s", "base_tokens_per_s", "mean_tokens_per_step", "verify_share",
           "draft_share", "overhead_share", "sd_time_s", "base_time_s", "n_tokens"]


@pytest.fixture(scope="module")
def cm():
    m = copy.deepcopy(load_cost_model("llama3.1-8b-h100"))
    # a draft-model proposer (per drafted token) so every drafter kind is exercised
    m.drafters["draft"] = Drafter("per_token", c_kv=1.1e-9, c_tok=3e-6, c0=7e-4)
    return m


def random_trace(seed, known_draft_len=False, k_max=8, dataset="sharegpt"):
    """Unstructured random arrays (not even consistent), uneven proposer lengths, some 1-token requests."""
    rng = np.random.default_rng(seed)
    arrays, prompts, dls = {}, {}, {}
    for r in range(7):
        L = int(rng.choice([1, 2, 5, int(rng.integers(10, 50)), int(rng.integers(10, 50))]))
        per, per_dl = {}, {}
        for q in ("ngram", "eagle", "draft"):
            Lq = L + int(rng.integers(0, 3))
            a = np.minimum(1 + rng.geometric(rng.uniform(0.2, 0.8), Lq) - 1, k_max + 1)
            per[q] = a.tolist()
            if known_draft_len and q == "ngram":
                dl = np.where(a > 1, rng.integers(np.maximum(a - 1, 1), k_max + 1), rng.integers(0, 2, Lq) * k_max)
                per_dl[q] = dl.tolist()
        arrays[f"r{r}"] = per
        prompts[f"r{r}"] = int(rng.integers(1, 300))
        if per_dl:
            dls[f"r{r}"] = per_dl
    return Trace.from_arrays(arrays, prompt_lens=prompts, dataset=dataset, model="m", k_max=k_max,
                             draft_lens=dls or None)


def assert_matches(row, ref, tol=1e-9):
    for k in NUMERIC:
        assert row[k] == pytest.approx(ref[k], rel=tol, abs=1e-300), (k, row[k], ref[k])


CASES = [(["ngram"], "fixed-1"), (["ngram"], "fixed-3"), (["eagle"], "fixed-2"), (["draft"], "fixed-4"),
         (["ngram"], "oracle"), (["eagle"], "oracle"), (["draft"], "oracle"),
         (["ngram", "eagle"], "oracle-combine"), (["eagle", "ngram", "draft"], "oracle-combine")]


@pytest.mark.parametrize("seed,known", [(1, False), (2, True), (3, False)])
@pytest.mark.parametrize("batching", ["duplicate", "mixed"])
def test_exact_against_reference_loop(cm, seed, known, batching):
    trace = random_trace(seed, known_draft_len=known)
    for props, policy in CASES:
        costs = ["ngram-only", "winner", "all"] if policy == "oracle-combine" else ["ngram-only"]
        df = simulate(trace, cm, props, policy, costs, batch_sizes=[1, 2, 5], batching=batching, progress=False,
                      seed=seed)
        assert len(df) == 3 * len(costs)
        for _, row in df.iterrows():
            ref = reference_simulate(trace, cm, props, policy, row.draft_cost, row.batch_size, batching, seed=seed)
            assert_matches(row, ref)


def test_exact_with_sampling_and_fixture(cm):
    trace = read_trace(FIX / "combined_cnn.jsonl")
    for policy, props in (("fixed-3", ["ngram"]), ("oracle-combine", ["ngram", "eagle"])):
        df = simulate(trace, cm, props, policy, "winner", batch_sizes=[1, 4], sample=7, seed=5, progress=False)
        assert (df["n_requests"] == 7).all()
        for _, row in df.iterrows():
            assert_matches(row, reference_simulate(trace, cm, props, policy, "winner", row.batch_size, sample=7, seed=5))


def test_fidelity_ngram_only_on_published_fixtures(cm):
    """The reference loop IS FACTS.md's method; ngram-only on published-format files must reproduce it, every
    dataset, the study's batch sizes, and the JSON-string form of acc_len must read the same."""
    trace = read_traces(sorted(FIX.glob("combined_*.jsonl")))
    assert trace.datasets == ["cnn", "gsm8k", "instructcoder", "sharegpt"]
    df = simulate(trace, "llama3.1-8b-h100", "ngram,eagle", "oracle-combine", "ngram-only",
                  batch_sizes=[1, 16, 64], progress=False)
    assert len(df) == 12 and set(df["proposers"]) == {"ngram+eagle"}
    for _, row in df.iterrows():
        one = trace.select(dataset=row.dataset)
        assert_matches(row, reference_simulate(one, cm, ["ngram", "eagle"], "oracle-combine", "ngram-only",
                                               row.batch_size))
    # the released rule: combined drafting is exactly 0.5875% of every decode step's target forward
    P, L = 100, 31
    t = Trace.from_arrays({"x": {"ngram": [3] * L, "eagle": [2] * L}}, prompt_lens={"x": P}, dataset="gsm8k",
                          model="m")
    r = simulate(t, cm, "ngram,eagle", "oracle-combine", "ngram-only", progress=False).iloc[0]
    steps = [1 + 3 * s for s in range(10)]
    decode_F = sum(cm.forward(P + p, 3) for p in steps)
    assert r.draft_share * r.sd_time_s == pytest.approx(0.005875 * decode_F, rel=1e-12)


def test_json_string_acc_len_reads_the_same(tmp_path, cm):
    recs = make_records("gsm8k", 6, mean_output=30, seed=9)
    as_str = copy.deepcopy(recs)
    for r in as_str:
        for q in ("acc_ngram", "acc_eagle"):
            r[q]["acc_len"] = str(r[q]["acc_len"])
    a = read_trace(write_jsonl(tmp_path / "combined_gsm8k.jsonl", recs))
    b = read_trace(write_jsonl(tmp_path / "s" / "combined_gsm8k.jsonl", as_str))
    da = simulate(a, cm, "ngram,eagle", "oracle-combine", batch_sizes=[1, 8], progress=False)
    db = simulate(b, cm, "ngram,eagle", "oracle-combine", batch_sizes=[1, 8], progress=False)
    pd.testing.assert_frame_equal(da, db)


@pytest.mark.parametrize("proposer,a,K,B", [("eagle", 3, 1, 1), ("eagle", 3, 3, 1), ("eagle", 5, 5, 1),
                                            ("ngram", 4, 2, 1), ("ngram", 2, 5, 1), ("eagle", 4, 3, 4)])
def test_closed_form_constant_acceptance(cm, proposer, a, K, B):
    """Constant acceptance a, fixed K: g = min(a, K+1) tokens per step, S = ceil((L-1)/g) steps at p_s = 1 + s*g."""
    P, L = 120, 301
    t = Trace.from_arrays({"x": {proposer: [a] * L}}, prompt_lens={"x": P}, dataset="gsm8k", model="m", k_max=20)
    row = simulate(t, cm, proposer, f"fixed-{K}", batch_sizes=[B], progress=False).iloc[0]
    g = min(a, K + 1)
    S = math.ceil((L - 1) / g)
    sum_kv = B * (S * (P + 1) + g * S * (S - 1) / 2)            # sum over steps of kv = B*(P + p_s)
    verify = S * (cm.c_tok * B * (K + 1) + cm.c0) + cm.c_kv * sum_kv
    if proposer == "eagle":
        e = cm.drafter("eagle")
        draft = e.c_kv * sum_kv + S * (e.c_tok * (K + 1) + e.c0)
    else:  # a > 1 everywhere: n-gram always matches and pays 0.5875% of each step's forward
        draft = 0.005875 * verify
    prefill = cm.c_tok * B * P + cm.c0
    sd = prefill + cm.overhead + verify + draft + S * cm.overhead
    m = L - 1
    base = prefill + cm.overhead + cm.c_kv * B * (m * P + m * (m + 1) / 2) + m * (cm.c_tok * B + cm.c0 + cm.overhead)
    assert row.speedup == pytest.approx(base / sd, rel=1e-12)
    assert row.mean_tokens_per_step == pytest.approx(g * S / S)
    assert row.sd_tokens_per_s == pytest.approx(B * L / sd, rel=1e-12)


@pytest.fixture(scope="module")
def realistic():
    """Bigger synthetic traces with consistent arrays (acc_len[p+1] >= acc_len[p] - 1), like real ones."""
    return {ds: Trace.from_arrays(
        {r["id"]: {"ngram": r["acc_ngram"]["acc_len"], "eagle": r["acc_eagle"]["acc_len"]}
         for r in make_records(ds, 40, mean_output=150, seed=11)},
        prompt_lens={r["id"]: len(r["prompt_token_ids"]) for r in make_records(ds, 40, mean_output=150, seed=11)},
        dataset=ds, model="synthetic") for ds in ("instructcoder", "sharegpt")}


@pytest.mark.parametrize("batching", ["duplicate", "mixed"])
def test_oracle_beats_every_fixed_k(realistic, batching):
    for ds, t in realistic.items():
        for q in ("ngram", "eagle"):
            pol = ["oracle"] + [f"fixed-{k}" for k in range(1, 8)]
            df = simulate(t, "llama3.1-8b-h100", q, pol, batch_sizes=[1, 8, 64], batching=batching, progress=False)
            for B, g in df.groupby("batch_size"):
                s = g.set_index("policy")["speedup"]
                assert (s["oracle"] >= s.drop("oracle")).all(), (ds, q, B, s.to_dict())


def test_combine_beats_each_single_oracle_and_accountings_order(realistic):
    for ds, t in realistic.items():
        bs = [1, 8, 64]
        comb = simulate(t, "llama3.1-8b-h100", "ngram,eagle", "oracle-combine", ["ngram-only", "winner", "all"],
                        batch_sizes=bs, progress=False).set_index(["draft_cost", "batch_size"])["speedup"]
        for q in ("ngram", "eagle"):
            single = simulate(t, "llama3.1-8b-h100", q, "oracle", batch_sizes=bs, progress=False)
            for B, s in zip(single["batch_size"], single["speedup"]):
                assert comb["ngram-only", B] >= s, (ds, q, B)
        for B in bs:  # EAGLE's drafting is dearer than n-gram's: each step that charges it lowers the bound
            assert comb["ngram-only", B] > comb["winner", B] > comb["all", B], (ds, B)


def test_winner_ties_go_to_the_cheaper_drafter_whatever_the_order(realistic):
    t = realistic[sorted(realistic)[0]]
    a = simulate(t, "llama3.1-8b-h100", "ngram,eagle", "oracle-combine", "winner", [1, 16], progress=False)
    b = simulate(t, "llama3.1-8b-h100", "eagle,ngram", "oracle-combine", "winner", [1, 16], progress=False)
    np.testing.assert_allclose(a["speedup"], b["speedup"], rtol=1e-12)
    assert combine_order(load_cost_model("llama3.1-8b-h100"), ["eagle", "ngram"]) == ["ngram", "eagle"]


def test_mixed_with_identical_requests_equals_duplicate(cm):
    rec = make_records("cnn", 1, mean_output=80, seed=4)[0]
    B = 6
    arrays = {f"c{i}": {"ngram": rec["acc_ngram"]["acc_len"], "eagle": rec["acc_eagle"]["acc_len"]} for i in range(B)}
    copies = Trace.from_arrays(arrays, prompt_lens={k: len(rec["prompt_token_ids"]) for k in arrays}, dataset="cnn",
                               model="m")
    one = copies.select(proposers=["ngram", "eagle"])
    one = Trace(one.acc[one.acc["request_id"] == "c0"], one.requests[one.requests["request_id"] == "c0"])
    for pol, props in (("oracle", "eagle"), ("oracle-combine", "ngram,eagle")):
        mixed = simulate(copies, cm, props, pol, "all", batch_sizes=[B], batching="mixed", progress=False).iloc[0]
        dup = simulate(one, cm, props, pol, "all", batch_sizes=[B], progress=False).iloc[0]
        for k in ("speedup", "sd_tokens_per_s", "base_tokens_per_s", "sd_time_s", "draft_share"):
            assert mixed[k] == pytest.approx(dup[k], rel=1e-12), k


def test_columns_defaults_and_determinism(cm):
    trace = read_traces(sorted(FIX.glob("combined_*.jsonl")))
    df = simulate(trace, cm, ["ngram"], ["fixed-1", "fixed-3", "oracle"], batch_sizes=(1, 8), progress=False)
    assert list(df.columns) == RESULT_COLUMNS
    assert len(df) == 4 * 3 * 2
    assert (df["n_requests"] == 12).all()  # every request by default
    assert set(df["batching"]) == {"duplicate"} and set(df["draft_cost"]) == {"ngram-only"}
    s = df["verify_share"] + df["draft_share"] + df["overhead_share"]
    np.testing.assert_allclose(s, 1.0, rtol=1e-12)
    again = simulate(trace, cm, ["ngram"], ["fixed-1", "fixed-3", "oracle"], batch_sizes=(1, 8), progress=False)
    pd.testing.assert_frame_equal(df, again)
    # another seed changes the n-gram match draws of fixed-K, not the oracle
    other = simulate(trace, cm, ["ngram"], ["fixed-3", "oracle"], batch_sizes=(1,), seed=7, progress=False)
    base = df[(df.batch_size == 1) & df.policy.isin(["fixed-3", "oracle"])].reset_index(drop=True)
    assert (other.set_index(["dataset", "policy"])["speedup"] != base.set_index(["dataset", "policy"])["speedup"]
            ).groupby("policy").any().to_dict() == {"fixed-3": True, "oracle": False}


def test_sampling_follows_python_random_sample(cm):
    t = read_trace(FIX / "combined_sharegpt.jsonl")
    ids = t.requests["request_id"].tolist()
    chosen = random.Random(42).sample(ids, 5)
    sub = Trace(t.acc[t.acc["request_id"].isin(chosen)], t.requests[t.requests["request_id"].isin(chosen)])
    a = simulate(t, cm, "eagle", "oracle", batch_sizes=[1, 8], sample=5, progress=False)
    b = simulate(sub, cm, "eagle", "oracle", batch_sizes=[1, 8], progress=False)
    np.testing.assert_allclose(a["speedup"], b["speedup"], rtol=1e-12)


def test_recorded_draft_len_replaces_the_match_model(cm):
    L = 40
    acc = [1, 1, 4, 3, 2, 1] * 6 + [1, 1, 1, 1]
    dl = [0, 3, 3, 3, 3, 0] * 6 + [0, 0, 0, 3]
    t = Trace.from_arrays({"x": {"ngram": acc}}, prompt_lens={"x": 50}, dataset="my-code-edit", model="m",
                          k_max=3, draft_lens={"x": {"ngram": dl}})
    r = simulate(t, cm, "ngram", "fixed-3", progress=False).iloc[0]  # no match probability needed
    # by hand: p=1 reads acc[0]=1, dl 0 -> verify 1 token, no drafting ...
    p, S, draft, F = 1, 0, 0.0, 0.0
    while p < L:
        prop = min(3, dl[p - 1])
        f = cm.forward(50 + p, prop + 1)
        F += f
        draft += 0.005875 * f if prop > 0 else 0.0
        p += min(acc[p - 1], prop + 1)
        S += 1
    assert r.draft_share * r.sd_time_s == pytest.approx(draft, rel=1e-12)
    assert r.mean_tokens_per_step == pytest.approx((p - 1) / S)
    # without draft_len, an unknown dataset needs an explicit probability
    t2 = Trace.from_arrays({"x": {"ngram": acc}}, prompt_lens={"x": 50}, dataset="my-code-edit", model="m", k_max=3)
    with pytest.raises(SimulationError, match="ngram_match_prob"):
        simulate(t2, cm, "ngram", "fixed-3", progress=False)
    lo = simulate(t2, cm, "ngram", "fixed-3", progress=False, ngram_match_prob=0.0).iloc[0]
    hi = simulate(t2, cm, "ngram", "fixed-3", progress=False, ngram_match_prob={"MY_CODE-EDIT": 1.0}).iloc[0]
    assert lo.draft_share < hi.draft_share and lo.speedup > hi.speedup
    # dataset names match case-insensitively
    t3 = Trace.from_arrays({"x": {"ngram": acc}}, prompt_lens={"x": 50}, dataset="CNN_DailyMail", model="m", k_max=3)
    assert simulate(t3, cm, "ngram", "fixed-3", progress=False).iloc[0].speedup > 0


def test_clear_errors(cm):
    t = read_trace(FIX / "combined_gsm8k.jsonl")
    with pytest.raises(SimulationError, match="unknown policy"):
        simulate(t, cm, "ngram", "greedy", progress=False)
    with pytest.raises(SimulationError, match="K must be >= 1"):
        simulate(t, cm, "ngram", "fixed-0", progress=False)
    for near in ("fixed3", "fixed_3"):   # a near miss is named, never read as fixed-3
        with pytest.raises(SimulationError, match="did you mean fixed-3"):
            simulate(t, cm, "ngram", near, progress=False)
    with pytest.raises(SimulationError, match="unknown draft_cost"):
        simulate(t, cm, "ngram,eagle", "oracle-combine", "eagle-only", progress=False)
    with pytest.raises(SimulationError, match="takes one proposer"):
        simulate(t, cm, "ngram,eagle", "fixed-3", progress=False)
    with pytest.raises(SimulationError, match="takes one proposer"):
        simulate(t, cm, "ngram,eagle", "oracle", progress=False)
    with pytest.raises(SimulationError, match="batch sizes must be >= 1"):
        simulate(t, cm, "ngram", "oracle", batch_sizes=[1, 0], progress=False)
    with pytest.raises(SimulationError, match="unknown batching"):
        simulate(t, cm, "ngram", "oracle", batching="static", progress=False)
    with pytest.raises(TraceError, match="unknown proposer"):
        simulate(t, cm, "ngram,medusa", "oracle-combine", progress=False)
    with pytest.raises(SimulationError, match="sample=99"):
        simulate(t, cm, "ngram", "oracle", sample=99, progress=False)
    with pytest.raises(SimulationError, match="unknown option"):
        simulate(t, cm, "ngram", "oracle", progress=False, k_max=3)
    t2 = Trace.from_arrays({"x": {"mtp": [2, 2, 2]}}, prompt_lens={"x": 5}, dataset="d", model="m")
    with pytest.raises(SimulationError, match="no drafting model for proposer 'mtp'"):
        simulate(t2, cm, "mtp", "oracle", progress=False)
