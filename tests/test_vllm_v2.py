"""The plugin on vLLM 0.25's V2 model runner without vLLM or a GPU: the contract (v2_contract.json against the patch
modules' wrapped names, the guard refusing a different signature), the step timer's wrappers on stand-in classes
with V2's exact signatures (fake CUDA events), the hybrid's merge on V2's tensor shapes against the package's
n-gram lookup and the host-side hybrid, the lagged skip gate, and the jobs' V2 specs and plan."""
import json
import os
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from spec_repro.engines.vllm import hybrid as H  # noqa: E402
from spec_repro.engines.vllm import hybrid_v2 as HV  # noqa: E402
from spec_repro.engines.vllm import runner_v2_patches as RV  # noqa: E402
from spec_repro.engines.vllm import step_timer, v2_contract as C  # noqa: E402
from spec_repro.engines.vllm.state import _state  # noqa: E402
from spec_repro.proposers.ngram import ngram_lookup  # noqa: E402
from spec_repro.traces import validate_steps  # noqa: E402

K = 3


# ---- stand-ins for V2's classes, with vLLM 0.25.0's parameter names ---------------------------------------------
class FakeSpeculator:
    def __init__(self, max_reqs, k):
        self.draft_tokens = torch.zeros(max_reqs, k, dtype=torch.int64)
        self.speculative_config = types.SimpleNamespace(method="eagle")
        self.draft_logits = None
        self.max_model_len = 64
        self.decode_calls = 0
        self.next = 0

    def propose(self, input_batch, attn_metadata, slot_mappings, last_hidden_states, aux_hidden_states, num_sampled,
                num_rejected, last_sampled, next_prefill_tokens, temperature, seeds, num_tokens_across_dp=None,
                dummy_run=False, skip_attn_for_dummy_run=False, mm_inputs=None, is_profile=False):
        n = input_batch.num_reqs
        self.next += 1
        self.draft_tokens[:n, 0] = 40 + self.next          # "EAGLE's" tokens: 40+ (the contexts use 0..4)
        self._multi_step_decode(n, False, None, None)
        return self.draft_tokens[:n]

    def _multi_step_decode(self, num_reqs, skip_attn, batch_desc, num_tokens_across_dp):
        self.decode_calls += 1
        self.draft_tokens[:num_reqs, 1:] = 50 + self.next


class FakeSampler:
    def __call__(self, logits, input_batch):
        return "sampled"


class FakeRejectionSampler:
    def __call__(self, logits, input_batch, draft_logits=None):
        return "rejection-sampled"


class FakeAsyncOutput:
    def __init__(self, req_ids, sampled):
        self.req_ids, self.sampled = req_ids, sampled

    def get_output(self):
        return types.SimpleNamespace(req_ids=self.req_ids, sampled_token_ids=self.sampled)


class FakeRunner:
    """Runs one step as V2's execute_model + sample_tokens order their calls."""

    def __init__(self, vllm_config, device):
        self.req_states = types.SimpleNamespace(
            all_token_ids=types.SimpleNamespace(gpu=torch.zeros(8, 64, dtype=torch.int32)),
            total_len=types.SimpleNamespace(gpu=torch.zeros(8, dtype=torch.int32)),
            draft_tokens=torch.zeros(8, K, dtype=torch.int64))
        self.speculator = FakeSpeculator(8, K)
        self.sampler, self.rejection_sampler = FakeSampler(), FakeRejectionSampler()
        self.step_input = None

    def execute_model(self, scheduler_output, intermediate_tensors=None, dummy_run=False,
                      skip_attn_for_dummy_run=False, is_profile=False):
        self.prepare_attn(self.step_input)
        return None

    def prepare_attn(self, input_batch):
        return (), None

    def sample_tokens(self, grammar_output):
        ib, new = self.step_input
        (self.rejection_sampler if ib.num_draft_tokens else self.sampler)(None, ib)
        rs = self.req_states
        for b, toks in enumerate(new):                         # post_update: tokens at total_len, total_len += n
            slot = int(ib.idx_mapping[b])
            t0 = int(rs.total_len.gpu[slot])
            rs.all_token_ids.gpu[slot, t0:t0 + len(toks)] = torch.tensor(toks, dtype=torch.int32)
            rs.total_len.gpu[slot] = t0 + len(toks)
        d = self.speculator.propose(ib, None, None, None, None, None, None, None, None, None, None)
        rs.draft_tokens[ib.idx_mapping.long()] = d
        return FakeAsyncOutput(ib.req_ids, new)


MODS = {C.V2_RUNNER_MODULE: {"GPUModelRunner": FakeRunner},
        C.V2_SPEC_MODULE: {"AutoRegressiveSpeculator": FakeSpeculator},
        C.V2_SAMPLER_MODULE: {"Sampler": FakeSampler},
        C.V2_REJECTION_MODULE: {"RejectionSampler": FakeRejectionSampler},
        C.V2_ASYNC_MODULE: {"AsyncOutput": FakeAsyncOutput}}


def _classes():
    return RV.v2_classes({m: types.SimpleNamespace(**c) for m, c in MODS.items()})


@pytest.fixture
def clean(monkeypatch):
    """The plugin's process state and class attributes restored after each test."""
    saved = {n: dict(c.__dict__) for n, c in _classes().items()}
    monkeypatch.setattr(step_timer, "_REC", [None, None])
    for key in ("runner", "v2_patched", "v2_disabled_reason", "hybrid", "hybrid_error", "hybrid_now",
                "hybrid_installed"):
        monkeypatch.setitem(_state, key, {"v2_patched": False, "hybrid_installed": False}.get(key))
    monkeypatch.setitem(RV._V2, "classes", {})
    monkeypatch.setitem(RV._V2, "orig", {})
    monkeypatch.setitem(RV._TOGGLE, "block", 0)
    yield
    RV.clock_reset()
    for n, cls in _classes().items():
        for meth, fn in saved[n].items():
            if callable(fn) and cls.__dict__.get(meth) is not fn:
                setattr(cls, meth, fn)


# ---- the contract ----------------------------------------------------------------------------------------------
def test_contract_lists_exactly_what_the_patches_wrap():
    con = C.load()
    assert con["vllm"] == "0.25.0"
    keys = [f"{m}:{q}" for m, q in C.V2_WRAPPED]
    assert list(con["wrapped"]) == keys
    assert set(RV.TIMER_WRAPPED) | set(HV.HYBRID_WRAPPED) == set(keys)
    assert {k.split(":")[1] for k in RV.TIMER_WRAPPED} == set(RV._WRAPPERS)
    for key, e in con["wrapped"].items():
        assert e["module"] + ":" + e["qualname"] == key and e["params"][0] == "self"
        assert e["file"] == e["module"].replace(".", "/") + ".py" and e["line"] > 0


def test_stand_ins_match_the_contract_and_a_changed_signature_is_refused(clean):
    """The stand-ins carry vLLM 0.25.0's parameters (the contract check passes on them); a class whose method
    differs makes install() wrap nothing and say why in one line."""
    classes = _classes()
    assert C.check(classes) == []

    class OtherSampler:
        def __call__(self, logits, batch):      # a different vLLM: renamed parameter
            return None

    bad = {**classes, f"{C.V2_SAMPLER_MODULE}:Sampler": OtherSampler}
    before = dict(FakeRunner.__dict__)
    assert RV.install(bad) is False
    assert "Sampler.__call__" in _state["v2_disabled_reason"] and "differs" in _state["v2_disabled_reason"]
    assert dict(FakeRunner.__dict__) == before and _state["v2_patched"] is False
    missing = {k: v for k, v in classes.items() if "AsyncOutput" not in k}
    assert any("AsyncOutput.get_output is missing" in p for p in C.check(missing, names=RV.TIMER_WRAPPED))


# ---- the step timer on V2 ---------------------------------------------------------------------------------------
class _Ev:
    clock = [0.0]

    def __init__(self, enable_timing=True):
        self.t = None

    def record(self, stream=None):
        self.t = self.clock[0]
        self.stream = stream

    def query(self):
        return self.t is not None

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


def _batch(req_ids, slots, n_draft, ub):
    return types.SimpleNamespace(req_ids=list(req_ids), num_reqs=len(req_ids),
                                 idx_mapping=torch.tensor(slots, dtype=torch.int32), num_draft_tokens=n_draft,
                                 seq_lens_cpu_upper_bound=torch.tensor(ub, dtype=torch.int32))


def _so(req_ids, k, first=False):
    n = {r: (4 if first else 1 + k) for r in req_ids}
    return types.SimpleNamespace(
        scheduled_new_reqs=[types.SimpleNamespace(req_id=r, prompt_token_ids=[1, 2, 3, 4], num_computed_tokens=0)
                            for r in req_ids] if first else [],
        scheduled_cached_reqs=types.SimpleNamespace(req_ids=[] if first else list(req_ids),
                                                    num_computed_tokens=[4] * (0 if first else len(req_ids)),
                                                    num_output_tokens=[1] * (0 if first else len(req_ids))),
        num_scheduled_tokens=n, total_num_scheduled_tokens=sum(n.values()),
        scheduled_spec_decode_tokens={} if first else {r: [-1] * k for r in req_ids}, finished_req_ids=set())


def _step(run, so, batch, new):
    run.step_input = (batch, new)
    assert run.execute_model(so) is None
    return run.sample_tokens(None)


def _one_request_steps(n: int, each=None) -> None:
    """``n`` steps of one request on a stand-in runner (a prefill, then decode steps of k drafts), step t's async
    output read after step t + 1 was sampled, as async scheduling does; ``each`` called after every step."""
    run, prev = FakeRunner(None, "cpu"), None
    for i in range(n):
        _Ev.clock[0] = float(i)
        out = _step(run, _so(["a"], K, first=i == 0), _batch(["a"], [3], 0 if i == 0 else K, [5]),
                    [[1]] if i == 0 else [[1, 2]])
        if prev is not None:
            prev.get_output()
        prev = out
        if each is not None:
            each()
    prev.get_output()


def test_v2_timer_records_on_the_runners_cached_stream(clean, tmp_path):
    """V2's runner caches the stream it runs on (``main_stream``, a cached_property): the deferred timer records its
    events there without looking the current stream up each step; a runner without it: the current stream."""
    rec = step_timer.StepRecorder(str(tmp_path / "steps.jsonl"))
    rec._torch = types.SimpleNamespace(cuda=types.SimpleNamespace(Event=_Ev, current_stream=lambda: "current"))
    rec._rank_ok = True
    step_timer._REC[:] = [os.getpid(), rec]
    assert RV.install(_classes()) is True and rec.defer
    run = FakeRunner(None, "cpu")
    _step(run, _so(["a"], K, first=True), _batch(["a"], [7], 0, [5]), [[1]])
    assert {e.stream for e in rec.pending[-1].evs} == {"current"}
    run.__dict__["main_stream"] = "main"
    _step(run, _so(["a"], K), _batch(["a"], [7], K, [5]), [[1, 2]])
    assert {e.stream for e in rec.pending[-1].evs} == {"main"}


def test_v2_timer_rows_and_instrument_off_restores_vllms_methods(clean, tmp_path):
    rec = step_timer.StepRecorder(str(tmp_path / "steps.jsonl"))
    rec._torch = types.SimpleNamespace(cuda=types.SimpleNamespace(Event=_Ev, current_stream=lambda: "s"))
    rec._rank_ok = True
    step_timer._REC[:] = [os.getpid(), rec]
    classes = _classes()
    origs = {k: classes[k.rsplit(".", 1)[0]].__dict__[k.rsplit(".", 1)[1]] for k in RV.TIMER_WRAPPED}
    assert RV.install(classes) is True and _state["v2_patched"]
    run = FakeRunner(None, "cpu")
    prev = None
    for i in range(3):
        _Ev.clock[0] = float(i)
        so = _so(["a", "b"], K, first=i == 0)
        out = _step(run, so, _batch(["a", "b"], [7, 6], 0 if i == 0 else 2 * K, [5, 5]),
                    [[1], [2]] if i == 0 else [[1, 2, 3], [4]])
        if prev is not None:         # async scheduling: step t's output is read after step t + 1 was sampled
            prev.get_output()
        prev = out
    prev.get_output()
    assert _state["runner"] == "v2"
    rec.flush()
    rows = [json.loads(x) for x in open(tmp_path / "steps.jsonl")]
    assert len(rows) == 3 and [r["step"] for r in rows] == [0, 1, 2]
    assert rows[0]["phase"] == "prefill" and rows[1]["phase"] == "decode"
    assert rows[1]["num_draft_tokens"] == 2 * K and rows[1]["accepted_per_req"] == {"a": 2, "b": 0}
    for r in rows:
        assert r["outputs_known"] and abs(r["t_verify"] + r["t_reject"] + r["t_draft"] + r["t_other"]
                                          - r["t_total"]) < 1e-9
    validate_steps(__import__("pandas").DataFrame(rows))
    # op="instrument", on=False: every wrapped method is vLLM's own again, and on=True wraps them again
    assert RV.instrument_v2(False) is False
    for k, fn in origs.items():
        assert classes[k.rsplit(".", 1)[0]].__dict__[k.rsplit(".", 1)[1]] is fn
    assert RV.instrument_v2(True) is True
    assert classes[f"{C.V2_RUNNER_MODULE}:GPUModelRunner"].__dict__["execute_model"] is not origs[RV.TIMER_WRAPPED[0]]


def test_v2_timer_phase_marks_follow_v2s_call_order(clean):
    """fwd0 after prepare_attn, fwd1 + samp0 at the sampler's entry as one event (logits in verification, as on
    V1), draft0/1 around the speculator's propose; a dummy run begins no step."""
    marks = []
    rec = types.SimpleNamespace(cur=None, ctx={"record": True})

    def begin(runner, so):
        rec.cur = types.SimpleNamespace(marks=[], in_forward=False, in_sample=False)
        marks.append("start")

    def mark(name, *also):                  # names that share one event (fwd1 and samp0)
        rec.cur.marks.append((name, None))
        marks.extend((name, *also))

    rec.begin, rec.mark, rec.drain = begin, mark, lambda: marks.append("drain")
    rec.watch_gc = lambda on: None
    apis = []
    rec.use_event_api = apis.append
    rec.end = lambda out: (marks.append("end"), setattr(rec, "cur", None))
    step_timer._REC[:] = [os.getpid(), rec]
    RV.install(_classes())
    assert apis == ["driver"]          # the timer's events through the driver unless a variant names torch
    run = FakeRunner(None, "cpu")
    _step(run, _so(["a"], K), _batch(["a"], [3], K, [5]), [[1, 2]])
    assert marks == ["start", "fwd0", "fwd1", "samp0", "samp1", "drain", "draft0", "draft1", "end"]
    marks.clear()
    run.step_input = (_batch(["a"], [3], 0, [5]), [[1]])
    run.execute_model(_so(["a"], K), None, True)         # dummy_run positionally
    assert marks == [] and rec.cur is None


# ---- the hybrid's merge on V2's tensors ------------------------------------------------------------------------
def test_lookup_width_bounds_every_context_without_a_sync():
    ub = torch.tensor([10, 300, 7], dtype=torch.int32)
    assert HV.lookup_width(ub, 3, 4096) == 512 and HV.lookup_width(ub, 1, 4096) == 256
    assert HV.lookup_width(ub, 2, 400) == 400 and HV.lookup_width(ub[:0], 0, 64) == 64


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_v2_merge_is_pr24344_on_v2s_buffers(seed):
    """A decode on V2's buffers: request slots taken from free_indices as RequestState does (pop from the end),
    the batch in V2's order (decode first: sorted by scheduled tokens), each step's accepted + bonus tokens
    appended at total_len (post_update), EAGLE's [num_reqs, k] int64 drafts. The merge must be the package's
    n-gram lookup where it matched (EAGLE's after its continuation), EAGLE's row elsewhere, and agree with the
    host-side hybrid (LiveHybrid, pr24344) on every request; the skip flag is 'no request needs EAGLE'."""
    rng = np.random.default_rng(seed)
    max_reqs, max_len, k, V = 6, 160, 4, 4
    tok = torch.zeros(max_reqs, max_len, dtype=torch.int32)      # all_token_ids (UVA on a GPU)
    total = torch.zeros(max_reqs, dtype=torch.int32)             # total_len
    free = list(range(max_reqs))
    slot, truth = {}, {}
    live = H.LiveHybrid(H.HybridPolicy("pr24344", k))
    skipper = H.LiveHybrid(H.HybridPolicy("pr24344-skip", k))
    prompts = {}
    hits = 0
    for step in range(30):
        if step in (0, 10):                     # requests arrive (add_request: the prompt staged at its slot)
            for j in range(3):
                r = f"s{step}-{j}"
                p = rng.integers(0, V, size=int(rng.integers(4, 20))).tolist()
                slot[r], truth[r], prompts[r] = free.pop(), list(p), list(p)
                tok[slot[r], :len(p)] = torch.tensor(p, dtype=torch.int32)
                total[slot[r]] = len(p)
        if step == 20:                          # a request finishes: its slot is freed, not cleared
            gone = sorted(slot)[0]
            free.append(slot.pop(gone))
            live.forget([gone])
            skipper.forget([gone])
        ids = sorted(slot, key=lambda r: (int(rng.integers(0, 3)), r))
        idx = torch.tensor([slot[r] for r in ids], dtype=torch.int32)
        new = []
        for r in ids:
            n = int(rng.integers(1, k + 2))
            toks = rng.integers(0, V, size=n).tolist()
            s, t0 = slot[r], int(total[slot[r]])
            tok[s, t0:t0 + n] = torch.tensor(toks, dtype=torch.int32)
            total[s] = t0 + n
            truth[r] += toks
            new.append(toks)
        ub = torch.tensor([len(truth[r]) - 1 + int(rng.integers(0, 3)) for r in ids], dtype=torch.int32)
        w = HV.lookup_width(ub, len(ids), max_len, bucket=32)
        eagle = torch.tensor(rng.integers(10, 20, size=(len(ids), k)), dtype=torch.int64)
        draft, chose, nv = HV.v2_merge(tok, total, idx, eagle, w)
        assert draft.dtype == torch.int64 and draft.shape == (len(ids), k)
        live.begin(ids, new, lambda r: prompts[r])
        choices = live.finish(eagle)
        need_skip = skipper.begin(ids, new, lambda r: prompts[r])
        skipper.finish(eagle)
        for b, r in enumerate(ids):
            ref = ngram_lookup(truth[r], k)
            want = ref + eagle[b, len(ref):].tolist() if ref else eagle[b].tolist()
            assert draft[b].tolist() == want, (step, r)
            assert bool(chose[b]) == bool(ref) == (not need_skip[b])
            c = choices[b]
            assert c.source == ("ngram" if ref else "eagle") and draft[b, :len(c.draft)].tolist() == c.draft
            hits += bool(ref)
        assert bool(chose.all()) == (not any(need_skip))
        idle, none = HV.v2_merge(tok, total, idx, eagle, w, use_ngram=False)[:2]
        assert torch.equal(idle, eagle) and not none.any()
    assert 0 < hits < 30 * 3


def _graph_like_capture(fn):
    """CUDA-graph capture's semantics on the CPU: replay runs the same ops on the same static inputs and writes the
    outputs captured at capture time in place."""
    out = fn()

    def replay():
        for o, n in zip(out, fn()):
            o.copy_(n)
    return replay, out


def _merges(step, seed=5, steps=24):
    rng = np.random.default_rng(seed)
    tok = torch.tensor(rng.integers(0, 3, size=(6, 96)), dtype=torch.int32)
    total = torch.tensor(rng.integers(10, 60, size=6), dtype=torch.int32)
    seen = []
    for i in range(steps):
        n = 3 if i < 12 else 2                               # two batch shapes
        idx = torch.tensor(rng.permutation(6)[:n], dtype=torch.int32)
        eagle = torch.tensor(rng.integers(5, 9, size=(n, K)), dtype=torch.int64)
        total[int(idx[0])] += 1                              # the buffer moves on between steps
        out = step(tok, total, idx, eagle, 64)
        seen.append([o.tolist() for o in out])
    return seen


def test_merge_graph_replays_equal_the_eager_merge(capsys):
    want = _merges(HV.MergeStep(True, graphs=False))
    st = HV.MergeStep(True, graphs=True, capture=_graph_like_capture)
    assert _merges(st) == want
    assert st.off_reason is None and len(st._g) == 2 and st.replays == 24 - 2 * 2
    assert HV.MergeStep(True).graphs is torch.cuda.is_available()

    def wrong(fn):
        replay, out = _graph_like_capture(fn)

        def bad():
            replay()
            out[0].add_(1)
        return bad, out

    st = HV.MergeStep(True, graphs=True, capture=wrong)
    assert _merges(st) == want and not st.graphs and "differed" in st.off_reason and st.replays == 0
    assert capsys.readouterr().err.count("CUDA graphs OFF") == 1


def test_merge_graphs_pad_a_shrinking_batch_and_count_only_its_requests():
    """Requests finish one by one (6 -> 1 rows): the graphs are kept per padded batch (1, 2, 4, 8), the padding
    repeats the last request, and the drafts, counts and every-row-matched flag equal the eager merge's over the
    real rows (a repeated row that matched would otherwise count twice: it does here)."""
    rng = np.random.default_rng(11)
    tok = torch.tensor(rng.integers(0, 2, size=(8, 96)), dtype=torch.int32)      # two symbols: n-gram matches
    total = torch.tensor(rng.integers(20, 60, size=8), dtype=torch.int32)

    def run(step):
        out = []
        for n in (6, 6, 5, 5, 5, 3, 3, 3, 2, 2, 1, 1, 7, 7):
            idx = torch.tensor(rng.permutation(8)[:n], dtype=torch.int32)
            eagle = torch.tensor(rng.integers(5, 9, size=(n, K)), dtype=torch.int64)
            out.append([o.tolist() for o in step(tok, total, idx, eagle, 64)])
        return out

    rng = np.random.default_rng(12)
    want = run(HV.MergeStep(True, graphs=False))
    rng = np.random.default_rng(12)
    st = HV.MergeStep(True, graphs=True, capture=_graph_like_capture)
    assert run(st) == want and st.off_reason is None
    assert sorted(k[0] for k in st._g) == [1, 2, 4, 8] and st.replays == 14 - 2 * 4   # 8 holds 6, 5 and 7
    assert any(c[1][0] > 0 for c in want)
    assert [HV.padded_batch(n) for n in (1, 2, 3, 5, 8, 9, 17, 64)] == [1, 2, 4, 8, 8, 16, 24, 64]


def _mirror_run(flag_prefill=True, seed=7, steps=40):
    """V2's buffers stepped as vLLM steps them: requests arrive at freed slots (the prompt staged over whatever
    the last occupant left, ``is_prefilling_np`` on that step), each step appends 1..k+1 tokens a row, one step
    is never seen by the hybrid (the policy off: the speculator's step count jumps) and appends past the tail.
    Yields per step (the merge over a device mirror, the merge over vLLM's buffer read directly)."""
    rng = np.random.default_rng(seed)
    max_reqs, max_len, k, V = 5, 400, K, 3
    src = torch.tensor(rng.integers(0, V, size=(max_reqs, max_len)), dtype=torch.int32)   # stale rows
    total = torch.zeros(max_reqs, dtype=torch.int32)
    rs = types.SimpleNamespace(all_token_ids=types.SimpleNamespace(gpu=src), total_len=types.SimpleNamespace(gpu=total))
    mirrored = HV.V2Hybrid("gpu-pr24344", graphs=True, capture=_graph_like_capture)
    direct = HV.MergeStep(True, graphs=False)                # the lookup over vLLM's buffer itself
    mirror, call = HV.TokenMirror(), 0
    live, free = {}, list(range(max_reqs))
    for step in range(steps):
        fresh = set()
        if step in (0, 12, 25):                        # arrivals (a finished request's slot is reused at 12, 25)
            if step:
                free.append(live.pop(sorted(live)[0]))
            while free and len(live) < 4:
                r = f"r{step}-{len(live)}"
                live[r] = free.pop()
                p = rng.integers(0, V, size=int(rng.integers(5, 60)))
                src[live[r], :len(p)] = torch.tensor(p, dtype=torch.int32)
                total[live[r]] = len(p)
                fresh.add(r)
        unseen = step == 18                            # the hybrid does not see this step: more than a tail
        for r, slot in live.items():
            n = int(rng.integers(1, k + 2)) + (k + 1 if unseen else 0)
            t0 = int(total[slot])
            src[slot, t0:t0 + n] = torch.tensor(rng.integers(0, V, size=n), dtype=torch.int32)
            total[slot] = t0 + n
        call += 2 if unseen else 1
        if unseen:
            continue
        ids = sorted(live)
        slots = np.array([live[r] for r in ids], dtype=np.int32)
        ib = types.SimpleNamespace(num_reqs=len(ids), idx_mapping=torch.tensor(slots), idx_mapping_np=slots,
                                   is_prefilling_np=np.array([flag_prefill and r in fresh for r in ids]),
                                   seq_lens_cpu_upper_bound=total[torch.tensor(slots).long()] + 1)
        eagle = torch.tensor(rng.integers(10, 20, size=(len(ids), k)), dtype=torch.int64)
        got = mirrored.step(rs, ib, eagle, max_len, mirror, call)
        want = direct(src, total, ib.idx_mapping, eagle, HV.lookup_width(ib.seq_lens_cpu_upper_bound, len(ids),
                                                                          max_len))[:2]
        yield [o.tolist() for o in got], [o.tolist() for o in want], mirror, mirrored.merge


def test_the_mirrored_lookup_equals_the_lookup_over_vllms_buffer():
    """The lookup over the device mirror proposes what the lookup over vLLM's (host-memory) buffer does at every
    step: whole rows copied where vLLM prefills and after an unseen step, the last 1 + k positions otherwise (in
    the merge's graph); the mirror grew with the widest lookup. Unflagged prefills would leave the last occupant's
    tokens in a reused slot: the check can fail."""
    n = 0
    for got, want, mirror, merge in _mirror_run():
        assert got == want
        n += 1
    assert n == 39 and mirror.tok.shape[1] >= 256
    assert merge.off_reason is None and merge.replays > 0      # the tail copy ran inside the (stand-in) graphs
    assert any(g != w for g, w, *_ in _mirror_run(flag_prefill=False))


def test_skip_gate_uses_the_latest_flag_that_arrived():
    done = []

    class Ev:
        def __init__(self):
            self.ok = False
            done.append(self)

        def record(self):
            pass

        def query(self):
            return self.ok

    g = HV.SkipGate(event=Ev, pin=False)
    assert g.decide() is False                          # nothing arrived: EAGLE drafts
    g.push(torch.tensor(True))
    assert g.decide() is False                          # its copy has not completed: not read, no wait
    done[0].ok = True
    assert g.decide() is True
    g.push(torch.tensor(False))
    g.push(torch.tensor(True))
    done[2].ok = True                                   # out of order: the older one still pending blocks it
    assert g.decide() is True and len(g.pending) == 2
    done[1].ok = True
    assert g.decide() is True and not g.pending         # False, then True: the latest


def test_v2_hybrid_on_stand_ins_changes_only_drafts_and_skips_the_decode_steps(clean, monkeypatch):
    """The installed hybrid on the stand-in classes: the runner's draft_tokens hold the merge (n-gram where the
    context repeats), the speculator's own draft_tokens stay EAGLE's, gpu-pr24344-skip skips _multi_step_decode
    once every request matched at an earlier step, and op=hybrid 'off' is EAGLE untouched."""
    monkeypatch.setenv("SPEC_REPRO_HYBRID", "gpu-pr24344-skip")
    assert HV.patch_hybrid_v2(_classes()) is True and _state["hybrid_installed"]
    run = FakeRunner(None, "cpu")
    sp = run.speculator
    assert sp._spec_repro_req_states is run.req_states and _state["runner"] == "v2"
    prompt = [1, 2, 3, 4, 1, 2, 3]                       # n-gram: [4, 1, 2, 3] continues it
    run.req_states.all_token_ids.gpu[5, :7] = torch.tensor(prompt, dtype=torch.int32)
    run.req_states.total_len.gpu[5] = 7
    b = _batch(["a"], [5], 0, [7])
    run.step_input = (b, [[4]])                          # context now 1 2 3 4 1 2 3 4: n-gram proposes 1 2 3
    run.sample_tokens(None)
    assert run.req_states.draft_tokens[5].tolist() == [1, 2, 3]
    assert sp.draft_tokens[0].tolist() == [41, 51, 51] and sp.decode_calls == 1
    run.step_input = (b, [[1]])                          # the flag of the last step has arrived: skip
    run.sample_tokens(None)
    assert sp.decode_calls == 1 and run.req_states.draft_tokens[5].tolist() == [2, 3, 4]
    assert sp._spec_repro_hybrids["gpu-pr24344-skip"].skipped == 1
    _state["hybrid_now"] = "off"
    run.step_input = (b, [[2]])
    run.sample_tokens(None)
    assert sp.decode_calls == 2 and run.req_states.draft_tokens[5].tolist() == [43, 53, 53]


def test_v2_hybrid_refuses_host_policies_and_probabilistic_drafts(clean, monkeypatch):
    monkeypatch.setenv("SPEC_REPRO_HYBRID", "pr24344")
    assert HV.patch_hybrid_v2(_classes()) is False and "V1 runner" in _state["hybrid_error"]
    monkeypatch.setenv("SPEC_REPRO_HYBRID", "gpu-pr24344")
    _state["hybrid_error"] = None
    assert HV.patch_hybrid_v2(_classes()) is True
    run = FakeRunner(None, "cpu")
    run.speculator.draft_logits = torch.zeros(1)
    run.step_input = (_batch(["a"], [0], 0, [3]), [[1]])
    run.sample_tokens(None)                             # EAGLE's drafts go through, the reason is recorded
    assert "probabilistic" in _state["hybrid_error"]
    assert run.req_states.draft_tokens[0].tolist() == run.speculator.draft_tokens[0].tolist()


# ---- engines, jobs and the plan --------------------------------------------------------------------------------
def test_engine_and_specs_route_policies_to_their_runner():
    from spec_repro.engines.vllm import engine as E
    from spec_repro.engines.vllm import v2hybrid
    from spec_repro.engines.vllm.hybrid_jobs import hybrid_specs

    env = E.engine_env(E.VLLMConfig(model="m", method="eagle", draft="d", hybrid="gpu-pr24344-skip",
                                    model_runner="v2"))
    assert env["VLLM_USE_V2_MODEL_RUNNER"] == "1" and env["SPEC_REPRO_HYBRID"] == "gpu-pr24344-skip"
    for kw, msg in [(dict(hybrid="gpu-pr24344-skip", model_runner="v1"), "V2 model runner only"),
                    (dict(hybrid="pr24344", model_runner="v2"), "V1 model runner"),
                    (dict(hybrid="gpu-pr24344", model_runner="v3"), "model_runner must be")]:
        with pytest.raises(E.VLLMEngineError, match=msg):
            E.engine_env(E.VLLMConfig(model="m", method="eagle", draft="d", **kw))
    with pytest.raises(ValueError, match="V2 runner only"):
        hybrid_specs("/h", model_dir="/m", methods=("gpu-pr24344-skip",))
    for st in v2hybrid.STAGES:
        for s in v2hybrid.stage_specs(st, "/h", model_dir="/m"):
            # vLLM's n-gram runs on V1 only: the grid's n-gram engine is the one V1 engine
            want = "v1" if s["config"]["method"] == "ngram" else "v2"
            assert s["name"].startswith(f"v2hybrid-{st}-") and s["config"]["model_runner"] == want
            E.engine_env(E.VLLMConfig(**s["config"], step_log="/tmp/x.jsonl"))      # every config is accepted
    none, rot, best, ngram = v2hybrid.stage_specs("grid", "/h", model_dir="/m")
    # EAGLE alone at its best fixed k and the hybrid at that k: a rotated V2 engine of their own, timed
    env = E.engine_env(E.VLLMConfig(**best["config"], step_log="/tmp/x.jsonl"))
    assert best["config"]["k"] == v2hybrid.EAGLE_BEST_K == 3 and best["engine_config"] == "v2-forced"
    assert any("HYBRID" in k for k in env) and best["tasks"][0]["batch_sizes"] == [1, 8, 32, 64]
    assert rot["config"]["hybrid_rotate"] == list(v2hybrid.ROTATE) and rot["tasks"][1]["batch_sizes"] == [1, 8, 32, 64]
    # the comparison's single proposers in the same stage: no SD on V2 with the same prompts and shapes, n-gram on V1
    assert none["config"]["method"] == "none" and none["engine_config"] == "v2-forced"
    assert {k: v for k, v in none["tasks"][1].items() if k != "repeats"} == \
        {k: v for k, v in rot["tasks"][1].items() if k != "repeats"} and none["tasks"][1]["repeats"] == 3
    assert ngram["engine_config"] == "v1-forced" and ngram["config"]["k"] == v2hybrid.NGRAM_K
    assert ngram["tasks"][0]["batch_sizes"] == [1, 8, 32, 64]
    assert ngram["tasks"][0]["workloads"] == rot["tasks"][1]["workloads"] == ["code-edit", "sharegpt"]


def test_check_lossless_needs_every_output_equal():
    from spec_repro.engines.vllm.v2hybrid import check_lossless

    def run(cfg, outs):
        return {"kind": "run", "task": "hybrid", "spec": "s", "workload": "w", "batch_size": 1, "keys": ["x", "y"],
                "outputs": outs, "config": cfg}

    none = {"method": "none"}
    hyb = {"method": "eagle", "hybrid": "gpu-pr24344"}
    assert check_lossless([run(none, [[1, 2], [3]]), run(hyb, [[1, 2], [3]])])[0] is True
    assert check_lossless([run(none, [[1, 2], [3]]), run(hyb, [[1, 5], [3]])])[0] is False
    assert check_lossless([run(none, [[1, 2], [3]])])[0] is False        # nothing compared: not a pass


def test_check_lossless_allows_what_vllms_own_eagle_shows():
    """bf16 near-ties part EAGLE alone from no SD too: a hybrid may differ on as many requests as EAGLE alone
    (less one), never more."""
    from spec_repro.engines.vllm.v2hybrid import check_lossless

    keys = list("abcdef")

    def run(cfg, outs):
        return {"kind": "run", "task": "hybrid", "spec": "s", "workload": "w", "batch_size": 1, "keys": keys,
                "outputs": outs, "config": cfg}

    ref = [[i, i + 1] for i in range(6)]
    none, eagle = {"method": "none"}, {"method": "eagle"}
    hyb = {"method": "eagle", "hybrid": "gpu-pr24344"}
    two_off = ref[:4] + [[9, 9], [9, 9]]                     # 4 of 6 equal
    three_off = ref[:3] + [[9, 9]] * 3                       # 3 of 6
    one_off = ref[:5] + [[9, 9]]                             # 5 of 6
    ok, rows = check_lossless([run(none, ref), run(eagle, two_off), run(hyb, three_off)])
    assert ok is True and [r["gate"] for r in rows] == [True, True] and rows[1]["eagle_equal"] == 4
    assert check_lossless([run(none, ref), run(eagle, one_off), run(hyb, three_off)])[0] is False   # 3 < 5 - 1
    assert check_lossless([run(none, ref), run(hyb, one_off)])[0] is False   # no EAGLE alone to compare with


def test_the_v2hybrid_plan_runs_the_lossless_check_first_and_fits():
    from pathlib import Path

    from spec_repro.engines.vllm import v2hybrid

    plan = json.loads((Path(__file__).resolve().parents[1] / "gpu/plans/v2hybrid.json").read_text())
    names = [s["stage"] for s in plan["stages"]]
    assert names.index("lossless") < names.index("grid")
    # one lease runs what is not resumed (RESUME places finished specs: the lossless gate, vLLM's n-gram on V1);
    # from scratch the job takes two leases, each stage priced at least at its estimate
    for st in v2hybrid.STAGES:
        stage = next(s for s in plan["stages"] if s["stage"] == st)
        specs = v2hybrid.stage_specs(st, "/h", model_dir="/m")
        want = sum(v2hybrid.estimate(s) for s in specs)
        assert want <= stage["seconds_from_scratch"], (st, want, stage)
        if stage.get("resumed"):
            assert stage["seconds"] <= 60, stage
            continue
        left = [s for s in specs if s["name"] not in stage.get("resumed_specs", ())]
        assert len(left) == len(specs) - len(stage.get("resumed_specs", ())) > 0
        want = sum(v2hybrid.estimate(s) for s in left)
        assert want <= stage["seconds"] <= 1.3 * want + 60, (st, want, stage["seconds"])
    scratch = sum(s.get("seconds_from_scratch", s.get("seconds", s.get("seconds_each", 0) * s.get("calls", 1)))
                  for s in plan["stages"])
    assert scratch > plan["limit_s"]            # from scratch: more than one lease, so the plan says two
    sh = (Path(__file__).resolve().parents[1] / "gpu/live_job.sh").read_text()
    assert "spec_repro.engines.vllm.gpu_profile run" in sh         # reproduce --profile gpu's GPU part: the gate first
    from spec_repro.engines.vllm import gpu_profile

    assert gpu_profile.V2_STAGES == v2hybrid.STAGES == ("lossless", "grid")
    # the grid's V2 engines time the timer first (no SD, and the rotated EAGLE engine on its `off` policy: jobs),
    # every variant against vLLM's own methods; the lossless engines only check outputs
    from spec_repro.engines.vllm.common import TIMER_VARIANTS

    for s in v2hybrid.stage_specs("lossless", "/h", model_dir="/m"):
        assert [t["type"] for t in s["tasks"]] == ["hybrid"]
    for s in v2hybrid.stage_specs("grid", "/h", model_dir="/m")[:2]:
        ov = s["tasks"][0]
        assert ov["type"] == "overhead" and ov["variants"][:2] == ["off", "timer"]
        assert set(ov["variants"]) <= set(TIMER_VARIANTS) and ov["repeats"] >= 8
        # the engine batches the overhead task's largest batch (max_num_seqs 1 ran its bs 64 one request at a time)
        assert s["config"]["max_num_seqs"] >= max(ov["batch_sizes"]), s["config"]["max_num_seqs"]
    assert "eng.set_hybrid(HYBRID_OFF)" in (Path(v2hybrid.__file__).parent / "jobs.py").read_text()


def test_overhead_task_interleaves_every_timer_variant_in_a_latin_square():
    """Each repeat runs the variants rotated by the repeat (every variant takes every place), each with its own
    op="instrument" arguments and recording flag; the runs carry their variant; the engine ends on the timer."""
    from spec_repro.engines.vllm.common import TIMER_VARIANTS
    from spec_repro.engines.vllm.jobs import overhead_task

    calls, recs = [], []

    class Eng:
        cfg = types.SimpleNamespace(hybrid_rotate=None)

        def steps(self, op, **kw):
            calls.append((op, kw))
            if op == "clock":       # a toggle run's clock: blocks of 8 steps, the timed ones 10% longer
                t, clock = 1.0, []
                for i in range(64):
                    clock.append(t if (i // 8) % 2 == 0 else -t)
                    t += 1.1e-3 if (i // 8) % 2 == 0 else 1e-3
                return [{"clock": clock}]

        def run_batch(self, prompt, b, max_tokens, run_id, record=True, label=""):
            calls.append(("run", run_id, record))
            return types.SimpleNamespace(run_id=run_id, instrumented=None)

    names = ["off", "timer", "hooks", "step", "drain", "toggle", "toggle-torch"]
    n = len(names)
    assert set(names) == set(TIMER_VARIANTS)
    task = {"batch_sizes": [1, 64], "repeats": n, "max_tokens": 8, "variants": names}
    overhead_task(Eng(), task, lambda r, **kw: recs.append((r, kw)), [1, 2, 3])
    warm = [c for c in calls if c[0] == "run" and c[1].startswith("warmup")]
    assert [c[1] for c in warm] == ["warmup-overhead-b1", "warmup-overhead-b64"] and not any(c[2] for c in warm)
    timed = [(r.run_id, kw["timer"], kw["repeat"], r.instrumented) for r, kw in recs]
    assert len(timed) == n * 2 * n
    for rep in range(n):
        order = [t for run_id, t, r, _ in timed if r == rep and run_id.startswith("overhead-b1-")]
        assert order == names[rep:] + names[:rep]
    for name in names:      # every place in the order, once each
        assert sorted(o.index(name) for o in ([t for run_id, t, r, _ in timed if r == rep
                                                and run_id.startswith("overhead-b1-")] for rep in range(n))) == \
            list(range(n))
    v = TIMER_VARIANTS
    assert {t: i for _, t, _, i in timed} == {n: v[n]["on"] and v[n]["record"] for n in names}
    # before each timed run: the variant's instrument call, and the run records only where the variant does
    for i, c in enumerate(calls):
        if c[0] == "run" and c[1].startswith("overhead-"):
            name = c[1].split("-", 2)[2].rsplit("-", 1)[0]          # overhead-b1-<variant>-<repeat>
            # the driver's event records unless the variant names another API (toggle-torch: torch's)
            assert calls[i - 1] == ("instrument", {"event_api": v[name].get("event_api", "driver"),
                                                   **{k: v[name][k] for k in ("on", "parts", "defer", "toggle")
                                                      if k in v[name]}})
            assert c[2] == v[name]["record"]
            # a toggled run's clock is read right after it, and its medians go with the run's record
            assert (calls[i + 1][0] == "clock") == (name in ("toggle", "toggle-torch"))
    for r, kw in recs:
        if kw["timer"] in ("toggle", "toggle-torch"):
            assert kw["toggle_timed_ms"] == pytest.approx(1.1) and kw["toggle_free_ms"] == pytest.approx(1.0)
        else:
            assert "toggle_timed_ms" not in kw
    assert calls[-1] == ("instrument", {"event_api": "driver", "on": True, "parts": None, "defer": True})


def test_toggle_times_one_block_of_each_pair_and_clocks_every_step(clean, tmp_path):
    """toggle=2: steps go in pairs of 2-step blocks, one block of each pair timed and the other passed through (no
    row, no mark: vLLM's call goes straight through), which one drawn per pair from the run's id; every step's
    execute_model entry is clocked, negative where passed through; a new run's context starts the count, the
    clock and the draw again; the timed steps' rows equal the plain timer's rows of the same steps."""
    from spec_repro.engines.vllm.import_hook import _worker_rpc

    rows, n = {}, 24
    for mode, toggle in (("timer", None), ("toggle", 2)):
        rec = step_timer.StepRecorder(str(tmp_path / f"{mode}.jsonl"))
        rec._torch = types.SimpleNamespace(cuda=types.SimpleNamespace(Event=_Ev, current_stream=lambda: "s"))
        rec._rank_ok = True
        step_timer._REC[:] = [os.getpid(), rec]
        RV._V2["classes"] = _classes()
        assert RV.instrument_v2(True, toggle=toggle) is True
        _worker_rpc(None, "context", run_id="overhead-b1-toggle-0", record=True)
        _one_request_steps(n)
        clock = _worker_rpc(None, "clock")["clock"]
        rec.flush()
        rows[mode] = [json.loads(x) for x in open(tmp_path / f"{mode}.jsonl")]
        if toggle:
            timed = [t > 0 for t in clock]
            assert len(timed) == n and all(b > a for a, b in zip(map(abs, clock), map(abs, clock[1:])))
            pairs = [timed[j:j + 4] for j in range(0, n, 4)]
            assert all(p in ([True, True, False, False], [False, False, True, True]) for p in pairs)
            assert len({tuple(p) for p in pairs}) == 2          # both orders drawn over six pairs
            _worker_rpc(None, "context", run_id="overhead-b1-toggle-1")
            assert _worker_rpc(None, "clock")["clock"] == [] and RV._TOGGLE["step"] == 0
            again = [RV.toggle_timed(i, 2) for i in range(n)]
            _worker_rpc(None, "context", run_id="overhead-b1-toggle-0")
            assert [RV.toggle_timed(i, 2) for i in range(n)] == timed != again    # the run's id sets the draw
        else:
            assert clock == []                      # no clock unless toggled
    same = [i for i, t in enumerate(timed) if t]    # the timer's rows of the steps the toggle timed
    assert [r["step"] for r in rows["toggle"]] == list(range(len(same)))   # the recorder's own count
    # a timed block's first step adds no host gap across an untimed block before it (t_other stays the step's)
    assert ["t_gap" in r for r in rows["toggle"]] == [i > 0 and timed[i - 1] for i in same]
    host = ("t_sched", "t_gap", "t_other", "t_total", "t_gc", "gc_full", "t_timer", "run_id", "step")
    assert [{k: v for k, v in r.items() if k not in host} for r in rows["toggle"]] == \
        [{k: v for k, v in rows["timer"][i].items() if k not in host} for i in same]
    assert RV.instrument_v2(False) is False and RV._TOGGLE["block"] == 0
    with pytest.raises(ValueError, match="toggle must be"):
        RV.instrument_v2(True, toggle=-1)


def test_toggle_periods_compare_the_arms_of_one_run():
    """Blocks of 4: timed steps take 1.1 ms, untimed 1.0 ms, the host's speed halves for a stretch (both arms alike)
    and one step stalls 20 ms; each block's first 2 periods carry 5 ms (the other arm's work) and the first two
    blocks 9 ms (the prefill): all of it left out, the medians are the arms' own periods."""
    from spec_repro.engines.vllm.common import toggle_periods

    t, clock, n = 100.0, [], 48
    for i in range(n):
        timed = (i // 4) % 2 == 0
        clock.append(t if timed else -t)
        p = 1.1e-3 if timed else 1.0e-3
        p *= 2 if 20 <= i < 36 else 1                       # the host slows for four blocks
        p += 5e-3 if i % 4 < 2 else 0                       # a block's first periods: left out
        p += 9e-3 if i < 8 else 0
        p += 20e-3 if i == 30 else 0                        # a stall: in an arm's tail, beyond the median
        t += p
    got = toggle_periods(clock)
    assert got["toggle_periods"] == (n // 4 - 2) * 2 - 1      # the last step has no next entry
    assert got["toggle_timed_ms"] == pytest.approx(1.1) and got["toggle_free_ms"] == pytest.approx(1.0)
    assert toggle_periods(clock[:9]) == {} and toggle_periods([]) == {}


def test_v2_timer_parts_and_deferred_rows(clean, tmp_path):
    """parts=["step"] wraps only the step's bounds (no phase marks: every second in t_other); the deferred timer
    builds no row during the steps, all at flush, the same rows as building them at the sampler."""
    rows = {}
    for mode, parts, defer in (("drain", None, False), ("timer", None, True), ("step", ["step"], True)):
        rec = step_timer.StepRecorder(str(tmp_path / f"{mode}.jsonl"))
        rec._torch = types.SimpleNamespace(cuda=types.SimpleNamespace(Event=_Ev, current_stream=lambda: "s"))
        rec._rank_ok = True
        step_timer._REC[:] = [os.getpid(), rec]
        RV._V2["classes"] = _classes()
        assert RV.instrument_v2(True, parts=parts, defer=defer) is True and rec.defer is defer
        built = []
        _one_request_steps(8, lambda: built.append(len(rec._lines) + rec.rows_written))
        if defer:
            assert built == [0] * 8 and len(rec.pending) == 8      # nothing built while the steps ran
        else:
            assert built[-1] > 0
        rec.flush()
        rows[mode] = [json.loads(x) for x in open(tmp_path / f"{mode}.jsonl")]
        assert RV.instrument_v2(False) is False
        keys = set(RV._V2["orig"])
        for k in keys:                                              # vLLM's methods back
            owner, meth = k.rsplit(".", 1)
            assert RV._V2["classes"][owner].__dict__[meth] is RV._V2["orig"][k]
    # the host's gaps between steps and its GC pauses (counted deferred): real time, not the fake clock
    host = ("t_sched", "t_gap", "t_other", "t_total", "t_gc", "gc_full", "t_timer")
    assert all("t_gc" in r and r["gc_full"] >= 0 for r in rows["timer"]) and "t_gc" not in rows["drain"][0]
    # the timer's own host time in each step: begin, its marks, end and the async output's read (perf_counter)
    assert all(0 < r["t_timer"] < 0.05 for r in rows["timer"]) and "t_timer" not in rows["drain"][0]
    assert [{k: v for k, v in r.items() if k not in host} for r in rows["drain"]] == \
        [{k: v for k, v in r.items() if k not in host} for r in rows["timer"]] and len(rows["timer"]) == 8
    assert [r["accepted_per_req"] for r in rows["step"]] == [r["accepted_per_req"] for r in rows["timer"]]
    assert all(r["t_verify"] == r["t_draft"] == r["t_reject"] == 0 for r in rows["step"])
    with pytest.raises(ValueError, match="unknown timer parts"):
        RV.instrument_v2(True, parts=["phase"])


def test_the_toggle_estimate_is_null_on_measured_steps_where_a_fixed_order_aliases():
    """The estimator on measured step sequences: every timed 128-token overhead run of the committed H100 grid
    (data/gpu/raw/v2hybrid-h100-grid, both engines, bs 1-64, 20 runs each), its steps' times laid end to end as
    a clock and split into arms by the toggle's own draw, where both arms are timed: 1 - untimed / timed must be
    null, within 3 standard errors and 2% at every point. Blocks of 8 in a fixed order are not: what recurs every
    16 steps (a KV block's allocation, no SD bs 64: steps 1-5 of 16 run ~5% longer) falls in one arm, +4-5% at
    bs 32-64."""
    import gzip

    from spec_repro.engines.vllm.common import TIMER_VARIANTS, toggle_periods
    from spec_repro.paths import data_dir

    runs = {}
    for spec in ("none", "rotate"):
        with gzip.open(data_dir() / "gpu" / "raw" / "v2hybrid-h100-grid" / "grid" /
                       f"steps_v2hybrid-grid-{spec}.jsonl.gz", "rt") as f:
            for line in f:
                if '"overhead-b' in line:
                    r = json.loads(line)
                    runs.setdefault((spec, r["batch_size"], r["run_id"]), []).append(r["t_total"])

    def null(arms):
        out = {}
        for (spec, b, rid), t_total in runs.items():
            t = 100.0 + np.concatenate([[0.0], np.cumsum(t_total)])[:-1]
            got = toggle_periods(np.where(arms(rid, len(t)), t, -t))
            out.setdefault((spec, b), []).append(got["toggle_free_ms"] / got["toggle_timed_ms"])
        assert {len(v) for v in out.values()} == {20} and len(out) == 8
        return {k: (1 - np.mean(v), np.std(v, ddof=1) / np.sqrt(len(v))) for k, v in out.items()}

    block = TIMER_VARIANTS["toggle"]["toggle"]

    def drawn(rid, n):
        RV.clock_reset(rid)
        return np.array([RV.toggle_timed(i, block) for i in range(n)])

    for k, (est, se) in null(drawn).items():        # measured: |estimate| <= 1.5 standard errors, se 0.4-1.0%
        assert abs(est) < min(3 * se, 0.02) and se < 0.012, (k, est, se)
    fixed = null(lambda rid, n: (np.arange(n) // 8) % 2 == 0)
    for k in (("none", 32), ("none", 64)):
        assert fixed[k][0] > max(0.03, 3 * fixed[k][1]), (k, fixed[k])


class _DrvEv(_Ev):
    """A stand-in event with a raw handle once torch created it (at its first record), as ``torch.cuda.Event``."""
    made = {}

    def __init__(self, enable_timing=True):
        super().__init__(enable_timing)
        self.cuda_event, self.torch_records = 0, 0

    def record(self, stream=None):
        super().record(stream)
        self.torch_records += 1
        if not self.cuda_event:
            self.cuda_event = 1000 + len(_DrvEv.made)
            _DrvEv.made[self.cuda_event] = self


def test_the_driver_records_every_event_torch_created_and_torch_the_rest(clean, tmp_path, capsys):
    """``event_api="driver"``: an event torch has created (its first record) is recorded through the driver's
    cuEventRecord (handles: the event's ``cuda_event``, the stream's ``cuda_stream``); one not yet created, or one
    the driver refused (a nonzero CUresult), through torch. The rows are those the torch path gives. Without the
    driver's library the recorder says so in one line and records through torch."""
    import ctypes

    rows, marks = {}, {}
    for api in ("torch", "driver", "refused"):
        _DrvEv.made.clear()
        rec = step_timer.StepRecorder(str(tmp_path / f"{api}.jsonl"))
        stream = types.SimpleNamespace(cuda_stream=77)
        rec._torch = types.SimpleNamespace(cuda=types.SimpleNamespace(Event=_DrvEv, current_stream=lambda: stream))
        rec._rank_ok = True
        calls = []

        def drv(h, s, ok=api == "driver"):
            calls.append((h, s))
            if ok:
                _DrvEv.made[h].t, _DrvEv.made[h].stream = _Ev.clock[0], stream
            return 0 if ok else 1

        step_timer._REC[:] = [os.getpid(), rec]
        assert RV.install(_classes()) is True
        rec._drv = None if api == "torch" else drv        # the install asked for the driver's: this stand-in
        _one_request_steps(4, each=rec.flush)       # each step's record (and its events) reused by the next
        rec.flush()
        evs = list(_DrvEv.made.values())
        marks[api] = sum(e.torch_records for e in evs) + (len(calls) if api == "driver" else 0)
        if api == "driver":          # torch created each event once; every later record went through the driver
            assert calls and all(e.torch_records == 1 for e in evs) and {s for _, s in calls} == {77}
        elif api == "refused":       # every driver call refused: torch recorded each mark
            assert calls and sum(e.torch_records for e in evs) == len(evs) + len(calls)
        host = ("t_timer", "t_gap", "t_sched", "t_other", "t_total", "t_gc")      # the host's clock: run to run
        rows[api] = [{k: v for k, v in json.loads(x).items() if k not in host}
                     for x in open(tmp_path / f"{api}.jsonl")]
        RV.instrument_v2(False)
    assert rows["driver"] == rows["torch"] == rows["refused"] and len(rows["torch"]) == 4
    assert marks["driver"] == marks["torch"] == marks["refused"] > len(_DrvEv.made)
    try:
        ctypes.PyDLL("libcuda.so.1")
    except OSError:
        rec = step_timer.StepRecorder(str(tmp_path / "x.jsonl"))
        assert rec.use_event_api("driver") == "torch" and rec._drv is None
        assert "libcuda.so.1 not loadable" in capsys.readouterr().err
    with pytest.raises(ValueError, match="event_api"):
        step_timer.StepRecorder(str(tmp_path / "y.jsonl")).use_event_api("cupti")


def test_the_step_log_says_whether_the_merge_replayed_a_graph():
    """A V2 step's ``hybrid`` entry carries ``graph``: True where the merge was a CUDA-graph replay (after the
    shape's capture and its checked replays, which return the eager merge), False where it ran eagerly."""
    rng = np.random.default_rng(3)
    for graphs, want in ((True, [False, False, True, True]), (False, [False] * 4)):
        hy = HV.V2Hybrid("gpu-pr24344", graphs=graphs, capture=_graph_like_capture)
        src = torch.tensor(rng.integers(0, 3, size=(2, 64)), dtype=torch.int32)
        rs = types.SimpleNamespace(all_token_ids=types.SimpleNamespace(gpu=src),
                                   total_len=types.SimpleNamespace(gpu=torch.tensor([40, 50], dtype=torch.int32)))
        slots = np.array([0, 1], dtype=np.int32)
        ib = types.SimpleNamespace(num_reqs=2, idx_mapping=torch.tensor(slots), idx_mapping_np=slots,
                                   is_prefilling_np=np.array([False, False]),
                                   seq_lens_cpu_upper_bound=torch.tensor([41, 51]))
        mirror, seen = HV.TokenMirror(), []
        for call in range(1, 5):
            hy.step(rs, ib, torch.full((2, K), 7, dtype=torch.int64), 64, mirror, call)
            seen.append(hy.last_graph)
        assert seen == want
    ring = HV._RING[0]
    HV._RING[0] = torch.tensor([[1, 3]], dtype=torch.int64)
    try:
        assert HV.resolve_counts((0, 2, K, False, True))["graph"] is True
        assert HV.resolve_counts((0, 2, K, True, False))["graph"] is False
    finally:
        HV._RING[0] = ring
