"""Where a measurement came from. Writing: machine, package versions, command and date, recorded with ``record``
in a folder's ``MANIFEST.json`` (every file under data/ has an entry, most with the ``sha256`` of the file's
bytes). Reading: ``verify_recorded(path)`` (from ``spec_repro.manifests``) checks a file against the sha256 its
folder's MANIFEST.json records for it before the package reads it (a changed file is one ``ChangedFileError``
line naming it; a file without such an entry, e.g. a user's own, reads as it is), and one-line and multi-line
descriptions of a trace or a measured file for captions and the summary table."""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from .fetch import sha256_file  # hashing a file needs no trace type (models and workloads import fetch)
from .manifests import ChangedFileError, ManifestError, check_manifest, recorded_sha256, verify_recorded

if TYPE_CHECKING:
    from .traces import Trace

__all__ = ["sha256_file", "package_versions", "machine_info", "record", "check_manifest", "ManifestError",
           "ChangedFileError", "recorded_sha256", "verify_recorded",
           "describe_source",
           "short_source", "trace_provenance", "manifest_line"]

_PKGS = ("spec-repro", "numpy", "pandas", "torch", "transformers", "vllm", "gguf")


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


def machine_name(m: dict | None = None) -> str:
    """A machine as a manifest's ``machine`` entry records it (default: this one), in a word: its GPU, else its CPU."""
    m = machine_info() if m is None else m
    return m.get("gpu") or m.get("cpu") or "?"


def record(manifest: str | Path, name: str, **fields) -> dict:
    """Add or replace entry ``name`` in a JSON manifest (a dict of entries), with machine/versions/date."""
    from filelock import FileLock

    manifest = Path(manifest)
    manifest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(manifest.parent / f".{manifest.name}.lock")):  # two writers never lose each other's entry
        return _record_locked(manifest, name, fields)


def update_entry(manifest: str | Path, name: str, **fields) -> dict:
    """Merge ``fields`` into the existing entry ``name`` of a JSON manifest, keeping its date, machine and command
    (where the file was first made): for a file recomputed from the same measurements, e.g. its new sha256 and a
    note of the recomputation. KeyError when there is no such entry."""
    from filelock import FileLock

    manifest = Path(manifest)
    with FileLock(str(manifest.parent / f".{manifest.name}.lock")):
        data = check_manifest(manifest)
        if name not in data:
            raise KeyError(f"{manifest}: no entry {name!r} to update")
        data[name] = {**data[name], **fields}
        _save(manifest, data)
    return data[name]


def _record_locked(manifest: Path, name: str, fields: dict) -> dict:
    data = check_manifest(manifest)
    entry = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
             "machine": machine_info(), "versions": package_versions(),
             "command": " ".join(sys.argv), **fields}
    data[name] = entry
    _save(manifest, data)
    return entry


def _save(manifest: Path, data: dict) -> None:
    """The manifest's entries written whole, atomically (its lock held by the caller)."""
    from .io import atomic_write

    with atomic_write(manifest) as f:
        f.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


# ---- reading: what a trace or a measured file is ----------------------------------------------------------

def describe_source(trace: Trace) -> str:
    """One line naming what a trace is: models, datasets, proposers, request count, and where it came from."""
    n = trace.requests.groupby("dataset", observed=True).size()
    ds = ", ".join(f"{d} ({c})" for d, c in n.items())
    metas = _metas(trace)
    fmt = "the study's published JSON lines" if any(m.get("study_file") for m in metas) else \
        ("JSON lines (not the study's published files)" if any(m.get("format") == "published-jsonl" for m in metas)
         else "spec_repro parquet")
    return (f"model {', '.join(trace.models)}; proposers {', '.join(trace.proposers)}; "
            f"requests per dataset {ds}; {fmt} traces")


def short_source(trace: Trace) -> str:
    """A one-line source for captions and the summary table: model, requests per dataset, trace kind, engine."""
    metas = _metas(trace)
    published = any(m.get("study_file") for m in metas)
    other_jsonl = any(m.get("format") == "published-jsonl" and not m.get("study_file") for m in metas)
    engines = sorted({f"{m['engine']}" + (f" on {m['device']}" if m.get("device") else "")
                      for m in metas if m.get("engine")})
    kind = "the study's published traces (vLLM, H100)" if published else \
        ("JSON-lines traces (not the study's published files)" if other_jsonl else "spec_repro traces")
    if published and other_jsonl:
        kind += " and other JSON-lines traces"
    eng = f", {'; '.join(engines)}" if engines else ""
    eng += ", collected live just now" if any(m.get("live") for m in metas) else ""
    per_model = []
    for mdl, g in trace.requests.groupby("model", observed=True):
        n = g.groupby("dataset", observed=True).size()
        per_model.append(f"{mdl}: {', '.join(f'{d} {c}' for d, c in n.items())} requests")
    return f"{'; '.join(per_model)}; {kind}{eng}"


def _metas(trace: Trace) -> list[dict]:
    m = trace.meta or {}
    return list(m.get("parts", [])) + [m]



_PROV_KEYS = ("engine", "device", "machine", "hardware", "model_file_sha256", "command", "date", "k_max")


def trace_provenance(trace: Trace) -> str:
    """What the trace is and where it came from (engine, machine, date when the files record them)."""
    parts = [describe_source(trace)]
    seen = []
    for m in _metas(trace):
        bits = []
        for key in _PROV_KEYS:
            v = m.get(key)
            if v in (None, "", [], {}):
                continue
            if isinstance(v, dict):  # machine info: keep what identifies it
                v = ", ".join(f"{a}={v[a]}" for a in ("cpu", "cpu_count", "gpu", "platform") if a in v) or str(v)
            bits.append(f"{key}: {v}")
        line = "; ".join(bits)
        if line and line not in seen:
            seen.append(line)
    if seen:
        parts.append(" | ".join(seen[:3]) + (f" (+{len(seen) - 3} more)" if len(seen) > 3 else ""))
    files = (trace.meta or {}).get("files")
    if files:
        parts.append("files: " + ", ".join(Path(f).name for f in files))
        for f in files:  # the collection manifest next to the file: model checksum, machine, versions, date
            man = Path(f).parent / "MANIFEST.json"
            e = check_manifest(man).get(Path(f).name)
            if not e:
                continue
            m, v = e.get("machine", {}), e.get("versions", {})
            parts.append(f"  {Path(f).name}: {e.get('n_requests', '?')} requests, {e.get('date', '?')}, "
                         f"{e.get('model_file', e.get('model', '?'))} (sha256 {str(e.get('model_file_sha256', '?'))[:12]}), "
                         f"{e.get('engine', '?')} on {e.get('device', '?')} ({_machine(m)}), torch {v.get('torch', '?')}, "
                         f"{e.get('decoding', '?')} decoding, max {e.get('max_new_tokens', '?')} new tokens"
                         + _short_line(e.get("short_outputs")) + _rewritten_line(e))
    return "\n".join(parts)


def _machine(m: dict) -> str:
    """The machine a manifest entry records: its GPU where it had one, cores, platform."""
    gpu = [m["gpu"]] if m.get("gpu") else []
    return ", ".join(gpu + [f"{m.get('cpu_count', '?')} cores", str(m.get("platform", "?"))])


def _rewritten_line(e: dict) -> str:
    """A trace written again in place (``collect`` adding proposers or ``--reprofile``): the date and machine of the
    line are the last write's; its outputs were decoded earlier, where ``original_run`` says."""
    o = e.get("original_run")
    if not isinstance(o, dict):
        return ""
    since = sorted(set(e.get("added_proposers") or []) | set(e.get("reprofiled") or {}))
    return (f"; outputs decoded {str(o.get('date', '?'))[:10]} on {machine_name(o.get('machine') or {})}"
            + (f", {', '.join(since)} profiled since" if since else ""))


def _short_line(short) -> str:
    """The outputs a collection left out of the trace for being short (``collect --min-output-len``)."""
    if not isinstance(short, dict):
        return ""
    return (f"; {short.get('requests', '?')} of {short.get('of_decoded', '?')} decoded outputs under "
            f"{short.get('min_output_len', '?')} tokens left out (the manifest's short_outputs)")


def manifest_line(folder: Path, files: Sequence[Path]) -> str:
    """A one-line provenance from ``folder/manifest.json`` entries that mention the files (or all entries)."""
    man = next((folder / n for n in ("MANIFEST.json", "manifest.json") if (folder / n).exists()), folder / "manifest.json")
    if not man.exists():
        return f"files {', '.join(f.name for f in files)} (no manifest.json)"
    data = check_manifest(man)
    names = {f.name for f in files} | {f.stem for f in files}
    entries = [(k, v) for k, v in data.items() if isinstance(v, dict)]
    # the files' own entries first, then entries that mention them (e.g. a fit made from them), then any
    hits = ([v for k, v in entries if k in names or Path(k).name in names]
            or [v for k, v in entries if any(n in json.dumps(v) for n in names)]
            or [v for _, v in entries])
    bits = []
    for v in hits[:1]:
        if not (v.get("machine") or v.get("gpu") or v.get("versions")) and isinstance(data.get("engines"), list):
            # a job's summary (``files``: sha256 per file; ``engines``: each engine's record): the first engine's env
            env = next((e["env"] for e in data["engines"] if isinstance(e, dict) and isinstance(e.get("env"), dict)),
                       {})
            v = {"gpu": env.get("nvidia_smi") or env.get("gpu"),
                 "versions": {p: env[p] for p in ("vllm", "torch") if env.get(p)}}
        m = v.get("machine", {}) if isinstance(v.get("machine"), dict) else {}
        gpu = v.get("gpu") or m.get("gpu") or m.get("cpu")
        if isinstance(gpu, str) and "\n" in gpu:   # one nvidia-smi line per GPU: say it once, with the count
            lines = [x.strip() for x in gpu.splitlines() if x.strip()]
            gpu = lines[0] + (f" (x{len(lines)})" if len(set(lines)) == 1 else "; " + "; ".join(lines[1:]))
        ver = v.get("versions", {}) if isinstance(v.get("versions"), dict) else {}
        eng = ", ".join(f"{p} {ver[p]}" for p in ("vllm", "torch") if p in ver)
        bits += [str(x) for x in (gpu, eng, v.get("date")) if x]
    return f"{', '.join(f.name for f in files[:4])}{' ...' if len(files) > 4 else ''}" + \
        (f" ({'; '.join(bits)})" if bits else "")
