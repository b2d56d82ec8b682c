"""The live hybrid's engine-step pieces (hybrid.LiveHybrid, valid_tokens, pack/unpack, trim_scheduled) on the
committed traces' real token ids, driven as vLLM's V1 runner would drive them: continuous batching (requests
join while others decode, a joining request spends steps in prefill chunks whose samples are discarded), the
sampler's [B, k+1] output with -1 after the first rejection, and the drafts handed back in either of the runner's
forms (lists on the synchronous path; a [B, k] array + valid counts under async scheduling, the scheduled
slots trimmed to those counts). Nothing here imports vLLM; what only a live engine can show is listed in the
plugin's docstring (the GPU session's checks)."""
import copy
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from test_hybrid import eagle_proposal, qwen, smol  # noqa: F401  (the committed traces, as module fixtures)

from spec_repro.costmodel import Drafter, load_cost_model
from spec_repro.engines.vllm import hybrid as H
from spec_repro.proposers.ngram import ngram_lookup


def engine(policy, reqs, toks, rows, *, async_form, max_batch=8, prefill_steps=2, seed=0):
    """Run requests ``rows`` through a LiveHybrid as the runner does, verifying greedily against each request's
    committed output. Requests join when a slot is free and spend ``prefill_steps`` steps in prefill (sampled
    garbage, discarded; the last chunk samples the first output token). Each step also runs a reference: fresh
    per-request states fed directly to ``hybrid.select`` with the context from the committed ids (prompt +
    output[:p]) and the package's n-gram lookup. Returns (emitted per request, steps [(req, source, k)],
    reference steps)."""
    rng = np.random.default_rng(seed)
    kmax = policy.kmax
    ref_pol = H.HybridPolicy(policy.name, kmax, getattr(policy, "cost_model", None))
    live = H.LiveHybrid(policy)
    L = {r: int(reqs.L[r]) for r in rows}
    ids = {r: f"req-{r}" for r in rows}
    waiting, running, prefill = list(rows), [], {}
    p, emitted, ref_states = {}, {}, {}
    drafts = {}         # request -> draft scheduled for this step
    got, want = [], []
    while waiting or running:
        while waiting and len(running) < max_batch:
            r = waiting.pop(0)
            running.append(r)
            prefill[r] = prefill_steps
        # the step: the target verifies each decoding request's scheduled draft; prefill chunks sample garbage
        B = len(running)
        sampled = np.full((B, kmax + 1), -1, np.int64)
        discard = []
        for i, r in enumerate(running):
            if prefill.get(r, 0) > 1:
                prefill[r] -= 1
                sampled[i, 0] = rng.integers(0, 1000)
                discard.append(i)
                continue
            if r in prefill:             # the last prefill chunk samples the first output token
                del prefill[r]
                p[r], emitted[r] = 1, [int(toks[r][1][0])]
                ref_states[r] = ref_pol.new_state(len(toks[r][0]))
                sampled[i, 0] = toks[r][1][0]
                continue
            d, target = drafts.pop(r), toks[r][1][p[r]:]
            m = 0
            while m < len(d) and m < len(target) and d[m] == target[m]:
                m += 1
            new = d[:m] + target[m:m + 1].tolist()
            sampled[i, :len(new)] = new
            emitted[r] += new
            p[r] += len(new)
        # the hybrid's part of the step
        req_ids = [ids[r] for r in running]
        new = H.valid_tokens(sampled, discard, vocab_size=10 ** 9)
        need = live.begin(req_ids, new, lambda rid: toks[int(rid[4:])][0].tolist())
        eg = np.full((B, kmax), -7, np.int64)      # EAGLE drafts every row (masked rows hold anything)
        dec = [i for i, r in enumerate(running) if i not in discard]
        for i in dec:
            r = running[i]
            eg[i] = eagle_proposal(toks[r][1], p[r] - 1, reqs.acc[1, reqs.off[r] + p[r] - 1], kmax)
        choices = live.finish(eg if any(need) else None)
        # the reference: the same decisions from the committed ids alone
        ctx = [np.concatenate([toks[running[i]][0], toks[running[i]][1][:p[running[i]]]]) for i in dec]
        ng = [ngram_lookup(c, kmax) for c in ctx]
        ref = H.select(ref_pol, [ref_states[running[i]] for i in dec], ctx, ng, eg[dec])
        assert [choices[i] for i in dec] == ref
        assert all(choices[i] == H.Choice([], "") and not need[i] for i in discard)
        # hand the drafts to the "scheduler" in the runner's form
        lists = [c.draft for c in choices]
        if async_form:
            arr, counts = H.pack(lists, kmax)
            nsched = {rid: 1 + kmax for rid in req_ids}          # k placeholder slots each
            spec = {rid: [-1] * kmax for rid in req_ids}
            removed, before = H.trim_scheduled(nsched, spec, dict(zip(req_ids, counts.tolist())))
            assert removed == B * kmax - int(counts.sum()) and before == {rid: kmax for rid in req_ids}
            assert all(nsched[rid] == 1 + len(spec.get(rid, [])) for rid in req_ids)
            back = H.unpack(arr, [len(spec.get(rid, [])) for rid in req_ids])
        else:
            back = lists
        assert back == lists
        for i, r in enumerate(running):
            if i in dec:
                drafts[r] = back[i][: max(0, L[r] - p[r])]     # the scheduler cuts at the output's end
                got.append((r, choices[i].source, len(choices[i].draft)))
                want.append((r, ref[dec.index(i)].source, len(ref[dec.index(i)].draft)))
        done = [r for r in running if r not in prefill and p.get(r, 0) >= L[r]]
        live.forget([ids[r] for r in done])
        running = [r for r in running if r not in done]
    assert not live.states and not live.hist        # every finished request forgotten
    return emitted, got, want


@pytest.mark.parametrize("name", H.POLICIES)
@pytest.mark.parametrize("async_form", [False, True])
def test_live_steps_are_lossless_and_agree_with_select(name, async_form, smol, request):
    """Through the engine-step pieces, in either draft form, every request emits exactly its committed output
    and every decision is the one hybrid.select takes on the committed ids; both proposers are used."""
    reqs, _requests, toks = smol
    cm = request.getfixturevalue("cm") if name == "adaptive-rule" else None
    rows = list(range(len(reqs.L)))
    emitted, got, want = engine(H.HybridPolicy(name, 8, cm), reqs, toks, rows, async_form=async_form)
    for r in rows:
        L = int(reqs.L[r])
        assert emitted[r][:L] == toks[r][1][:L].tolist(), r
    assert got == want
    assert {"ngram", "eagle"} <= {s for _r, s, _k in got}


def test_live_on_qwen_with_a_wide_batch(qwen, cm):
    """The Qwen trace (the GPU run's model), 32 requests at a time, async form, the simulator's policy."""
    reqs, _requests, toks = qwen
    rows = list(range(0, len(reqs.L), 2))
    emitted, got, want = engine(H.HybridPolicy("adaptive-rule", 8, cm), reqs, toks, rows, async_form=True,
                                max_batch=32, prefill_steps=3, seed=1)
    for r in rows:
        assert emitted[r][:int(reqs.L[r])] == toks[r][1][:int(reqs.L[r])].tolist(), r
    assert got == want


@pytest.fixture(scope="module")
def cm():
    """The cost model tests/test_hybrid.py uses."""
    m = copy.deepcopy(load_cost_model("llama3.1-8b-h100"))
    m.drafters["draft"] = Drafter("per_token", c_kv=1.1e-9, c_tok=3e-6, c0=7e-4)
    return m


def test_step_summary_counts_each_choice():
    pol = H.HybridPolicy("pr24344-skip", 4)
    live = H.LiveHybrid(pol)
    prompt = [5, 6, 7, 8, 5, 6, 7]
    need = live.begin(["a", "b", "c"], [[8], [1], []], lambda r: prompt if r == "a" else [1, 2, 3])
    assert need == [False, True, False]      # a: n-gram matched (5 6 7 8 -> 5 6 7 8); b: no match; c: no tokens
    ch = live.finish(np.array([[9, 9, 9, 9], [4, 4, 4, 4], [0, 0, 0, 0]]))
    assert ch == [H.Choice([5, 6, 7, 8], "ngram"), H.Choice([4, 4, 4, 4], "eagle"), H.Choice([], "")]
    s = live.summary(["a", "b", "c"])
    assert s == {"ngram": 1, "eagle": 1, "none": 1, "ngram_tokens": 4, "eagle_tokens": 4, "eagle_needed": True,
                 "per_req": {"a": ["ngram", 4], "b": ["eagle", 4], "c": ["", 0]}}
    assert live.hist["a"].view().tolist() == prompt + [8] and "c" not in live.hist


def test_forms_and_bad_input():
    assert H.valid_tokens(np.array([[3, 4, -1], [7, -1, -1], [9, 9, 9]]), [2]) == [[3, 4], [7], []]
    assert H.valid_tokens(np.array([[3, 150000, -1]]), vocab_size=151000) == [[3, 150000]]
    assert H.valid_tokens(np.array([[3, 151000, -1]]), vocab_size=151000) == [[3]]
    ids, n = H.pack([[1, 2], [], [3, 4, 5]], 3)
    assert ids.tolist() == [[1, 2, 0], [0, 0, 0], [3, 4, 5]] and n.tolist() == [2, 0, 3] and ids.dtype == np.int32
    assert H.unpack(ids, n) == [[1, 2], [], [3, 4, 5]]
    ns, sp = {"a": 4, "b": 4, "c": 1}, {"a": [-1] * 3, "b": [-1] * 3}
    assert H.trim_scheduled(ns, sp, {"a": 1, "b": 0, "c": 2}) == (5, {"a": 3, "b": 3})
    assert ns == {"a": 2, "b": 1, "c": 1} and sp == {"a": [-1]}
    live = H.LiveHybrid(H.HybridPolicy("pr24344", 4))
    for fn, msg in [(lambda: H.pack([[1, 2, 3]], 2), "3 tokens for 2 slots"),
                    (lambda: H.valid_tokens(np.zeros(3)), "[B, k+1]"),
                    (lambda: live.finish(None), "finish without begin"),
                    (lambda: live.begin(["a"], [[1], [2]], list), "one entry per request")]:
        with pytest.raises(H.HybridError, match=msg.replace("[", r"\[").replace("+", r"\+")):
            fn()
    live.begin(["a"], [[1]], lambda r: [1, 2, 3])
    with pytest.raises(H.HybridError, match="begin was called twice"):
        live.begin(["a"], [[1]], lambda r: [1, 2, 3])
    with pytest.raises(H.HybridError, match="2 rows for 1 requests"):
        live.finish(np.zeros((2, 4), int))


def test_history_is_reread_from_the_engines_context_when_a_step_was_not_seen():
    """On the synchronous path the plugin passes vLLM's own token ids (context_of): a step whose drafting vLLM
    skipped (the hybrid saw nothing) is caught up from them, and a shrunken context starts a new state."""
    prompt = [5, 6, 7, 8, 5, 6, 7]
    ctx = {"a": list(prompt)}
    live = H.LiveHybrid(H.HybridPolicy("pr24344", 4))

    def step(new):
        need = live.begin(["a"], [new], lambda r: prompt, lambda i: np.asarray(ctx["a"], np.int32))
        live.finish(np.zeros((1, 4), int))
        ctx["a"] += new
        return need

    step([8])
    ctx["a"] += [5, 6]                      # a step vLLM ran without calling the drafter
    step([7])
    assert live.hist["a"].view().tolist() == prompt + [8, 5, 6, 7] == ctx["a"]
    assert live.states["a"].n_prev == len(ctx["a"]) and live.states["a"].prompt_len == len(prompt)
    st = live.states["a"]
    ctx["a"] = ctx["a"][:len(prompt) + 1]   # vLLM dropped tokens the hybrid had counted
    step([9])
    assert live.hist["a"].view().tolist() == prompt + [8, 9] and live.states["a"] is not st
    assert live.states["a"].prompt_len == len(prompt)
