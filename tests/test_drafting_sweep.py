"""EAGLE's drafting time per k on the H200 (data/gpu/v1-runner/draft-k, 2026-12-02) and its entry into the
H200 presets as d0 + k * d1 (``costmodel.fit_drafting`` / ``enter_drafting``)."""
import dataclasses

import numpy as np
import pandas as pd
import pytest

from spec_repro import costmodel as C
from spec_repro import measured
from spec_repro.paths import v1_runner_dir

SWEEP = v1_runner_dir("draft-k") / "steps.parquet"


def test_the_sweep_covers_every_k_and_batch_size_on_both_targets():
    st = C.sweep_steps(SWEEP)
    got = st.groupby("model")[["k", "batch_size"]].agg(lambda x: sorted(set(x))).to_dict("index")
    assert set(got) == set(C.SWEEP_TARGETS)
    for m in got.values():
        assert m["k"] == [1, 3, 5, 8, 12] and m["batch_size"] == [1, 8, 32, 64]
    # every step drafted k tokens per request (the padded drafter batch): the sweep times k, not acceptance
    assert np.allclose(st["num_draft_tokens"] / st["num_reqs"], st["k"])


def test_drafting_is_per_token_with_no_fixed_part_and_above_the_hbm_floor():
    runs, fits, src = measured.drafting_sweep()
    assert "H200" in src and len(runs) == 80
    llama = fits[fits.model == "llama31-8b"].set_index("batch_size")
    # one head forward per drafted token, nothing fixed: d0 is under 3% of a single token's d1
    assert (llama.d0_ms < 0.03 * llama.d1_ms).all()
    # a head forward cannot beat its weights' streaming time; on Llama dims it comes within 2x of it at bs 1
    assert (fits.floor_share < 1).all() and 0.5 < llama.loc[1, "floor_share"] < 1
    assert llama.loc[1, "r2"] > 0.9
    # measured, not fitted: at bs 1 twelve tokens cost 11-13 times one (k = 1: ~0.49 ms, k = 12: ~5.7 ms)
    r = runs[(runs.model == "llama31-8b") & (runs.batch_size == 1)].groupby("k")["draft_ms"].median()
    assert 11 < r[12] / r[1] < 13
    qwen = fits[fits.model == "qwen2.5-coder-1.5b"]
    assert (qwen.d0_ms < 0.05).all() and (qwen.d1_ms > qwen.floor_ms).all()


def test_the_h200_presets_hold_the_sweeps_fit():
    assert C.main(["fit-drafting", "--check"]) == 0
    llama = C.load_cost_model("llama3.1-8b-h200")
    dr, rec = C.fit_drafting(SWEEP, "llama31-8b")
    # the refit to its last bits is this machine's BLAS's (same_fit)
    assert C.same_fit(dataclasses.asdict(llama.drafters["eagle"]), dataclasses.asdict(dr))
    assert llama.fit["drafting"]["k"] == [1, 3, 5, 8, 12]
    assert llama.fit["drafting"]["replaced"]["c0"] == pytest.approx(0.0004964345498216518)   # the k = 3-only fit
    # priced per drafted token: a 12-token proposal costs ~12 one-token ones at bs 1 (the study's linear fit: ~1)
    one, twelve = (llama.drafters["eagle"].time(600.0, 1, 0.0, 1, np.array([k], float))[0] for k in (1, 12))
    assert 11 < twelve / one < 12.5
    qwen = C.load_cost_model("qwen2.5-coder-1.5b-h200")
    d0 = qwen.fit["drafting"]["sweep_drafter"].get("c_step", 0.0)
    assert qwen.fit["drafting"]["d0_s"] == d0 and qwen.drafters["eagle"].c_step >= d0


def _steps(ks, d0, d1, n=12):
    rows = []
    for k in ks:
        for i in range(n):
            m = 1 + 3 * (i % 2)      # two batch sizes: d1 = c0 + c_tok * m is separable, c_tok = 1e-5
            rows.append({"run_id": f"r{k}", "engine": "vllm", "model": "m", "method": "eagle", "k": k, "batch_size": m,
                         "step": i, "num_reqs": m, "batched_tokens": m * (k + 1), "kv_tokens": 1000 * (i % 3),
                         "t_draft": d0 + k * (d1 + 1e-5 * m),
                         "t_verify": 1e-3 + 1e-6 * i, "t_reject": 0.0, "t_other": 1e-4, "t_total": 0.0,
                         "num_draft_tokens": k * m, "num_accepted_tokens": 0})
    df = pd.DataFrame(rows)
    return df.assign(t_total=df[["t_draft", "t_verify", "t_reject", "t_other"]].sum(axis=1))


def test_fit_separates_d0_over_several_k_and_takes_it_given_at_one_k():
    several = C.fit(_steps([1, 4, 9], 3e-4, 5e-4), kinds={"eagle": "per_token"}, ragged=False).model.drafters["eagle"]
    assert several.c_step == pytest.approx(3e-4, rel=1e-6) and several.c0 == pytest.approx(5e-4, rel=1e-6)
    one = _steps([5], 3e-4, 5e-4)
    assert C.fit(one, kinds={"eagle": "per_token"}, ragged=False).model.drafters["eagle"].c_step == 0   # not separable
    given = C.fit(one, kinds={"eagle": "per_token"}, ragged=False, d0={"eagle": 3e-4}).model.drafters["eagle"]
    assert given.c_step == pytest.approx(3e-4) and given.c0 == pytest.approx(5e-4, rel=1e-6)
    with pytest.raises(C.CostModelError, match="several k"):
        C.fit(_steps([1, 4], 3e-4, 5e-4), kinds={"eagle": "per_token"}, ragged=False, d0={"eagle": 1e-4})


def test_same_fit_takes_a_blas_last_bit_but_not_a_different_fit():
    """A refit on another machine's BLAS differs in the last bits of its least-squares coefficients (the Llama H200
    preset's c_kv: ...114e-09 against ...126e-09); ``same_fit`` calls that the same fit and anything more a different
    one: a number off at 1e-7, another key, another string, an int for a float."""
    a = {"c_kv": 2.2468183537224114e-09, "kind": "per_token", "n": 5080, "d1": [0.46, 0.485]}
    assert C.same_fit(a, {**a, "c_kv": 2.2468183537224126e-09})
    assert not C.same_fit(a, {**a, "c_kv": 2.2468183537224114e-09 * (1 + 1e-7)})
    assert not C.same_fit(a, {**a, "extra": 1}) and not C.same_fit(a, {**a, "kind": "per_step"})
    assert not C.same_fit(a, {**a, "d1": [0.46]}) and not C.same_fit(a, {**a, "n": True})
    assert C.same_fit(a, {**a, "n": 5080.0}) and not C.same_fit(a, {**a, "n": 5081})
