"""The device-side n-gram + EAGLE hybrid on vLLM 0.25's V2 model runner: PR #24344's rule inside V2's EAGLE
speculator, with no host round trip (policies ``gpu_hybrid.GPU_POLICIES``, ``SPEC_REPRO_HYBRID=<policy>``).

Where it sits. V2's runner (``vllm/v1/worker/gpu/model_runner.py``, ``sample_tokens``) samples, then
``postprocess_sampled`` appends each request's accepted tokens to ``req_states.all_token_ids`` (a
``[max_num_reqs, max_model_len]`` int32 buffer, host memory mapped to the device: UVA) and advances
``req_states.total_len`` (``input_batch.post_update``, a Triton kernel), then calls
``speculator.propose(input_batch, ...)``, which returns EAGLE's drafts ``[num_reqs, k]`` int64 (a view of the
speculator's ``draft_tokens``); the runner stores them in ``req_states.draft_tokens[idx_mapping]`` and the next
step reads them on the device (``combine_sampled_and_draft_tokens``); the scheduler only holds k placeholders per
request (``DraftTokensHandler``: -1s unless structured outputs are on). So every request always carries k drafts
(a uniform ``1 + k`` batch) and no token goes through the host.

The wrap. ``AutoRegressiveSpeculator.propose`` is wrapped: vLLM's EAGLE drafts as it would, then the n-gram lookup
(``gpu_hybrid.ngram_propose``, vLLM's prompt-lookup semantics, 3..7) runs over each request's row of
``all_token_ids`` (up to ``total_len``: the prompt and every token emitted, this step's included) and
``gpu_hybrid.mix`` puts n-gram's tokens where it matched (EAGLE's after its continuation ends) and EAGLE's row
elsewhere; the merged ``[num_reqs, k]`` tensor (EAGLE's dtype) is returned in place of EAGLE's. The speculator's
own ``draft_tokens`` are left as EAGLE wrote them (its next draft step reads them). The lookup reads only the
first W columns, W = the batch's host-side upper bound on sequence length + 1 (``input_batch.
seq_lens_cpu_upper_bound``, a CPU tensor vLLM keeps: no sync) rounded up to 256 times a power of two, at most
``max_model_len``. ``GPUModelRunner.__init__`` is wrapped to hand the speculator its runner's ``req_states``.

vLLM keeps ``all_token_ids`` in host memory mapped to the device (UVA: it is ``[max_num_reqs, max_model_len]``,
"for a large but not-frequently-accessed tensor"), so a lookup over it reads B x W of it over PCIe every step.
The lookup reads a device copy instead (:class:`TokenMirror`). The idle machinery's extra drafting grew with
B x W either way (data/gpu/live, and data/gpu/live/host-buffer over vLLM's buffer): not the read but the lookup's
GPU time, most of it one kernel, the cumulative product that counted each position's matches (0.86 of 0.99 ms
at 64 rows of 2,048 on an H100; ``benchmarks/v2_merge.py`` times the merge alone, and
data/gpu/raw/v2hybrid-h100-driver/bench the lookup's kernels); ``gpu_hybrid.ngram_propose`` reads the count from a
table of bit patterns instead. The copy: a request's whole row is copied on the steps vLLM prefills it
(``input_batch.is_prefilling_np``: new, resumed and chunked requests, whatever vLLM staged into the row), every
row of the batch when the step before was not seen (a policy switched on, the hybrid off in between), and
otherwise only each row's last ``1 + k`` positions (the most one step appends), inside the merge's graph.

Policies: ``gpu-pr24344`` (the rule), ``gpu-eagle-only`` (the same kernels, every row EAGLE's: the machinery's
cost, idle) and ``gpu-pr24344-skip``: PR #24344 with EAGLE's drafting skipped when no request needs it. On V2
EAGLE drafts in captured CUDA graphs, one draft prefill (the accepted tokens' KV for the head, and its first
token) and k - 1 draft decode steps; deciding on this step's lookup would need the lookup's result on the host
before the decode steps are launched (a sync the async runner avoids). What runs without a sync: the draft
prefill always (EAGLE's KV must hold every accepted token), and the k - 1 decode steps
(``_multi_step_decode``) skipped for the whole batch when, at the latest step whose flag has reached the host
(a non-blocking copy, read when its event has completed: ``SkipGate``, usually the step before), every request
of the batch matched. A skipped step's positions after n-gram's continuation hold the speculator's stale tokens
(valid ids from an earlier step): acceptance may drop there, outputs cannot change.

Lossless by construction: only draft tokens change, and V2 verifies them by the target (greedy: the target's
argmax; draft sampling ``greedy``, vLLM's default, treats draft probabilities as one-hot; the hybrid goes off
with probabilistic draft sampling, whose draft logits would not match n-gram's rows).

Launches: the merge is ~25 small kernels; on a GPU it is replayed as one CUDA graph per shape (``MergeStep``,
checked against the eager merge on its first replays; ``SPEC_REPRO_HYBRID_GRAPHS=0``: eager).

The step log's ``hybrid`` entry (with the timer on): requests and tokens on n-gram vs EAGLE (``resolve_counts``:
a non-blocking copy read when the row is built), ``eagle_skipped``, ``graph`` (the merge replayed a CUDA graph),
``runner: v2``.
"""
from __future__ import annotations

import os
import sys
from collections import deque

from . import v2_contract as C
from .common import ENV_HYBRID, HYBRID_OFF
from .gpu_hybrid import GraphSteps
from .hybrid_runner import _hybrid_off
from .state import _state, logger

HYBRID_WRAPPED = (
    f"{C.V2_RUNNER_MODULE}:GPUModelRunner.__init__",
    f"{C.V2_SPEC_MODULE}:AutoRegressiveSpeculator.propose",
    f"{C.V2_SPEC_MODULE}:AutoRegressiveSpeculator._multi_step_decode",
)
WINDOW_BUCKET = 256


def lookup_width(seq_lens_upper, num_reqs: int, max_len: int, bucket: int = WINDOW_BUCKET) -> int:
    """Columns of the token buffer the lookup reads: the batch's upper bound on sequence length (a CPU tensor or
    array) + 1 (this step's bonus token), rounded up to ``bucket`` times a power of two (a few widths, so a few
    graphs: the lookup over the device copy costs little per column), at most ``max_len``."""
    ub = int(seq_lens_upper[:num_reqs].max()) + 1 if num_reqs else 1
    w = bucket
    while w < ub:
        w *= 2
    return int(min(max_len, w))


def padded_batch(n: int) -> int:
    """The batch a graph of the merge is captured for: 1, 2, 4, 8, then multiples of 8 (vLLM's CUDA-graph sizes)."""
    if n <= 8:
        return 1 << max(0, (n - 1).bit_length())
    return -(-n // 8) * 8


def v2_merge(all_token_ids, total_len, idx_mapping, eagle, width: int, use_ngram: bool = True, min_n: int = 3,
             max_n: int = 7):
    """The hybrid's drafts from V2's tensors: ``all_token_ids`` [max_num_reqs, max_model_len] int32 (each request
    slot's prompt + emitted tokens), ``total_len`` [max_num_reqs] int32, ``idx_mapping`` [num_reqs] int32 (batch
    row -> slot), ``eagle`` [num_reqs, k] (EAGLE's drafts). Returns ``(draft [num_reqs, k] eagle's dtype,
    chose_ngram [num_reqs] bool, ngram_valid [num_reqs])``. Pure torch, no host sync."""
    import torch

    from .gpu_hybrid import mix, ngram_propose

    k = int(eagle.shape[1])
    W = max(1, min(int(width), int(all_token_ids.shape[1])))
    rows = idx_mapping.to(torch.int64).clamp_min(0)
    tok = all_token_ids[:, :W].index_select(0, rows)
    lens = total_len.index_select(0, rows).to(torch.int64).clamp(0, W)
    ng, nv = ngram_propose(tok, lens, k, min_n, max_n)
    draft, chose = mix(eagle, ng, nv, use_ngram=use_ngram)
    return draft, chose, nv


def sync_tail(mirror, src, total_len, idx_mapping, tail: int) -> None:
    """Copy each batch row's last ``tail`` positions (``total_len - tail`` .. ``total_len - 1`` of its slot) from
    vLLM's buffer ``src`` into ``mirror`` (as wide as the lookup reads): ``num_reqs x tail`` reads of ``src``, no
    host sync."""
    import torch

    r = idx_mapping.to(torch.int64).clamp_min(0)[:, None]
    pos = total_len.index_select(0, r[:, 0]).to(torch.int64)[:, None] - tail + torch.arange(tail, device=r.device)
    pos = pos.clamp(0, int(mirror.shape[1]) - 1)
    mirror[r, pos] = src[r, pos]


class TokenMirror:
    """A device copy of the rows of vLLM's token buffer the lookup reads (module docstring: vLLM's is in host
    memory). ``fill`` copies whole rows (``slots`` a host array, or every row of ``rows`` when None) up to
    ``width``; :func:`sync_tail`, inside the merge, the rest. The copy grows with the widest lookup, at most
    vLLM's row; ``seen``: the speculator's step it was last brought up to date at."""

    def __init__(self):
        self.tok = None
        self.seen = None

    def fill(self, src, width: int, rows=None, slots=None) -> None:
        import torch

        n_rows, max_len = int(src.shape[0]), int(src.shape[1])
        width = max(1, min(int(width), max_len))
        have = 0 if self.tok is None else int(self.tok.shape[1])
        if width > have:
            grown = torch.zeros(n_rows, min(max_len, max(width, 2 * have)), dtype=src.dtype, device=src.device)
            if have:
                grown[:, :have] = self.tok
            self.tok = grown
        if slots is not None:
            if len(slots) == 0:
                return
            rows = torch.as_tensor(slots, dtype=torch.int64).to(src.device, non_blocking=True)
        idx = rows.to(torch.int64).clamp_min(0)
        self.tok[idx, :width] = src[idx, :width]


class MergeStep(GraphSteps):
    """One step's merge, ``(draft, counts [2], every row matched)``: eager (:meth:`eager`, ~25 kernels launched from
    Python), or on a CUDA device one graph replay per shape (padded batch, lookup width, k): the host then copies the
    batch's slot indices and EAGLE's drafts into the graph's static inputs and replays (vLLM's token buffer and
    lengths are read in place: their addresses do not change). The merge writes nothing of vLLM's, so a capture
    needs no scratch state. A shape's first ``checks`` replays are compared with the eager merge (a sync, on those
    steps only); a capture that fails or a replay that differs turns graphs off for good with one message, and the
    eager merge goes on. ``SPEC_REPRO_HYBRID_GRAPHS=0``: eager. At most ``max_graphs`` shapes get a graph."""

    WHAT = "V2 hybrid", "merges"

    def __init__(self, use_ngram: bool, graphs: bool | None = None, checks: int = 2, capture=None,
                 max_graphs: int = 64):
        import torch

        super().__init__(torch.cuda.is_available() if graphs is None else graphs, checks, capture, max_graphs)
        self.use_ngram = bool(use_ngram)
        self._ptr = None

    def eager(self, tok, total, rows, eagle, width: int, src=None, tail: int = 0, n_live=None):
        """The merge launched op by op; ``n_live`` (a device scalar): only the first ``n_live`` rows are requests
        (the rest pad a graph's batch), and only they count in the counts and the every-row-matched flag."""
        import torch

        from .gpu_hybrid import step_summary

        if src is not None and tail > 0:
            sync_tail(tok, src, total, rows, tail)
        draft, chose, nv = v2_merge(tok, total, rows, eagle, width, use_ngram=self.use_ngram)
        if n_live is None:
            return draft, step_summary(chose, nv, int(eagle.shape[1])), chose.all()
        live = torch.arange(chose.shape[0], device=chose.device) < n_live
        return draft, step_summary(chose & live, nv, int(eagle.shape[1])), (chose | ~live).all()

    def __call__(self, tok, total, rows, eagle, width: int, src=None, tail: int = 0):
        """The merge over ``tok`` (vLLM's buffer, or a :class:`TokenMirror`'s with ``src`` vLLM's buffer and ``tail``
        the positions a step may append: those are copied first, in the same graph). A graph is kept per padded
        batch (:func:`padded_batch`: requests finish one by one, so a batch passes through every size) and width."""
        self.last_graph = False
        n = int(rows.shape[0])
        if not self.graphs or n == 0:
            return self.eager(tok, total, rows, eagle, width, src, tail)
        if self._g and tok.data_ptr() != self._ptr:        # the mirror grew: the graphs read the old buffer
            self._g = {}
        self._ptr = tok.data_ptr()
        b = padded_batch(n)
        key = (b, int(width), int(eagle.shape[1]), rows.dtype, eagle.dtype, tok.data_ptr(), total.data_ptr(),
               None if src is None else src.data_ptr(), int(tail))
        if self._full(key):
            return self.eager(tok, total, rows, eagle, width, src, tail)
        try:
            g = self._g.get(key)
            if g is None:
                g = {"rows": rows[-1:].expand(b).clone(), "eagle": eagle[-1:].expand(b, -1).clone(),
                     "n": rows.new_full((), n), "checks": self.checks}
                g["replay"], g["out"] = self._capture(
                    lambda: self.eager(tok, total, g["rows"], g["eagle"], width, src, tail, g["n"]))
                self._g[key] = g
            g["rows"][:n].copy_(rows)
            g["eagle"][:n].copy_(eagle)
            if b > n:                          # padding: the last request again (its tail copy is the same)
                g["rows"][n:].copy_(rows[-1:].expand(b - n))
                g["eagle"][n:].copy_(eagle[-1:].expand(b - n, -1))
            g["n"].fill_(n)
            g["replay"]()
            if g["checks"] > 0:
                want = self.eager(tok, total, rows, eagle, width, src, tail)
                got = (g["out"][0][:n], g["out"][1], g["out"][2])
                if not all(bool((a == w).all()) for a, w in zip(got, want)):
                    self._off("a graph replay differed from the eager merge")
                    return want
                g["checks"] -= 1
                return want
        except Exception as e:              # never break the engine for a faster path
            self._off(f"{type(e).__name__}: {e}")
            return self.eager(tok, total, rows, eagle, width, src, tail)
        self.replays += 1
        self.last_graph = True
        draft, counts, flag = g["out"]      # counts and flag are copied out at once (stream order); the draft is
        return draft[:n].clone(), counts, flag  # a fresh tensor, as vLLM's own propose hands over


class SkipGate:
    """The whole-batch skip decision without a sync: each step's flag (every request matched) is copied to host
    memory without waiting and read once its event has completed; ``decide`` returns the latest flag that has
    arrived (False before any). ``event``: a factory of events with ``record()`` / ``query()`` (CUDA events on a
    GPU; tests pass stand-ins)."""

    def __init__(self, event=None, pin: bool | None = None, max_pending: int = 8):
        import torch

        self.torch = torch
        self.pin = torch.cuda.is_available() if pin is None else bool(pin)
        self.event = event or (torch.cuda.Event if torch.cuda.is_available() else _Done)
        self.pending: deque = deque()
        self.last: bool | None = None
        self.max_pending = int(max_pending)

    def push(self, flag) -> None:
        buf = self.torch.empty(1, dtype=self.torch.bool, pin_memory=self.pin)
        buf.copy_(flag.reshape(1), non_blocking=True)
        ev = self.event()
        ev.record()
        self.pending.append((ev, buf))
        while len(self.pending) > self.max_pending:    # keep the newest few (older ones are superseded)
            self.pending.popleft()

    def decide(self) -> bool:
        while self.pending and self.pending[0][0].query():
            _ev, buf = self.pending.popleft()
            self.last = bool(buf[0])
        return bool(self.last)


class _Done:
    """The event of a copy that completed when it was made (CPU tensors: the copy is synchronous)."""

    def record(self, *args) -> None:
        pass

    def query(self) -> bool:
        return True


#: the counts' copies: one pinned [RING_ROWS, 2] buffer, a row a step (no buffer allocated per step); more rows
#: than the step timer holds steps before it resolves them (2 x StepRecorder.DEFER_CAP)
RING_ROWS = 16384
_RING: list = [None, 0]


def resolve_counts(h) -> dict:
    """A step's ``hybrid`` entry from its ring row: (row, requests, k, skipped, graph: the merge replayed a CUDA
    graph) -> ``gpu_hybrid.summary_row``."""
    from .gpu_hybrid import summary_row

    i, n, k, skipped, graph = h
    row = summary_row(_RING[0][i].tolist(), n, k, graph=graph)
    row.update(eagle_needed=row["eagle"] > 0, eagle_skipped=bool(skipped), runner="v2")
    return row


class V2Hybrid:
    """One speculator's hybrid under one policy."""

    def __init__(self, name: str, event=None, graphs: bool | None = None, capture=None):
        from .common import ENV_HYBRID_GRAPHS
        from .gpu_hybrid import GPU_POLICIES

        if name not in GPU_POLICIES:
            raise ValueError(f"{name!r} is not a device-side policy ({', '.join(GPU_POLICIES)})")
        self.name, self.use_ngram = name, name != "gpu-eagle-only"
        self.gate = SkipGate(event) if name == "gpu-pr24344-skip" else None
        if graphs is None and os.environ.get(ENV_HYBRID_GRAPHS, "1") == "0":
            graphs = False
        self.merge = MergeStep(self.use_ngram, graphs=graphs, capture=capture)
        self.steps = self.skipped = 0

    @property
    def last_graph(self) -> bool:
        """Whether the last step's merge was a CUDA-graph replay (the step log's ``graph``)."""
        return self.merge.last_graph

    def step(self, req_states, input_batch, eagle, max_len: int, mirror: TokenMirror, call: int):
        """(draft, counts [2] device tensor); this step's 'every row matched' goes to the skip gate. The lookup
        reads ``mirror`` (the speculator's device copy; ``call``: its step count), brought up to date here (whole
        rows where vLLM prefills, or all when the step before was not seen) and in the merge (the rest)."""
        n = int(input_batch.num_reqs)
        w = lookup_width(input_batch.seq_lens_cpu_upper_bound, n, max_len)
        src, total, rows = req_states.all_token_ids.gpu, req_states.total_len.gpu, input_batch.idx_mapping[:n]
        pre = getattr(input_batch, "is_prefilling_np", None)
        slots = getattr(input_batch, "idx_mapping_np", None)
        if mirror.seen is None or call != mirror.seen + 1 or pre is None or slots is None:
            mirror.fill(src, w, rows=rows)
        else:
            mirror.fill(src, w, slots=slots[:n][pre[:n]])
        mirror.seen = call
        draft, counts, all_matched = self.merge(mirror.tok, total, rows, eagle[:n], w, src=src,
                                                tail=int(eagle.shape[1]) + 1)
        if self.gate is not None:
            self.gate.push(all_matched)
        self.steps += 1
        return draft, counts


def patch_hybrid_v2(classes: dict) -> bool:
    """Wrap V2's runner ``__init__`` and the EAGLE speculator's ``propose`` / ``_multi_step_decode`` (see the module
    docstring) after checking them against the contract; False, with one message, where the policy or vLLM does
    not fit (vLLM then runs its own EAGLE)."""
    from .gpu_hybrid import GPU_POLICIES

    name = os.environ.get(ENV_HYBRID, "")
    if name not in GPU_POLICIES:
        _hybrid_off(f"{ENV_HYBRID}={name!r}: the V2 runner runs the device-side policies ({', '.join(GPU_POLICIES)});"
                    " host-side ones need the V1 runner (VLLM_USE_V2_MODEL_RUNNER=0, engine model_runner='v1')")
        return False
    problems = C.check(classes, names=HYBRID_WRAPPED)
    if problems:
        _hybrid_off("a vLLM other than the contract's: " + "; ".join(problems))
        return False
    runner = classes[f"{C.V2_RUNNER_MODULE}:GPUModelRunner"]
    spec = classes[f"{C.V2_SPEC_MODULE}:AutoRegressiveSpeculator"]
    orig_init, orig_propose = runner.__dict__["__init__"], spec.__dict__["propose"]
    orig_decode = spec.__dict__["_multi_step_decode"]
    if getattr(orig_propose, "_spec_repro_hybrid", False):
        return False

    def __init__(self, vllm_config, device, *args, **kwargs):
        orig_init(self, vllm_config, device, *args, **kwargs)
        _state["runner"] = "v2"
        sp = getattr(self, "speculator", None)
        if sp is not None:
            sp._spec_repro_req_states = self.req_states

    def propose(self, input_batch, *args, **kwargs):
        now = _state["hybrid_now"] or name
        if kwargs.get("dummy_run"):
            return orig_propose(self, input_batch, *args, **kwargs)
        self._spec_repro_calls = call = self.__dict__.get("_spec_repro_calls", 0) + 1   # every drafting step
        if now == HYBRID_OFF:
            return orig_propose(self, input_batch, *args, **kwargs)
        hy = _v2_hybrid(self, now)
        if hy is None:
            return orig_propose(self, input_batch, *args, **kwargs)
        skip = hy.gate.decide() if hy.gate is not None else False
        self._spec_repro_skip_decode = skip
        try:
            eagle = orig_propose(self, input_batch, *args, **kwargs)
        finally:
            self._spec_repro_skip_decode = False
        hy.skipped += bool(skip)
        try:
            mirror = self.__dict__.setdefault("_spec_repro_mirror", TokenMirror())   # one for every policy
            draft, counts = hy.step(self._spec_repro_req_states, input_batch, eagle, self.max_model_len, mirror, call)
        except Exception as e:          # never break the engine: this policy off, EAGLE's drafts go on
            self._spec_repro_hybrids[now] = None
            _hybrid_off(f"{now}: {type(e).__name__}: {e}")
            return eagle
        _log_counts(counts, int(input_batch.num_reqs), int(eagle.shape[1]), skip, hy.last_graph)
        return draft

    def _multi_step_decode(self, *args, **kwargs):
        if getattr(self, "_spec_repro_skip_decode", False):     # gpu-pr24344-skip: the batch's decode steps
            return None
        return orig_decode(self, *args, **kwargs)

    for fn, orig in ((__init__, orig_init), (propose, orig_propose), (_multi_step_decode, orig_decode)):
        fn._spec_repro_orig = getattr(orig, "_spec_repro_orig", orig)
    propose._spec_repro_hybrid = True
    runner.__init__, spec.propose, spec._multi_step_decode = __init__, propose, _multi_step_decode
    _state["hybrid"], _state["hybrid_installed"] = name, True
    return True


def _v2_hybrid(speculator, name: str):
    """The speculator's hybrid for ``name`` (built at its first drafting step under that policy, then kept), or
    None where it cannot run (the reason once, in the status's ``hybrid_error``)."""
    built = speculator.__dict__.setdefault("_spec_repro_hybrids", {})
    if name not in built:
        built[name] = _build(speculator, name)
    return built[name]


def _build(speculator, name: str):
    sc = getattr(speculator, "speculative_config", None)
    method = getattr(sc, "method", None)
    if method not in ("eagle", "eagle3"):
        _hybrid_off(f"the hybrid needs method 'eagle' or 'eagle3', vLLM runs {method!r}")
    elif getattr(speculator, "draft_logits", None) is not None:
        _hybrid_off("probabilistic draft sampling: EAGLE's draft logits would not match n-gram's rows (use vLLM's "
                    "default draft_sample_method='greedy')")
    elif getattr(speculator, "_spec_repro_req_states", None) is None:
        _hybrid_off("the speculator was built before the plugin wrapped GPUModelRunner.__init__: no token buffer")
    else:
        try:
            return V2Hybrid(name)
        except Exception as e:
            _hybrid_off(f"{type(e).__name__}: {e}")
    return None


def _log_counts(counts, n: int, k: int, skipped: bool, graph: bool = False) -> None:
    """The step's [requests on n-gram, n-gram tokens] copied without a wait into the ring's next row; the step
    keeps only (row, n, k, skipped, graph), resolved with its row (``resolve_counts``)."""
    from . import step_timer

    rec = step_timer._REC[1]
    if rec is None or rec.cur is None:
        return
    try:
        import torch

        if _RING[0] is None:
            _RING[0] = torch.zeros(RING_ROWS, 2, dtype=torch.int64, pin_memory=torch.cuda.is_available())
        i = _RING[1]
        _RING[1] = (i + 1) % RING_ROWS
        _RING[0][i].copy_(counts, non_blocking=True)
        rec.cur.hybrid, rec.cur.hybrid_fn = (i, n, k, bool(skipped), bool(graph)), resolve_counts
    except Exception as e:      # the counts are the log's, never the step's
        logger.warning("spec_repro hybrid counts not logged: %s", e)
        print(f"[spec_repro] hybrid counts not logged: {e}", file=sys.stderr, flush=True)
