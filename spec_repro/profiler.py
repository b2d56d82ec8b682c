"""Exact acceptance profiler: per output position, how many tokens ONE speculative step would produce.

For each request the target decodes greedily ONCE (batched, through :func:`spec_repro.engines.torch.generate`).
With the prompt x_1..x_P and output o_0..o_{L-1} (o_0 from the prefill), a step that starts after o_q
(context = prompt + o_0..o_q) verifies drafts against o_{q+1}, o_{q+2}, ... . Under greedy decoding the accepted
count is the length of the prefix of the drafts equal to those tokens, so for every position q:

* n-gram: the vLLM prompt-lookup proposal for the true context with k = k_max (``draft_len`` = its length, 0
  where no n-gram recurs); a smaller k proposes a prefix of it, so ``min(acc_len - 1, k)`` is exact for any k.
* draft model (chain drafting): ONE teacher-forced pass of the drafter over prompt + output gives
  its argmax g_j after every output token o_j. The chain from q drafts g_q; if g_q = o_{q+1} the next draft is
  the drafter's argmax after o_{q+1}, i.e. g_{q+1}, and so on: accepted = the run of consecutive j >= q with
  g_j = o_{j+1}, capped at k_max.
* early exit of the target (first N layers + final norm + LM head): the same chain rule; g_j is read out of
  the greedy decode itself (the hidden state after layer N of o_j's pass), since the self-draft's KV cache
  equals the target's first N layers'. No extra pass.
* EAGLE / EAGLE-3: a head's later drafts depend on its own hidden states, so one teacher-forced pass is not
  enough; :func:`spec_repro.proposers.eagle.eagle_chain_acceptance` runs every chain depth for every start
  position at once (one target pass for the features, then k_max passes of the one-layer head).

Accepted counts never run past the end of the output (the last position has acc_len 1). ``acc_len`` = accepted
+ 1, as in the study's traces. Numbers equal a real engine run's up to float ties between the batched decode,
the teacher-forced pass and the engine's incremental passes (checked by tests/test_profiler.py).

The drafter's confidence (model drafters only, not n-gram): at every position q and draft position
d = 1..k_max, the drafter's top-1 probability -- the softmax of its logits at the token it drafts -- of draft
number d of the chain that starts after o_q, i.e. the draft compared with o_{q+d} (NaN where o_{q+d} lies past
the output). It comes out of the same passes as the acceptance and is teacher-forced alike: a chain drafter's
draft d is its prediction after prompt + o_0..o_{q+d-1} (with p_j its top-1 probability after o_j,
confidence[q, d-1] = p_{q+d-1}); an EAGLE head's is its chained output over the true tokens. For d <= acc_len
(every accepted draft and the first rejected one) that is the context the real chain drafts from, so the value
is the real chain's (checked against the engine's drafters by tests/test_confidence.py); past the first
rejected draft the real chain would condition on its own rejected token instead. Stored 8-bit quantized
(``spec_repro.traces``: steps of 1/254), read with ``Trace.confidence``.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import numpy as np
import torch

from .engines.torch import generate
from .metrics import top1_prob
from .proposers import Proposer
from .proposers.early_exit import EarlyExitProposer
from .proposers.ngram import NgramProposer, ngram_lookup_all
from .traces import Trace, dequantize_confidence, quantize_confidence

__all__ = ["RequestProfile", "ngram_acceptance", "chain_acceptance", "chain_confidence",
           "model_argmax_after_outputs", "model_top1_after_outputs", "proposer_acceptance", "proposer_profile",
           "profile_requests", "profile_decoded", "profiles_to_trace"]


@dataclass
class RequestProfile:
    request_id: str
    dataset: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    acc: dict[str, list[int]] = field(default_factory=dict)
    draft_len: dict[str, list[int]] = field(default_factory=dict)
    prompt_text: str | None = None
    output_text: str | None = None
    decode_s: float = 0.0  # this request's share of the batched greedy decode (wall / batch size)
    # {proposer: [L, k_max] float32 probabilities} of the model drafters (module doc); absent for n-gram
    conf: dict[str, np.ndarray] = field(default_factory=dict)

    def to_json(self) -> dict:
        d = dict(self.__dict__)
        # compact in a partial file: the trace's uint8 codes, base64 (shape [L, k_max] from the output length)
        d["conf"] = {k: base64.b64encode(quantize_confidence(v).tobytes()).decode() for k, v in self.conf.items()}
        return d

    @classmethod
    def from_json(cls, d: Mapping) -> "RequestProfile":
        d = dict(d)
        L = len(d.get("output_token_ids") or [])
        conf = {}
        for k, v in (d.get("conf") or {}).items():
            a = np.frombuffer(base64.b64decode(v), np.uint8)
            if L == 0 or a.size % L:
                raise ValueError(f"confidence of {k!r}: {a.size} values for {L} positions")
            conf[k] = dequantize_confidence(a.reshape(L, -1))
        d["conf"] = conf
        return cls(**d)


def ngram_acceptance(prompt: Sequence[int], output: Sequence[int], k_max: int, min_n: int = 3,
                     max_n: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """(acc_len, draft_len) per output position for vLLM's n-gram proposer (see module doc)."""
    full = np.asarray(list(prompt) + list(output), dtype=np.int64)
    P, L = len(prompt), len(output)
    starts, lens = ngram_lookup_all(full, P, k_max, min_n, max_n)
    acc = np.ones(L, dtype=np.int64)
    for q in range(L):
        s, n = int(starts[q]), int(lens[q])
        a = 0
        nxt = P + q + 1
        while a < n and nxt + a < len(full) and full[s + a] == full[nxt + a]:
            a += 1
        acc[q] = 1 + a
    return acc, lens.astype(np.int64)


def chain_acceptance(argmax_after: Sequence[int], output: Sequence[int], k_max: int) -> np.ndarray:
    """acc_len per output position for greedy chain drafting, from the drafter's argmax after each output
    token (``argmax_after[j]`` = drafter's next token given prompt + o_0..o_j, j = 0..L-2)."""
    L = len(output)
    g = np.asarray(argmax_after, dtype=np.int64)[: max(L - 1, 0)]
    match = g == np.asarray(output[1:], dtype=np.int64)
    run = np.zeros(L + 1, dtype=np.int64)  # run[j] = consecutive matches starting at j
    for j in range(L - 2, -1, -1):
        run[j] = run[j + 1] + 1 if match[j] else 0
    return 1 + np.minimum(run[:L], k_max)


def chain_confidence(top1_prob_after: Sequence[float], L: int, k_max: int) -> np.ndarray:
    """[L, k_max] float32 confidence of greedy chain drafting from the drafter's top-1 probability after each
    output token (``top1_prob_after[j]`` for j = 0..L-2, teacher-forced as :func:`chain_acceptance`):
    ``conf[q, d-1] = top1_prob_after[q+d-1]``, NaN where q + d > L - 1 (no o_{q+d} to compare with)."""
    p = np.full(L + k_max, np.nan, dtype=np.float32)
    n = min(len(top1_prob_after), max(L - 1, 0))
    p[:n] = np.asarray(top1_prob_after, dtype=np.float32)[:n]
    return p[np.arange(L)[:, None] + np.arange(k_max)[None, :]]


@torch.no_grad()
def model_top1_after_outputs(model, prompt: Sequence[int],
                             output: Sequence[int]) -> tuple[list[int], np.ndarray]:
    """One teacher-forced pass of ``model`` over prompt + output[:-1]: (its argmax after each o_j, j < L-1, the
    softmax probability of that argmax)."""
    P, L = len(prompt), len(output)
    if L < 2:
        return [], np.zeros(0, np.float32)
    dev = next(model.parameters()).device
    ids = torch.as_tensor([list(prompt) + list(output[:-1])], dtype=torch.long, device=dev)
    h = model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state[0, P:]  # after o_0 .. o_{L-2}
    logits = model.get_output_embeddings()(h)
    g = logits.argmax(dim=-1)
    return g.tolist(), top1_prob(logits, g).float().cpu().numpy()


def model_argmax_after_outputs(model, prompt: Sequence[int], output: Sequence[int]) -> list[int]:
    """One teacher-forced pass of ``model`` over prompt + output[:-1]: its argmax after each o_j, j < L-1."""
    return model_top1_after_outputs(model, prompt, output)[0]


def proposer_profile(p: Proposer, prompt: Sequence[int], output: Sequence[int], k_max: int,
                     exit_readout: tuple[Sequence[int], Sequence[float] | None] | None = None,
                     confidence: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(acc_len, draft_len, confidence) of one proposer at every output position of one greedy decode (module
    doc): n-gram by lookup (confidence None), EAGLE by its chained pass, early exit from ``exit_readout`` (the
    decode's read-out: argmax after each output token and its probability) when given, any other drafter by one
    teacher-forced pass. ``confidence``: [L, k_max] float32 (module doc), None when not asked for."""
    from .proposers.eagle import EagleProposer, eagle_chain_profile

    if isinstance(p, NgramProposer):
        acc, dl = ngram_acceptance(prompt, output, k_max, p.min_n, p.max_n)
        return acc, dl, None
    conf = None
    if isinstance(p, EagleProposer):
        acc, conf = eagle_chain_profile(p.head, prompt, output, k_max, confidence=confidence)
    else:
        if exit_readout is not None and (exit_readout[1] is not None or not confidence):
            g, pr = exit_readout
        elif confidence:
            g, pr = model_top1_after_outputs(p.model, prompt, output)
        else:
            g, pr = model_argmax_after_outputs(p.model, prompt, output), None
        acc = chain_acceptance(g, output, k_max)
        if confidence:
            conf = chain_confidence(pr, len(output), k_max)
    return acc, np.full(len(output), k_max), conf


def proposer_acceptance(p: Proposer, prompt: Sequence[int], output: Sequence[int], k_max: int,
                        exit_argmax: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(acc_len, draft_len) of one proposer at every output position of one greedy decode (module doc):
    n-gram by lookup, EAGLE by its chained pass, early exit from ``exit_argmax`` (the decode's read-out) when
    given, any other drafter by one teacher-forced pass."""
    ex = None if exit_argmax is None else (exit_argmax, None)
    acc, dl, _ = proposer_profile(p, prompt, output, k_max, ex, confidence=False)
    return acc, dl


def _profile_into(prof: RequestProfile, proposers: Mapping[str, Proposer], k_max: int,
                  exit_readout: Mapping[str, tuple] | None = None) -> None:
    """Every proposer's (acc_len, draft_len) and, for the model drafters, confidence over ``prof``'s prompt and
    output, stored on ``prof``."""
    for name, p in proposers.items():
        ex = (exit_readout or {}).get(name)
        acc, dl, conf = proposer_profile(p, prof.prompt_token_ids, prof.output_token_ids, k_max, ex)
        prof.acc[name] = acc.astype(int).tolist()
        prof.draft_len[name] = dl.astype(int).tolist()
        if conf is not None:
            prof.conf[name] = conf


def _req_fields(r, i: int, dataset: str | None):
    if isinstance(r, (list, tuple)):
        return str(i), dataset or "unknown", list(r), None
    return str(r.id), getattr(r, "dataset", None) or dataset or "unknown", list(r.prompt_token_ids), \
        getattr(r, "prompt_text", None)


def profile_requests(target, requests: Sequence, proposers: Mapping[str, Proposer], *, k_max: int = 16,
                     max_new_tokens: int = 256, batch_size: int = 8, tokenizer=None, eos_token_ids=None,
                     dataset: str | None = None, progress=None) -> Iterable[list[RequestProfile]]:
    """Profile ``requests`` (workload ``Request`` objects or token-id lists) in batches; yields each finished
    batch's list of :class:`RequestProfile` (so callers can save as they go).

    ``proposers``: {trace name: proposer}; n-gram proposers are profiled by lookup, model-based ones
    (``proposer.model``) by one teacher-forced pass."""
    from .proposers.eagle import EagleProposer

    for name, p in proposers.items():
        if not isinstance(p, (NgramProposer, EagleProposer)) and getattr(p, "model", None) is None:
            raise ValueError(f"proposer {name!r} has neither n-gram settings, an EAGLE head nor a drafter model to "
                             "profile")
    if k_max < 1:
        raise ValueError("k_max must be >= 1")
    reqs = [_req_fields(r, i, dataset) for i, r in enumerate(requests)]
    # early exits of the target itself are read out during the greedy decode (no extra pass)
    taps = {name: p.layers for name, p in proposers.items()
            if isinstance(p, EarlyExitProposer) and p.target is target}
    for b in range(0, len(reqs), batch_size):
        batch = reqs[b: b + batch_size]
        res = generate(target, [r[2] for r in batch], max_new_tokens=max_new_tokens,
                       eos_token_ids=eos_token_ids, progress=progress, exit_layers=sorted(set(taps.values())))
        out = []
        for j, ((rid, ds, prompt, ptext), o) in enumerate(zip(batch, res.output_ids)):
            prof = RequestProfile(rid, ds, prompt, list(o), prompt_text=ptext,
                                  decode_s=res.wall_s / len(batch))
            if tokenizer is not None:
                prof.output_text = tokenizer.decode(o)
            _profile_into(prof, proposers, k_max,
                          {name: (res.meta["exit_argmax"][taps[name]][j],
                                  res.meta["exit_top1_prob"][taps[name]][j]) for name in taps})
            out.append(prof)
        yield out


def profile_decoded(requests: Sequence, outputs: Sequence[Sequence[int]], proposers: Mapping[str, Proposer], *,
                    k_max: int = 16, tokenizer=None, dataset: str | None = None,
                    decode_s: Sequence[float] | None = None) -> list[RequestProfile]:
    """Profile outputs decoded elsewhere (vLLM): every proposer teacher-forced over prompt + output, as in
    :func:`profile_requests` (n-gram by lookup, EAGLE by one pass per chain depth, a drafter or early exit by one
    pass each). Acceptance is judged against these outputs, i.e. what the decoding engine's target produced."""
    for name, p in proposers.items():
        if not isinstance(p, NgramProposer) and getattr(p, "model", None) is None and not hasattr(p, "head"):
            raise ValueError(f"proposer {name!r} has neither n-gram settings, an EAGLE head nor a drafter model to "
                             "profile")
    out = []
    for i, (r, o) in enumerate(zip(requests, outputs)):
        rid, ds, prompt, ptext = _req_fields(r, i, dataset)
        prof = RequestProfile(rid, ds, prompt, [int(x) for x in o], prompt_text=ptext,
                              decode_s=float(decode_s[i]) if decode_s is not None else 0.0)
        if tokenizer is not None:
            prof.output_text = tokenizer.decode(prof.output_token_ids)
        _profile_into(prof, proposers, k_max)
        out.append(prof)
    return out


def profiles_to_trace(profiles: Sequence[RequestProfile], *, model: str, k_max: int,
                      meta: dict | None = None) -> Trace:
    """A :class:`spec_repro.traces.Trace` (one dataset per call's requests; several datasets are concatenated)."""
    by_ds: dict[str, list[RequestProfile]] = {}
    for p in profiles:
        by_ds.setdefault(p.dataset, []).append(p)
    traces = []
    for ds, ps in by_ds.items():
        traces.append(Trace.from_arrays(
            {p.request_id: p.acc for p in ps},
            prompt_lens={p.request_id: len(p.prompt_token_ids) for p in ps},
            dataset=ds, model=model, k_max=k_max,
            draft_lens={p.request_id: p.draft_len for p in ps},
            confidences={p.request_id: p.conf for p in ps if p.conf},
            request_info={p.request_id: {"prompt_token_ids": p.prompt_token_ids,
                                         "output_token_ids": p.output_token_ids,
                                         "prompt_text": p.prompt_text, "output_text": p.output_text}
                          for p in ps},
            meta=dict(meta or {})))
    if len(traces) == 1:
        return traces[0]
    t = Trace.concat(traces)
    t.meta.update(meta or {})
    return t
