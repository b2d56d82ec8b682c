"""Per-step phase timing for vLLM, as a vLLM *general plugin* (no fork of vLLM).

Supported: vLLM 0.25.x with the V1 GPU model runner (``vllm/v1/worker/gpu_model_runner.py``; the engine in
``spec_repro.engines.vllm`` forces it with ``VLLM_USE_V2_MODEL_RUNNER=0``). On any other version or layout the
plugin warns once and stays off; vLLM runs unchanged.

Activation: only when ``SPEC_REPRO_STEP_LOG=<path>`` is set in the environment of the vLLM processes (the
engine option ``step_log=`` sets it). vLLM loads general plugins in every process (``vllm.plugins.
load_general_plugins``: the front process, the engine core and each worker); ``register()`` only installs an
import hook, so the model runner is patched in whichever process imports it (the worker) and nowhere else.

What is timed, per engine step (``GPUModelRunner.execute_model`` + ``sample_tokens``), with CUDA events taken
from a pool and resolved lazily: finished steps are turned into rows right after the sampler is launched, while
the GPU still runs the current forward, so the step gains no synchronize and little host time. Version 3 also
records every event on a stream looked up once per step and reads the batch shape from the SchedulerOutput
only when the row is built (off the step's critical path). Measured on the H200: data/gpu/overhead.csv.

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

Separately, and only when ``SPEC_REPRO_DRAFT_CUDAGRAPHS=1`` is set (engine option ``draft_cudagraphs=True``),
the plugin applies the fix of vLLM PR #47460 to 0.25's V1 runner: ``_check_and_update_cudagraph_mode`` initializes
the drafter's CUDA-graph keys for EAGLE/MTP but not for ``draft_model``, so a draft model's PIECEWISE graphs are
captured but never replayed and every draft forward runs eagerly (launch-bound). The patch also initializes them
for ``draft_model``. It changes vLLM's behaviour, so it is opt-in and recorded in the engine's status.

The live n-gram + EAGLE hybrid, only when ``SPEC_REPRO_HYBRID=<policy>`` is set (engine option ``hybrid=``;
policies of ``hybrid.POLICIES``; ``adaptive-rule`` reads its cost model from ``SPEC_REPRO_HYBRID_COST``, a preset
name or file) and vLLM runs method ``eagle``: ``patch_hybrid`` wraps ``propose_draft_token_ids`` (before the
timer, so ``t_draft`` times the hybrid's whole drafting). Per step the wrapper copies the sampler's output to
the host (one synchronize the runner would otherwise do later, in its bookkeeping), hands each request's emitted
tokens to ``hybrid.LiveHybrid`` (n-gram lookups, the policy's choice), runs vLLM's EAGLE drafting only when some
request's choice reads it (else only its next-token bookkeeping: EAGLE's KV for that step's tokens is then not
written, a gap its later drafts attend over: lossless, but its acceptance may drop after skipped steps), and
returns per request the chosen draft, cut to the chosen k (and to the next step's slots,
``num_spec_tokens_to_schedule``): ``list[list[int]]`` on the synchronous path (vLLM's own contract for n-gram;
the scheduler takes any length, none included), a ``[B, k]`` int32 tensor on the async path, whose placeholder
slots the wrapped ``execute_model`` cuts to the valid counts at the next step on a private copy of the
SchedulerOutput (``hybrid.trim_scheduled``, as vLLM does for its GPU n-gram; the scheduler keeps the uncut
counts its own accounting needs, ``prev_num_draft_len`` restored to the slots scheduled, as vLLM does). On the
synchronous path the hybrid re-reads a request's history from the runner's token ids where its count differs
(``LiveHybrid.begin(context_of=)``). Draft probabilities are cleared (greedy verification does not read them;
EAGLE's would not match an n-gram row). Each step row gets a ``hybrid`` column (counts per proposer, with detail
on also per request). A wrong method or layout disables the hybrid with one message (vLLM then runs plain EAGLE,
and the status says so).

The device-side policies (``gpu_hybrid.GPU_POLICIES``: ``gpu-pr24344``, ``gpu-eagle-only``) take another path,
``_gpu_hybrid_step``: vLLM's EAGLE drafts as it would, then the step's tokens go into a device buffer, the n-gram
lookup and the choice run there, and the ``[B, k]`` result goes back to vLLM with nothing read to the host (the step
log's counts ride a non-blocking copy, ``_DeviceCounts``); finished requests' rows are freed in every
``execute_model`` (vLLM tells them in steps without drafting). They need the padded drafter batch (vLLM's default).

Padding, only when ``SPEC_REPRO_HYBRID_PAD=1`` is set beside ``SPEC_REPRO_HYBRID`` (engine option
``hybrid_pad=True``; status ``hybrid_pad``): every request that emitted tokens gets exactly
``num_spec_tokens_to_schedule`` draft tokens, its policy's draft followed by a filler (``hybrid.pad_draft``:
EAGLE's own continuation where its row starts with the draft, else n-gram's period, a 1-token lookup, the last
token repeated), so the next step is a uniform ``1 + k`` decode batch, the only shape vLLM 0.25's V1 runner
replays its full CUDA graph for (``_is_uniform_decode``, v1/worker/gpu_model_runner.py:3816-3834; measured on
the H200: a non-uniform step verifies 2-4x slower). Greedy verification keeps it lossless; the step log's
``hybrid`` column adds ``pad_tokens``, ``pad_by`` and ``pad_accepted`` (``hybrid.LiveHybrid.summary``).
Policy ``ngram-only`` with padding is n-gram alone, padded (vLLM's own n-gram cannot be: its runner is not
wrapped); ``eagle-only`` is the hybrid loaded but idle.

GPU checks for the hybrid (what was read in vLLM 0.25's source, not run; file:line under ``vllm/``)
-------------------------------------------------------------------------------------------------------------
1. Contract. ``propose_draft_token_ids(scheduler_output, sampled_token_ids, sampling_metadata, ...)`` is called
   positionally from ``sample_tokens``' closure (v1/worker/gpu_model_runner.py:4514-4528), its result stored in
   ``_draft_token_ids`` and passed to ``_copy_draft_token_ids_to_cpu`` (:4798-4832): a list only sets
   ``_draft_token_req_ids`` and ``take_draft_token_ids`` returns it as is (:4792-4796, :4836-4837); a tensor
   sets ``prev_num_spec_tokens`` = its width (:4803), the stride ``_prepare_input_ids`` reads it with under
   async scheduling (:1794, :1848-1866). EAGLE with the padded drafter batch (the default) gets the sampler's
   ``[B, k+1]`` GPU tensor before the bookkeeping (:4545-4561), with ``disable_padded_drafter_batch`` the
   bookkeeping's lists after it (:4636-4640). Check: a hybrid run's status has ``hybrid`` set and no
   ``hybrid_error``; the step rows carry ``hybrid``; ``num_draft_tokens`` per step equals the sum of the
   previous step's ``hybrid`` ``ngram_tokens + eagle_tokens`` (``+ pad_tokens`` with padding; less requests
   that finished).
2. Losslessness: ``jobs lossless`` on every hybrid spec, under ``--engine-config study-like`` (synchronous) and
   ``default`` (vLLM turns async scheduling on for EAGLE, config/vllm.py:992-1040). n-gram rows verified as
   EAGLE's: greedy rejection needs no draft probs (v1/sample/rejection_sampler.py:403-504, ``NO_DRAFT_PROBS``;
   gpu_model_runner.py:4884-4888 returns None when ``_draft_probs`` is None, which EAGLE leaves None for greedy:
   v1/spec_decode/llm_base_proposer.py:440-497). Async only: the scheduler advances ``num_computed_tokens`` by
   the k placeholders at schedule time (v1/core/sched/scheduler.py:1174-1177, v1/core/sched/async_scheduler.py:
   19-44) and takes back ``len(scheduled spec) - accepted`` at output (scheduler.py:1583-1607); the runner's
   correction uses ``prev_num_draft_len`` (gpu_model_runner.py:1317-1343, :1491-1509), restored to the slots
   scheduled as for vLLM's GPU n-gram (:1290-1301, :1458-1461, v1/worker/gpu_input_batch.py:498). The cut is
   made on a copy because the in-process executor hands the runner the scheduler's own object
   (v1/executor/uniproc_executor.py:79-121). If async outputs differ from the no-SD engine's while synchronous
   ones match, run the hybrid with ``study-like`` only.
3. Skipped EAGLE drafting (pr24344-skip, adaptive-rule): synchronous path, nothing else to do (vLLM's own
   "drafter cannot run" branch does nothing there either, gpu_model_runner.py:4559-4580, the event is async-only,
   :905-915); async path, ``prepare_next_token_ids_padded`` + ``_copy_valid_sampled_token_count``
   (llm_base_proposer.py:1050-1100, gpu_model_runner.py:4850-4870), as that branch. The drafter's KV for the
   skipped step's tokens is not written (its first pass writes it, llm_base_proposer.py:502-600): expect EAGLE's
   acceptance after skipped steps below plain EAGLE's (compare ``eagle``'s per-step acceptance with the
   hybrid's EAGLE rows).
4. History: the emitted tokens are ``valid_tokens`` of the sampler output, as ``RejectionSampler.parse_output``
   (v1/sample/rejection_sampler.py:249-283, discard rows from ``discard_request_mask``,
   gpu_model_runner.py:2056-2059); new requests start from ``CachedRequestState.prompt_token_ids``. Async path:
   no re-read (``token_ids_cpu`` holds -1 there, gpu_model_runner.py:3727), so a step vLLM ran without calling
   the drafter (input longer than the drafter's max length, :4559-4617) leaves a gap in the history; keep
   prompt + max_tokens + k under max_model_len.
5. Padding (``SPEC_REPRO_HYBRID_PAD=1``) relies on: (i) ``uniform_decode_query_len = 1 + num_spec_tokens``
   (gpu_model_runner.py:842), the *configured* k, so the padded width ``num_spec_tokens_to_schedule`` makes a
   step uniform only while it equals k (no dynamic k: scheduler.py:1086-1090); (ii) synchronous path: the
   scheduler keeps a request's list as given (``update_draft_token_ids``, scheduler.py:1948-1968) and schedules
   ``1 + len(list)`` tokens (:473-488), cut only by the token budget and max_model_len; async path: it always
   schedules ``num_spec_tokens_to_schedule`` placeholders (async_scheduler.py:22-25), so with every count full
   ``trim_scheduled`` cuts nothing and the runner sees the scheduler's own 1 + k counts; (iii) every padding id is
   a real token id (taken from the context or an EAGLE row checked against ``[0, vocab_size)``), as the target's
   embedding needs. Check: with ``hybrid_pad`` the decode steps' ``batched_tokens == num_reqs * (1 + k)`` and
   their ``t_verify`` falls to the uniform steps' (pr24344 measured 1.98/2.07/2.45/3.21 ms at bs 1/8/32/64);
   ``jobs lossless`` equal everywhere; ``pad_accepted`` summed over a run is at most the run's accepted tokens.

Control from the front process (``LLM.collective_rpc("spec_repro_steps", kwargs={...})``, see
``spec_repro.engines.vllm.VLLMEngine``): ``op="context"`` sets run_id/model/method/k/batch_size/detail/record,
``op="instrument"`` with ``on=False`` restores vLLM's original methods (for overhead measurements),
``op="flush"`` writes pending rows and returns how many rows were written so far, ``op="hybrid"`` with
``policy=`` switches the installed hybrid between runs (``set_hybrid``: one engine measures EAGLE alone, the idle
hybrid and the hybrids interleaved, so engine-to-engine host noise cancels), ``op="probe"`` times
``engine.host_probe`` in the worker (``VLLMEngine.engine_probe``: the host's speed where t_draft and t_other
accrue, read just before and after each run, outside its timed window).
"""
from __future__ import annotations

import copy
import importlib.abc
import json
import logging
import os
import sys
import threading
import time
import warnings

logger = logging.getLogger("spec_repro.vllm_plugin")

from .common import (ENV_DRAFT_CG, ENV_FORCE, ENV_GAP, ENV_HYBRID, ENV_HYBRID_COST, ENV_HYBRID_GRAPHS,  # noqa: F401
                     ENV_HYBRID_PAD, ENV_PATH, HYBRID_OFF, host_probe, prompt_hash)

PLUGIN_VERSION = 3   # 1: events resolved inside the step; 2: resolved while the GPU runs; 3: + lazy batch shape
SUPPORTED_VERSIONS = ("0.25.",)           # prefixes of vllm.__version__
RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
WORKER_MODULE = "vllm.v1.worker.gpu_worker"
# method -> parameter names that must be present (the layout this plugin was written against)
RUNNER_METHODS = {
    "execute_model": ("scheduler_output",),
    "sample_tokens": ("grammar_output",),
    "_model_forward": (),
    "_sample": ("logits", "spec_decode_metadata"),
    "propose_draft_token_ids": ("scheduler_output",),
}

_state = {"registered": False, "disabled_reason": None, "patched": False, "draft_cudagraphs": False,
          "hybrid": None, "hybrid_error": None, "hybrid_pad": False, "hybrid_now": None, "hybrid_installed": False}
_ORIG: dict[str, object] = {}
_lock = threading.Lock()


# ---- registration --------------------------------------------------------------------------------------------
def register() -> None:
    """Entry point of the ``vllm.general_plugins`` group. Idempotent; a no-op unless SPEC_REPRO_STEP_LOG,
    SPEC_REPRO_DRAFT_CUDAGRAPHS or SPEC_REPRO_HYBRID is set."""
    if _state["registered"] or not (os.environ.get(ENV_PATH) or os.environ.get(ENV_DRAFT_CG) == "1"
                                    or os.environ.get(ENV_HYBRID)):
        return
    _state["registered"] = True
    ok, why = check_version()
    if not ok and os.environ.get(ENV_FORCE) != "1":
        _disable(why)
        return
    mod = sys.modules.get(RUNNER_MODULE)
    if mod is not None:
        _on_import(RUNNER_MODULE, mod)
    wmod = sys.modules.get(WORKER_MODULE)
    if wmod is not None:
        _on_import(WORKER_MODULE, wmod)
    if not any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PostImportFinder())


def check_version(version: str | None = None) -> tuple[bool, str]:
    """(supported?, reason). ``version`` defaults to the installed vLLM's."""
    if version is None:
        try:
            import vllm

            version = getattr(vllm, "__version__", "unknown")
        except Exception as e:  # pragma: no cover - only without vLLM
            return False, f"vLLM cannot be imported ({e})"
    if any(version.startswith(p) for p in SUPPORTED_VERSIONS):
        return True, f"vLLM {version}"
    return False, (f"vLLM {version} is not a supported version (supported: "
                   f"{', '.join(p + 'x' for p in SUPPORTED_VERSIONS)}); set {ENV_FORCE}=1 to try anyway")


def check_layout(runner_cls) -> list[str]:
    """Problems with the model runner class's layout (empty list = the plugin can patch it)."""
    import inspect

    problems = []
    for name, params in RUNNER_METHODS.items():
        fn = getattr(runner_cls, name, None)
        if fn is None or not callable(fn):
            problems.append(f"{runner_cls.__name__}.{name} is missing")
            continue
        try:
            have = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            continue
        for p in params:
            if p not in have:
                problems.append(f"{runner_cls.__name__}.{name} has no parameter {p!r}")
    return problems


def status() -> dict:
    return {"registered": _state["registered"], "patched": _state["patched"], "version": PLUGIN_VERSION,
            "disabled_reason": _state["disabled_reason"], "path": os.environ.get(ENV_PATH),
            "draft_cudagraphs": _state["draft_cudagraphs"], "hybrid": _state["hybrid"],
            "hybrid_error": _state["hybrid_error"], "hybrid_pad": _state["hybrid_pad"],
            "hybrid_now": _state["hybrid_now"] or _state["hybrid"]}


def _disable(why: str) -> None:
    _state["disabled_reason"] = why
    msg = f"spec_repro step timing DISABLED: {why}"
    logger.warning(msg)
    warnings.warn(msg, RuntimeWarning, stacklevel=2)
    print(f"[spec_repro] {msg}", file=sys.stderr, flush=True)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Patches the V1 model runner / worker modules right after they are imported (in whichever process)."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in (RUNNER_MODULE, WORKER_MODULE):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _PatchingLoader(spec.loader, fullname)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner, name):
        self.inner, self.name = inner, name

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        _on_import(self.name, module)

    def __getattr__(self, item):  # get_source, is_package, ... for tools that ask the loader
        return getattr(self.inner, item)


def _on_import(name: str, module) -> None:
    try:
        if name == RUNNER_MODULE:
            cls = getattr(module, "GPUModelRunner", None)
            if cls is None:
                _disable(f"{RUNNER_MODULE} has no GPUModelRunner")
                return
            problems = check_layout(cls)
            if problems:
                _disable("unsupported model-runner layout: " + "; ".join(problems))
                return
            if os.environ.get(ENV_DRAFT_CG) == "1":
                patch_draft_cudagraphs(cls)
            if os.environ.get(ENV_HYBRID):
                patch_hybrid(cls)
            if not os.environ.get(ENV_PATH):
                return
            _ORIG["runner_cls"] = cls
            _ORIG["async_out_cls"] = getattr(module, "AsyncGPUModelRunnerOutput", None)
            instrument(True)
        elif name == WORKER_MODULE:
            worker_cls = getattr(module, "Worker", None)
            if worker_cls is not None:
                worker_cls.spec_repro_steps = _worker_rpc
    except Exception as e:  # never break vLLM because of the timer
        _disable(f"patching {name} failed: {type(e).__name__}: {e}")


# ---- patching ------------------------------------------------------------------------------------------------
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


def patch_hybrid(cls) -> bool:
    """Install the live hybrid on the runner class (see the module docstring); the policy is built per runner at
    its first drafting step, from ``SPEC_REPRO_HYBRID`` and the runner's speculative config."""
    from . import hybrid as H

    name = os.environ.get(ENV_HYBRID, "")
    if name not in H.POLICIES:
        _hybrid_off(f"{ENV_HYBRID}={name!r} is not a hybrid policy ({', '.join(H.POLICIES)})")
        return False
    missing = [m for m in ("propose_draft_token_ids", "execute_model", "_update_states")
               if not callable(getattr(cls, m, None))]
    if missing or getattr(cls.propose_draft_token_ids, "_spec_repro_hybrid", False):
        if missing:
            _hybrid_off(f"{cls.__name__} has no {', '.join(missing)}")
        return False
    orig_propose, orig_exec, orig_update = cls.propose_draft_token_ids, cls.execute_model, cls._update_states

    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, *args, **kwargs):
        now = _state["hybrid_now"] or name         # switched between runs by op="hybrid" (one engine, A/B)
        if now == HYBRID_OFF:                       # vLLM's own EAGLE step, not counted: EAGLE alone
            return orig_propose(self, scheduler_output, sampled_token_ids, *args, **kwargs)
        hy = _live_hybrid(self, now)
        if hy is None:
            return orig_propose(self, scheduler_output, sampled_token_ids, *args, **kwargs)
        if isinstance(hy, _DeviceHybrid):       # gpu-*: the rule on the device, no host round trip
            return _gpu_hybrid_step(self, hy, orig_propose, scheduler_output, sampled_token_ids, args, kwargs)
        if hy.policy.name in H.PASSTHROUGH:     # nothing to decide: vLLM's own EAGLE step, only counted
            out = orig_propose(self, scheduler_output, sampled_token_ids, *args, **kwargs)
            rec = _REC[1]
            if rec is not None and rec.cur is not None:
                ids = list(self.input_batch.req_ids)
                rec.cur.hybrid = H.passthrough_summary(len(ids), hy.policy.kmax,
                                                       ids if rec.cur.ctx["detail"] else None)
            return out
        return _hybrid_step(self, hy, orig_propose, scheduler_output, sampled_token_ids, args, kwargs)

    def execute_model(self, scheduler_output, *args, **kwargs):
        # async path: cut the k placeholder slots the scheduler gave each request to its valid draft count, on a
        # private copy of the SchedulerOutput. The scheduler must keep the uncut counts: it advanced
        # num_computed_tokens by them at schedule time (scheduler.py:1174-1177) and takes back k - accepted at
        # update_from_output (scheduler.py:1583-1607); the runner's correction, with prev_num_draft_len restored
        # to k, takes back the same (gpu_model_runner.py:1317-1343, 1496-1509). The in-process executor hands
        # the scheduler's own object to the runner (uniproc_executor.py:79-121), so cutting it in place would
        # make the scheduler take back only j - accepted and drift by k - j per cut step.
        for hy in (getattr(self, "_spec_repro_hybrids", None) or {}).values():   # every device hybrid built,
            if isinstance(hy, _DeviceHybrid):   # active or not, every step: finished requests are often told in
                hy.history.forget(getattr(scheduler_output, "finished_req_ids", ()))   # a step with no drafting
        valid = getattr(self, "_spec_repro_valid", None)
        self._spec_repro_valid, self._spec_repro_before = None, {}
        if valid:
            so = copy.copy(scheduler_output)
            so.num_scheduled_tokens = dict(so.num_scheduled_tokens)
            so.scheduled_spec_decode_tokens = dict(so.scheduled_spec_decode_tokens)
            removed, self._spec_repro_before = H.trim_scheduled(so.num_scheduled_tokens,
                                                                so.scheduled_spec_decode_tokens, valid)
            so.total_num_scheduled_tokens -= removed
            rec = _REC[1]
            if rec is not None and rec.cur is not None and rec.cur.so is scheduler_output:
                rec.cur.so = so          # the step row shows the drafts verified
            scheduler_output = so
        return orig_exec(self, scheduler_output, *args, **kwargs)

    def _update_states(self, scheduler_output, *args, **kwargs):
        out = orig_update(self, scheduler_output, *args, **kwargs)
        for r, k in (getattr(self, "_spec_repro_before", None) or {}).items():
            rs = self.requests.get(r)       # as vLLM after cutting its GPU n-gram's drafts (gpu_model_runner.py:
            if rs is not None:              # 1458-1461): the slots scheduled, for the next step's correction
                rs.prev_num_draft_len = k
        self._spec_repro_before = {}
        return out

    propose_draft_token_ids._spec_repro_hybrid = True
    cls.propose_draft_token_ids, cls.execute_model = propose_draft_token_ids, execute_model
    cls._update_states = _update_states
    _state["hybrid"] = name
    _state["hybrid_pad"] = _pad_on()
    _state["hybrid_installed"] = True
    return True


def _pad_on() -> bool:
    return os.environ.get(ENV_HYBRID_PAD) == "1"


def set_hybrid(policy: str | None) -> None:
    """Switch the installed hybrid to ``policy`` (a ``hybrid.POLICIES`` name; ``HYBRID_OFF``: vLLM's own EAGLE,
    uncounted; None: back to ``SPEC_REPRO_HYBRID``'s) for the steps that follow: between runs, when no request is
    in flight (a request's device rows start from its prompt under the policy that first drafts for it). Refused
    (ValueError) for an unknown name or when no hybrid is installed; a policy that went off (``hybrid_error``)
    leaves the others switchable."""
    from . import hybrid as H

    if policy is not None and policy != HYBRID_OFF and policy not in H.POLICIES:
        raise ValueError(f"hybrid policy {policy!r}: one of {HYBRID_OFF}, {', '.join(H.POLICIES)}")
    if policy is not None and not _state["hybrid_installed"]:
        raise ValueError(f"no hybrid installed (start the engine with {ENV_HYBRID}=<policy>): cannot switch to "
                         f"{policy!r}")
    _state["hybrid_now"] = policy


def _hybrid_off(why: str) -> None:
    _state["hybrid"], _state["hybrid_error"] = None, why
    msg = f"spec_repro hybrid OFF (vLLM runs its own drafter): {why}"
    logger.warning(msg)
    print(f"[spec_repro] {msg}", file=sys.stderr, flush=True)


def _live_hybrid(runner, name: str):
    """The runner's hybrid for policy ``name`` (built at its first drafting step under that policy, then kept:
    an engine switched between policies keeps one per policy), or None where the hybrid cannot run. The active
    one is also ``runner._spec_repro_hybrid``."""
    built = runner.__dict__.setdefault("_spec_repro_hybrids", {})
    if name not in built:
        built[name] = _build_hybrid(runner, name)
    runner._spec_repro_hybrid = built[name]
    return built[name]


def _build_hybrid(runner, name: str):
    runner._spec_repro_hybrid = None
    try:
        from . import hybrid as H

        sc = runner.speculative_config
        if sc is None or sc.method != "eagle":
            _hybrid_off(f"the hybrid needs method 'eagle', vLLM runs {getattr(sc, 'method', None)!r}")
            return None
        if name in H.GPU_POLICIES:
            from .gpu_hybrid import DeviceHistory

            return _DeviceHybrid(name, DeviceHistory(runner.max_num_reqs, runner.max_model_len, runner.device))
        pol = H.HybridPolicy(name, int(sc.num_speculative_tokens), os.environ.get(ENV_HYBRID_COST) or None)
        return H.LiveHybrid(pol, pad=_pad_on())
    except Exception as e:
        _hybrid_off(f"{type(e).__name__}: {e}")
    return None


def _hybrid_step(runner, hy, orig, so, sampled, args, kwargs):
    """One step of the live hybrid (needs a live vLLM: checked by the GPU session, see the module docstring)."""
    import numpy as np
    import torch

    from . import hybrid as H

    hy.forget(getattr(so, "finished_req_ids", ()))
    ib = runner.input_batch
    req_ids = list(ib.req_ids)
    B = len(req_ids)
    after = isinstance(sampled, list)       # disable_padded_drafter_batch: called after the bookkeeping
    if after:                                # valid tokens per request already (parse_output's)
        new = sampled
    else:                                    # the padded path: [B, k+1], -1 after the first rejection
        discard = np.nonzero(runner.discard_request_mask.np[:B])[0]
        new = H.valid_tokens(sampled[:B].cpu(), discard, ib.vocab_size)
    context_of = None
    if not runner.use_async_scheduling:
        # the synchronous runner's own token ids before this step (the bookkeeping writes real ids there,
        # gpu_model_runner.py:3740-3746; under async it writes -1 placeholders, :3727): the hybrid re-reads a
        # request's history from them when its own count differs (steps whose drafting vLLM skipped, e.g.
        # input too long for the drafter, gpu_model_runner.py:4559-4617; a resumed request)
        nts, tok = ib.num_tokens_no_spec, ib.token_ids_cpu
        if after:
            context_of = lambda i: tok[i, :int(nts[i]) - len(new[i])]  # noqa: E731
        else:
            context_of = lambda i: tok[i, :int(nts[i])]  # noqa: E731
    need = hy.begin(req_ids, new, lambda r: runner.requests[r].prompt_token_ids or [], context_of)
    eagle = None
    if any(need):
        out = orig(runner, so, sampled, *args, **kwargs)
        eagle = out[:B].cpu()
    elif not after and runner.valid_sampled_token_count_event is not None:
        # EAGLE skipped (async only): the next-token bookkeeping the next step's input preparation reads
        # (prev_sampled_token_ids, valid_sampled_token_count_gpu), as vLLM does when its drafter cannot run
        # (gpu_model_runner.py:4563-4575, 4850-4870; the synchronous runner has no such event, :905-915)
        nxt, cnt = runner.drafter.prepare_next_token_ids_padded(sampled, runner.requests, ib,
                                                                runner.discard_request_mask.gpu)
        runner._copy_valid_sampled_token_count(nxt, cnt)
    runner._draft_probs = runner._draft_prob_req_ids = None
    # at most the slots the scheduler gives the next step (num_spec_tokens_to_schedule: EAGLE's width too,
    # gpu_model_runner.py:4928, 5170; async placeholders, async_scheduler.py:22-25); with padding on, exactly
    # that many for every request that emitted tokens (a uniform 1 + k decode batch next step)
    width = int(getattr(so, "num_spec_tokens_to_schedule", 0) or hy.policy.kmax)
    drafts = [c.draft for c in hy.finish(eagle, width=width, vocab_size=ib.vocab_size)]
    rec = _REC[1]
    if rec is not None and rec.cur is not None:
        rec.cur.hybrid = hy.summary(req_ids if rec.cur.ctx["detail"] else None)
    drafts = [d[:width] for d in drafts]
    if not runner.use_async_scheduling:
        return drafts
    ids, counts = H.pack(drafts, width)
    runner._spec_repro_valid = dict(zip(req_ids, counts.tolist()))
    return torch.from_numpy(ids).to(runner.device)


class _DeviceHybrid:
    """A runner's device-side hybrid (``gpu_hybrid``): the policy's name and its token buffer."""

    def __init__(self, name: str, history):
        from .gpu_hybrid import DeviceStep

        self.name, self.history, self.steps = name, history, 0
        graphs = None if os.environ.get(ENV_HYBRID_GRAPHS, "1") != "0" else False   # None: on where CUDA
        self.step = DeviceStep(history, use_ngram=name == "gpu-pr24344", graphs=graphs)


class _DeviceCounts:
    """A step's ``hybrid`` entry, copied to pinned host memory without a wait and read when the row is built
    (after the step's last event: the copy, queued before it on the same stream, is done by then)."""

    __slots__ = ("buf", "n", "k", "graph")

    def __init__(self, buf, n: int, k: int, graph: bool = False):
        self.buf, self.n, self.k, self.graph = buf, n, k, graph

    def resolve(self) -> dict:
        from .gpu_hybrid import summary_row

        return summary_row(self.buf.tolist(), self.n, self.k, self.graph)


def _gpu_hybrid_step(runner, hy, orig, so, sampled, args, kwargs):
    """One step of the device-side hybrid: vLLM's EAGLE drafts (its own code, unchanged), this step's tokens into
    the device buffer, the n-gram lookup there, the choice by ``torch.where`` (``gpu_hybrid.DeviceStep``: one
    CUDA-graph replay per batch shape, ``SPEC_REPRO_HYBRID_GRAPHS=0`` for eager steps); nothing is read back to the
    host (the step log's counts ride a non-blocking copy). Needs the padded drafter path (a tensor of sampled tokens:
    vLLM's default for EAGLE); elsewhere the hybrid goes off with one message and vLLM runs plain EAGLE."""
    import torch

    out = orig(runner, so, sampled, *args, **kwargs)
    if not (torch.is_tensor(sampled) and torch.is_tensor(out)):
        _hybrid_off("the device-side hybrid needs vLLM's padded drafter batch (disable_padded_drafter_batch "
                    "off): it reads the sampled tokens as a tensor")
        runner._spec_repro_hybrid = runner._spec_repro_hybrids[hy.name] = None
        return out
    gh = hy.history
    gh.forget(getattr(so, "finished_req_ids", ()))
    ib = runner.input_batch
    req_ids = list(ib.req_ids)
    B = len(req_ids)
    rows = gh.rows(req_ids, lambda r: runner.requests[r].prompt_token_ids or [])
    k = int(out.shape[1])
    draft, counts = hy.step(rows, sampled[:B], ~runner.discard_request_mask.gpu[:B], out[:B], ib.vocab_size)
    hy.steps += 1
    rec = _REC[1]
    if rec is not None and rec.cur is not None:
        buf = torch.empty(2, dtype=torch.int64, pin_memory=torch.cuda.is_available())
        buf.copy_(counts, non_blocking=True)
        rec.cur.hybrid = _DeviceCounts(buf, B, k, hy.step.last_graph)
    runner._draft_probs = runner._draft_prob_req_ids = None
    if out.shape[0] > B:
        out = out.clone()
        out[:B] = draft
        return out
    return draft


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


def _worker_rpc(self, op: str = "status", **kw):
    """``Worker.spec_repro_steps``: called through ``LLM.collective_rpc("spec_repro_steps", kwargs=...)``."""
    rec = _recorder()
    _guard(rec.flush)
    if op == "context":
        rec.set_context(**kw)
    elif op == "instrument":
        instrument(bool(kw.get("on", True)))
    elif op == "hybrid":
        set_hybrid(kw.get("policy"))
    elif op == "probe":      # the host's speed in THIS process (the engine core's worker), between runs
        return {"probe_ms": host_probe(), "pid": os.getpid()}
    return {**status(), "rows": rec.rows_written, "pid": os.getpid(), "context": dict(rec.ctx)}


# ---- the recorder --------------------------------------------------------------------------------------------
class _Step:
    __slots__ = ("so", "marks", "host_start", "host_end", "gap", "in_forward", "outputs", "ctx", "stream",
                 "index", "hybrid")

    def __init__(self, so, host_start, gap, ctx, stream):
        self.so, self.marks, self.host_start, self.host_end = so, [], host_start, None
        self.gap, self.in_forward, self.outputs, self.ctx, self.stream = gap, False, None, ctx, stream
        self.index = 0
        self.hybrid = None          # the live hybrid's choices at this step (LiveHybrid.summary)

    def set_outputs(self, out) -> None:
        try:
            self.outputs = (list(out.req_ids), [len(x) for x in out.sampled_token_ids])
        except Exception:
            self.outputs = None


class StepRecorder:
    """Collects steps of one process; writes JSON lines to ``path`` (append)."""

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
        self._pool: list = []      # CUDA events to reuse (creating them costs host time every step)
        self._lines: list[str] = []

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

    def _event(self, stream):
        ev = self._pool.pop() if self._pool else self._torch.cuda.Event(enable_timing=True)
        ev.record(stream)
        return ev

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
        # the batch shape is read from ``so`` when the row is built (in drain, while the GPU runs): vLLM builds a
        # new SchedulerOutput every step and does not change it afterwards
        stream = self._torch.cuda.current_stream()
        st = _Step(so, now, gap, self.ctx, stream)
        st.marks.append(("start", self._event(stream)))
        self.cur = st

    def mark(self, name: str) -> None:
        st = self.cur
        if st is not None:
            st.marks.append((name, self._event(st.stream)))

    def end(self, out) -> None:
        st, self.cur = self.cur, None
        if st is None:
            return
        st.marks.append(("end", self._event(st.stream)))
        st.host_end = self.last_host_end = time.perf_counter()
        if out is not None:
            if hasattr(out, "sampled_token_ids") and not hasattr(out, "get_output"):
                st.set_outputs(out)
            elif hasattr(out, "get_output"):
                out._spec_repro_step = st
        st.index = self.step
        self.step += 1
        self.pending.append(st)
        if len(self.pending) > 1024:      # nothing drained them (no sampling step): resolve here
            self.flush()

    def drain(self, max_steps: int = 2) -> None:
        """Resolve up to ``max_steps`` finished steps whose events have completed, without waiting.

        Called right after the sampler was launched, while the GPU still runs this step's forward: the host
        would only wait there, so the work is hidden (this keeps the timer's own cost off the step)."""
        n = 0
        while self.pending and n < max_steps and self.pending[0].marks[-1][1].query():
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
        marks = st.marks
        marks[-1][1].synchronize()  # complete already when called from drain(); cheap
        start = marks[0][1]
        times = [(name, start.elapsed_time(ev) / 1e3) for name, ev in marks]
        self._pool.extend(ev for _, ev in marks)
        st.marks = []
        phases = phase_times(times)
        gap = st.gap if (st.gap is not None and st.gap < self.gap_cap) else 0.0
        phases["t_other"] += gap
        phases["t_total"] += gap
        meta = step_meta(st.so, detail=bool(st.ctx["detail"]))
        meta["step"] = st.index
        st.so = None
        if st.hybrid is not None:
            meta["hybrid"] = st.hybrid.resolve() if isinstance(st.hybrid, _DeviceCounts) else st.hybrid
        return build_row(st.ctx, meta, phases, st.outputs, gap=gap, raw_gap=st.gap)


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


def build_row(ctx: dict, meta: dict, phases: dict, outputs, gap: float = 0.0, raw_gap=None) -> dict:
    """One STEP_COLUMNS row (plus optional fields) from a step's context, shape, phase times and outputs."""
    spec = meta.get("_spec", {})
    acc: dict[str, int] = {}
    if outputs is not None:
        for rid, n in zip(*outputs):
            if rid in spec and n > 0:
                acc[rid] = max(0, min(spec[rid], n - 1))
    row = {"run_id": ctx["run_id"], "engine": ctx["engine"], "model": ctx["model"], "method": ctx["method"],
           "k": int(ctx["k"]), "batch_size": int(ctx["batch_size"]), "step": int(meta.get("step", 0)),
           "num_reqs": meta["num_reqs"], "batched_tokens": meta["batched_tokens"], "kv_tokens": meta["kv_tokens"],
           **{k: float(v) for k, v in phases.items()},
           "num_draft_tokens": meta["num_draft_tokens"], "num_accepted_tokens": int(sum(acc.values())),
           "phase": meta["phase"], "accepted_per_req": acc, "t_sched": float(gap),
           "outputs_known": outputs is not None}
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
