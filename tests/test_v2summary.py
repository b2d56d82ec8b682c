"""``v2hybrid summarize`` / ``verdict`` (``engines.vllm.v2summary``, ``v2verdict``) on recorded real device data.

The V2 job's rows have the V1 rows' format, so the data here are committed real runs relabelled as the V2 job's
stages (what each relabelling changes is said where it is made):

- ``raw``: a raw folder of two stage folders. ``grid/``: data/gpu/v2grid's records (real weights, vLLM's own V2
  runner for no SD and EAGLE, V1 for n-gram; outputs kept), spec names turned into ``v2hybrid-grid-<spec>``.
  ``overhead/``: data/gpu/results.jsonl's timer on / off runs of ``llama8b-none-overhead3`` (the V1 timer,
  Llama-8B dims, dummy weights, bs 1 and 64, interleaved repeats), spec ``v2hybrid-overhead-none``, its config
  forcing V2 and leaving async scheduling to vLLM, and a ``resolved`` record that says V2 with async scheduling
  off (vLLM's resolved config is what the labels read: the config alone would infer async on for no SD).
- ``grid``: data/gpu/v1-runner/rotated-code-edit's summarized runs and steps (one engine rotating EAGLE alone,
  gpu-eagle-only, gpu-pr24344 and the idle hybrid; no SD and n-gram in engines of their own; its profile
  hybrid_trace_s5.jsonl and lossless.csv), every engine but n-gram's relabelled ``v2-forced`` / runner ``v2`` and
  every row ``stage`` ``grid``.
"""
from __future__ import annotations

import gzip
import json
import shutil
import statistics
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from spec_repro.engines.vllm import v2hybrid, v2summary, v2verdict
from spec_repro.paths import data_dir, v1_runner_dir

V2GRID = data_dir() / "gpu" / "v2grid" / "results.jsonl.gz"
V1_RESULTS = data_dir() / "gpu" / "results.jsonl"
OVERHEAD_SPEC = "llama8b-none-overhead3"
ROTATED = v1_runner_dir("rotated-code-edit")


def snapshot(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _write(path: Path, recs) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


@pytest.fixture()
def raw(tmp_path):
    r = tmp_path / "raw"
    grid = [json.loads(x) for x in gzip.open(V2GRID, "rt") if x.strip()]
    for d in grid:
        d["spec"] = f"v2hybrid-grid-{d['spec']}"
    _write(r / "grid" / "results.jsonl", grid)
    ov = [json.loads(x) for x in open(V1_RESULTS) if x.strip()]
    ov = [d for d in ov if d.get("spec") == OVERHEAD_SPEC]
    for d in ov:
        d["spec"] = "v2hybrid-overhead-none"
        if d.get("config"):          # the engine's config, which every run record carries: V2 forced, async vLLM's
            d["config"].update(model_runner="v2", async_scheduling=None)
        if d.get("kind") == "engine":
            d["resolved"] = {"runner": "v2", "async_scheduling": False, "runner_source": "vllm_config"}
    _write(r / "overhead" / "results.jsonl", ov)
    return r


@pytest.fixture()
def grid(tmp_path):
    out = tmp_path / "grid"
    out.mkdir()
    for f in ("lossless.csv", "hybrid_trace_s5.jsonl"):
        shutil.copy(ROTATED / f, out / f)
    runs, steps = pd.read_csv(ROTATED / "runs.csv"), pd.read_parquet(ROTATED / "steps.parquet")
    for df in (runs, steps):
        v2 = ~df["spec"].str.contains("-ngram")
        df["stage"] = "grid"
        df.loc[v2, "engine_config"] = "v2-forced"
        if "runner" in df:
            df.loc[v2, "runner"] = "v2"
    runs.to_csv(out / "runs.csv", index=False)
    steps.to_parquet(out / "steps.parquet", index=False)
    v2summary.ratio_table(out).to_csv(out / "ratios.csv", index=False)
    v2summary.predicted_table(out).to_csv(out / "predicted.csv", index=False)
    return out


def test_summarize_labels_every_run_from_the_resolved_config_and_computes_the_overhead(raw, tmp_path):
    out = tmp_path / "live"
    assert v2hybrid.main(["summarize", "--raw", str(raw), "--out", str(out)]) == 0
    assert {"runs.csv", "steps.parquet", "lossless.csv", "overhead.csv", "ratios.csv", "MANIFEST.json"} <= \
        {p.name for p in out.iterdir()}
    runs = pd.read_csv(out / "runs.csv")
    assert set(runs["stage"]) == {"grid", "overhead"}
    ov = runs[runs["stage"] == "overhead"]
    # the resolved record, not the config: the config forced no async setting (vLLM's own: async for no SD)
    assert (ov["runner"] == "v2").all() and (~ov["async_scheduling"].astype(bool)).all()
    assert ov["async_scheduling_forced"].isna().all() and (ov["engine_config"] == "v2-forced").all()
    g = runs[runs["stage"] == "grid"].set_index("config")
    assert set(g.loc["ngram", "runner"]) == {"v1"} and set(g.loc["eagle", "runner"]) == {"v2"}
    assert set(g.loc["eagle", "runner_source"]) == {"vllm_config"} and set(g["engine_config"]) == {"default"}
    # each run keeps its own timer state (the overhead task turns the timer off for half its runs)
    assert sorted(ov["instrumented"].value_counts().tolist()) == [12, 12]

    # the overhead by hand: per batch size, 1 - the mean over repeats of on / off tok/s
    recs = [json.loads(x) for x in open(raw / "overhead" / "results.jsonl") if x.strip()]
    table = pd.read_csv(out / "overhead.csv").set_index("batch_size")
    for b in (1, 64):
        pairs = {}
        for d in recs:
            if d.get("kind") == "run" and d["batch_size"] == b:
                pairs.setdefault(d["repeat"], {})[d["instrumented"]] = d["output_tok_per_s"]
        want = 1 - statistics.mean(p[True] / p[False] for p in pairs.values())
        assert table.loc[b, "overhead"] == pytest.approx(want, abs=1e-5)
        assert table.loc[b, "within_limit"] == (want <= 0.03) and table.loc[b, "config"] == "none"
        assert table.loc[b, "timer"] == "drain"       # no variant recorded: the timer that built rows at the sampler
    man = json.loads((out / "MANIFEST.json").read_text())
    assert {"overhead.csv", "ratios.csv", "lossless.csv"} <= set(man)
    assert "v2-forced" in man["_device_runs"]["engine_configs"]


def test_the_fastest_eagle_alone_is_read_whatever_its_k(tmp_path):
    """data/gpu/v2grid's co-resident no SD, EAGLE k = 5 and EAGLE k = 3 engines (real weights, the H200), the k = 3
    engine's configuration suffixed ``-k3`` as the V2 grid's k = 3 engine: each row's ``vs_best_eagle`` is over
    the faster EAGLE alone at that batch size (k = 3 on code-edit here, 787 against 691 tok/s at bs 1)."""
    keep = ("v2grid-none-k0", "v2grid-eagle-k5", "v2grid-eagle-k3")
    recs = []
    for x in gzip.open(V2GRID, "rt"):
        d = json.loads(x) if x.strip() else {}
        if d.get("spec") in keep and d.get("group") and d.get("kind") in ("engine", "run", "done"):
            if d["spec"] == "v2grid-eagle-k3" and "config" in d:       # its engine and run records
                d["config"]["config_suffix"] = "-k3"
            d["spec"] = f"v2hybrid-grid-{d['spec']}"
            recs.append(d)
    _write(tmp_path / "raw" / "grid" / "results.jsonl", recs)
    out = tmp_path / "live"
    assert v2hybrid.main(["summarize", "--raw", str(tmp_path / "raw"), "--out", str(out)]) == 0
    rt = pd.read_csv(out / "ratios.csv").set_index(["workload", "config", "batch_size"])
    assert set(rt.index.get_level_values("config")) == {"none", "eagle", "eagle-k3"}
    for b in (1, 8, 32, 64):
        k5, k3 = rt.loc[("code-edit", "eagle", b), "tok_s"], rt.loc[("code-edit", "eagle-k3", b), "tok_s"]
        assert k3 > k5 and rt.loc[("code-edit", "eagle", b), "best_eagle"] == "eagle-k3"
        assert rt.loc[("code-edit", "eagle", b), "vs_best_eagle"] == pytest.approx(k5 / k3, rel=1e-5)
        assert rt.loc[("code-edit", "eagle-k3", b), "vs_best_eagle"] == pytest.approx(1.0)
        assert rt.loc[("code-edit", "none", b), "vs_best_eagle"] == pytest.approx(
            rt.loc[("code-edit", "none", b), "tok_s"] / k3, rel=1e-5)      # the csv keeps 6 digits
    assert rt.loc[("code-edit", "eagle", 1), "tok_s"] == pytest.approx(690.9, abs=0.1)
    assert rt.loc[("code-edit", "eagle-k3", 1), "tok_s"] == pytest.approx(787.0, abs=0.1)


def test_overhead_table_pairs_each_timer_variant_with_the_off_runs_of_its_repeat(raw):
    """The recorded on / off runs relabelled as two variants (their own tok/s, so the arithmetic is checked, not a
    measurement): each variant's overhead is 1 - mean over repeats of variant / off in the same repeat."""
    runs, _, _ = v2summary.load_v2(raw)
    ov = runs[runs["task"] == "overhead"].copy()
    on = ov[ov["instrumented"]]
    ov["timer"] = ov["instrumented"].map({True: "timer", False: "off"})
    hooks = on.assign(timer="hooks", output_tok_per_s=on["output_tok_per_s"] * 1.5)
    t = v2summary.overhead_table(pd.concat([ov, hooks])).set_index(["timer", "batch_size"])
    assert set(t.index.get_level_values(0)) == {"timer", "hooks"}
    for b in (1, 64):
        off = ov[(~ov["instrumented"]) & (ov["batch_size"] == b)].set_index("repeat")["output_tok_per_s"]
        mine = on[on["batch_size"] == b].set_index("repeat")["output_tok_per_s"]
        assert t.loc[("timer", b), "overhead"] == pytest.approx(1 - (mine / off).mean(), abs=1e-9)
        assert t.loc[("hooks", b), "overhead"] == pytest.approx(1 - (1.5 * mine / off).mean(), abs=1e-9)


def test_toggle_runs_give_the_timers_cost_inside_runs_and_it_is_the_headline(raw):
    """The recorded on / off runs plus toggle runs whose medians are set by hand (arithmetic, not a measurement):
    overhead_blocks = 1 - mean over runs of untimed / timed median period, on the timer's rows; the headline
    takes it, the whole-run estimate stays beside; a toggle run is no variant of its own (half its steps timed)."""
    runs, _, _ = v2summary.load_v2(raw)
    ov = runs[runs["task"] == "overhead"].copy()
    ov["timer"] = ov["instrumented"].map({True: "timer", False: "off"})
    on = ov[ov["timer"] == "timer"]
    timed = {1: [1.02, 1.04, 1.01], 64: [5.2, 5.1, 5.3]}
    tog = pd.concat([on[on["batch_size"] == b].head(3).assign(
        timer="toggle", toggle_timed_ms=timed[b], toggle_free_ms=[1.0, 1.0, 1.0] if b == 1 else [5.0, 5.0, 5.0])
        for b in (1, 64)])
    t = v2summary.overhead_table(pd.concat([ov, tog])).set_index(["timer", "batch_size"])
    assert set(t.index.get_level_values(0)) == {"timer"}
    for b in (1, 64):
        want = 1 - np.mean([(1.0 if b == 1 else 5.0) / x for x in timed[b]])
        assert t.loc[("timer", b), "overhead_blocks"] == pytest.approx(want, abs=1e-12)
        assert t.loc[("timer", b), "overhead"] == t.loc[("timer", b), "overhead_blocks"]
        assert t.loc[("timer", b), "blocks_runs"] == 3 and t.loc[("timer", b), "overhead_blocks_ci95"] > 0
        off = ov[(ov["timer"] == "off") & (ov["batch_size"] == b)].set_index("repeat")["output_tok_per_s"]
        mine = on[on["batch_size"] == b].set_index("repeat")["output_tok_per_s"]
        assert t.loc[("timer", b), "overhead_paired"] == pytest.approx(1 - (mine / off).mean(), abs=1e-9)
    assert t.loc[("timer", 1), "within_limit"] and not t.loc[("timer", 64), "within_limit"]   # +2.3% / +4.0%
    # the same timer with its events recorded by torch's Event.record (toggle-torch): rows of its own (timer-torch),
    # inside runs only, named by the engine's configuration; the timer's rows unchanged
    drv = tog.assign(timer="toggle-torch", toggle_timed_ms=tog["toggle_free_ms"] * 1.01)
    t2 = v2summary.overhead_table(pd.concat([ov, tog, drv])).set_index(["timer", "batch_size"])
    assert set(t2.index.get_level_values(0)) == {"timer", "timer-torch"}
    for b in (1, 64):
        assert t2.loc[("timer-torch", b), "overhead"] == pytest.approx(1 - 1 / 1.01, abs=1e-12)
        assert t2.loc[("timer-torch", b), "config"] == t2.loc[("timer", b), "config"]
        assert np.isnan(t2.loc[("timer-torch", b), "overhead_paired"])
        assert t2.loc[("timer", b), "overhead"] == t.loc[("timer", b), "overhead"]
    assert t2.loc["timer-torch", "within_limit"].all()


def test_a_failed_summarize_leaves_the_folder_byte_identical(raw, grid, monkeypatch):
    before = snapshot(grid)

    def failing(out):
        raise RuntimeError("the prediction failed")

    monkeypatch.setattr(v2summary, "predicted_table", failing)
    with pytest.raises(RuntimeError, match="the prediction failed"):
        v2summary.summarize(raw, grid)
    assert snapshot(grid) == before and sorted(p.name for p in grid.iterdir()) == sorted(before)


def test_out_overlapping_raw_is_one_line(raw, capsys):
    assert v2hybrid.main(["summarize", "--raw", str(raw), "--out", str(raw / "grid")]) == 2
    err = capsys.readouterr().err.strip()
    assert "overlap" in err and "\n" not in err and "Traceback" not in err
    assert v2hybrid.main(["verdict", "--out", str(raw / "nowhere")]) == 2


def test_ratios_pair_each_policy_with_eagle_in_its_repeat(grid):
    rt = pd.read_csv(grid / "ratios.csv")
    runs = pd.read_csv(grid / "runs.csv")
    runs = runs[(runs["workload"] == "code-edit") & (runs["task"] == "hybrid")]

    def tok_s(config, b):      # per repeat: the repeat's tokens over its wall seconds
        r = runs[(runs["config"] == config) & (runs["batch_size"] == b)]
        return {rep: g["output_tokens"].sum() / g["wall_s"].sum() for rep, g in r.groupby("repeat")}

    row = rt[(rt["workload"] == "code-edit") & (rt["config"] == "gpu-pr24344") & (rt["batch_size"] == 8)].iloc[0]
    hy, ea, none = tok_s("gpu-pr24344", 8), tok_s("eagle", 8), tok_s("none", 8)
    assert row["vs_eagle_median"] == pytest.approx(statistics.median(hy[r] / ea[r] for r in hy))
    assert row["vs_eagle_pairs"] == len(hy) == 4
    assert row["vs_none"] == pytest.approx(statistics.mean(hy.values()) / statistics.mean(none.values()))
    assert row["runner"] == "v2" and row["engine_config"] == "v2-forced"
    ng = rt[(rt["workload"] == "code-edit") & (rt["config"] == "ngram")]
    assert set(ng["runner"]) == {"v1"} and ng["vs_eagle_median"].isna().all()


def test_each_rotated_engine_is_paired_with_its_own_eagle(grid):
    """A second rotated engine at another k (its configurations suffixed ``-k3``): here the committed rotated
    engine's code-edit runs again under a second spec name, relabelled ``-k3`` and each repeat moved one on (r -> r
    + 1 mod 4). Paired with its own ``eagle-k3`` the ratios are the first engine's; paired with the first engine's
    EAGLE they would not be."""
    runs = pd.read_csv(grid / "runs.csv")
    rot = runs[(runs["spec"] == "hybrid-default-rotate-s5") & (runs["task"] == "hybrid")]
    k3 = rot.assign(spec="hybrid-default-rotate-k3", config=rot["config"] + "-k3", repeat=(rot["repeat"] + 1) % 4,
                    run_id=rot["run_id"].str.replace(r"-r(\d)$", lambda m: f"-r{(int(m.group(1)) + 1) % 4}",
                                                     regex=True))
    pd.concat([runs, k3]).to_csv(grid / "runs.csv", index=False)
    ll = pd.read_csv(grid / "lossless.csv")        # its lossless rows: EAGLE alone's counts read from its own engine
    e3 = ll[ll["config"] == "eagle"].assign(config="eagle-k3", equal=0)
    pd.concat([ll, e3]).to_csv(grid / "lossless.csv", index=False)
    rt = v2summary.ratio_table(grid).set_index(["workload", "config", "batch_size"])
    assert (rt.loc["code-edit"].xs("gpu-pr24344-k3", level="config")["eagle_equal"] == 0).all()
    assert (rt.loc["code-edit"].xs("gpu-pr24344", level="config")["eagle_equal"] > 0).all()
    for b in (1, 8, 32, 64):
        here, there = rt.loc[("code-edit", "gpu-pr24344", b)], rt.loc[("code-edit", "gpu-pr24344-k3", b)]
        for c in ("vs_eagle_median", "vs_eagle_min", "vs_eagle_max", "vs_eagle_pairs"):
            assert there[c] == pytest.approx(here[c]), (b, c)
        assert there["best_eagle"] in ("eagle", "eagle-k3")
    # the verdict's cost of a hybrid is its step beyond EAGLE alone's in its own engine: the copy's steps 1 ms longer
    steps = pd.read_parquet(grid / "steps.parquet")
    srot = steps[steps["spec"] == "hybrid-default-rotate-s5"]
    pd.concat([steps, srot.assign(spec="hybrid-default-rotate-k3", config=srot["config"] + "-k3",
                                  t_draft=srot["t_draft"] + 1e-3)]).to_parquet(grid / "steps.parquet", index=False)
    for b in (8, 32):
        assert v2verdict._cost(grid, "gpu-pr24344-k3", b) == v2verdict._cost(grid, "gpu-pr24344", b)
        assert "ms drafting" in v2verdict._cost(grid, "gpu-pr24344", b)
    from spec_repro.engines.vllm.live_tables import paired_ratios

    mixed = paired_ratios(grid, base="eagle", workload="code-edit", select=v2summary.SELECT)    # the wrong base
    mixed = mixed.set_index(["config", "batch_size"])["paired_median"]
    assert any(abs(mixed[("gpu-pr24344-k3", b)] - rt.loc[("code-edit", "gpu-pr24344-k3", b), "vs_eagle_median"]) > 1e-3
               for b in (1, 8, 32, 64))


def test_the_hybrid_is_predicted_out_of_sample_from_the_v2_steps(grid):
    p = pd.read_csv(grid / "predicted.csv")
    fit = dict(zip(p["config"], p["fitted_on"]))
    assert fit["gpu-pr24344"] == "out of sample" and fit["none"] == fit["eagle"] == fit["gpu-eagle-only"] == "in sample"
    assert set(p["profile"]) == {"hybrid_trace_s5.jsonl"}
    h = p[p["config"] == "gpu-pr24344"].set_index("batch_size")
    assert h.loc[8, "ratio_per_bs"] == pytest.approx(h.loc[8, "tok_s"] / h.loc[8, "predicted_per_bs_tok_s"])
    assert 0.7 < h["ratio_per_bs"].min() and h["ratio_per_bs"].max() < 1.3


def test_the_verdict_fails_exactly_where_a_number_fails(grid, capsys):
    ov = pd.DataFrame({"engine_config": "v2-forced", "spec": "v2hybrid-overhead-none", "config": "none",
                       "batch_size": [1, 8, 32, 64], "overhead": [0.01, 0.02, 0.0, 0.03]})
    ov["within_limit"] = ov["overhead"] <= 0.03
    pd.concat([ov, ov.assign(config="eagle")]).to_csv(grid / "overhead.csv", index=False)
    line = lambda f: f(grid)       # noqa: E731
    assert line(v2verdict.overhead_line)[0]
    ov.loc[3, ["overhead", "within_limit"]] = [0.031, False]
    pd.concat([ov, ov.assign(config="eagle")]).to_csv(grid / "overhead.csv", index=False)
    ok, text = line(v2verdict.overhead_line)
    assert not ok and "bs 64 +3.1%" in text
    # with toggle runs the line holds the estimate inside runs and gives the whole runs' beside
    ov = ov.assign(overhead_blocks=ov["overhead"], overhead_blocks_ci95=0.004, overhead_paired=0.05)
    pd.concat([ov, ov.assign(config="eagle")]).to_csv(grid / "overhead.csv", index=False)
    ok, text = line(v2verdict.overhead_line)
    assert not ok and "inside runs, ±0.4%/0.4%/0.4%/0.4%; whole runs against vLLM's own: +5.0%" in text
    # the timer with its events recorded by torch: printed beside, not held (the timer every run uses is)
    both = pd.concat([ov.assign(timer="timer"), ov.assign(config="eagle", timer="timer"),
                      ov.assign(timer="timer-torch", overhead=0.015, within_limit=True)])
    both.to_csv(grid / "overhead.csv", index=False)
    ok, text = line(v2verdict.overhead_line)
    assert not ok and text.endswith("(its events recorded by torch, inside runs: none: bs 1 +1.5%, bs 8 +1.5%, "
                                    "bs 32 +1.5%, bs 64 +1.5%)")

    ok, text = line(v2verdict.every_bs_line)     # measured: gpu-pr24344 1.3-2.0x EAGLE at every batch size
    assert ok and "bs 1 gpu-pr24344 2.022x" in text
    rt = pd.read_csv(grid / "ratios.csv")
    at = (rt["config"] == "gpu-pr24344") & (rt["batch_size"] == 32) & (rt["workload"] == "code-edit")
    rt.loc[at, "vs_eagle_median"] = 0.97
    rt.to_csv(grid / "ratios.csv", index=False)
    ok, text = line(v2verdict.every_bs_line)
    assert not ok and "bs 32 gpu-pr24344 0.970x (pays" in text and "ms drafting" in text

    ok, text = line(v2verdict.bs1_line)          # 2.02x EAGLE, 1.009x no SD, but not every output equal
    assert not ok and "lossless no (28/32 equal; EAGLE alone 28/32)" in text
    # the lossless stage's comparison, where it ran the shape, is the one read (the grid's engines differ in bf16)
    ll = pd.read_csv(grid / "lossless.csv")
    gate = ll[(ll["config"] == "gpu-pr24344") & (ll["batch_size"] == 1)].head(1).assign(
        spec="v2hybrid-lossless-rotate", equal=3, total=3, first_difference="")
    pd.concat([ll, gate]).to_csv(grid / "lossless.csv", index=False)
    rt = v2summary.ratio_table(grid)
    b1 = (rt["config"] == "gpu-pr24344") & (rt["batch_size"] == 1) & (rt["workload"] == "code-edit")
    assert rt.loc[b1, ["lossless", "equal", "compared"]].values.tolist() == [[True, 3, 3]]
    rt.to_csv(grid / "ratios.csv", index=False)
    assert line(v2verdict.bs1_line)[0]
    rt.loc[b1, "vs_best_other"] = 0.99
    rt.to_csv(grid / "ratios.csv", index=False)
    assert not line(v2verdict.bs1_line)[0]
    # EAGLE alone faster at another k (an engine of its own): the hybrid must hold the line against it too
    rt.loc[b1, "vs_best_other"] = 1.01
    rt["best_eagle"], rt["vs_best_eagle"] = "eagle-k3", 1.049
    rt.to_csv(grid / "ratios.csv", index=False)
    ok, text = line(v2verdict.bs1_line)
    assert not ok and "1.049x eagle-k3 (EAGLE alone, another engine" in text
    rt["vs_best_eagle"] = 1.051
    rt.to_csv(grid / "ratios.csv", index=False)
    assert line(v2verdict.bs1_line)[0]
    rt.loc[rt["batch_size"] == 64, "vs_best_eagle"] = 0.97
    rt.to_csv(grid / "ratios.csv", index=False)
    ok, text = line(v2verdict.every_bs_line)
    assert not ok and "0.970x eagle-k3 (EAGLE alone, another engine: a ratio of means) (pays" in text
    rt["best_eagle"] = "eagle"                  # the grid's own k the fastest: the paired ratio alone holds the line
    rt.to_csv(grid / "ratios.csv", index=False)
    assert line(v2verdict.bs1_line)[0] and "eagle-k3" not in line(v2verdict.bs1_line)[1]

    ok, text = line(v2verdict.prediction_line)   # measured: 1.201x its prediction at bs 1 (each phase per shape)
    assert not ok and "ratio_shape" in text and "code-edit gpu-pr24344: 0.856-1.201" in text
    assert "2 of 4 points" in text and "(beside, ratio_per_bs: 2 of 4 within)" in text
    pr = pd.read_csv(grid / "predicted.csv")
    hyb = pr["config"] == "gpu-pr24344"
    pr.assign(ratio_shape=pr["ratio_shape"].where(~hyb, 1.09)).to_csv(grid / "predicted.csv", index=False)
    assert line(v2verdict.prediction_line)[0]                               # every point within: the line passes
    # a table without ratio_shape (made before it): ratio_per_bs held, EAGLE alone at another k printed beside
    old = pr.drop(columns=["predicted_shape_tok_s", "ratio_shape", "shape_fitted_on"])
    old.to_csv(grid / "predicted.csv", index=False)
    held = line(v2verdict.prediction_line)
    assert not held[0] and "ratio_per_bs" in held[1] and "code-edit gpu-pr24344: 0.887-1.199" in held[1]
    pd.concat([old, old[old["config"] == "eagle"].assign(config="eagle-k3", ratio_per_bs=0.5)]).to_csv(
        grid / "predicted.csv", index=False)
    ok, text = line(v2verdict.prediction_line)
    assert ok == held[0] and text.startswith(held[1]) and "EAGLE alone at another k" in text
    assert "code-edit eagle-k3: 0.500-0.500" in text
    assert line(v2verdict.labels_line)[0]
    runs = pd.read_csv(grid / "runs.csv")
    runs.loc[0, "weights"] = None
    runs.to_csv(grid / "runs.csv", index=False)
    ok, text = line(v2verdict.labels_line)
    assert not ok and "missing weights" in text
    assert v2hybrid.main(["verdict", "--out", str(grid)]) == 1
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == len(v2verdict.LINES) and all(x[:4] in ("PASS", "FAIL") for x in printed)


def test_the_verdicts_hybrid_is_the_fastest_at_any_k():
    """Of the hybrids at a batch size, the verdict holds the one a user would pick: the highest tok/s (over the
    fastest EAGLE alone, whatever its k), not the one furthest above its own engine's EAGLE."""
    rt = pd.DataFrame({"workload": "code-edit", "batch_size": 1,
                       "config": ["gpu-pr24344-skip", "gpu-pr24344-skip-k3", "eagle", "eagle-k3"],
                       "vs_eagle_median": [1.27, 1.12, None, None], "vs_best_eagle": [1.10, 1.12, 0.87, 1.0]})
    assert v2verdict._best(rt, 1)["config"] == "gpu-pr24344-skip-k3"
    assert v2verdict._best(rt.drop(columns="vs_best_eagle"), 1)["config"] == "gpu-pr24344-skip"    # an older table


def test_the_live_readers_name_each_runner_and_read_the_grid_stage_only(grid):
    """A V2 folder as reproduce --profile gpu leaves it: the notebooks' readers say V2 where V2 ran and V1 for
    vLLM's n-gram, and a lossless-stage run (another shape, other outputs) never enters the speedups."""
    from spec_repro import measured as M

    before, _ = M.live_speedups(grid)
    runs = pd.read_csv(grid / "runs.csv")
    extra = runs[runs["config"] == "eagle"].head(1).assign(stage="lossless", wall_s=1e-6)   # absurdly fast
    pd.concat([runs, extra]).to_csv(grid / "runs.csv", index=False)
    t, src = M.live_speedups(grid)
    assert t["speedup"].tolist() == before["speedup"].tolist()
    assert M.live_runners(t) == "V2 runner (forced); ngram: V1 runner (forced)" and M.live_runners(t) in src
    lab = dict(zip(t["method"], t["proposers"]))
    assert lab["ngram"].endswith("V1 runner (forced))") and lab["gpu-pr24344"].endswith("V2 runner (forced))")
    s, _ = M.live_steps(grid)
    assert set(s.loc[s["method"] == "eagle", "model"]) == {"qwen2.5-coder-1.5b (real weights, V2 runner (forced))"}
    assert set(s["stage"]) == {"grid"} and M.live_runners(s) == M.live_runners(t)


def test_a_restarted_spec_keeps_its_last_measurement_only(tmp_path):
    """Real records: the H100 run's lossless stage (data/gpu/raw/v2hybrid-h100) started its no-SD engine at
    max_num_seqs 1, was stopped after 12 runs and restarted at 64, so its run ids and their steps come twice; the
    readers (runs, steps, lossless report) keep the restart's."""
    from spec_repro.engines.vllm.live_runs import load

    src = data_dir() / "gpu" / "raw" / "v2hybrid-h100" / "lossless"
    for f in src.glob("*.jsonl.gz"):
        (tmp_path / f.name[:-3]).write_bytes(gzip.open(f).read())
    recs = [json.loads(x) for x in open(tmp_path / "results.jsonl") if x.strip()]
    none = [d for d in recs if d.get("spec") == "v2hybrid-lossless-none" and d.get("kind") == "run"]
    assert len(none) > len({d["run_id"] for d in none})          # the restart is in the file
    assert {d["config"]["max_num_seqs"] for d in none} == {1, 64}
    runs, steps, _ = load(tmp_path)
    r = runs[runs["spec"] == "v2hybrid-lossless-none"]
    assert len(r) == len(set(r["run_id"])) == len({d["run_id"] for d in none})
    assert set(r["max_num_seqs"]) == {64}
    s = steps[(steps["spec"] == "v2hybrid-lossless-none") & (steps["run_id"] == "overhead-b8-on-0")]
    assert s["step"].is_monotonic_increasing and s["num_reqs"].max() == 8      # batched: the restart's steps
    ok, rows = v2hybrid.check_lossless(recs)
    assert ok and not [x for x in rows if x["spec"] == "v2hybrid-lossless-none"]


def test_the_hbm_ceiling_is_the_measuring_gpus(tmp_path):
    """throughput's ceiling uses the bandwidth of the GPU the folder's manifest names: the same runs read as
    measured on an H100 get a ceiling 3.35 / 4.8 of the H200's."""
    from spec_repro.engines.vllm.live_throughput import throughput
    from spec_repro.engines.vllm.steps import hbm_bytes_per_s

    assert hbm_bytes_per_s("NVIDIA H100 80GB HBM3") == 3.35e12 and hbm_bytes_per_s("NVIDIA H200") == 4.8e12
    assert hbm_bytes_per_s(None) == 4.8e12
    src = v1_runner_dir("agreement")
    shutil.copytree(src, tmp_path / "h100")
    m = json.loads((tmp_path / "h100" / "MANIFEST.json").read_text())
    assert "H200" in m["_device_runs"]["machine"]["gpu"]
    m["_device_runs"]["machine"]["gpu"] = "NVIDIA H100 80GB HBM3"
    (tmp_path / "h100" / "MANIFEST.json").write_text(json.dumps(m))
    h200, h100 = throughput(out=src), throughput(out=tmp_path / "h100")
    assert (h200["tok_s"] == h100["tok_s"]).all()
    assert ((h100["ceiling_tok_s"] / h200["ceiling_tok_s"] - 3.35 / 4.8).abs() < 1e-9).all()


def test_a_repeat_cut_by_the_deadline_is_left_out():
    """data/gpu/live/drain-timer (an H100 run cut by its deadline): the deadline cut n-gram's second bs-1 repeat
    after its first 2 of 8 chunks (its fastest prompts) and the rotated engine's last sharegpt bs-1 repeat mid-way:
    neither enters tok/s or a pair."""
    from spec_repro.engines.vllm.live_runs import read_runs
    from spec_repro.engines.vllm.live_tables import paired_ratios
    from spec_repro.engines.vllm.live_throughput import throughput

    live = data_dir() / "gpu" / "live" / "drain-timer"
    r = read_runs(live)
    ng = r[(r["config"] == "ngram") & (r["batch_size"] == 1)]
    per = ng.groupby("repeat").agg(n=("wall_s", "size"), tok=("output_tokens", "sum"), wall=("wall_s", "sum"))
    assert list(per["n"]) == [8, 2]                                   # the cut repeat is in the data
    t = throughput(out=live, workload="code-edit", select={"stage": "grid"})
    row = t[(t["config"] == "ngram") & (t["batch_size"] == 1)].iloc[0]
    assert row["repeats"] == 1 and abs(row["tok_s"] - per["tok"].iloc[0] / per["wall"].iloc[0]) < 1e-9
    pr = paired_ratios(live, workload="sharegpt", select=v2summary.SELECT).set_index("config")
    skip = r[(r["workload"] == "sharegpt") & (r["config"] == "gpu-pr24344-skip") & (r["stage"] == "grid")]
    assert skip["repeat"].nunique() == 4 and pr.loc["gpu-pr24344-skip", "pairs"] == 3   # EAGLE's 4th was cut


def test_the_summary_rows_of_the_v2_run_name_each_configurations_runner():
    """The reproduce summary's row labels (rowlabels) of the H100 V2 run's speedups and steps come from its runs'
    recorded runners: the hybrids and EAGLE at both k, and no SD on V2, n-gram on V1 (the source's words alone would
    read V1)."""
    from spec_repro import measured as M
    from spec_repro.rowlabels import row_labels

    live = data_dir() / "gpu" / "live"
    for _, src in (M.live_speedups(live), M.live_steps(live)):
        lab = row_labels("", src)
        assert lab["runner"] == ("eagle v2, eagle-k3 v2, gpu-eagle-only v2, gpu-pr24344 v2, gpu-pr24344-skip v2, "
                                 "gpu-pr24344-skip-k3 v2, ngram v1, none v2"), lab
        assert lab["configuration"] == "v1-forced/v2-forced" and lab["weights"].startswith("real")
    assert row_labels("", M.live_speedups()[1])["runner"] == "v1"          # the committed V1-runner study


def test_the_v2_runs_step_model_fits_its_own_steps():
    """data/gpu/live/drain-timer: the step model fitted on the V2 run's no-SD and EAGLE-alone steps (live_model,
    uniform batches) prices those same configurations within 10% at every workload and batch size (in sample); the
    hybrids, out of sample, are the verdict's line (tests above). (data/gpu/live/host-buffer's host drifted
    more: in sample 0.87-1.08 there, its README.)"""
    p = pd.read_csv(data_dir() / "gpu" / "live" / "drain-timer" / "predicted.csv")
    ins = p[p["fitted_on"] == "in sample"]
    assert set(ins["config"]) == {"none", "eagle", "gpu-eagle-only"} and len(ins) == 18
    assert ins["ratio_per_bs"].between(0.9, 1.1).all(), ins[["workload", "config", "batch_size", "ratio_per_bs"]]


def test_summarizing_again_over_changed_records_rewrites_the_folder(raw, tmp_path):
    """A folder summarized before (its MANIFEST.json records runs.csv's sha256) summarized again after the raw
    records changed: the tables read the new runs.csv back without a changed-file error, and the manifest records
    the new files."""
    from spec_repro.manifests import verify_recorded

    out = tmp_path / "live"
    assert v2hybrid.main(["summarize", "--raw", str(raw), "--out", str(out)]) == 0
    before = (out / "runs.csv").read_bytes()
    f = raw / "grid" / "results.jsonl"
    recs = f.read_text().splitlines()
    last_run = max(i for i, x in enumerate(recs) if '"kind": "run"' in x)
    f.write_text("\n".join(recs[:last_run] + recs[last_run + 1:]) + "\n")       # one run fewer
    assert v2hybrid.main(["summarize", "--raw", str(raw), "--out", str(out)]) == 0
    assert (out / "runs.csv").read_bytes() != before
    for name in ("runs.csv", "steps.parquet", "overhead.csv", "ratios.csv"):
        verify_recorded(out / name)


def test_host_adjusted_overhead_recovers_a_known_cost_under_host_drift():
    """Runs whose tok/s follow the host probe exactly (y = base x (1 - cost) x probe^-0.3, the probe drifting
    over a factor of two): the paired ratio is thrown off by the drift, the host-adjusted estimate is the cost."""
    import numpy as np

    rng = np.random.default_rng(3)
    cost = {"off": 0.0, "timer": 0.02, "drain": 0.08}
    rows = []
    for rep in range(8):
        for v, c in cost.items():
            probe = float(rng.uniform(3.0, 6.0))
            rows.append({"spec": "s", "batch_size": 8, "repeat": rep, "timer": v, "engine_probe_ms": probe,
                         "engine_probe_end_ms": probe, "output_tok_per_s": 1000 * (1 - c) * probe ** -0.3})
    h = v2summary.host_adjusted(pd.DataFrame(rows)).set_index("timer")
    for v in ("timer", "drain"):
        assert h.loc[v, "overhead_host"] == pytest.approx(cost[v], abs=1e-9)
        assert h.loc[v, "overhead_host_ci95"] < 1e-6
    assert v2summary.host_adjusted(pd.DataFrame(rows).drop(columns="engine_probe_ms")).empty


def test_timer_host_share_is_the_timers_own_seconds_over_the_runs_wall():
    """Two timed runs of one shape: 10 steps of 0.1 ms own host time in a 0.01 s run (10%) and 10 of 0.2 ms in
    0.04 s (5%): 0.15 ms a step, 7.5% of the wall on average; runs of a variant whose steps lack t_timer give
    nothing, and a folder without t_timer no columns."""
    runs = pd.DataFrame({"spec": "s", "run_id": ["a", "b", "c"], "timer": ["timer", "timer", "drain"],
                         "batch_size": 8, "wall_s": [0.01, 0.04, 0.02]})
    steps = pd.DataFrame({"spec": "s", "run_id": ["a"] * 10 + ["b"] * 10 + ["c"] * 10,
                          "t_timer": [1e-4] * 10 + [2e-4] * 10 + [None] * 10})
    t = v2summary.timer_host(runs, steps).set_index("timer")
    assert list(t.index) == ["timer"]
    assert t.loc["timer", "timer_host_ms"] == pytest.approx(0.15)
    assert t.loc["timer", "timer_host_share"] == pytest.approx(0.075)
    assert v2summary.timer_host(runs, steps.drop(columns="t_timer")).empty


def test_the_shape_model_prices_k3_where_the_line_through_k5_does_not():
    """data/gpu/live/slower-host (EAGLE at k = 5 and k = 3): the line through no SD's and k = 5's forward prices
    the k = 3 hybrid 11-15% slow at code-edit bs 8-64 (V2's forward is not linear in the tokens verified); each step
    phase as measured at its k and batch size (``ratio_shape``, EAGLE alone at both k in sample, the hybrids still out of
    sample) puts it within 3%, and the configurations it fits within 8% at every point. The verdict holds
    ``ratio_shape`` (20 of 24 hybrid points) and prints the line model's count beside it."""
    live = data_dir() / "gpu" / "live" / "slower-host"
    p = pd.read_csv(live / "predicted.csv").set_index(["workload", "config", "batch_size"])
    k3 = p.loc[("code-edit", "gpu-pr24344-skip-k3")].loc[[8, 32, 64]]
    assert (k3["ratio_per_bs"] > 1.10).all() and ((k3["ratio_shape"] - 1).abs() < 0.03).all()
    assert (p.loc[(slice(None), "gpu-pr24344-skip-k3"), "shape_fitted_on"] == "out of sample").all()
    fitted = p[p["shape_fitted_on"] == "in sample"]
    assert set(fitted.index.get_level_values("config")) == {"none", "eagle", "eagle-k3", "gpu-eagle-only"}
    assert ((fitted["ratio_shape"] - 1).abs() < 0.08).all()
    ok, text = v2verdict.prediction_line(live)
    assert not ok and "ratio_shape" in text and "20 of 24 points" in text and "ratio_per_bs: 14 of 24" in text


def test_the_h100_grid_with_driver_events_passes_the_timer_line_and_names_the_hybrids_cost():
    """data/gpu/live (the timer's events through the driver, torch's beside): the timer costs both engines under 1%
    inside runs at every batch size with either event API (``timer``, ``timer-torch``), so the verdict's timer line
    passes; the fastest hybrid from bs 32 is under 0.98x EAGLE k = 3 and the line names the drafting it pays; the
    shape model prices every hybrid point within 10%, the skip at bs 1 within 5% only with its decision taken on the
    step before's flag and EAGLE's draft prefill run every step (``_walk``: at k = 3 0.89 without)."""
    live = data_dir() / "gpu" / "live"
    ov = pd.read_csv(live / "overhead.csv")
    inside = ov[ov["timer"].isin(["timer", "timer-torch"])]
    assert len(inside) == 16 and (inside["overhead_blocks"].abs() < 0.01).all()
    ok, text = v2verdict.overhead_line(live)
    assert ok and "(its events recorded by torch, inside runs: eagle: bs 1 +0.4%" in text
    ok, text = v2verdict.every_bs_line(live)
    assert not ok and "bs 64 gpu-pr24344-skip-k3 0.931x (pays +0.59 ms drafting" in text
    ok, text = v2verdict.prediction_line(live)
    assert ok and "24 of 24 points" in text and "ratio_per_bs: 22 of 24" in text
    p = pd.read_csv(live / "predicted.csv").set_index(["workload", "config", "batch_size"])
    skip1 = p.loc[[("code-edit", "gpu-pr24344-skip", 1), ("code-edit", "gpu-pr24344-skip-k3", 1)], "ratio_shape"]
    assert ((skip1 - 1).abs() < 0.05).all()
