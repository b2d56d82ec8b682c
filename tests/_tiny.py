"""A tiny randomly initialised Llama (real PyTorch/transformers model, synthetic weights) for engine tests.

float64 keeps the engine's different batchings of the same computation bit-close, so greedy argmax ties cannot
flip between a verify pass and a one-token pass."""
from __future__ import annotations

import torch

VOCAB = 48


def tiny_llama(seed: int = 0, layers: int = 4, vocab: int = VOCAB):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    return LlamaForCausalLM(cfg).to(torch.float64).eval()


def prompts(lengths=(5, 17, 9), seed: int = 1, vocab: int = VOCAB, repeat: bool = True):
    g = torch.Generator().manual_seed(seed)
    ps = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]
    if repeat and len(ps) > 1:
        ps[1] = ps[1] + ps[1][:8]  # some prompt repetition for the n-gram proposer
    return ps


def hf_greedy(model, prompt, max_new_tokens):
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids),
                         max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def profile_all(target, proposers, *, k_max, max_new_tokens):
    """Every request of ``prompts()`` profiled with ``proposers`` (batches of 2, no EOS), as one list."""
    from spec_repro.profiler import profile_requests

    out = []
    for batch in profile_requests(target, prompts(), proposers, k_max=k_max, max_new_tokens=max_new_tokens,
                                  batch_size=2, eos_token_ids=[]):
        out.extend(batch)
    return out
