"""The files of an EAGLE head checkpoint (vLLM's layout: config.json + model.safetensors or pytorch_model.bin),
checked before any model loads: a junk config, a damaged safetensors header or a pickle that is not plain tensors
is one clear ``EagleError`` line, never a traceback and never executed code."""
from __future__ import annotations

import json
from pathlib import Path

__all__ = ["EagleError", "check_head_dir", "committed_head", "head_identity", "read_config", "resolve_parts"]

#: the EAGLE heads committed with the package (``data/heads/<folder>``), by target
COMMITTED_HEADS = {"qwen2.5-coder-1.5b": "qwen2.5-coder-1.5b-eagle", "smollm2-135m": "smollm2-135m-eagle"}


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


#: a head committed in parts (``spec_repro.parts``): its weights' manifest, beside config.json
PARTS_MANIFEST = "model.safetensors.parts.json"


def resolve_parts(d: Path) -> Path:
    """A head folder whose weights are committed in parts (``model.safetensors.parts.json`` beside its
    config.json) resolves to ``$SPEC_REPRO_CACHE/heads/<sha256>/``: the parts joined and verified (each part's
    sha256 and the whole file's), with the folder's config.json and TRAINING.json; a missing or altered part is
    one EagleError line naming it. A cached copy that verifies is used alone (the device machine, where the
    parts do not travel: ``gpu/stage_cache.sh`` stages the joined head). Any other folder is returned as is."""
    from ..io import atomic_write
    from ..parts import PartsError, cached

    man = d / PARTS_MANIFEST
    if not man.is_file() or (d / "model.safetensors").is_file():
        return d
    try:
        dest = cached(man, where="heads").parent
    except PartsError as e:
        raise EagleError(f"EAGLE head {d}: {e}") from None
    for name in ("config.json", "TRAINING.json"):
        src, dst = d / name, dest / name
        if src.is_file() and (not dst.is_file() or dst.read_bytes() != src.read_bytes()):
            with atomic_write(dst, "wb") as f:
                f.write(src.read_bytes())
    return dest


def committed_head(target: str) -> Path:
    """The head committed for ``target`` (``data/heads/``), ready to load: a head in parts joined and verified
    (:func:`resolve_parts`). EagleError when the package keeps none for it."""
    from ..locations import data_dir

    if target not in COMMITTED_HEADS:
        raise EagleError(f"no EAGLE head is committed for {target!r} (committed: {', '.join(COMMITTED_HEADS)})")
    return check_head_dir(data_dir() / "heads" / COMMITTED_HEADS[target])


def check_head_dir(path) -> Path:
    """The checkpoint directory, or one clear error naming what is missing or damaged (before any model is
    loaded): its config must be a JSON object and every safetensors file's header readable. A head committed
    in parts resolves to its joined, verified copy in the cache (:func:`resolve_parts`)."""
    if not path:
        raise EagleError("proposer 'eagle' needs --eagle-head DIR (a head in vLLM's eagle/eagle3 layout: "
                         "config.json + model.safetensors, e.g. from `spec-repro train eagle`)")
    d = Path(path).expanduser()
    if not d.is_dir():
        raise EagleError(f"EAGLE head {d}: no such directory (expected config.json + model.safetensors)")
    if not (d / "config.json").is_file():
        raise EagleError(f"{d}: no config.json (expected an EAGLE head checkpoint directory)")
    d = resolve_parts(d)
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
