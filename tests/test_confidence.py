"""The drafter's confidence in the traces: the profiler's value is the drafter's own softmax at the token it
drafts (checked by hand and against the engine's real chains), it survives parquet, older traces read without
it, and the committed SmolLM2 traces carry it."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from spec_repro.engines.torch import generate
from spec_repro.profiler import RequestProfile, chain_confidence, profiles_to_trace
from spec_repro.proposers import make_proposer
from spec_repro.proposers.eagle import EagleProposer, new_head, target_features
from spec_repro.proposers.early_exit import early_exit_view
from spec_repro.tracefiles import read_trace
from spec_repro.traces import (ACC_COLUMNS, CONF_COLUMN, Trace, TraceError, dequantize_confidence,
                               quantize_confidence)

from _tiny import profile_all, prompts, tiny_llama

N_NEW, K_MAX = 30, 6
STEP = 0.5 / 254 + 1e-6          # the stored 8-bit code's largest error
ROOT = Path(__file__).resolve().parents[1]
COMMITTED = sorted((ROOT / "data" / "traces").glob("*__*.parquet"))   # the Qwen and SmolLM2 traces
OLD = ROOT / "tests" / "fixtures" / "old_trace" / "smollm2-135m__mt-bench.parquet"
MODEL_DRAFTERS = ("draft", "early-exit", "eagle")


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0)


@pytest.fixture(scope="module")
def drafter():
    return tiny_llama(seed=7, layers=2)


@pytest.fixture(scope="module")
def head(target):
    return new_head(target, "eagle", seed=1).to(torch.float64)


def _make(name, target, drafter, head):
    if name == "eagle":
        return EagleProposer(head)
    return make_proposer(name, target, min_n=1, max_n=3, layers=3, draft_model=drafter)


@pytest.fixture(scope="module")
def profiles(target, drafter, head):
    props = {n: _make(n, target, drafter, head) for n in ("ngram",) + MODEL_DRAFTERS}
    return profile_all(target, props, k_max=K_MAX, max_new_tokens=N_NEW)


@pytest.fixture(scope="module")
def trace(profiles):
    return profiles_to_trace(profiles, model="tiny", k_max=K_MAX)


def _top1(logits):
    """The softmax by hand: exp of the logits over their sum, at the largest one."""
    e = torch.exp(logits - logits.max())
    return float(e.max() / e.sum())


@torch.no_grad()
def _hand_conf(name, target, drafter, head, prompt, out, q, d):
    """Draft d of the chain after o_q, teacher-forced (module doc of spec_repro.profiler), computed from scratch:
    one plain forward of the drafter over prompt + o_0..o_{q+d-1}, its last logits."""
    ids = torch.tensor([list(prompt) + list(out[: q + d])])
    if name == "eagle":
        assert d == 1    # EAGLE's first draft: the head over the teacher-forced pairs 0..P+q-1
        feats = target_features(target, ids[:, :-1], "final")
        h = head.chain(ids[:, 1:], feats, 1)[0][0, -1]
        return _top1(head.logits(h))
    model = drafter if name == "draft" else early_exit_view(target, 3)
    return _top1(model(input_ids=ids).logits[0, -1])


@pytest.mark.parametrize("name", MODEL_DRAFTERS)
def test_confidence_is_the_drafters_softmax_by_hand(target, drafter, head, profiles, trace, name):
    prof = profiles[1]
    prompt, out = prof.prompt_token_ids, prof.output_token_ids
    L = len(out)
    conf = prof.conf[name]
    assert conf.shape == (L, K_MAX) and conf.dtype == np.float32
    stored = trace.confidence(name)[("unknown", "tiny", prof.request_id)]
    for q in (0, 7, L - 3):
        for d in ((1,) if name == "eagle" else range(1, K_MAX + 1)):
            if q + d > L - 1:                              # no o_{q+d} to compare this draft with
                assert np.isnan(conf[q, d - 1]) and np.isnan(stored[q, d - 1])
                continue
            p = _hand_conf(name, target, drafter, head, prompt, out, q, d)
            assert 0 < p <= 1
            assert conf[q, d - 1] == pytest.approx(p, rel=1e-6), (name, q, d)
            assert abs(stored[q, d - 1] - p) <= STEP, (name, q, d)
    assert np.isnan(conf[L - 1]).all()                     # the last position drafts past the output


def _spy(prop):
    """Record, per propose() call, the logits of each of its k drafts (what the engine's proposer drafts from)."""
    st, calls, cur = prop.state, [], []
    fwd, propose = st.forward, prop.propose

    def forward(*a, **k):
        res = fwd(*a, **k)
        cur.append(res.detach().clone())
        return res

    def spied(contexts, k):
        cur.clear()
        drafts = propose(contexts, k)
        calls.append(list(cur[-k:]))
        return drafts

    st.forward, prop.propose = forward, spied
    return calls


@pytest.mark.parametrize("name", MODEL_DRAFTERS)
def test_confidence_equals_the_engines_chain_where_exact(target, drafter, head, profiles, name):
    """Up to the first rejected draft (d <= acc_len) the teacher-forced context is the real chain's: the
    engine's incremental drafter gives the same probabilities to the same tokens."""
    k = K_MAX
    prop = _make(name, target, drafter, head)
    calls = _spy(prop)
    r = generate(target, prompts(), max_new_tokens=N_NEW, eos_token_ids=[], proposer=prop, k=k)
    assert r.output_ids == [p.output_token_ids for p in profiles]
    n_checked = 0
    for step, ev in r.events.groupby("step"):
        for row, e in enumerate(ev.itertuples()):
            prof = profiles[e.request]
            L = len(prof.output_token_ids)
            for d in range(1, min(e.accepted + 1, k, L - 1 - e.position) + 1):
                p = _top1(calls[step - 1][d - 1][row])
                assert prof.conf[name][e.position, d - 1] == pytest.approx(p, rel=1e-6), (name, e, d)
                n_checked += 1
    assert n_checked > 40


def test_chain_confidence_by_hand():
    p = [0.9, 0.8, 0.7, 0.6]                 # a drafter's top-1 probability after o_0 .. o_3 (L = 5)
    c = chain_confidence(p, 5, 3)
    np.testing.assert_allclose(c[0], [0.9, 0.8, 0.7])
    np.testing.assert_allclose(c[2], [0.7, 0.6, np.nan])
    assert np.isnan(c[4]).all() and c.shape == (5, 3)


def test_quantization():
    p = np.array([0.0, 1 / 254, 0.5, 0.999, 1.0, np.nan], np.float32)
    q = quantize_confidence(p)
    assert q.dtype == np.uint8 and q.tolist() == [0, 1, 127, 254, 254, 255]
    back = dequantize_confidence(q)
    assert np.isnan(back[-1]) and np.abs(back[:-1] - p[:-1]).max() <= STEP
    with pytest.raises(TraceError, match=r"\[0, 1\]"):
        quantize_confidence([1.5])


def test_trace_round_trip(trace, tmp_path):
    assert trace.confidence_proposers == sorted(MODEL_DRAFTERS)
    assert list(trace.acc.columns) == list(ACC_COLUMNS) + [CONF_COLUMN]
    f = trace.to_parquet(tmp_path / "tiny__x.parquet")
    assert str(pq.read_schema(f).field(CONF_COLUMN).type) == "list<element: uint8>"
    back = read_trace(f)
    assert back.confidence_proposers == sorted(MODEL_DRAFTERS)
    for name in ("ngram",) + MODEL_DRAFTERS:
        a, b = trace.confidence(name), back.confidence(name)
        assert a.keys() == b.keys() == trace.arrays(name).keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
            assert a[key].shape == (len(trace.arrays(name)[key]), K_MAX)
            assert np.isnan(a[key]).all() == (name == "ngram")
    back.to_parquet(tmp_path / "again.parquet")                    # byte for byte
    assert (tmp_path / "again.parquet").read_bytes() == f.read_bytes()
    plain = pd.read_parquet(f)                                      # a reader that knows nothing of it: lists
    assert plain[CONF_COLUMN].notna().sum() == len(back.acc) - (back.acc.proposer == "ngram").sum()
    # sub-traces and concatenations keep it, row by row
    sub = back.select(proposers=["eagle", "ngram"])
    np.testing.assert_array_equal(np.concatenate(list(sub.confidence("eagle").values())),
                                  np.concatenate(list(back.confidence("eagle").values())))


def test_partial_file_line_keeps_confidence(profiles):
    p = profiles[0]
    again = RequestProfile.from_json(json.loads(json.dumps(p.to_json())))
    for name in MODEL_DRAFTERS:
        np.testing.assert_array_equal(again.conf[name], dequantize_confidence(quantize_confidence(p.conf[name])))
    assert "ngram" not in again.conf
    old = {k: v for k, v in p.to_json().items() if k != "conf"}      # a line written before confidence existed
    assert RequestProfile.from_json(old).conf == {}


def test_old_traces_read_without_confidence(trace, tmp_path):
    old = read_trace(OLD)
    assert list(old.acc.columns) == list(ACC_COLUMNS)
    assert old.confidence_proposers == []
    c = old.confidence("eagle")
    assert len(c) == 2 and all(v.shape == (256, 16) and np.isnan(v).all() for v in c.values())
    old.to_parquet(tmp_path / "old.parquet")
    assert CONF_COLUMN not in pq.read_schema(tmp_path / "old.parquet").names
    # a trace with it and one without: one table, the older rows without a value
    both = Trace.concat([trace, old])
    assert both.confidence_proposers == sorted(MODEL_DRAFTERS)
    assert both.acc[CONF_COLUMN].isna().sum() == len(old.acc) + (trace.acc.proposer == "ngram").sum()
    back = read_trace(both.to_parquet(tmp_path / "both.parquet"))
    assert np.isnan(back.confidence("eagle")[("mt-bench", "smollm2-135m", "mt-bench/137")]).all()


def test_bad_confidence_is_refused(trace):
    acc = trace.acc.copy()
    acc[CONF_COLUMN] = [[0.5] * (K_MAX - 1)] * len(acc)
    with pytest.raises(TraceError, match="expected k_max"):
        Trace(acc, trace.requests)
    acc[CONF_COLUMN] = [[2.0] * K_MAX] * len(acc)
    with pytest.raises(TraceError, match=r"\[0, 1\]"):
        Trace(acc, trace.requests)
    acc[CONF_COLUMN] = [None] * (len(acc) - 1) + [[0.25] * K_MAX]   # plain lists of probabilities: quantized
    t = Trace(acc, trace.requests)
    assert list(t.acc[CONF_COLUMN].iloc[-1]) == [64] * K_MAX


@pytest.mark.skipif(not COMMITTED, reason="no committed traces")
@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.stem)
def test_committed_traces_carry_confidence(path):
    """Every model drafter of every committed trace (the Qwen traces: the draft model, early exit, EAGLE; SmolLM2's:
    early exit, EAGLE) carries its confidence; n-gram has none."""
    t = read_trace(path)
    drafters = sorted(set(t.proposers) & set(MODEL_DRAFTERS))
    assert len(drafters) >= 2 and t.confidence_proposers == drafters
    k = int(t.acc.k_max.iloc[0])
    for name in t.confidence_proposers:
        conf, acc = t.confidence(name), t.arrays(name)
        first = np.concatenate([c[:, 0] for c in conf.values()])
        a = np.concatenate([acc[key] for key in conf])
        for key, c in conf.items():
            L = len(acc[key])
            past = np.arange(L)[:, None] + np.arange(1, k + 1)[None, :] > L - 1
            assert c.shape == (L, k) and (np.isnan(c) == past).all(), key
            assert ((c[~past] >= 0) & (c[~past] <= 1)).all()
        # the drafter is surer of its first draft where the target accepted it
        assert np.nanmean(first[a > 1]) > np.nanmean(first[a == 1]) + 0.1, name
    assert np.isnan(np.concatenate(list(t.confidence("ngram").values()))).all()
    entry = json.loads((path.parent / "MANIFEST.json").read_text())[path.name]
    assert entry["confidence"]["proposers"] == drafters


def test_checked_read_keeps_confidence(trace, tmp_path):
    # the reader of verified copies (published.read_published_cached) skips the value checks, not the column
    p = trace.to_parquet(tmp_path / "t.parquet")
    fast = Trace.from_parquet(p, checked=True)
    assert fast.confidence_proposers == trace.confidence_proposers == sorted(MODEL_DRAFTERS)
    a, b = read_trace(p).acc, fast.acc
    assert b[CONF_COLUMN].isna().tolist() == a[CONF_COLUMN].isna().tolist()
    assert [list(x) for x in b[CONF_COLUMN].dropna()] == [list(x) for x in a[CONF_COLUMN].dropna()]
