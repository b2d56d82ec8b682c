"""The baselines a user would run (spec_repro.baselines), per-drafted-token pricing with catch-up
(spec_repro.costmodel), and n-gram's match recomputed in the study's alignment (spec_repro.simcore). Hand-built
traces are SYNTHETIC; the alignment fixture is the committed Qwen code-edit trace rewritten in the study's
convention (its measured arrays shifted by one position)."""
import copy
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from spec_repro.costmodel import CostModel, Drafter, load_cost_model
from spec_repro.simcore import ngram_match
from spec_repro.simulate import SimulationError, _group_arrays, simulate
from spec_repro.traces import Trace
from spec_repro.tracefiles import read_trace

ROOT = Path(__file__).resolve().parents[1]
KMAX = 8


@pytest.fixture(scope="module")
def cm():
    return load_cost_model("llama3.1-8b-h100-per-token")


def tiny():
    """One request: n-gram matches (draft_len 8, acc 5) at positions 0..3, no match elsewhere; EAGLE acc 2."""
    L = 12
    ng_acc = [5, 5, 5, 5] + [1] * (L - 4)
    ng_dl = [8, 8, 8, 8] + [0] * (L - 4)
    return Trace.from_arrays({"x": {"ngram": ng_acc, "eagle": [3] * L}}, prompt_lens={"x": 100},
                             dataset="code-edit", model="m", k_max=KMAX, draft_lens={"x": {"ngram": ng_dl}})


def test_ngram_else_eagle_steps_and_charges(cm):
    """p=1 (j=0): n-gram matched, k=min(4, 8): 5 tokens -> p=6 (j=5): no match, EAGLE k=2: 3 tokens -> p=9 (j=8)
    -> 3 -> p=12 = L. Drafting: n-gram's fraction of F at the one matched step; EAGLE 2 tokens at every step
    (plain) or only at its two steps plus one catch-up forward at its re-entry (skip)."""
    t = tiny()
    df = simulate(t, cm, "ngram,eagle", ["ngram-else-eagle-4-2", "ngram-else-eagle-skip-4-2"], batch_sizes=[1],
                  progress=False).set_index("policy")
    assert (df["draft_cost"] == "ran").all()
    assert df.loc["ngram-else-eagle-4-2", "mean_tokens_per_step"] == pytest.approx(11 / 3)
    p = np.array([1, 6, 9])
    inp = np.array([5, 3, 3])
    kv = 100 + p
    F = cm.forward(kv, inp)
    e = cm.drafter("eagle")
    per_tok = e.c_kv * kv + e.c_tok * 1 + e.c0
    ng = cm.drafter("ngram").fraction * F[0]
    plain = ng + (2 * per_tok).sum()
    skip = ng + (2 * per_tok[1:]).sum() + per_tok[1]     # + one catch-up forward at p = 6
    for pol, want in (("ngram-else-eagle-4-2", plain), ("ngram-else-eagle-skip-4-2", skip)):
        r = df.loc[pol]
        assert r.draft_share * r.sd_time_s == pytest.approx(want, rel=1e-12)
    no_catch = copy.deepcopy(cm)
    no_catch.drafters["eagle"].catch_up = 0.0
    r = simulate(t, no_catch, "ngram,eagle", "ngram-else-eagle-skip-4-2", batch_sizes=[1], progress=False).iloc[0]
    assert r.draft_share * r.sd_time_s == pytest.approx(skip - per_tok[1], rel=1e-12)


def test_switch_and_dynamic_k_errors_and_equivalence(cm):
    t = tiny()
    with pytest.raises(SimulationError, match="takes n-gram and one model proposer"):
        simulate(t.select(proposers=["eagle"]), cm, "eagle", "ngram-else-eagle", progress=False)
    with pytest.raises(SimulationError, match="needs a table"):
        simulate(t, cm, "eagle", "dynamic-k", progress=False)
    with pytest.raises(SimulationError, match="duplicate batching only"):
        simulate(t, cm, "eagle", "dynamic-k", batching="mixed", dynamic_k={1: 3}, progress=False)
    with pytest.raises(SimulationError, match="measured acceptance only up to"):
        simulate(t, cm, "ngram,eagle", "ngram-else-eagle-4-9", progress=False)
    dyn = simulate(t, cm, "eagle", "dynamic-k", batch_sizes=[1, 8, 64], dynamic_k={1: 4, 8: 2, 64: 1},
                   progress=False)
    assert dyn["policy"].tolist() == ["dynamic-k (k=4)", "dynamic-k (k=2)", "dynamic-k (k=1)"]
    for B, k in ((1, 4), (8, 2), (64, 1)):
        fx = simulate(t, cm, "eagle", f"fixed-{k}", batch_sizes=[B], progress=False).iloc[0]
        assert dyn.set_index("batch_size").loc[B, "speedup"] == pytest.approx(fx.speedup, rel=1e-12)


def test_per_token_drafter_fields_round_trip_and_price():
    d = Drafter("per_token", c_kv=1e-9, c_tok=2e-6, c0=5e-4, c_step=3e-4, catch_up=1.0)
    assert d.time(1000, 4, 0.01, 2, np.array([0, 3])).tolist() == pytest.approx([0.0, 3e-4 + 3 * (1e-6 + 4e-6 + 5e-4)])
    cm = CostModel("x", 1e-8, 2e-5, 5e-3, 1e-3, {"eagle": d})
    back = CostModel.from_dict(cm.to_dict())
    assert back.drafter("eagle") == d
    assert "re-entry" in back.summary() and "0.0003 + proposal * (1e-09*kv" in back.summary()
    study = load_cost_model("llama3.1-8b-h100").drafter("eagle")
    per = load_cost_model("llama3.1-8b-h100-per-token").drafter("eagle")
    # anchored at the study's k = 3: the same drafting time there (kv = 1000, one request), a third of it per token
    assert per.time(1000, 4, 0.0, 1, 3) == pytest.approx(study.time(1000, 4, 0.0, 1, 3), rel=1e-12)
    assert per.time(1000, 17, 0.0, 1, 16) > 4 * study.time(1000, 17, 0.0, 1, 16)


def test_winner_accounting_charges_catch_up_on_re_entry(cm):
    """Oracle Combine `winner`: EAGLE pays only where it wins, and one catch-up forward where it wins again after
    n-gram won the request's previous step."""
    L = 12
    t = Trace.from_arrays({"x": {"ngram": [5, 1, 1, 1, 1, 5, 1, 1, 1, 1, 1, 1], "eagle": [2] * L}},
                          prompt_lens={"x": 100}, dataset="code-edit", model="m", k_max=KMAX)
    r = simulate(t, cm, "ngram,eagle", "oracle-combine", "winner", batch_sizes=[1], progress=False).iloc[0]
    # steps: p=1 ngram (5) -> p=6 ngram (5) -> p=11 eagle (2) -> done at 13 >= 12
    p = np.array([1, 6, 11])
    inp = np.array([5, 5, 2])
    kv = 100 + p
    F = cm.forward(kv, inp)
    e = cm.drafter("eagle")
    per_tok = e.c_kv * kv + e.c_tok + e.c0
    want = cm.drafter("ngram").fraction * F[:2].sum() + per_tok[2] * 1 + per_tok[2]
    assert r.draft_share * r.sd_time_s == pytest.approx(want, rel=1e-12)


def _study_convention(tmp_path, n=20):
    """The committed Qwen code-edit trace in the study's convention: its acc[j] (draft from prompt + output[:j+1])
    becomes the study's acc[j + 1] (draft from prompt + output[:j + 1]); acc[0], the draft from the prompt alone,
    comes from vLLM's lookup on the prompt."""
    from spec_repro.proposers.ngram import ngram_lookup

    t = read_trace(ROOT / "data" / "traces" / "qwen2.5-coder-1.5b__code-edit.parquet")
    t = t.select(proposers=["ngram", "eagle"])
    keep = t.requests["request_id"].tolist()[:n]
    recs = []
    for rid in keep:
        r = t.requests[t.requests.request_id == rid].iloc[0]
        pr, ou = list(r.prompt_token_ids), list(r.output_token_ids)
        a = t.acc[t.acc.request_id == rid]
        ng = a[a.proposer == "ngram"].sort_values("position").acc_len.tolist()
        ea = a[a.proposer == "eagle"].sort_values("position").acc_len.tolist()
        d = ngram_lookup(pr, 16)
        a0 = 1
        while a0 - 1 < len(d) and a0 - 1 < len(ou) and d[a0 - 1] == ou[a0 - 1]:
            a0 += 1
        recs.append({"id": rid, "prompt_token_ids": pr, "generated_token_ids": ou,
                     "acc_ngram": {"acc_len": [a0] + ng[:-1]}, "acc_eagle": {"acc_len": [1] + ea[:-1]}})
    path = tmp_path / "combined_code-edit.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return t, read_trace(path, model="m", k_max=16)


def test_study_alignment_is_recognized_and_reproduces_the_published_acc_len(tmp_path):
    """Recomputed from the ids in the study's alignment, the lookup reproduces >= 99.5% of acc_ngram; one position
    later (the package's own alignment, which sees the token the step verifies) far fewer. Fixed-k n-gram then
    proposes what the lookup proposes, not the random match model."""
    pkg, pub = _study_convention(tmp_path)
    sub = pub.select(proposers=["ngram", "eagle"])
    reqs = _group_arrays(sub.acc, sub.requests, ["ngram", "eagle"], sub.requests.request_id.tolist())
    m = ngram_match(reqs, sub.requests, 0, 16)
    assert m.alignment == "study" and m.agreement["study"] >= 0.995 and m.agreement["package"] < 0.9
    # the package's own trace: its recorded draft_len, and recomputed it is the package alignment
    psub = pkg.select(proposers=["ngram", "eagle"])
    preqs = _group_arrays(psub.acc, psub.requests, ["ngram", "eagle"], pub.requests.request_id.tolist())
    assert ngram_match(preqs, psub.requests, 0, 16).alignment == "recorded"
    preqs.dlen[:] = -1
    pm = ngram_match(preqs, psub.requests, 0, 16)
    assert pm.alignment == "package" and pm.agreement["package"] >= 0.995
    np.testing.assert_array_equal(pm.lens, np.minimum(
        _group_arrays(psub.acc, psub.requests, ["ngram"], pub.requests.request_id.tolist()).dlen[0], 16))
    # the study's lens at j + 1 are the package's at j (the same contexts)
    off = reqs.off
    for r in range(len(reqs.ids)):
        a, b = off[r], off[r + 1]
        np.testing.assert_array_equal(m.lens[a + 1:b], pm.lens[a:b - 1])
    lookup = simulate(pub.select(proposers=["ngram"]), "llama3.1-8b-h100", "ngram", "fixed-8", progress=False)
    rand = simulate(pub.select(proposers=["ngram"]), "llama3.1-8b-h100", "ngram", "fixed-8", ngram_match="random",
                    ngram_match_prob=0.8, progress=False)
    assert lookup.speedup.iloc[0] != rand.speedup.iloc[0]
    no_ids = Trace(pub.acc, pub.requests.drop(columns=["prompt_token_ids", "output_token_ids"]), pub.meta)
    fallback = simulate(no_ids.select(proposers=["ngram"]), "llama3.1-8b-h100", "ngram", "fixed-8",
                        ngram_match_prob=0.8, progress=False)
    assert fallback.speedup.iloc[0] == pytest.approx(rand.speedup.iloc[0], rel=1e-12)
    with pytest.raises(SimulationError, match="token ids"):
        simulate(no_ids, "llama3.1-8b-h100-per-token", "ngram,eagle", "ngram-else-eagle", progress=False)


def test_random_ids_are_not_taken_for_matches():
    """Synthetic fixtures carry random token ids: they do not reproduce acc_ngram, so no lengths come back."""
    t = read_trace(ROOT / "tests" / "fixtures" / "published" / "combined_instructcoder.jsonl")
    sub = t.select(proposers=["ngram", "eagle"])
    reqs = _group_arrays(sub.acc, sub.requests, ["ngram", "eagle"], sub.requests.request_id.tolist())
    m = ngram_match(reqs, sub.requests, 0, int(sub.acc.k_max.max()))
    assert m.lens is None and "do not belong" in m.why


def test_cli_switch_and_dynamic_k(tmp_path):
    import subprocess
    import sys

    trace = ROOT / "data" / "traces" / "smollm2-135m__code-edit.parquet"
    out = tmp_path / "o.csv"
    run = lambda *a: subprocess.run([sys.executable, "-m", "spec_repro.cli", "simulate", "--traces", str(trace),
                                     "--no-progress", "--out", str(out), *a], capture_output=True, text=True,
                                    timeout=180, check=False)
    r = run("--proposers", "ngram,eagle", "--policy", "ngram-else-eagle-16-2", "ngram-else-eagle-skip-16-2",
            "--cost-model", "llama3.1-8b-h100-per-token", "--batch-sizes", "1", "16")
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(out)
    assert len(df) == 4 and set(df.draft_cost) == {"ran"}
    r = run("--proposers", "eagle", "--policy", "dynamic-k", "--dynamic-k", "1:3", "16:1", "--batch-sizes", "1", "16")
    assert r.returncode == 0, r.stderr
    assert pd.read_csv(out).policy.tolist() == ["dynamic-k (k=3)", "dynamic-k (k=1)"]
    bad = run("--proposers", "eagle", "--policy", "dynamic-k", "--dynamic-k", "1-3")
    assert bad.returncode != 0 and bad.stderr.strip().startswith("error: ") and len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("oracle", [False, True])
def test_compiled_walk_takes_the_lockstep_walks_steps(oracle):
    from spec_repro.simcore import walk_compiled, walk_lockstep

    rng = np.random.default_rng(3)
    L = rng.integers(1, 60, 40)
    off = np.r_[0, np.cumsum(L)]
    a = rng.integers(1, 9, off[-1])
    prop = rng.integers(0, 8, off[-1])
    for x, y in zip(walk_compiled(a, prop, off, oracle), walk_lockstep(a, prop, off, oracle)):
        np.testing.assert_array_equal(x, y)


def test_ngram_match_is_kept_on_disk_by_content(tmp_path, monkeypatch):
    """A recomputed match is kept under $SPEC_REPRO_CACHE/ngram/: a new process (here: the in-process cache
    emptied) reads it instead of running the lookup, with the same lengths, alignment and agreement; an
    altered entry is computed again; SPEC_REPRO_TRACE_CACHE=0 keeps nothing."""
    import spec_repro.proposers.ngram as ngram_mod
    import spec_repro.simcore as simcore

    monkeypatch.setenv("SPEC_REPRO_CACHE", str(tmp_path / "cache"))
    _pkg, pub = _study_convention(tmp_path)
    sub = pub.select(proposers=["ngram", "eagle"])
    reqs = _group_arrays(sub.acc, sub.requests, ["ngram", "eagle"], sub.requests.request_id.tolist())
    simcore._MATCH_CACHE.clear()
    m = ngram_match(reqs, sub.requests, 0, 16)
    entries = sorted((tmp_path / "cache" / "ngram").glob("*.npz"))
    assert len(entries) == 1 and entries[0].with_suffix(".sha256").is_file()
    real = ngram_mod.ngram_lookup_batch

    def refuse(*a, **k):
        raise AssertionError("the lookup ran again")

    monkeypatch.setattr(ngram_mod, "ngram_lookup_batch", refuse)
    simcore._MATCH_CACHE.clear()
    again = ngram_match(reqs, sub.requests, 0, 16)
    np.testing.assert_array_equal(again.lens, m.lens)
    assert (again.alignment, again.agreement, again.why) == (m.alignment, m.agreement, m.why)
    assert again.lens.dtype == np.int64 and not again.lens.flags.writeable
    # other content (another k) is another entry
    with pytest.raises(AssertionError, match="ran again"):
        ngram_match(reqs, sub.requests, 0, 15)
    # an altered entry is not trusted: computed again and replaced
    entries[0].write_bytes(entries[0].read_bytes()[:-8] + b"\0" * 8)
    simcore._MATCH_CACHE.clear()
    with pytest.raises(AssertionError, match="ran again"):
        ngram_match(reqs, sub.requests, 0, 16)
    monkeypatch.setattr(ngram_mod, "ngram_lookup_batch", real)
    simcore._MATCH_CACHE.clear()
    np.testing.assert_array_equal(ngram_match(reqs, sub.requests, 0, 16).lens, m.lens)
    monkeypatch.setenv("SPEC_REPRO_CACHE", str(tmp_path / "off"))
    monkeypatch.setenv("SPEC_REPRO_TRACE_CACHE", "0")
    simcore._MATCH_CACHE.clear()
    np.testing.assert_array_equal(ngram_match(reqs, sub.requests, 0, 16).lens, m.lens)
    assert not (tmp_path / "off" / "ngram").exists()
