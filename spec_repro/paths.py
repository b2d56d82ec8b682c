"""Where things live and how to load them: the checkout's ``data/`` and ``figures/`` folders (like
showyourwork's ``paths.data / ...``; defined in ``spec_repro.locations``, below every module, and re-exported
here) and the notebooks' ``traces=`` parameter resolved to files and read (above the trace readers)."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .locations import V1_STUDIES, data_dir, figures_dir, repo_root, v1_runner_dir
from .tracefiles import read_trace
from .traces import STUDY_MODEL, Trace, TraceError

__all__ = ["repo_root", "data_dir", "figures_dir", "V1_STUDIES", "v1_runner_dir", "trace_files", "load_traces",
           "PUBLISHED_MODEL"]


def trace_files(traces=None, *, model: str | None = None, datasets: Sequence[str] | None = None) -> list[Path]:
    """Resolve the notebooks' ``traces=`` parameter to files.

    ``None`` means the committed embedded traces (``data/traces/*.parquet``); a string may be a file, a
    directory or a glob; a list mixes those. ``model`` keeps files whose name contains it (case-insensitive,
    e.g. ``"smollm2"``); ``datasets`` keeps files whose name contains one of them."""
    if traces is None:
        items: list = [data_dir() / "traces"]
    elif isinstance(traces, (str, Path)):
        items = [traces]
    else:
        items = list(traces)
    files: list[Path] = []
    for it in items:
        p = Path(it).expanduser()
        if p.is_dir():
            files += sorted(p.glob("*.parquet")) + sorted(p.glob("*.jsonl"))
        elif any(ch in str(it) for ch in "*?["):
            files += sorted(Path().glob(str(it))) if not p.is_absolute() else sorted(Path("/").glob(str(p)[1:]))
        elif p.exists():
            files.append(p)
        else:
            raise TraceError(f"{p}: no such trace file or directory")
    files = [f for f in files if not f.name.endswith(".tmp") and not f.name.startswith(".")]
    if model:
        files = [f for f in files if model.lower() in f.name.lower()]
    if datasets:
        files = [f for f in files if any(d.lower() in f.name.lower() for d in datasets)]
    if not files:
        raise TraceError(f"no trace files found for traces={traces!r}, model={model!r}, datasets={datasets!r}")
    return files


#: The model the study's published traces were measured with (its JSON lines do not say).
PUBLISHED_MODEL = STUDY_MODEL


def load_traces(traces=None, *, model: str | None = None, datasets: Sequence[str] | None = None,
                published_model: str = PUBLISHED_MODEL) -> Trace:
    """Read and concatenate the trace files ``trace_files`` resolves (parquet or JSON lines). Labels come from
    the data: the study's own JSON-lines files, recognized by content, are labelled ``published_model``; any
    other JSON-lines file by the model its records name (else ``unknown``), never by its extension."""
    files = trace_files(traces, model=model, datasets=datasets)

    def one(f):
        t = read_trace(f)
        if t.meta.get("study_file") and published_model != STUDY_MODEL:
            t.acc["model"], t.requests["model"] = published_model, published_model
            t = Trace(t.acc, t.requests, t.meta)
        return t

    t = Trace.concat(one(f) for f in files)
    t.meta["files"] = [str(f) for f in files]
    return t
