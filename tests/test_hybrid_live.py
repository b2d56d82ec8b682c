"""The live hybrid's engine-step pieces (hybrid.LiveHybrid, valid_tokens, pack/unpack, trim_scheduled) on the
committed traces' real token ids, driven as vLLM's V1 runner would drive them: continuous batching (requests
join while others decode, a joining request spends steps in prefill chunks whose samples are discarded), the
sampler's [B, k+1] output with -1 after the first rejection, and the drafts handed back in either of the runner's
forms (lists on the synchronous path; a [B, k] array + valid counts under async scheduling, the scheduled
slots trimmed to those counts). Nothing here imports vLLM; what only a live engine can show is listed in the
docstring of ``hybrid_runner`` (its GPU checks)."""
import copy
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from test_hybrid import eagle_proposal, qwen, smol  # noqa: F401  (the committed traces, as module fixtures)

from spec_repro import adaptive as AD
from spec_repro.costmodel import Drafter, load_cost_model
from spec_repro.engines.vllm import hybrid as H
from spec_repro.proposers.ngram import ngram_lookup


def engine(policy, reqs, toks, rows, *, async_form, max_batch=8, prefill_steps=2, seed=0, pad=False, mask=False,
           log=None):
    """Run requests ``rows`` through a LiveHybrid as the runner does, verifying greedily against each request's
    committed output. Requests join when a slot is free and spend ``prefill_steps`` steps in prefill (sampled
    garbage, discarded; the last chunk samples the first output token). Each step also runs a reference: fresh
    per-request states fed directly to ``hybrid.select`` with the context from the committed ids (prompt +
    output[:p]) and the package's n-gram lookup. Returns (emitted per request, steps [(req, source, k)],
    reference steps); ``k`` is the policy's own draft length (padding excluded).

    ``pad``: the LiveHybrid pads (module docstring, "Padding"); ``mask``: EAGLE's rows of requests whose choice
    does not read EAGLE hold -7 (masked drafting; otherwise EAGLE drafts every decoding row, as the plugin runs
    it); ``log`` (a list): per step and decoding request, what the padding checks need (see
    test_padding_makes_every_step_uniform_and_stays_lossless)."""
    rng = np.random.default_rng(seed)
    kmax = policy.kmax
    ref_pol = H.HybridPolicy(policy.name, kmax, getattr(policy, "cost_model", None),
                             params=getattr(policy, "params", None))
    live = H.LiveHybrid(policy, pad=pad)
    L = {r: int(reqs.L[r]) for r in rows}
    ids = {r: f"req-{r}" for r in rows}
    waiting, running, prefill = list(rows), [], {}
    p, emitted, ref_states = {}, {}, {}
    drafts = {}         # request -> draft scheduled for this step
    sent = {}           # request -> (its policy's own draft, padding tokens) of the draft scheduled
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
        verified = {}   # request -> (tokens accepted, of them padding, the policy's own draft, tokens emitted)
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
            own, npad = sent.pop(r)
            verified[r] = (m, max(0, m - len(own)), own, new)
            sampled[i, :len(new)] = new
            emitted[r] += new
            p[r] += len(new)
        # the hybrid's part of the step
        req_ids = [ids[r] for r in running]
        new = H.valid_tokens(sampled, discard, vocab_size=10 ** 9)
        need = live.begin(req_ids, new, lambda rid: toks[int(rid[4:])][0].tolist())
        eg = np.full((B, kmax), -7, np.int64)      # EAGLE drafts every decoding row (masked: only those needing it)
        dec = [i for i, r in enumerate(running) if i not in discard]
        for i in dec:
            r = running[i]
            if need[i] or not mask:
                eg[i] = eagle_proposal(toks[r][1], p[r] - 1, reqs.acc[1, reqs.off[r] + p[r] - 1], kmax)
        choices = live.finish(eg if any(need) else None, width=kmax, vocab_size=10 ** 9)
        # the reference: the same decisions from the committed ids alone
        ctx = [np.concatenate([toks[running[i]][0], toks[running[i]][1][:p[running[i]]]]) for i in dec]
        ng = [ngram_lookup(c, kmax) for c in ctx]
        ref = H.select(ref_pol, [ref_states[running[i]] for i in dec], ctx, ng, eg[dec])
        own = {i: H.Choice(c.draft[:len(c.draft) - c.pad], c.source) for i, c in enumerate(choices)}
        assert [own[i] for i in dec] == ref
        assert all(choices[i] == H.Choice([], "") and not need[i] for i in discard)
        assert pad or all(c.pad == 0 for c in choices)
        if log is not None:
            summ = live.summary(req_ids)
            for j, i in enumerate(dec):
                r = running[i]
                log.append({"req": r, "p": p[r], "choice": choices[i], "ref": ref[j], "ngram": ng[j],
                            "eagle": eg[i].tolist(), "context": ctx[j], "verified": verified.get(r),
                            "state_accepted": live.states[ids[r]].accepted, "summary": summ,
                            "per_req": summ["per_req"][ids[r]]})
        # hand the drafts to the "scheduler" in the runner's form
        lists = [c.draft for c in choices]
        if async_form:
            arr, counts = H.pack(lists, kmax)
            nsched = {rid: 1 + kmax for rid in req_ids}          # k placeholder slots each
            spec = {rid: [-1] * kmax for rid in req_ids}
            removed, before = H.trim_scheduled(nsched, spec, dict(zip(req_ids, counts.tolist())))
            assert removed == B * kmax - int(counts.sum()) and before == {rid: kmax for rid in req_ids}
            assert all(nsched[rid] == 1 + len(spec.get(rid, [])) for rid in req_ids)
            if pad:      # uniform: every decoding request keeps its 1 + k slots (only prefill rows are cut)
                assert removed == len(discard) * kmax
                assert all(nsched[req_ids[i]] == 1 + kmax for i in dec)
            back = H.unpack(arr, [len(spec.get(rid, [])) for rid in req_ids])
        else:
            back = lists
        assert back == lists
        for i, r in enumerate(running):
            if i in dec:
                drafts[r] = back[i][: max(0, L[r] - p[r])]     # the scheduler cuts at the output's end
                sent[r] = (own[i].draft, choices[i].pad)
                got.append((r, own[i].source, len(own[i].draft)))
                want.append((r, ref[dec.index(i)].source, len(ref[dec.index(i)].draft)))
        done = [r for r in running if r not in prefill and p.get(r, 0) >= L[r]]
        live.forget([ids[r] for r in done])
        running = [r for r in running if r not in done]
    assert not live.states and not live.hist and not live._sent      # every finished request forgotten
    return emitted, got, want


@pytest.mark.parametrize("name", H.HOST_POLICIES)
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
    used = {s for _r, s, _k in got} - {""}
    assert used == {"ngram-only": {"ngram"}, "eagle-only": {"eagle"}, "idle": {"eagle"}}.get(name, {"ngram", "eagle"})


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


# ---- padding (LiveHybrid(pad=True): every draft padded to the step's k) ------------------------------------------
@pytest.mark.parametrize("name, async_form, mask", [("pr24344", False, False), ("pr24344", True, True),
                                                    ("pr24344-skip", True, False), ("pr24344-skip", False, True),
                                                    ("ngram-only", True, False), ("ngram-only", False, False),
                                                    ("eagle-only", True, False), ("adaptive-rule", True, True),
                                                    ("adaptive-rule", False, False)])
def test_padding_makes_every_step_uniform_and_stays_lossless(name, async_form, mask, smol, request):
    """With padding on, through the engine-step pieces: (a) every decoding request's draft is exactly k tokens at
    every step (async: no decoding request's slots are trimmed), whatever the policy chose, no draft included;
    (b) every request emits exactly its committed (greedy) output, and the policy takes exactly the decisions it
    takes unpadded (hybrid.select on the committed ids); (c) the accounting: the policy's own accepted count is
    its own draft's (no padding token counted), the step log's pad_accepted is the number of padding tokens the
    verification accepted (each one the greedy output's token at its position), and no padding token is an id
    outside the vocabulary (masked EAGLE rows hold -7)."""
    reqs, _requests, toks = smol
    cm = request.getfixturevalue("cm") if name == "adaptive-rule" else None
    kmax = 8
    rows = list(range(len(reqs.L)))
    log = []
    # adaptive-rule: with a lower bound of 2 standard errors, so that it declines to speculate at some steps here
    params = AD.RuleParams(lcb=2.0) if name == "adaptive-rule" else None
    emitted, got, want = engine(H.HybridPolicy(name, kmax, cm, params=params), reqs, toks, rows,
                                async_form=async_form, pad=True, mask=mask, log=log)
    assert got == want
    for r in rows:                                                          # (b)
        L = int(reqs.L[r])
        assert emitted[r][:L] == toks[r][1][:L].tolist(), r
    pads = fillers = 0
    pad_acc = {}
    for e in log:
        c = e["choice"]
        assert len(c.draft) == kmax and 0 <= c.pad <= kmax, e                # (a)
        own = c.draft[:kmax - c.pad]
        assert H.Choice(own, c.source) == e["ref"]
        assert all(x >= 0 for x in c.draft[len(own):]), e                   # (c) real ids only
        assert e["per_req"][:3] == [c.source, len(own), c.pad]
        pads += c.pad
        fillers += c.pad and c.source == ""
        v = e["verified"]
        if v is not None:                                                   # (c) this step's verification
            m, _pad_m, prev_own, new = v
            out = toks[e["req"]][1]
            p0 = e["p"] - len(new)
            assert new[:m] == out[p0:p0 + m].tolist()                       # accepted tokens are greedy's
            # the last token emitted is the target's own (at an output's end the replay has no bonus token)
            pad_m = max(0, min(m, len(new) - 1) - len(prev_own))
            assert e["per_req"][3] == pad_m
            pol_acc = e["state_accepted"]
            k = 0
            while k < min(len(prev_own), len(new)) and prev_own[k] == new[k]:
                k += 1
            assert pol_acc == min(k, len(new) - 1) <= len(prev_own), e      # the policy's own draft only
            pad_acc[id(e["summary"])] = pad_acc.get(id(e["summary"]), 0) + pad_m
        s = e["summary"]
        assert set(s["pad_by"]) <= set(H.FILLERS) and sum(s["pad_by"].values()) == s["pad_tokens"]
    sums = {id(e["summary"]): e["summary"] for e in log}
    assert all(sums[i]["pad_accepted"] == n for i, n in pad_acc.items())
    if name == "eagle-only":
        assert pads == 0                        # EAGLE always drafts k: nothing to pad
    else:
        assert pads > 0 and sum(pad_acc.values()) > 0      # padded, and some padding accepted
    if name in ("ngram-only", "adaptive-rule"):
        assert fillers > 0                      # requests the policy gave no draft were padded too


def test_padding_is_off_by_default(smol):
    """Without pad the same replay proposes n-gram's short drafts as they are (non-uniform steps)."""
    reqs, _requests, toks = smol
    log = []
    engine(H.HybridPolicy("pr24344", 8), reqs, toks, list(range(len(reqs.L))), async_form=True, log=log)
    assert any(len(e["choice"].draft) < 8 for e in log) and all(e["choice"].pad == 0 for e in log)
    assert "pad_tokens" not in log[0]["summary"] and len(log[0]["per_req"]) == 2


def test_pad_draft_fillers():
    t = np.array([1, 2, 9, 1], np.int64)
    V = 100
    # eagle: EAGLE's row continues exactly the chosen draft
    assert H.pad_draft([5, 6], 4, t, [5, 6], [5, 6, 7, 8], V) == ([7, 8], "eagle")
    # EAGLE disagrees with the n-gram draft: n-gram's period continues it
    assert H.pad_draft([5, 6], 5, t, [5, 6], [5, 9, 7, 8, 8], V) == ([5, 6, 5], "ngram")
    # a rule's cut of n-gram's proposal: the proposal's next tokens, then its period
    assert H.pad_draft([1], 5, t, [1, 2, 3], None, V) == ([2, 3, 1, 2], "ngram")
    # a masked row (-7) or an id outside the vocabulary is not used
    assert H.pad_draft([], 3, t, [3], [-7, -7, -7], V) == ([3, 3, 3], "ngram")
    assert H.pad_draft([5], 3, t, [], [5, 6, V], V) == ([5, 5], "cycle")
    assert H.pad_draft([5], 3, t, [], [5, 6, 99], V) == ([6, 99], "eagle")
    # a row shorter than the width is not used either
    assert H.pad_draft([5], 3, t, [], [5, 6], V) == ([5, 5], "cycle")
    # no draft, no n-gram match: the lookup from one token (1 first occurred at 0: 2 9 1 follow), its period
    assert H.pad_draft([], 4, t, [], None, V) == ([2, 9, 1, 2], "lookup")
    # nothing recurs: the last token repeated
    assert H.pad_draft([], 3, np.array([4, 5, 6]), [], None, V) == ([6, 6, 6], "repeat")
    assert H.pad_draft([1, 2, 3], 3, t, [], None, V) == ([], "")


def test_short_ngram_proposals_end_a_periodic_stretch(qwen):
    """The ``ngram`` filler's premise, on the Qwen trace's real contexts: wherever vLLM's lookup proposes d < k
    tokens, the context ends with at least min_n + d tokens of period d, so repeating the proposal continues it."""
    _reqs, _requests, toks = qwen
    k, n_short = 8, 0
    for prompt, out in toks[:40]:
        ids = np.concatenate([prompt, out])
        for c in range(len(prompt) + 1, len(ids)):
            g = ngram_lookup(ids[:c], k)
            if 0 < len(g) < k:
                n_short += 1
                d = len(g)
                assert ids[c - d:c].tolist() == g
                assert all(ids[c - 1 - i] == ids[c - 1 - i - d] for i in range(3)), (c, g)
    assert n_short > 50


def test_padded_step_summary():
    """The step log's padding columns, step by step (n-gram alone, padded to k = 4)."""
    live = H.LiveHybrid(H.HybridPolicy("ngram-only", 4), pad=True)
    prompt = [5, 6, 7, 8, 5, 6, 7]
    need = live.begin(["a", "b", "c"], [[8], [1], []], lambda r: prompt if r == "a" else [1, 2, 3])
    assert need == [False, False, False]                      # ngram-only never reads EAGLE
    # EAGLE's rows anyway (another request could have needed them): b's padding takes its row
    ch = live.finish(np.array([[9, 9, 9, 9], [4, 4, 4, 4], [0, 0, 0, 0]]), width=4)
    assert ch == [H.Choice([5, 6, 7, 8], "ngram"), H.Choice([4, 4, 4, 4], "", 4), H.Choice([], "")]
    s = live.summary(["a", "b", "c"])
    assert s == {"ngram": 1, "eagle": 0, "none": 2, "ngram_tokens": 4, "eagle_tokens": 0, "eagle_needed": False,
                 "pad_tokens": 4, "pad_by": {"eagle": 4}, "pad_accepted": 0,
                 "per_req": {"a": ["ngram", 4, 0, 0], "b": ["", 0, 4, 0], "c": ["", 0, 0, 0]}}
    # b: 2 of its 4 padding tokens accepted, then the target's 2; context 1 2 3 1 4 4 2 has no 3-gram match
    live.begin(["a", "b"], [[5, 6, 7], [4, 4, 2]], None)
    ch = live.finish(None, width=4)
    assert ch == [H.Choice([8, 5, 6, 7], "ngram"), H.Choice([3, 1, 4, 4], "", 4)]   # "2" first at 1: 3 1 4 4
    s = live.summary(["a", "b"])
    assert s["pad_by"] == {"lookup": 4} and s["pad_accepted"] == 2 and s["none"] == 1
    assert s["per_req"] == {"a": ["ngram", 4, 0, 0], "b": ["", 0, 4, 2]}
    assert live.states["b"].accepted == 0 and live.states["a"].accepted == 2   # the policy's own drafts only
    live.begin(["b"], [[3, 1, 9]], None)                      # 9 never occurred before: repeated
    assert live.finish(None, width=4) == [H.Choice([9, 9, 9, 9], "", 4)]
    s = live.summary(["b"])
    assert s["pad_accepted"] == 2 and s["pad_by"] == {"repeat": 4} and live.states["b"].accepted == 0
    # width below k_max (vLLM's dynamic k): cut, then padded to it
    live.begin(["a"], [[8]], None)
    assert live.finish(None, width=2) == [H.Choice([5, 6], "ngram")]
    live.forget(["a", "b"])
    assert not live._sent
