"""Tables derived from the study's published traces and committed under data/published (the traces themselves are
not redistributed): the per-draft-position acceptance table is consistent with its own definitions and its
manifest, n-gram's draft length is recovered from token ids, and, where the traces are on this machine
(SPEC_REPRO_PUBLISHED_TRACES, a folder with the four combined_<dataset>.jsonl), it regenerates byte for byte."""
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from spec_repro import metrics as M
from spec_repro.paths import data_dir
from spec_repro.published import (
    DRAFT_POSITION_KS,
    draft_position_table,
    read_draft_position_rates,
    read_published_jsonl,
    with_ngram_draft_len,
)
from spec_repro.tracefiles import read_trace
from spec_repro.traces import STUDY_FILES, Trace

TABLE = data_dir() / "published" / "draft_position_rates.csv"
PUB = Path(os.environ.get("SPEC_REPRO_PUBLISHED_TRACES", "/nonexistent"))
FILES = [PUB / name for name, _, _ in STUDY_FILES.values()]


def test_committed_table_follows_its_definitions():
    t = read_draft_position_rates()
    assert list(t.columns) == ["dataset", "model", "proposer", "k", "draft_position", "rate", "conditional_rate",
                               "drafts"]
    assert set(t["dataset"]) == {"cnn", "gsm8k", "instructcoder", "sharegpt"} and set(t["k"]) == set(DRAFT_POSITION_KS)
    assert set(t["proposer"]) == {"eagle", "ngram"}
    for _, g in t.groupby(["dataset", "proposer", "k"]):
        g = g.sort_values("draft_position")
        assert g["draft_position"].tolist() == list(range(1, g["k"].iloc[0] + 1))
        r, c = g["rate"].to_numpy(), g["conditional_rate"].to_numpy()
        assert (np.diff(r) <= 0).all() and r[0] == c[0]                      # unconditional: falls with i
        assert np.allclose(r[1:] / r[:-1], c[1:], atol=2e-3)                 # rate_i = rate_(i-1) x conditional_i
    five = t[(t["k"] == 5) & (t["dataset"] == "sharegpt") & (t["proposer"] == "eagle")]
    assert five["rate"].round(2).tolist() == [0.61, 0.37, 0.24, 0.17, 0.12]
    assert five["conditional_rate"].round(2).tolist() == [0.61, 0.61, 0.65, 0.69, 0.73]


def test_manifest_names_the_study_files():
    e = json.loads((TABLE.parent / "MANIFEST.json").read_text())[TABLE.name]
    assert e["source_repo"] == "https://github.com/SpecDecode-Bench/simulator" and len(e["source_commit"]) == 40
    assert {f["sha256"] for f in e["source_files"].values()} == set(STUDY_FILES)
    assert all(f["study_file"] for f in e["source_files"].values())
    assert e["command"].startswith("python -m spec_repro.published draft-position-rates")
    assert "SpecDecode-Bench/simulator @ " + e["source_commit"][:7] in read_draft_position_rates().attrs["source"]


def test_ngram_draft_len_recovered_from_token_ids(tmp_path):
    """A package trace written in the study's format (draft_len dropped) and read back: the lookup recomputed from
    its token ids gives back every recorded draft_len, hence the same rates."""
    t = read_trace(data_dir() / "traces" / "smollm2-135m__code-edit.parquet")
    keep = sorted(t.requests["request_id"].unique())[:6]
    t = Trace(t.acc[t.acc["request_id"].isin(keep) & (t.acc["proposer"] == "ngram")].reset_index(drop=True),
              t.requests[t.requests["request_id"].isin(keep)].reset_index(drop=True), dict(t.meta))
    p = read_published_jsonl(t.to_published_jsonl(tmp_path / "x_ngram.jsonl"), k_max=int(t.acc["k_max"].max()))
    assert p.acc["draft_len"].isna().all()
    q, report = with_ngram_draft_len(p)
    (rep,) = report.values()
    assert rep["alignment"] == "package" and rep["agreement"]["package"] == 1.0
    key = ["request_id", "position"]
    assert (q.acc.sort_values(key)["draft_len"].to_numpy() == t.acc.sort_values(key)["draft_len"].to_numpy()).all()
    cols = ["rate", "conditional_rate", "drafts"]
    pd.testing.assert_frame_equal(M.acceptance_by_draft_position(q, k=3)[cols],
                                  M.acceptance_by_draft_position(t, k=3)[cols])


@pytest.mark.skipif(not all(f.exists() for f in FILES), reason="published traces not present (set SPEC_REPRO_PUBLISHED_TRACES)")
def test_committed_table_regenerates_from_the_published_traces(tmp_path):
    table, files = draft_position_table(FILES)
    table.to_csv(tmp_path / "t.csv", index=False)
    assert (tmp_path / "t.csv").read_bytes() == TABLE.read_bytes()
    assert all(f["ngram_lookup"] and next(iter(f["ngram_lookup"].values()))["alignment"] == "study"
               for f in files.values())
