"""The study's published acceptance traces (SpecDecode-Bench/simulator ``combined_<dataset>.jsonl``): one JSON
object per request, read into the package's ``Trace`` schema with a clear error for every malformed line."""
from __future__ import annotations

import json
import re
from pathlib import Path

from .traces import STUDY_FILES, STUDY_MODEL, STUDY_SOURCE, Trace, TraceError, _check_acc_array, dataset_from_path

__all__ = ["read_published_jsonl", "read_published_cached"]

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
            for name, a in per_prop.items():
                _check_acc_array(a, f"{where}: {name}", allow_empty=True)
            arrays[rid] = per_prop
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
    if not isinstance(val, list):
        raise TraceError(f"{where}: acc_len must be a list of ints, got {type(val).__name__}")
    if any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in val):
        raise TraceError(f"{where}: acc_len must hold only ints")
    return val


def _proposer_from_name(path: Path) -> str | None:
    name = path.name.lower()
    hits = [p for p in ("eagle3", "eagle", "ngram", "draft", "mtp") if p in name]
    return hits[0] if hits else None


_CACHE_VERSION = "1"  # bump when read_published_jsonl's output changes


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
                t = Trace.from_parquet(cached)
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
