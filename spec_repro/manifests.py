"""A folder's ``MANIFEST.json`` read, and a file checked against it (below the trace schema, the readers and
``provenance``, which writes manifests and re-exports these).

- ``check_manifest(path)``: the entries ({} when there is none); a cut or foreign manifest is one
  ``ManifestError`` line naming it.
- ``verify_recorded(path)``: ``path`` after checking that its bytes hash to the ``sha256`` its folder's
  MANIFEST.json records for it (the entry named by the file, or whose ``file`` is it); a changed file is one
  ``ChangedFileError`` line naming it and both hashes. A file with no recorded sha256 (a user's own) is not
  checked. Each file is hashed once per process and version (cached by path, mtime, size and inode).
"""
from __future__ import annotations

import json
from pathlib import Path

from .fetch import sha256_file

__all__ = ["ManifestError", "ChangedFileError", "check_manifest", "recorded_sha256", "verify_recorded"]


class ManifestError(ValueError):
    """A MANIFEST.json that is not a readable JSON object of entries (cut, damaged, foreign); the message, one
    line, names the file."""


def check_manifest(manifest: str | Path) -> dict:
    """The entries of a JSON manifest ({} when there is none); ManifestError (a ValueError) with one line
    naming the file when it is not a JSON object of entries. Commands call it before their work, so a bad
    manifest never fails a finished run; readers of entries call it too, so a cut manifest is never a bare
    JSONDecodeError."""
    manifest = Path(manifest)
    if not manifest.exists():
        return {}
    try:
        data = json.loads(manifest.read_bytes().decode("utf-8"))
    except (ValueError, RecursionError, OSError) as e:
        raise ManifestError(f"{manifest}: not a readable JSON manifest ({type(e).__name__}); fix, move or "
                            f"remove it (nothing was written)") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{manifest}: expected a JSON object of entries; fix, move or remove it (nothing "
                            f"was written)")
    return data


class ChangedFileError(ManifestError):
    """A file whose bytes no longer hash to the sha256 its folder's MANIFEST.json records; the message, one line,
    names the file and both hashes."""


_MANIFESTS: dict = {}   # (manifest, mtime_ns, size) -> {file name: recorded sha256}
_HASHES: dict = {}      # (file, mtime_ns, size, inode) -> sha256 of its bytes: each file hashed once per process


def _stamp(p: Path) -> tuple:
    st = p.stat()
    return str(p.resolve()), st.st_mtime_ns, st.st_size, st.st_ino


def recorded_sha256(path: str | Path) -> tuple[str, Path] | None:
    """(sha256, manifest) that the ``MANIFEST.json`` beside ``path`` records for it (the entry named by the file's
    name, or whose ``file`` is that name), or None when there is no such manifest, entry or 64-digit sha256.
    The manifest is parsed once per process and version (cached by path, mtime and size)."""
    p = Path(path)
    man = p.parent / "MANIFEST.json"
    try:
        key = _stamp(man)[:3]
    except OSError:
        return None
    shas = _MANIFESTS.get(key)
    if shas is None:
        shas = {}
        for k, e in check_manifest(man).items():
            if isinstance(e, dict) and isinstance(e.get("sha256"), str) and len(e["sha256"]) == 64:
                name = e.get("file") if isinstance(e.get("file"), str) else k
                shas[name] = e["sha256"]
        if len(_MANIFESTS) > 256:
            _MANIFESTS.clear()
        _MANIFESTS[key] = shas
    want = shas.get(p.name)
    return (want, man) if want else None


def verify_recorded(path: str | Path) -> Path:
    """``path``, after checking that its bytes hash to the sha256 its folder's MANIFEST.json records for it;
    ChangedFileError (one line naming the file) when they do not. A file without a recorded sha256 (no manifest
    beside it, no entry, an entry without sha256: a user's own files) is returned unchecked. Each file is hashed
    once per process and version (cached by path, mtime, size and inode; ~1 ms per MB)."""
    p = Path(path)
    rec = recorded_sha256(p)
    if rec is None or not p.is_file():
        return p
    want, man = rec
    key = _stamp(p)
    got = _HASHES.get(key)
    if got is None:
        got = _HASHES[key] = sha256_file(p)
    if got != want:
        raise ChangedFileError(f"{p}: changed since it was recorded (sha256 {got[:12]}…, {man} records "
                               f"{want[:12]}…); restore it with `git checkout -- {p}` or make it again with the "
                               f"command its MANIFEST.json entry names")
    return p
