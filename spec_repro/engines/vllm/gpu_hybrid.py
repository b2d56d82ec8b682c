"""The live hybrid on the device: PR #24344's rule with no host round trip (policies :data:`GPU_POLICIES`).

Why. The host-side hybrid (:mod:`.hybrid`, ``LiveHybrid``) reads the sampled tokens and EAGLE's drafts back to
the host every step; under async scheduling that makes the CPU wait for the GPU twice a step, and the idle
hybrid measured 23-26% below EAGLE alone on the H200 (``data/gpu/v1-runner/reproduce-grid``). Here nothing leaves
the device:
each request's token ids live in a device buffer (:class:`DeviceHistory`), the n-gram lookup runs there
(:func:`ngram_propose`, vLLM's prompt-lookup semantics, the package's :func:`~spec_repro.proposers.ngram.
ngram_lookup` on every row at once) and the choice is a ``torch.where`` (:func:`mix`), so the step hands vLLM a
``[B, k]`` tensor as EAGLE's own path does and async scheduling keeps overlapping the host with the GPU.

Policies (both proposers run every step, except where ``gpu-pr24344-skip`` skips EAGLE's decode steps on a lagged
decision: the rule cannot skip EAGLE's drafting on this step's lookup without a host decision):

``gpu-pr24344``     per request, n-gram's tokens where it matched (its continuation, up to where the context
                    ends), EAGLE's tokens at the positions n-gram has none; EAGLE's row where it did not match.
                    Every request gets k tokens (a uniform ``1 + k`` decode batch: vLLM's full CUDA graph).
``gpu-eagle-only``  the same machinery, every request on EAGLE (the mask is all false): what the device-side
                    hybrid costs, loaded but idle.
``gpu-pr24344-skip`` V2 runner only (``hybrid_v2``): ``gpu-pr24344`` with EAGLE's k - 1 draft decode steps
                    skipped for the whole batch when every request matched at the latest step whose flag reached
                    the host without a sync; on the V1 runner it is refused (``V1_GPU_POLICIES``).

Lossless by construction: only the draft tokens change; greedy verification keeps the target's output.

Launches. Eager, a step is ~40 small kernels launched from Python; in data/gpu/v1-runner/engine-per-policy (H200)
the machinery
idle (``gpu-eagle-only``) took 0.5-1.4 ms more drafting time a step than vLLM's own EAGLE step. :class:`DeviceStep`
replays the step as one CUDA graph per batch shape (checked against the eager step on its first replays; eager
where capture fails, on the CPU, or with ``SPEC_REPRO_HYBRID_GRAPHS=0``).

Pure torch (no vLLM import), device-agnostic: the CPU tests run every function here on CPU tensors and check
them against the host-side hybrid and :func:`ngram_lookup`. The vLLM side (``hybrid_runner._gpu_hybrid_step``) hands
it the sampler's ``[B, k+1]`` output, the runner's discard mask and EAGLE's ``[B, k]`` drafts; on the V2 runner
(``hybrid_v2``) the lookup reads vLLM's own device token buffer instead of a :class:`DeviceHistory`.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["GPU_POLICIES", "V1_GPU_POLICIES", "DeviceHistory", "DeviceStep", "GraphSteps", "mix", "ngram_propose",
           "step_summary"]

GPU_POLICIES = ("gpu-pr24344", "gpu-eagle-only", "gpu-pr24344-skip")
V1_GPU_POLICIES = ("gpu-pr24344", "gpu-eagle-only")      # the V1 runner's (hybrid_runner); the skip is V2's only


def ngram_propose(tok, lens, k: int, min_n: int = 3, max_n: int = 7):
    """vLLM's prompt lookup on every row at once: ``tok`` [B, L] token ids, ``lens`` [B] context lengths
    (``tok[b, :lens[b]]`` is row b's context). Returns ``(draft [B, k], n_valid [B])``: the up-to-k tokens
    after the EARLIEST occurrence of the LONGEST n-gram (``min_n <= n <= max_n``, n < context length) that ends
    the context and recurs ending before its last token, cut where the context ends; ``n_valid`` 0 without a
    match (``draft`` there is arbitrary). The same proposal as :func:`spec_repro.proposers.ngram.ngram_lookup`.

    How: for every candidate continuation start e (1 <= e <= len - 1), the length of the common suffix of
    ``tok[:e]`` and the context, capped at ``max_n``: the ``max_n`` comparisons of e's preceding tokens packed
    into one integer's bits, their count of leading matches read from a table of every bit pattern (``2 **
    max_n`` entries, built on the device each call); the best e is the largest such length, then the smallest e.
    About 20 kernels, no host sync. A cumulative product over the ``max_n`` comparisons gives the same lengths
    and was the lookup's cost: on an H100 at 64 rows it took 0.23 / 0.87 / 1.74 ms at widths 512 / 2,048 / 4,096,
    the table 0.04 ms at each (``data/gpu/raw/v2hybrid-h100-driver/bench/lookup_ops.txt``)."""
    import torch
    import torch.nn.functional as F

    if min_n < 1 or max_n < min_n or k < 1:
        raise ValueError(f"need 1 <= min_n <= max_n and k >= 1, got min_n={min_n}, max_n={max_n}, k={k}")
    B, L = tok.shape
    dev = tok.device
    lens = lens.to(torch.int64)
    jn = torch.arange(max_n, device=dev)
    suf = tok.gather(1, (lens[:, None] - 1 - jn).clamp(0, L - 1))            # suf[b, j] = tok[b, len-1-j]
    pad = F.pad(tok, (max_n, 0), value=-1)                                  # -1: never a token id
    prev = pad.unfold(1, max_n, 1)[:, :L, :].flip(-1)                        # prev[b, e, j] = tok[b, e-1-j]
    bits = ((prev == suf[:, None, :]).to(torch.int32) * (1 << jn).to(torch.int32)).sum(-1)   # [B, L]: bit j, match j
    pat = torch.arange(1 << max_n, device=dev)
    lead = ((pat[:, None] >> jn) & 1).cumprod(-1).sum(-1)        # [2 ** max_n]: each pattern's leading matches
    m = lead[bits]                                                        # [B, L] common suffix length, <= max_n
    m = torch.minimum(m, (lens - 1).clamp_min(0)[:, None])                # n < context length
    e = torch.arange(L, device=dev)
    ok = (e[None, :] >= 1) & (e[None, :] <= lens[:, None] - 1)
    m = torch.where(ok, m, torch.zeros((), dtype=m.dtype, device=dev))
    best = (m.to(torch.int64) * (L + 1) + (L - e)[None, :]).argmax(1)         # longest, then earliest
    n = m.gather(1, best[:, None])[:, 0]
    idx = best[:, None] + torch.arange(k, device=dev)
    valid = (n >= min_n)[:, None] & (idx < lens[:, None])
    draft = tok.gather(1, idx.clamp_max(L - 1))
    return draft, valid.sum(1)


def mix(eagle, ng_draft, ng_valid, use_ngram: bool = True):
    """One ``[B, k]`` draft per request, EAGLE's dtype: n-gram's first ``ng_valid[b]`` tokens and EAGLE's after
    them where n-gram matched (``ng_valid > 0``), EAGLE's row elsewhere; ``use_ngram=False`` (``gpu-eagle-only``):
    EAGLE's rows, through the same kernel. Returns ``(draft, chose_ngram [B] bool)``."""
    import torch

    k = eagle.shape[1]
    nv = ng_valid[:, None] if use_ngram else torch.zeros_like(ng_valid)[:, None]
    take = torch.arange(k, device=eagle.device)[None, :] < nv
    return torch.where(take, ng_draft[:, :k].to(eagle.dtype), eagle), nv[:, 0] > 0


def step_summary(chose, ng_valid, k: int):
    """The step's counts as one small device tensor (copied to the host without a wait, read when the step log
    row is built): [requests on n-gram, n-gram tokens proposed]."""
    import torch

    return torch.stack([chose.sum(), torch.where(chose, ng_valid.clamp_max(k), 0).sum()]).to(torch.int64)


def summary_row(counts: Sequence[int], n_reqs: int, k: int, graph: bool = False) -> dict:
    """The step log's ``hybrid`` entry (``LiveHybrid.summary``'s keys) from :func:`step_summary`'s counts: every
    request has ``k`` tokens, n-gram's where it matched and EAGLE's at every other position; ``graph``: the step
    was a CUDA-graph replay (:class:`DeviceStep`)."""
    ng, ngt = int(counts[0]), int(counts[1])
    return {"ngram": ng, "eagle": int(n_reqs) - ng, "none": 0, "ngram_tokens": ngt,
            "eagle_tokens": int(n_reqs) * int(k) - ngt, "eagle_needed": n_reqs > 0, "pad_tokens": 0,
            "gpu": True, "graph": bool(graph)}


def _cuda_capture(fn, warmups: int = 2, pool=None):
    """``fn`` captured as a CUDA graph (the usual recipe: warm-up runs on a side stream, then the capture) into
    memory ``pool`` (None: a pool of its own): returns (replay, fn's outputs, written in place by every replay)."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    # thread_local: only this thread's calls are checked during the capture; vLLM's own threads (the async
    # output copies) go on as they are
    with torch.cuda.graph(g, pool=pool, capture_error_mode="thread_local"):
        out = fn()
    return g.replay, out


class GraphSteps:
    """The CUDA-graph bookkeeping of a device-side step (:class:`DeviceStep`, ``hybrid_v2.MergeStep``): at most
    ``max_graphs`` shapes get a graph (``capture``: how; tests pass a stand-in with a graph's semantics), each
    checked against the eager path on its first ``checks`` replays; a capture that fails or a replay that differs
    turns graphs off for good (``off_reason``, said once), and the eager path goes on.

    One memory pool for all of a step's graphs: their memory is the largest graph's, not the sum (the lookup's
    [B, W, 7] intermediates grow with the history's width). Sharing is safe here because a replay's outputs are
    consumed (cloned or copied out, in stream order) before any other graph of the step replays, and graphs never
    run at once; a graph that read another's leftovers would differ from the eager path on its checked replays."""

    WHAT = "device-side hybrid", "steps"      # who says it, what goes on eager

    def __init__(self, graphs: bool, checks: int = 2, capture=None, max_graphs: int = 16):
        self.graphs, self.checks = bool(graphs), int(checks)
        self._capture, self.max_graphs = capture or self._pooled_capture, int(max_graphs)
        self._g: dict = {}
        self._pool = None
        self.off_reason: str | None = None
        self.replays = 0
        self.last_graph = False         # whether the last call was a CUDA-graph replay (the step log's ``graph``)

    def _pooled_capture(self, fn):
        import torch

        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return _cuda_capture(fn, pool=self._pool)

    def _full(self, key) -> bool:
        """No graph for ``key`` and no room for another: its steps run eager."""
        return key not in self._g and len(self._g) >= self.max_graphs

    def _off(self, why: str) -> None:
        import sys

        self.graphs, self._g = False, {}
        if self.off_reason is None:
            self.off_reason = why
            who, what = self.WHAT
            print(f"[spec_repro] {who}: CUDA graphs OFF (eager {what} go on): {why}", file=sys.stderr, flush=True)


class DeviceStep(GraphSteps):
    """One step of the device-side hybrid for a batch: this step's tokens into the history, n-gram's lookup, the
    mix with EAGLE's drafts, the step's counts; ``(draft [B, k], counts [2])``.

    Eager (:meth:`eager`: ~40 kernels launched from Python, ~0.5-1.4 ms of host time a step on the H200:
    data/gpu/v1-runner/engine-per-policy), or
    on a CUDA device one graph replay per batch shape (``graphs``, default: on where the device is CUDA): the
    host's work is then four input copies and a replay. A shape's graph is captured at its first step, its warm-up
    and capture pointed at the history's scratch row (no request's tokens move), and checked against the eager path
    from the same state on its first ``checks`` replays (history, draft and counts equal); a capture that fails or
    a check that differs turns graphs off for good, says why once (``off_reason``), and the eager path goes on.
    ``capture``: how to capture (tests pass a stand-in with a graph's semantics: the same static buffers, outputs
    written in place). At most ``max_graphs`` shapes get a graph (the rest run eager)."""

    def __init__(self, history: "DeviceHistory", use_ngram: bool, graphs: bool | None = None, checks: int = 2,
                 capture=None, max_graphs: int = 16):
        super().__init__(history.device.type == "cuda" if graphs is None else graphs, checks, capture, max_graphs)
        self.h, self.use_ngram = history, bool(use_ngram)

    def eager(self, rows, sampled, keep, eagle, vocab_size=None):
        h, k = self.h, int(eagle.shape[1])
        h.append(rows, sampled, keep, vocab_size)
        ng, nv = h.propose(rows, k)
        draft, chose = mix(eagle, ng, nv, use_ngram=self.use_ngram)
        return draft, step_summary(chose, nv, k)

    def __call__(self, rows, sampled, keep, eagle, vocab_size=None):
        self.last_graph = False
        if not self.graphs:
            return self.eager(rows, sampled, keep, eagle, vocab_size)
        torch = self.h.torch
        key = (int(rows.shape[0]), int(sampled.shape[1]), int(eagle.shape[1]), sampled.dtype, eagle.dtype,
               vocab_size)
        if self._full(key):                 # a ragged tail of batch sizes: eager
            return self.eager(rows, sampled, keep, eagle, vocab_size)
        try:
            g = self._g.get(key) or self._build(key, rows, sampled, eagle, vocab_size)
            g["rows"].copy_(rows)
            g["sampled"].copy_(sampled)
            if keep is None:
                g["keep"].fill_(True)
            else:
                g["keep"].copy_(keep[: rows.shape[0]].to(torch.bool))
            g["eagle"].copy_(eagle)
            if g["checks"] > 0:
                return self._checked(g, rows, sampled, keep, eagle, vocab_size)
            g["replay"]()
        except Exception as e:              # never break the engine for a faster path
            self._off(f"{type(e).__name__}: {e}")
            return self.eager(rows, sampled, keep, eagle, vocab_size)
        self.replays += 1
        self.last_graph = True
        return g["out"][0].clone(), g["out"][1].clone()

    def _build(self, key, rows, sampled, eagle, vocab_size):
        torch, h = self.h.torch, self.h
        g = {"rows": torch.full_like(rows, h.max_reqs), "sampled": torch.zeros_like(sampled),
             "keep": torch.ones(rows.shape[0], dtype=torch.bool, device=rows.device),
             "eagle": torch.zeros_like(eagle), "checks": self.checks}
        scratch_len = h.len[h.max_reqs].clone()
        g["replay"], g["out"] = self._capture(
            lambda: self.eager(g["rows"], g["sampled"], g["keep"], g["eagle"], vocab_size))
        h.len[h.max_reqs] = scratch_len     # the warm-up and capture wrote only the scratch row
        self._g[key] = g
        return g

    def _checked(self, g, rows, sampled, keep, eagle, vocab_size):
        torch, h = self.h.torch, self.h
        tok0, len0 = h.tok.clone(), h.len.clone()
        g["replay"]()
        got = (h.tok.clone(), h.len.clone(), g["out"][0].clone(), g["out"][1].clone())
        h.tok.copy_(tok0)
        h.len.copy_(len0)
        want = self.eager(rows, sampled, keep, eagle, vocab_size)
        sc = h.max_reqs           # the scratch row takes rejected writes: its contents are not compared
        try:                      # the eager step has run: whatever happens now, its result stands
            same = (torch.equal(got[0][:sc], h.tok[:sc]) and torch.equal(got[1][:sc], h.len[:sc])
                    and torch.equal(got[2], want[0]) and torch.equal(got[3], want[1]))
        except Exception:
            same = False
        if not same:
            self._off("a graph replay differed from the eager step (history, draft or counts)")
            return want
        g["checks"] -= 1
        return want


class DeviceHistory:
    """Each request's token ids (prompt + every token emitted) in a device buffer, one row per request.

    ``tok`` [max_reqs + 1, max_len] int32 and ``len`` [max_reqs + 1] int64; the last row is scratch (writes that
    must not land go there). A request gets a row at its first step (:meth:`rows`, its prompt copied from the
    host once) and gives it back when it finishes (:meth:`forget`). The rows are the host's only bookkeeping
    (req_id -> row); every count stays on the device.

    A request the engine did not hand to the drafter at some step (vLLM skips drafting for inputs too long for
    the drafter) misses that step's tokens here: its n-gram proposals are then of a wrong context, which costs
    acceptance, never correctness (verification is the target's)."""

    def __init__(self, max_reqs: int, max_len: int, device=None):
        import torch

        self.torch = torch
        self.max_reqs, self.max_len = int(max_reqs), int(max_len)
        self.device = torch.device(device or "cpu")
        self.tok = torch.zeros(self.max_reqs + 1, self.max_len, dtype=torch.int32, device=self.device)
        self.len = torch.zeros(self.max_reqs + 1, dtype=torch.int64, device=self.device)
        self.row_of: dict[str, int] = {}
        self._free = list(range(self.max_reqs - 1, -1, -1))
        self._last_ids: tuple = ()
        self._last_rows = None
        self._pin = self.device.type == "cuda"

    def _to_dev(self, values, dtype):
        t = self.torch.as_tensor(values, dtype=dtype)
        if self._pin:
            t = t.pin_memory()
        return t.to(self.device, non_blocking=True)

    def forget(self, req_ids) -> None:
        for r in req_ids or ():
            row = self.row_of.pop(r, None)
            if row is not None:
                self._free.append(row)
                self._last_ids = ()

    def rows(self, req_ids: Sequence[str], prompt_of: Callable[[str], Sequence[int]]):
        """The rows of this step's requests, in the batch's order (a device tensor, reused while the batch is
        unchanged); a request seen for the first time gets a row with its prompt."""
        ids = tuple(req_ids)
        if ids == self._last_ids and self._last_rows is not None:
            return self._last_rows
        for r in ids:
            if r not in self.row_of:
                if not self._free:     # requests that finished unseen: free the rows of those not in this batch
                    self.forget([x for x in list(self.row_of) if x not in set(ids)])
                if not self._free:
                    raise RuntimeError(f"DeviceHistory: more than {self.max_reqs} requests at once")
                row = self._free.pop()
                p = list(prompt_of(r))[: self.max_len]
                self.row_of[r] = row
                if p:
                    self.tok[row, : len(p)] = self._to_dev(p, self.torch.int32)
                self.len[row] = len(p)
        self._last_ids = ids
        self._last_rows = self._to_dev([self.row_of[r] for r in ids], self.torch.int64)
        return self._last_rows

    def append(self, rows, sampled, keep=None, vocab_size: int | None = None):
        """Append this step's emitted tokens: ``sampled`` [B, W] (the sampler's output, -1 after the first
        rejection), ``keep`` [B] bool (False: a row whose sample vLLM throws away, a partial prefill chunk),
        ids >= ``vocab_size`` dropped (as ``RejectionSampler.parse_output``). Returns the tokens per row [B]."""
        torch = self.torch
        B, W = sampled.shape
        valid = sampled >= 0
        if vocab_size is not None:
            valid &= sampled < int(vocab_size)
        if keep is not None:
            valid &= keep[:B, None].to(torch.bool)
        # valid tokens form a prefix of each row (placeholders only follow the first rejection)
        j = torch.arange(W, device=sampled.device)
        pos = self.len[rows][:, None] + j[None, :]
        valid &= pos < self.max_len
        L = self.max_len
        lin = torch.where(valid, rows[:, None] * L + pos, self.max_reqs * L + j[None, :])
        self.tok.view(-1)[lin.reshape(-1)] = sampled.reshape(-1).to(torch.int32)
        n = valid.sum(1)
        self.len.index_add_(0, rows, n)
        return n

    def propose(self, rows, k: int, min_n: int = 3, max_n: int = 7):
        """n-gram's proposal for each row's context (:func:`ngram_propose`)."""
        return ngram_propose(self.tok[rows], self.len[rows], k, min_n, max_n)

    def context(self, req_id: str) -> list[int]:
        """A request's token ids as held here (host copy: for tests and checks, not for the step)."""
        row = self.row_of[req_id]
        return self.tok[row, : int(self.len[row])].tolist()
