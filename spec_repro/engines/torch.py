"""Reference speculative-decoding engine in plain PyTorch (CPU or CUDA, same code).

Greedy chain speculative decoding over a batch of B requests with ragged acceptance, on any Hugging Face
causal LM (``model.get_decoder()`` + ``model.get_output_embeddings()``: Llama, Qwen2, SmolLM2 ...).
Plain greedy decoding (no proposer) goes through the same loop, so baselines and SD runs share every cost.

Design (after gpt-fast's ``generate.py``, batched):

* :class:`KVState` keeps one model's KV cache (``transformers.DynamicCache``) for B rows. Every row has its
  own positions; a cache *slot* is valid or not per row. New tokens are appended as a right-padded chunk; a
  4-D additive mask lets each query see only the valid slots of its own row at or before its own slot, and
  RoPE positions come from the row's count of valid tokens. Rejected draft tokens and padding become invalid
  slots ("holes"); trailing invalid columns are cropped and the cache is compacted when holes pile up.
  With B = 1 there are never holes: rejection is a plain crop.
* A step: the proposer drafts up to k tokens per row (ragged; n-gram may propose none), the target verifies
  ``[last token] + drafts`` in one forward, a row accepts the longest prefix of drafts equal to the target's
  argmax and gains one bonus token. Output is token-identical to greedy decoding (up to float ties).
* Each step is timed in four phases (``STEP_COLUMNS`` of :mod:`spec_repro.traces`): drafting, verification
  (the target forward only), acceptance (argmax + comparison) and the rest (input preparation, cache
  bookkeeping), with ``torch.cuda.synchronize`` around phases on GPU.

``batched_tokens`` and ``kv_tokens`` count what the forward really computed: the padded chunk (B x longest
row chunk) and the cache slots (B x cache length, holes included).
"""
from __future__ import annotations

import inspect
import time
import uuid
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import pandas as pd
import torch

__all__ = ["KVState", "GenerationResult", "generate", "eos_ids_of", "measure_verify_cost", "weight_bytes"]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def eos_ids_of(model, tokenizer=None) -> set[int]:
    """End-of-sequence ids from the model's generation config (and the tokenizer)."""
    ids: set[int] = set()
    gc = getattr(model, "generation_config", None)
    for src in (getattr(gc, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if src is None:
            continue
        ids.update([int(x) for x in src] if isinstance(src, (list, tuple)) else [int(src)])
    return ids


class KVState:
    """KV cache of one model for a batch of rows with per-row valid slots (see module doc)."""

    def __init__(self, model):
        from transformers import DynamicCache

        self.model = model
        self.decoder = model.get_decoder()
        self.head = model.get_output_embeddings()
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self._cache_kw = "cache" if "cache" in inspect.signature(self.decoder.forward).parameters else "past_key_values"
        self._new_cache = DynamicCache
        self.cache = DynamicCache()
        self._valid = None  # (B, S) bool, or None while every slot of every row is valid
        self._slots = 0
        self.tokens: list[list[int]] = []  # tokens held per row, in order (= valid slots)

    @property
    def valid(self) -> torch.Tensor:
        """(B, S) bool: which cache slots hold a row's token."""
        if self._valid is None:
            return torch.ones(self.rows, self._slots, dtype=torch.bool, device=self.device)
        return self._valid

    @valid.setter
    def valid(self, v: torch.Tensor) -> None:
        self._valid, self._slots = v, int(v.shape[1])

    @property
    def all_valid(self) -> bool:
        if self._valid is not None and bool(self._valid.all()):
            self._valid = None
        return self._valid is None

    # ---- shape --------------------------------------------------------------------------------------
    @property
    def rows(self) -> int:
        return len(self.tokens)

    def reset(self, rows: int) -> None:
        self.cache = self._new_cache()
        self._valid, self._slots = None, 0
        self.tokens = [[] for _ in range(rows)]

    # ---- forward ------------------------------------------------------------------------------------
    def prepare(self, chunks: Sequence[Sequence[int]]) -> dict:
        """Tensors for appending ``chunks[r]`` (may be empty) to each row: ids, positions, mask."""
        if len(chunks) != self.rows:
            raise ValueError(f"{len(chunks)} chunks for {self.rows} rows")
        lens = [len(c) for c in chunks]
        m = max(lens)
        if m == 0:
            raise ValueError("nothing to feed")
        B, S = self.rows, self._slots
        if B == 1:
            n0 = len(self.tokens[0])
            ids = torch.as_tensor([list(chunks[0])], dtype=torch.long)
            pos = torch.arange(n0, n0 + m)[None, :]
        else:
            ids = torch.zeros(B, m, dtype=torch.long)
            pos = torch.zeros(B, m, dtype=torch.long)
            for r, c in enumerate(chunks):
                n0 = len(self.tokens[r])
                if c:
                    ids[r, : len(c)] = torch.as_tensor(c, dtype=torch.long)
                pos[r] = torch.arange(n0, n0 + m)
        if min(lens) == m and self.all_valid:
            # no padding and no holes (always so at B = 1): the model's own causal mask
            mask, valid = None, None
        else:
            lens_t = torch.as_tensor(lens, device=self.device)
            new_valid = torch.arange(m, device=self.device)[None, :] < lens_t[:, None]  # (B, m)
            valid = torch.cat([self.valid, new_valid], dim=1)  # (B, S+m)
            causal = (torch.arange(S + m, device=self.device)[None, :]
                      <= (S + torch.arange(m, device=self.device))[:, None])
            allowed = valid[:, None, :] & causal[None, :, :]  # (B, m, S+m)
            # a padding query of a row whose chunk is empty may see nothing: let it see its own slot (unused)
            allowed[:, torch.arange(m), S + torch.arange(m)] = True
            mask = torch.zeros(B, 1, m, S + m, dtype=self.dtype, device=self.device)
            mask.masked_fill_(~allowed[:, None], torch.finfo(self.dtype).min)
        return {"ids": ids.to(self.device), "pos": pos.to(self.device), "mask": mask, "valid": valid,
                "lens": lens, "chunks": [list(c) for c in chunks]}

    @torch.no_grad()
    def forward(self, prep: dict, logits: str = "all", hidden_layers: Sequence[int] = ()) -> torch.Tensor:
        """Run the model on a prepared chunk; returns logits (B, m, V) (``"all"``) or (B, V) at each row's
        last fed token (``"last"``), half precision upcast to float32. Updates the cache, slot validity and
        token lists. ``hidden_layers``: keep the hidden states after these decoder layers in
        ``self.last_hidden[layer]`` (B, m, H), for early-exit read-outs."""
        kw = {"output_hidden_states": True} if hidden_layers else {}
        try:
            out = self.decoder(input_ids=prep["ids"], attention_mask=prep["mask"], position_ids=prep["pos"],
                               use_cache=True, **{self._cache_kw: self.cache}, **kw)
        except (torch.OutOfMemoryError, RuntimeError) as e:
            if isinstance(e, torch.OutOfMemoryError) or "can't allocate memory" in str(e):
                B, m = prep["ids"].shape
                raise MemoryError(f"out of memory on {self.device} running a batch of {B} rows x {m} new tokens "
                                  f"over a {self._slots}-slot KV cache: use a smaller batch size or shorter "
                                  f"prompts") from e
            raise
        self.last_hidden = {int(n): out.hidden_states[int(n)] for n in hidden_layers}
        self.last_final = out.last_hidden_state  # (B, m, H) after the final norm: EAGLE-1's feature
        if prep["valid"] is None:
            self._slots += prep["ids"].shape[1]
        else:
            self.valid = prep["valid"]
        h = out.last_hidden_state
        if logits == "last":
            idx = torch.as_tensor([max(n - 1, 0) for n in prep["lens"]], device=h.device)
            h = h[torch.arange(h.shape[0], device=h.device), idx]
        self.last_h = h
        res = self.head(h)
        if res.dtype in (torch.float16, torch.bfloat16):
            res = res.float()
        for r, c in enumerate(prep["chunks"]):
            self.tokens[r].extend(c)
        return res

    def extend(self, chunks: Sequence[Sequence[int]], logits: str = "all") -> torch.Tensor:
        return self.forward(self.prepare(chunks), logits)

    # ---- bookkeeping --------------------------------------------------------------------------------
    def truncate(self, keep: Sequence[int]) -> None:
        """Keep only the first ``keep[r]`` valid tokens of each row (the rest become holes)."""
        if all(n == len(t) for n, t in zip(keep, self.tokens)):
            return
        keep_t = torch.as_tensor(list(keep), device=self.device)
        cum = self.valid.long().cumsum(dim=1)
        self.valid = self.valid & (cum <= keep_t[:, None])
        for r, n in enumerate(keep):
            del self.tokens[r][n:]
        self._tidy()

    def select(self, rows: Sequence[int]) -> None:
        """Keep only the given rows (finished requests leave the batch)."""
        idx = torch.as_tensor(list(rows), dtype=torch.long, device=self.device)
        if self.cache.get_seq_length() > 0:
            self.cache.batch_select_indices(idx)
        if self._valid is not None:
            self.valid = self._valid[idx]
        self.tokens = [self.tokens[i] for i in rows]
        self._tidy()

    def _tidy(self) -> None:
        if self._valid is None or self._slots == 0 or self.rows == 0:
            return
        S = self._slots
        any_valid = self.valid.any(dim=0)
        last = int(torch.nonzero(any_valid).max()) + 1 if bool(any_valid.any()) else 0
        if last < S:
            self.cache.crop(-(S - last))
            self.valid = self.valid[:, :last]
            S = last
        n_max = max(len(t) for t in self.tokens)
        if S > n_max + max(16, n_max // 4):
            self._compact(n_max)

    def _compact(self, n_max: int) -> None:
        """Move each row's valid slots to the front (right padding), dropping the holes."""
        B, S = self.valid.shape
        order = torch.argsort((~self.valid).to(torch.int8), dim=1, stable=True)[:, :n_max]  # valid slots first
        new_valid = torch.arange(n_max, device=self.device)[None, :] < self.valid.sum(dim=1, keepdim=True)
        for layer in self.cache.layers:
            if not getattr(layer, "is_initialized", True) or layer.keys is None or layer.keys.numel() == 0:
                continue
            H, D = layer.keys.shape[1], layer.keys.shape[3]
            gi = order[:, None, :, None].expand(B, H, n_max, D)
            layer.keys = torch.gather(layer.keys, 2, gi)
            layer.values = torch.gather(layer.values, 2, order[:, None, :, None].expand(B, H, n_max,
                                                                                        layer.values.shape[3]))
        self.valid = new_valid


@dataclass
class GenerationResult:
    """What :func:`generate` returns.

    ``output_ids[i]``: the tokens generated for request i (the prefill's token first, EOS included when hit).
    ``steps``: one row per engine step (``STEP_COLUMNS`` + ``phase`` + ``accepted_per_req``), prefill first.
    ``events``: one row per (request, speculative step): ``request`` (index), ``step``, ``position`` (p: the
    output position of the last token before the step, so the step proposes tokens p+1, p+2 ...),
    ``draft_len``, ``accepted`` (drafts equal to the target's argmax, before cutting at EOS/max tokens) and
    ``produced`` (tokens the step added to the output)."""

    output_ids: list[list[int]]
    steps: pd.DataFrame
    events: pd.DataFrame
    wall_s: float
    meta: dict = field(default_factory=dict)

    @property
    def new_tokens(self) -> int:
        return sum(len(o) for o in self.output_ids)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else float("nan")


@torch.no_grad()
def generate(model, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, proposer=None, k: int = 3,
             eos_token_ids: Iterable[int] | None = None, model_name: str = "model", run_id: str | None = None,
             progress=None, exit_layers: Sequence[int] = ()) -> GenerationResult:
    """Greedy (``proposer=None``) or greedy chain speculative decoding of a batch of prompts.

    ``proposer``: an object of :mod:`spec_repro.proposers` (``start``/``propose``/``select``), ``k`` its draft
    length per step. ``eos_token_ids`` default: the model's. Returns a :class:`GenerationResult`.

    ``exit_layers`` (plain greedy only): also read out, for every fed output token, the argmax of the target's
    final norm + LM head applied to the hidden state after each of these layers -- exactly what an early-exit
    self-draft of that depth would draft next (its KV cache equals the target's first layers'), at the cost
    of one LM-head product per token. Stored in ``result.meta["exit_argmax"][layer][request]``, and the softmax
    probability of each of those tokens (the self-draft's top-1 probability, float32) in
    ``result.meta["exit_top1_prob"][layer][request]``."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    if proposer is not None and k < 1:
        raise ValueError("k must be >= 1 with a proposer")
    if exit_layers and proposer is not None:
        raise ValueError("exit_layers read-outs need plain greedy decoding (proposer=None)")
    exit_layers = [int(n) for n in exit_layers]
    exit_argmax = {n: [[] for _ in prompts] for n in exit_layers}
    exit_prob = {n: [[] for _ in prompts] for n in exit_layers}
    if exit_layers:
        final_norm = model.get_decoder().norm
    eos = set(eos_ids_of(model) if eos_token_ids is None else eos_token_ids)
    # an EAGLE-class proposer drafts from the target's features of every verified position
    feat = getattr(proposer, "features", None)
    feat_layers = list(feat) if isinstance(feat, tuple) else []
    state = KVState(model)

    def features_of(counts):
        f = state.last_final if feat == "final" else torch.cat([state.last_hidden[i] for i in feat_layers], -1)
        return [f[r, :n] for r, n in enumerate(counts)]

    dev = state.device
    B = len(prompts)
    method = "none" if proposer is None else proposer.method
    k_eff = 0 if proposer is None else int(k)
    run_id = run_id or f"torch-{method}-k{k_eff}-b{B}-{uuid.uuid4().hex[:8]}"
    steps, events = [], []

    def step_row(step, phase, n_reqs, batched, kv, td, tv, tr, to, nd, na, acc_list):
        steps.append({"run_id": run_id, "engine": "torch", "model": model_name, "method": method, "k": k_eff,
                      "batch_size": B, "step": step, "num_reqs": n_reqs, "batched_tokens": batched,
                      "kv_tokens": kv, "t_draft": td, "t_verify": tv, "t_reject": tr, "t_other": to,
                      "t_total": td + tv + tr + to, "num_draft_tokens": nd, "num_accepted_tokens": na,
                      "phase": phase, "accepted_per_req": acc_list})

    # ---- prefill ----------------------------------------------------------------------------------------
    _sync(dev)
    t_start = t0 = time.perf_counter()
    state.reset(B)
    prep = state.prepare(prompts)
    _sync(dev)
    t1 = time.perf_counter()
    logits = state.forward(prep, logits="last", hidden_layers=feat_layers)
    _sync(dev)
    t2 = time.perf_counter()
    first = logits.argmax(dim=-1).tolist()
    t3 = time.perf_counter()
    outputs = [[int(t)] for t in first]
    if proposer is not None:
        proposer.start([list(p) + o for p, o in zip(prompts, outputs)])
        if feat:
            proposer.add_features(features_of(prep["lens"]))
    _sync(dev)
    t4 = time.perf_counter()
    step_row(0, "prefill", B, int(prep["ids"].numel()), 0, t4 - t3, t2 - t1, t3 - t2, t1 - t0, 0, 0, None)

    active = [i for i in range(B) if not (outputs[i][-1] in eos or len(outputs[i]) >= max_new_tokens)]
    if len(active) < B:
        state.select(active)
        if proposer is not None:
            proposer.select(active)
    step = 0
    while active:
        step += 1
        t0 = time.perf_counter()
        kv_before = state.rows * state._slots
        if proposer is not None:
            ctx = [list(prompts[i]) + outputs[i] for i in active]
            drafts = [list(d)[:k_eff] for d in proposer.propose(ctx, k_eff)]
        else:
            drafts = [[] for _ in active]
        _sync(dev)
        t1 = time.perf_counter()
        chunks = [[outputs[i][-1]] + d for i, d in zip(active, drafts)]
        prep = state.prepare(chunks)
        _sync(dev)
        t2 = time.perf_counter()
        logits = state.forward(prep, logits="all", hidden_layers=exit_layers or feat_layers)
        _sync(dev)
        t3 = time.perf_counter()
        greedy = logits.argmax(dim=-1).tolist()  # (rows, m)
        for n in exit_layers:
            from ..metrics import top1_prob

            lg = state.head(final_norm(state.last_hidden[n][:, 0]))
            ex_t = lg.argmax(dim=-1)
            ex, pr = ex_t.tolist(), top1_prob(lg, ex_t).tolist()
            for r, i in enumerate(active):
                exit_argmax[n][i].append(int(ex[r]))
                exit_prob[n][i].append(float(pr[r]))
        keep, still, acc_list = [], [], []
        n_draft = n_acc = 0
        for r, (i, d) in enumerate(zip(active, drafts)):
            g = greedy[r]
            a = 0
            while a < len(d) and d[a] == g[a]:
                a += 1
            new = d[:a] + [g[a]]
            pos = len(outputs[i]) - 1
            room = max_new_tokens - len(outputs[i])
            new = new[:room]
            for j, t in enumerate(new):
                if t in eos:
                    new = new[: j + 1]
                    break
            outputs[i].extend(new)
            n_draft += len(d)
            n_acc += a
            acc_list.append(a)
            events.append({"request": i, "step": step, "position": pos, "draft_len": len(d), "accepted": a,
                           "produced": len(new)})
            keep.append(len(state.tokens[r]) - len(d) + a)  # last token + accepted drafts stay cached
            if not (new[-1] in eos or len(outputs[i]) >= max_new_tokens):
                still.append(r)
        if feat:  # the last token and the accepted drafts are verified positions now
            proposer.add_features(features_of([a + 1 for a in acc_list]))
        t4 = time.perf_counter()
        state.truncate(keep)
        if len(still) < len(active):
            state.select(still)
            if proposer is not None:
                proposer.select(still)
        n_rows = len(active)
        active = [active[r] for r in still]
        _sync(dev)
        t5 = time.perf_counter()
        step_row(step, "decode", n_rows, int(prep["ids"].numel()), kv_before, t1 - t0, t3 - t2, t4 - t3,
                 (t2 - t1) + (t5 - t4), n_draft, n_acc, acc_list)
        if progress is not None:
            progress.update(sum(e["produced"] for e in events[-n_rows:]))
    wall = time.perf_counter() - t_start
    steps_df = pd.DataFrame(steps)
    ev = pd.DataFrame(events, columns=["request", "step", "position", "draft_len", "accepted", "produced"])
    meta = {"run_id": run_id, "method": method, "k": k_eff}
    if exit_layers:
        meta["exit_argmax"] = exit_argmax
        meta["exit_top1_prob"] = exit_prob
    return GenerationResult(outputs, steps_df, ev, wall, meta)


@torch.no_grad()
def measure_verify_cost(model, *, kv_len: int = 512, ks: Sequence[int] = tuple(range(0, 17)), repeats: int = 15,
                        warmup: int = 2, seed: int = 0, progress: bool = True) -> pd.DataFrame:
    """Forward time of the target on k + 1 new tokens after a ``kv_len``-token KV cache, for each k in ``ks``
    (k = 0 is a plain decode step). Repeats run round-robin over k, so background load hits every k alike.
    Returns one row per (k, repeat): ``k``, ``n_tokens`` (= k + 1), ``kv_len``, ``repeat``, ``seconds``."""
    from ..progress import tqdm

    g = torch.Generator().manual_seed(seed)
    vocab = int(model.config.vocab_size)
    state = KVState(model)
    state.reset(1)
    state.extend([torch.randint(0, vocab, (kv_len,), generator=g).tolist()], logits="last")
    dev = state.device
    rows = []
    total = (warmup + repeats) * len(ks)
    with tqdm(total=total, desc="verify cost", disable=not progress) as bar:
        for rep in range(-warmup, repeats):
            for k in ks:
                chunk = torch.randint(0, vocab, (k + 1,), generator=g).tolist()
                prep = state.prepare([chunk])
                _sync(dev)
                t0 = time.perf_counter()
                state.forward(prep, logits="all")
                _sync(dev)
                dt = time.perf_counter() - t0
                state.truncate([kv_len])
                if rep >= 0:
                    rows.append({"k": k, "n_tokens": k + 1, "kv_len": kv_len, "repeat": rep, "seconds": dt})
                bar.update(1)
    return pd.DataFrame(rows)


def weight_bytes(model) -> int:
    """Bytes of the model's parameters (what one decode step must read from memory at least once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())
