import pandas as pd
import pytest
import torch

from spec_repro.engines.torch import KVState, generate, measure_verify_cost
from spec_repro.proposers import make_proposer
from spec_repro.traces import STEP_COLUMNS, validate_steps

from _tiny import prompts, tiny_llama


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0)


def test_step_records_follow_the_schema(target):
    r = generate(target, prompts(), max_new_tokens=20, eos_token_ids=[], proposer=make_proposer("ngram", min_n=1),
                 k=3, model_name="tiny")
    steps = validate_steps(r.steps)
    assert list(steps.columns[: len(STEP_COLUMNS)]) == list(STEP_COLUMNS)
    assert (steps.engine == "torch").all() and (steps.method == "ngram").all() and (steps.k == 3).all()
    assert steps.phase.iloc[0] == "prefill" and (steps.phase.iloc[1:] == "decode").all()
    dec = steps[steps.phase == "decode"]
    assert (dec.t_verify > 0).all() and (dec.t_total >= dec.t_verify).all()
    # accounting: every token after the prefill's comes from a step; accepted counts add up
    assert r.events.produced.sum() == sum(len(o) - 1 for o in r.output_ids)
    assert dec.num_accepted_tokens.sum() == r.events.accepted.sum()
    assert dec.num_draft_tokens.sum() == r.events.draft_len.sum()
    assert all(len(o) == 20 for o in r.output_ids)


def test_plain_greedy_has_no_drafts(target):
    r = generate(target, prompts()[:1], max_new_tokens=8, eos_token_ids=[])
    dec = r.steps[r.steps.phase == "decode"]
    assert len(dec) == 7 and (dec.num_draft_tokens == 0).all() and (dec.method == "none").all()
    assert (dec.batched_tokens == 1).all()


def test_bad_input_errors(target):
    with pytest.raises(ValueError, match="at least one token"):
        generate(target, [[]], max_new_tokens=4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(target, [[1, 2]], max_new_tokens=0)
    with pytest.raises(ValueError, match="k must be"):
        generate(target, [[1, 2]], max_new_tokens=4, proposer=make_proposer("ngram"), k=0)


def test_kvstate_holes_and_compaction_keep_logits_exact(target):
    """Rows with rejected tokens (holes) and a compacted cache give the same logits as a fresh prefill."""
    ps = prompts()
    st = KVState(target)
    st.reset(3)
    st.extend(ps, logits="last")
    junk = [[1, 2, 3, 4, 5], [6], [7, 8]]
    for _ in range(6):  # append junk, then reject most of it: holes pile up until compaction
        keep = [len(t) for t in st.tokens]
        st.extend(junk, logits="all")
        st.truncate([keep[0] + 1, keep[1], keep[2] + 2])
    assert st.valid.shape[1] < max(len(t) for t in st.tokens) + 5 * 6  # compaction happened
    nxt = [[11, 12], [13], [14, 15, 16]]
    got = st.extend(nxt, logits="last")
    for r in range(3):
        full = torch.tensor([st.tokens[r]])
        with torch.no_grad():
            want = target(full).logits[0, -1]
        assert torch.allclose(got[r], want, atol=1e-8)


def test_measure_verify_cost_shape(target):
    df = measure_verify_cost(target, kv_len=32, ks=[0, 3], repeats=2, warmup=1, progress=False)
    assert isinstance(df, pd.DataFrame) and len(df) == 4
    assert set(df.n_tokens) == {1, 4} and (df.seconds > 0).all()


def test_out_of_memory_is_a_clear_error(target, monkeypatch):
    st = KVState(target)
    st.reset(1)

    def boom(*a, **kw):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(st, "decoder", boom)
    with pytest.raises(MemoryError, match="smaller batch size"):
        st.extend([[1, 2, 3]])
