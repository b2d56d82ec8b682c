"""vLLM's default engine with real weights (``data/gpu/v2grid``) as finding 1 reads it: ``measured.v2_speedups``
against the committed tables it comes from, and the summary rows built on it."""
import json

import numpy as np
import pandas as pd
import pytest

from spec_repro import findings as F
from spec_repro import measured as M
from spec_repro.engines.vllm.v2grid import CLEAN_STEAL
from spec_repro.paths import data_dir

GRID = data_dir() / "gpu" / "v2grid"


@pytest.fixture(scope="module")
def v2():
    return M.v2_speedups()


def test_speedups_are_the_grid_over_its_least_contended_no_sd_engine(v2):
    df, src = v2
    table = pd.read_csv(GRID / "table.csv")
    nones = table[table["method"] == "none"]
    base_engine = nones.groupby("engine")["steal_share"].mean().idxmin()
    assert base_engine == "v2grid-none-k0#1"
    base = nones[nones["engine"] == base_engine].set_index(["workload", "batch_size"])["tok_s"]
    sd = table[table["method"] != "none"].set_index(["workload", "batch_size", "method", "k"])["tok_s"]
    assert len(df) == len(sd) == 40                    # EAGLE k = 1, 2, 3, 5 and n-gram k = 5 x 2 workloads x 4 bs
    for r in df.itertuples():
        m, k = r.method.rsplit("-k", 1)
        want = sd[(r.dataset, r.batch_size, m, int(k))] / base[(r.dataset, r.batch_size)]
        assert r.speedup == pytest.approx(want, rel=1e-4), r
    live, _ = M.live_speedups()
    assert set(live.columns) <= set(df.columns)
    assert {"runner", "contended", "steal_share"} <= set(df.columns)
    assert (df["engine_config"] == "default").all() and (df["weights"] == "real").all()
    assert dict(df.groupby("method")["runner"].agg(set)) == {
        "eagle-k1": {"V2"}, "eagle-k2": {"V2"}, "eagle-k3": {"V2"}, "eagle-k5": {"V2"}, "ngram-k5": {"V1"}}
    # AL in the label: the mean over the workload's batch sizes (code-edit, EAGLE k = 3: 2.62, 2.62, 2.52, 2.52)
    p = df[(df["dataset"] == "code-edit") & (df["method"] == "eagle-k3")]["proposers"].unique()
    assert list(p) == ["eagle k=3 (AL 2.57, real weights)"]


def test_contended_points_are_the_runs_with_steal(v2):
    df, _ = v2
    assert (df["contended"] == (df["steal_share"] >= CLEAN_STEAL)).all()
    clean = {(r.method, r.dataset, r.batch_size) for r in df[~df["contended"]].itertuples()}
    assert clean == {("eagle-k3", "code-edit", 1), ("eagle-k3", "code-edit", 8), ("eagle-k3", "sharegpt", 32),
                     ("eagle-k3", "sharegpt", 64), ("eagle-k2", "code-edit", 32), ("eagle-k2", "code-edit", 64)}
    t = M.v2_table(df)
    assert t.loc[("code-edit", 1), "eagle-k3"] == "1.72" and t.loc[("code-edit", 64), "eagle-k3"] == "0.92*"
    assert t.shape == (8, 5)


def test_ceiling_is_live_throughputs_at_the_same_prompts(v2):
    """The HBM ceiling is priced as ``live.throughput`` prices it: code-edit's first prompts are the same requests in
    both grids, so the ceiling per accepted token agrees with the V1 (forced) table's at every batch size."""
    df, _ = v2
    live, _ = M.live_speedups()
    per_tok = ((df["ceiling_tok_s"] / df["acceptance_length"]).groupby([df["dataset"], df["batch_size"]])
               .agg(["min", "max"]))
    assert np.allclose(per_tok["min"], per_tok["max"])          # one context per workload and batch size
    lv = (live["ceiling_tok_s"] / live["acceptance_length"]).groupby(live["batch_size"]).first()
    assert np.allclose(per_tok.loc["code-edit", "min"].to_numpy(), lv.to_numpy(), rtol=1e-9)
    assert (df["ceiling_tok_s"] > df["tokens_per_s"]).all()


def test_source_names_what_ran(v2):
    _, src = v2
    for bit in ("vLLM 0.25.0", "default engine", "uninstrumented", "real weights", "one H200", "V2 runner",
                "async scheduling", "n-gram on the V1 runner", "ratios.csv (NVIDIA H200", "vllm 0.25.0"):
        assert bit in src, bit


def test_a_folder_without_the_raw_records_or_the_table(tmp_path):
    (tmp_path / "ratios.csv").write_text((GRID / "ratios.csv").read_text())
    (tmp_path / "MANIFEST.json").write_text(json.dumps(
        {"files": {"ratios.csv": "0" * 64},
         "engines": [{"spec": "s", "env": {"gpu": "G", "vllm": "9.9", "torch": "1"}}]}))
    df, src = M.v2_speedups(tmp_path)
    assert len(df) == 40 and df["ceiling_tok_s"].isna().all()      # no results.jsonl.gz: no prompt lengths
    assert src.endswith("ratios.csv (G; vllm 9.9, torch 1)")
    assert M.v2_speedups(tmp_path / "none") == (None, f"measured (vLLM default engine, V2 grid): no ratios.csv under "
                                                      f"{tmp_path / 'none'}")


def test_summary_rows_headline_the_default_engine_per_workload(v2):
    df, src = v2
    live, lsrc = M.live_speedups()
    rows = F.finding1_rows(None, None, sim_source="", live=live, live_source=lsrc, v2=df, v2_source=src)
    got = [(r.short, r.this_run, r.verdict, r.headline, r.source) for r in rows]
    assert got[:2] == [
        ("code-edit, qwen2.5-coder-1.5b (vLLM V2): best (eagle-k3), bs 1 -> 64", "1.72x -> 0.92x",
         "agrees (slower than no SD at bs 64; host-contended at bs 64: a lower bound there)", True, src),
        ("sharegpt, qwen2.5-coder-1.5b (vLLM V2): best (eagle-k3), bs 1 -> 64", "1.30x -> 0.96x",
         "agrees (slower than no SD at bs 64; host-contended at bs 1: a lower bound there)", True, src)]
    assert [(r.short, r.this_run, r.headline) for r in rows[2:]] == [
        ("code-edit, qwen2.5-coder-1.5b (vLLM V1, forced): best (pr24344-skip), bs 1 -> 64", "1.21x -> 0.55x", False)]
    # the README's results table fits them: one row each within README_LINE, whatever the source key
    for r in rows[:2]:
        line = f"| 1 | {r.short} | {r.paper} | {r.this_run} | {F._verdict_short(r.verdict)} | B99 |"
        assert len(line) <= F.README_LINE, line
