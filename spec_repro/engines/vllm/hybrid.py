"""The live n-gram + EAGLE hybrid's per-step logic: per request, which proposal is verified and how many tokens.

Pure Python/numpy (no vLLM import): the vLLM side (a wrapper of the V1 runner's ``propose_draft_token_ids``,
installed by the package's plugin) calls it once per step with what the engine knows at that step, and hands the
returned per-request lists to the scheduler, which accepts any length, none included.

Lossless by construction: a hybrid only chooses which *draft* tokens are proposed; verification stays the
target's own (greedy: the longest prefix of the draft equal to the target's tokens, plus the target's next
token), so the output is plain greedy decoding's whatever the policy picks.

What a decision reads (per request, at a step start with context ``tokens`` = prompt + output so far)
-----------------------------------------------------------------------------------------------------
The token ids so far, the prompt length, n-gram's proposal (vLLM's prompt lookup at k = ``kmax``: a list, empty
when nothing matched), EAGLE's proposal (a list of ``kmax`` ints, or None where its drafting was skipped), the
batch size, and what the tokens emitted since the request's previous step start reveal about the proposals
made there (how many of each one's tokens match them: the verified one's accepted count among them). Nothing
else; a :class:`RequestState` keeps what is needed between steps, all of it derived from these.

Policies
--------
``pr24344``        vLLM PR #24344's rule: n-gram's proposal where it matched (non-empty), else EAGLE's. Both
                   proposers run every step.
``pr24344-skip``   the same choice; EAGLE's proposal is not needed where n-gram matched (its drafting can be
                   skipped or masked there: :func:`policy_needs_eagle`).
``ngram-only``     n-gram's proposal where it matched, else no draft; EAGLE's proposal is never read (its drafting
                   is skipped every step): vLLM's n-gram through the hybrid's path, so with padding on ("Padding"
                   below) n-gram with every draft padded to k (vLLM's own n-gram cannot be padded). vLLM still
                   loads the EAGLE head (the plugin needs method ``eagle``).
``eagle-only``     EAGLE's proposal for every request: the hybrid loaded (its n-gram lookups and bookkeeping run)
                   but idle, for the plugin's overhead against plain EAGLE. Measured on the H200 (2026-12-01,
                   ``data/gpu/v1-runner/reproduce-grid``): 23-26% below EAGLE alone at bs 1-64, 2.4-3.9 ms more
                   drafting per step:
                   the cost of the hybrid's machinery itself, whatever it chooses (the likely cause, read from the
                   plugin: its host reads of the sampled tokens and of EAGLE's drafts every step, which make the
                   CPU wait for the GPU where async scheduling would overlap them).
``idle``           the hybrid loaded with nothing to decide: every request on EAGLE, and the plugin hands each
                   step to vLLM's own EAGLE untouched (:data:`PASSTHROUGH`: no lookups, no host reads), so its cost
                   is the plugin's alone (what ``eagle-only`` pays beyond it is the machinery's).
``gpu-pr24344``    PR #24344's rule on the device, no host round trip (:mod:`.gpu_hybrid`): n-gram's tokens where it
                   matched, EAGLE's at every other position; every request k tokens. Both run every step.
``gpu-eagle-only`` the device-side machinery (token buffer, n-gram lookup, the mix) with every request on EAGLE:
                   its cost, loaded but idle.
``gpu-pr24344-skip`` V2 runner only (:mod:`.hybrid_v2`): ``gpu-pr24344`` with EAGLE's draft decode steps skipped
                   for the whole batch when every request matched at the latest step whose flag reached the host.
                   These three are not :class:`HybridPolicy` ones (``HOST_POLICIES``).
``adaptive-rule``  the simulator's best causal policy, :mod:`spec_repro.adaptive`'s rule on the same signals
                   (``ng_dl``, ``ng_run``, decayed acceptance counts, ``since``) with the same cost-based choice of
                   (proposer, k), through the per-decision functions the simulator's walk uses
                   (``adaptive._reveal``, ``_estimates``, ``_rule_choice``, ``_advance``), so given the same
                   inputs and cost model both take the same decisions (tests/test_hybrid.py checks it step by step
                   on committed traces, requests served one after another as the simulator walks them). The
                   population's counts (every revealed outcome of every request, the prior of a request's own
                   estimate) live on the policy; a request reads them as they stood when its state was made
                   (``new_state``). The decision is made before EAGLE drafts: EAGLE is needed only where the
                   rule verifies it, and, as in the simulator, an EAGLE proposal that is not verified is not read
                   (EAGLE "did not run" there, its catch-up is charged when it comes back). Where the simulator
                   reads a trace's acc_len, the live policy matches proposals against the tokens emitted since:
                   the revealed value ``min(acc, d + 1, g + 1)`` (d: proposal length, g: tokens emitted) and
                   whether a rejection was seen are the same either way, and ``ng_run`` (the n-gram proposal made m
                   positions ago matched the m tokens emitted since) is recomputed with the package's lookup
                   (:func:`spec_repro.proposers.ngram.ngram_lookup`, vLLM's semantics) at the context lengths no
                   step started at.

Batch entry points: :func:`policy_needs_eagle` (before EAGLE drafts) and :func:`mix` (after: n-gram lists +
EAGLE's [B, k] array -> one list per request, cut to the chosen k).

One engine step, as the plugin runs it (:class:`LiveHybrid`, still pure)
-------------------------------------------------------------------------
The plugin (``hybrid_runner.py``, ``SPEC_REPRO_HYBRID=<policy>`` with vLLM method ``eagle``) wraps the V1 runner's
``propose_draft_token_ids``; per step it hands :class:`LiveHybrid` what the runner knows there and nothing else:

1. ``begin(req_ids, new_tokens, prompt_of)``: the tokens each request emitted this step (the sampler's
   ``[B, k+1]`` output through :func:`valid_tokens`, as vLLM's ``RejectionSampler.parse_output``: -1 placeholders
   and discarded rows, i.e. partial prefill chunks, dropped). The hybrid keeps each request's token ids itself
   (prompt + everything emitted): under async scheduling the runner's ``token_ids_cpu`` holds -1 placeholders,
   so one history serves both paths. It looks up n-gram (the package's ``ngram_lookup``, min_n 3, max_n 7: the
   lookup the policies' ``ng_run`` uses) and returns per request whether the choice reads EAGLE's proposal.
2. ``finish(eagle)``: EAGLE's ``[B, k]`` rows (None when the step skipped EAGLE's drafting) -> one
   :class:`Choice` per request; requests with no tokens this step get an empty draft.
3. The runner wants the drafts as ``list[list[int]]`` on the synchronous path and as a ``[B, k]`` tensor plus
   per-request valid counts under async scheduling (the scheduler there always schedules k placeholder slots;
   the plugin trims them before the next step's input preparation, as vLLM does for its GPU n-gram):
   :func:`pack` / :func:`unpack` convert (lossless for drafts of at most k tokens), :func:`trim_scheduled`
   trims a step's scheduled counts.
4. ``summary()``: the step's counts per proposer for the step log's ``hybrid`` column.

Padding (``LiveHybrid(pad=True)``; plugin ``SPEC_REPRO_HYBRID_PAD=1``; engine option ``hybrid_pad=True``)
-----------------------------------------------------------------------------------------------------
Off by default (the behaviour measured first stays reproducible). vLLM 0.25's V1 runner takes its full CUDA
graph only for a *uniform* decode batch, every request scheduling ``1 + num_speculative_tokens`` tokens
(``GPUModelRunner._is_uniform_decode``, v1/worker/gpu_model_runner.py:3816-3834, ``uniform_decode_query_len``
:842); one request with a shorter draft (an n-gram match near the context's end, a rule's smaller k) or none
makes the whole step non-uniform (measured on the H200 with Qwen2.5-Coder-1.5B: a 1-token n-gram step at bs 1
verifies in 8.55 ms, a 6-token one in 1.98 ms). With padding on, ``finish(eagle, width=)`` extends each request's
chosen draft to the step's width (the slots vLLM schedules next, ``num_spec_tokens_to_schedule``; the policy's
k_max without one), whatever the policy chose, no draft included. Greedy verification is lossless for any draft
tokens (a wrong token is rejected, a right one is the token greedy emits anyway), so padding changes only the
speed. The policy never sees the padding: its state and acceptance counts, and the step log's ``ngram_tokens`` /
``eagle_tokens`` / per-proposer counts, are its own tokens; ``pad_tokens`` (proposed this step), ``pad_by`` (per
filler) and ``pad_accepted`` (padding tokens accepted by this step's verification: of the drafts proposed at
each request's previous step) count the padding. A request that emitted nothing this step (a partial prefill
chunk) stays empty: the scheduler ignores a prefill chunk's drafts (v1/core/sched/scheduler.py:1958-1962). The fillers, in
the order tried: ``hybrid_batch`` (``pad_draft``).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .gpu_hybrid import GPU_POLICIES
from .hybrid_batch import (FILLERS, HybridError, _cycle, pack, pad_draft, passthrough_summary,  # noqa: F401
                           trim_scheduled, unpack, valid_tokens)

__all__ = ["FILLERS", "GPU_POLICIES", "HOST_POLICIES", "PASSTHROUGH", "POLICIES", "PROPOSERS", "Choice", "HybridError", "HybridPolicy", "LiveHybrid",
           "RequestState", "mix", "pack", "pad_draft", "passthrough_summary", "policy_needs_eagle", "select",
           "trim_scheduled", "unpack", "valid_tokens"]

HOST_POLICIES = ("pr24344", "pr24344-skip", "adaptive-rule", "ngram-only", "eagle-only", "idle")  # LiveHybrid's
POLICIES = HOST_POLICIES + GPU_POLICIES    # every live policy: the host's and the device's (gpu_hybrid)
PASSTHROUGH = ("idle",)    # policies whose every step is vLLM's own EAGLE step: the plugin does not wrap them
PROPOSERS = ("ngram", "eagle")   # row order of the adaptive state's arrays
NG, EA = 0, 1
_SOURCE = {-1: "", NG: "ngram", EA: "eagle"}


@dataclass(frozen=True)
class Choice:
    """One request's proposal to verify this step: ``draft`` (empty: no speculation) and where it came from
    (``"ngram"``, ``"eagle"``, or ``""`` when the policy proposes nothing); ``pad``: how many of ``draft``'s
    tokens, at its end, are padding (``LiveHybrid(pad=True)``; 0 otherwise), so the policy's own draft is
    ``draft[:len(draft) - pad]`` and ``source`` is that part's."""

    draft: list[int]
    source: str
    pad: int = 0


class RequestState:
    """What a policy keeps about one request between its steps (everything derived from its token ids)."""

    def __init__(self, prompt_len: int):
        if int(prompt_len) < 1:
            raise HybridError(f"prompt_len must be >= 1, got {prompt_len!r}")
        self.prompt_len = int(prompt_len)
        self.n_prev = -1                      # context length at the previous step start (-1: none yet)
        self.draft: list[int] = []            # the proposal verified at that step ([]: none)
        self.accepted: int | None = None     # how many of its tokens the target accepted (None before step 2)
        self.proposed: list[list[int]] = [[], []]   # adaptive-rule, per proposer: its proposal read at that step
        self.ngram_at: dict[int, list[int]] = {}   # adaptive-rule: n-gram lookups by context length (last kmax+1)
        self.pending: tuple | None = None    # adaptive-rule: (n, v, k, ng_dl, bucket, ngram) until select
        # adaptive's per-request signal state, as in adaptive._walk
        self.cnt = np.zeros((2, 2, 4), np.float64)
        self.last = np.zeros(2, np.float64)
        self.since = np.zeros(2, np.int64)
        self.prev_ran = np.zeros(2, np.bool_)
        self.prev_d = np.zeros(2, np.int64)
        self.alpha1 = np.zeros(2, np.float64)
        self.alpha2 = np.zeros(2, np.float64)
        self.prev_bucket = 0
        self.pool = np.zeros((2, 2, 4), np.float64)   # the population's counts when the request started


def _prefix(a: Sequence[int], b: np.ndarray) -> int:
    """How many leading tokens of proposal ``a`` equal the emitted tokens ``b`` (at most len(b))."""
    m = 0
    for x, y in zip(a, b.tolist()):
        if int(x) != y:
            break
        m += 1
    return m


class HybridPolicy:
    """One policy over requests with up to ``kmax`` draft tokens (vLLM's ``num_speculative_tokens``; n-gram's and
    EAGLE's proposals are that long at most). ``adaptive-rule`` needs a cost model (preset name, path or
    ``CostModel``) with drafters for ``ngram`` and ``eagle``; ``params``: its ``adaptive.RuleParams``."""

    def __init__(self, name: str, kmax: int, cost_model: Any = None, params: Any = None):
        if name not in HOST_POLICIES:
            where = " (a device-side policy: gpu_hybrid, not LiveHybrid)" if name in GPU_POLICIES else ""
            raise HybridError(f"unknown hybrid policy {name!r}{where}; expected one of {', '.join(HOST_POLICIES)}")
        if int(kmax) < 1:
            raise HybridError(f"kmax must be >= 1 (vLLM's num_speculative_tokens), got {kmax!r}")
        self.name, self.kmax = name, int(kmax)
        if name == "adaptive-rule":
            from ... import adaptive as AD
            from ...costmodel import CostModelError, load_cost_model

            if cost_model is None:
                raise HybridError("adaptive-rule prices proposals with a cost model: pass cost_model= (a preset "
                                  "name, a preset file or a CostModel)")
            try:
                self.cost_model = load_cost_model(cost_model)
                self._costs = AD._costs(self.cost_model, PROPOSERS)
            except CostModelError as e:
                raise HybridError(str(e)) from None
            self.params = params or AD.RuleParams()
            self._prm = self.params.array()
            self._pool = np.zeros((2, 2, 4), np.float64)   # every revealed outcome of every request so far
            self._ad = AD

    def new_state(self, prompt_len: int) -> RequestState:
        """A request's state; adaptive-rule's starts from the population's counts as they stand now."""
        st = RequestState(prompt_len)
        if self.name == "adaptive-rule":
            st.pool[:] = self._pool
        return st

    # ---- per request -------------------------------------------------------------------------------------------
    def needs_eagle(self, st: RequestState, tokens: np.ndarray, ngram: Sequence[int], batch_size: int) -> bool:
        """Whether this step's choice for the request reads EAGLE's proposal (asked before EAGLE drafts; the
        step's ``select`` must follow with the same tokens and n-gram list)."""
        if self.name in ("pr24344", "eagle-only", "idle"):
            return True
        if self.name == "pr24344-skip":
            return len(ngram) == 0
        if self.name == "ngram-only":
            return False
        return self._decide(st, tokens, ngram, batch_size)[0] == EA

    def select(self, st: RequestState, tokens: np.ndarray, ngram: Sequence[int], eagle: Sequence[int] | None,
               batch_size: int) -> Choice:
        """The proposal to verify for the request at this step (see the module docstring for the inputs)."""
        ngram = [int(x) for x in list(ngram)[: self.kmax]]
        if self.name != "adaptive-rule":
            self._observe(st, tokens)
            if self.name in ("eagle-only", "idle"):
                v = EA
            elif ngram:
                v = NG
            else:
                v = -1 if self.name == "ngram-only" else EA
            draft = ngram if v == NG else self._eagle(eagle, self.kmax) if v == EA else []
        else:
            v, k, ng_dl, bucket = self._decide(st, tokens, ngram, batch_size)
            draft = ngram[:k] if v == NG else self._eagle(eagle, k) if v == EA else []
            v = v if draft else -1
            self._ad._advance(v, len(draft), NG, ng_dl, st.since, st.prev_ran, st.prev_d)
            st.proposed = [ngram[:ng_dl], draft if v == EA else []]
            st.prev_bucket, st.pending = bucket, None
        st.n_prev, st.draft = len(tokens), draft
        return Choice(draft, _SOURCE[v] if draft else "")

    # ---- the rule ----------------------------------------------------------------------------------------------
    def _check(self, st: RequestState, tokens: np.ndarray) -> None:
        if not isinstance(tokens, np.ndarray) or tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            raise HybridError(f"tokens must be a 1-D integer numpy array (the request's token ids so far), got "
                              f"{type(tokens).__name__}{getattr(tokens, 'shape', '')}")
        n = len(tokens)
        if n <= st.prompt_len:
            raise HybridError(f"a step needs at least one output token: {n} token ids for a prompt of "
                              f"{st.prompt_len}")
        if n <= st.n_prev:
            raise HybridError(f"the request's tokens did not grow since its previous step ({st.n_prev} then {n}): "
                              f"one state per request, one select per step")

    def _observe(self, st: RequestState, tokens: np.ndarray) -> np.ndarray:
        """Check the step's tokens; the tokens emitted since the previous step start (and what they accepted)."""
        self._check(st, tokens)
        new = tokens[st.n_prev:] if st.n_prev >= 0 else tokens[:0]
        if st.n_prev >= 0:
            st.accepted = min(_prefix(st.draft, new), len(new) - 1)
        return new

    def _lookup(self, st: RequestState, tokens: np.ndarray, c: int) -> list[int]:
        """n-gram's proposal at context length ``c`` (looked up once per request and length)."""
        if c not in st.ngram_at:
            from ...proposers.ngram import ngram_lookup

            st.ngram_at[c] = [int(x) for x in ngram_lookup(tokens[:c], self.kmax)]
        return st.ngram_at[c]

    def _decide(self, st: RequestState, tokens: np.ndarray, ngram: Sequence[int], batch_size: int) -> tuple:
        """adaptive-rule's (v, k, ng_dl, bucket) at this step; computed once (kept until ``select``)."""
        n = len(tokens) if isinstance(tokens, np.ndarray) else -1
        ngram = [int(x) for x in list(ngram)[: self.kmax]]
        if st.pending is not None:
            if st.pending[0] != n or st.pending[-1] != ngram:
                raise HybridError(f"needs_eagle at {st.pending[0]} tokens was not followed by select with the same "
                                  f"tokens and n-gram list (got {n} tokens): call both once per step")
            return st.pending[1:-1]
        if int(batch_size) < 1:
            raise HybridError(f"batch_size must be >= 1, got {batch_size!r}")
        new = self._observe(st, tokens)
        AD, prm, kmax, P = self._ad, self._prm, self.kmax, st.prompt_len
        copy_run, decay, prior_a, prior_w, probe, pool_w, lcb = prm
        # 1. what the tokens emitted since the previous step start reveal about the proposals made there: the
        #    matched prefix m (<= len(new)) gives min(acc, lim) and whether acc < lim exactly as acc would
        for q in (NG, EA):
            if st.n_prev >= 0 and st.prev_ran[q] and st.prev_d[q] > 0:
                a, lim = 1 + _prefix(st.proposed[q], new), min(int(st.prev_d[q]) + 1, len(new) + 1)
                AD._reveal(st.cnt, st.last, q, st.prev_bucket if q == NG else 0, a, lim, decay)
                AD._reveal(self._pool, np.zeros(2), q, st.prev_bucket if q == NG else 0, a, lim, 1.0)
        # 2. n-gram signals from the tokens
        st.ngram_at[n] = ngram
        for c in [c for c in st.ngram_at if c < n - kmax]:
            del st.ngram_at[c]
        ng_dl = len(ngram)
        ng_run = 0
        top = min(kmax, n - P - 1)
        tail = tokens[n - top:n].tolist() if top > 0 else []
        for m in range(top, 0, -1):
            # the proposal at context n - m matched all m tokens emitted since
            prop = self._lookup(st, tokens, n - m)
            if len(prop) >= m and prop[:m] == tail[top - m:]:
                ng_run = m
                break
        bucket = 1 if ng_run >= copy_run else 0
        AD._estimates(st.cnt, st.pool, NG, bucket, prior_a, prior_w, pool_w, lcb, st.alpha1, st.alpha2, np.zeros(2),
                      np.zeros(2))
        # 3. decide
        B = int(batch_size)
        c = self._costs
        v, k = AD._rule_choice(NG, ng_dl, kmax, B * n, B, st.alpha1, st.alpha2, st.since, st.prev_ran,
                               st.n_prev < 0, c["tcost"], c["dkind"], c["dk"], c["dt"], c["d0"], c["frac"],
                               c["cstep"], c["creq"], c["cup"], probe)
        st.pending = (n, int(v), int(k), ng_dl, bucket, ngram)
        return st.pending[1:-1]

    def _eagle(self, eagle: Sequence[int] | None, k: int) -> list[int]:
        if eagle is None:
            raise HybridError(f"policy {self.name!r} verifies EAGLE's proposal here but none was given (its "
                              f"drafting was skipped where policy_needs_eagle said it is needed)")
        return [int(x) for x in list(eagle)[:k]]


# ---- batch entry points ----------------------------------------------------------------------------------------
def _batch(states: Sequence[RequestState], tokens: Sequence[np.ndarray], ngram: Sequence[Sequence[int]],
           batch_size: int | None) -> int:
    B = len(states)
    if len(tokens) != B or len(ngram) != B:
        raise HybridError(f"one entry per request: {B} states, {len(tokens)} token arrays, {len(ngram)} n-gram "
                          f"lists")
    return B if batch_size is None else int(batch_size)


def policy_needs_eagle(policy: HybridPolicy, states: Sequence[RequestState], tokens: Sequence[np.ndarray],
                       ngram: Sequence[Sequence[int]], batch_size: int | None = None) -> list[bool]:
    """Per request: whether this step's choice reads EAGLE's proposal (False everywhere: EAGLE's drafting can be
    skipped this step). ``batch_size`` defaults to the number of requests."""
    B = _batch(states, tokens, ngram, batch_size)
    return [policy.needs_eagle(s, t, g, B) for s, t, g in zip(states, tokens, ngram)]


def select(policy: HybridPolicy, states: Sequence[RequestState], tokens: Sequence[np.ndarray],
           ngram: Sequence[Sequence[int]], eagle: Any = None, batch_size: int | None = None) -> list[Choice]:
    """Per request, the proposal to verify and its source (see :func:`mix` for ``eagle``)."""
    B = _batch(states, tokens, ngram, batch_size)
    if eagle is None:
        rows: list = [None] * len(states)
    else:
        rows = eagle.tolist() if hasattr(eagle, "tolist") else list(eagle)
        if len(rows) != len(states):
            raise HybridError(f"EAGLE's proposals have {len(rows)} rows for {len(states)} requests")
    return [policy.select(s, t, g, e, B) for s, t, g, e in zip(states, tokens, ngram, rows)]


def mix(policy: HybridPolicy, states: Sequence[RequestState], tokens: Sequence[np.ndarray],
        ngram: Sequence[Sequence[int]], eagle: Any = None, batch_size: int | None = None) -> list[list[int]]:
    """The draft token ids to verify, one list per request (empty: no speculation), each cut to the chosen k.

    ``ngram``: n-gram's list per request; ``eagle``: EAGLE's [B, k] proposals as an array (anything with
    ``tolist()``: numpy, a CPU tensor) or a list of per-request lists / None, or None when EAGLE did not draft;
    rows of requests whose choice does not read EAGLE are ignored (masked drafting may leave anything there)."""
    return [c.draft for c in select(policy, states, tokens, ngram, eagle, batch_size)]


class _History:
    """One request's token ids so far (prompt + emitted), in a buffer that doubles."""

    __slots__ = ("buf", "n")

    def __init__(self, prompt: Sequence[int]):
        p = np.asarray(prompt if isinstance(prompt, np.ndarray) else list(prompt), np.int64)
        self.buf = np.empty(max(64, 2 * len(p)), np.int64)
        self.buf[:len(p)] = p
        self.n = len(p)

    def extend(self, toks: Sequence[int]) -> None:
        m = self.n + len(toks)
        if m > len(self.buf):
            self.buf = np.concatenate([self.buf[:self.n], np.empty(max(m, 2 * len(self.buf)) - self.n, np.int64)])
        self.buf[self.n:m] = toks
        self.n = m

    def view(self) -> np.ndarray:
        return self.buf[:self.n]


class LiveHybrid:
    """A policy over the requests of one engine process, driven once per step (see the module docstring):
    ``needs = begin(req_ids, new_tokens, prompt_of)``, then ``choices = finish(eagle)``; ``forget`` drops
    finished requests. ``min_n``/``max_n``: n-gram's lookup (3/7: the one the policies' signals use). ``pad``:
    pad every request's draft to the step's width (module docstring, "Padding"; off by default)."""

    def __init__(self, policy: HybridPolicy, min_n: int = 3, max_n: int = 7, pad: bool = False):
        self.policy, self.min_n, self.max_n, self.pad = policy, int(min_n), int(max_n), bool(pad)
        self.states: dict[str, RequestState] = {}
        self.hist: dict[str, _History] = {}
        self._step: tuple | None = None
        self._last: list[Choice] = []
        self._needs: list[bool] = []
        self._sent: dict[str, tuple[list[int], int]] = {}   # pad: each request's last draft (tokens, padding)
        self._pad_by: dict[str, int] = {}                    # pad: this step's padding tokens per filler
        self._pad_acc: dict[str, int] = {}                   # pad: padding tokens accepted this step, per request

    def forget(self, req_ids) -> None:
        for r in req_ids or ():
            self.states.pop(r, None)
            self.hist.pop(r, None)
            self._sent.pop(r, None)

    def begin(self, req_ids: Sequence[str], new_tokens: Sequence[Sequence[int]], prompt_of,
              context_of=None) -> list[bool]:
        """Record each request's tokens emitted this step (``prompt_of(req_id)`` gives the prompt ids the first
        time a request is seen); n-gram's lookups; per request whether its choice reads EAGLE's proposal
        (False for requests that emitted nothing this step: they get no draft).

        ``context_of(i)`` (optional): the engine's own token ids of request ``i`` before this step's tokens. Where
        its length differs from the hybrid's history (steps the hybrid did not see: vLLM skipped drafting, or a
        request resumed), the history is re-read from it; a request whose context shrank starts a new state."""
        from ...proposers.ngram import ngram_lookup

        if len(req_ids) != len(new_tokens):
            raise HybridError(f"one entry per request: {len(req_ids)} ids, {len(new_tokens)} token lists")
        if self._step is not None:
            raise HybridError("begin was called twice without finish: one begin and one finish per step")
        act, toks, ng = [], [], []
        self._pad_acc = {}
        for i, (r, new) in enumerate(zip(req_ids, new_tokens)):
            if not len(new):
                continue
            h = self.hist.get(r)
            ctx = context_of(i) if context_of is not None else None
            if ctx is not None and (h is None or h.n != len(ctx)):
                h = self._resync(r, ctx, len(new), prompt_of)
                self._sent.pop(r, None)          # a step the hybrid did not see: its last draft was not verified
            elif h is None:
                h = self.hist[r] = _History(prompt_of(r))
                self.states[r] = self.policy.new_state(h.n)
            if self.pad and r in self._sent:
                # the verified draft's accepted prefix (at most len(new) - 1: the last token is the target's own)
                d, pad = self._sent.pop(r)
                m = min(_prefix(d, np.asarray(new)), len(new) - 1)
                self._pad_acc[r] = max(0, m - (len(d) - pad))
            h.extend(new)
            t = h.view()
            act.append(i)
            toks.append(t)
            ng.append(ngram_lookup(t, self.policy.kmax, self.min_n, self.max_n))
        st = [self.states[req_ids[i]] for i in act]
        need = policy_needs_eagle(self.policy, st, toks, ng) if act else []
        self._step = (list(req_ids), act, st, toks, ng)
        out = [False] * len(req_ids)
        for i, n in zip(act, need):
            out[i] = n
        self._needs = out
        return out

    def _resync(self, r: str, ctx, n_new: int, prompt_of) -> _History:
        st = self.states.get(r)
        h = self.hist[r] = _History(ctx)
        if st is None or h.n + n_new <= st.n_prev:
            self.states[r] = self.policy.new_state(len(prompt_of(r)) if st is None else st.prompt_len)
        return h

    def finish(self, eagle: Any = None, width: int | None = None, vocab_size: int | None = None) -> list[Choice]:
        """Per request (all ``begin``'s requests, in order) the proposal to verify; ``eagle``: EAGLE's [B, k]
        proposals for all of them (rows of requests not needing EAGLE are ignored) or None if it did not draft.
        With padding on, each draft of a request that emitted tokens this step is cut to ``width`` (default: the
        policy's k_max) and padded to it (:func:`pad_draft`; ``vocab_size``: ids EAGLE's rows may hold);
        without, ``width`` and ``vocab_size`` are not read."""
        if self._step is None:
            raise HybridError("finish without begin: one begin and one finish per step")
        req_ids, act, st, toks, ng = self._step
        B = len(req_ids)
        self._step = None
        rows = None
        if eagle is not None:
            rows = eagle.tolist() if hasattr(eagle, "tolist") else list(eagle)
            if len(rows) != B:
                raise HybridError(f"EAGLE's proposals have {len(rows)} rows for {B} requests")
            rows = [rows[i] for i in act]
        out = [Choice([], "")] * B
        self._pad_by = {}
        w = self.policy.kmax if width is None else int(width)
        for j, (i, c) in enumerate(zip(act, select(self.policy, st, toks, ng, rows) if act else [])):
            if self.pad:
                d = c.draft[:w]
                tail, kind = pad_draft(d, w, toks[j], ng[j], None if rows is None else rows[j], vocab_size)
                c = Choice(d + tail, c.source if d else "", len(tail))
                if tail:
                    self._pad_by[kind] = self._pad_by.get(kind, 0) + len(tail)
                self._sent[req_ids[i]] = (c.draft, c.pad)
            out[i] = c
        self._last = out
        return out

    def summary(self, req_ids: Sequence[str] | None = None) -> dict:
        """The last step's choices: counts per proposer (``""``: no draft), the draft tokens per proposer, whether
        any request needed EAGLE, and with ``req_ids`` the per-request [source, k]. With padding on also
        ``pad_tokens`` (this step's padding), ``pad_by`` (its tokens per filler), ``pad_accepted`` (padding
        tokens accepted by this step's verification, i.e. of the drafts proposed at the requests' previous
        steps) and per request [source, k, padding tokens, padding tokens accepted this step]; ``k`` and the
        per-proposer counts are the policy's own tokens (padding excluded)."""
        n = {"ngram": 0, "eagle": 0, "": 0}
        tok = {"ngram": 0, "eagle": 0}
        for c in self._last:
            n[c.source] += 1
            if c.source:
                tok[c.source] += len(c.draft) - c.pad
        out = {"ngram": n["ngram"], "eagle": n["eagle"], "none": n[""], "ngram_tokens": tok["ngram"],
               "eagle_tokens": tok["eagle"], "eagle_needed": any(self._needs)}
        if self.pad:
            out.update(pad_tokens=sum(c.pad for c in self._last), pad_by=dict(self._pad_by),
                       pad_accepted=sum(self._pad_acc.values()))
        if req_ids is not None:
            if self.pad:
                out["per_req"] = {r: [c.source, len(c.draft) - c.pad, c.pad, self._pad_acc.get(r, 0)]
                                  for r, c in zip(req_ids, self._last)}
            else:
                out["per_req"] = {r: [c.source, len(c.draft)] for r, c in zip(req_ids, self._last)}
        return out
