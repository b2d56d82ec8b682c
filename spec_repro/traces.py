"""One tidy schema for speculative-decoding traces, and its readers/writers.

Acceptance traces (what the oracle simulator and the acceptance notebooks read)
------------------------------------------------------------------------------
``Trace.acc`` is a long table, one row per (request, proposer, output position):

==============  =======  =====================================================================
column          dtype    meaning
==============  =======  =====================================================================
request_id      string   unique within (dataset, model)
dataset         string   workload name (``code-edit``, ``sharegpt``, ``instructcoder`` ...)
model           string   target model name
proposer        string   ``ngram``, ``eagle``, ``eagle3``, ``draft``, ``mtp`` ...
position        int32    output position p = 0..L-1 (p = 0 is the token the prefill produced)
acc_len         int16    tokens ONE step would produce if speculation started here: accepted + 1
k_max           int16    the draft length the trace was measured with (acc_len <= k_max + 1)
draft_len       Int16    tokens the proposer would really propose here, <= k_max; 0 = n-gram found
                         no match (no drafting cost, the step verifies one token). <NA> = unknown
                         (published traces): the simulator then models matches as the study did.
prompt_len      int32    P, prompt tokens of the request
output_len      int32    L, output tokens of the request (first token included)
confidence      list     optional (absent in traces profiled before it was recorded, which read as before):
                <uint8>  k_max codes per row, entry d-1 (d = 1..k_max) = the probability of the drafter's
                         own top-1 token at draft position d, quantized to 8 bits: code = round(254 p),
                         p = code / 254 (steps of 1/254, error <= 1/508 ~ 0.002), code 255 = no value.
                         p is the softmax of the drafter's logits at the token it drafts as draft number d
                         of the chain that starts after output position p (the draft compared with
                         o_{p+d}), teacher-forced as the acceptance (exact for d <= acc_len; see
                         ``spec_repro.profiler``). No value (255) where o_{p+d} lies past the output
                         (p + d > L - 1); the list is null for proposers without confidence (n-gram).
==============  =======  =====================================================================

``Trace.confidence(proposer)`` reads it back as {(dataset, model, request_id): float32 array [L, k_max]} of
probabilities in [0, 1] (unit: probability of the drafter's own top-1 token at draft position d, 8-bit
quantized as above), NaN where absent (past the output's end, a proposer without confidence such as n-gram, a
trace profiled before confidence was recorded). ``quantize_confidence`` / ``dequantize_confidence`` convert.

``Trace.requests`` holds one row per request: request_id, dataset, model, prompt_len, output_len and,
when known, ``prompt_token_ids``/``output_token_ids`` (lists) and ``prompt_text``/``output_text``.

Files: ``Trace.to_parquet`` writes ``acc`` as the parquet table, each request's token ids and texts
(``REQ_FILE_COLUMNS``) as columns set on the request's first row (null on its other rows), and ``meta`` as JSON in
the file's key-value metadata (schema ``acc-v2``), so one parquet file is one self-contained trace. The request table
(id, dataset, model, prompt and output lengths) is read back off each request's first row, so a file of any number
of requests reads back (10^6 requests: 1.7 MB, written and read in a few seconds); a request with no acceptance row
(rare) is kept as JSON in the metadata (``REQ_ALONE_KEY``). Files of schema ``acc-v1``, the request table as JSON in
the metadata (the committed traces under data/traces), read as before; that form cannot hold ~10^6 requests (the
metadata passes Thrift's size limit). A file whose folder's ``MANIFEST.json`` records its sha256 (the committed
traces and step logs) is checked against it before it is read (``manifests.verify_recorded``, hashed once per
process and file version): a changed file is one TraceError line naming it. This module is the schema and
imports no reader of other formats: ``spec_repro.published`` (the study's JSON lines) sits above it, and
``spec_repro.tracefiles.read_trace`` above both reads any trace file.

Step timings (what the cost-model fits and the verification-bottleneck notebook read)
-------------------------------------------------------------------------------------
``STEP_COLUMNS``: one row per engine step (decode/verify iteration), times in seconds, see ``read_steps``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from .manifests import ManifestError, verify_recorded

__all__ = [
    "ACC_COLUMNS", "ACC_OPTIONAL", "CONF_COLUMN", "REQ_COLUMNS", "STEP_COLUMNS", "TraceError", "Trace",
    "quantize_confidence", "dequantize_confidence",
    "read_steps", "read_step_records", "validate_steps", "dataset_from_path", "too_long_number",
]

ACC_COLUMNS: dict[str, str] = {
    "request_id": "string", "dataset": "string", "model": "string", "proposer": "string",
    "position": "int32", "acc_len": "int16", "k_max": "int16", "draft_len": "Int16",
    "prompt_len": "int32", "output_len": "int32",
}
REQ_COLUMNS: dict[str, str] = {
    "request_id": "string", "dataset": "string", "model": "string",
    "prompt_len": "int32", "output_len": "int32",
}
# Optional acceptance columns, kept when present: the drafter's confidence, list<uint8> of k_max codes per row
# (module doc), held in pandas as an Arrow-backed column (no Python object per row).
CONF_COLUMN = "confidence"
CONF_SCALE = 254    # code = round(CONF_SCALE * probability)
CONF_ABSENT = 255   # the code of "no value" (NaN)
ACC_OPTIONAL = (CONF_COLUMN,)
# Optional per-request columns (lists or text), kept when present.
REQ_OPTIONAL = ("prompt_token_ids", "output_token_ids", "prompt_text", "output_text")
# In a parquet file the token ids are list<int32> columns of the acc table, set on each request's first row
# (null elsewhere): compact, and the file stays one self-contained table. Files without them read as before.
ID_COLUMNS = ("prompt_token_ids", "output_token_ids")
# Every per-request column a parquet file holds beyond the acc table's: list<int32> ids and string texts, each
# request's value on its first row (null elsewhere). The request table itself (id, dataset, model, lengths) is
# read off each request's first row, so a file of any number of requests reads back (the footer's key-value
# metadata, where files of schema acc-v1 held the table as JSON, is limited by Thrift to a few hundred MB).
REQ_FILE_COLUMNS = ID_COLUMNS + ("prompt_text", "output_text")
FILE_SCHEMA = b"acc-v2"
REQ_ALONE_KEY = b"spec_repro.requests_without_rows"   # JSON: requests with no acceptance row (lengths only)

STEP_COLUMNS: dict[str, str] = {
    "run_id": "string",        # one engine configuration's run
    "engine": "string",        # "vllm" | "torch"
    "model": "string",
    "method": "string",        # "none" (no SD), "ngram", "eagle", "eagle3", "draft_model", "mtp" ...
    "k": "int16",              # draft tokens per step (0 without SD)
    "batch_size": "int32",     # requests submitted together
    "step": "int64",           # step index within the run
    "num_reqs": "int32",       # requests scheduled in this step
    "batched_tokens": "int64",  # n: tokens processed by the target forward in this step
    "kv_tokens": "int64",      # tokens held in the KV cache before the step
    "t_draft": "float64",      # seconds: proposing
    "t_verify": "float64",     # seconds: target forward (verification)
    "t_reject": "float64",     # seconds: rejection sampling / acceptance
    "t_other": "float64",      # seconds: everything else (scheduling, input prep, bookkeeping)
    "t_total": "float64",      # seconds: the whole step, = sum of the four
    "num_draft_tokens": "int64",
    "num_accepted_tokens": "int64",
}
# Optional step columns kept when present: per-request accepted counts, prefill/decode phase, the vLLM plugin's
# run bookkeeping (run_kind: study / profile / overhead; outlier: JIT-compilation steps; t_sched: host time
# between steps) and each step's physical limit (bytes the verification pass must read, the HBM floor in s,
# achieved GB/s and bandwidth utilisation), the live hybrid's choices per proposer (the plugin's ``hybrid``), and
# ``uniform`` (bool: every request verified exactly k + 1 tokens, vLLM's full-CUDA-graph batch; see
# ``spec_repro.costmodel``'s ragged forward, which ``costmodel.fit`` fits where it is present).
STEP_OPTIONAL = ("accepted_per_req", "phase", "run_kind", "outlier", "t_sched", "spec", "session",
                 "verify_bytes", "verify_floor_s", "achieved_GBps", "bw_util", "hybrid", "uniform")
_TIME_COLS = ("t_draft", "t_verify", "t_reject", "t_other", "t_total")

#: The study's published trace files (SpecDecode-Bench/simulator, data/llama3.1-8B/, commit 2fdccbd), recognized
#: by content (sha256 of the file), never by name: sha256 -> (file, dataset, requests).
STUDY_FILES: dict[str, tuple[str, str, int]] = {
    "90637b8cb4c410b3de6cdf2898ef1104d41b0fc5bff5e8692a6bfc836101899b": ("combined_cnn.jsonl", "cnn", 300),
    "6d6bfb9993f4a540ff73cb330bdd4348dc3e6a6c77a111d3e35b96caf83c26f1": ("combined_gsm8k.jsonl", "gsm8k", 300),
    "cfd6b6b156076a704f7aff0f060920bb7c5e4c3b80ef32efbe858b62d85cd910":
        ("combined_instructcoder.jsonl", "instructcoder", 500),
    "748df2df1e89b986009aad1a42fee604b1fe57558b690aef0da7d9c7b9708b75": ("combined_sharegpt.jsonl", "sharegpt", 310),
}
#: The model and hardware of those files (their JSON lines do not say; the study's paper and repository do).
STUDY_MODEL = "Llama-3.1-8B-Instruct (published trace)"
STUDY_SOURCE = "the study's published traces (Llama-3.1-8B-Instruct, vLLM, H100)"



class TraceError(ValueError):
    """A trace file or table that does not follow the schema; the message says where and why."""


def dataset_from_path(path: str | Path) -> str:
    """Default dataset name of a trace file: its stem without a ``combined_`` prefix."""
    stem = Path(path).name
    for suf in (".jsonl", ".json", ".parquet", ".gz"):
        if stem.endswith(suf):
            stem = stem[: -len(suf)]
    stem = stem.split(".")[0]
    return stem[len("combined_"):] if stem.startswith("combined_") else stem


@dataclass
class Trace:
    """Acceptance trace: ``acc`` (long table, ACC_COLUMNS), ``requests`` (REQ_COLUMNS + optional) and ``meta``."""

    acc: pd.DataFrame
    requests: pd.DataFrame
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.acc = _coerce(self.acc, ACC_COLUMNS, "acc", extra=[c for c in ACC_OPTIONAL if c in self.acc.columns])
        if CONF_COLUMN in self.acc.columns:
            self.acc[CONF_COLUMN] = _check_confidence(self.acc, "acc")
        keep = [c for c in self.requests.columns if c in REQ_OPTIONAL]
        self.requests = _coerce(self.requests, REQ_COLUMNS, "requests", extra=keep)

    # ---- construction -------------------------------------------------------------------------------
    @classmethod
    def _checked(cls, acc: pd.DataFrame, requests: pd.DataFrame, meta: dict) -> "Trace":
        """A trace of tables whose values were checked already: only put in the schema's columns and dtypes."""
        keep = [c for c in requests.columns if c in REQ_OPTIONAL]
        t = cls.__new__(cls)
        t.acc = _coerce(acc, ACC_COLUMNS, "acc", extra=[c for c in ACC_OPTIONAL if c in acc.columns], check=False)
        t.requests = _coerce(requests, REQ_COLUMNS, "requests", extra=keep, check=False)
        t.meta = meta
        return t

    @classmethod
    def from_arrays(
        cls,
        arrays: Mapping[str, Mapping[str, Sequence[int]]],
        *,
        prompt_lens: Mapping[str, int],
        dataset: str,
        model: str,
        k_max: int | None = None,
        draft_lens: Mapping[str, Mapping[str, Sequence[int]]] | None = None,
        request_info: Mapping[str, Mapping] | None = None,
        meta: dict | None = None,
        truncate_to_shortest: bool = True,
        confidences: Mapping[str, Mapping[str, np.ndarray]] | None = None,
    ) -> "Trace":
        """Build a trace from ``arrays[request_id][proposer] = acc_len list``.

        ``confidences[request_id][proposer]``: the drafter's confidence, an array [L, k_max] of probabilities
        (NaN = none; module doc), for the proposers that have one; with none at all the trace has no
        ``confidence`` column.

        Every proposer's array of a request is cut to the shortest one (L = the shortest, as the study does).
        ``k_max`` defaults to the longest draft over the whole trace: max(acc_len) - 1, or the longest of
        ``draft_lens`` where that is longer. Requests with an empty array are skipped
        (their ids are listed in ``meta['skipped_empty']``)."""
        import pyarrow as pa

        runs: list[tuple] = []          # one (request id, proposer, L, P) per acceptance array kept
        acc_parts, dl_parts = [], []
        reqs, skipped = [], []
        conf_blocks: list = []           # per (request, proposer) run of rows: its [L, k] confidence or None
        for rid, per_prop in arrays.items():
            if not per_prop:
                raise TraceError(f"request {rid!r}: no proposer arrays")
            lens = {p: len(a) for p, a in per_prop.items()}
            if min(lens.values()) == 0:
                skipped.append(str(rid))
                continue
            if not truncate_to_shortest and len(set(lens.values())) > 1:
                raise TraceError(f"request {rid!r}: proposer arrays differ in length {lens}")
            L = min(lens.values())
            P = int(prompt_lens[rid])
            for prop, a in per_prop.items():
                acc_parts.append(_check_acc_array(a, f"request {rid!r}, proposer {prop!r}")[:L])
                dl = np.full(L, -1, dtype=np.int64)
                if draft_lens is not None and prop in draft_lens.get(rid, {}):
                    dl = np.asarray(draft_lens[rid][prop], dtype=np.int64)[:L]
                    if len(dl) != L:
                        raise TraceError(f"request {rid!r}, proposer {prop!r}: draft_len length {len(dl)} != {L}")
                cf = (confidences or {}).get(rid, {}).get(prop)
                if cf is not None:
                    cf = np.asarray(cf, dtype=np.float32)
                    if cf.ndim != 2 or len(cf) < L:
                        raise TraceError(f"request {rid!r}, proposer {prop!r}: confidence must be an array "
                                         f"[positions, k_max] over at least its {L} positions, got shape {cf.shape}")
                    cf = cf[:L]
                conf_blocks.append((L, cf))
                dl_parts.append(dl)
                runs.append((str(rid), str(prop), L, P))
            info = dict(request_info.get(rid, {})) if request_info else {}
            reqs.append({"request_id": str(rid), "dataset": dataset, "model": model, "prompt_len": P,
                         "output_len": L, **{k: v for k, v in info.items() if k in REQ_OPTIONAL}})
        if not reqs:
            raise TraceError(f"no request with a non-empty acceptance array ({len(skipped)} empty)")
        run_rid, run_prop, run_L, run_P = zip(*runs)
        n = np.array(run_L, np.int64)
        row_run = np.repeat(np.arange(len(runs)), n)

        def repeated(names):   # a string column: each run's name on its rows (arrow: no str object per row)
            return pd.arrays.ArrowStringArray(pa.array(names, pa.large_string()).take(pa.array(row_run)))

        def same(name):        # one name on every row
            return repeated([name] * len(runs)) if isinstance(name, str) else name

        dl = pd.Series(np.concatenate(dl_parts)).astype("Int16")
        dl[dl < 0] = pd.NA
        acc = pd.DataFrame({"request_id": repeated(run_rid), "dataset": same(dataset), "model": same(model),
                            "proposer": repeated(run_prop),
                            "position": np.arange(len(row_run)) - np.repeat(np.cumsum(n) - n, n),
                            "acc_len": np.concatenate(acc_parts), "draft_len": dl.array,
                            "prompt_len": np.repeat(np.array(run_P, np.int64), n), "output_len": n[row_run]})
        # by default the longest draft the trace shows: a drafted length (draft_lens) or an acceptance (acc_len - 1);
        # a trace of low acceptance (sharegpt) has drafts longer than anything accepted
        dmax = acc["draft_len"].max()
        kmax = (max(int(acc["acc_len"].max()) - 1, 0 if pd.isna(dmax) else int(dmax)) if k_max is None
                else int(k_max))
        if kmax < 1:
            kmax = 1
        if int(acc["acc_len"].max()) > kmax + 1:
            raise TraceError(f"acc_len up to {int(acc['acc_len'].max())} exceeds k_max + 1 = {kmax + 1}")
        acc["k_max"] = kmax
        if any(cf is not None for _, cf in conf_blocks):
            acc[CONF_COLUMN] = _conf_series(_conf_from_blocks(conf_blocks), acc.index)
        m = dict(meta or {})
        if skipped:
            m["skipped_empty"] = skipped
        return cls(acc, pd.DataFrame(reqs), m)

    # ---- queries ------------------------------------------------------------------------------------
    @property
    def proposers(self) -> list[str]:
        return _distinct(self.acc, "proposer")

    @property
    def datasets(self) -> list[str]:
        return _distinct(self.acc, "dataset")

    @property
    def models(self) -> list[str]:
        return _distinct(self.acc, "model")

    def check_proposers(self, proposers: Iterable[str]) -> list[str]:
        """Raise a TraceError naming what is available if any requested proposer is absent."""
        proposers = list(proposers)
        have = self.proposers
        missing = [p for p in proposers if p not in have]
        if missing:
            raise TraceError(f"unknown proposer(s) {missing}: this trace has {have}")
        return proposers

    def selection(self, *, dataset: str | None = None, model: str | None = None,
                  proposers: Iterable[str] | None = None) -> tuple[np.ndarray, pd.DataFrame]:
        """What ``select`` keeps, with no rows copied: a mask over ``acc``'s rows and the requests kept."""
        keep = np.ones(len(self.acc), np.bool_)
        for col, want in (("dataset", dataset), ("model", model)):
            if want is not None:
                keep &= (self.acc[col] == want).to_numpy(dtype=np.bool_, na_value=False)
        first = self.acc["position"].to_numpy() == 0
        if proposers is not None:
            props = self.check_proposers(proposers)
            keep &= self.acc["proposer"].isin(props).to_numpy(dtype=np.bool_, na_value=False)
            if len(props) > 1:  # keep the requests that have every one of them
                rid = _key_codes(self.acc)
                n_props = np.bincount(rid[keep & first], minlength=rid.max(initial=-1) + 1)
                keep &= n_props[rid] == len(props)
        req = self.requests
        if not keep.all():
            key = ["dataset", "model", "request_id"]
            req = req.merge(_where(self.acc, keep & first, key).drop_duplicates(), on=key, how="inner")
        return keep, req

    def select(self, *, dataset: str | None = None, model: str | None = None,
               proposers: Iterable[str] | None = None) -> "Trace":
        """A sub-trace; with ``proposers``, only requests that have every one of them."""
        keep, req = self.selection(dataset=dataset, model=model, proposers=proposers)
        acc = self.acc if keep.all() else _where(self.acc, keep, self.acc.columns)
        return Trace(acc.reset_index(drop=True), req.reset_index(drop=True), dict(self.meta))

    @property
    def confidence_proposers(self) -> list[str]:
        """The proposers with a recorded confidence (on any of their rows)."""
        if CONF_COLUMN not in self.acc.columns:
            return []
        has = self.acc[CONF_COLUMN].notna().to_numpy(dtype=bool)
        return sorted(self.acc.loc[has, "proposer"].unique().tolist())

    def confidence(self, proposer: str) -> dict[tuple[str, str, str], np.ndarray]:
        """{(dataset, model, request_id): float32 array [L, k_max]} for one proposer: entry [p, d-1] = the
        probability of the drafter's own top-1 token at draft position d when drafting after output position p
        (8-bit quantized as stored, module doc); NaN where absent (past the output's end, a proposer without
        confidence such as n-gram, a trace profiled before confidence was recorded). Same keys as
        :meth:`arrays`."""
        self.check_proposers([proposer])
        d = self.acc[self.acc["proposer"] == proposer].sort_values(["dataset", "model", "request_id", "position"])
        kmax = d["k_max"].to_numpy(np.int64)
        K = int(kmax.max(initial=1))
        dense = np.full((len(d), K), np.nan, dtype=np.float32)
        if CONF_COLUMN in d.columns and len(d):
            import pyarrow.compute as pc

            arr = d[CONF_COLUMN].array.__arrow_array__().combine_chunks()
            lens = _list_lengths(arr)
            flat = dequantize_confidence(pc.list_flatten(arr).to_numpy(zero_copy_only=False))
            rows = np.repeat(np.arange(len(d)), lens)
            cols = np.arange(len(flat)) - np.repeat(np.cumsum(lens) - lens, lens)
            dense[rows, cols] = flat
        out = {}
        pos = np.arange(len(d))
        for key, g in d.assign(_row=pos).groupby(["dataset", "model", "request_id"], sort=False, observed=True):
            r = g["_row"].to_numpy()
            out[key] = dense[r, : int(kmax[r[0]])]
        return out

    def arrays(self, proposer: str) -> dict[tuple[str, str, str], np.ndarray]:
        """{(dataset, model, request_id): acc_len array over positions} for one proposer."""
        self.check_proposers([proposer])
        d = self.acc[self.acc["proposer"] == proposer].sort_values(["dataset", "model", "request_id", "position"])
        out = {}
        for key, g in d.groupby(["dataset", "model", "request_id"], sort=False, observed=True):
            out[key] = g["acc_len"].to_numpy(np.int64)
        return out

    # ---- I/O ----------------------------------------------------------------------------------------
    def to_parquet(self, path: str | Path) -> Path:
        """Write the trace as one self-contained parquet file (module doc, "Files"): ``acc`` as the table, each
        request's optional columns (``REQ_FILE_COLUMNS``) on its first row, ``meta`` as JSON in the footer."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        acc = self.acc.drop(columns=[CONF_COLUMN]) if CONF_COLUMN in self.acc.columns else self.acc
        table = pa.Table.from_pandas(acc, preserve_index=False)
        req = self.requests
        first = _request_first_rows(self.acc)   # each request's first row: where its per-request values go
        for col in REQ_FILE_COLUMNS:   # token ids (list<int32>) and texts (string), set on each request's first row
            if col in req.columns and req[col].notna().any():
                table = table.append_column(col, _id_column(self.acc, req, col, first) if col in ID_COLUMNS
                                            else _text_column(self.acc, req, col, first))
        if CONF_COLUMN in self.acc.columns and self.acc[CONF_COLUMN].notna().any():
            # after the pandas part, so the pandas metadata does not name it: a reader that does not know the
            # column gets plain lists (and drops it), no Arrow-backed dtype to reconstruct
            table = table.append_column(CONF_COLUMN, self.acc[CONF_COLUMN].array.__arrow_array__().combine_chunks())
        md = dict(table.schema.metadata or {})
        alone = _requests_without_rows(first[0], req)
        if len(alone):   # requests with no acceptance row (rare): their lengths only, as JSON in the footer
            md[REQ_ALONE_KEY] = alone[list(REQ_COLUMNS)].to_json(orient="records").encode()
        md[b"spec_repro.meta"] = json.dumps(self.meta, default=str).encode()
        md[b"spec_repro.schema"] = FILE_SCHEMA
        from .io import atomic_path

        with atomic_path(path) as tmp:  # atomic: a reader never sees half a file, a failure keeps the old one
            pq.write_table(table.replace_schema_metadata(md), tmp, compression="zstd")
        return path

    @classmethod
    def from_parquet(cls, path: str | Path, *, checked: bool = False) -> "Trace":
        """Read a trace written by ``to_parquet``. ``checked=True``: the file is a copy this package wrote of a
        checked trace and verified since (``published.read_published_cached``: its sha256 as sealed when it was
        written), so its rows are only read into the schema's dtypes, not checked again."""
        import pyarrow.parquet as pq

        path = Path(path)
        if not path.exists():
            raise TraceError(f"{path}: no such trace file")
        _verified(path)   # a committed trace: its bytes as its MANIFEST.json's sha256 records
        try:
            with pq.ParquetFile(path) as f:   # one file: no dataset layer (pq.read_table's)
                table = f.read()
            md = table.schema.metadata or {}
            ids = {c: table.column(c) for c in REQ_FILE_COLUMNS if c in table.column_names}
            conf = table.column(CONF_COLUMN) if CONF_COLUMN in table.column_names else None
            acc = table.drop_columns(list(ids) + ([CONF_COLUMN] if conf is not None else [])).to_pandas()
        except Exception as e:  # pyarrow raises several types for a bad file (a damaged footer, pages, schema)
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            raise TraceError(f"{path}: not a readable parquet file ({first})") from None
        missing = [c for c in ACC_COLUMNS if c not in acc.columns]
        if missing:
            raise TraceError(f"{path}: not an acceptance trace, missing columns {missing}")
        if conf is not None:
            try:
                acc[CONF_COLUMN] = _conf_series(conf, acc.index)
            except TraceError as e:
                raise TraceError(f"{path}: {e}") from None
        try:
            if b"spec_repro.requests" in md:   # files written before the request columns: the table as JSON
                requests = pd.DataFrame(json.loads(md[b"spec_repro.requests"]))
            else:                               # each request's lengths on its first row, and those alone
                requests = _where(acc, _changes(acc, _KEY), list(REQ_COLUMNS)).drop_duplicates(_KEY)
                if REQ_ALONE_KEY in md:
                    requests = pd.concat([requests, pd.DataFrame(json.loads(md[REQ_ALONE_KEY]))],
                                         ignore_index=True)
            meta = json.loads(md.get(b"spec_repro.meta", b"{}"))
        except (ValueError, TypeError, RecursionError) as e:
            raise TraceError(f"{path}: unreadable spec_repro metadata ({type(e).__name__})") from e
        if not isinstance(meta, dict):
            raise TraceError(f"{path}: spec_repro metadata is not a JSON object")
        if ids:
            requests = _attach_ids(acc, requests, ids, path)
        if checked:
            return cls._checked(acc, requests, meta)
        try:
            t = cls(acc, requests, meta)
        except TraceError as e:
            raise TraceError(f"{path}: {e}") from e
        _check_requests_match(t, path)
        return t

    def to_published_jsonl(self, path: str | Path) -> Path:
        """Write the study's JSON-lines format (``acc_<proposer>`` objects with ``acc_len`` lists).

        One-proposer traces use the single key ``acc``. Token ids are written when the trace has them."""
        from .io import atomic_write

        path = Path(path)
        props = self.proposers
        req = self.requests.set_index(["dataset", "model", "request_id"])
        with atomic_write(path) as f:
            for (ds, mdl, rid), g in self.acc.groupby(["dataset", "model", "request_id"], sort=True, observed=True):
                r = req.loc[(ds, mdl, rid)]
                rec = {"id": rid, "model": mdl,
                       "prompt_token_ids": _as_list(r.get("prompt_token_ids")),
                       "generated_token_ids": _as_list(r.get("output_token_ids"))}
                for p, gp in g.groupby("proposer", observed=True):
                    key = "acc" if len(props) == 1 else f"acc_{p}"
                    rec[key] = {"acc_len": gp.sort_values("position")["acc_len"].astype(int).tolist()}
                f.write(json.dumps(rec) + "\n")
        return path

    @staticmethod
    def concat(traces: Iterable["Trace"]) -> "Trace":
        traces = list(traces)
        if not traces:
            raise TraceError("no traces to concatenate")
        acc = pd.concat([t.acc for t in traces], ignore_index=True)
        req = pd.concat([t.requests for t in traces], ignore_index=True)
        # each part is a checked trace (no row twice): rows can repeat only where two parts share a request
        firsts = [t.acc.loc[t.acc["position"].to_numpy() == 0, _KEY].drop_duplicates() for t in traces]
        shared = len(traces) > 1 and pd.concat(firsts, ignore_index=True).duplicated().any()
        dup = acc.duplicated(["dataset", "model", "request_id", "proposer", "position"]) if shared else None
        if shared and dup.any():
            r = acc[dup].iloc[0]
            raise TraceError(f"duplicate rows after concat, e.g. request {r.request_id!r} of {r.dataset!r}")
        meta = {"parts": [t.meta for t in traces]}
        # every part was checked when it was built and joining them can only repeat a row (checked above): the
        # joined tables are put in the schema's dtypes, not checked a second time
        req = req.drop_duplicates(["dataset", "model", "request_id"])
        if CONF_COLUMN in acc.columns:   # parts with and without confidence: the column put in one form, checked
            return Trace(acc, req, meta)
        return Trace._checked(acc, req, meta)


# ---- step timings ---------------------------------------------------------------------------------------
def validate_steps(df: pd.DataFrame, where: str = "steps") -> pd.DataFrame:
    """Check and coerce a step-timing table (STEP_COLUMNS); optional columns are kept."""
    extra = [c for c in df.columns if c in STEP_OPTIONAL]
    df = _coerce(df, STEP_COLUMNS, where, extra=extra)
    t = df[list(_TIME_COLS)].to_numpy(float)
    if (t < 0).any() or not np.isfinite(t).all():
        raise TraceError(f"{where}: step times must be finite and >= 0")
    parts = t[:, :4].sum(axis=1)
    bad = np.abs(parts - t[:, 4]) > 1e-6 + 1e-3 * t[:, 4]
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise TraceError(f"{where}: row {i}: t_draft+t_verify+t_reject+t_other = {parts[i]:.6g} s "
                         f"!= t_total = {t[i, 4]:.6g} s")
    if (df["num_accepted_tokens"] > df["num_draft_tokens"]).any():
        raise TraceError(f"{where}: accepted tokens exceed draft tokens")
    return df


def read_steps(path: str | Path) -> pd.DataFrame:
    """Read step timings written as JSON lines (one step per line) or parquet."""
    p = Path(path)
    if p.suffix == ".parquet":
        if not p.exists():
            raise TraceError(f"{p}: no such step-timing file")
        return validate_steps(pd.read_parquet(_verified(p)), str(p))
    return read_step_records(p)[0]


def _verified(p: Path) -> Path:
    """``p`` checked against its MANIFEST.json's sha256 (``manifests.verify_recorded``), as a TraceError."""
    try:
        return verify_recorded(p)
    except ManifestError as e:
        raise TraceError(str(e)) from None


def too_long_number(e: ValueError) -> str:
    """One line for the ValueError ``json.loads`` raises past Python's int-string conversion limit (4,300
    digits)."""
    return f"a number too long to read ({str(e).split(';')[0].strip()[:120]})"


def read_step_records(path: str | Path) -> tuple[pd.DataFrame, list[dict]]:
    """A JSON-lines step log read once: (the validated step table, the raw records in the same order, for the
    fields a writer logs beyond the table's, e.g. the vLLM plugin's ``hybrid`` counts)."""
    p = Path(path)
    if not p.exists():
        raise TraceError(f"{p}: no such step-timing file")
    recs = []
    with open(_verified(p)) as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    recs.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise TraceError(f"{p}:{lineno}: not JSON ({e.msg})") from e
                except ValueError as e:  # an integer past Python's int-string conversion limit
                    raise TraceError(f"{p}:{lineno}: {too_long_number(e)}") from None
    if not recs:
        raise TraceError(f"{p}: empty step-timing file")
    return validate_steps(pd.DataFrame(recs), str(p)), recs


# ---- helpers --------------------------------------------------------------------------------------------
def quantize_confidence(p) -> np.ndarray:
    """Probabilities in [0, 1] (NaN = none) -> the stored uint8 codes: round(254 p), 255 for NaN."""
    p = np.asarray(p, dtype=np.float32)
    q = np.full(p.shape, CONF_ABSENT, dtype=np.uint8)
    ok = ~np.isnan(p)
    if ((p[ok] < 0) | (p[ok] > 1)).any():
        raise TraceError(f"{CONF_COLUMN}: probabilities must lie in [0, 1] (or be NaN)")
    q[ok] = np.rint(p[ok] * CONF_SCALE).astype(np.uint8)
    return q


def dequantize_confidence(q) -> np.ndarray:
    """Stored uint8 codes -> float32 probabilities code / 254, NaN for 255."""
    q = np.asarray(q, dtype=np.uint8)
    out = q.astype(np.float32) / CONF_SCALE
    out[q == CONF_ABSENT] = np.nan
    return out


def _list_lengths(arr) -> np.ndarray:
    """The length of each list of an Arrow list array, 0 for a null, as int64."""
    import pyarrow.compute as pc

    return pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False).astype(np.int64)


def _conf_type():
    import pyarrow as pa

    return pa.list_(pa.uint8())


def _conf_series(arr, index) -> pd.Series:
    """An Arrow-backed pandas column of list<uint8> codes from an Arrow (chunked) list array: of codes
    (integers 0..255), or of probabilities (floats, NaN = none), which are quantized."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks else pa.array([], type=_conf_type())
    if arr.type == _conf_type() and arr.type.value_field.name != _conf_type().value_field.name:
        arr = arr.cast(_conf_type())        # parquet names the list's field "element": one dtype for all
    if arr.type != _conf_type():
        t = arr.type
        if not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)) or not (
                pa.types.is_floating(t.value_type) or pa.types.is_integer(t.value_type)):
            raise TraceError(f"acc: column {CONF_COLUMN!r} must hold lists of probabilities, got {t}")
        arr = arr.cast(pa.large_list(t.value_type))
        v = pc.list_flatten(arr).to_numpy(zero_copy_only=False)
        if pa.types.is_floating(t.value_type):
            v = quantize_confidence(v)
        elif len(v) and (v.min() < 0 or v.max() > CONF_ABSENT):
            raise TraceError(f"acc: column {CONF_COLUMN!r} holds codes outside 0..{CONF_ABSENT}")
        lens = _list_lengths(arr)
        off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        arr = pa.ListArray.from_arrays(pa.array(off), pa.array(np.asarray(v, np.uint8)), type=_conf_type(),
                                       mask=arr.is_null())
    return pd.Series(pd.arrays.ArrowExtensionArray(arr), index=index, name=CONF_COLUMN)


def _conf_from_blocks(blocks) -> "pa.Array":
    """list<uint8> codes over consecutive runs of rows: each block is (rows, [rows, k] probabilities) or
    (rows, None)."""
    import pyarrow as pa

    lens, vals, mask = [], [], []
    for n, cf in blocks:
        if cf is None:
            lens.append(np.zeros(n, np.int64))
            mask.append(np.ones(n, bool))
        else:
            lens.append(np.full(n, cf.shape[1], np.int64))
            vals.append(quantize_confidence(cf).ravel())
            mask.append(np.zeros(n, bool))
    off = np.concatenate([[0], np.cumsum(np.concatenate(lens))]).astype(np.int32)
    values = np.concatenate(vals) if vals else np.zeros(0, np.uint8)
    return pa.ListArray.from_arrays(pa.array(off), pa.array(values), type=_conf_type(),
                                    mask=pa.array(np.concatenate(mask)))


def _check_confidence(acc: pd.DataFrame, where: str) -> pd.Series:
    """The ``confidence`` column as list<uint8> codes (Arrow-backed), checked: each non-null list holds k_max
    codes (its row's k_max). Plain Python lists or arrays of probabilities (NaN = none) are quantized."""
    import pyarrow as pa

    col = acc[CONF_COLUMN]
    if getattr(col.dtype, "pyarrow_dtype", None) is not None:
        arr = col.array.__arrow_array__()
    else:  # plain lists / arrays of probabilities (a table built by hand, a reader that knows no Arrow types)
        vals = col.to_numpy(dtype=object)
        null = np.array([v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)) for v in vals], bool)
        try:
            rows = [np.asarray(v, dtype=np.float32).ravel() if not z else np.zeros(0, np.float32)
                    for v, z in zip(vals, null)]
        except (TypeError, ValueError) as e:
            raise TraceError(f"{where}: column {CONF_COLUMN!r} must hold lists of probabilities ({e})") from None
        off = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
        flat = np.concatenate(rows) if rows else np.zeros(0, np.float32)
        arr = pa.LargeListArray.from_arrays(pa.array(off), pa.array(flat), mask=pa.array(null))
    s = _conf_series(arr, col.index)
    a = s.array.__arrow_array__().combine_chunks() if len(s) else pa.array([], type=_conf_type())
    valid = a.is_valid().to_numpy(zero_copy_only=False)
    lens = _list_lengths(a)
    k = acc["k_max"].to_numpy(np.int64)
    bad = valid & (lens != k)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise TraceError(f"{where}: row {i}: {int(lens[i])} confidence values, expected k_max = {int(k[i])} (one "
                         f"per draft position)")
    return s


def _coerce(df: pd.DataFrame, schema: Mapping[str, str], where: str, extra: Sequence[str] = (),
            check: bool = True) -> pd.DataFrame:
    """``df``'s schema columns (then ``extra``) in the schema's dtypes; ``check``: its values checked too."""
    missing = [c for c in schema if c not in df.columns]
    if missing:
        raise TraceError(f"{where}: missing columns {missing}")
    cols = list(schema) + [c for c in extra if c not in schema]
    if not check and list(df.columns) == cols and all(str(df[c].dtype) == dt for c, dt in schema.items()):
        return df.reset_index(drop=True)   # already the schema's columns and dtypes: nothing to convert
    out = df[cols].copy()
    for c, dt in schema.items():
        _check_int_range(out[c], dt, where, c)
        try:
            out[c] = out[c].astype(dt)
        except (TypeError, ValueError) as e:
            raise TraceError(f"{where}: column {c!r} cannot be read as {dt} ({e})") from e
    if not check:
        return out.reset_index(drop=True)
    if where in ("acc", "requests") and len(out):
        _check_fields(out, schema, where)
    if where == "acc" and len(out):
        if (out["acc_len"] < 1).any():
            raise TraceError("acc: acc_len values must be >= 1 (accepted + 1)")
        if (out["acc_len"] > out["k_max"] + 1).any():
            raise TraceError("acc: acc_len exceeds k_max + 1")
        dl = out["draft_len"]
        if ((dl < 0) | (dl > out["k_max"])).fillna(False).any():
            raise TraceError("acc: draft_len must lie in 0..k_max")
        if _runs_are_whole(out):
            return out.reset_index(drop=True)
        g = out.groupby(["dataset", "model", "request_id", "proposer"], observed=True)
        stats = g.agg(n=("position", "size"), lo=("position", "min"), hi=("position", "max"),
                      L=("output_len", "first"), u=("position", "nunique"))
        bad = stats[(stats.lo != 0) | (stats.hi != stats.n - 1) | (stats.u != stats.n) | (stats.L != stats.n)]
        if len(bad):
            key, r = bad.index[0], bad.iloc[0]
            raise TraceError(f"acc: length mismatch for {key}: positions {r.lo}..{r.hi} ({r.n} rows, "
                             f"{r.u} distinct) but output_len = {r.L}; positions must be 0..output_len-1")
    return out.reset_index(drop=True)


def _check_fields(out: pd.DataFrame, schema: Mapping[str, str], where: str) -> None:
    """Every name present (no null dataset, model, proposer or request id), every length in range: a null would
    drop its requests from every group (0 requests, NaN), a negative prompt length would price negative KV."""
    for c, dt in schema.items():
        if dt == "string" and out[c].isna().any():
            i = int(np.flatnonzero(out[c].isna().to_numpy())[0])
            raise TraceError(f"{where}: column {c!r} is null in row {i}; every row needs a {c}")
    for c, lo in (("prompt_len", 0), ("output_len", 1), ("position", 0), ("k_max", 1)):
        if c in schema and (out[c] < lo).any():
            i = int(np.flatnonzero((out[c] < lo).to_numpy())[0])
            raise TraceError(f"{where}: column {c!r} = {out[c].iloc[i]} in row {i}; it must be >= {lo}")


def _changes(acc: pd.DataFrame, cols: Sequence[str]) -> np.ndarray:
    """Per row: True where any of ``cols`` differs from the row before (row 0: True; a null is a change).
    Every first occurrence of a combination is such a row, so questions about distinct combinations can be
    asked of these rows alone (a handful per request in every layout written here)."""
    ch = np.ones(len(acc), np.bool_)
    if len(acc) > 1:
        same = np.ones(len(acc) - 1, np.bool_)
        for c in cols:
            v = acc[c].array
            eq = v[1:] == v[:-1]
            same &= eq.to_numpy(dtype=np.bool_, na_value=False) if hasattr(eq, "to_numpy") else \
                np.asarray(eq, np.bool_)
        ch[1:] = ~same
    return ch


def _distinct(acc: pd.DataFrame, col: str) -> list:
    """The distinct values of one column, sorted (looked up on the rows where it changes)."""
    return sorted(acc[col].array[_changes(acc, [col])].unique().tolist())


def _where(df: pd.DataFrame, mask: np.ndarray, cols: Sequence[str]) -> pd.DataFrame:
    """The rows of ``df`` where ``mask`` holds, columns ``cols`` (a new 0..n-1 index). Column by column: a mask
    filters an arrow column chunk by chunk, where a DataFrame row selection takes rows, which first joins the
    chunks of each column (``Trace.concat`` keeps one per part): a copy of the whole column."""
    return pd.DataFrame({c: df[c].array[mask] for c in cols})


def _key_codes(acc: pd.DataFrame, cols: Sequence[str] = ("dataset", "model", "request_id")) -> np.ndarray:
    """One integer per row naming its combination of ``cols``, numbered in order of first appearance
    (compacted after each column, so it stays below rows x distinct values and never overflows). Only the rows
    where the combination changes are factorized; the others repeat the code of the row before."""
    ch = _changes(acc, cols)
    code = np.zeros(int(ch.sum()), dtype=np.int64)
    for c in cols:
        k, uniq = pd.factorize(acc[c].array[ch])
        code = pd.factorize(code * len(uniq) + k)[0]
    return code[np.cumsum(ch) - 1]


def _runs_are_whole(acc: pd.DataFrame) -> bool:
    """Fast path of the position check, for the layout every writer here produces: each (dataset, model,
    request, proposer) is one contiguous run of rows with positions 0..output_len-1 in order, and no key has two
    runs. True proves the check passes; False only means "not this layout" (the groupby check then decides)."""
    pos = acc["position"].to_numpy(np.int64)
    n = len(pos)
    start = pos == 0
    if not start[0]:
        return False
    key = ["dataset", "model", "request_id", "proposer"]
    # within a run: positions step by one, the key and output_len stay the same
    inner_ok = (pos[1:] == pos[:-1] + 1) & ~_changes(acc, [*key, "output_len"])[1:]
    if not (inner_ok | start[1:]).all():
        return False
    first = np.flatnonzero(start)
    if not (acc["output_len"].to_numpy(np.int64)[first] == np.diff(np.append(first, n))).all():
        return False
    return not _where(acc, start, key).duplicated().any()


def _check_requests_match(t: "Trace", where) -> None:
    """Every request of ``acc`` has exactly one row in ``requests`` with the same prompt and output lengths."""
    key = ["dataset", "model", "request_id"]
    if t.requests.duplicated(key).any():
        r = t.requests[t.requests.duplicated(key)].iloc[0]
        raise TraceError(f"{where}: request {r.request_id!r} listed twice in the request table")
    cols = key + ["prompt_len", "output_len"]
    heads = _where(t.acc, _changes(t.acc, key), cols)   # each request's first row is one of them
    per = list(zip(*(heads[c].tolist() for c in cols)))
    lens = {r[:3]: r[3:] for r in zip(*(t.requests[c].tolist() for c in cols))}
    first = {}
    for r in per:
        first.setdefault(r[:3], r[3:])                    # a request's lengths on its first row
    for k in first:
        if k not in lens:
            raise TraceError(f"{where}: request {k[2]!r} has acceptance rows but no entry in the request "
                             f"table")
    for k, v in first.items():
        if lens[k] != v:
            raise TraceError(f"{where}: request {k[2]!r}: prompt/output lengths differ between the "
                             f"acceptance rows and the request table")
    if "prompt_token_ids" in t.requests.columns:  # stored ids are the prompt: their count is its length
        n = [-1 if v is None or isinstance(v, float) else len(v) for v in t.requests["prompt_token_ids"]]
        off = np.flatnonzero((np.asarray(n) >= 0) & (np.asarray(n) != t.requests["prompt_len"].to_numpy()))
        if len(off):
            r = t.requests.iloc[int(off[0])]
            raise TraceError(f"{where}: request {r.request_id!r}: prompt_len {int(r.prompt_len)} but "
                             f"{n[int(off[0])]} prompt_token_ids")


def _check_int_range(col: pd.Series, dt: str, where: str, name: str) -> None:
    """Refuse values an integer column's dtype cannot hold (astype would wrap them silently) and non-integral
    floats (astype would truncate them). O(n) numpy; a column already of the target dtype is skipped."""
    if dt.lower() not in ("int16", "int32", "int64") or str(col.dtype) == dt:
        return
    kind = col.dtype.kind if isinstance(col.dtype, np.dtype) else getattr(col.dtype, "kind", "O")
    if kind not in "iuf":
        return  # strings / objects: astype raises (a TraceError below) or parses them
    v = col.to_numpy(dtype="float64", na_value=np.nan) if kind == "f" or not isinstance(col.dtype, np.dtype) \
        else col.to_numpy()
    if kind == "f" or v.dtype.kind == "f":
        fin = v[~np.isnan(v)] if dt[0] == "I" else v
        if not np.isfinite(fin).all():
            raise TraceError(f"{where}: column {name!r} holds non-finite values (NaN or inf)")
        if (fin != np.round(fin)).any():
            raise TraceError(f"{where}: column {name!r} holds non-integral values")
        v = fin
    if len(v):
        info = np.iinfo(dt.lower())
        lo, hi = v.min(), v.max()
        if lo < info.min or hi > info.max:
            bad = hi if hi > info.max else lo
            raise TraceError(f"{where}: column {name!r} holds {bad:.0f}, outside what the schema's {dt} can hold "
                             f"({info.min}..{info.max})")


def _check_acc_array(a, where: str, allow_empty: bool = False) -> np.ndarray:
    if not isinstance(a, (list, tuple, np.ndarray)):
        raise TraceError(f"{where}: acc_len must be a list of ints, got {type(a).__name__}")
    if len(a) == 0:
        if allow_empty:
            return np.zeros(0, np.int16)
        raise TraceError(f"{where}: empty acc_len list")
    try:
        arr = np.asarray(a)
    except Exception as e:
        raise TraceError(f"{where}: acc_len is not a flat list of ints") from e
    kind = arr.dtype.kind   # integers ("i", "u"), or floats that are finite whole numbers
    if arr.ndim != 1 or not (kind in "iu" or (kind == "f" and np.isfinite(arr).all()
                                              and np.all(arr == np.round(arr)))):
        raise TraceError(f"{where}: acc_len must be a flat list of finite ints")
    if arr.min() < 1:
        i = int(np.flatnonzero(arr < 1)[0])
        raise TraceError(f"{where}: acc_len[{i}] = {arr[i]} < 1 (it counts accepted + 1)")
    hi = _INT16_MAX
    if arr.max() > hi:
        i = int(np.flatnonzero(arr > hi)[0])
        raise TraceError(f"{where}: acc_len[{i}] = {arr[i]:.0f} exceeds {hi}, the largest acc_len the schema "
                         f"holds (int16; no step accepts that many tokens)")
    return arr.astype(np.int16, copy=False)


_INT16_MAX = int(np.iinfo(np.int16).max)


def _as_list(v):
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return []
    return [int(x) for x in v]


_KEY = ["dataset", "model", "request_id"]


def _request_first_rows(acc: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """Each request's first row of ``acc``: its key (``_KEY`` columns) and the row numbers, in row order."""
    ch = _changes(acc, _KEY)                            # every request's first row is one of them
    heads = _where(acc, ch, _KEY)
    first = ~heads.duplicated().to_numpy()
    return heads[first], np.flatnonzero(ch)[first]


def _id_column(acc: pd.DataFrame, req: pd.DataFrame, col: str, first: tuple[pd.DataFrame, np.ndarray]):
    """A list<int32> column over ``acc``'s rows: the request's ids on its first row (``first``:
    :func:`_request_first_rows`), null on the others."""
    import pyarrow as pa

    heads, rows = first
    lookup = {tuple(str(x) for x in k): v for k, v in zip(req[_KEY].itertuples(index=False, name=None), req[col])}
    keys = zip(*(heads[c].astype(str).tolist() for c in _KEY))
    lists = [lookup.get(k) for k in keys]
    lists = [None if v is None or (isinstance(v, float) and np.isnan(v)) else v for v in lists]
    arrs = [np.asarray(v) for v in lists if v is not None]
    ints = all(a.ndim == 1 and (a.dtype.kind in "iu" or not len(a)) for a in arrs)
    flat = np.concatenate([a for a in arrs if len(a)] or [np.zeros(0, np.int64)]) if ints else None
    i32 = np.iinfo(np.int32)
    if ints and (not len(flat) or (flat.min() >= i32.min and flat.max() <= i32.max)):
        # integer lists that fit: built from their offsets and values at once
        n = np.zeros(len(acc), np.int64)
        has = np.zeros(len(acc), np.bool_)
        sel = rows[[v is not None for v in lists]]
        n[sel] = [len(a) for a in arrs]
        has[sel] = True
        off = np.zeros(len(acc) + 1, np.int32)
        np.cumsum(n, out=off[1:])
        return pa.ListArray.from_arrays(pa.array(off), pa.array(flat.astype(np.int32)),
                                        type=pa.list_(pa.int32()), mask=pa.array(~has))
    vals: list = [None] * len(acc)   # anything else (ids as strings, floats, ...): element by element
    for row, v in zip(rows, lists):
        vals[row] = None if v is None else [int(x) for x in v]
    return pa.array(vals, type=pa.list_(pa.int32()))


def _text_column(acc: pd.DataFrame, req: pd.DataFrame, col: str, first: tuple[pd.DataFrame, np.ndarray]):
    """A string column over ``acc``'s rows: the request's ``col`` on its first row (``first``:
    :func:`_request_first_rows`), null on the others."""
    import pyarrow as pa

    heads, rows = first
    got = heads.merge(req[_KEY + [col]], on=_KEY, how="left")[col]
    vals = pa.array([None if v is None or (isinstance(v, float) and np.isnan(v)) or v is pd.NA else str(v)
                     for v in got.tolist()], pa.large_string())
    idx = np.full(len(acc), -1, np.int64)
    idx[rows] = np.arange(len(rows))
    return vals.take(pa.array(idx, mask=idx < 0))


def _requests_without_rows(heads: pd.DataFrame, req: pd.DataFrame) -> pd.DataFrame:
    """The requests of ``req`` that have no acceptance row (``heads``: the keys of the requests that have rows,
    once each, :func:`_request_first_rows`)."""
    if len(heads) == len(req):   # every request has rows (_check_requests_match: each acc request is in req)
        return req.iloc[:0]
    m = req[_KEY].merge(heads.assign(_has=True), on=_KEY, how="left")["_has"].isna().to_numpy()
    return req[m]


def _id_lists(arr) -> tuple[np.ndarray, list]:
    """The rows of a parquet list column that hold a list, and those lists (Python lists, as ``to_pylist``
    gives them), read from the column's offsets and flat values in one numpy pass rather than element by
    element."""
    import pyarrow as pa

    a = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    if pa.types.is_string(a.type) or pa.types.is_large_string(a.type):   # texts: one value per request
        valid = a.is_valid()
        return np.flatnonzero(valid.to_numpy(zero_copy_only=False)), a.filter(valid).to_pylist()
    if not (pa.types.is_list(a.type) or pa.types.is_large_list(a.type)) or a.values.null_count:
        vals = a.to_pylist()   # not a plain list column (or a null inside a list): element by element
        rows = np.array([i for i, v in enumerate(vals) if v is not None], np.int64)
        return rows, [vals[i] for i in rows]
    rows = np.flatnonzero(a.is_valid().to_numpy(zero_copy_only=False))
    off = a.offsets.to_numpy()   # absolute positions in a.values, the array's own offset included
    flat = a.values.to_numpy(zero_copy_only=False).tolist()
    return rows, [flat[off[i]:off[i + 1]] for i in rows]


def _attach_ids(acc: pd.DataFrame, requests: pd.DataFrame, ids: dict, path) -> pd.DataFrame:
    """Put the per-request columns read from a parquet file (``REQ_FILE_COLUMNS``: id lists, texts) back on
    ``requests`` (one value per request). Only the rows that carry them (each request's first) are looked at one
    by one."""
    requests = requests.copy()
    rkeys = [tuple(str(x) for x in k) for k in zip(*(requests[c].tolist() for c in _KEY))]
    keys_of: dict = {}   # the id columns' rows are the same rows (each request's first): their keys read once
    for col, arr in ids.items():
        rows, lists = _id_lists(arr)
        tag = rows.tobytes()
        if tag not in keys_of:
            keys_of[tag] = list(zip(*(acc[c].take(rows).astype(str).tolist() for c in _KEY)))
        found: dict = {}
        for k, v in zip(keys_of[tag], lists):
            if k in found:
                raise TraceError(f"{path}: request {k[2]!r} carries {col} twice")
            found[k] = v
        requests[col] = [found.get(k) for k in rkeys]
    return requests
