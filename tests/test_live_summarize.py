"""``live summarize`` (``engines.vllm.live_summary.summarize``) writes a live folder whole or not at all: the recorded
device outputs in tests/fixtures/vllm summarized over a copy of a committed live folder
(data/gpu/v1-runner/host-probe: its
profile, host record and head files beside the tables); a writer failing after others wrote leaves every byte of
the folder as it was, MANIFEST.json included; a run that finishes replaces the tables, keeps the files it only
read, and records what is there."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from spec_repro.engines.vllm import live, live_summary
from spec_repro.paths import v1_runner_dir
from spec_repro.provenance import sha256_file

FIXTURES = Path(__file__).parent / "fixtures" / "vllm"
LIVE10 = v1_runner_dir("host-probe")
TRACE = "hybrid_trace_sharegpt_s11.jsonl"        # the device-side hybrid's profile: summarize reads it from out


def snapshot(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture()
def raw(tmp_path):
    r = tmp_path / "raw"
    shutil.copytree(FIXTURES, r)
    return r


@pytest.fixture()
def out(tmp_path):
    o = tmp_path / "live10"
    shutil.copytree(LIVE10, o)
    return o


def test_a_failed_summarize_leaves_the_folder_byte_identical(raw, out, monkeypatch):
    before = snapshot(out)
    seen = {}

    def failing_table(folder, name, workload, ta):     # the last writer before the manifest
        seen.update(folder=folder, trace=(folder / TRACE).read_bytes(), runs=(folder / "runs.csv").read_bytes())
        raise RuntimeError("a table writer failed")

    monkeypatch.setattr(live_summary, "_write_table", failing_table)
    with pytest.raises(RuntimeError, match="a table writer failed"):
        live_summary.summarize(raw, out)
    # the writer ran in the stage, over the new runs.csv and a copy of the profile already in out
    assert seen["folder"].parent == out and seen["folder"].name.startswith(".stage.")
    assert seen["trace"] == before[TRACE] and seen["runs"] != before["runs.csv"]
    assert snapshot(out) == before                     # every file, MANIFEST.json and its sha256s included
    assert sorted(p.name for p in out.iterdir()) == sorted(before)      # no stage left behind


def test_a_summarize_that_finishes_replaces_the_tables_and_keeps_what_it_read(raw, out, tmp_path, monkeypatch):
    before = snapshot(out)
    trace_inode = (out / TRACE).stat().st_ino
    fresh = tmp_path / "fresh"
    live_summary.summarize(raw, fresh)                 # the same raw folder into an empty one: no table to write
    assert sorted(p.name for p in fresh.iterdir()) == ["MANIFEST.json", "runs.csv", "steps.parquet"]

    def table(folder, name, workload, ta):             # the device table's input, as the stage holds it
        trace = live_summary.device_trace(folder, workload)
        (folder / name).write_text(f"{trace.name},{sha256_file(trace)}\n")

    monkeypatch.setattr(live_summary, "_write_table", table)
    res = live_summary.summarize(raw, out, command="live summarize (test)")
    assert res == {"runs": 5, "steps": 208, "engines": 1}
    after = snapshot(out)
    for name in ("runs.csv", "steps.parquet"):         # replaced by the fixture's
        assert after[name] == (fresh / name).read_bytes() != before[name]
    assert after["device_hybrid_sharegpt.csv"].decode() == f"{TRACE},{sha256_file(LIVE10 / TRACE)}\n"
    # what summarize only read or did not write stays as it was; the profile is the same file, not a copy
    kept = set(before) - {"runs.csv", "steps.parquet", "device_hybrid_sharegpt.csv", "MANIFEST.json"}
    assert kept and all(after[n] == before[n] for n in kept)
    assert (out / TRACE).stat().st_ino == trace_inode
    assert sorted(after) == sorted(before)             # no stage, nothing else
    man = json.loads(after["MANIFEST.json"])
    assert man["_device_runs"]["summarize_command"] == "live summarize (test)"
    for name in set(after) - {"MANIFEST.json", "README.md"}:
        assert man[name]["sha256"] == sha256_file(out / name), name
    assert man[TRACE]["kind"].startswith("measured on the lent H200")      # profiled on the device (bf16)


def test_the_command_line_refuses_an_out_inside_raw_in_one_line(raw, capsys):
    before = snapshot(raw)
    assert live.main(["summarize", "--raw", str(raw), "--out", str(raw / "live")]) == 2
    err = capsys.readouterr().err
    assert "overlap" in err and len(err.strip().splitlines()) == 1
    assert snapshot(raw) == before
