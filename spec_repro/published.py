"""The study's published acceptance traces (SpecDecode-Bench/simulator ``combined_<dataset>.jsonl``): one JSON
object per request, read into the package's ``Trace`` schema with a clear error for every malformed line."""
from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .traces import STUDY_FILES, STUDY_MODEL, STUDY_SOURCE, Trace, TraceError, _check_acc_array, dataset_from_path, \
    too_long_number

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["read_published_jsonl", "read_published_cached", "with_ngram_draft_len", "draft_position_table",
           "write_draft_position_table", "read_draft_position_rates", "STUDY_REPO", "STUDY_TRACE_DIR",
           "DRAFT_POSITION_KS"]

_PUBLISHED_ACC = re.compile(r"^acc(?:_(?P<name>[A-Za-z0-9][A-Za-z0-9_.\-]*))?$")


def read_published_jsonl(path: str | Path, *, dataset: str | None = None, model: str | None = None,
                         proposer: str | None = None, k_max: int | None = None, strict: bool = False) -> Trace:
    """Read the study's published trace format (one JSON object per line).

    Keys: ``id``, ``prompt_token_ids``, ``generated_token_ids`` and per proposer ``acc_<name>`` (e.g.
    ``acc_ngram``, ``acc_eagle``) or a single ``acc``, each an object whose ``acc_len`` is a list of ints (or that
    list as a JSON string). A single ``acc`` needs ``proposer=`` unless the file name names one proposer.
    Requests whose arrays are empty are skipped; every other deviation raises TraceError with the line number.

    In the released files, ``acc_ngram`` has one entry per generated token but ``acc_eagle`` often has more or
    fewer (EAGLE's own run generated a different output): L is the shortest array, as the study takes it. Such
    requests are counted in ``meta['length_mismatch']``; ``strict=True`` makes any array whose length differs
    from ``generated_token_ids`` by more than one an error instead.

    Provenance comes from the data, never from the file name: the study's own files are recognized by their
    sha256 (``STUDY_FILES``; ``meta['study_file']``, model ``STUDY_MODEL``); any other file is labelled with
    ``model=`` if given, else the ``model`` field its records carry (``Trace.to_published_jsonl`` writes one),
    else ``unknown``."""
    import hashlib

    path = Path(path)
    if not path.exists():
        raise TraceError(f"{path}: no such trace file")
    if not path.is_file():
        raise TraceError(f"{path}: not a regular file")
    given_dataset = dataset
    dataset = dataset or dataset_from_path(path)
    digest = hashlib.sha256()
    rec_models: set = set()
    arrays: dict[str, dict[str, list[int]]] = {}
    prompt_lens: dict[str, int] = {}
    info: dict[str, dict] = {}
    mismatched = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            digest.update(raw)
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise TraceError(f"{where}: not UTF-8 text (a binary file?)") from None
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise TraceError(f"{where}: not JSON ({e.msg})") from e
            except ValueError as e:  # an integer of more digits than Python converts (4,300): one line
                raise TraceError(f"{where}: {too_long_number(e)}") from None
            except RecursionError:
                raise TraceError(f"{where}: JSON nested too deeply") from None
            if not isinstance(rec, dict):
                raise TraceError(f"{where}: expected a JSON object, got {type(rec).__name__}")
            if isinstance(rec.get("model"), str):
                rec_models.add(rec["model"])
            rid = rec.get("id", lineno - 1)
            if isinstance(rid, bool) or not isinstance(rid, (str, int)) or rid == "":
                raise TraceError(f"{where}: 'id' must be a string or an integer, got {rid!r}")
            rid = str(rid)
            if rid in arrays:
                raise TraceError(f"{where}: duplicate request id {rid!r}")
            prompt = rec.get("prompt_token_ids")
            gen = rec.get("generated_token_ids")
            if not isinstance(prompt, list):
                raise TraceError(f"{where}: 'prompt_token_ids' must be a list of token ids")
            plen = rec.get("prompt_len", len(prompt))
            if isinstance(plen, bool) or plen != len(prompt):
                raise TraceError(f"{where}: request {rid!r}: prompt_len {plen!r} but {len(prompt)} "
                                 f"prompt_token_ids")
            per_prop: dict[str, list[int]] = {}
            for key, val in rec.items():
                m = _PUBLISHED_ACC.match(key)
                if not m:
                    continue
                name = m.group("name") or proposer or _proposer_from_name(path)
                if name is None:
                    raise TraceError(f"{where}: key 'acc' does not say which proposer; pass proposer=...")
                per_prop[name] = _published_acc_list(val, f"{where}: {key}")
            if not per_prop:
                raise TraceError(f"{where}: no acceptance key ('acc', 'acc_ngram', 'acc_eagle', ...)")
            if isinstance(gen, list) and gen:
                off = {n: len(a) for n, a in per_prop.items() if a and abs(len(a) - len(gen)) > 1}
                if off and strict:
                    name, n = next(iter(off.items()))
                    raise TraceError(f"{where}: length mismatch, {n} acceptance entries for "
                                     f"{len(gen)} generated tokens ({name})")
                mismatched += bool(off)
            arrays[rid] = {name: _check_acc_array(a, f"{where}: {name}", allow_empty=True)
                           for name, a in per_prop.items()}
            prompt_lens[rid] = len(prompt)
            info[rid] = {"prompt_token_ids": prompt, "output_token_ids": gen if isinstance(gen, list) else None}
    if not arrays:
        raise TraceError(f"{path}: empty trace file")
    meta = {"source": str(path), "format": "published-jsonl", "length_mismatch": mismatched,
            "sha256": digest.hexdigest()}
    study = STUDY_FILES.get(meta["sha256"])
    if study is not None:
        meta.update(study_file=study[0], provenance=STUDY_SOURCE)
        dataset = given_dataset or study[1]
    if model is None:
        if study is not None:
            model = STUDY_MODEL
        elif len(rec_models) == 1:
            model = rec_models.pop()
            meta["provenance"] = f"model named by the file's records ({path.name})"
        else:
            model = "unknown"
            meta["provenance"] = f"JSON lines {path.name}: not one of the study's published files; no model field"
    try:
        return Trace.from_arrays(arrays, prompt_lens=prompt_lens, dataset=dataset, model=model, k_max=k_max,
                                 request_info=info, meta=meta)
    except TraceError as e:
        raise TraceError(f"{path}: {e}") from e


def _published_acc_list(val, where: str) -> list:
    if isinstance(val, dict):
        if "acc_len" not in val:
            raise TraceError(f"{where}: object has no 'acc_len'")
        val = val["acc_len"]
    if isinstance(val, str):
        try:
            val = json.loads(val)
        except json.JSONDecodeError as e:
            raise TraceError(f"{where}: acc_len string is not a JSON list ({e.msg})") from e
        except ValueError as e:
            raise TraceError(f"{where}: acc_len string: {too_long_number(e)}") from None
    if not isinstance(val, list):
        raise TraceError(f"{where}: acc_len must be a list of ints, got {type(val).__name__}")
    if not set(map(type, val)) <= {int, float}:   # JSON's numbers (a bool is no number here)
        raise TraceError(f"{where}: acc_len must hold only ints")
    return val


def _proposer_from_name(path: Path) -> str | None:
    name = path.name.lower()
    hits = [p for p in ("eagle3", "eagle", "ngram", "draft", "mtp") if p in name]
    return hits[0] if hits else None


_CACHE_VERSION = "2"  # bump when read_published_jsonl's output or what it refuses changes (2: prompt_len)


def read_published_cached(path: Path, **kw) -> Trace:
    """``read_published_jsonl`` parsed once: the trace is kept as parquet under ``$SPEC_REPRO_CACHE/traces``,
    keyed by the file's sha256, the reader's arguments and the schema version, so the next read of the same
    bytes skips the JSON parse (a changed file, or other arguments, is a new key). ``SPEC_REPRO_TRACE_CACHE=0``
    turns it off; a cache entry that cannot be read, or whose bytes no longer hash to the sha256 recorded beside
    it when it was written (``<entry>.sha256``), is parsed again and replaced: a cached byte is never trusted
    unverified."""
    import hashlib
    import os

    if os.environ.get("SPEC_REPRO_TRACE_CACHE", "1") == "0" or not path.is_file():
        return read_published_jsonl(path, **kw)
    from .fetch import cache_root, sha256_file, verify_file

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    args = {k: kw.get(k) for k in ("dataset", "model", "proposer", "k_max", "strict")}
    if not args["dataset"]:
        args["dataset"] = dataset_from_path(path)  # the default dataset comes from the name: part of the key
    args["proposer"] = args["proposer"] or _proposer_from_name(path)
    key = hashlib.sha256(json.dumps([_CACHE_VERSION, h.hexdigest(), args], sort_keys=True).encode())
    cached = cache_root() / "traces" / f"{key.hexdigest()[:32]}.parquet"
    seal = cached.with_suffix(".sha256")
    if cached.is_file():
        try:
            if verify_file(cached, seal.read_text().strip() if seal.is_file() else None):
                t = Trace.from_parquet(cached, checked=True)   # sealed as written from the checked parse
                t.meta["source"] = str(path)  # the same bytes may live under another name now
                return t
        except (TraceError, OSError, UnicodeError):
            pass  # unreadable or altered: parse again below and replace it
    t = read_published_jsonl(path, **kw)
    try:
        t.to_parquet(cached)
        from .io import atomic_write

        with atomic_write(seal) as f:
            f.write(sha256_file(cached) + "\n")
    except OSError:
        pass  # a read-only or full cache only costs the next read its parse
    return t


# ---- the study's per-draft-position acceptance, as a committed table ----------------------------------------
#: Where the study's published traces live (their sha256 are ``traces.STUDY_FILES``).
STUDY_REPO = "https://github.com/SpecDecode-Bench/simulator"
STUDY_TRACE_DIR = "data/llama3.1-8B"
#: The draft lengths ``data/published/draft_position_rates.csv`` covers.
DRAFT_POSITION_KS = (3, 5, 7)
_TABLE = "draft_position_rates.csv"


def with_ngram_draft_len(trace: Trace) -> tuple[Trace, dict]:
    """``trace`` with n-gram's ``draft_len`` filled in where it is unknown (the study's files do not record it):
    vLLM's prompt lookup (min 3 / max 7) recomputed from the token ids, in the alignment that reproduces the
    trace's own n-gram acc_len (``simcore.ngram_match``). A step where the lookup finds no match is then no draft,
    as in this package's own traces. Returns the trace and, per (dataset, model), the alignment and the share of
    positions where the recomputed acceptance equals the published one."""
    import numpy as np

    from .simcore import group_arrays, is_ngram, ngram_match

    acc = trace.acc.copy()
    report: dict = {}
    for prop in trace.proposers:
        if not is_ngram(prop):
            continue
        for (ds, mdl), g in acc[acc["proposer"] == prop].groupby(["dataset", "model"], observed=True):
            if g["draft_len"].notna().all():
                continue
            order = list(dict.fromkeys(g["request_id"]))
            req = trace.requests[(trace.requests["dataset"] == ds) & (trace.requests["model"] == mdl)]
            reqs = group_arrays(g, req, [prop], order)
            m = ngram_match(reqs, req, 0, int(g["k_max"].max()))
            report[f"{ds}/{mdl}/{prop}"] = {"alignment": m.alignment,
                                            "agreement": {a: round(v, 4) for a, v in m.agreement.items()},
                                            **({"why": m.why} if m.lens is None else {})}
            if m.lens is None:
                continue
            # group_arrays concatenates the requests in `order`, positions 0..L-1 each: the same order as g sorted
            rank = {r: i for i, r in enumerate(order)}
            idx = g.assign(_r=g["request_id"].map(rank)).sort_values(["_r", "position"]).index
            acc.loc[idx, "draft_len"] = np.asarray(m.lens, np.int64)
    acc["draft_len"] = acc["draft_len"].astype("Int16")
    return Trace(acc, trace.requests, dict(trace.meta)), report


def draft_position_table(paths, ks=DRAFT_POSITION_KS) -> tuple[pd.DataFrame, dict]:
    """``metrics.acceptance_by_draft_position`` (both rates) of the published trace files ``paths`` at each
    draft length in ``ks``, n-gram's no-match steps left out (``with_ngram_draft_len``). Returns the table
    (dataset, model, proposer, k, draft_position, rate, conditional_rate, drafts) and a per-file report (name,
    sha256, dataset, requests, n-gram's recomputed-lookup agreement)."""
    import pandas as pd

    from .metrics import acceptance_by_draft_position

    parts, files = [], {}
    for path in sorted(Path(p) for p in paths):
        t = read_published_jsonl(path)
        t, ngram = with_ngram_draft_len(t)
        files[path.name] = {"sha256": t.meta["sha256"], "study_file": bool(t.meta.get("study_file")),
                            "dataset": t.datasets[0] if len(t.datasets) == 1 else list(t.datasets),
                            "requests": int(t.requests["request_id"].nunique()), "ngram_lookup": ngram}
        for k in ks:
            r = acceptance_by_draft_position(t, k=int(k))
            r.insert(3, "k", int(k))
            parts.append(r)
    table = pd.concat(parts, ignore_index=True)
    table[["rate", "conditional_rate"]] = table[["rate", "conditional_rate"]].round(4)
    table = table.sort_values(["dataset", "model", "proposer", "k", "draft_position"], kind="stable")
    return table.reset_index(drop=True), files


def _git_blob_sha1(path: Path) -> str:
    import hashlib

    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _git_commit(git_dir: str | Path, files: Sequence[Path]) -> str:
    """The commit of ``git_dir`` (HEAD) whose ``STUDY_TRACE_DIR/<name>`` blobs are these files' bytes."""
    import subprocess

    def git(*a):
        return subprocess.run(["git", f"--git-dir={git_dir}", *a], check=True, capture_output=True,
                              text=True).stdout.strip()

    commit = git("rev-parse", "HEAD")
    for f in files:
        blob = git("rev-parse", f"{commit}:{STUDY_TRACE_DIR}/{f.name}")
        if blob != _git_blob_sha1(f):
            raise TraceError(f"{f}: not the bytes of {STUDY_TRACE_DIR}/{f.name} at {commit} in {git_dir}")
    return commit


def write_draft_position_table(paths, out_dir: str | Path, *, ks=DRAFT_POSITION_KS, git_dir: str | Path | None = None,
                               commit: str | None = None, command: str | None = None) -> Path:
    """Write ``out_dir/draft_position_rates.csv`` (``draft_position_table``) and its entry in
    ``out_dir/MANIFEST.json``: the source repository and commit (``git_dir``: a clone or mirror of it, checked
    blob by blob against the files; or ``commit`` as given), every file's sha256 and git blob id, the command."""
    from .io import atomic_path
    from .provenance import record, sha256_file

    paths = sorted(Path(p) for p in paths)
    if not paths:
        raise TraceError("no published trace files given")
    if git_dir is not None:
        commit = _git_commit(git_dir, paths)
    table, files = draft_position_table(paths, ks)
    for p in paths:
        files[p.name].update(path_in_repo=f"{STUDY_TRACE_DIR}/{p.name}", git_blob=_git_blob_sha1(p))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / _TABLE) as tmp:
        table.to_csv(tmp, index=False)
    record(out / "MANIFEST.json", _TABLE, file=_TABLE, sha256=sha256_file(out / _TABLE),
           **({"command": command} if command else {}),
           kind="derived: per-draft-position acceptance of the study's published traces "
                "(spec_repro.metrics.acceptance_by_draft_position)",
           source_repo=STUDY_REPO, source_commit=commit or "unknown", source_files=files, ks=[int(k) for k in ks],
           model=STUDY_MODEL, rows=len(table),
           definitions={"rate": "drafts whose i-th token was accepted / drafts (the study's per-position rate)",
                        "conditional_rate": "drafts whose i-th token was accepted / drafts whose (i-1)-th was "
                                            "(i = 1: rate)",
                        "drafts": "steps of a fixed-k greedy run where the proposer proposed something",
                        "ngram": "steps where vLLM's prompt lookup (min 3 / max 7), recomputed from the files' "
                                 "token ids, finds no match are no drafts (as in this package's traces, "
                                 "draft_len 0); EAGLE drafts at every step"})
    return out / _TABLE


def read_draft_position_rates(path: str | Path | None = None) -> pd.DataFrame:
    """The committed table of the study's per-draft-position acceptance (``data/published/draft_position_rates.csv``,
    written by ``python -m spec_repro.published draft-position-rates``)."""
    import pandas as pd

    from .locations import data_dir
    from .provenance import check_manifest, verify_recorded

    path = Path(path) if path else data_dir() / "published" / _TABLE
    if not path.is_file():
        raise TraceError(f"{path}: no such table; write it with `python -m spec_repro.published "
                         f"draft-position-rates PATH/combined_*.jsonl --out {path.parent}`")
    df = pd.read_csv(verify_recorded(path))
    man = path.parent / "MANIFEST.json"
    e = check_manifest(man).get(path.name, {}) if man.is_file() else {}
    where = (f"{e.get('source_repo', '?').removeprefix('https://github.com/')} @ {str(e.get('source_commit', '?'))[:7]}, "
             f"{STUDY_TRACE_DIR}/combined_*.jsonl, {len(e.get('source_files', {}))} files" if e
             else "no MANIFEST.json entry")
    df.attrs["source"] = f"{STUDY_SOURCE} ({where}) via {path.parent.name}/{path.name}"
    return df


def main(argv: Sequence[str] | None = None) -> int:
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m spec_repro.published",
                                 description="Tables derived from the study's published traces.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("draft-position-rates", help="per-draft-position acceptance (both rates) at several k")
    d.add_argument("files", nargs="+", help="the study's combined_<dataset>.jsonl files")
    d.add_argument("--out", default="data/published", help="folder for the table and its MANIFEST.json entry")
    d.add_argument("--k", type=int, nargs="+", default=list(DRAFT_POSITION_KS), help="draft lengths")
    src = d.add_mutually_exclusive_group()
    src.add_argument("--git-dir", help="a clone/mirror of the source repository: its HEAD is recorded, after "
                                       "checking that the files are its blobs")
    src.add_argument("--commit", help="the source commit, recorded as given")
    a = ap.parse_args(argv)
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        out = write_draft_position_table(a.files, a.out, ks=a.k, git_dir=a.git_dir, commit=a.commit,
                                         command="python -m spec_repro.published " + " ".join(args))
    except TraceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
