"""The vLLM step-timing plugin's pure parts (no vLLM, no GPU): phase arithmetic, step shape from a scheduler
output, row building against the step schema, version/layout checks, and the n-gram replica of vLLM's proposer."""
import json
import os
import random
import types

import pytest

from spec_repro.engines.vllm import hybrid as H
from spec_repro.engines.vllm import plugin as vp
from spec_repro.engines.vllm.agreement import ngram_propose, predict_ngram_steps
from spec_repro.traces import TraceError, validate_steps
import pandas as pd


def _sched(new=(), cached=(), spec=None):
    """A SchedulerOutput-shaped namespace: new = [(req_id, prompt_ids, n_sched)],
    cached = [(req_id, num_computed, num_output, n_sched)]."""
    nsched = {r: n for r, _, n in new}
    nsched.update({r: n for r, _, _, n in cached})
    return types.SimpleNamespace(
        scheduled_new_reqs=[types.SimpleNamespace(req_id=r, prompt_token_ids=p, num_computed_tokens=0)
                            for r, p, _ in new],
        scheduled_cached_reqs=types.SimpleNamespace(req_ids=[c[0] for c in cached],
                                                    num_computed_tokens=[c[1] for c in cached],
                                                    num_output_tokens=[c[2] for c in cached]),
        num_scheduled_tokens=nsched, total_num_scheduled_tokens=sum(nsched.values()),
        scheduled_spec_decode_tokens=spec or {})


@pytest.mark.parametrize("so", [
    _sched(cached=[("a", 10, 3, 4), ("b", 12, 5, 4)], spec={"a": [1, 2, 3], "b": [4, 5, 6]}),     # decode
    _sched(cached=[("a", 10, 3, 1), ("b", 12, 5, 1)]),                                            # decode, no SD
    _sched(new=[("c", [1, 2, 3], 3)], cached=[("a", 10, 3, 4)], spec={"a": [1, 2, 3]}),           # mixed
    _sched(new=[("c", [1, 2, 3], 3)]),                                                            # prefill
    _sched(cached=[("a", 10, 0, 1), ("b", 12, 5, 1)]),       # a 1-token prefill chunk beside a decode: mixed
    _sched(cached=[("a", 10, 3, 6), ("b", 12, 5, 1)], spec={"a": [1, 2, 3]}),   # 2 tokens past 1 + drafts
    _sched(cached=[("a", 10, 3, 2), ("b", 12, 5, 4)], spec={"a": [1, 2, 3], "b": [4, 5, 6]}),   # sums short
], ids=["decode", "decode-none", "mixed", "prefill", "chunk", "resumed", "short"])
def test_quick_meta_is_step_meta_on_every_kind_of_step(so):
    """The deferred timer's shape read at the step's start equals the row builder's (without its ``_spec``)."""
    want = {k: v for k, v in vp.step_meta(so).items() if k != "_spec"}
    assert vp.quick_meta(so) == want
    assert vp.quick_meta(so, detail=True) == {k: v for k, v in vp.step_meta(so, detail=True).items() if k != "_spec"}


def test_phase_times_partition_the_step():
    marks = [("start", 0.0), ("fwd0", 0.001), ("fwd1", 0.007), ("samp0", 0.0072), ("samp1", 0.0075),
             ("draft0", 0.008), ("draft1", 0.0095), ("end", 0.010)]
    p = vp.phase_times(marks)
    assert p["t_verify"] == pytest.approx(0.006)
    assert p["t_reject"] == pytest.approx(0.0003)
    assert p["t_draft"] == pytest.approx(0.0015)
    assert p["t_total"] == pytest.approx(0.010)
    assert p["t_other"] == pytest.approx(0.010 - 0.006 - 0.0003 - 0.0015)


def test_phase_times_without_sd_has_no_draft():
    p = vp.phase_times([("start", 0.0), ("fwd0", 0.0005), ("fwd1", 0.004), ("samp0", 0.004), ("samp1", 0.0041),
                        ("end", 0.0045)])
    assert p["t_draft"] == 0.0 and p["t_verify"] == pytest.approx(0.0035)
    assert p["t_other"] == pytest.approx(0.0045 - 0.0035 - 0.0001)


def test_step_meta_decode_with_drafts():
    so = _sched(cached=[("a", 100, 5, 4), ("b", 50, 3, 1)], spec={"a": [1, 2, 3]})
    m = vp.step_meta(so, detail=True)
    assert m["batched_tokens"] == 5 and m["kv_tokens"] == 150 and m["num_reqs"] == 2
    assert m["num_draft_tokens"] == 3 and m["phase"] == "decode"
    assert m["req_info"] == {"a": [5, 4, 3], "b": [3, 1, 0]}


def test_step_meta_prefill_and_mixed():
    so = _sched(new=[("n", list(range(10)), 10)])
    m = vp.step_meta(so, detail=True)
    assert m["phase"] == "prefill" and m["kv_tokens"] == 0
    assert m["new_reqs"]["n"] == [10, vp.prompt_hash(range(10))]
    so = _sched(new=[("n", [1, 2, 3], 3)], cached=[("a", 20, 4, 1)])
    assert vp.step_meta(so)["phase"] == "mixed"


def test_build_row_validates_against_step_schema():
    so = _sched(cached=[("a", 100, 5, 4), ("b", 50, 3, 4)], spec={"a": [1, 2, 3], "b": [4, 5, 6]})
    meta = vp.step_meta(so)
    meta["step"] = 7
    phases = vp.phase_times([("start", 0.0), ("fwd0", 0.001), ("fwd1", 0.007), ("samp0", 0.007),
                             ("samp1", 0.0072), ("end", 0.008)])
    ctx = {"run_id": "r", "engine": "vllm", "model": "m", "method": "ngram", "k": 3, "batch_size": 2}
    # request a: 3 tokens out (2 accepted); b: 4 out (all 3 accepted)
    row = vp.build_row(ctx, meta, phases, (["a", "b"], [3, 4]))
    assert row["accepted_per_req"] == {"a": 2, "b": 3} and row["num_accepted_tokens"] == 5
    df = validate_steps(pd.DataFrame([json.loads(json.dumps(row))]))
    assert df.loc[0, "num_draft_tokens"] == 6 and df.loc[0, "step"] == 7
    assert "accepted_per_req" in df.columns and "phase" in df.columns


def test_build_row_keeps_the_hybrids_choices():
    """With the hybrid on, a step's row carries its choices (LiveHybrid.summary) and read_steps keeps them."""
    from spec_repro.engines.vllm import hybrid as H

    live = H.LiveHybrid(H.HybridPolicy("pr24344", 3))
    live.begin(["a", "b"], [[4], [9]], lambda r: [1, 2, 3, 4, 1, 2, 3])
    live.finish([[7, 7, 7], [8, 8, 8]])
    so = _sched(cached=[("a", 8, 1, 1), ("b", 8, 1, 1)])
    meta = {**vp.step_meta(so), "step": 0, "hybrid": live.summary(["a", "b"])}
    phases = vp.phase_times([("start", 0.0), ("fwd0", 0.001), ("fwd1", 0.005), ("draft0", 0.005),
                             ("draft1", 0.006), ("end", 0.007)])
    ctx = {"run_id": "r", "engine": "vllm", "model": "m", "method": "eagle", "k": 3, "batch_size": 2}
    row = json.loads(json.dumps(vp.build_row(ctx, meta, phases, (["a", "b"], [1, 1]))))
    assert row["hybrid"]["ngram"] == 1 and row["hybrid"]["eagle"] == 1
    assert row["hybrid"]["per_req"] == {"a": ["ngram", 3], "b": ["eagle", 3]}
    df = validate_steps(pd.DataFrame([row]))
    assert df.loc[0, "hybrid"]["ngram_tokens"] == 3


def test_build_row_broken_times_are_rejected_by_schema():
    so = _sched(cached=[("a", 10, 2, 1)])
    meta = vp.step_meta(so)
    ctx = {"run_id": "r", "engine": "vllm", "model": "m", "method": "none", "k": 0, "batch_size": 1}
    row = vp.build_row(ctx, meta, {"t_draft": 0.0, "t_verify": 0.01, "t_reject": 0.0, "t_other": 0.0,
                                   "t_total": 0.002}, (["a"], [1]))
    with pytest.raises(TraceError, match="t_total"):
        validate_steps(pd.DataFrame([row]))


def test_version_check():
    assert vp.check_version("0.25.0")[0] and vp.check_version("0.25.3")[0]
    ok, why = vp.check_version("0.26.0")
    assert not ok and "0.25.x" in why


def test_layout_check_names_missing_methods():
    class Runner:
        def execute_model(self, scheduler_output, intermediate_tensors=None): ...
        def sample_tokens(self, grammar_output): ...
        def _model_forward(self, **kw): ...
        def _sample(self, logits, spec_decode_metadata): ...
    probs = vp.check_layout(Runner)
    assert probs == ["Runner.propose_draft_token_ids is missing"]

    class Renamed(Runner):
        def propose_draft_token_ids(self, scheduler_output): ...
        def _sample(self, logits, metadata): ...
    assert vp.check_layout(Renamed) == ["Renamed._sample has no parameter 'spec_decode_metadata'"]


def test_register_is_noop_without_env(monkeypatch):
    monkeypatch.delenv(vp.ENV_PATH, raising=False)
    monkeypatch.delenv(vp.ENV_HYBRID, raising=False)
    monkeypatch.setitem(vp._state, "registered", False)
    vp.register()
    assert vp._state["registered"] is False


def test_register_is_noop_without_env_and_draft_flag(monkeypatch):
    monkeypatch.delenv(vp.ENV_PATH, raising=False)
    monkeypatch.delenv(vp.ENV_HYBRID, raising=False)
    monkeypatch.setenv(vp.ENV_DRAFT_CG, "0")
    monkeypatch.setitem(vp._state, "registered", False)
    vp.register()
    assert vp._state["registered"] is False


class _FakeEvent:
    """A CUDA event on a fake clock: record() stamps the clock's current time on the given stream."""
    clock = [0.0]

    def __init__(self, enable_timing=True):
        self.t, self.stream = None, None

    def record(self, stream=None):
        assert stream is not None, "v3 records on the step's stream, never a per-event lookup"
        self.t, self.stream = self.clock[0], stream

    def query(self):
        return self.t is not None

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3   # ms, like torch


def _fake_torch(streams):
    def current_stream():
        streams.append("s")
        return "s"
    return types.SimpleNamespace(cuda=types.SimpleNamespace(Event=_FakeEvent, current_stream=current_stream))


@pytest.mark.parametrize("defer", [False, True], ids=["drain", "deferred"])
def test_recorder_builds_rows_lazily_on_a_fake_clock(tmp_path, defer):
    """The recorder's whole path (begin, marks, end, drain, flush) with fake CUDA events: one stream lookup per
    step, the batch shape read when the row is built (deferred: at the step's start, no row before flush), and
    phase times equal to the clock's marks; steps and their events are reused, none allocated per step."""
    streams = []
    rec = vp.StepRecorder(str(tmp_path / "steps.jsonl"))
    rec._torch, rec._rank_ok = _fake_torch(streams), True
    rec.defer = defer
    rec.set_context(run_id="r", model="m", method="ngram", k=3, batch_size=2)
    clock = _FakeEvent.clock
    for step in range(3):
        so = _sched(cached=[("a", 10 + step, 3 + step, 4), ("b", 12 + step, 5 + step, 4)],
                    spec={"a": [1, 2, 3], "b": [4, 5, 6]})
        clock[0] = 0.0
        rec.begin(None, so)
        clock[0] = 0.001
        rec.mark("fwd0")
        clock[0] = 0.005
        rec.mark("fwd1")
        rec.mark("samp0")
        clock[0] = 0.0052
        rec.mark("samp1")
        rec.drain()
        clock[0] = 0.006
        rec.mark("draft0")
        clock[0] = 0.0065
        rec.mark("draft1")
        clock[0] = 0.007
        out = types.SimpleNamespace(req_ids=["a", "b"], sampled_token_ids=[[1, 2, 3, 4], [7]])
        rec.end(out)
    assert len(streams) == 3                       # one lookup per step
    if defer:
        assert len(rec.pending) == 3 and rec.rows_written == 0 and not rec._lines
        assert all(st.so is None and st.meta["phase"] == "decode" for st in rec.pending)   # no SchedulerOutput kept
    rec.flush()
    rows = [json.loads(x) for x in open(tmp_path / "steps.jsonl")]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for i, r in enumerate(rows):
        assert r["t_verify"] == pytest.approx(0.004) and r["t_reject"] == pytest.approx(0.0002)
        assert r["t_draft"] == pytest.approx(0.0005)
        assert r["t_total"] == pytest.approx(0.007 + r["t_sched"])
        assert r["kv_tokens"] == 22 + 2 * i and r["num_draft_tokens"] == 6 and r["phase"] == "decode"
        assert r["accepted_per_req"] == {"a": 3, "b": 0} and r["num_accepted_tokens"] == 3
    validate_steps(pd.DataFrame(rows))
    events = {id(e) for st in rec._free for e in st.evs}
    assert rec._free and not rec.pending and len(events) == 8 * len(rec._free)    # steps return to be reused
    assert len(rec._free) == (3 if defer else 2)  # drained: each step resolved at the next one's sampler


def test_draft_cudagraph_patch_initializes_keys_for_draft_models_only():
    calls = []

    class Drafter:
        def initialize_cudagraph_keys(self, mode):
            calls.append(mode)

    class Runner:
        def _check_and_update_cudagraph_mode(self, *a, **k):
            calls.append("orig")

    def runner(draft_model: bool):
        r = Runner()
        r.speculative_config = types.SimpleNamespace(uses_draft_model=lambda: draft_model)
        r.drafter = Drafter()
        r.compilation_config = types.SimpleNamespace(cudagraph_mode="FULL_AND_PIECEWISE")
        return r

    assert vp.patch_draft_cudagraphs(Runner) is True
    assert vp.patch_draft_cudagraphs(Runner) is False          # idempotent
    runner(True)._check_and_update_cudagraph_mode()
    assert calls == ["orig", "FULL_AND_PIECEWISE"]
    calls.clear()
    runner(False)._check_and_update_cudagraph_mode()           # EAGLE/MTP: vLLM's own path, untouched
    assert calls == ["orig"]


def _vllm_ngram_kmp(tokens, min_n, max_n, k):
    """vLLM 0.25's _find_longest_matched_ngram_and_propose_tokens, transcribed line by line (KMP on the
    reversed sequence) as an independent reference for ngram_propose."""
    total = len(tokens)
    if total < min_n:
        return []
    t = tokens[::-1]
    lps = [0] * max_n
    longest, position, prev, i = 0, 0, 0, 1
    while i < total:
        if t[prev] == t[i]:
            prev += 1
            if prev >= longest:
                longest, position = prev, i
            if i < max_n:
                lps[i] = prev
            if prev == max_n:
                prev = lps[max_n - 1]
            i += 1
        elif prev != 0:
            prev = lps[prev - 1]
        else:
            i += 1
    if longest < min_n:
        return []
    start = total - 1 - position + longest
    k = min(k, total - start)
    return tokens[start:start + k]


@pytest.mark.parametrize("seed", range(6))
def test_ngram_propose_matches_vllm_algorithm(seed):
    rng = random.Random(seed)
    for _ in range(300):
        vocab = rng.choice([2, 3, 5, 20])
        toks = [rng.randrange(vocab) for _ in range(rng.randrange(1, 60))]
        lo = rng.randint(1, 4)
        hi = rng.randint(lo, 8)
        k = rng.randint(1, 10)
        assert ngram_propose(toks, lo, hi, k) == _vllm_ngram_kmp(toks, lo, hi, k), (toks, lo, hi, k)


def test_predict_ngram_steps_counts_leading_matches():
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    output = [1, 2, 3, 4, 5, 9, 9]
    # at p=3 the context ends with 1 2 3 -> earliest match at the prompt start -> drafts 4 5 6 7 (k=4)
    pred = predict_ngram_steps(prompt, output, [3], k=4, min_n=3, max_n=7)
    assert pred[3] == (4, 2)      # output[3:] = 4 5 9 ... -> 2 accepted
    assert predict_ngram_steps(prompt, output, [1], k=4)[1] == (0, 0)   # "8 1" has no 3-gram match


def test_hybrid_cuts_a_private_copy_of_the_scheduler_output(monkeypatch):
    """Async path: the placeholder slots are cut on a copy (the in-process executor shares the scheduler's own
    object, whose uncut counts its update_from_output needs), and prev_num_draft_len gets the slots scheduled."""
    import types

    seen = {}

    class Runner:
        def propose_draft_token_ids(self, scheduler_output, sampled_token_ids): ...
        def execute_model(self, scheduler_output, intermediate_tensors=None):
            self._update_states(scheduler_output)
            seen["so"] = scheduler_output
        def _update_states(self, scheduler_output):
            for r in scheduler_output.num_scheduled_tokens:   # as update_req_spec_token_ids
                self.requests[r].prev_num_draft_len = len(scheduler_output.scheduled_spec_decode_tokens.get(r, ()))

    monkeypatch.setenv(vp.ENV_HYBRID, "pr24344")
    monkeypatch.setitem(vp._state, "hybrid", None)
    assert vp.patch_hybrid(Runner)
    run = Runner()
    run.requests = {r: types.SimpleNamespace(prev_num_draft_len=0) for r in "abc"}
    so = types.SimpleNamespace(num_scheduled_tokens={"a": 4, "b": 4, "c": 1}, total_num_scheduled_tokens=9,
                               scheduled_spec_decode_tokens={"a": [-1] * 3, "b": [-1] * 3})
    run._spec_repro_valid = {"a": 1, "b": 0, "c": 2}
    run.execute_model(so)
    cut = seen["so"]
    assert cut is not so and cut.num_scheduled_tokens == {"a": 2, "b": 1, "c": 1}
    assert cut.scheduled_spec_decode_tokens == {"a": [-1]} and cut.total_num_scheduled_tokens == 4
    assert so.num_scheduled_tokens == {"a": 4, "b": 4, "c": 1} and so.total_num_scheduled_tokens == 9
    assert so.scheduled_spec_decode_tokens == {"a": [-1] * 3, "b": [-1] * 3}
    assert [run.requests[r].prev_num_draft_len for r in "abc"] == [3, 3, 0]
    run.execute_model(so)                    # nothing to cut: the scheduler's object goes through
    assert seen["so"] is so and run._spec_repro_valid is None


def _fake_runner(async_sched: bool, prompts: dict, k: int):
    """What ``hybrid_runner._hybrid_step`` reads of vLLM 0.25's V1 runner (names as in gpu_model_runner.py), on the CPU."""
    import types

    import numpy as np

    ids = list(prompts)
    width = max(map(len, prompts.values())) + 8
    tok = np.zeros((len(ids), width), np.int32)
    for i, r in enumerate(ids):
        tok[i, :len(prompts[r])] = prompts[r]
    calls = {"eagle": 0, "next_tokens": 0}

    def prepare_next_token_ids_padded(sampled, requests, ib, discard_gpu):
        calls["next_tokens"] += 1
        return "nxt", "cnt"

    run = types.SimpleNamespace(
        input_batch=types.SimpleNamespace(req_ids=ids, vocab_size=1000, token_ids_cpu=tok,
                                          num_tokens_no_spec=np.array([len(prompts[r]) for r in ids])),
        discard_request_mask=types.SimpleNamespace(np=np.zeros(len(ids), bool), gpu=None),
        use_async_scheduling=async_sched, device="cpu",
        requests={r: types.SimpleNamespace(prompt_token_ids=list(p)) for r, p in prompts.items()},
        valid_sampled_token_count_event=object() if async_sched else None,
        drafter=types.SimpleNamespace(prepare_next_token_ids_padded=prepare_next_token_ids_padded),
        _copy_valid_sampled_token_count=lambda nxt, cnt: None,
        speculative_config=types.SimpleNamespace(method="eagle", num_speculative_tokens=k))
    return run, calls


@pytest.mark.parametrize("pad", [False, True])
@pytest.mark.parametrize("async_sched", [False, True])
def test_hybrid_step_pads_every_draft_to_the_scheduled_width(monkeypatch, pad, async_sched):
    """The plugin's step (``_hybrid_step``) on a fake V1 runner: with SPEC_REPRO_HYBRID_PAD=1 every request's
    draft has num_spec_tokens_to_schedule tokens, as a list (synchronous) or as full valid counts of the [B, k]
    tensor (async: nothing for ``execute_model`` to trim, the scheduler's 1 + k counts go through); without it,
    n-gram's 4-token match and the no-match request (ngram-only) keep their lengths."""
    import torch

    from spec_repro.engines.vllm import hybrid as H

    k = 6
    monkeypatch.setenv(vp.ENV_HYBRID, "pr24344" if not async_sched else "ngram-only")
    if pad:
        monkeypatch.setenv(vp.ENV_HYBRID_PAD, "1")
    else:
        monkeypatch.delenv(vp.ENV_HYBRID_PAD, raising=False)
    monkeypatch.setitem(vp._state, "hybrid_error", None)
    prompts = {"a": [5, 6, 7, 8, 5, 6, 7], "b": [1, 2, 3]}
    run, calls = _fake_runner(async_sched, prompts, k)
    hy = vp._live_hybrid(run, os.environ[vp.ENV_HYBRID])
    assert hy is not None and hy.pad is pad and vp._state["hybrid_error"] is None
    sampled = torch.tensor([[8] + [-1] * k, [1] + [-1] * k])     # one token each (the last prefill chunk's)
    eagle = torch.tensor([[5, 6, 7, 8, 5, 6], [4, 4, 4, 4, 4, 4]], dtype=torch.int32)

    def orig(runner, so, sampled_token_ids, *a, **kw):
        calls["eagle"] += 1
        return eagle

    so = types.SimpleNamespace(finished_req_ids=set(), num_spec_tokens_to_schedule=k)
    out = vp._hybrid_step(run, hy, orig, so, sampled, (), {})
    if async_sched:     # ngram-only: EAGLE's drafting skipped, its next-token bookkeeping done instead
        assert calls == {"eagle": 0, "next_tokens": 1}
        assert tuple(out.shape) == (2, k)
        counts = run._spec_repro_valid
        drafts = H.unpack(out, [counts["a"], counts["b"]])
        assert drafts[0][:4] == [5, 6, 7, 8]
        if pad:
            assert counts == {"a": k, "b": k} and drafts[0] == [5, 6, 7, 8, 5, 6]   # n-gram's period
            nsched = {"a": 1 + k, "b": 1 + k}
            spec = {"a": [-1] * k, "b": [-1] * k}
            assert H.trim_scheduled(nsched, spec, counts)[0] == 0 and nsched == {"a": 1 + k, "b": 1 + k}
        else:
            assert counts == {"a": 4, "b": 0}
    else:               # pr24344: EAGLE drafted (b had no match); a's tail is EAGLE's continuation of 5 6 7 8
        assert calls["eagle"] == 1 and isinstance(out, list)
        assert out == ([[5, 6, 7, 8, 5, 6], [4] * k] if pad else [[5, 6, 7, 8], [4] * k])
    s = hy.summary()
    assert s["ngram_tokens"] == 4 and ("pad_tokens" in s) is pad
    if pad:
        assert s["pad_tokens"] == (2 + k if async_sched else 2)
        assert s["pad_by"] == ({"ngram": 2, "lookup": k} if async_sched else {"eagle": 2})


def _device_hybrid_runner(monkeypatch, installed="gpu-pr24344"):
    """A fake V1 runner class patched with the hybrid (``installed``), EAGLE drafting [[9]*4, [4]*4]; requests
    a (its context repeats "5 6 7") and b; returns (k, EAGLE's drafts, prompts, the runner)."""
    import torch

    k = 4
    eagle = torch.tensor([[9, 9, 9, 9], [4, 4, 4, 4]])

    class Runner:
        def propose_draft_token_ids(self, scheduler_output, sampled_token_ids):
            return eagle[: len(self.input_batch.req_ids)]

        def execute_model(self, scheduler_output, intermediate_tensors=None):
            return None

        def _update_states(self, scheduler_output):
            return None

    monkeypatch.setenv(vp.ENV_HYBRID, installed)
    monkeypatch.setitem(vp._state, "hybrid", None)
    monkeypatch.setitem(vp._state, "hybrid_now", None)
    monkeypatch.setitem(vp._state, "hybrid_installed", False)
    monkeypatch.setitem(vp._state, "hybrid_error", None)
    assert vp.patch_hybrid(Runner)
    prompts = {"a": [5, 6, 7, 8, 5, 6, 7], "b": [1, 2, 3]}
    fake, _ = _fake_runner(True, prompts, k)
    run = Runner()
    run.__dict__.update(vars(fake))
    run.max_num_reqs, run.max_model_len = 2, 64
    run.discard_request_mask = types.SimpleNamespace(gpu=torch.zeros(2, dtype=torch.bool))
    return k, eagle, prompts, run


def test_device_hybrid_step_on_a_fake_runner_frees_rows_told_in_a_step_without_drafting(monkeypatch):
    """The device-side hybrid through the patched runner (CPU tensors): n-gram's tokens for the request whose
    context repeats, EAGLE's for the other, draft probabilities cleared; then requests that finished are told in a
    step with no drafting (vLLM's batch-final step: execute_model, no propose), and a new batch as large as
    max_num_seqs still gets rows (the H200 run of 2026-12-02 died on 'more than 64 requests at once' before
    execute_model freed them)."""
    import types

    import torch

    k, eagle, prompts, run = _device_hybrid_runner(monkeypatch)
    run._draft_probs = "stale"
    so = types.SimpleNamespace(finished_req_ids=set(), num_spec_tokens_to_schedule=k)
    sampled = torch.tensor([[8] + [-1] * k, [1] + [-1] * k])
    out = run.propose_draft_token_ids(so, sampled)
    assert out.tolist() == [[5, 6, 7, 8], [4, 4, 4, 4]] and run._draft_probs is None
    hy = run._spec_repro_hybrid
    assert isinstance(hy, vp._DeviceHybrid) and hy.history.context("a") == prompts["a"] + [8]
    run.execute_model(types.SimpleNamespace(finished_req_ids={"a", "b"}))      # told without a drafting step
    assert hy.history.row_of == {}
    run.input_batch.req_ids = ["c", "d"]
    run.requests.update({r: types.SimpleNamespace(prompt_token_ids=[2, 3, 4, 2, 3]) for r in "cd"})
    out = run.propose_draft_token_ids(so, torch.tensor([[4] + [-1] * k, [1] + [-1] * k]))
    assert out.tolist() == [[2, 3, 4, 9], [4, 4, 4, 4]]   # c: "2 3 4" recurs, its 3 tokens then EAGLE's; d: none
    assert set(hy.history.row_of) == {"c", "d"}


def test_one_engine_switches_between_eagle_alone_idle_and_the_device_hybrids(monkeypatch):
    """``op="hybrid"`` (``set_hybrid``) on the fake runner: ``off`` is vLLM's EAGLE step untouched and uncounted,
    ``gpu-eagle-only`` EAGLE's tokens through the hybrid's machinery, ``gpu-pr24344`` n-gram's where the context
    repeats, ``idle`` vLLM's step counted; each policy keeps its own hybrid, and every device hybrid built frees
    the rows of finished requests whether active or not. Unknown names and a switch with no hybrid installed are
    refused."""
    import types

    import torch

    monkeypatch.setitem(vp._state, "hybrid_installed", False)
    monkeypatch.setitem(vp._state, "hybrid_now", None)
    with pytest.raises(ValueError, match="no hybrid installed"):
        vp.set_hybrid("idle")
    k, eagle, prompts, run = _device_hybrid_runner(monkeypatch)
    with pytest.raises(ValueError, match="hybrid policy 'gpu-pr2434'"):
        vp.set_hybrid("gpu-pr2434")
    so = types.SimpleNamespace(finished_req_ids=set(), num_spec_tokens_to_schedule=k)
    sampled = torch.tensor([[8] + [-1] * k, [1] + [-1] * k])
    got = {}
    for pol in ("off", "gpu-eagle-only", "gpu-pr24344", "idle"):
        vp.set_hybrid(pol)
        assert vp.status()["hybrid_now"] == pol
        got[pol] = run.propose_draft_token_ids(so, sampled)
    assert got["off"] is not None and got["off"].tolist() == eagle.tolist()
    assert got["gpu-eagle-only"].tolist() == eagle.tolist()
    assert got["gpu-pr24344"].tolist() == [[5, 6, 7, 8], [4, 4, 4, 4]]
    assert got["idle"].tolist() == eagle.tolist()
    built = run._spec_repro_hybrids
    assert set(built) == {"gpu-eagle-only", "gpu-pr24344", "idle"}           # "off" builds nothing
    assert isinstance(built["idle"], H.LiveHybrid) and run._spec_repro_hybrid is built["idle"]
    dev = [built["gpu-eagle-only"], built["gpu-pr24344"]]
    assert all(set(h.history.row_of) == {"a", "b"} for h in dev)
    run.execute_model(types.SimpleNamespace(finished_req_ids={"a", "b"}))     # idle active: both still freed
    assert all(h.history.row_of == {} for h in dev)
    vp.set_hybrid(None)                                    # back to the installed one
    assert vp.status()["hybrid_now"] == "gpu-pr24344"
    vp._hybrid_off("a policy failed")                      # one policy off: the others stay switchable
    vp.set_hybrid("off")
    assert vp.status()["hybrid_now"] == "off" and vp.status()["hybrid_error"] == "a policy failed"
