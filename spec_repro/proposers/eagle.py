"""EAGLE-1 and EAGLE-3 draft heads, drafting exactly as vLLM 0.25 does (``vllm/v1/spec_decode``).

A head is ONE Llama decoder layer that drafts from the target's own features. Its input at position i is the
pair (token x_{i+1}, feature of position i), RoPE position i:

* EAGLE-1 (vLLM ``EagleLlamaForCausalLM``, ``llama_eagle.py``): feature = the target's last hidden state after
  its final norm. ``x = fc(cat(embed(token), feature))`` (2H -> H), then a pre-norm decoder layer whose input
  norm is the identity; the output (no final norm) goes through the TARGET's LM head.
* EAGLE-3 (vLLM ``Eagle3LlamaForCausalLM``, ``llama_eagle3.py``): feature = the target's residual stream entering
  layers (2, L//2, L-3) (vLLM's default ``get_eagle3_aux_hidden_state_layers``; a config key
  ``eagle_aux_hidden_state_layer_ids`` overrides), concatenated and fused by ``fc`` (3H -> H). The layer's
  attention reads ``cat(input_layernorm(embed(token)), hidden_norm(hidden))`` (2H wide); a final ``norm`` and
  the head's own LM head over a draft vocabulary, mapped to target ids by ``d2t`` (target = draft + d2t[draft]).

Chained drafting (vLLM's ``propose``): the first draft comes from the pair at the last verified position; each
further draft feeds (previous draft, the head's own pre-norm output) at the next position. The head's KV cache
holds the teacher-forced pairs of every verified position (vLLM rewrites the chain's slots with them at the next
step), so the draft at depth d of a chain that starts at pair s sees: teacher-forced keys at positions <= s and
the chain's own keys at s+1 .. s+d-1. :meth:`EagleHead.chain` computes every depth for every start at once
with exactly that attention pattern (EAGLE-3's "training-time test"), which both the profiler (exact acceptance
at every position) and training use; :class:`EagleProposer` drafts incrementally for the engine.

Checkpoints load in vLLM 0.25's layouts: EAGLE-1 keys ``fc.weight``, ``layers.0.{self_attn,mlp}.*``,
``layers.0.post_attention_layernorm.weight`` (``embed_tokens``/``lm_head`` shared from the target when absent,
as in vLLM), e.g. yuhuili/EAGLE-LLaMA3.1-Instruct-8B; EAGLE-3 keys ``fc.weight``, ``midlayer.*`` (or
``layers.0.*``), ``norm.weight``, ``lm_head.weight``, ``d2t`` (``t2d`` ignored), e.g. AngelSlim/Qwen3-8B_eagle3.
"""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from .eagle_files import EagleError, _read_weights, check_head_dir, read_config

from . import Proposer
from ..metrics import top1_prob

__all__ = ["EagleHead", "EagleProposer", "EagleError", "check_head_dir", "load_head", "save_head", "new_head", "target_features",
           "feature_layers", "eagle_chain_argmax", "eagle_chain_acceptance", "eagle_chain_profile", "KINDS"]

KINDS = ("eagle", "eagle3")
ARCH = {"eagle": "EagleLlamaForCausalLM", "eagle3": "Eagle3LlamaForCausalLM"}


class _RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


class _Attn(nn.Module):
    def __init__(self, d_in, H, heads, kv_heads, head_dim):
        super().__init__()
        self.q_proj = nn.Linear(d_in, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(d_in, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(d_in, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, H, bias=False)


class _MLP(nn.Module):
    def __init__(self, H, inter):
        super().__init__()
        self.gate_proj = nn.Linear(H, inter, bias=False)
        self.up_proj = nn.Linear(H, inter, bias=False)
        self.down_proj = nn.Linear(inter, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Layer(nn.Module):
    def __init__(self, kind, cfg):
        super().__init__()
        H = cfg["hidden_size"]
        self.self_attn = _Attn(2 * H if kind == "eagle3" else H, H, cfg["num_attention_heads"],
                               cfg["num_key_value_heads"], cfg["head_dim"])
        self.mlp = _MLP(H, cfg["intermediate_size"])
        self.post_attention_layernorm = _RMSNorm(H, cfg["rms_norm_eps"])
        if kind == "eagle3":
            self.input_layernorm = _RMSNorm(H, cfg["rms_norm_eps"])
            self.hidden_norm = _RMSNorm(H, cfg["rms_norm_eps"])


def _rope_config(cfg: dict):
    from transformers import LlamaConfig

    keys = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
            "rope_theta", "rope_scaling", "rope_parameters")
    return LlamaConfig(**{k: cfg[k] for k in keys if cfg.get(k) is not None})


class EagleHead(nn.Module):
    """An EAGLE-1 (``kind="eagle"``) or EAGLE-3 (``"eagle3"``) head bound to its target's embeddings and LM head.

    ``cfg``: the head's config.json as a dict (hidden_size, num_attention_heads, num_key_value_heads, head_dim,
    intermediate_size, rms_norm_eps, rope_theta/rope_scaling, vocab_size; EAGLE-3 also draft_vocab_size,
    target_hidden_size and the aux layer ids). Parameter names are the checkpoint's keys."""

    def __init__(self, kind: str, cfg: dict, target=None):
        super().__init__()
        if kind not in KINDS:
            raise EagleError(f"unknown EAGLE kind {kind!r}; choose from {', '.join(KINDS)}")
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        self.kind, self.cfg = kind, dict(cfg)
        H = cfg["hidden_size"]
        Ht = cfg.get("target_hidden_size") or H
        self.fc = nn.Linear(3 * Ht if kind == "eagle3" else 2 * H, H, bias=bool(cfg.get("fc_bias", False)))
        self.layers = nn.ModuleList([_Layer(kind, cfg)])
        if kind == "eagle3":
            self.norm = _RMSNorm(H, cfg["rms_norm_eps"])
            self.lm_head = nn.Linear(H, cfg["draft_vocab_size"], bias=False)
            self.register_buffer("d2t", torch.zeros(cfg["draft_vocab_size"], dtype=torch.long))
        self.rotary = LlamaRotaryEmbedding(_rope_config(cfg))
        self.heads, self.kv_heads, self.head_dim = cfg["num_attention_heads"], cfg["num_key_value_heads"], \
            cfg["head_dim"]
        self.aux_layers = tuple(cfg.get("eagle_aux_hidden_state_layer_ids") or ())
        self._target = (None,)
        if target is not None:
            self.bind(target)

    # ---- the target's shared pieces (not parameters of the head: never saved, never trained) -------------
    def bind(self, target) -> "EagleHead":
        H = self.cfg["hidden_size"]
        emb = target.get_input_embeddings()
        if emb.weight.shape[1] != H:
            raise EagleError(f"EAGLE head hidden size {H} does not match the target's embedding width "
                             f"{emb.weight.shape[1]}")
        V = int(emb.weight.shape[0])
        if int(self.cfg.get("vocab_size") or V) != V:
            raise EagleError(f"EAGLE head vocabulary {self.cfg['vocab_size']} does not match the target's {V}")
        Ht = self.cfg.get("target_hidden_size") or H
        if int(target.config.hidden_size) != Ht:
            raise EagleError(f"EAGLE head expects target features of width {Ht}, the target's hidden size is "
                             f"{target.config.hidden_size}")
        if self.kind == "eagle3" and not self.aux_layers:
            L = int(target.config.num_hidden_layers)
            self.aux_layers = (2, L // 2, L - 3)
        self._target = (target,)
        return self

    @property
    def target(self):
        return self._target[0]

    def embed(self, ids):
        return self.target.get_input_embeddings()(ids)

    def logits(self, h):
        """Logits over the TARGET vocabulary from the head's pre-norm output ``h`` (vLLM's compute_logits)."""
        if self.kind == "eagle":
            W = self.target.get_output_embeddings()
            return W(h.to(W.weight.dtype))
        lg = self.lm_head(self.norm(h))
        V = int(self.target.get_output_embeddings().weight.shape[0])
        out = lg.new_full((*lg.shape[:-1], V), float("-inf"))
        out[..., torch.arange(lg.shape[-1], device=lg.device) + self.d2t] = lg
        return out

    def argmax(self, h):
        """Greedy draft token ids (target vocabulary) from pre-norm outputs ``h``."""
        if self.kind == "eagle":
            return self.logits(h).argmax(-1)
        i = self.lm_head(self.norm(h)).argmax(-1)
        return i + self.d2t[i]

    def top1(self, h):
        """(greedy draft token ids, their probabilities) from pre-norm outputs ``h``: the ids are :meth:`argmax`'s
        (the same logits, the same argmax), the probability is the softmax of the logits the head drafts from
        (EAGLE-1: the target's LM head over its vocabulary; EAGLE-3: the head's own LM head over its draft
        vocabulary) at that token, i.e. the head's top-1 probability."""
        if self.kind == "eagle":
            lg = self.logits(h)
            i = lg.argmax(-1)
            return i, top1_prob(lg, i)
        lg = self.lm_head(self.norm(h))
        i = lg.argmax(-1)
        return i + self.d2t[i], top1_prob(lg, i)

    def combine(self, feats):
        """vLLM's combine_hidden_states: EAGLE-3 fuses the three aux features with ``fc``."""
        return self.fc(feats) if self.kind == "eagle3" else feats

    # ---- one layer, split so that attention can be done several ways --------------------------------
    def _pre(self, emb, hidden, positions):
        lay = self.layers[0]
        if self.kind == "eagle":
            x = self.fc(torch.cat([emb, hidden], dim=-1))
            res = x
        else:
            if self.cfg.get("norm_before_residual"):
                hidden = lay.hidden_norm(hidden)
                res = hidden
            else:
                res = hidden
                hidden = lay.hidden_norm(hidden)
            x = torch.cat([lay.input_layernorm(emb), hidden], dim=-1)
        a = lay.self_attn
        B, T = x.shape[:2]
        q = a.q_proj(x).view(B, T, self.heads, self.head_dim).transpose(1, 2)
        k = a.k_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        v = a.v_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        cos, sin = self.rotary(v, positions)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v, res

    def _post(self, attn, res):
        lay = self.layers[0]
        B, _, T, _ = attn.shape
        r = lay.self_attn.o_proj(attn.transpose(1, 2).reshape(B, T, -1)) + res
        return lay.mlp(lay.post_attention_layernorm(r)) + r

    def _rep(self, t):
        n = self.heads // self.kv_heads
        return t if n == 1 else t.repeat_interleave(n, dim=1)

    # ---- every depth of every chain at once (profiler, training) --------------------------------------
    def chain(self, tokens, feats, depth: int, valid_len: Sequence[int] | None = None) -> list[torch.Tensor]:
        """Pre-norm outputs of chained drafting for every start position, depths 1..``depth``.

        ``tokens``: (B, T) the token of each pair (x_{i+1}); ``feats``: (B, T, Hf) the target feature of each
        position (already combined for EAGLE-3 or not: raw aux features are fused here). Returns ``outs`` with
        ``outs[d-1][b, i]`` = the head's output at position i of the chain that started at pair s = i-d+1 (its
        argmax is that chain's draft number d). Right padding is harmless (causal)."""
        B, T = tokens.shape
        dev = tokens.device
        pos = torch.arange(T, device=dev)[None].expand(B, T)
        dt = self.fc.weight.dtype
        emb = self.embed(tokens).to(dt)
        feats = feats.to(dt)
        hid = self.combine(feats) if (self.kind == "eagle3" and feats.shape[-1] != self.cfg["hidden_size"]) \
            else feats
        scale = 1.0 / math.sqrt(self.head_dim)
        ii = torch.arange(T, device=dev)
        Ks, Vs, outs = [], [], []
        for d in range(1, depth + 1):
            q, k, v, res = self._pre(emb, hid, pos)
            k, v = self._rep(k), self._rep(v)
            Ks.append(k)
            Vs.append(v)
            # teacher-forced keys (depth 1) at j <= i-d+1
            s1 = torch.matmul(q, Ks[0].transpose(-1, -2)) * scale              # (B, h, T, T)
            s1 = s1.masked_fill(ii[None, :] > (ii[:, None] - d + 1), float("-inf"))
            parts, vals = [s1], []
            for e in range(2, d + 1):                                          # the chain's own keys
                sh = d - e
                ke = Ks[e - 1] if sh == 0 else F.pad(Ks[e - 1], (0, 0, sh, 0))[:, :, :T]
                ve = Vs[e - 1] if sh == 0 else F.pad(Vs[e - 1], (0, 0, sh, 0))[:, :, :T]
                se = (q * ke).sum(-1, keepdim=True) * scale                   # (B, h, T, 1)
                if sh:
                    se = se.masked_fill((ii < sh)[None, None, :, None], float("-inf"))
                parts.append(se)
                vals.append(ve)
            w = torch.softmax(torch.cat(parts, dim=-1).float(), dim=-1).to(q.dtype)
            attn = torch.matmul(w[..., :T], Vs[0])
            for j, ve in enumerate(vals):
                attn = attn + w[..., T + j: T + j + 1] * ve
            out = self._post(attn, res)
            outs.append(out)
            # next depth: pair i gets the head's output at i-1 (its own previous draft's hidden state)
            hid = F.pad(out, (0, 0, 1, 0))[:, :T]
        return outs


# ---- the target's features ----------------------------------------------------------------------------
def feature_layers(head: EagleHead):
    """What the target must expose: ``"final"`` (EAGLE-1) or the aux layer ids (EAGLE-3, hidden_states indices:
    the residual stream entering that layer)."""
    return "final" if head.kind == "eagle" else tuple(head.aux_layers)


def _features_from(out, layers) -> torch.Tensor:
    return out.last_hidden_state if layers == "final" else torch.cat([out.hidden_states[i] for i in layers], dim=-1)


@torch.no_grad()
def target_features(target, ids, layers) -> torch.Tensor:
    """One teacher-forced target pass over ``ids`` (B, N): features (B, N, Hf) of every position."""
    out = target.get_decoder()(input_ids=ids, use_cache=False, output_hidden_states=layers != "final")
    return _features_from(out, layers)


def _chain_outputs(head: EagleHead, prompt, output, k_max: int, feats=None):
    """(ids [1, N] of prompt + output, :meth:`EagleHead.chain`'s k_max pre-norm outputs over them), the target's
    features computed by one teacher-forced pass unless given."""
    dev = next(head.parameters()).device
    ids = torch.as_tensor([list(prompt) + list(output)], dtype=torch.long, device=dev)
    if feats is None:
        feats = target_features(head.target, ids[:, :-1], feature_layers(head))
    return ids, head.chain(ids[:, 1:], feats, k_max)


@torch.no_grad()
def eagle_chain_argmax(head: EagleHead, prompt, output, k_max: int, feats=None) -> list[torch.Tensor]:
    """Drafts of every chain over prompt + output: ``D[d-1][i]`` = draft number d of the chain whose first
    draft comes from pair i-d+1 (pairs i = 0 .. N-2 of the N = P + L tokens)."""
    _, outs = _chain_outputs(head, prompt, output, k_max, feats)
    return [head.argmax(o)[0] for o in outs]


def eagle_chain_acceptance(head: EagleHead, prompt, output, k_max: int, feats=None):
    """acc_len at every output position q for greedy chained EAGLE drafting (the step after o_q drafts from pair
    s = P+q-1: draft d is compared with o_{q+d}); capped at ``k_max`` and at the end of the output."""
    return eagle_chain_profile(head, prompt, output, k_max, feats, confidence=False)[0]


@torch.no_grad()
def eagle_chain_profile(head: EagleHead, prompt, output, k_max: int, feats=None, confidence: bool = True):
    """(acc_len [L], confidence [L, k_max] float32 or None) of greedy chained EAGLE drafting at every output
    position q, from one chained pass (:meth:`EagleHead.chain`).

    ``acc_len`` as :func:`eagle_chain_acceptance`. ``confidence[q, d-1]``: the head's top-1 probability
    (:meth:`EagleHead.top1`) of its draft number d in the chain that starts after o_q -- the draft compared with
    o_{q+d}; NaN where o_{q+d} lies past the output (q + d > L - 1). Teacher-forced as the acceptance: the chain
    carries the head's own hidden states and the true tokens, so for d <= acc_len[q] (every accepted draft and
    the first rejected one) it is the real chain's; past the first rejection the real chain would condition on
    its rejected draft instead."""
    import numpy as np

    P, L = len(prompt), len(output)
    if L < 2:
        return np.ones(L, dtype=np.int64), (np.full((L, k_max), np.nan, np.float32) if confidence else None)
    ids, outs = _chain_outputs(head, prompt, output, k_max, feats)
    D, Pr = [], []
    for o in outs:
        if confidence:
            i, pr = head.top1(o)
            D.append(i[0])
            Pr.append(pr[0])
        else:
            D.append(head.argmax(o)[0])
    full = ids[0]
    q = torch.arange(L, device=full.device)
    s = P + q - 1
    run = torch.ones(L, dtype=torch.bool, device=full.device)
    acc = torch.ones(L, dtype=torch.long, device=full.device)
    conf = torch.full((L, k_max), float("nan"), dtype=torch.float32, device=full.device) if confidence else None
    for d in range(1, k_max + 1):
        i = s + d - 1                        # where draft d of this chain sits
        tgt = P + q + d                      # o_{q+d}
        ok = tgt < P + L
        m = torch.zeros(L, dtype=torch.bool, device=full.device)
        m[ok] = D[d - 1][i[ok]] == full[tgt[ok]]
        run = run & m
        acc = acc + run.long()
        if confidence:
            conf[ok, d - 1] = Pr[d - 1][i[ok]].float()
    return acc.cpu().numpy(), (conf.cpu().numpy() if confidence else None)


# ---- checkpoints ---------------------------------------------------------------------------------------
def _detect(w: dict) -> str:
    keys = set(w)
    if "fc.weight" not in keys:
        raise EagleError("unknown EAGLE head layout: no 'fc.weight' (expected EAGLE-1 keys fc.weight [H, 2H] + "
                         "layers.0.*, or EAGLE-3 keys fc.weight [H, 3H] + midlayer.* + norm.weight + lm_head.weight"
                         " + d2t)")
    if "d2t" in keys or any(k.startswith("midlayer.") for k in keys):
        return "eagle3"
    if any(k.startswith("layers.0.") for k in keys):
        return "eagle"
    raise EagleError("unknown EAGLE head layout: 'fc.weight' but neither layers.0.* (EAGLE-1) nor midlayer.* "
                     "(EAGLE-3) keys")


def load_head(path, target, *, device=None, dtype=None) -> EagleHead:
    """Load an EAGLE-1/EAGLE-3 checkpoint directory (config.json + safetensors or .bin) for ``target``."""
    d = check_head_dir(path)
    cfg = read_config(d)
    w = _read_weights(d)
    kind = _detect(w)
    w = {k.replace("midlayer.", "layers.0."): v for k, v in w.items() if k not in ("t2d",)}
    w = {k: v for k, v in w.items() if not k.startswith(("embed_tokens.", "model.embed_tokens."))}
    if kind == "eagle":
        w.pop("layers.0.input_layernorm.weight", None)   # vLLM: identity for the first layer
        w.pop("lm_head.weight", None)
    cfg.setdefault("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    fcw = w["fc.weight"]
    if kind == "eagle3":
        cfg.setdefault("draft_vocab_size", int(w["lm_head.weight"].shape[0]) if "lm_head.weight" in w
                       else cfg["vocab_size"])
        cfg.setdefault("target_hidden_size", int(fcw.shape[1]) // 3)
        if "d2t" not in w:
            w["d2t"] = torch.zeros(cfg["draft_vocab_size"], dtype=torch.long)
    elif fcw.shape[1] != 2 * cfg["hidden_size"]:
        raise EagleError(f"EAGLE-1 fc.weight is {tuple(fcw.shape)}, expected ({cfg['hidden_size']}, "
                         f"{2 * cfg['hidden_size']}) for hidden size {cfg['hidden_size']}")
    cfg["fc_bias"] = "fc.bias" in w
    p = next(target.parameters())
    head = EagleHead(kind, cfg).to(dtype=dtype or p.dtype)
    own = head.state_dict()
    missing = sorted(k for k in own if k not in w and not k.startswith("rotary."))
    extra = sorted(k for k in w if k not in own)
    if missing or extra:
        raise EagleError(f"{d}: {kind} checkpoint keys do not match (missing {missing[:4]}, unexpected "
                         f"{extra[:4]})")
    for k, v in w.items():
        if own[k].shape != v.shape:
            raise EagleError(f"{d}: {k} has shape {tuple(v.shape)}, expected {tuple(own[k].shape)} from its "
                             "config.json")
    head.load_state_dict(w, strict=False)
    head.bind(target)
    head.source = d
    return head.to(device=device or p.device).requires_grad_(False).eval()


def new_head(target, kind: str = "eagle", *, seed: int = 0) -> EagleHead:
    """A freshly initialised head shaped after ``target`` (for training): one Llama layer of the target's width,
    attention layout and RoPE, float32 on the target's device."""
    c = target.config
    H = int(c.hidden_size)
    cfg = {"hidden_size": H, "num_attention_heads": int(c.num_attention_heads),
           "num_key_value_heads": int(getattr(c, "num_key_value_heads", c.num_attention_heads)),
           "head_dim": int(getattr(c, "head_dim", None) or H // c.num_attention_heads),
           "intermediate_size": int(c.intermediate_size), "rms_norm_eps": float(c.rms_norm_eps),
           "max_position_embeddings": int(c.max_position_embeddings),
           "vocab_size": int(target.get_input_embeddings().weight.shape[0]), "hidden_act": "silu"}
    rp = getattr(c, "rope_parameters", None) or {}
    cfg["rope_theta"] = float(rp.get("rope_theta", getattr(c, "rope_theta", 10000.0)))
    if rp.get("rope_type", "default") != "default":
        cfg["rope_scaling"] = dict(rp)
    if kind == "eagle3":
        L = int(c.num_hidden_layers)
        cfg.update(draft_vocab_size=cfg["vocab_size"], target_hidden_size=H,
                   eagle_aux_hidden_state_layer_ids=[2, L // 2, L - 3])
    g = torch.Generator().manual_seed(seed)
    head = EagleHead(kind, cfg)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    if kind == "eagle3":
        with torch.no_grad():
            head.lm_head.weight.copy_(target.get_output_embeddings().weight.detach().float().cpu())
    head.bind(target)
    return head.to(next(target.parameters()).device).float()


def save_head(head: EagleHead, out, *, extra_config: dict | None = None, dtype=torch.bfloat16) -> Path:
    """Write the head as a vLLM-loadable checkpoint directory (config.json + model.safetensors, each atomic)."""
    from safetensors.torch import save_file

    out = Path(out)
    cfg = {k: v for k, v in head.cfg.items() if k != "fc_bias"}
    cfg.update({"architectures": [ARCH[head.kind]], "model_type": "llama", "num_hidden_layers": 1,
                "torch_dtype": str(dtype).replace("torch.", ""), "tie_word_embeddings": False,
                **(extra_config or {})})
    if head.kind == "eagle3":
        cfg["eagle_aux_hidden_state_layer_ids"] = list(head.aux_layers)
    sd = {}
    for k, v in head.state_dict().items():
        if k.startswith("rotary."):
            continue
        if head.kind == "eagle3":
            k = k.replace("layers.0.", "midlayer.")
        sd[k] = v.detach().cpu().contiguous() if k == "d2t" else v.detach().to("cpu", dtype).contiguous()
    from ..guard import claim_dir, head_dir
    from ..io import atomic_path, atomic_write

    # never deletes or empties a folder: a new or empty one is claimed (marked), one marked by an earlier head
    # gets its files replaced one by one, atomically; any other folder is refused before anything is written
    out = head_dir(out, "head folder")
    fresh = not out.exists()
    try:
        with atomic_path(out / "model.safetensors") as tmp:
            save_file(sd, str(tmp), metadata={"format": "pt"})
        claim_dir(out, "spec_repro.proposers.eagle.save_head")
        with atomic_write(out / "config.json") as f:
            f.write(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    except BaseException:
        if fresh and out.is_dir():                               # made just now: nothing of anyone else's
            shutil.rmtree(out, ignore_errors=True)
        raise
    return out


# ---- the engine's proposer ----------------------------------------------------------------------------
class _HeadDecoder(nn.Module):
    """The head as a decoder that :class:`spec_repro.engines.torch.KVState` can drive (ragged batches, holes,
    truncation). The hidden input of the chunk being fed is set in ``self.hidden`` (B, m, H) beforehand."""

    def __init__(self, head: EagleHead):
        super().__init__()
        self.head = head
        self.hidden = None

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=True, past_key_values=None,
                output_hidden_states=False, **_):
        h = self.head
        q, k, v, res = h._pre(h.embed(input_ids), self.hidden, position_ids)
        k, v = past_key_values.update(k, v, 0)
        k, v = h._rep(k), h._rep(v)
        m, S = q.shape[2], k.shape[2]
        if attention_mask is None:     # no padding, no holes: causal with the cache in front
            ii = torch.arange(m, device=q.device)[:, None] + (S - m)
            attention_mask = torch.zeros(m, S, dtype=q.dtype, device=q.device).masked_fill(
                torch.arange(S, device=q.device)[None, :] > ii, torch.finfo(q.dtype).min)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask)
        return SimpleNamespace(last_hidden_state=h._post(a, res), hidden_states=None)


class _HeadLM(nn.Module):
    def __init__(self, head: EagleHead):
        super().__init__()
        self.head = head
        self.decoder = _HeadDecoder(head)
        self.out = _Logits(head)

    def get_decoder(self):
        return self.decoder

    def get_output_embeddings(self):
        return self.out


class _Logits(nn.Module):
    def __init__(self, head):
        super().__init__()
        self._h = (head,)

    def forward(self, h):
        return self._h[0].logits(h)


class EagleProposer(Proposer):
    """Greedy chained EAGLE drafting for :func:`spec_repro.engines.torch.generate` (vLLM's semantics, see the
    module doc). The engine hands it the target's features of every verified position (``add_features``)."""

    def __init__(self, head: EagleHead):
        from ..engines.torch import KVState

        self.head = head.eval()
        self.name = self.method = head.kind
        self.features = feature_layers(head)
        self.lm = _HeadLM(self.head)
        self.state = KVState(self.lm)
        self.done: list[int] = []
        self.pending: list[list[torch.Tensor]] = []

    def start(self, contexts):
        self.state.reset(len(contexts))
        self.done = [0] * len(contexts)
        self.pending = [[] for _ in contexts]

    def add_features(self, feats: Sequence[torch.Tensor]) -> None:
        """Target features (n_r, Hf) of the positions just verified, per current row."""
        for r, f in enumerate(feats):
            if f.shape[0]:
                self.pending[r].append(f)

    def select(self, rows):
        self.state.select(rows)
        self.done = [self.done[i] for i in rows]
        self.pending = [self.pending[i] for i in rows]

    @torch.no_grad()
    def propose(self, contexts, k):
        st, h = self.state, self.head
        if st.rows != len(contexts):
            raise RuntimeError("EagleProposer: batch changed without select()")
        st.truncate(self.done)                      # drop the last chain's drafts: verified pairs only
        chunks, hid = [], []
        for r, c in enumerate(contexts):
            f = torch.cat(self.pending[r]) if self.pending[r] else None
            n = 0 if f is None else f.shape[0]
            if self.done[r] + n != len(c) - 1:
                raise RuntimeError(f"EagleProposer: row {r} has features for {self.done[r] + n} of "
                                   f"{len(c) - 1} positions")
            chunks.append(list(c[self.done[r] + 1:]))    # pair i: token x_{i+1}
            hid.append(f)
        m = max(len(x) for x in chunks)
        Hf = next(x for x in hid if x is not None).shape[-1]
        p = next(h.parameters())
        buf = torch.zeros(len(chunks), m, Hf, dtype=p.dtype, device=p.device)
        for r, f in enumerate(hid):
            if f is not None:
                buf[r, : f.shape[0]] = f
        self.lm.decoder.hidden = h.combine(buf)
        logits = st.forward(st.prepare(chunks), logits="last")
        self.done = [d + len(x) for d, x in zip(self.done, chunks)]
        self.pending = [[] for _ in contexts]
        drafts = [[] for _ in contexts]
        last = st.last_h
        for i in range(k):
            nxt = logits.argmax(-1).tolist()
            for r, t in enumerate(nxt):
                drafts[r].append(int(t))
            if i + 1 < k:
                self.lm.decoder.hidden = last[:, None, :]
                logits = st.forward(st.prepare([[t] for t in nxt]), logits="last")
                last = st.last_h
        return drafts
