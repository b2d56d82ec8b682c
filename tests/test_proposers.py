import pytest
import torch

from spec_repro.proposers import make_proposer
from spec_repro.proposers.early_exit import default_exit_layer, early_exit_view
from spec_repro.proposers.ngram import NgramProposer, ngram_lookup, ngram_lookup_all

from _tiny import prompts, tiny_llama


# ---- n-gram: vLLM prompt-lookup semantics --------------------------------------------------------------
def test_ngram_vllm_docstring_example():
    # vLLM's own example: [4,2,3] cannot match, [2,3] matches -> the 3 tokens that follow, fewer than k=4
    assert ngram_lookup([1, 2, 3, 4, 2, 3], k=4, min_n=2, max_n=3) == [4, 2, 3]


def test_ngram_longest_match_wins_over_later_shorter():
    ctx = [7, 1, 2, 3, 50, 51, 9, 2, 3, 60, 61, 1, 2, 3]
    # suffix [1,2,3] occurs at 1 (continuation 50, 51); the 2-gram [2,3] also occurs later (-> 60)
    assert ngram_lookup(ctx, k=2, min_n=2, max_n=3) == [50, 51]


def test_ngram_earliest_occurrence_of_longest():
    ctx = [5, 1, 2, 10, 1, 2, 20, 1, 2]
    assert ngram_lookup(ctx, k=1, min_n=2, max_n=2) == [10]


def test_ngram_max_n_caps_the_match_length():
    # the 4-gram [1,2,3,4] recurs at 0 (-> 8), but max_n=2 only looks at [3,4]: earliest is index 2 (-> 5)
    ctx = [1, 2, 3, 4, 8, 3, 4, 5, 0, 1, 2, 3, 4]
    assert ngram_lookup(ctx, k=1, min_n=2, max_n=2) == [8]
    ctx2 = [3, 4, 5, 9, 1, 2, 3, 4, 8, 1, 2, 3, 4]
    assert ngram_lookup(ctx2, k=1, min_n=2, max_n=2) == [5]
    assert ngram_lookup(ctx2, k=1, min_n=2, max_n=4) == [8]


def test_ngram_no_match_short_context_and_overlap():
    assert ngram_lookup([1, 2, 3, 4], k=3, min_n=2, max_n=3) == []
    assert ngram_lookup([1, 2], k=3, min_n=3, max_n=4) == []
    # a run of one token: the match may overlap the suffix; continuation cut at the context's end
    assert ngram_lookup([9, 9, 9, 9], k=5, min_n=2, max_n=3) == [9]
    assert ngram_lookup([1, 2, 3, 1, 2, 3, 1, 2], k=3, min_n=2, max_n=2) == [3, 1, 2]


def test_ngram_lookup_all_matches_single_lookups():
    toks = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 1, 4, 1, 5, 9, 2, 6, 5, 3, 1, 4]
    starts, lens = ngram_lookup_all(toks, first=4, k=5, min_n=2, max_n=4)
    for i in range(4, len(toks)):
        want = ngram_lookup(toks[: i + 1], k=5, min_n=2, max_n=4)
        s, n = starts[i - 4], lens[i - 4]
        assert (toks[s: s + n] if n else []) == want


def test_ngram_bad_settings():
    with pytest.raises(ValueError, match="min_n"):
        NgramProposer(min_n=4, max_n=2)


def test_make_proposer_errors():
    with pytest.raises(ValueError, match="unknown proposer 'medusa'"):
        make_proposer("medusa")
    with pytest.raises(ValueError, match="needs an EAGLE head"):
        make_proposer("eagle")
    with pytest.raises(ValueError, match="draft_model"):
        make_proposer("draft")
    with pytest.raises(ValueError, match="target"):
        make_proposer("early-exit")


# ---- early exit -------------------------------------------------------------------------------------------
def test_early_exit_view_is_first_layers_norm_head_with_shared_weights():
    m = tiny_llama(layers=4)
    v = early_exit_view(m, 2)
    assert v.model.layers[0] is m.model.layers[0] and len(v.model.layers) == 2 and len(m.model.layers) == 4
    assert v.lm_head.weight.data_ptr() == m.lm_head.weight.data_ptr()
    assert m.config.num_hidden_layers == 4
    ids = torch.tensor([prompts()[1]])
    with torch.no_grad():
        full = m(ids, output_hidden_states=True)
        want = m.lm_head(m.model.norm(full.hidden_states[2]))
        got = v(ids).logits
        assert torch.allclose(got, want, atol=1e-10)
        assert torch.allclose(m(ids).logits, full.logits)  # the target itself is untouched
    with pytest.raises(ValueError, match="1..4"):
        early_exit_view(m, 5)
    assert default_exit_layer(m) == 4 and default_exit_layer(tiny_llama(layers=30)) == 24


def test_draft_proposer_drafts_the_models_greedy_chain():
    from _tiny import hf_greedy

    d = tiny_llama(seed=3)
    p = make_proposer("draft", draft_model=d)
    ctxs = prompts()
    p.start(ctxs)
    drafts = p.propose(ctxs, 5)
    for c, dr in zip(ctxs, drafts):
        assert dr == hf_greedy(d, c, 5)
    # after a partial acceptance the drafter re-syncs to the new context
    ctxs2 = [c + dr[:2] + [7] for c, dr in zip(ctxs, drafts)]
    for c, dr in zip(ctxs2, p.propose(ctxs2, 4)):
        assert dr == hf_greedy(d, c, 4)
