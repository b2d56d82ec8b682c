"""The model proposer's length by its own confidence (spec_repro.baselines: conf-stop, ngram-else-eagle-skip-conf)
and its ceiling (T = oracle): a walk computed by hand, exact drafting charges, causality (perturbing what a
decision may not see changes no decision; the oracle, which reads the step's acceptance, is caught), one-line
errors, and the comparison against the rule tuned out of sample on the committed SmolLM2 traces."""
import copy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from spec_repro.baselines import conf_name, conf_steps, parse_conf, stop_lengths
from spec_repro.costmodel import load_cost_model
from spec_repro.simulate import SimulationError, _group_arrays, parse_policy, simulate
from spec_repro.traces import Trace

ROOT = Path(__file__).resolve().parents[1]
K = 3
# probabilities exactly representable by the stored 8-bit code (code / 254)
C = {"A": [[1.0, 0.5, 0.5], [0.5, 0.5, 0.5], [1.0, 1.0, 1.0], [0.5, 0.5, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]],
     "B": [[0.2, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]}
ACC = {"A": [3, 2, 1, 3, 2, 1], "B": [1, 2, 2, 1]}


def hand_trace(ngram_dl=None):
    arrays = {r: {"eagle": a, "ngram": [1] * len(a)} for r, a in ACC.items()}
    dls = {r: {"ngram": [0] * len(a)} for r, a in ACC.items()}
    if ngram_dl:
        for r, (dl, acc) in ngram_dl.items():
            arrays[r]["ngram"], dls[r]["ngram"] = acc, dl
    conf = {r: {"eagle": np.round(np.array(c, np.float32) * 254) / 254} for r, c in C.items()}
    return Trace.from_arrays(arrays, prompt_lens={"A": 100, "B": 50}, dataset="code-edit", model="m", k_max=K,
                             draft_lens=dls, confidences=conf)


@pytest.fixture(scope="module")
def cm():
    return copy.deepcopy(load_cost_model("llama3.1-8b-h100-per-token"))


def test_policy_names():
    assert parse_policy("conf-stop") == ("conf-stop", (0, 0.3, 8))
    assert parse_policy("conf-stop-0.45-6") == ("conf-stop", (0, 0.45, 6))
    assert parse_policy("conf-stop-oracle-6") == ("conf-stop", (0, None, 6))
    assert parse_policy("ngram-else-eagle-skip-conf-16-0.3-4") == ("ngram-else-eagle-skip-conf", (16, 0.3, 4))
    assert parse_policy("ngram-else-eagle-skip-conf-16-oracle-4") == ("ngram-else-eagle-skip-conf", (16, None, 4))
    assert conf_name("ngram-else-eagle-skip-conf", 16, None, 4) == "ngram-else-eagle-skip-conf-16-oracle-4"
    assert parse_conf(conf_name("conf-stop", 0, 0.05, 8)) == ("conf-stop", (0, 0.05, 8))
    for bad, msg in (("conf-stop-3-0.5-8", "T and K only"), ("ngram-else-eagle-skip-conf-16", "all three"),
                     ("conf-stop-1.5-8", r"\[0, 1\]"), ("conf-stop-0.5-0", ">= 1")):
        with pytest.raises(SimulationError, match=msg):
            parse_policy(bad)


def test_stop_lengths_by_hand():
    c = np.array([[1.0, 0.5, 0.5], [0.5, 0.5, 1.0], [0.2, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, np.nan, 1.0]])
    prop, comp = stop_lengths(c, 0.4, 3)
    # products: 1, .5, .25 -> stop at 3 | .5, .25 -> 2 | .2 -> 1 | never | NaN (absent) reads as 0 -> 2
    assert prop.tolist() == [2, 1, 0, 3, 1] and comp.tolist() == [3, 2, 1, 3, 2]
    prop, comp = stop_lengths(c, 0.4, 2)
    assert prop.tolist() == [2, 1, 0, 2, 1] and comp.tolist() == [2, 2, 1, 2, 2]
    prop, comp = stop_lengths(None, None, 3, np.array([1, 2, 4, 7]))
    assert prop.tolist() == [0, 1, 3, 3] and comp.tolist() == [1, 2, 3, 3]


def _drafting(cm, steps):
    """Drafting time at bs 1 of per-token EAGLE over (kv, computed drafts) steps, per request (sd_time_s is the
    mean request latency; two requests here)."""
    e = cm.drafter("eagle")
    return sum(n * (e.c_kv * kv + e.c_tok + e.c0) for kv, n in steps) / 2


def test_conf_stop_walk_by_hand(cm):
    """T = 0.4, K = 3. A: j=0 products 1, .5, .25: proposes 2 (3 computed), acc 3 -> 3 tokens; j=3: .5, .25:
    proposes 1 (2 computed), acc 3 -> 2 tokens; done (6). B: j=0 .2 < T: proposes 0 (1 computed, paid), one
    token; j=1 never below: 3 proposed, acc 2 -> 2 tokens; done (4)."""
    t = hand_trace()
    row = simulate(t.select(proposers=["eagle"]), cm, "eagle", "conf-stop-0.4-3", batch_sizes=[1],
                   progress=False).iloc[0]
    assert row.draft_cost == "ran" and row.mean_tokens_per_step == pytest.approx((3 + 2 + 1 + 2) / 4)
    want = _drafting(cm, [(100 + 1, 3), (100 + 4, 2), (50 + 1, 1), (50 + 2, 3)])
    assert row.draft_share * row.sd_time_s == pytest.approx(want, rel=1e-12)
    # the ceiling: A j=0 acc 3 -> proposes 2, computes 3 (the rejected third, read to stop); j=3 acc 3 -> 2, 3;
    # B j=0 acc 1 -> 0, 1; j=1 acc 2 -> 1, 2
    o = simulate(t.select(proposers=["eagle"]), cm, "eagle", "conf-stop-oracle-3", batch_sizes=[1],
                 progress=False).iloc[0]
    assert o.mean_tokens_per_step == pytest.approx((3 + 3 + 1 + 2) / 4)
    assert o.draft_share * o.sd_time_s == pytest.approx(
        _drafting(cm, [(101, 3), (104, 3), (51, 1), (52, 2)]), rel=1e-12)


def test_skip_conf_walk_by_hand(cm):
    """A: n-gram matched at j=3 (2 tokens, both right): j=0 EAGLE's stop (2 proposed, 3 computed, 3 tokens); j=3
    n-gram serves (EAGLE skips), 3 tokens. B: no match; as conf-stop."""
    t = hand_trace({"A": ([0, 0, 0, 2, 0, 0], [1, 1, 1, 3, 1, 1])})
    props = ["ngram", "eagle"]
    sub = t.select(proposers=props)
    reqs = _group_arrays(sub.acc, sub.requests, props, sub.requests["request_id"].tolist())
    from spec_repro.simulate import _group_confidence
    conf = _group_confidence(sub, reqs, props, ("code-edit", "m"), K)
    req, p, idx, inp, gen, ch = conf_steps(reqs, props, reqs.dlen[0], conf, 3, 0.4, K, cm,
                                         "ngram-else-eagle-skip-conf")
    assert (p - 1).tolist() == [0, 3, 0, 1] and (inp - 1).tolist() == [2, 2, 0, 3] and gen.tolist() == [3, 3, 1, 2]
    assert ch[1][1].tolist() == [True, False, True, True] and ch[1][2].tolist() == [3, 2, 1, 3]
    row = simulate(sub, cm, props, "ngram-else-eagle-skip-conf-3-0.4-3", batch_sizes=[1], progress=False).iloc[0]
    ng = cm.drafter("ngram").fraction * float(cm.forward(104, 3)) / 2
    want = _drafting(cm, [(101, 3), (51, 1), (52, 3)]) + ng
    assert row.draft_share * row.sd_time_s == pytest.approx(want, rel=1e-12)


def _decisions(t, policy, cm, props):
    sub = t.select(proposers=props)
    reqs = _group_arrays(sub.acc, sub.requests, props, sub.requests["request_id"].tolist())
    from spec_repro.simulate import _group_confidence
    kind, (kn, T, k) = parse_conf(policy)
    conf = _group_confidence(sub, reqs, props, ("code-edit", "m"), int(sub.acc.k_max.max()))
    ngdl = reqs.dlen[0] if kind != "conf-stop" else None
    req, p, idx, inp, gen, ch = conf_steps(reqs, props, ngdl, conf, kn, T, k, cm, kind)
    return [(int(p[s]) - 1, int(inp[s]) - 1, int(ch[-1][2][s])) for s in range(len(p))]


def _random_request(rng, L, kmax):
    acc = np.minimum(rng.integers(1, kmax + 2, L), L - np.arange(L))
    dl = np.where(rng.random(L) < 0.3, rng.integers(1, kmax + 1, L), 0)
    conf = rng.choice([0.1, 0.3, 0.5, 0.7, 0.9, 1.0], (L, kmax))
    return acc, dl, conf


@pytest.mark.parametrize("policy,props", [("conf-stop-0.3-4", ["eagle"]),
                                          ("ngram-else-eagle-skip-conf-6-0.3-4", ["ngram", "eagle"]),
                                          ("conf-stop-oracle-4", ["eagle"]),
                                          ("ngram-else-eagle-skip-conf-6-oracle-4", ["ngram", "eagle"])])
def test_no_decision_sees_what_it_may_not(cm, policy, props):
    """Perturb, for each step at position j, everything its decision may not see: every acc at positions >= j
    (the step's own acceptance included), n-gram's match after j, the confidence of later positions and of the
    drafts after the stop at j (never computed), and the confidence at positions no step started at. The stop
    policies change no decision; the ceiling (T = oracle: EAGLE proposes exactly its acceptance) reads the step's
    acceptance, and the same perturbations catch it: the LEAKY control."""
    rng = np.random.default_rng(3)
    kmax = 6
    changed = checked = 0
    for r in range(6):
        L = int(rng.integers(30, 60))
        acc, dl, conf = _random_request(rng, L, kmax)
        ng_acc = np.minimum(np.where(dl > 0, rng.integers(1, kmax + 2, L), 1), L - np.arange(L))

        def trace(acc, dl, conf, ng_acc):
            return Trace.from_arrays({"x": {"eagle": acc.tolist(), "ngram": ng_acc.tolist()}}, prompt_lens={"x": 40},
                                     dataset="code-edit", model="m", k_max=kmax,
                                     draft_lens={"x": {"ngram": dl.tolist()}},
                                     confidences={"x": {"eagle": np.round(conf * 254) / 254}})

        base = _decisions(trace(acc, dl, conf, ng_acc), policy, cm, props)
        starts = {j: comp for j, _k, comp in base}
        for s, (j, _k, _c) in enumerate(base):
            for _ in range(3):
                A, D, Cf, N = acc.copy(), dl.copy(), conf.copy(), ng_acc.copy()
                A[j:] = np.minimum(rng.integers(1, kmax + 2, L - j), L - np.arange(j, L))
                N[j:] = np.minimum(rng.integers(1, kmax + 2, L - j), L - np.arange(j, L))
                D[j + 1:] = rng.integers(0, kmax + 1, L - j - 1)
                for q in range(L):
                    seen = starts.get(q, 0) if q <= j else 0
                    Cf[q, seen:] = rng.choice([0.1, 0.3, 0.5, 0.7, 0.9, 1.0], kmax - seen)
                got = _decisions(trace(A, D, Cf, N), policy, cm, props)
                checked += 1
                changed += got[:s + 1] != base[:s + 1]
    assert checked > 100
    if "oracle" in policy:
        assert changed > checked // 4      # the look-ahead is caught
    else:
        assert changed == 0


def test_no_confidence_is_one_clear_error(cm, tmp_path):
    t = hand_trace()
    no = Trace(t.acc.drop(columns=["confidence"]), t.requests, t.meta)
    with pytest.raises(SimulationError, match="has no confidence for 'eagle'"):
        simulate(no, cm, "ngram,eagle", "ngram-else-eagle-skip-conf", progress=False)
    simulate(no, cm, "ngram,eagle", "ngram-else-eagle-skip-conf-3-oracle-3", progress=False)   # the ceiling needs none
    with pytest.raises(SimulationError, match="one model proposer"):
        simulate(t, cm, "ngram,eagle", "conf-stop-0.4-3", progress=False)
    with pytest.raises(SimulationError, match="k_max = 3"):
        simulate(t, cm, "eagle", "conf-stop-0.4-8", progress=False)
    q = tmp_path / "no-confidence.parquet"             # a trace from before the column (read as it was written)
    no.to_parquet(q)
    r = subprocess.run([sys.executable, "-m", "spec_repro.cli", "simulate", "--traces", str(q), "--proposers",
                        "ngram,eagle", "--policy", "ngram-else-eagle-skip-conf", "--cost-model",
                        "qwen2.5-coder-1.5b-h200", "--no-progress"], capture_output=True, text=True, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1 and "has no confidence for 'eagle'" in lines[0], r.stderr


def test_against_the_tuned_rule_on_the_committed_smollm2_traces():
    """Every SmolLM2 workload: the rule's pair, T and K chosen on the other workloads; the perfect stop bounds the
    confidence stop (same KN), and nothing causal is far from the tuned rule."""
    from spec_repro.grids import confidence_table, cost_model_for
    from spec_repro.paths import load_traces

    t = load_traces(None, model="smollm2")
    cmx, _ = cost_model_for(t, "llama3.1-8b-h100-per-token")
    tab = confidence_table(t, cmx)
    assert len(tab) == 5 and tab.rule_config.str.startswith("ngram-else-eagle-skip-").all()
    assert (tab.ceiling_config.str.contains("-oracle-")).all() and tab.conf_stop.notna().all()
    same_kn = tab.skip_conf_config.str.split("-").str[5] == tab.ceiling_config.str.split("-").str[5]
    assert (tab.skip_conf[same_kn] <= tab.ceiling[same_kn]).all() and (tab.ceiling_x_rule > 1).all()
    assert tab.skip_conf_x_rule.between(0.9, 1.1).all()
