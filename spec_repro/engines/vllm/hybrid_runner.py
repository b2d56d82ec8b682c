"""The hybrid glue: the live n-gram + EAGLE hybrid (``hybrid.POLICIES``, ``gpu_hybrid.GPU_POLICIES``) wrapped
around the V1 runner's drafting.

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

The device-side policies (``gpu_hybrid.V1_GPU_POLICIES``: ``gpu-pr24344``, ``gpu-eagle-only``; ``gpu-pr24344-skip`` is
the V2 runner's only, ``hybrid_v2``) take another path,
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
"""
from __future__ import annotations

import copy
import os
import sys

from . import step_timer
from .common import ENV_HYBRID, ENV_HYBRID_COST, ENV_HYBRID_GRAPHS, ENV_HYBRID_PAD, HYBRID_OFF
from .state import _state, logger


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
            rec = step_timer._REC[1]
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
            rec = step_timer._REC[1]
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
            from .gpu_hybrid import V1_GPU_POLICIES, DeviceHistory

            if name not in V1_GPU_POLICIES:
                _hybrid_off(f"{name!r} runs on the V2 model runner only (hybrid_v2); the V1 runner's device-side "
                            f"policies are {', '.join(V1_GPU_POLICIES)}")
                return None

            return _DeviceHybrid(name, DeviceHistory(runner.max_num_reqs, runner.max_model_len, runner.device))
        pol = H.HybridPolicy(name, int(sc.num_speculative_tokens), os.environ.get(ENV_HYBRID_COST) or None)
        return H.LiveHybrid(pol, pad=_pad_on())
    except Exception as e:
        _hybrid_off(f"{type(e).__name__}: {e}")
    return None


def _hybrid_step(runner, hy, orig, so, sampled, args, kwargs):
    """One step of the live hybrid (needs a live vLLM: see the module docstring's GPU checks)."""
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
    rec = step_timer._REC[1]
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
    rec = step_timer._REC[1]
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
