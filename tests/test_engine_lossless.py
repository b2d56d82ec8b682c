"""Lossless: greedy chain speculative decoding returns exactly plain greedy decoding's tokens."""
import pytest
import torch

from spec_repro.engines.torch import generate
from spec_repro.proposers import make_proposer

from _tiny import hf_greedy, prompts, tiny_llama

N_NEW = 40
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="module", params=DEVICES)
def target(request):
    return tiny_llama(seed=0).to(request.param)


@pytest.fixture(scope="module")
def reference(target):
    return [hf_greedy(target, p, N_NEW) for p in prompts()]


def _proposer(name, target):
    if name == "draft":
        return make_proposer("draft", draft_model=tiny_llama(seed=5, layers=2).to(target.device))
    if name == "draft-self":  # a drafter equal to the target: every draft accepted
        return make_proposer("draft", draft_model=target)
    return make_proposer(name, target, min_n=1, max_n=3, layers=2)


@pytest.mark.parametrize("batch", [1, 3])
def test_plain_greedy_lossless_vs_transformers_generate(target, reference, batch):
    r = generate(target, prompts()[:batch], max_new_tokens=N_NEW, eos_token_ids=[])
    assert r.output_ids == reference[:batch]


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("name", ["ngram", "draft", "early-exit", "draft-self"])
@pytest.mark.parametrize("k", [1, 4])
def test_sd_lossless(target, reference, name, batch, k):
    r = generate(target, prompts()[:batch], max_new_tokens=N_NEW, eos_token_ids=[], proposer=_proposer(name, target),
                 k=k)
    assert r.output_ids == reference[:batch]
    if name == "draft-self":  # nothing rejected: every step accepts all k drafts (until max tokens)
        assert (r.events.accepted == k).all()
    if batch == 3 and name in ("ngram", "early-exit"):  # ragged: rows accept different counts in one step
        per_step = r.events.groupby("step").accepted.nunique()
        assert (per_step > 1).any()


def test_sd_lossless_with_eos_and_ragged_finish(target, reference):
    # stop at a token that occurs at different output positions per request: rows leave the batch mid-run
    eos = reference[1][6]
    want = []
    for ref in reference:
        cut = ref.index(eos) + 1 if eos in ref else len(ref)
        want.append(ref[:cut])
    for prop in (None, _proposer("ngram", target), _proposer("early-exit", target)):
        r = generate(target, prompts(), max_new_tokens=N_NEW, eos_token_ids=[eos], proposer=prop, k=3)
        assert r.output_ids == want


@pytest.mark.slow
def test_sd_lossless_smollm2():
    from spec_repro import models

    model, tok = models.load("smollm2-135m", quiet=True)
    text = ("Rename the variable `x` to `total` and return the code:\n\n"
            "def f(values):\n    x = 0\n    for v in values:\n        x += v\n    return x\n")
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if not isinstance(ids, list) else ids)
    ps = [ids, ids[:-12] + ids[-6:], tok.encode("def fibonacci(n):")]
    base = generate(model, ps, max_new_tokens=32)
    ref0 = model.generate(torch.tensor([ps[0]]), attention_mask=torch.ones(1, len(ps[0]), dtype=torch.long),
                          max_new_tokens=32, do_sample=False)[0, len(ps[0]):].tolist()
    assert base.output_ids[0] == ref0
    runs = {}
    for name in ("ngram", "early-exit"):
        runs[name] = r = generate(model, ps, max_new_tokens=32, proposer=make_proposer(name, model), k=4)
        assert r.output_ids == base.output_ids, name
    # n-gram needs no target: built without one it is the same proposer, so the run above is its run (greedy
    # decoding is deterministic), and n-gram drafts were accepted in it
    alone = make_proposer("ngram")
    assert type(alone) is type(make_proposer("ngram", model)) and vars(alone) == vars(make_proposer("ngram", model))
    assert runs["ngram"].events.accepted.sum() > 0
