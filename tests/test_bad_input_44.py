"""Issue 44: cases of a hostile probe. Each ends in ONE clear ``error:`` line and a non-zero exit (or the correct
result); never a traceback, a silently dropped value or a stale folder left behind.

Fast: tiny fixtures, in-process CLI; the real model is never loaded."""
from __future__ import annotations

from test_bad_input import _check_error, good_records, run, sim, write_jsonl


def test_dynamic_k_duplicate_batch_size_refused(tmp_path):
    t = write_jsonl(tmp_path / "t.jsonl", good_records())
    code, msg = run(sim(t, "--dynamic-k", "1:5", "1:2", tmp=tmp_path, proposers="eagle", policy=("dynamic-k",)))
    _check_error(code, msg, "--dynamic-k.*batch size 1 more than one")
    assert not (tmp_path / "out.csv").exists()
