"""Trace files on disk: the committed files checked against their MANIFEST.json's sha256 when read (a changed
file is one line naming it; a file without an entry reads as it is), and a request table of any size read back
(each request's columns on its first row; files with the table as JSON in the footer still read)."""
import json
import shutil
import time

import numpy as np
import pandas as pd
import pytest

from spec_repro.paths import data_dir, load_traces
from spec_repro.provenance import ChangedFileError, sha256_file, verify_recorded
from spec_repro.tracefiles import read_trace
from spec_repro.traces import Trace, TraceError

TRACES = data_dir() / "traces"
NAME = "smollm2-135m__humaneval.parquet"


def _copy(tmp_path, names=(NAME,)):
    d = tmp_path / "traces"
    d.mkdir()
    shutil.copy(TRACES / "MANIFEST.json", d)
    for n in names:
        shutil.copy(TRACES / n, d)
    return d


# ---- sha256 against the manifest ----------------------------------------------------------------------------
def test_every_committed_data_file_has_its_sha256_and_it_matches():
    """Every entry of every MANIFEST.json under data/ that names a file beside it records the file's sha256, and
    the file hashes to it (the folders under data/gpu/: tests/test_gpu_manifests.py)."""
    checked = 0
    for man in sorted(data_dir().glob("*/MANIFEST.json")):
        for key, e in json.loads(man.read_text()).items():
            f = man.parent / (e.get("file") or key) if isinstance(e, dict) else None
            if f is None or not f.is_file():
                continue
            assert len(e.get("sha256") or "") == 64, f"{f}: no sha256 in {man}"
            assert sha256_file(f) == e["sha256"], f"{f} differs from {man}"
            checked += 1
    assert checked >= 10 + 3 + 2 + 1   # the ten traces, data/cpu, data/heads' step logs, data/published


@pytest.mark.parametrize("how", ["flip", "append"])
def test_a_changed_trace_is_one_line_naming_it(tmp_path, how):
    d = _copy(tmp_path)
    f = d / NAME
    assert len(read_trace(f).requests) > 0                    # untouched: reads
    b = bytearray(f.read_bytes())
    if how == "flip":
        b[len(b) // 2] ^= 0x01
    else:
        b += b"\0"
    f.write_bytes(bytes(b))
    for read in (read_trace, Trace.from_parquet, lambda p: load_traces(str(p))):
        with pytest.raises(TraceError) as e:
            read(f)
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(f"{f}: changed since it was recorded"), msg
        assert "MANIFEST.json records" in msg and "git checkout --" in msg


def test_a_changed_trace_at_the_cli_is_one_error_line(tmp_path):
    from spec_repro.cli import main

    d = _copy(tmp_path)
    f = d / NAME
    f.write_bytes(f.read_bytes() + b"x")
    with pytest.raises(SystemExit) as e:
        main(["simulate", "--traces", str(f), "--proposers", "ngram", "--policy", "oracle", "--batch-sizes", "1",
              "--out", str(tmp_path / "o.csv"), "--no-progress"])
    msg = str(e.value.code)
    assert msg.startswith("error: ") and "\n" not in msg and "changed since it was recorded" in msg, msg
    assert not (tmp_path / "o.csv").exists()


def test_files_without_a_recorded_sha256_read_as_they_are(tmp_path):
    d = _copy(tmp_path)
    man = json.loads((d / "MANIFEST.json").read_text())
    del man[NAME]["sha256"]
    (d / "MANIFEST.json").write_text(json.dumps(man))
    f = d / NAME
    f.write_bytes(f.read_bytes())                             # an entry without sha256: not checked
    assert verify_recorded(f) == f
    own = tmp_path / "own" / "mine.parquet"                  # a user's own trace, no manifest beside it
    read_trace(TRACES / NAME).to_parquet(own)
    assert len(read_trace(own).requests) == len(read_trace(f).requests)


def test_the_check_follows_the_file_and_hashes_it_once(tmp_path, monkeypatch):
    import spec_repro.manifests as prov

    d = _copy(tmp_path)
    f = d / NAME
    calls = []
    real = prov.sha256_file
    monkeypatch.setattr(prov, "sha256_file", lambda p: calls.append(p) or real(p))
    prov._HASHES.clear()
    for _ in range(3):
        verify_recorded(f)
    assert len(calls) == 1                                    # once per file and version
    good = f.read_bytes()
    f.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))          # same size: the mtime (and bytes) tell
    with pytest.raises(ChangedFileError):
        verify_recorded(f)
    f.write_bytes(good)
    assert verify_recorded(f) == f


def test_a_changed_step_log_is_named(tmp_path):
    from spec_repro.traces import read_steps

    d = tmp_path / "cpu"
    shutil.copytree(data_dir() / "cpu", d)
    f = d / "steps_smollm2-135m.parquet"
    assert len(read_steps(f))
    f.write_bytes(f.read_bytes() + b"\0")
    with pytest.raises(TraceError, match=r"steps_smollm2-135m.parquet: changed since it was recorded"):
        read_steps(f)


def test_rewriting_a_trace_records_its_new_sha256(tmp_path):
    """add_proposers rewrites the file and its manifest entry: the new sha256 is recorded, so it reads."""
    from spec_repro import collect
    from spec_repro.proposers import make_proposer

    d = _copy(tmp_path)
    f = d / NAME
    before = json.loads((d / "MANIFEST.json").read_text())[NAME]["sha256"]
    collect.add_proposers(f, {"ngram": make_proposer("ngram")}, replace=True, quiet=True)
    after = json.loads((d / "MANIFEST.json").read_text())[NAME]["sha256"]
    assert after == sha256_file(f)
    assert len(read_trace(f).requests) > 0
    assert before != after or sha256_file(TRACES / NAME) == after


# ---- the request table at any size ----------------------------------------------------------------------------
def _big_trace(n: int) -> Trace:
    """n requests of 1 or 2 output positions, one proposer: built with numpy, no decode."""
    import pyarrow as pa

    L = (1 + np.arange(n) % 2).astype(np.int32)
    row_req = np.repeat(np.arange(n), L)
    ids = pa.array([f"r{i}" for i in range(n)], pa.large_string())
    P = (1 + np.arange(n) % 500).astype(np.int32)
    rows = len(row_req)
    acc = pd.DataFrame({
        "request_id": pd.arrays.ArrowStringArray(ids.take(pa.array(row_req))), "dataset": "d", "model": "m",
        "proposer": "ngram", "position": (np.arange(rows) - np.repeat(np.cumsum(L) - L, L)).astype(np.int32),
        "acc_len": (1 + row_req % 4).astype(np.int16), "k_max": np.int16(3),
        "draft_len": pd.array(np.full(rows, 3, np.int16), dtype="Int16"), "prompt_len": P[row_req],
        "output_len": L[row_req]})
    req = pd.DataFrame({"request_id": pd.arrays.ArrowStringArray(ids), "dataset": "d", "model": "m",
                        "prompt_len": P, "output_len": L})
    return Trace(acc, req, {"source": "numpy"})


def test_a_million_requests_read_back(tmp_path):
    """10^6 requests: the table as JSON in the footer (~83 MB) would pass Thrift's limit and not read back."""
    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    t = _big_trace(10**6)
    f = t.to_parquet(tmp_path / "big.parquet")
    assert b"spec_repro.requests" not in pq.read_schema(f).metadata
    u = Trace.from_parquet(f)
    assert len(u.requests) == 10**6 and len(u.acc) == len(t.acc) == 1_500_000
    r = u.requests.set_index("request_id")
    for i in (0, 1, 499_999, 999_999):
        assert (r.loc[f"r{i}", "prompt_len"], r.loc[f"r{i}", "output_len"]) == (1 + i % 500, 1 + i % 2)
    assert u.acc["acc_len"].to_numpy().sum() == t.acc["acc_len"].to_numpy().sum()
    assert u.meta == {"source": "numpy"}
    assert time.perf_counter() - t0 < 60


def test_request_columns_round_trip_and_old_files_read(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    info = {"a": {"prompt_token_ids": [1, 2, 3], "output_token_ids": [4, 5], "prompt_text": "p a",
                  "output_text": "o a"},
            "b": {"prompt_token_ids": [1, 2], "output_token_ids": [6, 7, 8], "output_text": "o b"}}
    t = Trace.from_arrays({"a": {"ngram": [2, 1], "eagle": [1, 1]}, "b": {"ngram": [1, 2, 1], "eagle": [3, 1, 1]}},
                          prompt_lens={"a": 3, "b": 2}, dataset="x", model="m", k_max=3, request_info=info)
    lone = pd.DataFrame([{"request_id": "c", "dataset": "x", "model": "m", "prompt_len": 4, "output_len": 2}])
    t = Trace(t.acc, pd.concat([t.requests, lone], ignore_index=True), t.meta)   # a request with no rows
    f = t.to_parquet(tmp_path / "new.parquet")
    schema = pq.read_schema(f)
    assert schema.metadata[b"spec_repro.schema"] == b"acc-v2"
    assert str(schema.field("output_text").type) == "large_string"
    u = read_trace(f)

    def norm(r):
        return r.set_index("request_id").sort_index().map(
            lambda v: list(v) if isinstance(v, (list, np.ndarray)) else (None if pd.isna(v) else v))
    pd.testing.assert_frame_equal(norm(u.requests), norm(t.requests), check_dtype=False)
    pd.testing.assert_frame_equal(u.acc, t.acc)
    assert read_trace(u.to_parquet(tmp_path / "again.parquet")).requests.equals(u.requests)
    # a file with the request table as JSON in its footer (schema acc-v1) reads as before
    table = pa.Table.from_pandas(t.acc, preserve_index=False)
    md = {**table.schema.metadata, b"spec_repro.requests": t.requests.to_json(orient="records").encode(),
          b"spec_repro.meta": b"{}", b"spec_repro.schema": b"acc-v1"}
    pq.write_table(table.replace_schema_metadata(md), tmp_path / "old.parquet")
    pd.testing.assert_frame_equal(norm(read_trace(tmp_path / "old.parquet").requests), norm(t.requests),
                                  check_dtype=False)
