"""The files of an EAGLE head checkpoint (vLLM's layout: config.json + model.safetensors or pytorch_model.bin),
checked before any model loads: a junk config, a damaged safetensors header or a pickle that is not plain tensors
is one clear ``EagleError`` line, never a traceback and never executed code."""
from __future__ import annotations

import json
from pathlib import Path

__all__ = ["EagleError", "check_head_dir", "head_identity", "read_config"]


def head_identity(path) -> dict:
    """A head checkpoint's weights by sha256: {file name: sha256} of its safetensors files (else its .bin files)."""
    from ..fetch import sha256_file

    w = sorted(Path(path).glob("*.safetensors")) or sorted(Path(path).glob("*.bin"))
    return {f.name: sha256_file(f) for f in w}


class EagleError(ValueError):
    """A head that cannot be loaded or does not fit its target (one clear line)."""


def _first(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:160]


def read_config(d: Path) -> dict:
    try:
        cfg = json.loads((Path(d) / "config.json").read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise EagleError(f"{d}/config.json is not a readable JSON config ({_first(e)})") from None
    if not isinstance(cfg, dict):
        raise EagleError(f"{d}/config.json is not a JSON object (expected a head's model config)")
    return cfg


def check_head_dir(path) -> Path:
    """The checkpoint directory, or one clear error naming what is missing or damaged (before any model is
    loaded): its config must be a JSON object and every safetensors file's header readable."""
    if not path:
        raise EagleError("proposer 'eagle' needs --eagle-head DIR (a head in vLLM's eagle/eagle3 layout: "
                         "config.json + model.safetensors, e.g. from `spec-repro train eagle`)")
    d = Path(path).expanduser()
    if not d.is_dir():
        raise EagleError(f"EAGLE head {d}: no such directory (expected config.json + model.safetensors)")
    if not (d / "config.json").is_file():
        raise EagleError(f"{d}: no config.json (expected an EAGLE head checkpoint directory)")
    if not (list(d.glob("*.safetensors")) or list(d.glob("pytorch_model*.bin"))):
        raise EagleError(f"{d}: no model.safetensors or pytorch_model.bin (expected an EAGLE head checkpoint)")
    read_config(d)
    from safetensors import safe_open

    for f in sorted(d.glob("*.safetensors")):
        try:
            with safe_open(str(f), framework="pt") as h:
                list(h.keys())
        except Exception as e:  # SafetensorError, OSError, ...: a damaged or foreign file
            raise EagleError(f"{f} is not a readable safetensors file ({_first(e)})") from None
    return d


def _read_weights(d: Path) -> dict:
    """Every tensor of the checkpoint; ``.bin`` files are read with ``weights_only=True`` (no code runs)."""
    import torch

    st = sorted(d.glob("*.safetensors"))
    w = {}
    try:
        if st:
            from safetensors.torch import load_file

            for f in st:
                w.update(load_file(str(f)))
            return w
        bins = sorted(d.glob("pytorch_model*.bin"))
        for f in bins:
            part = torch.load(str(f), map_location="cpu", weights_only=True)
            if not isinstance(part, dict) or not all(isinstance(v, torch.Tensor) for v in part.values()):
                raise EagleError(f"{f} does not hold a dict of tensors")
            w.update(part)
    except EagleError:
        raise
    except Exception as e:  # a damaged file, a pickle that is not plain tensors (refused, never run)
        raise EagleError(f"{d}: the head's weights cannot be read as plain tensors ({_first(e)})") from None
    if not w:
        raise EagleError(f"{d}: no model.safetensors or pytorch_model.bin (expected an EAGLE head checkpoint)")
    return w
