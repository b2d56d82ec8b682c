"""Train an EAGLE head by self-distillation on its target's own greedy outputs (``spec-repro train eagle``).

1. Prompts: each training workload is split ONCE into an evaluation part (the first ``eval_n`` requests of its
   seeded order: exactly the requests ``spec-repro collect -n eval_n --seed`` profiles) and a training part
   (the requests after them); a slice of the training part is held out to track acceptance while training.
   Nothing of the evaluation part is ever decoded, featurised or trained on here.
2. Data: the target decodes every training prompt greedily (the torch engine, batched); one teacher-forced pass
   gives its feature at every position (EAGLE-1: last hidden state after the final norm).
3. Loss, per chain depth d = 1..``ttt_depth`` (the attention pattern of :meth:`EagleHead.chain`, so depth d
   sees its own earlier drafts exactly as at inference): cross-entropy against the target's next-token
   distribution, kept as its ``topk`` most likely tokens (renormalised; computed once per position in the
   feature pass), over a loss vocabulary (the target's ``loss_vocab`` most frequent top tokens plus every
   position's top token in the batch, the distribution restricted to those rows; 0: all), fused with its gradient
   in chunks (:class:`_SparseCE`; each depth's positions picked by host-built indices), weighted
   ``depth_decay``^(d-1) (default 0.8), plus
   EAGLE-1's smooth-L1 feature regression at depth 1 (weight ``reg``). The target's embeddings and LM head stay
   frozen. Held-out acceptance always drafts over the whole vocabulary.
4. Checkpoints every ``ckpt_every`` steps under ``<out>/.ckpt/`` (head, optimiser, step, data order, loss
   curve; loaded with ``weights_only=True``): a rerun with the same settings resumes. ``<out>`` must be a new
   folder, an empty one or an earlier head's (marked ``.spec_repro_owned``): no other folder is ever touched. The head is written in vLLM's layout
   (:func:`spec_repro.proposers.eagle.save_head`) with ``<out>/TRAINING.json``: data, steps, loss curve,
   held-out walked tokens per step at k = 1..8 and per-position rates, throughput, wall time, hardware.

Seeded and deterministic on CPU (and on CUDA up to the GPU's own nondeterministic kernels).
"""
from __future__ import annotations

import itertools
import json
import math
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .guard import claim_dir, head_dir
from .io import atomic_path, atomic_write
from .proposers.eagle import EagleHead, eagle_chain_acceptance, feature_layers, load_head, new_head, save_head, \
    target_features

__all__ = ["EVAL_SETS", "eval_requests", "eval_filter", "split_by_source", "decodes_training", "distill",
           "batched_features", "train_eagle", "held_out_acceptance", "train_from_workloads"]


#: what ``spec-repro collect`` profiles (workload -> requests, seed 0): the evaluation requests whose sources
#: training never sees
EVAL_SETS = {"sharegpt": 400, "code-edit": 300, "gsm-symbolic": 300, "humaneval": 164, "mt-bench": 80}


def eval_requests(*, tokenizer, eval_sets=None, seed: int = 0, max_prompt_tokens: int | None = 1024) -> list:
    """The evaluation requests: the first ``n`` of each workload's seeded order (exactly what ``collect -n n``
    profiles)."""
    from . import workloads as wl

    out = []
    for w, n in (EVAL_SETS if eval_sets is None else eval_sets).items():
        out += wl.load_upto(w, n, seed=seed, tokenizer=tokenizer, max_prompt_tokens=max_prompt_tokens)
    return out


def split_by_source(workloads: Sequence[str], *, train_n: int, tokenizer, seed: int = 0,
                    max_prompt_tokens: int | None = 1024, eval_sets=None,
                    train_n_for: dict | None = None) -> tuple[dict, dict]:
    """Training requests of ``workloads`` (at most ``train_n`` each, or ``train_n_for[workload]``, in seeded
    order) sharing no source with any
    evaluation request (:data:`EVAL_SETS`): no HumanEval task, ShareGPT conversation (or a copy of it under
    another id), gsm-symbolic template (:func:`spec_repro.workloads.source_key`) and no prompt whose messages say
    the same after :func:`spec_repro.workloads.sharegpt.norm`. Returns ({workload: requests}, facts); each
    workload's facts record its builder's version (:func:`spec_repro.workloads.version`)."""
    from random import Random

    from . import workloads as wl

    evaluated, n_banned = eval_filter(tokenizer=tokenizer, eval_sets=eval_sets, seed=seed,
                                      max_prompt_tokens=max_prompt_tokens)
    out, facts = {}, {}
    for w in workloads:
        cap = (train_n_for or {}).get(w, train_n)
        reqs = wl.load(w, n=None, seed=seed, tokenizer=tokenizer, max_prompt_tokens=max_prompt_tokens)
        Random(seed + 1).shuffle(reqs)
        keep, seen, dropped = [], set(), 0
        for r in reqs:
            if evaluated(r):
                dropped += 1
                continue
            if r.prompt_text in seen:      # identical prompts (ShareGPT repeats some): once
                continue
            seen.add(r.prompt_text)
            keep.append(r)
            if len(keep) >= cap:
                break
        if not keep:
            raise ValueError(f"workload {w!r} has no request whose source is outside the evaluation sets")
        out[w] = keep
        facts[w] = {"train_requests": len(keep), "dropped_sharing_an_eval_source": dropped,
                    "sources": len({wl.source_key(r) for r in keep}), "cap": cap,
                    "workload_version": wl.version(w)}
    facts["eval_sets"] = dict(EVAL_SETS if eval_sets is None else eval_sets)
    facts["eval_sources_excluded"] = n_banned
    return out, facts


def eval_filter(*, tokenizer, eval_sets=None, seed: int = 0, max_prompt_tokens: int | None = 1024):
    """(``evaluated(request)``, number of evaluation sources): ``evaluated`` is True for a request that training
    must not see: it shares a source (:func:`spec_repro.workloads.source_key`), its prompt text or its normalized
    messages (:func:`_said`) with an evaluation request (:func:`eval_requests`), or its prompt ids are one's."""
    from . import workloads as wl

    held = eval_requests(tokenizer=tokenizer, eval_sets=eval_sets, seed=seed, max_prompt_tokens=max_prompt_tokens)
    banned = {wl.source_key(r) for r in held}
    texts = {r.prompt_text for r in held}
    said = {_said(r) for r in held}
    ids = {_prompt_key(r.prompt_token_ids) for r in held}

    def evaluated(r) -> bool:
        return (wl.source_key(r) in banned or r.prompt_text in texts or _said(r) in said
                or _prompt_key(r.prompt_token_ids) in ids)

    return evaluated, len(banned)


def _said(req) -> tuple:
    """A request's messages as compared across sources: each one's text normalized (``sharegpt.norm``)."""
    from .workloads.sharegpt import norm

    return tuple(norm(m.get("content") or "") for m in req.messages)


@torch.no_grad()
def distill(target, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, batch_size: int, eos_token_ids=None,
            desc: str = "greedy") -> list[list[int]]:
    """The target's greedy outputs for ``prompts`` (batched torch engine, shortest prompts batched together)."""
    from .progress import tqdm

    from .engines.torch import generate

    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    outs: list = [None] * len(prompts)
    with tqdm(total=len(prompts), desc=desc, unit="req") as bar:
        for b in range(0, len(order), batch_size):
            idx = order[b: b + batch_size]
            r = generate(target, [prompts[i] for i in idx], max_new_tokens=max_new_tokens, eos_token_ids=eos_token_ids)
            for i, o in zip(idx, r.output_ids):
                outs[i] = o
            bar.update(len(idx))
    return outs


@torch.no_grad()
def batched_features(target, seqs, layers, *, tokens_per_batch: int = 32768, progress: bool = True) -> list:
    """Teacher-forced target features of every position of every sequence, in length-sorted right-padded batches
    (causal attention: right padding changes nothing before it), kept on the target's device in its dtype."""
    from .progress import tqdm

    dev = next(target.parameters()).device
    out: list = [None] * len(seqs)
    with tqdm(total=sum(map(len, seqs)), desc="feature pass", unit="tok", unit_scale=True,
              disable=not progress) as bar:
        for idx in _buckets([len(x) for x in seqs], tokens_per_batch):
            ids = _pad_ids(seqs, idx, dev)
            f = target_features(target, ids, layers)
            for r, i in enumerate(idx):
                out[i] = f[r, : len(seqs[i])].clone()
            bar.update(sum(len(seqs[i]) for i in idx))
    return out


def target_topk(target, feats, k: int, *, chunk: int = 8192) -> list:
    """The target's next-token distribution at every position, kept sparse: its ``k`` most likely tokens (int32
    ids) and their probabilities renormalised over those ``k`` (float16), one pair per sequence. Computed once
    from the feature pass's features (the LM head runs once per position, not once per depth and step)."""
    W = target.get_output_embeddings()
    out = []
    for f in feats:
        ids, ps = [], []
        for s in range(0, f.shape[0], chunk):
            z = W(f[s: s + chunk].to(W.weight.dtype)).float()
            p, i = torch.softmax(z, -1).topk(min(k, z.shape[-1]), dim=-1)
            ids.append(i.to(torch.int32))
            ps.append((p / p.sum(-1, keepdim=True)).to(torch.float16))
        out.append((torch.cat(ids), torch.cat(ps)))
    return out


def loss_vocabulary(tops, size: int, vocab: int) -> tuple[torch.Tensor | None, float]:
    """The ``size`` tokens the target ranks first most often over the training positions (None: the whole
    vocabulary, when ``size`` is 0 or covers it), and the share of positions whose top token is among them."""
    if not size or size >= vocab:
        return None, 1.0
    dev = tops[0][0].device
    counts = torch.zeros(vocab, dtype=torch.long, device=dev)
    for ids, _ in tops:
        counts += torch.bincount(ids[:, 0].long(), minlength=vocab)
    keep = counts.topk(size).indices.sort().values
    return keep, float(counts[keep].sum() / counts.sum().clamp(min=1))


class _SparseCE(torch.autograd.Function):
    """Summed cross-entropy of softmax(h W^T) against sparse target distributions, and its gradient, in one
    chunked pass (the (tokens x vocabulary) logits are never kept, so nothing is recomputed in the backward).

    h (n, H); W (V', H) the LM-head rows of the loss vocabulary; cols (n, K) the target tokens' rows in W;
    p (n, K) their probabilities: a row sums to 1, or to 0 for a position that does not count (padding, a chain
    depth's first positions), whose loss and gradient are then exactly 0 (no boolean indexing: no host sync)."""

    @staticmethod
    def forward(ctx, h, W, cols, p, chunk: int):
        grad = torch.empty_like(h)
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        for s in range(0, h.shape[0], chunk):
            z = (h[s: s + chunk].to(W.dtype) @ W.T).float()
            lse = torch.logsumexp(z, -1, keepdim=True)
            c, q = cols[s: s + chunk], p[s: s + chunk].float()
            total += (q * (lse - z.gather(1, c))).sum()
            g = z.sub_(lse).exp_().mul_(q.sum(-1, keepdim=True))   # softmax (x the row's weight), in place
            g.scatter_add_(1, c, -q)                     # d loss / d logits = softmax - p
            grad[s: s + chunk] = (g.to(W.dtype) @ W).to(h.dtype)
        ctx.save_for_backward(grad)
        return total

    @staticmethod
    def backward(ctx, g_out):
        (grad,) = ctx.saved_tensors
        return grad * g_out.to(grad.dtype), None, None, None, None


def _loss(head: EagleHead, ids, feats, lens, depth: int, reg: float, tops, vocab_rows=None, chunk: int = 4096,
          decay: float = 0.8, on_chain=None):
    """Mean loss of one padded batch: ids (B, N), feats (B, N, H) of every position, lens (B,) (a CPU tensor or
    list: the counts of positions are known without asking the GPU); ``tops``: the target's sparse next-token
    distributions (ids (B, N, K), probs (B, N, K)); ``vocab_rows``: the loss vocabulary (None: all of it). With a
    loss vocabulary the softmax runs over it plus every position's top token, and the target's distribution is
    restricted to those rows (renormalised): its tail tokens outside them are dropped. Depth d weighs
    ``decay**(d-1)``; ``on_chain``: called once the chain's forward is queued (the step's phase timer). Returns
    (loss, per-depth cross-entropies as one tensor)."""
    B, N = ids.shape
    T = N - 1                                      # pairs i = 0..N-2: (ids[i+1], f_i) -> f_{i+1}
    outs = head.chain(ids[:, 1:], feats[:, :-1], depth)
    if on_chain is not None:
        on_chain()
    tgt = feats[:, 1:]
    dev = ids.device
    lens_l = [int(x) for x in lens]
    W = head.target.get_output_embeddings().weight
    t_ids, t_p = tops[0][:, 1:].long(), tops[1][:, 1:]     # the target's distribution at position i+1
    V = W.shape[0]
    if vocab_rows is None:
        rows = None
        cols, q = t_ids, t_p.float()
    else:                                          # the loss vocabulary and every position's top token
        rows = torch.unique(torch.cat([vocab_rows, t_ids[..., 0].reshape(-1)]))   # (padding's 0 is harmless)
        where = torch.full((V,), -1, dtype=torch.long, device=W.device)
        where[rows] = torch.arange(len(rows), device=W.device)
        cols = where[t_ids]
        q = t_p.float() * (cols >= 0)
        q = q / q.sum(-1, keepdim=True).clamp_min(1e-30)    # padding rows stay 0
        cols = cols.clamp_min(0)
    Wr = (W if rows is None else W[rows]).detach().to(torch.bfloat16 if W.is_cuda else W.dtype)
    H = tgt.shape[-1]
    K = cols.shape[-1]
    cols, q = cols.reshape(B * T, K), q.reshape(B * T, K)
    total, parts = 0.0, []
    for d, out in enumerate(outs, start=1):
        at = _positions(lens_l, T, d, dev)        # the pairs depth d counts (i >= d-1, inside the sequence)
        n = max(len(at), 1)
        o = out.reshape(B * T, H)[at]
        ce = _SparseCE.apply(o, Wr, cols[at], q[at], chunk) / n
        total = total + decay ** (d - 1) * ce
        parts.append(ce.detach())
        if d == 1 and reg:
            total = total + reg * F.smooth_l1_loss(o.float(), tgt.reshape(B * T, H)[at].float())
    return total / sum(decay ** k for k in range(depth)), torch.stack(parts)


def _positions(lens: Sequence[int], T: int, d: int, dev) -> torch.Tensor:
    """Flat indices b*T + i of the pairs i = d-1 .. lens[b]-2 of every row b, built on the host and copied
    without a sync (boolean masks would make the host wait for the GPU)."""
    idx = [np.arange(b * T + d - 1, b * T + L - 1, dtype=np.int64) for b, L in enumerate(lens) if L - 1 > d - 1]
    t = torch.from_numpy(np.concatenate(idx) if idx else np.zeros(0, dtype=np.int64))
    return t.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else t


def _buckets(lengths: Sequence[int], tokens_per_batch: int) -> list[list[int]]:
    """Length-sorted buckets of about ``tokens_per_batch`` padded tokens (a longer sequence alone), shortest
    first."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    out, cur, longest = [], [], 0
    for i in order:
        if cur and max(longest, lengths[i]) * (len(cur) + 1) > tokens_per_batch:
            out.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, lengths[i])
    if cur:
        out.append(cur)
    return out


def _batches(lengths: Sequence[int], tokens_per_batch: int, rng: np.random.Generator) -> list[list[int]]:
    """:func:`_buckets` in a seeded random order (the training loop's)."""
    out = _buckets(lengths, tokens_per_batch)
    return [out[j] for j in rng.permutation(len(out))]


def _pad_ids(seqs, idx, device):
    """Sequences ``idx`` of ``seqs`` right-padded with 0 into (B, N) ids (their lengths are the host's)."""
    ids = torch.zeros(len(idx), max(len(seqs[i]) for i in idx), dtype=torch.long, device=device)
    for r, i in enumerate(idx):
        ids[r, : len(seqs[i])] = torch.as_tensor(seqs[i], device=device)
    return ids


def _pad(seqs, feats, tops, idx, device):
    """One training batch: ids (:func:`_pad_ids`), features (B, N, H) and the target's sparse distributions
    (ids (B, N, K), probs (B, N, K)), zero past each sequence's end."""
    ids = _pad_ids(seqs, idx, device)
    B, n = ids.shape
    F_ = torch.zeros(B, n, feats[idx[0]].shape[-1], dtype=feats[idx[0]].dtype, device=device)
    K = tops[idx[0]][0].shape[-1]
    t_ids = torch.zeros(B, n, K, dtype=torch.int32, device=device)
    t_p = torch.zeros(B, n, K, dtype=torch.float16, device=device)
    for r, i in enumerate(idx):
        F_[r, : len(seqs[i])] = feats[i].to(device)
        t_ids[r, : len(seqs[i])] = tops[i][0].to(device)
        t_p[r, : len(seqs[i])] = tops[i][1].to(device)
    return ids, F_, (t_ids, t_p)


@torch.no_grad()
def held_out_acceptance(head: EagleHead, pairs, ks=tuple(range(1, 9))) -> dict:
    """Held-out acceptance of exact chained drafting over (prompt, output) pairs:

    * ``tokens_per_step``: {k: walked tokens per step, mean over requests} (a greedy run with draft length k
      walks each output, a step advancing by min(acc_len, k + 1): the study's tokens per step);
    * ``draft_position_rate``: the study's per-position rate at k = max(ks) (drafts whose i-th token was
      accepted / drafts, over the walked steps);
    * ``conditional_position_rate``: drafts whose i-th token was accepted / drafts whose (i-1)-th was (what
      shows a head collapsing past its training depth; i = 1 equals the rate above);
    * ``position_mean``: {k: mean over output positions of min(acc_len, k + 1)}, which is not what a run
      produces per step (kept, named, for comparison with earlier records)."""
    from .metrics import accepted_histogram, walk_steps

    accs = [eagle_chain_acceptance(head, p, o, max(ks)) for p, o in pairs if len(o) > 1]
    tps = {k: float(np.mean([len(a) / len(walk_steps(a, k)) for a in accs])) for k in ks}
    K = max(ks)
    hist = sum(accepted_histogram(a, K) for a in accs)
    rate = {i: float(hist[i:].sum() / hist.sum()) for i in range(1, K + 1)}
    cond = {i: float(hist[i:].sum() / max(hist[i - 1:].sum(), 1)) for i in range(1, K + 1)}
    flat = np.concatenate(accs)
    pos = {k: float(np.minimum(flat, k + 1).mean()) for k in ks}
    return {"tokens_per_step": tps, "draft_position_rate": rate, "conditional_position_rate": cond,
            "position_mean": pos, "requests": len(accs)}


#: the training steps (counted from the run's first) timed phase by phase, the device synchronised at each phase
SPLIT_STEPS = (20, 30)


def _mark(dev, timed: bool) -> float:
    if timed and dev.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() if timed else 0.0


def _step_split(rows) -> dict | None:
    """Mean seconds per phase of the timed steps: batch assembly, the chain's forward (every depth), the fused
    loss (its softmax and gradient over the loss vocabulary, every depth), backward, clip + optimizer;
    ``forward_loss_s`` is the chain and the loss together."""
    if not rows:
        return None
    a = np.asarray(rows, dtype=float)
    names = ("pad_s", "chain_forward_s", "loss_s", "backward_s", "optimizer_s")
    out = {k: round(float(a[:, i].mean()), 5) for i, k in enumerate(names)}
    out["forward_loss_s"] = round(out["chain_forward_s"] + out["loss_s"], 5)
    out.update(steps=len(rows), real_tokens_per_step=round(float(a[:, 5].mean()), 1),
               padded_tokens_per_step=round(float(a[:, 6].mean()), 1))
    return out


def train_eagle(target, train_pairs, *, out, val_pairs=(), kind: str = "eagle", steps: int = 1000,
                lr: float = 5e-4, tokens_per_batch: int = 8192, ttt_depth: int = 3, reg: float = 0.1,
                seed: int = 0, ckpt_every: int = 200, eval_every: int = 200, log: dict | None = None,
                progress: bool = True, started: float | None = None, time_limit_s: float | None = None,
                topk: int = 32, loss_vocab: int = 32768, deadline: float | None = None, depth_decay: float = 0.8,
                init_head=None) -> tuple[EagleHead, dict]:
    """Train a head on (prompt, output) pairs of the target's greedy decodes; returns (head, training record).

    ``log``: facts about the data to keep in the record (workloads, prompt counts ...); ``started``: when the
    whole recipe began (``time.time()``), for the record's total wall time. ``topk``: the target's distribution
    at each position is kept as its ``topk`` most likely tokens (renormalised); ``loss_vocab``: the softmax of
    the loss runs over the target's ``loss_vocab`` most frequent top tokens plus every position's top token
    (0: the whole vocabulary). Held-out acceptance always drafts over the whole vocabulary, as vLLM does.
    ``deadline`` (a ``time.time()``): the loop's time limit shrinks, once the features are ready, so that training
    stops by then (a leased GPU's budget: the decode before it may take longer than planned). ``init_head``: a
    head directory (vLLM's layout, this target's shape and ``kind``) whose weights the training starts from
    instead of a fresh initialisation (its sha256 is in the record and the settings); ``depth_decay``: chain
    depth d's loss weighs ``depth_decay**(d-1)``."""
    from .progress import tqdm

    check_train_settings(steps=steps, lr=lr, tokens_per_batch=tokens_per_batch, ttt_depth=ttt_depth, reg=reg,
                         seed=seed, ckpt_every=ckpt_every, eval_every=eval_every, topk=topk, loss_vocab=loss_vocab,
                         depth_decay=depth_decay)
    if not train_pairs:
        raise ValueError("no training sequences (every decode was a single token, or --val-n took them all)")
    out = Path(out)
    dev = next(target.parameters()).device
    torch.manual_seed(seed)
    target.requires_grad_(False)                  # embeddings and LM head are shared, frozen
    head = new_head(target, kind, seed=seed)
    init = None if init_head is None else _start_from(head, init_head)
    if dev.type == "cpu":
        head = head.to(next(target.parameters()).dtype)
    layers = feature_layers(head)
    seqs = [list(p) + list(o) for p, o in train_pairs]
    t_feat = time.time()
    feats = batched_features(target, seqs, layers, progress=progress)
    tops = target_topk(target, feats if layers == "final" else  # EAGLE-3 reads aux layers: targets need the last
                       batched_features(target, seqs, "final", progress=False), topk)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t_feat = time.time() - t_feat
    if deadline is not None:                      # what is left of the budget, never more than asked for
        left = max(1.0, deadline - time.time())
        time_limit_s = left if time_limit_s is None else min(float(time_limit_s), left)
    V = int(target.get_output_embeddings().weight.shape[0])
    vocab_rows, coverage = loss_vocabulary(tops, loss_vocab, V)
    settings = {"kind": kind, "steps": steps, "lr": lr, "tokens_per_batch": tokens_per_batch, "ttt_depth": ttt_depth,
                "reg": reg, "seed": seed, "n_train_sequences": len(seqs), "train_tokens": sum(map(len, seqs)),
                "topk": topk, "loss_vocab": loss_vocab, "depth_decay": depth_decay,
                "init_head_sha256": init["sha256"] if init else None}
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=lr, betas=(0.9, 0.95),
                            weight_decay=0.0)
    # warm-up over the first 5% and a cosine to 10% of ``lr``, over the steps or, with a time limit, over whichever
    # ends first: a run stopped by its time limit ends annealed, not at its peak learning rate
    done_share = {"p": 0.0}
    warm = max(1, steps // 20)

    def lr_factor(s):
        p = min(1.0, max(s / steps, done_share["p"]))
        w = min(1.0, max(p, (s + 1) / steps) / 0.05) if time_limit_s else min(1.0, (s + 1) / warm)
        return w * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    out = claim_dir(head_dir(out), "spec-repro train eagle")   # a new, empty or earlier head's folder only
    ck = out / ".ckpt" / "state.pt"                             # inside --out: nothing is written beside it
    step, curve, evals, queue = 0, [], [], []
    rng = np.random.default_rng(seed)
    if ck.exists():
        st = _load_checkpoint(ck, dev)
        if st["settings"] == settings:
            head.load_state_dict(st["head"], strict=False)
            opt.load_state_dict(st["opt"])
            sched.load_state_dict(st["sched"])
            step, curve, evals, queue = st["step"], st["curve"], st["evals"], st["queue"]
            rng.bit_generator.state = st["rng"]
            if progress:
                print(f"[train] resuming from {ck} at step {step}")
    lengths = [len(s) for s in seqs]
    t0 = time.time()
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else torch.autocast("cpu",
                                                                                                       enabled=False)
    head.train()
    bar = tqdm(total=steps, initial=step, desc=f"train {kind}", disable=not progress)
    stopped_at, seen, step0, split = None, 0, step, []
    while step < steps:
        if time_limit_s is not None and time.time() - t0 > time_limit_s:
            stopped_at = step            # out of time: the head as trained so far, evaluated below
            break
        if not queue:
            queue = _batches(lengths, tokens_per_batch, rng)
        idx = queue.pop()
        timed = SPLIT_STEPS[0] <= step - step0 < SPLIT_STEPS[1]    # a few steps timed phase by phase
        marks = [_mark(dev, timed)]
        ids, fb, tb = _pad(seqs, feats, tops, idx, dev)
        lens = [lengths[i] for i in idx]          # on the host: no sync to count positions
        seen += sum(lens)
        marks.append(_mark(dev, timed))
        with autocast:
            loss, parts = _loss(head, ids, fb.to(torch.bfloat16 if dev.type == "cuda" else fb.dtype), lens,
                                ttt_depth, reg, tb, vocab_rows, decay=depth_decay,
                                on_chain=(lambda: marks.append(_mark(dev, True))) if timed else None)
        marks.append(_mark(dev, timed))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        marks.append(_mark(dev, timed))
        torch.nn.utils.clip_grad_norm_(head.parameters(), 0.5)
        opt.step()
        marks.append(_mark(dev, timed))
        if timed:
            split.append([b - a for a, b in itertools.pairwise(marks)] + [sum(lens), ids.numel()])
        step += 1
        if time_limit_s is not None:
            done_share["p"] = max(step / steps, (time.time() - t0) / time_limit_s)
        sched.step()
        vals = torch.cat([loss.detach().reshape(1).float(), parts.float()]).tolist()   # a host sync (the rows' unique the other)
        curve.append([step, round(vals[0], 5), [round(p, 4) for p in vals[1:]]])
        post = {"loss": f"{curve[-1][1]:.3f}"}
        if val_pairs and (step % eval_every == 0 or step == steps):
            head.eval()
            te = time.time()
            ev = held_out_acceptance(head, val_pairs)
            head.train()
            evals.append({"step": step, **ev, "eval_s": round(time.time() - te, 2)})
            post["heldout_k3"] = f"{ev['tokens_per_step'][3]:.2f}"
        bar.set_postfix(post)
        bar.update(1)
        if step % ckpt_every == 0 and step < steps:
            ck.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(ck) as tmp:
                torch.save({"settings": settings, "head": head.state_dict(), "opt": opt.state_dict(),
                            "sched": sched.state_dict(), "step": step, "curve": curve, "evals": evals,
                            "rng": rng.bit_generator.state, "queue": queue}, tmp)
    bar.close()
    head.eval()
    if stopped_at is not None and val_pairs and (not evals or evals[-1]["step"] != step):
        evals.append({"step": step, **held_out_acceptance(head, val_pairs)})
    from .provenance import machine_info, package_versions

    n_feat = sum(map(len, seqs))
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t_loop = time.time() - t0 - sum(e.get("eval_s", 0.0) for e in evals)
    record = {"settings": settings, "feature_pass_s": round(t_feat, 1), "train_wall_s": round(time.time() - t0, 1),
              "feature_pass_tokens_per_s": round(n_feat / t_feat, 1) if t_feat else None,
              "feature_pass": "target forward (features) + its LM head once per position (top-k targets)",
              "train_tokens_per_s": round(seen / max(t_loop, 1e-9), 1) if seen else None,
              "train_tokens_per_s_meaning": f"sequence tokens (prompt + output, no padding) through one optimizer "
                                            f"step of every chain depth 1..{ttt_depth}, per second of the loop "
                                            f"(held-out evaluations excluded); this run's tokens only (a resumed "
                                            f"run counts from its resume)",
              "loss_vocabulary": {"size": loss_vocab if vocab_rows is not None else V,
                                  "top_token_coverage": round(coverage, 5), "target_topk": topk},
              "step_split": _step_split(split),
              "steps_done": step, "stopped_by_time_limit": stopped_at is not None, "time_limit_s": time_limit_s,
              "time_limit_from_deadline": deadline is not None,
              "loss_curve": curve[:: max(1, len(curve) // 200)] + curve[-1:], "held_out": evals,
              "final_held_out_tokens_per_step": evals[-1]["tokens_per_step"] if evals else None,
              "final_held_out_draft_position_rate": evals[-1]["draft_position_rate"] if evals else None,
              "metric": "tokens_per_step: walked steps (each advances min(acc_len, k + 1)), mean over held-out "
                        "requests; position_mean: mean over positions of min(acc_len, k + 1) (not per step)",
              "machine": machine_info(), "versions": package_versions(),
              "target": getattr(target.config, "_name_or_path", None), **(log or {})}
    if init:
        record["init_head"] = {**init, **record.get("init_head", {})}
    save_head(head, out, extra_config={"spec_repro_training": {k: settings[k] for k in ("kind", "steps", "seed")}})
    if started is not None:
        record["total_wall_s"] = round(time.time() - started, 1)
    with atomic_write(out / "TRAINING.json") as f:
        f.write(json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")
    if ck.exists():
        ck.unlink()
    if ck.parent.is_dir() and not any(ck.parent.iterdir()):
        ck.parent.rmdir()
    return head, record


def check_train_settings(*, steps: int = 1000, lr: float = 5e-4, tokens_per_batch: int = 8192, ttt_depth: int = 3,
                         reg: float = 0.1, seed: int = 0, ckpt_every: int = 200, eval_every: int = 200,
                         time_limit_s: float | None = None, topk: int = 32, loss_vocab: int = 32768,
                         depth_decay: float = 0.8) -> None:
    """Refuse, with one line naming the option, any training number that cannot give a trained head."""
    from .guard import check_float, check_int

    check_int("--steps", steps, 1, 10**9)
    check_float("--lr", lr, 0.0, 1.0, lo_open=True)
    check_int("--tokens-per-batch", tokens_per_batch, 2, 2**31 - 1)
    check_int("--ttt-depth", ttt_depth, 1, 16)
    check_float("reg", reg, 0.0, 1e6)
    check_int("--seed", seed, 0, 2**32 - 1)
    check_int("ckpt_every", ckpt_every, 1)
    check_int("eval_every", eval_every, 1)
    check_int("--topk", topk, 1, 4096)
    check_int("--loss-vocab", loss_vocab, 0, 2**31 - 1)
    check_float("--depth-decay", depth_decay, 0.0, 1.0, lo_open=True)
    if time_limit_s is not None:
        check_float("--time-limit", time_limit_s, 0.0, 1e9, lo_open=True)


def _start_from(head: EagleHead, path) -> dict:
    """Copy the weights of the head at ``path`` into the fresh ``head`` (same kind and shapes; ValueError with one
    line otherwise); returns what the record keeps of it: its sha256 (its one weights file's, as the traces'
    MANIFEST records a head; with several files, the sha256 of their {name: sha256}), and its own training
    record's steps and tokens when it has one."""
    from .fetch import sha256_bytes
    from .proposers.eagle import check_head_dir
    from .proposers.eagle_files import head_identity

    try:
        d = check_head_dir(path)
        src = load_head(d, head.target, device=torch.device("cpu"), dtype=torch.float32)
    except ValueError as e:
        raise ValueError(f"--init-head: {e}") from None
    if src.kind != head.kind:
        raise ValueError(f"--init-head {d} is an {src.kind} head; this run trains {head.kind}")
    mine = dict(head.named_parameters())
    theirs = dict(src.named_parameters())
    for k, p in mine.items():
        if k not in theirs or theirs[k].shape != p.shape:
            got = tuple(theirs[k].shape) if k in theirs else "nothing"
            raise ValueError(f"--init-head {d}: {k} is {got}, this target's head needs {tuple(p.shape)}")
    with torch.no_grad():
        for k, p in mine.items():
            p.copy_(theirs[k].to(p.device, p.dtype))
    files = head_identity(d)
    sha = next(iter(files.values())) if len(files) == 1 else sha256_bytes(json.dumps(files, sort_keys=True).encode())
    info = {"path": str(d), "sha256": sha, "files": list(files)}
    rec = d / "TRAINING.json"
    if rec.is_file():
        r = json.loads(rec.read_text())
        info.update(steps_done=r.get("steps_done"), train_tokens=(r.get("settings") or {}).get("train_tokens"),
                    target_tokens=(r.get("data") or {}).get("target_tokens"))
    return info


def _load_checkpoint(ck: Path, dev) -> dict:
    """A training checkpoint, read with ``weights_only=True`` (tensors, numbers, strings, lists, dicts: a pickle
    that would run code is refused, never executed); ValueError with one line when it is not such a file."""
    import pickle

    try:
        st = torch.load(ck, map_location=dev, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError, TypeError, AttributeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"checkpoint {ck} is not a plain-tensor training checkpoint ({first[:160]}); it was not "
                         f"loaded: delete {ck.parent} to start the training afresh") from None
    need = ("settings", "head", "opt", "sched", "step", "curve", "evals", "queue", "rng")
    if not isinstance(st, dict) or any(k not in st for k in need):
        raise ValueError(f"checkpoint {ck} lacks the training state {list(need)}; delete {ck.parent} to start "
                         f"the training afresh")
    return st


def train_from_workloads(target_name: str, out, *, workloads: Sequence[str] = ("sharegpt", "py-functions"),
                         eval_n: int | None = None, train_n: int = 1000, val_n: int = 32, max_new_tokens: int = 256,
                         max_prompt_tokens: int = 1024, batch_size: int = 32, device: str = "cpu", seed: int = 0,
                         kind: str = "eagle", engine: str = "torch", vllm_memory: float = 0.8,
                         vllm_max_seqs: int = 1024, train_n_for: dict | None = None,
                         time_budget_s: float | None = None, init_head=None, decodes=None,
                         **train_kw) -> tuple[EagleHead, dict]:
    """The whole recipe of ``spec-repro train eagle``: split prompts by source, decode (the torch engine, or vLLM
    on a GPU), train, write the head + record. ``eval_n``: requests per workload of :data:`EVAL_SETS` kept out
    (None: the sets as collected, humaneval 164 and mt-bench 80). ``train_n_for``: {workload: at most this many
    training prompts} over ``train_n``. ``vllm_memory`` / ``vllm_max_seqs``: vLLM's
    gpu_memory_utilization and max_num_seqs for the decode (the GPU is vLLM's alone until it shuts down).
    ``time_budget_s``: the whole recipe stops training by this many seconds after it started (the loop's
    ``time_limit_s`` shrinks to what the decode and the feature pass left). ``init_head``: continue from that
    head's weights (:func:`train_eagle`); when its ``TRAINING.json`` records this recipe's split (same seed,
    evaluation sets and prompt length cap), the held-out decodes are drawn only from prompts its run never
    decoded (the split is prefix-stable: a workload's first ``train_requests`` are the ones it took).
    ``decodes``: a file of the target's decodes (:func:`write_decodes`): when it exists it is the training data
    and the split only its filter (:func:`decodes_training`: decodes whose prompts the current workloads do not
    rebuild, or that are now in an evaluation source, are dropped; ``train_n`` does not apply; the decodes it
    marks held out are held out again; with ``init_head`` its record must name this file's decode), else it is
    written after the decode, so that a later run on the same prompts skips it."""
    from . import models
    from .guard import check_device, check_float, check_int

    if kind != "eagle":
        raise ValueError("training supports kind 'eagle' (EAGLE-1 layout, chain-trained); EAGLE-3 heads load and "
                         "draft but are not trained here")
    from .engines.vllm.decode import check_engine

    for name, v, lo in (("--train-n", train_n, 1), ("--val-n", val_n, 0),
                        ("--max-new-tokens", max_new_tokens, 1), ("--max-prompt-tokens", max_prompt_tokens, 1),
                        ("--batch-size", batch_size, 1)) + ((("--eval-n", eval_n, 0),) if eval_n is not None else ()):
        check_int(name, v, lo, 2**31 - 1)
    for w, v in (train_n_for or {}).items():
        if w not in workloads:
            raise ValueError(f"--train-n {w}={v}: {w!r} is not among --workloads ({' '.join(workloads)})")
        check_int(f"--train-n {w}", v, 1, 2**31 - 1)
    if time_budget_s is not None:
        check_float("--time-budget", time_budget_s, 0.0, 1e9, lo_open=True)
    check_train_settings(seed=seed, **train_kw)       # every number, before the model loads
    if init_head is not None:
        from .proposers.eagle import check_head_dir

        try:
            check_head_dir(init_head)
        except ValueError as e:
            raise ValueError(f"--init-head: {e}") from None
    check_float("vllm_memory", vllm_memory, 0.0, 1.0, lo_open=True)
    check_int("vllm_max_seqs", vllm_max_seqs, 1, 2**20)
    check_engine(engine, device)                       # before the device: it says what --engine vllm needs
    if decodes is not None and str(decodes).endswith(".parts.json") and not Path(decodes).is_file():
        raise ValueError(f"--decodes {decodes}: no such parts manifest (new decodes are written as a .parquet)")
    check_device(device)
    from . import workloads as wl

    for w in workloads:
        wl.describe(w)
    eval_sets = None if eval_n is None else {w: min(n, eval_n) for w, n in EVAL_SETS.items()}
    out = head_dir(out, "--out", inputs=[target_name] if Path(target_name).expanduser().exists() else [])
    t0 = time.time()
    target, tok = models.load(target_name, device=device)
    if init_head is not None:                          # the head fits this target, before anything is decoded
        _start_from(new_head(target, kind, seed=seed), init_head)
    dec_meta = {"target": target_name, "max_new_tokens": max_new_tokens, "seed": seed, "engine": engine,
                "max_prompt_tokens": max_prompt_tokens}
    from_file = decodes is not None and _decodes_exist(decodes)
    if from_file:                                      # the file is the data; the split only filters it
        prompts, outs, held, dstats, facts = decodes_training(
            decodes, workloads, dec_meta, tokenizer=tok, seed=seed, max_prompt_tokens=max_prompt_tokens,
            eval_sets=eval_sets)
        if not prompts:
            raise ValueError(f"--decodes {decodes}: none of its {facts['rows']} decodes is a prompt of "
                             f"{' '.join(workloads)} outside the evaluation sources: decode into a new file")
        taken = {}
        unseen, held_note = _decodes_of_init(init_head, decodes, dstats)
    else:
        split, facts = split_by_source(workloads, train_n=train_n, tokenizer=tok, seed=seed,
                                       max_prompt_tokens=max_prompt_tokens, eval_sets=eval_sets,
                                       train_n_for=train_n_for)
        taken = _taken_by(init_head, split, seed=seed, eval_sets=facts["eval_sets"],
                          max_prompt_tokens=max_prompt_tokens)
        unseen = bool(taken)
        held_note = ("held-out decodes are prompts its run never decoded" if taken else
                     "its TRAINING.json does not record this split: the held-out decodes may be in its data")
        prompts = [list(r.prompt_token_ids) for w in workloads for r in split[w]]
        fresh = [i >= taken.get(w, 0) for w in workloads for i in range(len(split[w]))]
        order = np.random.default_rng(seed).permutation(len(prompts))
        prompts = [prompts[i] for i in order]
        fresh = [fresh[i] for i in order]
    facts["max_prompt_tokens"] = max_prompt_tokens
    t_dec = time.time()
    if not from_file and engine == "vllm":
        from .engines.torch import eos_ids_of
        from .engines.vllm.decode import vllm_greedy

        outs, dstats = vllm_greedy(str(models.converted_dir(target_name)), prompts, max_new_tokens=max_new_tokens,
                                   eos_token_ids=sorted(eos_ids_of(target, tok)), seed=seed,
                                   gpu_memory_utilization=vllm_memory, max_num_seqs=vllm_max_seqs)
    elif not from_file:
        outs = distill(target, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size)
        n_out = sum(map(len, outs))
        dstats = {"engine": "spec_repro.engines.torch", "output_tokens": n_out,
                  "decode_wall_s": round(time.time() - t_dec, 1),
                  "output_tokens_per_s": round(n_out / max(time.time() - t_dec, 1e-9), 1)}
    keep = [i for i, o in enumerate(outs) if len(o) > 1]
    pairs = [(prompts[i], outs[i]) for i in keep]
    if from_file:                                      # the decodes' own held-out set, never trained on
        val_at = {j for j, i in enumerate(keep) if held[i]}
    else:
        val_at = _hold_out([fresh[i] for i in keep], val_n)
        if decodes is not None:
            held = [False] * len(prompts)
            for j in val_at:
                held[keep[j]] = True
            write_decodes(decodes, prompts, outs, held, {**dec_meta, "decode": dstats})
    val = [pr for j, pr in enumerate(pairs) if j in val_at]
    train = [pr for j, pr in enumerate(pairs) if j not in val_at]
    dfile = None
    if decodes is not None:
        dfile = {"path": str(decodes), "read": from_file}
        if from_file:                                  # what the file held, what was trained on, what dropped
            dfile.update({k: facts.pop(k) for k in ("rows", "kept", "kept_per_workload", "held_out", "dropped",
                                                    "dropped_held_out", "why")})
            facts = {**facts, **{w: {"train_requests": n, "workload_version": facts["workload_versions"][w],
                                     "from_decodes_file": True} for w, n in dfile["kept_per_workload"].items()}}
            facts.pop("workload_versions")
    log = {"data": {"workloads": facts, "held_out_val_sequences": len(val), "max_new_tokens": max_new_tokens,
                    "decode": {"greedy": True, **dstats}, "target": target_name,
                    **({"decodes_file": dfile} if dfile else {}),
                    "target_tokens": sum(len(p) + len(o) for p, o in pairs),
                    "output_tokens": sum(len(o) for _, o in pairs),
                    "decode_s": round(time.time() - t0, 1)}}
    if time_budget_s is not None:
        log["time_budget_s"] = time_budget_s
    if init_head is not None:
        log["init_head"] = {"prompts_its_run_decoded": dict(taken),
                            "held_out_unseen_by_it": unseen,
                            "held_out_note": held_note}
    return train_eagle(target, train, val_pairs=val, out=out, kind=kind, seed=seed, log=log, started=t0,
                       deadline=None if time_budget_s is None else t0 + time_budget_s, init_head=init_head,
                       **train_kw)


def _prompt_key(ids) -> str:
    import hashlib

    return hashlib.sha256(np.asarray(ids, dtype=np.int32).tobytes()).hexdigest()[:24]


def _decodes_exist(path) -> bool:
    p = Path(path)
    from .parts import manifest_of

    return p.is_file() or manifest_of(p).is_file()


def write_decodes(path, prompts, outs, held, meta: dict) -> Path:
    """The target's decodes of ``prompts`` as a parquet file (zstd): each prompt's key (the sha256 of its ids),
    its output ids and whether it was held out, the decode's settings in the file's metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from .io import atomic_path

    tab = pa.table({"prompt_key": [_prompt_key(p) for p in prompts],
                    "output_ids": pa.array([np.asarray(o, dtype=np.int32) for o in outs], type=pa.list_(pa.int32())),
                    "held_out": pa.array(list(map(bool, held)))})
    tab = tab.replace_schema_metadata({"spec_repro_decodes": json.dumps(meta, default=str)})
    p = Path(path)
    with atomic_path(p) as tmp:
        pq.write_table(tab, tmp, compression="zstd", compression_level=9)
    return p


def read_decodes(path, prompts, meta: dict):
    """(outputs, held-out flags, decode facts) for ``prompts`` from a decodes file (:func:`write_decodes`; a
    ``.parts.json`` or a file whose parts manifest lies beside it is joined and verified first). ValueError (one
    line) when it was decoded with other settings or lacks a prompt."""
    keys, outs_all, held_all, theirs = _decodes_table(path, meta)
    at = {k: i for i, k in enumerate(keys)}
    want = [_prompt_key(x) for x in prompts]
    missing = sum(k not in at for k in want)
    if missing:
        raise ValueError(f"--decodes {path} lacks {missing} of this run's {len(want)} prompts (other workloads, "
                         f"--train-n or split): decode into a new file")
    outs = [outs_all[at[k]] for k in want]
    held = [bool(held_all[at[k]]) for k in want]
    return outs, held, _decode_facts(path, theirs)


def _decode_facts(path, theirs: dict) -> dict:
    return {**(theirs.get("decode") or {}), "read_from": str(path), "decoded_by": theirs.get("engine")}


def _decodes_table(path, meta: dict):
    """(prompt keys, outputs, held-out flags, the file's metadata) of a decodes file, in its order; ValueError (one
    line) when it is not one, its parts do not verify, or it was decoded with settings other than ``meta``'s."""
    import pyarrow.parquet as pq

    from .parts import PartsError, cached, manifest_of

    p = Path(path)
    try:
        if p.name.endswith(".parts.json"):
            p = cached(p)
        elif not p.is_file() and manifest_of(p).is_file():
            p = cached(manifest_of(p))
        tab = pq.read_table(p)
        theirs = json.loads((tab.schema.metadata or {}).get(b"spec_repro_decodes", b"{}"))
        keys = tab.column("prompt_key").to_pylist()
        outs, held = tab.column("output_ids").to_pylist(), tab.column("held_out").to_pylist()
    except PartsError as e:
        raise ValueError(f"--decodes: {e}") from None
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"--decodes {path}: not a decodes file ({(str(e).splitlines() or [''])[0][:120]})") from None
    for k, v in meta.items():
        if k != "engine" and theirs.get(k) != v:
            raise ValueError(f"--decodes {path} was decoded with {k} {theirs.get(k)!r}, this run asks {v!r}")
    return keys, outs, held, theirs


def decodes_training(path, workloads: Sequence[str], meta: dict, *, tokenizer, seed: int = 0,
                     max_prompt_tokens: int | None = 1024, eval_sets=None):
    """The training data of a run that reads a decodes file (:func:`write_decodes`): the file is the data, the
    current split only filters it. The file keeps each prompt's key, not its ids: a decode's prompt is rebuilt
    from the requests of ``workloads`` (all of them, no cap) whose prompt ids have that key. A decode is dropped
    when no request rebuilds its prompt (its workload's builder makes other prompts now), when a request that
    rebuilds it is an evaluation request's source, prompt or normalized messages (:func:`eval_filter`), or when
    the prompt repeats an earlier row's. Held out: the file's held-out flags of the decodes kept (the decodes the
    run that wrote the file never trained on). Nothing requires the file to hold every prompt of the split.

    Returns (prompts, outputs, held-out flags, decode facts, facts): facts count the file's rows, the decodes kept
    per workload and held out, and the ones dropped, by reason."""
    from . import workloads as wl

    keys, outs_all, held_all, theirs = _decodes_table(path, meta)
    evaluated, n_banned = eval_filter(tokenizer=tokenizer, eval_sets=eval_sets, seed=seed,
                                      max_prompt_tokens=max_prompt_tokens)
    by_key: dict = {}
    for w in workloads:
        for r in wl.load(w, n=None, seed=seed, tokenizer=tokenizer, max_prompt_tokens=max_prompt_tokens):
            by_key.setdefault(_prompt_key(r.prompt_token_ids), []).append((w, r))
    prompts, outs, held, seen = [], [], [], set()
    kept = {w: 0 for w in workloads}
    drop = {"prompt_not_rebuilt": 0, "evaluation_source": 0, "repeated_prompt": 0}
    drop_held = dict.fromkeys(drop, 0)
    for k, o, h in zip(keys, outs_all, held_all):
        hits = by_key.get(k)
        why = ("prompt_not_rebuilt" if not hits else "evaluation_source" if any(evaluated(r) for _, r in hits)
               else "repeated_prompt" if k in seen else None)
        if why:
            drop[why] += 1
            drop_held[why] += bool(h)
            continue
        seen.add(k)
        w, r = hits[0]
        kept[w] += 1
        prompts.append(list(r.prompt_token_ids))
        outs.append(o)
        held.append(bool(h))
    facts = {"rows": len(keys), "kept": len(prompts), "kept_per_workload": kept, "held_out": sum(held),
             "dropped": drop, "dropped_held_out": drop_held, "eval_sources_excluded": n_banned,
             "eval_sets": dict(EVAL_SETS if eval_sets is None else eval_sets),
             "workload_versions": {w: wl.version(w) for w in workloads},
             "why": "the file is the training data and the current split its filter: a decode whose prompt no "
                    "current request rebuilds (the file keeps prompt keys, not ids), or whose request shares a "
                    "source, prompt or normalized messages with an evaluation request, is not trained on"}
    return prompts, outs, held, _decode_facts(path, theirs), facts


def _decodes_of_init(init_head, decodes, dstats: dict) -> tuple[bool, str]:
    """(whether the decodes file's held-out decodes are known unseen by ``init_head``, a note): they are when its
    ``TRAINING.json`` records this file's decode (the run that wrote the file, or one that read it, held them out
    and never trained on them). ValueError (one line) when that record names another decode: the file's held-out
    prompts may be in the head's training data."""
    if init_head is None:
        return False, ""
    rec = Path(init_head).expanduser() / "TRAINING.json"
    theirs = ((json.loads(rec.read_text()).get("data") or {}).get("decode") or {}) if rec.is_file() else {}
    mine = {k: v for k, v in dstats.items() if k not in ("read_from", "decoded_by")}
    if not theirs:
        return False, "its TRAINING.json does not record its decode: the file's held-out decodes may be in its data"
    if any(theirs.get(k) != v for k, v in mine.items()):
        raise ValueError(f"--decodes {decodes} is not the decode of --init-head {init_head}'s run (its TRAINING.json "
                         f"records another): that head may have trained on the file's held-out decodes")
    return True, "held-out decodes are the decodes file's held-out ones, which its run never trained on"


def _hold_out(fresh: Sequence[bool], val_n: int) -> set:
    """Indices of the held-out decodes: the first ``val_n`` whose prompt no earlier run decoded (``fresh``)."""
    return set([j for j, f in enumerate(fresh) if f][:val_n])


def _taken_by(init_head, split: dict, *, seed: int, eval_sets: dict, max_prompt_tokens) -> dict:
    """{workload: how many of ``split[workload]`` (its first ones) the run that trained ``init_head`` decoded},
    from that head's ``TRAINING.json``; {} when there is no init head or its record does not say (a head trained
    elsewhere). The split is prefix-stable (a seeded order, capped), so with the same seed, evaluation sets and
    prompt length cap its run took exactly the first ``train_requests`` of each workload (every one of a workload
    whose builder version differs from the recorded one, or that its run read from a decodes file); ValueError
    (one line) when the record names a different split."""
    if init_head is None:
        return {}
    rec = Path(init_head).expanduser() / "TRAINING.json"
    if not rec.is_file():
        return {}
    r = json.loads(rec.read_text())
    facts = ((r.get("data") or {}).get("workloads")) or {}
    if not facts:
        return {}
    theirs = {"seed": (r.get("settings") or {}).get("seed"), "eval_sets": facts.get("eval_sets"),
              "max_prompt_tokens": facts.get("max_prompt_tokens", 1024)}   # 1024: the CLI default before it was kept
    mine = {"seed": seed, "eval_sets": dict(eval_sets), "max_prompt_tokens": max_prompt_tokens}
    for k in mine:
        if theirs[k] != mine[k]:
            raise ValueError(f"--init-head {init_head} was trained on a split with {k} {theirs[k]}, this run's is "
                             f"{mine[k]}: run with the same {k} (its held-out decodes must be prompts it never saw)")
    from . import workloads as wl

    # a workload whose builder changed since (another version), or whose prompts came from a decodes file (not a
    # prefix of the split): every prompt of it counts as decoded, none fresh
    def prefix(w: str) -> bool:
        return facts[w].get("workload_version", 1) == wl.version(w) and not facts[w].get("from_decodes_file")

    return {w: int(facts[w]["train_requests"]) if prefix(w) else len(split[w])
            for w in split if isinstance(facts.get(w), dict)}
