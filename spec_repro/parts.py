"""Large files committed in parts: a file of at most 16 MiB a part (what one device call brings back, and a size git
hosts take), each part's sha256 and the whole file's in ``<name>.parts.json`` beside them.

- ``split(src, dest_dir)`` writes ``<name>.part0 ..`` and ``<name>.parts.json``;
- ``assemble(manifest, out)`` checks every part (present, its size, its sha256), concatenates them into ``out``
  atomically and checks the whole file's sha256; any missing or altered part is one :class:`PartsError` line
  naming it, and nothing is written;
- ``cached(manifest)``: the file reassembled once under ``$SPEC_REPRO_CACHE/parts/<sha256>/<name>`` (or another
  folder of the cache) and verified (hashed again on every call: size and mtime are never taken as proof).

The EAGLE heads (``spec_repro.proposers.eagle_files``) and the heads' training decodes use it.
"""
from __future__ import annotations

import json
from pathlib import Path

from .fetch import cache_root, sha256_file, verify_file
from .io import atomic_path, atomic_write

__all__ = ["PartsError", "PART_BYTES", "split", "assemble", "cached", "manifest_of", "read_manifest"]

#: the largest part: 16 MiB (a device call brings back files of at most 16 MiB)
PART_BYTES = 16 * 1024 * 1024


class PartsError(ValueError):
    """A file's parts that are missing, altered or not described by a readable manifest (one clear line)."""


def manifest_of(path: str | Path) -> Path:
    """The parts manifest of the file ``path`` (``<path>.parts.json``)."""
    p = Path(path)
    return p.with_name(p.name + ".parts.json")


def split(src: str | Path, dest_dir: str | Path, *, part_bytes: int = PART_BYTES, name: str | None = None) -> Path:
    """Cut ``src`` into parts of at most ``part_bytes`` under ``dest_dir`` (``<name>.part<i>``) and write their
    manifest (file name, size, sha256, and each part's); returns the manifest's path. Parts of an earlier split
    of another file under the same name are removed only when the new manifest replaced theirs."""
    src, dest = Path(src), Path(dest_dir)
    if not 0 < part_bytes <= PART_BYTES:
        raise PartsError(f"part size {part_bytes} outside 1..{PART_BYTES} bytes")
    name = name or src.name
    dest.mkdir(parents=True, exist_ok=True)
    parts = []
    with open(src, "rb") as f:
        for i, chunk in enumerate(iter(lambda: f.read(part_bytes), b"")):
            p = dest / f"{name}.part{i}"
            with atomic_path(p) as tmp:
                Path(tmp).write_bytes(chunk)
            parts.append({"name": p.name, "bytes": len(chunk), "sha256": sha256_file(p)})
    man = {"file": name, "bytes": sum(p["bytes"] for p in parts), "sha256": sha256_file(src), "parts": parts}
    m = manifest_of(dest / name)
    old = read_manifest(m) if m.is_file() else None
    with atomic_write(m) as fh:
        fh.write(json.dumps(man, indent=1) + "\n")
    if old:
        keep = {p["name"] for p in parts}
        for p in old["parts"]:
            if p["name"] not in keep:
                (dest / p["name"]).unlink(missing_ok=True)
    return m


def read_manifest(manifest: str | Path) -> dict:
    """A parts manifest, checked for shape (PartsError naming the file otherwise)."""
    m = Path(manifest)
    try:
        man = json.loads(m.read_text())
        ok = (isinstance(man, dict) and isinstance(man.get("file"), str) and isinstance(man.get("sha256"), str)
              and len(man["sha256"]) == 64 and isinstance(man.get("parts"), list) and man["parts"]
              and all(isinstance(p, dict) and isinstance(p.get("name"), str) and "/" not in p["name"]
                      and isinstance(p.get("sha256"), str) and isinstance(p.get("bytes"), int) for p in man["parts"]))
    except (OSError, ValueError) as e:
        raise PartsError(f"{m}: not a readable parts manifest ({(str(e).splitlines() or [''])[0][:120]})") from None
    if not ok or "/" in man["file"]:
        raise PartsError(f"{m}: not a parts manifest (file, sha256 and a list of parts with name, bytes, sha256)")
    return man


def assemble(manifest: str | Path, out: str | Path) -> Path:
    """Join the parts that ``manifest`` lists (beside it) into ``out``, verified part by part and whole; a missing,
    short or altered part is a PartsError naming it, before anything is written."""
    m = Path(manifest)
    man = read_manifest(m)
    where = m.parent
    for i, p in enumerate(man["parts"]):
        f = where / p["name"]
        if not f.is_file():
            raise PartsError(f"{man['file']}: part {i} ({f}) is missing; {len(man['parts'])} parts are listed in "
                             f"{m.name} (restore it from the repository: git checkout -- {f})")
        if f.stat().st_size != p["bytes"] or sha256_file(f) != p["sha256"]:
            raise PartsError(f"{man['file']}: part {i} ({f}) is altered: its sha256 is not the one {m.name} "
                             f"records (restore it: git checkout -- {f})")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:
        with open(tmp, "wb") as fo:
            for p in man["parts"]:
                fo.write((where / p["name"]).read_bytes())
        got = sha256_file(tmp)
        if got != man["sha256"]:
            raise PartsError(f"{man['file']}: the joined parts hash to {got[:12]}…, {m.name} records "
                             f"{man['sha256'][:12]}…: the manifest and its parts disagree")
    return out


def cached(manifest: str | Path, where: str = "parts") -> Path:
    """The file ``manifest`` describes, reassembled once under ``$SPEC_REPRO_CACHE/<where>/<sha256>/`` and
    verified on every call. Where the parts are absent (a machine they were not sent to) a cached copy that
    verifies is used alone."""
    man = read_manifest(manifest)
    out = cache_root() / where / man["sha256"] / man["file"]
    if verify_file(out, man["sha256"]):
        return out
    return assemble(manifest, out)
