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


def test_speedups_are_the_grid_over_its_co_resident_no_sd_engine(v2):
    """EAGLE's engines ran resident beside a no-SD engine, runs rotated: each is divided by that engine; n-gram
    (V1, started alone) by the least contended no-SD engine started alone."""
    df, src = v2
    table = pd.read_csv(GRID / "table.csv")
    nones = table[table["method"] == "none"]
    grouped = nones[nones["group"].notna()]
    assert grouped["engine"].unique().tolist() == ["v2grid-none-k0#1"]
    alone = nones[nones["group"].isna()].groupby("engine")["steal_share"].mean().idxmin()
    assert alone == "v2grid-none-k0#2"
    sd = table[(table["method"] != "none")].drop_duplicates(["workload", "batch_size", "method", "k"])
    sd = sd.set_index(["workload", "batch_size", "method", "k"])
    assert len(df) == len(sd) == 40                    # EAGLE k = 1, 2, 3, 5 and n-gram k = 5 x 2 workloads x 4 bs
    for r in df.itertuples():
        m, k = r.method.rsplit("-k", 1)
        row = sd.loc[(r.dataset, r.batch_size, m, int(k))]
        base = nones[nones["engine"] == ("v2grid-none-k0#1" if isinstance(row["group"], str) else alone)]
        want = row["tok_s"] / base.set_index(["workload", "batch_size"])["tok_s"][(r.dataset, r.batch_size)]
        assert r.speedup == pytest.approx(want, rel=1e-4), r
        assert isinstance(row["group"], str) == m.startswith("eagle")
    live, _ = M.live_speedups()
    assert set(live.columns) <= set(df.columns)
    assert {"runner", "contended", "steal_share"} <= set(df.columns)
    assert (df["engine_config"] == "default").all() and (df["weights"] == "real").all()
    assert dict(df.groupby("method")["runner"].agg(set)) == {
        "eagle-k1": {"V2"}, "eagle-k2": {"V2"}, "eagle-k3": {"V2"}, "eagle-k5": {"V2"}, "ngram-k5": {"V1"}}
    # AL in the label: the mean over the workload's batch sizes (code-edit, EAGLE k = 3: 2.85, 2.83, 2.73, 2.72)
    p = df[(df["dataset"] == "code-edit") & (df["method"] == "eagle-k3")]["proposers"].unique()
    assert list(p) == ["eagle k=3 (AL 2.78, real weights)"]


def test_contended_points_are_the_runs_started_alone_with_steal(v2):
    """Co-resident EAGLE points are never contended (the host's epochs fall on no SD alike); n-gram's, started
    alone, are where the hypervisor stole CLEAN_STEAL of their wall time."""
    df, _ = v2
    eagle = df["method"].str.startswith("eagle")
    assert not df.loc[eagle, "contended"].any()
    ng = df[~eagle]
    assert (ng["contended"] == (ng["steal_share"] >= CLEAN_STEAL)).all()
    assert {(r.dataset, r.batch_size) for r in ng[ng["contended"]].itertuples()} == {
        ("code-edit", 64), ("sharegpt", 1), ("sharegpt", 8)}
    t = M.v2_table(df)
    assert t.loc[("code-edit", 1), "eagle-k3"] == "2.11" and t.loc[("code-edit", 64), "eagle-k3"] == "1.26"
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
        ("code-edit, qwen2.5-coder-1.5b (vLLM V2): best (eagle-k3), bs 1 -> 64", "2.11x -> 1.26x", "agrees", True,
         src),
        ("sharegpt, qwen2.5-coder-1.5b (vLLM V2): best (eagle-k2), bs 1 -> 64", "1.37x -> 1.08x", "agrees", True,
         src)]
    assert [(r.short, r.this_run, r.headline) for r in rows[2:]] == [
        ("code-edit, qwen2.5-coder-1.5b (vLLM V1, forced): best (pr24344-skip), bs 1 -> 64", "1.21x -> 0.55x", False)]
    # the README's results table fits them: one row each within README_LINE, whatever the source key
    for r in rows[:2]:
        line = f"| 1 | {r.short} | {r.paper} | {r.this_run} | {F._verdict_short(r.verdict)} | B99 |"
        assert len(line) <= F.README_LINE, line
