"""The live hybrid's per-step logic (spec_repro.engines.vllm.hybrid), on the committed traces' real token ids.

A trace records each position's prompt/output token ids and EAGLE's acceptance there, not EAGLE's draft tokens:
EAGLE's proposal at a step is rebuilt as the output tokens it matched followed by tokens that differ from the
next output token (the only part of a proposal greedy verification, and the policies, can tell apart). n-gram's
proposal is the package's lookup on the context, as vLLM's prompt lookup."""
import copy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from spec_repro import adaptive as AD
from spec_repro.costmodel import Drafter, load_cost_model
from spec_repro.engines.vllm import hybrid as H
from spec_repro.proposers.ngram import ngram_lookup
from spec_repro.simulate import _group_arrays
from spec_repro.tracefiles import read_trace

ROOT = Path(__file__).resolve().parents[1]
PROPS = ["ngram", "eagle"]
USED = {"ngram-only": {"ngram", ""}, "eagle-only": {"eagle"}, "idle": {"eagle"}}   # what the single-proposer policies verify


@pytest.fixture(scope="module")
def cm():
    """The cost model tests/test_adaptive.py uses."""
    m = copy.deepcopy(load_cost_model("llama3.1-8b-h100"))
    m.drafters["draft"] = Drafter("per_token", c_kv=1.1e-9, c_tok=3e-6, c0=7e-4)
    return m


def _trace(name):
    t = read_trace(ROOT / "data" / "traces" / f"{name}.parquet").select(proposers=PROPS)
    ids = t.requests["request_id"].tolist()
    reqs = _group_arrays(t.acc, t.requests, PROPS, ids)
    by = t.requests.drop_duplicates("request_id").set_index("request_id")
    toks = [(np.asarray(by.at[r, "prompt_token_ids"], np.int64), np.asarray(by.at[r, "output_token_ids"], np.int64))
            for r in ids]
    return reqs, t.requests, toks


@pytest.fixture(scope="module")
def smol():
    return _trace("smollm2-135m__code-edit")


@pytest.fixture(scope="module")
def qwen():
    return _trace("qwen2.5-coder-1.5b__code-edit")


def eagle_proposal(out, j, acc, kmax):
    """EAGLE's proposal at output position j (context prompt + out[:j+1]): the acc - 1 tokens it matched, then
    tokens unequal to the output's next one."""
    a = int(acc)
    miss = int(out[j + a]) + 1 if j + a < len(out) else 0
    return (out[j + 1:j + a].tolist() + [miss] * kmax)[:kmax]


def replay(policy, reqs, toks, rows, B=None, eagle_as_array=True, futures=None):
    """Drive ``policy`` over requests ``rows`` in lockstep with greedy verification against each request's output.

    Per step, every active request gets its n-gram lookup and (where any request needs it, as a GPU side that
    drafts the whole batch) EAGLE's proposals as one [n, kmax] array, with garbage (-1) in the rows of requests
    whose choice does not read EAGLE. ``B``: the batch size the policy is told (default: the requests active).
    ``futures``: per request a replacement output (the tokens the target produces; ids after a cut differ).
    Returns per request the emitted tokens and the steps (p, source, k, tokens emitted, needs_eagle,
    the state's accepted count of the previous step). Every draft is checked to be a prefix of its source's."""
    kmax = policy.kmax
    outs = {r: (futures or {}).get(r, toks[r][1]) for r in rows}
    L = {r: int(reqs.L[r]) for r in rows}
    states = {r: policy.new_state(len(toks[r][0])) for r in rows}
    bufs = {r: np.concatenate([toks[r][0], outs[r]]) for r in rows}   # as vLLM's token_ids_cpu rows
    p = {r: 1 for r in rows}
    emitted = {r: [int(outs[r][0])] for r in rows}
    steps = {r: [] for r in rows}
    while True:
        act = [r for r in rows if p[r] < L[r]]
        if not act:
            return emitted, steps
        tk = [bufs[r][:len(toks[r][0]) + p[r]] for r in act]
        ng = [ngram_lookup(t, kmax) for t in tk]
        bs = len(act) if B is None else B
        need = H.policy_needs_eagle(policy, [states[r] for r in act], tk, ng, bs)
        if any(need):
            eg = [eagle_proposal(outs[r], p[r] - 1, reqs.acc[1, reqs.off[r] + p[r] - 1], kmax) if nd
                  else [-1] * kmax for r, nd in zip(act, need)]
            eg = np.array(eg, np.int64) if eagle_as_array else eg
        else:
            eg = None
        choices = H.select(policy, [states[r] for r in act], tk, ng, eg, bs)
        for i, (r, c, nd) in enumerate(zip(act, choices, need)):
            d, target = c.draft, outs[r][p[r]:]
            src = {"ngram": ng[i], "eagle": None if eg is None else list(eg[i]), "": []}[c.source]
            assert d == [int(x) for x in src[:len(d)]] and (c.source == "") == (d == []) and len(d) <= kmax
            m = 0
            while m < len(d) and m < len(target) and d[m] == target[m]:
                m += 1
            g = m + 1
            emitted[r] += d[:m] + target[m:m + 1].tolist()    # accepted draft tokens, then the target's own
            steps[r].append((p[r], c.source, len(d), g, nd, states[r].accepted))
            p[r] += g


@pytest.mark.parametrize("name", H.HOST_POLICIES)
def test_lossless_whatever_the_policy(name, smol, cm):
    """Greedy verification of whatever the policy proposes, in a batch, emits exactly each request's output ids;
    every proposal is a prefix of the proposer's own; the state's accepted count is the verification's."""
    reqs, _requests, toks = smol
    kmax = 16
    pol = H.HybridPolicy(name, kmax, cm)
    rows = list(range(len(reqs.L)))
    emitted, steps = replay(pol, reqs, toks, rows)
    for r in rows:
        L = int(reqs.L[r])
        assert emitted[r][:L] == toks[r][1][:L].tolist(), r
    n_steps = sum(len(s) for s in steps.values())
    n_tok = sum(int(reqs.L[r]) - 1 for r in rows)
    assert n_steps < 0.6 * n_tok        # it speculated (and got tokens accepted)
    used = {s[1] for st in steps.values() for s in st}
    if name == "adaptive-rule":
        assert {"ngram", "eagle"} <= used, used        # and "" where it chose not to speculate
    else:
        assert used == USED.get(name, {"ngram", "eagle"}), used
    for r in rows:   # the accepted count each state derives from its token ids is the verification's
        assert [s[5] for s in steps[r]] == [None] + [s[3] - 1 for s in steps[r][:-1]]


def test_pr24344_picks_ngram_exactly_where_the_lookup_matches(qwen, cm):
    """pr24344: n-gram's proposal wherever the package's lookup matches (where the trace's recorded n-gram
    draft_len is > 0), else EAGLE's k_max tokens; pr24344-skip takes the same choices and needs EAGLE only where
    n-gram did not match."""
    reqs, _requests, toks = qwen
    rows = list(range(0, len(reqs.L), 3))
    kmax = 16
    _e, a = replay(H.HybridPolicy("pr24344", kmax), reqs, toks, rows)
    _e, b = replay(H.HybridPolicy("pr24344-skip", kmax), reqs, toks, rows, eagle_as_array=False)
    kinds = set()
    for r in rows:
        pr, out = toks[r]
        for (p, src, k, _g, need, _a) in a[r]:
            dl = int(reqs.dlen[0, reqs.off[r] + p - 1])       # the profiler's recorded n-gram match at j = p - 1
            look = ngram_lookup(np.concatenate([pr, out[:p]]), kmax)
            assert len(look) == min(dl, kmax), (r, p)
            assert (src == "ngram") == (dl > 0) and need, (r, p)
            assert k == (len(look) if dl > 0 else kmax)
            kinds.add(src)
        assert [s[:4] for s in a[r]] == [s[:4] for s in b[r]]
        assert [s[4] for s in b[r]] == [s[1] == "eagle" for s in b[r]]
    assert kinds == {"ngram", "eagle"}


@pytest.mark.parametrize("trace,cost,kmax,B", [("smol", "test", 16, 1), ("smol", "test", 16, 64),
                                               ("smol", "llama3.1-8b-h100-per-token", 8, 16),
                                               ("qwen", "test", 16, 8),
                                               ("qwen", "llama3.1-8b-h100-per-token", 16, 1)])
def test_adaptive_rule_live_equals_the_simulator(trace, cost, kmax, B, cm, request):
    """adaptive-rule, driven step by step from the token ids (told batch size B), takes exactly the decisions of
    adaptive.adaptive_steps (verified proposer, k, tokens produced, per step) for every request of a committed
    trace, the requests served one after another in the simulator's order (their ids), so the population's counts
    each request starts from are the same: the live policy and the simulator agree."""
    reqs, requests, toks = request.getfixturevalue(trace)
    model = cm if cost == "test" else load_cost_model(cost)
    sim = AD.adaptive_steps(reqs, requests, PROPS, "adaptive-rule", B, model, kmax)
    pol = H.HybridPolicy("adaptive-rule", kmax, model)
    rows = list(range(len(reqs.L)))
    live = {}
    for r in sorted(rows, key=lambda r: str(reqs.ids[r])):
        live.update(replay(pol, reqs, toks, [r], B=B)[1])
    code = {"": -1, "ngram": 0, "eagle": 1}
    for r in rows:
        m = sim.req == r
        want = list(zip(sim.p[m].tolist(), sim.verified[m].tolist(), (sim.inp[m] - 1).tolist(), sim.gen[m].tolist()))
        got = [(p, code[src], k, g) for p, src, k, g, _n, _a in live[r]]
        assert got == want, r
        assert [n for _p, _s, _k, _g, n, _a in live[r]] == [v == 1 for _p, v, _k, _g in want]   # EAGLE needed where verified
    assert len(set(sim.verified.tolist())) >= 2


@pytest.mark.parametrize("name", H.HOST_POLICIES)
def test_no_decision_reads_the_future(name, smol, cm):
    """Replace each request's output after a cut with another request's output ids: every decision at a step
    that starts at or before the cut (needs EAGLE, source, k) is unchanged, although EAGLE's proposals there and
    everything after the cut differ."""
    reqs, _requests, toks = smol
    kmax = 16
    rows = [r for r in range(len(reqs.L)) if reqs.L[r] >= 120][:8]
    assert len(rows) == 8
    _e, base = replay(H.HybridPolicy(name, kmax, cm), reqs, toks, rows, B=8)
    changed = 0
    for cut in (10, 40, 90):
        fut = {}
        for i, r in enumerate(rows):
            other = np.concatenate([toks[rows[(i + 1) % len(rows)]][1], toks[r][1]])   # real ids, long enough
            fut[r] = np.concatenate([toks[r][1][:cut + 1], other[cut + 1:]])[:len(toks[r][1])]
        _e, pert = replay(H.HybridPolicy(name, kmax, cm), reqs, toks, rows, B=8, futures=fut)
        for r in rows:
            before = [(p, s, k, n) for p, s, k, _g, n, _a in base[r] if p <= cut]
            assert [(p, s, k, n) for p, s, k, _g, n, _a in pert[r] if p <= cut] == before, (r, cut)
            changed += [s[:4] for s in pert[r]] != [s[:4] for s in base[r]]
    # the perturbation does reach the decisions after the cut (eagle-only decides the same whatever the tokens)
    assert changed > 0 or name in ("eagle-only", "idle")


def test_the_shared_rule_is_the_simulators(smol, cm):
    """A live policy whose rule differs from the simulator's (another copy_run) disagrees somewhere: the
    equality above is not vacuous."""
    reqs, requests, toks = smol
    sim = AD.adaptive_steps(reqs, requests, PROPS, "adaptive-rule", 1, cm, 16)
    pol = H.HybridPolicy("adaptive-rule", 16, cm, params=AD.RuleParams(copy_run=3))
    _e, live = replay(pol, reqs, toks, list(range(len(reqs.L))), B=1)
    got = [(p, k) for r in range(len(reqs.L)) for p, _s, k, *_x in live[r]]
    assert got != list(zip(sim.p.tolist(), (sim.inp - 1).tolist()))


def test_bad_input_gives_one_clear_line(cm):
    t = np.arange(10, dtype=np.int64)
    cases = [
        (lambda: H.HybridPolicy("ngram-else-eagle", 8), "expected one of pr24344, pr24344-skip, adaptive-rule"),
        (lambda: H.HybridPolicy("pr24344", 0), "kmax must be >= 1"),
        (lambda: H.HybridPolicy("adaptive-rule", 8), "pass cost_model="),
        (lambda: H.HybridPolicy("adaptive-rule", 8, "smollm2-135m-cpu"), "no drafting model for proposer 'eagle'"),
        (lambda: H.HybridPolicy("pr24344", 8).select(H.RequestState(4), t, [], None, 1), "none was given"),
        (lambda: H.HybridPolicy("pr24344", 8).select(H.RequestState(4), t.tolist(), [1], None, 1),
         "1-D integer numpy array"),
        (lambda: H.HybridPolicy("pr24344", 8).select(H.RequestState(10), t, [1], None, 1),
         "at least one output token"),
        (lambda: H.mix(H.HybridPolicy("pr24344", 8), [H.RequestState(4)], [t, t], [[1]]), "one entry per request"),
        (lambda: H.mix(H.HybridPolicy("pr24344", 8), [H.RequestState(4)], [t], [[]], np.zeros((2, 8), int)),
         "2 rows for 1 requests"),
        (lambda: H.HybridPolicy("adaptive-rule", 8, cm).needs_eagle(H.RequestState(4), t, [], 0), "batch_size"),
    ]
    for fn, msg in cases:
        with pytest.raises(H.HybridError) as e:
            fn()
        assert msg in str(e.value) and "\n" not in str(e.value), str(e.value)
    pol, st = H.HybridPolicy("adaptive-rule", 8, cm), H.RequestState(4)
    pol.needs_eagle(st, t, [5], 1)
    with pytest.raises(H.HybridError, match="was not followed by select"):
        pol.select(st, t, [], None, 1)
    pol, st = H.HybridPolicy("pr24344", 8), H.RequestState(4)
    assert pol.select(st, t, [3, 4], None, 1) == H.Choice([3, 4], "ngram")
    with pytest.raises(H.HybridError, match="did not grow"):
        pol.select(st, t, [3, 4], None, 1)


def test_importing_the_hybrid_imports_no_vllm_and_no_numba():
    code = ("import sys; import spec_repro.engines.vllm.hybrid; "
            "assert not {'vllm', 'torch', 'numba'} & set(sys.modules), sorted({'vllm', 'torch', 'numba'} & "
            "set(sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
