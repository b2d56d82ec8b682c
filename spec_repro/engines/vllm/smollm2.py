"""SmolLM2-135M with real weights on vLLM: its prompts (the embedded workloads through its chat template, as the
torch engine's collection selects them) and its GGUF de-quantized to a float32 folder vLLM loads, with a digest
that shows both engines run identical weights."""
from __future__ import annotations

import json
from pathlib import Path

from ...io import atomic_write

__all__ = ["SMOL_WORKLOADS", "prepare_smollm2_prompts", "tensor_digest", "convert_gguf"]

SMOL_WORKLOADS = ("code-edit", "sharegpt", "humaneval", "mt-bench", "gsm-symbolic")


def prepare_smollm2_prompts(out: str | Path, workloads=SMOL_WORKLOADS, n: int = 40, seed: int = 0,
                            max_prompt_tokens: int = 1024) -> Path:
    """Token-id prompts of the embedded workloads through SmolLM2's chat template: the same selection as the
    torch engine's collection (``spec_repro.collect``: n=40, seed 0, prompts <= 1024 tokens). Runs on the CPU."""
    from transformers import AutoTokenizer

    from ... import models
    from ... import workloads as wl

    models._convert("smollm2-135m", quiet=True)
    tok = AutoTokenizer.from_pretrained(models.converted_dir("smollm2-135m"))
    from transformers import GenerationConfig

    gc = GenerationConfig.from_pretrained(models.converted_dir("smollm2-135m"))
    eos = sorted({int(x) for x in ([gc.eos_token_id] if isinstance(gc.eos_token_id, int) else gc.eos_token_id or [])}
                 | ({int(tok.eos_token_id)} if tok.eos_token_id is not None else set()))
    out = Path(out)
    with atomic_write(out) as f:
        for w in workloads:
            for r in wl.load(w, n=n, seed=seed, tokenizer=tok, max_prompt_tokens=max_prompt_tokens):
                f.write(json.dumps({"key": f"{w}/{r.id}", "dataset": w, "request_id": str(r.id),
                                    "prompt_token_ids": list(map(int, r.prompt_token_ids)), "eos": eos}) + "\n")
    return out


def tensor_digest(state: dict) -> str:
    """sha256 over (name, float32 bytes) of every tensor, in name order: the same weights give the same digest
    whatever file layout or library version wrote them."""
    import hashlib

    import torch

    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def convert_gguf(gguf: str | Path, out: str | Path) -> dict:
    """De-quantize a GGUF (transformers + gguf) to a float32 HF folder vLLM can load; returns its digest."""
    import torch
    from transformers import AutoModelForCausalLM

    gguf = Path(gguf)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.save_pretrained(out)
    return {"out": str(out), "digest": tensor_digest(model.state_dict()), "params": sum(p.numel() for p in model.parameters())}
