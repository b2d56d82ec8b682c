"""The profiler's per-position acceptance equals what real engine runs record, for every proposer and k."""
import json

import numpy as np
import pytest

from spec_repro.engines.torch import generate
from spec_repro.profiler import chain_acceptance, ngram_acceptance, profile_requests, profiles_to_trace
from spec_repro.proposers import make_proposer
from spec_repro.proposers.early_exit import early_exit_view
from spec_repro.published import read_published_jsonl
from spec_repro.tracefiles import read_trace

from _tiny import profile_all, prompts, tiny_llama

N_NEW, K_MAX = 40, 8


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0)


@pytest.fixture(scope="module")
def drafter():
    return tiny_llama(seed=7, layers=2)


def _make(name, target, drafter):
    return make_proposer(name, target, min_n=1, max_n=3, layers=3, draft_model=drafter)


@pytest.fixture(scope="module")
def profiles(target, drafter):
    props = {n: _make(n, target, drafter) for n in ("ngram", "early-exit", "draft")}
    return profile_all(target, props, k_max=K_MAX, max_new_tokens=N_NEW)


def test_chain_acceptance_by_hand():
    out = [10, 11, 12, 13, 14, 15]
    g = [11, 12, 99, 14, 15]          # drafter's argmax after o_0..o_4
    assert chain_acceptance(g, out, k_max=8).tolist() == [3, 2, 1, 3, 2, 1]
    assert chain_acceptance(g, out, k_max=1).tolist() == [2, 2, 1, 2, 2, 1]


def test_ngram_acceptance_by_hand():
    prompt = [1, 2, 3, 4, 5, 1, 2]
    out = [3, 4, 9]
    acc, dl = ngram_acceptance(prompt, out, k_max=4, min_n=2, max_n=3)
    # after [..,1,2,3]: match [1,2,3] at 0 -> draft [4,5,1,2]; true next 4, 9 -> 1 accepted
    assert dl.tolist()[0] == 4 and acc.tolist() == [2, 1, 1]


@pytest.mark.parametrize("name", ["ngram", "early-exit", "draft"])
@pytest.mark.parametrize("k", [2, 5, K_MAX])
def test_profiler_predicts_engine_acceptance(target, drafter, profiles, name, k):
    r = generate(target, prompts(), max_new_tokens=N_NEW, eos_token_ids=[], proposer=_make(name, target, drafter),
                 k=k)
    assert r.output_ids == [p.output_token_ids for p in profiles]
    assert len(r.events) > 10
    for e in r.events.itertuples():
        prof = profiles[e.request]
        L = len(prof.output_token_ids)
        assert min(e.accepted, L - 1 - e.position) == min(prof.acc[name][e.position] - 1, k), (name, e)
        if name == "ngram":
            assert e.draft_len == min(prof.draft_len["ngram"][e.position], k)
    if name == "ngram":
        assert r.events.accepted.sum() > 0


def test_early_exit_readout_equals_teacher_forced_pass(target, profiles):
    from spec_repro.profiler import model_argmax_after_outputs

    view = early_exit_view(target, 3)
    for p in profiles:
        g = model_argmax_after_outputs(view, p.prompt_token_ids, p.output_token_ids)
        assert chain_acceptance(g, p.output_token_ids, K_MAX).tolist() == p.acc["early-exit"]


def test_trace_round_trip(profiles, tmp_path):
    t = profiles_to_trace(profiles, model="tiny", k_max=K_MAX, meta={"note": "synthetic tiny model"})
    assert t.proposers == ["draft", "early-exit", "ngram"] and len(t.requests) == 3
    assert (t.acc.acc_len <= K_MAX + 1).all()
    path = t.to_parquet(tmp_path / "tiny__x.parquet")
    back = read_trace(path)
    for key, arr in t.arrays("ngram").items():
        np.testing.assert_array_equal(back.arrays("ngram")[key], arr)
    ng = back.acc[back.acc.proposer == "ngram"]
    assert ng.draft_len.notna().all() and (ng.draft_len <= K_MAX).all()
    assert list(back.requests.output_token_ids.iloc[0]) == profiles[0].output_token_ids
    pub = back.select(proposers=["ngram", "early-exit"]).to_published_jsonl(tmp_path / "combined_x.jsonl")
    rec = json.loads(pub.read_text().splitlines()[0])
    assert set(rec) >= {"id", "prompt_token_ids", "generated_token_ids", "acc_ngram", "acc_early-exit"}
    again = {rid: a for (_, _, rid), a in read_published_jsonl(pub, model="tiny").arrays("early-exit").items()}
    for (_, _, rid), arr in back.arrays("early-exit").items():
        np.testing.assert_array_equal(again[rid], arr)


def test_profiler_rejects_bad_settings(target):
    with pytest.raises(ValueError, match="k_max"):
        next(profile_requests(target, prompts(), {"ngram": make_proposer("ngram")}, k_max=0))
