"""A per_token drafter's cost per request of the steps where it drafts (``Drafter.c_step_req``): priced as the
formula says by the drafter, the duplicated and the continuous batch and the adaptive policies (each the same as a
drafter whose c_step holds c_step_req * B at that batch size), omitted from a preset where it is 0 (every committed
preset without it round-trips to its own file), refused on the other kinds. Traces here are SYNTHETIC (seeded)."""
import copy
import json
from dataclasses import replace

import numpy as np
import pytest

from spec_repro import adaptive as AD
from spec_repro.costmodel import PRESETS, CostModel, CostModelError, Drafter, load_cost_model
from spec_repro.simulate import _group_arrays, simulate
from spec_repro.traces import Trace

DR = Drafter("per_token", c_kv=1e-9, c_tok=2e-6, c0=3e-4, c_step=1e-3, c_step_req=4e-5, catch_up=1.0)


def test_a_drafting_step_costs_proposal_times_the_forward_plus_the_fixed_terms():
    kv, m = np.array([100.0, 2000.0, 5000.0, 0.0]), np.array([1.0, 8.0, 64.0, 32.0])
    prop = np.array([1, 3, 5, 0])
    want = prop * (1e-9 * kv + 2e-6 * m + 3e-4) + np.where(prop > 0, 1e-3 + 4e-5 * m, 0.0)
    np.testing.assert_allclose(DR.time(kv, prop + 1, 0.0, m, prop), want, rtol=1e-15)
    assert DR.time(0, 1, 0, 64, 0) == 0.0                           # nothing drafted: nothing charged
    assert float(DR.time(0, 3, 0, 64, 2)) == pytest.approx(2 * (2e-6 * 64 + 3e-4) + 1e-3 + 4e-5 * 64, rel=1e-15)
    # one draft forward (the catch-up): the per-step terms are not charged again
    assert float(DR.forward_time(10, 2, 0, 8)) == pytest.approx(1e-9 * 10 + 2e-6 * 8 + 3e-4, rel=1e-15)
    plain = replace(DR, c_step_req=0.0)
    np.testing.assert_array_equal(plain.time(kv, prop + 1, 0.0, m, prop),
                                  prop * (1e-9 * kv + 2e-6 * m + 3e-4) + np.where(prop > 0, 1e-3, 0.0))


def test_round_trip_summary_and_errors(tmp_path):
    m = CostModel("x", 0.0, 1e-5, 2e-3, 0.0, drafters={"eagle": DR, "ngram": Drafter("fraction", fraction=0.01)})
    d = m.to_dict()
    assert d["drafters"]["eagle"]["c_step_req"] == 4e-5 and "c_step_req" not in d["drafters"]["ngram"]
    back = load_cost_model(m.to_json(tmp_path / "m.json"))
    assert back.drafters["eagle"] == DR and back.to_dict() == d
    assert "0.001 + 4e-05*m + proposal * (" in m.summary()
    assert "c_step_req" not in replace(DR, c_step_req=0.0).to_dict()
    for bad, match in ((-1e-5, "negative"), (float("nan"), "finite"), (True, "must be a number")):
        with pytest.raises(CostModelError, match=match):
            replace(m, drafters={"eagle": replace(DR, c_step_req=bad)}).validate()
    with pytest.raises(CostModelError, match="only a per_token drafter"):
        replace(m, drafters={"ngram": Drafter("fraction", fraction=0.01, c_step_req=1e-5)}).validate()
    with pytest.raises(CostModelError, match=r"drafters.eagle.c_step_req must be a number"):
        CostModel.from_dict({**d, "drafters": {"eagle": {**d["drafters"]["eagle"], "c_step_req": "1e-5"}}})


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_committed_preset_round_trips_to_its_own_file(name):
    """A preset without the term gains no key (to_dict omits it at 0). (A hand-written preset may spell an
    optional term out at 0, which to_dict omits: compared without those.)"""
    raw = json.loads(PRESETS[name].read_text())
    m = load_cost_model(name)
    opt = ("c_step", "catch_up", "c_step_req")
    want = {**raw, "drafters": {k: {x: v for x, v in d.items() if not (x in opt and v == 0)}
                                for k, d in raw["drafters"].items()}}
    assert m.to_dict() == want
    for k, dr in m.drafters.items():
        assert dr.c_step_req == raw["drafters"][k].get("c_step_req", 0.0)


def _trace(seed=3, n=10, k_max=6, same=False):
    rng = np.random.default_rng(seed)
    arrays, prompts, dls = {}, {}, {}
    for r in range(n):
        rr = np.random.default_rng(seed) if same else rng
        L = 64 if same else int(rr.integers(20, 80))
        ng = rr.integers(1, k_max + 2, L)
        arrays[f"r{r}"] = {"ngram": ng.tolist(), "eagle": rr.integers(1, k_max + 2, L).tolist(),
                           "draft": rr.integers(1, k_max + 2, L).tolist()}
        prompts[f"r{r}"] = 200 if same else int(rr.integers(10, 400))
        dls[f"r{r}"] = {"ngram": np.maximum(ng - 1, rr.integers(0, k_max + 1, L)).tolist()}
    return Trace.from_arrays(arrays, prompt_lens=prompts, dataset="code-edit", model="m", k_max=k_max,
                             draft_lens=dls)


def _models(B):
    """The model with the per-request term, and the one whose c_step holds it at batch size B."""
    base = copy.deepcopy(load_cost_model("llama3.1-8b-h100"))
    base.drafters["draft"] = DR
    base.drafters["eagle"] = replace(DR, c_step_req=2e-5, c0=5e-4)
    folded = copy.deepcopy(base)
    for q in ("draft", "eagle"):
        d = base.drafters[q]
        folded.drafters[q] = replace(d, c_step=d.c_step + d.c_step_req * B, c_step_req=0.0)
    return base, folded


def _without(m):
    out = copy.deepcopy(m)
    out.drafters = {q: replace(d, c_step_req=0.0) for q, d in m.drafters.items()}
    return out


COLS = ["speedup", "sd_time_s", "draft_share", "mean_tokens_per_step"]


@pytest.mark.parametrize("B", [1, 8, 64])
def test_duplicate_batching_and_the_adaptive_policies_price_it_per_request(B):
    base, folded = _models(B)
    t = _trace()
    runs = [dict(proposers="draft", policy=["fixed-3", "fixed-6"]),
            dict(proposers="ngram,draft", policy=["oracle-combine"], draft_cost=["winner", "all"]),
            dict(proposers="ngram,eagle,draft", policy=["adaptive-rule", "adaptive-learned"])]
    for kw in runs:
        a, b = (simulate(t, m, batch_sizes=[B], progress=False, **kw) for m in (base, folded))
        np.testing.assert_allclose(a[COLS].to_numpy(float), b[COLS].to_numpy(float), rtol=1e-12)
    one = simulate(t, base, "draft", "fixed-3", batch_sizes=[B], progress=False)
    less = simulate(t, _without(base), "draft", "fixed-3", batch_sizes=[B], progress=False)
    assert (one["sd_time_s"] > less["sd_time_s"]).all()             # the term is charged, not dropped
    # the rule sees it: its choices at B are those of the folded model, not those of the model without it
    props = ["ngram", "eagle", "draft"]
    sub = t.select(proposers=props)
    reqs = _group_arrays(sub.acc, sub.requests, props, sub.requests["request_id"].tolist())
    sa, sb, sc = (AD.adaptive_steps(reqs, sub.requests, props, "adaptive-rule", B, m, 6)
                  for m in (base, folded, _without(base)))
    np.testing.assert_array_equal(sa.verified, sb.verified)
    np.testing.assert_array_equal(sa.inp, sb.inp)
    if B == 64:
        assert not (len(sa.inp) == len(sc.inp) and np.array_equal(sa.inp, sc.inp))


def test_mixed_batching_prices_it_per_decoding_request():
    """Identical requests, as many as the batch: every decode step holds all of them, so m = B throughout."""
    B = 8
    base, folded = _models(B)
    t = _trace(n=B, same=True)
    for props, pol in (("draft", ["fixed-3"]), ("ngram,eagle,draft", ["adaptive-rule"])):
        a, b = (simulate(t, m, props, pol, batch_sizes=[B], batching="mixed", progress=False) for m in (base, folded))
        np.testing.assert_allclose(a[COLS].to_numpy(float), b[COLS].to_numpy(float), rtol=1e-12)
