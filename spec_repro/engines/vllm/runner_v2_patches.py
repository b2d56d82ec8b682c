"""The step timer on vLLM 0.25's V2 model runner (``vllm/v1/worker/gpu/model_runner.py``), the runner vLLM picks for
EAGLE and no SD on dense targets: the same JSON row per step as on V1 (``step_timer``: ``t_verify``, ``t_reject``,
``t_draft``, ``t_other``; columns ``spec_repro.traces.STEP_COLUMNS``), from CUDA events on the step's stream.

Installed by the import hook when the worker imports V2's runner module (vLLM imports it only when the worker
runs V2: ``v1/worker/gpu_worker.py``), with ``SPEC_REPRO_STEP_LOG`` set. Before anything is wrapped every method in
``TIMER_WRAPPED`` is checked against ``v2_contract.json`` (``v2_contract.check``: present, same parameters as
vLLM 0.25.0); on a difference nothing is wrapped and one line says why (status ``v2_disabled_reason``).
``instrument_v2(False)`` puts vLLM's own methods back (``op="instrument", on=False``: the overhead reference);
``instrument_v2(True, parts=..., defer=...)`` installs some of the timer (``TIMER_PARTS``) or builds its rows at
the sampler as V1 does (``defer=False``): the variants whose cost ``common.TIMER_VARIANTS`` names, measured apart.

Rows are built when the engine flushes (after each ``generate`` call), never during a step (``defer``, the
default), and nothing a step allocates outlives it (``step_timer._Step``): a 1.5B target's V2 step is bound by
the host (a 3.4 ms no-SD step against 0.9 ms of weight reads on an H100), so whatever the timer does on the host
lengthens the step; and vLLM freezes its startup heap, so objects a timer keeps alive across steps are what the
garbage collector's full passes walk (the likely cost of a timer that kept every step until flush: no SD 13%
slower at bs 1, data/gpu/raw/v2timer-h100-retaining; the variants' costs: data/gpu/live/timer/overhead.csv).

What each phase covers on V2 (events in stream order; each phase is the GPU stream's time between its marks,
which includes any wait of the stream for the host inside it):

* step start: ``GPUModelRunner.execute_model`` entry (request-state updates, staged writes, batch descriptor);
* ``t_verify``: from the end of ``prepare_attn`` (input ids, positions, block tables, slot mappings prepared)
  to the sampler's entry: the attention metadata, the target forward (FULL CUDA graph replay for uniform
  decode batches, PIECEWISE or eager otherwise), the hidden-state gather and ``compute_logits`` (inside
  ``GPUModelRunner.sample``) and any grammar bitmask: the logits belong to verification, as on V1;
* ``t_reject``: ``Sampler.__call__`` without drafts, ``RejectionSampler.__call__`` with them (V2 samples in one
  of the two; the sampler's output copy to the host starts after it, on vLLM's copy stream);
* ``t_draft``: ``AutoRegressiveSpeculator.propose`` (EAGLE's draft prefill and k - 1 draft decode steps, each a
  captured FULL graph when the batch allows; with the hybrid on, its n-gram lookup and merge too);
* ``t_other``: the rest of the step: input preparation before ``prepare_attn`` ends, prompt logprobs,
  ``postprocess_sampled`` (token-history and count updates on the device), the draft-token bookkeeping after
  ``propose``, plus the engine core's host time between two steps when shorter than ``SPEC_REPRO_STEP_GAP_S``.

Async scheduling (vLLM's default with EAGLE on V2): the engine core calls ``execute_model`` then
``sample_tokens`` for step t and gets an ``AsyncOutput`` whose host copy it reads (``get_output``) while step
t + 1 runs; the host prepares step t + 1 while the GPU still runs step t's drafting, so a step's host work and
the previous step's GPU work overlap. The events measure the stream: a step's ``t_total`` is its span on the GPU
(first event to last), the host-only gap is added to ``t_other`` as on V1, so ``t_total`` summed over steps can
exceed the wall time where host and GPU overlap (the same convention as the V1 rows under async scheduling).
The per-request accepted counts come from ``AsyncOutput.get_output`` (no extra synchronize)."""
from __future__ import annotations

import random
import sys
import time

from . import v2_contract as C
from .runner_patches import _guard
from .state import _lock, _state, logger
from .step_timer import _recorder

#: the timer's parts, each the contract keys it wraps: ``step`` (a row per step: its start and end, and the accepted
#: counts from the async output) and ``phases`` (the verify / reject / draft marks inside the step)
TIMER_PARTS = {
    "step": (f"{C.V2_RUNNER_MODULE}:GPUModelRunner.execute_model",
             f"{C.V2_RUNNER_MODULE}:GPUModelRunner.sample_tokens",
             f"{C.V2_ASYNC_MODULE}:AsyncOutput.get_output"),
    "phases": (f"{C.V2_RUNNER_MODULE}:GPUModelRunner.prepare_attn",
               f"{C.V2_SAMPLER_MODULE}:Sampler.__call__",
               f"{C.V2_REJECTION_MODULE}:RejectionSampler.__call__",
               f"{C.V2_SPEC_MODULE}:AutoRegressiveSpeculator.propose"),
}
#: the contract keys the timer wraps (the hybrid's are hybrid_v2.HYBRID_WRAPPED)
TIMER_WRAPPED = tuple(k for keys in TIMER_PARTS.values() for k in keys)

_V2: dict = {"classes": {}, "orig": {}, "installed": ()}
#: the ``toggle`` variant (``common.TIMER_VARIANTS``): with ``block`` > 0 each run's steps go in pairs of blocks of
#: ``block`` steps, one block recorded by the timer and the other passed through, which first drawn per pair from a
#: generator seeded by the run's id (a fixed order would alias with what recurs every 16 steps, as a KV block's
#: allocation does: +4-5% on no SD at bs 32-64 from that alone); every step's ``execute_model`` entry goes to
#: ``_CLOCK`` (perf_counter, negative where passed through: ``common.toggle_periods``)
_TOGGLE: dict = {"block": 0, "step": 0, "first": True, "rng": random.Random(0)}
_CLOCK: list = []
CLOCK_CAP = 1 << 16


def clock_reset(run_id: str = "") -> None:
    """A new run (``op="context"``): its steps count from 0, its clock starts empty, its blocks' order is drawn
    from ``run_id`` (crc32: the same in every process)."""
    import zlib

    _TOGGLE["step"] = 0
    _TOGGLE["rng"] = random.Random(zlib.crc32(str(run_id).encode()))
    _CLOCK.clear()


def toggle_timed(n: int, block: int) -> bool:
    """Whether the run's step ``n`` is recorded: its pair of blocks' order is drawn at the pair's first step."""
    at = n % (2 * block)
    if at == 0:
        _TOGGLE["first"] = _TOGGLE["rng"].random() < 0.5
    return (at < block) == _TOGGLE["first"]


def clock_read() -> list:
    """The run's clock so far (``op="clock"``), empty unless the ``toggle`` variant is installed."""
    return list(_CLOCK)


def v2_classes(modules: dict) -> dict:
    """{``module:Class``: class} of every class in the contract, from {module name: module}."""
    out = {}
    for key in C.load()["wrapped"]:
        mod, qual = key.split(":")
        cls_name = qual.split(".")[0]
        m = modules.get(mod)
        cls = getattr(m, cls_name, None) if m is not None else None
        if cls is not None:
            out[f"{mod}:{cls_name}"] = cls
    return out


def refuse(why: str) -> None:
    _state["v2_disabled_reason"] = why
    msg = f"spec_repro V2-runner step timing OFF (vLLM runs unchanged): {why}"
    logger.warning(msg)
    print(f"[spec_repro] {msg}", file=sys.stderr, flush=True)


def install(classes: dict) -> bool:
    """Check the contract for every timed method, then wrap them (``instrument_v2(True)``). False, with one
    logged line, when the running vLLM differs from the contract."""
    problems = C.check(classes, names=TIMER_WRAPPED)
    if problems:
        refuse("a vLLM other than the contract's: " + "; ".join(problems))
        return False
    _V2["classes"] = dict(classes)
    from .common import V2_EVENT_API

    return instrument_v2(True, event_api=V2_EVENT_API)


def _split(key: str):
    owner, meth = key.rsplit(".", 1)
    return owner, meth


def instrument_v2(on: bool, parts=None, defer: bool | None = None, toggle: int | None = None,
                  event_api: str | None = None) -> bool:
    """Install (on) or remove (off) the V2 timing wrappers; returns whether they are installed. ``parts``: the
    ``TIMER_PARTS`` to install (default all); ``defer``: rows built at flush only (default True) or also at the
    sampler while the GPU runs; ``toggle``: blocks of that many steps, of each pair one recorded and one passed
    through (drawn), every step clocked (``_TOGGLE``; default 0: every step recorded, no clock); ``event_api``:
    how the timer records its CUDA events (``StepRecorder.use_event_api``: ``driver``, what ``install`` sets:
    ``common.V2_EVENT_API``, or ``torch``; None keeps the current). Installing again with other parts first puts
    vLLM's methods back."""
    if toggle is not None and int(toggle) < 0:
        raise ValueError(f"toggle must be a number of steps >= 0, got {toggle!r}")
    _TOGGLE["block"] = int(toggle or 0) if on else 0
    clock_reset()
    classes = _V2["classes"]
    if not classes or (on and _state["v2_disabled_reason"]):
        return _state["v2_patched"]
    names = tuple(parts) if parts else tuple(TIMER_PARTS)
    unknown = set(names) - set(TIMER_PARTS)
    if unknown:
        raise ValueError(f"unknown timer parts {sorted(unknown)}: {', '.join(TIMER_PARTS)}")
    keys = tuple(k for n in TIMER_PARTS if n in names for k in TIMER_PARTS[n])
    with _lock:
        if _state["v2_patched"] and (not on or keys != _V2["installed"]):
            for key in _V2["installed"]:
                owner, meth = _split(key)
                setattr(classes[owner], meth, _V2["orig"][key])
            _state["v2_patched"] = False
            _V2["installed"] = ()
            _recorder().cur = None
        if on and not _state["v2_patched"]:
            for key in keys:
                owner, meth = _split(key)
                cls = classes[owner]
                orig = cls.__dict__[meth]
                _V2["orig"][key] = orig
                w = _WRAPPERS[key.split(":")[1]](orig)
                w._spec_repro_orig = getattr(orig, "_spec_repro_orig", orig)
                setattr(cls, meth, w)
            _state["v2_patched"] = True
            _V2["installed"] = keys
        rec = _recorder()
        if on:
            rec.defer = True if defer is None else bool(defer)
        if event_api is not None:
            rec.use_event_api(event_api)
        rec.watch_gc(bool(on and _state["v2_patched"]))
    return _state["v2_patched"]


# ---- the wrappers (each takes the method it wraps) -------------------------------------------------------------
def _execute_model(orig):
    def execute_model(self, scheduler_output, *args, **kwargs):
        if _state["runner"] != "v2":
            _state["runner"] = "v2"
        rec = _recorder()
        dummy = kwargs.get("dummy_run", False) or (len(args) > 1 and bool(args[1]))
        block = _TOGGLE["block"]
        if not dummy and block:               # the toggle variant: this step's block timed or passed through
            n = _TOGGLE["step"]
            _TOGGLE["step"] = n + 1
            timed = toggle_timed(n, block)
            if len(_CLOCK) < CLOCK_CAP:
                _CLOCK.append(time.perf_counter() if timed else -time.perf_counter())
            if not timed:
                dummy = True
                rec.last_host_end = None      # the next timed step's gap would span the untimed block
        if not dummy:
            _guard(rec.begin, self, scheduler_output)
        else:
            rec.cur = None
        out = orig(self, scheduler_output, *args, **kwargs)
        if rec.cur is not None and out is not None:   # no forward (empty step) or a non-last PP rank: no sampling
            _guard(rec.end, None)
        return out
    return execute_model


def _prepare_attn(orig):
    def prepare_attn(self, input_batch, *args, **kwargs):
        out = orig(self, input_batch, *args, **kwargs)
        st = _recorder().cur
        if st is not None and not st.in_forward:
            st.in_forward = True
            _guard(_recorder().mark, "fwd0")
        return out
    return prepare_attn


def _sampler_call(orig):
    def __call__(self, logits, input_batch, *args, **kwargs):
        rec = _recorder()
        st = rec.cur
        if st is None or st.in_sample:      # not in a step, or nested: untimed
            return orig(self, logits, input_batch, *args, **kwargs)
        st.in_sample = True
        _guard(rec.mark, "fwd1", "samp0")     # one event: the forward ends where sampling starts
        out = orig(self, logits, input_batch, *args, **kwargs)
        _guard(rec.mark, "samp1")
        _guard(rec.drain)        # finished steps into rows while the GPU runs this one
        return out
    return __call__


def _propose(orig):
    def propose(self, input_batch, *args, **kwargs):
        rec = _recorder()
        if rec.cur is None or kwargs.get("dummy_run"):
            return orig(self, input_batch, *args, **kwargs)
        _guard(rec.mark, "draft0")
        out = orig(self, input_batch, *args, **kwargs)
        _guard(rec.mark, "draft1")
        return out
    return propose


def _sample_tokens(orig):
    def sample_tokens(self, grammar_output, *args, **kwargs):
        out = orig(self, grammar_output, *args, **kwargs)
        rec = _recorder()
        if rec.cur is not None:
            _guard(rec.end, out)
        return out
    return sample_tokens


def _get_output(orig):
    def get_output(self, *args, **kwargs):
        res = orig(self, *args, **kwargs)
        st = getattr(self, "_spec_repro_step", None)
        if st is not None:
            t0 = time.perf_counter()
            st.set_outputs(res)
            st.self_s += time.perf_counter() - t0
            self._spec_repro_step = None
        return res
    return get_output


_WRAPPERS = {"GPUModelRunner.execute_model": _execute_model, "GPUModelRunner.prepare_attn": _prepare_attn,
             "GPUModelRunner.sample_tokens": _sample_tokens, "Sampler.__call__": _sampler_call,
             "RejectionSampler.__call__": _sampler_call, "AsyncOutput.get_output": _get_output,
             "AutoRegressiveSpeculator.propose": _propose}
