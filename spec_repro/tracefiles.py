"""Read a trace file of any format: the package's parquet (``Trace.from_parquet``) or the study's published
JSON lines (``spec_repro.published``). It sits above both, so the schema (``spec_repro.traces``) imports no
reader and ``published`` imports only the schema: the data flow has no import circle."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from .published import read_published_cached
from .traces import Trace, TraceError

__all__ = ["read_trace", "read_traces"]


def read_trace(path: str | Path, **kw) -> Trace:
    """Read one trace file: the package's parquet, or the study's JSON lines (``.jsonl``/``.json``)."""
    p = Path(path)
    if p.exists() and not p.is_file():
        raise TraceError(f"{p}: not a regular file")
    if p.suffix == ".parquet":
        if kw.get("dataset"):
            t = Trace.from_parquet(p)
            t.acc["dataset"] = kw["dataset"]
            t.requests["dataset"] = kw["dataset"]
            return Trace(t.acc, t.requests, t.meta)
        return Trace.from_parquet(p)
    if p.suffix in (".jsonl", ".json"):
        return read_published_cached(p, **kw)
    raise TraceError(f"{p}: unknown trace format {p.suffix!r} (expected .parquet, .jsonl or .json)")


def read_traces(paths: Iterable[str | Path], **kw) -> Trace:
    return Trace.concat(read_trace(p, **kw) for p in paths)
