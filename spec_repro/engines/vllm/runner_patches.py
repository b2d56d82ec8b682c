"""The V1 runner patches: the step timer's wrappers of ``GPUModelRunner`` (``instrument``: on, or off again for
overhead measurements) and, opt-in, the draft model's CUDA-graph fix.

Separately, and only when ``SPEC_REPRO_DRAFT_CUDAGRAPHS=1`` is set (engine option ``draft_cudagraphs=True``),
the plugin applies the fix of vLLM PR #47460 to 0.25's V1 runner: ``_check_and_update_cudagraph_mode`` initializes
the drafter's CUDA-graph keys for EAGLE/MTP but not for ``draft_model``, so a draft model's PIECEWISE graphs are
captured but never replayed and every draft forward runs eagerly (launch-bound). The patch also initializes them
for ``draft_model``. It changes vLLM's behaviour, so it is opt-in and recorded in the engine's status.
"""
from __future__ import annotations

import sys

from .state import RUNNER_METHODS, _ORIG, _lock, _state, logger
from .step_timer import _recorder


def patch_draft_cudagraphs(cls) -> bool:
    """vLLM PR #47460 on 0.25's V1 runner: after ``_check_and_update_cudagraph_mode`` resolved the mode, also
    initialize the drafter's CUDA-graph keys when the method is ``draft_model`` (vLLM does it for EAGLE/MTP only)."""
    orig = getattr(cls, "_check_and_update_cudagraph_mode", None)
    if orig is None or getattr(orig, "_spec_repro", False):
        return False

    def _check_and_update_cudagraph_mode(self, *args, **kwargs):
        out = orig(self, *args, **kwargs)
        sc = getattr(self, "speculative_config", None)
        drafter = getattr(self, "drafter", None)
        if sc is not None and sc.uses_draft_model() and hasattr(drafter, "initialize_cudagraph_keys"):
            drafter.initialize_cudagraph_keys(self.compilation_config.cudagraph_mode)
            _state["draft_cudagraphs"] = True
        return out

    _check_and_update_cudagraph_mode._spec_repro = True
    cls._check_and_update_cudagraph_mode = _check_and_update_cudagraph_mode
    return True


def instrument(on: bool) -> bool:
    """Install (on=True) or remove (on=False) the timing wrappers on the runner class. Returns the new state."""
    cls = _ORIG.get("runner_cls")
    if cls is None or (on and _state["disabled_reason"]):
        return _state["patched"]
    with _lock:
        if on and not _state["patched"]:
            for name in RUNNER_METHODS:
                _ORIG[name] = cls.__dict__.get(name, getattr(cls, name))
            cls.execute_model = _execute_model
            cls._model_forward = _model_forward
            cls._sample = _sample
            cls.propose_draft_token_ids = _propose
            cls.sample_tokens = _sample_tokens
            acls = _ORIG.get("async_out_cls")
            if acls is not None and hasattr(acls, "get_output"):
                _ORIG["get_output"] = acls.__dict__.get("get_output", acls.get_output)
                acls.get_output = _async_get_output
            _state["patched"] = True
        elif not on and _state["patched"]:
            for name in RUNNER_METHODS:
                setattr(cls, name, _ORIG[name])
            acls = _ORIG.get("async_out_cls")
            if acls is not None and "get_output" in _ORIG:
                acls.get_output = _ORIG["get_output"]
            _state["patched"] = False
            rec = _recorder()
            rec.cur = None
    return _state["patched"]


def _guard(fn, *args) -> None:
    """Run a recorder call; on any error stop recording (vLLM goes on untouched) and say why, once."""
    try:
        fn(*args)
    except Exception as e:
        rec = _recorder()
        rec.cur = None
        if rec.ctx["record"]:
            rec.ctx["record"] = False
            _state["disabled_reason"] = f"recording stopped after an error: {type(e).__name__}: {e}"
            logger.exception("spec_repro step timing: recording stopped")
            print(f"[spec_repro] {_state['disabled_reason']}", file=sys.stderr, flush=True)


def _execute_model(self, scheduler_output, *args, **kwargs):
    if _state["runner"] != "v1":
        _state["runner"] = "v1"
    rec = _recorder()
    _guard(rec.begin, self, scheduler_output)
    out = _ORIG["execute_model"](self, scheduler_output, *args, **kwargs)
    if rec.cur is not None:
        _guard(rec.mark, "fwd1")
        if out is not None and rec.cur is not None:  # no sample_tokens() follows (empty step, PP non-last rank)
            _guard(rec.end, out if hasattr(out, "sampled_token_ids") else None)
    return out


def _model_forward(self, *args, **kwargs):
    rec = _recorder()
    if rec.cur is not None and not rec.cur.in_forward:
        rec.cur.in_forward = True
        _guard(rec.mark, "fwd0")
    return _ORIG["_model_forward"](self, *args, **kwargs)


def _timed(name: str, mark0: str, mark1: str, drain: bool = False):
    """A wrapper of runner method ``name`` that times the original between marks ``mark0`` and ``mark1`` (and,
    with ``drain``, then resolves finished steps while the GPU runs: see ``StepRecorder.drain``)."""

    def wrapper(self, *args, **kwargs):
        rec = _recorder()
        if rec.cur is None:
            return _ORIG[name](self, *args, **kwargs)
        _guard(rec.mark, mark0)
        out = _ORIG[name](self, *args, **kwargs)
        _guard(rec.mark, mark1)
        if drain:
            _guard(rec.drain)
        return out

    wrapper.__name__ = wrapper.__qualname__ = name
    return wrapper


_sample = _timed("_sample", "samp0", "samp1", drain=True)


_propose = _timed("propose_draft_token_ids", "draft0", "draft1")


def _sample_tokens(self, *args, **kwargs):
    out = _ORIG["sample_tokens"](self, *args, **kwargs)
    rec = _recorder()
    if rec.cur is not None:
        _guard(rec.end, out)
    return out


def _async_get_output(self):
    res = _ORIG["get_output"](self)
    st = getattr(self, "_spec_repro_step", None)
    if st is not None:
        st.set_outputs(res)
        self._spec_repro_step = None
    return res
