"""Every row of ``reproduce``'s summary names its runner, weights and engine configuration (``rowlabels``).

Recorded data only: the committed vLLM records under data/gpu (results.jsonl: the Llama-dims and SmolLM2 engines,
each engine record holding the config it ran), data/gpu/v2grid's raw records (vLLM's own runner choice, read from
each engine's resolved config: V2 for no SD and EAGLE, V1 for n-gram) copied outside data/gpu as a user's
``reproduce --profile gpu`` results would be, and the committed summary of a ``reproduce --profile gpu`` run
(data/gpu/v1-runner/reproduce-grid/summary.csv, written before the sources carried the labels)."""
from __future__ import annotations

import gzip
import json

import pandas as pd

from spec_repro import measured
from spec_repro.paths import data_dir, v1_runner_dir
from spec_repro.rowlabels import COLUMNS, UNKNOWN, label_rows, row_labels


def _engines(path):
    return [d for d in (json.loads(x) for x in open(path) if x.strip()) if d.get("kind") == "engine"]


def test_the_measured_vllm_sources_name_what_their_engines_ran():
    # what the committed engine records say, read here on their own: every Llama-dims / SmolLM2 engine forced
    # the V1 runner and synchronous scheduling (study-like)
    recs = _engines(data_dir() / "gpu" / "results.jsonl")
    assert {(e["config"].get("model_runner"), e["config"].get("async_scheduling")) for e in recs} == {("v1", False)}
    for fn, weights in ((measured.gpu_speedups, "dummy"), (measured.gpu_steps, "dummy"),
                        (measured.gpu_verify_limits, "dummy"), (measured.acceptance_agreement, "real")):
        _d, src = fn()
        assert row_labels("", src) == {"runner": "v1", "weights": weights, "configuration": "study-like"}, fn


def test_a_gpu_profile_run_is_labelled_from_its_engines_resolved_config(tmp_path):
    res = tmp_path / "raw" / "results.jsonl"
    res.parent.mkdir()
    with gzip.open(data_dir() / "gpu" / "v2grid" / "results.jsonl.gz", "rt") as f:
        res.write_text(f.read())
    for e in _engines(res):        # the config chose nothing: the runner is the resolved one
        assert e["config"]["model_runner"] == "default" and e["resolved"]["runner"] in ("v1", "v2")
    _d, src = measured.gpu_speedups(files=[res], task="hybrid")
    assert row_labels("", src) == {"runner": "eagle v2, ngram v1, none v2",
                                   "weights": "real", "configuration": "default"}


def test_every_committed_summary_row_gets_the_three_labels():
    s = label_rows(pd.read_csv(v1_runner_dir("reproduce-grid") / "summary.csv"))
    assert all(s[c].astype(str).str.len().gt(0).all() for c in COLUMNS)
    sim = s["source"].str.startswith("simulated")
    assert (s.loc[sim, "runner"] == "simulated").all()
    assert s.loc[sim, "configuration"].str.startswith("cost model ").all()
    live = s["source"].str.contains("V1 runner (forced)", regex=False)
    assert live.sum() == 5 and (s.loc[live, "configuration"] == "v1-forced").all()
    # written before the sources carried their engines' labels: the Llama-dims, verify-limit and SmolLM2 rows
    # say no runner; the same sources made now do (the test above)
    old = s["runner"] == UNKNOWN
    assert old.sum() == 13 and s.loc[old, "source"].str.contains("vllm", case=False).all()
