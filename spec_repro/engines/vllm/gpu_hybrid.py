"""The live hybrid on the device: PR #24344's rule with no host round trip (policies :data:`GPU_POLICIES`).

Why. The host-side hybrid (:mod:`.hybrid`, ``LiveHybrid``) reads the sampled tokens and EAGLE's drafts back to
the host every step; under async scheduling that makes the CPU wait for the GPU twice a step, and the idle
hybrid measured 23-26% below EAGLE alone on the H200 (``data/gpu/reproduce``). Here nothing leaves the device:
each request's token ids live in a device buffer (:class:`DeviceHistory`), the n-gram lookup runs there
(:func:`ngram_propose`, vLLM's prompt-lookup semantics, the package's :func:`~spec_repro.proposers.ngram.
ngram_lookup` on every row at once) and the choice is a ``torch.where`` (:func:`mix`), so the step hands vLLM a
``[B, k]`` tensor as EAGLE's own path does and async scheduling keeps overlapping the host with the GPU.

Policies (both proposers run every step: the rule cannot skip EAGLE's drafting without a host decision):

``gpu-pr24344``     per request, n-gram's tokens where it matched (its continuation, up to where the context
                    ends), EAGLE's tokens at the positions n-gram has none; EAGLE's row where it did not match.
                    Every request gets k tokens (a uniform ``1 + k`` decode batch: vLLM's full CUDA graph).
``gpu-eagle-only``  the same machinery, every request on EAGLE (the mask is all false): what the device-side
                    hybrid costs, loaded but idle.

Lossless by construction: only the draft tokens change; greedy verification keeps the target's output.

Pure torch (no vLLM import), device-agnostic: the CPU tests run every function here on CPU tensors and check
them against the host-side hybrid and :func:`ngram_lookup`. The vLLM side (``plugin._gpu_hybrid_step``) hands
it the sampler's ``[B, k+1]`` output, the runner's discard mask and EAGLE's ``[B, k]`` drafts.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["GPU_POLICIES", "DeviceHistory", "mix", "ngram_propose", "step_summary"]

GPU_POLICIES = ("gpu-pr24344", "gpu-eagle-only")


def ngram_propose(tok, lens, k: int, min_n: int = 3, max_n: int = 7):
    """vLLM's prompt lookup on every row at once: ``tok`` [B, L] token ids, ``lens`` [B] context lengths
    (``tok[b, :lens[b]]`` is row b's context). Returns ``(draft [B, k], n_valid [B])``: the up-to-k tokens
    after the EARLIEST occurrence of the LONGEST n-gram (``min_n <= n <= max_n``, n < context length) that ends
    the context and recurs ending before its last token, cut where the context ends; ``n_valid`` 0 without a
    match (``draft`` there is arbitrary). The same proposal as :func:`spec_repro.proposers.ngram.ngram_lookup`.

    How: for every candidate continuation start e (1 <= e <= len - 1), the length of the common suffix of
    ``tok[:e]`` and the context, capped at ``max_n`` (a cumulative product over the last ``max_n`` positions);
    the best e is the largest such length, then the smallest e. About 20 kernels, no host sync."""
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
    m = (prev == suf[:, None, :]).to(torch.int32).cumprod(-1).sum(-1)      # [B, L]
    m = torch.minimum(m, (lens - 1).clamp_min(0)[:, None].to(torch.int32))  # n < context length
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


def summary_row(counts: Sequence[int], n_reqs: int, k: int) -> dict:
    """The step log's ``hybrid`` entry (``LiveHybrid.summary``'s keys) from :func:`step_summary`'s counts: every
    request has ``k`` tokens, n-gram's where it matched and EAGLE's at every other position."""
    ng, ngt = int(counts[0]), int(counts[1])
    return {"ngram": ng, "eagle": int(n_reqs) - ng, "none": 0, "ngram_tokens": ngt,
            "eagle_tokens": int(n_reqs) * int(k) - ngt, "eagle_needed": n_reqs > 0, "pad_tokens": 0,
            "gpu": True}


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
