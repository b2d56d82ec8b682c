"""Where a measurement came from: machine, package versions, command, date. Every file under data/ has a
manifest entry written with ``record``."""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import sys
from importlib import metadata
from pathlib import Path

_PKGS = ("spec-repro", "numpy", "pandas", "torch", "transformers", "vllm", "gguf")


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(chunk), b""):
            h.update(b)
    return h.hexdigest()


def package_versions(names=_PKGS) -> dict[str, str]:
    out = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            pass
    return out


def machine_info() -> dict:
    info = {"host": platform.node(), "platform": platform.platform(), "python": sys.version.split()[0],
            "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count()}
    try:
        import torch

        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpu_count"] = torch.cuda.device_count()
            info["cuda"] = torch.version.cuda
    except Exception:
        pass
    return info


def record(manifest: str | Path, name: str, **fields) -> dict:
    """Add or replace entry ``name`` in a JSON manifest (a dict of entries), with machine/versions/date."""
    from filelock import FileLock

    manifest = Path(manifest)
    manifest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(manifest.parent / f".{manifest.name}.lock")):  # two writers never lose each other's entry
        return _record_locked(manifest, name, fields)


def _record_locked(manifest: Path, name: str, fields: dict) -> dict:
    from .io import atomic_write

    try:
        data = json.loads(manifest.read_text()) if manifest.exists() else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"{manifest}: not JSON ({e.msg}); fix or remove it") from None
    if not isinstance(data, dict):
        raise ValueError(f"{manifest}: expected a JSON object of entries; fix or remove it")
    entry = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
             "machine": machine_info(), "versions": package_versions(),
             "command": " ".join(sys.argv), **fields}
    data[name] = entry
    with atomic_write(manifest) as f:
        f.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    return entry
