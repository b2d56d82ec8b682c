"""The step timer: per engine step, CUDA events on the step's stream, resolved lazily into one JSON row per step.

What is timed, per engine step (``GPUModelRunner.execute_model`` + ``sample_tokens``): CUDA events recorded on
a stream looked up once per step, resolved lazily. A step's record and its events are reused from step to step
(``_Step``): nothing allocated for a step outlives it. Where rows are built: on V1, right after the sampler is
launched, while the GPU still runs the current forward (the batch shape read from the SchedulerOutput then; the
step gains no synchronize and little host time; measured on the H200: data/gpu/overhead.csv); on V2 (``defer``),
only when the engine flushes after a ``generate`` call, the shape read at the step's start as plain numbers
(``quick_meta``), since there the host bounds a small target's step and any work on it shows, as does the
garbage collector: vLLM freezes its startup heap, so whatever the timer kept alive across steps would be walked
by every full collection (``runner_v2_patches``; each V2 row counts the process's GC pauses: ``t_gc``,
``gc_full``, and the timer's own host seconds in the step: ``t_timer``).

* ``t_verify``: target forward = ``_model_forward`` start to the end of ``execute_model`` (logits included);
* ``t_reject``: ``_sample`` (the rejection sampler with SD; the plain sampler without);
* ``t_draft``:  ``propose_draft_token_ids`` (n-gram lookup on the CPU, EAGLE/draft-model forwards on the GPU);
* ``t_other``:  the rest of the step (input preparation, bookkeeping, draft-token copies) plus the engine
  core's host time between two consecutive steps (scheduling, output processing) when that gap is shorter than
  ``SPEC_REPRO_STEP_GAP_S`` (default 0.05 s; longer gaps are idle time between ``generate`` calls).

Events measure the GPU stream's timeline; for CPU phases (the n-gram proposer runs after a sync) the stream is
idle, so the events fire at host time and measure the CPU work. Each step is written as one JSON line with the
columns of ``spec_repro.traces.STEP_COLUMNS`` plus ``phase`` (prefill/decode/mixed), ``accepted_per_req``
({req_id: accepted}) and, with detail on, ``req_info`` ({req_id: [output position before the step, scheduled
tokens, draft tokens]}) and ``new_reqs`` ({req_id: [prompt_len, sha1(prompt int32 bytes)[:12]]}); with the
hybrid on, ``hybrid`` (``hybrid.LiveHybrid.summary``: how many requests got n-gram's, EAGLE's or no draft at
this step, their draft tokens, whether EAGLE drafted; with detail, ``per_req`` {req_id: [source, k]}). A step's
``hybrid`` is what it proposed: those drafts are verified at the request's next step.
"""
from __future__ import annotations

import json
import os
import time

from .common import ENV_GAP, ENV_PATH, prompt_hash


class _Step:
    """One step's record, reused: the recorder keeps a free list of these, each with its own CUDA events, so a
    step allocates nothing that outlives it. Deferred, the batch shape is read at the step's start into plain
    numbers and its accepted counts into a {req_id: int} dict (neither is a container the garbage collector
    tracks): holding many steps until flush keeps no SchedulerOutput or event alive that the GC must walk."""

    __slots__ = ("so", "evs", "names", "n", "host_start", "host_end", "gap", "in_forward", "in_sample", "outputs",
                 "ctx", "stream", "index", "hybrid", "hybrid_fn", "awaiting", "meta", "spec", "acc", "gc_s", "gc_full",
                 "self_s", "stream_h")

    def __init__(self):
        self.evs: list = []         # CUDA events, created as marks need them and kept with the step
        self.names: list = []
        self.reset(None, 0.0, None, None, None)

    def reset(self, so, host_start, gap, ctx, stream) -> None:
        self.so, self.n, self.host_start, self.host_end, self.gap = so, 0, host_start, None, gap
        self.in_forward = self.in_sample = self.awaiting = False
        self.outputs = self.meta = self.spec = self.acc = self.hybrid = self.hybrid_fn = None
        self.ctx, self.stream, self.index, self.gc_s, self.gc_full = ctx, stream, 0, 0.0, 0
        self.stream_h = 0           # the stream's raw handle where the driver records the events (else 0)
        self.self_s = 0.0       # the timer's own host seconds in this step (begin, marks, end, the outputs' read:
        #                         each adds its perf_counter span; the wrappers' calls themselves are not in it)

    def set_outputs(self, out) -> None:
        self.awaiting = False
        try:
            if self.spec is not None:        # deferred: the accepted counts now, the output dropped
                self.acc = accepted(out.req_ids, map(len, out.sampled_token_ids),
                                    {r: len(v) for r, v in self.spec.items()})
                self.spec = None
            else:
                self.outputs = (list(out.req_ids), [len(x) for x in out.sampled_token_ids])
        except Exception:
            self.outputs = self.acc = None


class StepRecorder:
    """Collects steps of one process; writes JSON lines to ``path`` (append)."""

    AWAIT_STEPS = 3      # drain leaves a step whose async output is unread for up to this many pending steps
    DEFER_CAP = 4096     # deferred: steps held before drain resolves the finished ones (nothing called flush)

    def __init__(self, path: str):
        self.path = path
        self.ctx = {"run_id": "", "engine": "vllm", "model": "", "method": "none", "k": 0, "batch_size": 0,
                    "record": True, "detail": False}
        self.cur: _Step | None = None
        self.pending: list[_Step] = []
        self.step = 0
        self.rows_written = 0
        self.last_host_end = None
        self.gap_cap = float(os.environ.get(ENV_GAP, "0.05"))
        self._rank_ok = None
        self._torch = None
        self._free: list[_Step] = []     # steps (and their events) to reuse: nothing per step outlives it
        # deferred (the V2 timer's default): rows are built only at flush (the engine's RPC after each generate
        # call), none during the steps: the host, which bounds a small target's step, does nothing but record events
        self.defer = False
        self._stream = None              # the stream of the last step (looked up once a step, not once a mark)
        self._lines: list[str] = []
        self.gc_s, self.gc_full = 0.0, 0     # the process's garbage-collection seconds and full collections so far
        self._gc_t0 = 0.0
        self.event_api = "torch"         # how events are recorded: torch's Event.record, or the driver (use_event_api)
        self._drv = None                 # cuEventRecord with the GIL held, where event_api is "driver"
        self._no_driver_said = False     # the driver's library missing: said once

    def use_event_api(self, api: str) -> str:
        """Record the timer's CUDA events with torch's ``Event.record`` (``torch``) or the driver's
        ``cuEventRecord`` called with the GIL held (``driver``: :func:`driver_record`); returns the API in use (torch
        where the driver's library cannot be loaded, with one logged line)."""
        if api not in ("torch", "driver"):
            raise ValueError(f"event_api must be 'torch' or 'driver', got {api!r}")
        self._drv = driver_record() if api == "driver" else None
        if api == "driver" and self._drv is None and not self._no_driver_said:
            import sys

            self._no_driver_said = True
            print("[spec_repro] the timer's driver event records are unavailable (libcuda.so.1 not loadable): "
                  "torch's Event.record instead", file=sys.stderr, flush=True)
        self.event_api = "driver" if self._drv is not None else "torch"
        return self.event_api

    def watch_gc(self, on: bool) -> None:
        """Count the process's GC pauses (``gc_callback`` in ``gc.callbacks``) or stop counting them."""
        import gc

        cb = self.__dict__.setdefault("_gc_cb", self.gc_callback)     # one bound method: removable again
        if on and cb not in gc.callbacks:
            gc.callbacks.append(cb)
        elif not on and cb in gc.callbacks:
            gc.callbacks.remove(cb)

    def gc_callback(self, phase: str, info: dict) -> None:
        """``gc.callbacks`` entry (installed with the V2 timer): the process's GC pauses, added to each step's
        ``t_gc`` / ``gc_full`` (a pause inside a step lengthens it on a host-bound runner)."""
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        else:
            self.gc_s += time.perf_counter() - self._gc_t0
            if info.get("generation") == 2:
                self.gc_full += 1

    def set_context(self, **kw) -> None:
        # a new dict: steps still pending keep the context they ran under
        self.ctx = {**self.ctx, **{k: v for k, v in kw.items() if k in self.ctx}}
        if "run_id" in kw:
            self.step = 0
            self.last_host_end = None

    def _recording_rank(self) -> bool:
        if self._rank_ok is None:
            try:
                from vllm.distributed.parallel_state import get_pp_group, get_tp_group

                self._rank_ok = get_tp_group().rank_in_group == 0 and get_pp_group().is_last_rank
            except Exception:
                self._rank_ok = True
        return self._rank_ok

    def begin(self, runner, so) -> None:
        self.cur = None
        if not self.ctx["record"] or not self._recording_rank():
            return
        if not getattr(so, "total_num_scheduled_tokens", 0):
            return
        if self._torch is None:
            import torch

            self._torch = torch
        now = time.perf_counter()
        gap = None if self.last_host_end is None else now - self.last_host_end
        # V2's runner caches the stream it runs on (``main_stream``: "to avoid lookup overhead"); elsewhere the
        # current stream, one Stream object kept for every step on it (none per step)
        stream = getattr(runner, "__dict__", {}).get("main_stream") if self.defer else None
        if stream is None:
            stream = self._torch.cuda.current_stream()
            if self._stream is None or stream != self._stream:
                self._stream = stream
            stream = self._stream
        st = self._free.pop() if self._free else _Step()
        if self.defer:
            # the shape now, as plain numbers (the SchedulerOutput is not kept until flush)
            st.reset(None, now, gap, self.ctx, stream)
            st.meta = quick_meta(so, detail=bool(self.ctx["detail"]))
            st.spec = so.scheduled_spec_decode_tokens or {}
            st.gc_s, st.gc_full = self.gc_s, self.gc_full
        else:
            # read from ``so`` when the row is built (in drain, while the GPU runs): vLLM builds a new
            # SchedulerOutput every step and does not change it afterwards
            st.reset(so, now, gap, self.ctx, stream)
        st.stream_h = stream.cuda_stream if self._drv is not None else 0
        self.cur = st
        self._mark(st, "start")
        st.self_s += time.perf_counter() - now

    def _mark(self, st: _Step, name) -> None:
        """One CUDA event on the step's stream; ``name``: a mark's name, or a tuple of names sharing the event."""
        t0 = time.perf_counter()
        i = st.n
        if i == len(st.evs):
            st.evs.append(self._torch.cuda.Event(enable_timing=True))
            st.names.append(name)
        else:
            st.names[i] = name
        ev, drv = st.evs[i], self._drv
        # the driver where the event exists (torch creates it at its first record), else (or if it fails) torch's
        if drv is None or not st.stream_h or not ev.cuda_event or drv(ev.cuda_event, st.stream_h) != 0:
            ev.record(st.stream)
        st.n = i + 1
        st.self_s += time.perf_counter() - t0

    def mark(self, name: str, *also: str) -> None:
        """Mark the current step at ``name`` (and ``also``: more names at the same point, one event)."""
        st = self.cur
        if st is not None:
            self._mark(st, (name, *also) if also else name)

    def end(self, out) -> None:
        st, self.cur = self.cur, None
        if st is None:
            return
        self._mark(st, "end")
        st.host_end = self.last_host_end = t0 = time.perf_counter()
        if st.meta is not None:
            st.gc_s, st.gc_full = self.gc_s - st.gc_s, self.gc_full - st.gc_full
        if out is not None:
            if hasattr(out, "sampled_token_ids") and not hasattr(out, "get_output"):
                st.set_outputs(out)
            elif hasattr(out, "get_output"):
                out._spec_repro_step = st
                st.awaiting = True
        st.index = self.step
        self.step += 1
        self.pending.append(st)
        st.self_s += time.perf_counter() - t0
        if len(self.pending) > (2 * self.DEFER_CAP if self.defer else 1024):   # nothing drained them: resolve here
            self.flush()

    def drain(self, max_steps: int = 2) -> None:
        """Resolve up to ``max_steps`` finished steps whose events have completed, without waiting.

        Called right after the sampler was launched, while the GPU still runs this step's forward: the host
        would only wait there, so the work is hidden (this keeps the timer's own cost off the step). A step whose
        outputs come with an async output not read yet (async scheduling: the engine core reads step t's while
        step t + 1 runs) waits while at most ``AWAIT_STEPS`` steps are pending, so its row has its accepted
        counts; ``flush`` resolves everything. Deferred (``defer``): nothing, until ``DEFER_CAP`` steps wait."""
        if self.defer:
            if len(self.pending) < self.DEFER_CAP:
                return
            max_steps = len(self.pending)
        n = 0
        while (self.pending and n < max_steps and self.pending[0].evs[self.pending[0].n - 1].query()
               and not (self.pending[0].awaiting and len(self.pending) <= self.AWAIT_STEPS)):
            self._lines.append(json.dumps(self._row(self.pending.pop(0))))
            n += 1
        if len(self._lines) >= 256:
            self._write()

    def flush(self) -> int:
        """Resolve every finished step (waiting for its events) and append everything to the file."""
        while self.pending:
            self._lines.append(json.dumps(self._row(self.pending.pop(0))))
        return self._write()

    def _write(self) -> int:
        n = len(self._lines)
        if n:
            d = os.path.dirname(self.path)
            if d:
                os.makedirs(d, exist_ok=True)
            with open(self.path, "a") as f:
                f.write("\n".join(self._lines) + "\n")
            self._lines = []
            self.rows_written += n
        return n

    def _row(self, st: _Step) -> dict:
        evs, names, n = st.evs, st.names, st.n
        evs[n - 1].synchronize()  # complete already when called from drain(); cheap
        start = evs[0]
        times = []
        for i in range(n):
            t = start.elapsed_time(evs[i]) / 1e3
            times += [(nm, t) for nm in names[i]] if isinstance(names[i], tuple) else [(names[i], t)]
        phases = phase_times(times)
        gap = st.gap if (st.gap is not None and st.gap < self.gap_cap) else 0.0
        phases["t_other"] += gap
        phases["t_total"] += gap
        meta = st.meta if st.meta is not None else step_meta(st.so, detail=bool(st.ctx["detail"]))
        meta["step"] = st.index
        if st.hybrid_fn is not None:
            meta["hybrid"] = st.hybrid_fn(st.hybrid)       # device counts, by the slot they were copied to
        elif st.hybrid is not None:
            meta["hybrid"] = st.hybrid.resolve() if hasattr(st.hybrid, "resolve") else st.hybrid   # device counts
        row = build_row(st.ctx, meta, phases, st.outputs, gap=gap, raw_gap=st.gap, acc=st.acc)
        if st.meta is not None:
            row["t_gc"], row["gc_full"], row["t_timer"] = float(st.gc_s), int(st.gc_full), float(st.self_s)
        st.reset(None, 0.0, None, None, None)
        self._free.append(st)
        return row


def driver_record():
    """``cuEventRecord(event, stream)`` from the CUDA driver (``libcuda.so.1``) through ``ctypes.PyDLL``, which keeps
    the GIL across the call; None where the library or the symbol cannot be loaded. torch's ``Event.record``
    releases the GIL on every call: on a host-bound step another Python thread may take it there, and the step
    waits to get it back. Takes raw handles (``Event.cuda_event``, ``Stream.cuda_stream``: the runtime's event and
    stream are the driver's) and returns the CUresult (0: recorded)."""
    import ctypes

    try:
        f = ctypes.PyDLL("libcuda.so.1").cuEventRecord
    except (OSError, AttributeError):
        return None
    f.argtypes = (ctypes.c_void_p, ctypes.c_void_p)
    f.restype = ctypes.c_int
    return f


def phase_times(marks: list[tuple[str, float]]) -> dict:
    """Four phases from ordered (mark name, seconds since step start) pairs.

    Pairs fwd0..fwd1 -> verify, samp0..samp1 -> reject, draft0..draft1 -> draft; ``end`` closes the step;
    t_other = total - the three. A missing closing mark ends its phase at the next mark."""
    out = {"t_draft": 0.0, "t_verify": 0.0, "t_reject": 0.0}
    opens = {"fwd0": ("fwd1", "t_verify"), "samp0": ("samp1", "t_reject"), "draft0": ("draft1", "t_draft")}
    total = 0.0
    for i, (name, t) in enumerate(marks):
        if name == "end":
            total = t
        if name in opens:
            close, col = opens[name]
            t1 = next((tt for nn, tt in marks[i + 1:] if nn == close), None)
            if t1 is None:
                t1 = marks[i + 1][1] if i + 1 < len(marks) else t
            out[col] += max(0.0, t1 - t)
    total = max(total, sum(out.values()))
    out["t_other"] = total - out["t_draft"] - out["t_verify"] - out["t_reject"]
    out["t_total"] = total
    return out


def step_meta(so, detail: bool = False) -> dict:
    """Batch shape of one step from vLLM's SchedulerOutput (target-forward tokens, KV before, drafts, phase)."""
    nsched = dict(so.num_scheduled_tokens)
    spec = {r: len(v) for r, v in (so.scheduled_spec_decode_tokens or {}).items()}
    kv = 0
    pos: dict[str, int] = {}
    new: dict[str, list] = {}
    for r in so.scheduled_new_reqs:
        kv += int(r.num_computed_tokens)
        pos[r.req_id] = 0
        ids = r.prompt_token_ids or []
        if detail:
            new[r.req_id] = [len(ids), prompt_hash(ids)]
    c = so.scheduled_cached_reqs
    n_out = list(getattr(c, "num_output_tokens", []) or [])
    for i, rid in enumerate(c.req_ids):
        kv += int(c.num_computed_tokens[i])
        pos[rid] = int(n_out[i]) if i < len(n_out) else -1
    decoding = [r for r in nsched if pos.get(r, 0) > 0 and nsched[r] == 1 + spec.get(r, 0)]
    phase = "decode" if len(decoding) == len(nsched) else ("prefill" if not decoding else "mixed")
    meta = {"num_reqs": len(nsched), "batched_tokens": int(so.total_num_scheduled_tokens), "kv_tokens": kv,
            "num_draft_tokens": int(sum(spec.values())), "phase": phase, "_spec": spec}
    if detail:
        meta["req_info"] = {r: [pos.get(r, -1), int(nsched[r]), spec.get(r, 0)] for r in nsched}
        meta["new_reqs"] = new
    return meta


def quick_meta(so, detail: bool = False) -> dict:
    """``step_meta`` without its per-request loops where the step is a plain decode step (no new request, every
    request decoding its 1 + drafts tokens: what most steps are), so the deferred timer can read a step's shape at
    its start cheaply; any other step (and ``detail``) takes ``step_meta`` itself. Same keys, no ``_spec``."""
    c = so.scheduled_cached_reqs
    n_out = getattr(c, "num_output_tokens", None)
    nsched = so.num_scheduled_tokens
    spec = so.scheduled_spec_decode_tokens or {}
    n, batched = len(nsched), int(so.total_num_scheduled_tokens)
    nd = sum(map(len, spec.values())) if spec else 0
    if detail or so.scheduled_new_reqs or not n_out or len(c.req_ids) != n or batched != n + nd or min(n_out) <= 0:
        meta = step_meta(so, detail=detail)
        meta.pop("_spec", None)
        return meta
    # every scheduled request is a cached one with output tokens, and the tokens add up to 1 + drafts each (each
    # request is scheduled at least that many): each is a decode step's request
    return {"num_reqs": n, "batched_tokens": batched, "kv_tokens": int(sum(c.num_computed_tokens)),
            "num_draft_tokens": int(nd), "phase": "decode"}


def accepted(req_ids, n_sampled, n_drafts: dict) -> dict:
    """{req_id: draft tokens accepted} of one step: a request that verified ``n_drafts[r]`` drafts and sampled
    ``n`` tokens accepted ``n - 1`` of them (the last is the target's own), at most its drafts."""
    return {r: max(0, min(n_drafts[r], n - 1)) for r, n in zip(req_ids, n_sampled) if r in n_drafts and n > 0}


def build_row(ctx: dict, meta: dict, phases: dict, outputs, gap: float = 0.0, raw_gap=None, acc=None) -> dict:
    """One STEP_COLUMNS row (plus optional fields) from a step's context, shape, phase times and outputs (or
    the accepted counts already read from them: ``acc``)."""
    known = outputs is not None or acc is not None
    if acc is None:
        acc = accepted(*outputs, meta.get("_spec", {})) if outputs is not None else {}
    row = {"run_id": ctx["run_id"], "engine": ctx["engine"], "model": ctx["model"], "method": ctx["method"],
           "k": int(ctx["k"]), "batch_size": int(ctx["batch_size"]), "step": int(meta.get("step", 0)),
           "num_reqs": meta["num_reqs"], "batched_tokens": meta["batched_tokens"], "kv_tokens": meta["kv_tokens"],
           **{k: float(v) for k, v in phases.items()},
           "num_draft_tokens": meta["num_draft_tokens"], "num_accepted_tokens": int(sum(acc.values())),
           "phase": meta["phase"], "accepted_per_req": acc, "t_sched": float(gap),
           "outputs_known": known}
    if raw_gap is not None:
        row["t_gap"] = float(raw_gap)
    for key in ("req_info", "new_reqs", "hybrid"):
        if key in meta:
            row[key] = meta[key]
    return row


_REC: list = [None, None]   # (pid, recorder) of this process


def _recorder() -> StepRecorder:
    rec = _REC[1]
    if rec is not None:
        return rec
    rec = StepRecorder(os.environ.get(ENV_PATH) or os.devnull)
    _REC[:] = [os.getpid(), rec]
    import atexit

    atexit.register(rec.flush)
    return rec
