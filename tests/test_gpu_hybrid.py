"""The device-side hybrid's logic (spec_repro.engines.vllm.gpu_hybrid) on CPU tensors: the n-gram lookup against the
package's vLLM-semantics lookup, the token buffer against the true contexts through a decode with rejections,
discarded rows, finished and new requests, and the mix against the host-side hybrid's PR #24344 choice."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from spec_repro.engines.vllm import gpu_hybrid as G  # noqa: E402
from spec_repro.engines.vllm import hybrid as H  # noqa: E402
from spec_repro.proposers.ngram import ngram_lookup  # noqa: E402


def _contexts(rng, n):
    out = []
    for _ in range(n):
        L = int(rng.integers(1, 90))
        V = int(rng.integers(2, 7))
        out.append(rng.integers(0, V, size=L).tolist())
    return out


@pytest.mark.parametrize("min_n,max_n,k", [(3, 7, 5), (1, 2, 3), (2, 4, 8), (3, 3, 1), (2, 9, 4)])
def test_ngram_propose_is_vllm_lookup(min_n, max_n, k):
    rng = np.random.default_rng(min_n * 100 + max_n * 10 + k)
    ctx = _contexts(rng, 200)
    L = max(map(len, ctx)) + 3
    tok = torch.full((len(ctx), L), 5, dtype=torch.int32)   # junk past each context end must not be read
    for b, c in enumerate(ctx):
        tok[b, :len(c)] = torch.tensor(c)
    lens = torch.tensor([len(c) for c in ctx])
    draft, nv = G.ngram_propose(tok, lens, k, min_n, max_n)
    hits = 0
    for b, c in enumerate(ctx):
        ref = ngram_lookup(c, k, min_n, max_n)
        assert draft[b, :nv[b]].tolist() == ref, (b, c)
        hits += bool(ref)
    assert 20 < hits < len(ctx)            # both cases exercised


def test_ngram_propose_rejects_bad_sizes():
    with pytest.raises(ValueError):
        G.ngram_propose(torch.zeros(1, 4, dtype=torch.int32), torch.tensor([4]), 3, 4, 3)


def test_history_follows_a_decode_and_mix_is_pr24344():
    """A batch decoded step by step: each step's sampler output ([B, k+1], -1 after the first rejection), a
    discarded row (partial prefill), a request that finishes and a new one that takes its row. The buffer's
    contexts must equal the true ones and the mix must be n-gram's row where it matched, EAGLE's elsewhere."""
    rng = np.random.default_rng(7)
    k, V = 4, 5
    truth = {f"r{i}": rng.integers(0, V, size=int(rng.integers(3, 30))).tolist() for i in range(4)}
    prompts = {r: list(t) for r, t in truth.items()}
    gh = G.DeviceHistory(max_reqs=3, max_len=200)
    active = ["r0", "r1", "r2"]
    for step in range(40):
        if step == 15:                       # r1 finishes; r3 arrives and gets its row
            gh.forget(["r1"])
            active = ["r0", "r3", "r2"]
        rows = gh.rows(active, lambda r: prompts[r])
        sampled = torch.full((len(active), k + 1), -1, dtype=torch.int64)
        keep = torch.ones(len(active), dtype=torch.bool)
        before = {r: len(truth[r]) for r in active}
        for b, r in enumerate(active):
            n = int(rng.integers(1, k + 2))
            new = rng.integers(0, V, size=n).tolist()
            if r == "r2" and step % 7 == 3:   # a partial prefill chunk: its sample is thrown away
                keep[b] = False
                sampled[b, :n] = torch.tensor(new)
                continue
            sampled[b, :n] = torch.tensor(new)
            truth[r] += new
        sampled[0, -1] = V + 3 if sampled[0, -1] >= 0 else -1   # an id >= vocab: dropped, as vLLM does
        if sampled[0, -1] >= 0:
            truth[active[0]].pop()
        n = gh.append(rows, sampled, keep, vocab_size=V)
        for b, r in enumerate(active):
            assert gh.context(r) == truth[r], (step, r)
        assert n.tolist() == [len(truth[r]) - before[r] for r in active]
        ng, nv = gh.propose(rows, k)
        eagle = torch.tensor(rng.integers(0, V, size=(len(active), k)))
        draft, chose = G.mix(eagle, ng, nv)
        for b, r in enumerate(active):
            ref = ngram_lookup(truth[r], k)
            want = (ref + eagle[b, len(ref):].tolist()) if ref else eagle[b].tolist()
            assert draft[b].tolist() == want
            assert bool(chose[b]) == bool(ref)
            # the host-side hybrid's PR #24344 choice on the same inputs: the same proposer, the same tokens
            pol = H.HybridPolicy("pr24344", k)
            c = pol.select(pol.new_state(len(prompts[r])), np.asarray(truth[r]), ref, eagle[b].tolist(), len(active))
            assert c.draft == draft[b, :len(c.draft)].tolist() and c.source == ("ngram" if ref else "eagle")
        idle, chose_idle = G.mix(eagle, ng, nv, use_ngram=False)
        assert torch.equal(idle, eagle) and not chose_idle.any()
        counts = G.step_summary(chose, nv, k).tolist()
        row = G.summary_row(counts, len(active), k)
        assert row["ngram"] == int(chose.sum()) and row["ngram"] + row["eagle"] == len(active)
        assert row["ngram_tokens"] + row["eagle_tokens"] == len(active) * k
    with pytest.raises(RuntimeError, match="more than 3"):
        gh.rows(["r0", "r2", "r3", "new"], lambda r: [1, 2])


def test_gpu_policies_are_hybrid_policies():
    from spec_repro.engines.vllm.jobs import hybrid_method

    for p in G.GPU_POLICIES:
        assert p in H.POLICIES and p not in H.PASSTHROUGH
        assert hybrid_method(p) == ("eagle", p, False)


def test_host_policy_class_refuses_device_policies():
    with pytest.raises(H.HybridError, match="device-side"):
        H.HybridPolicy("gpu-pr24344", 5)


def test_a_full_buffer_frees_the_rows_of_requests_not_in_the_batch():
    """Requests that finished without the buffer being told (a batch-final step vLLM runs without drafting) must
    not exhaust it: a new request takes the row of one that is not in this step's batch."""
    gh = G.DeviceHistory(max_reqs=2, max_len=16)
    gh.rows(["a", "b"], lambda r: [1, 2, 3])
    rows = gh.rows(["a", "c"], lambda r: [7, 8])
    assert set(gh.row_of) == {"a", "c"} and gh.context("c") == [7, 8] and gh.context("a") == [1, 2, 3]
    assert rows.tolist() == [gh.row_of["a"], gh.row_of["c"]]


def _graph_like_capture(fn):
    """A stand-in for CUDA-graph capture with a graph's semantics on the CPU: replay runs the same ops on the same
    static input buffers and writes the outputs captured at capture time in place."""
    out = fn()

    def replay():
        for o, n in zip(out, fn()):
            o.copy_(n)
    return replay, out


def _decode(step_fn, gh, seed=11, steps=30):
    """A decode as in the test above (rejections, a discarded row, ids past the vocabulary, a request finishing,
    a batch shrinking to two and growing back): each step's (draft, counts) and every request's context."""
    rng = np.random.default_rng(seed)
    k, V = 4, 5
    prompts = {f"r{i}": rng.integers(0, V, size=int(rng.integers(3, 30))).tolist() for i in range(5)}
    active, seen = ["r0", "r1", "r2"], []
    for step in range(steps):
        if step == 10:
            gh.forget(["r1"])
            active = ["r0", "r2"]
        if step == 20:
            active = ["r0", "r3", "r2"]
        rows = gh.rows(active, lambda r: prompts[r])
        sampled = torch.full((len(active), k + 1), -1, dtype=torch.int64)
        for b in range(len(active)):
            n = int(rng.integers(1, k + 2))
            sampled[b, :n] = torch.tensor(rng.integers(0, V + 2, size=n))
        keep = torch.tensor([not (r == "r2" and step % 7 == 3) for r in active] + [True])   # one spare, as vLLM's
        eagle = torch.tensor(rng.integers(0, V, size=(len(active), k)))
        draft, counts = step_fn(rows, sampled, keep, eagle, V)
        seen.append((draft.tolist(), counts.tolist(), {r: gh.context(r) for r in active}))
    return seen


@pytest.mark.parametrize("use_ngram", [True, False])
def test_graph_replays_are_the_eager_steps(use_ngram):
    """``DeviceStep`` with graphs (the stand-in capture) against the eager step, step by step through the same
    decode: the same drafts, counts and contexts; graphs per batch shape (3 rows, then 2, then 3 again), each
    checked on its first two replays, then replayed."""
    eager = G.DeviceStep(G.DeviceHistory(3, 128), use_ngram, graphs=False)
    want = _decode(eager, eager.h)
    graphed = G.DeviceStep(G.DeviceHistory(3, 128), use_ngram, graphs=True, capture=_graph_like_capture)
    got = _decode(graphed, graphed.h)
    assert got == want
    assert graphed.off_reason is None and len(graphed._g) == 2 and graphed.replays == 30 - 2 * 2
    assert eager.replays == 0 and not eager.last_graph and graphed.last_graph
    assert G.DeviceStep(G.DeviceHistory(2, 16), True).graphs is False       # on the CPU: eager by default


def test_a_graph_that_differs_or_fails_turns_graphs_off_and_the_eager_step_goes_on(capsys):
    eager = G.DeviceStep(G.DeviceHistory(3, 128), True, graphs=False)
    want = _decode(eager, eager.h)

    def wrong(fn):                      # a replay whose draft is off by one
        replay, out = _graph_like_capture(fn)

        def bad():
            replay()
            out[0].add_(1)
        return bad, out

    def broken(fn):
        raise RuntimeError("capture failed")

    for capture, why in ((wrong, "differed from the eager step"), (broken, "RuntimeError: capture failed")):
        st = G.DeviceStep(G.DeviceHistory(3, 128), True, graphs=True, capture=capture)
        assert _decode(st, st.h) == want
        assert not st.graphs and why in st.off_reason and st.replays == 0
        assert capsys.readouterr().err.count("CUDA graphs OFF") == 1


def test_shapes_past_max_graphs_run_eager():
    eager = G.DeviceStep(G.DeviceHistory(3, 128), True, graphs=False)
    want = _decode(eager, eager.h)
    st = G.DeviceStep(G.DeviceHistory(3, 128), True, graphs=True, capture=_graph_like_capture, max_graphs=1)
    assert _decode(st, st.h) == want
    assert len(st._g) == 1 and st.graphs and st.replays == 20 - 2      # B = 3 replayed, B = 2 eager
