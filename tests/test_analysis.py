"""spec_repro.analysis on small SYNTHETIC traces built here by hand or with a seeded generator (labelled as
such), where the right answer can be derived on paper."""
import numpy as np
import pandas as pd
import pytest

from spec_repro import analysis as A
from spec_repro.traces import Trace, TraceError


def _trace(arrays, prompt_lens=None, dataset="synthetic", info=None, draft_lens=None, k_max=None):
    prompt_lens = prompt_lens or {r: 10 for r in arrays}
    return Trace.from_arrays(arrays, prompt_lens=prompt_lens, dataset=dataset, model="synthetic",
                             request_info=info, draft_lens=draft_lens, k_max=k_max)


def test_walk_steps_fixed_and_oracle():
    a = np.array([3, 1, 1, 5, 1, 1, 1, 1, 2, 1])
    # oracle: 0 -(3)-> 3 -(5)-> 8 -(2)-> 10
    assert A.walk_steps(a, None).tolist() == [0, 3, 8]
    # k=1 caps each step at 2 tokens: 0 -> 2 -> 3 -> 5 -> 6 -> 7 -> 8 -> 10
    assert A.walk_steps(a, 1).tolist() == [0, 2, 3, 5, 6, 7, 8]


def test_tokens_per_step_constant_acceptance():
    t = _trace({"r0": {"ngram": [4] * 12}, "r1": {"ngram": [1] * 12}})
    per = A.tokens_per_step_per_request(t, k=None).set_index("request_id")
    assert per.loc["r0", "steps"] == 3 and per.loc["r0", "tokens_per_step"] == 4.0
    assert per.loc["r1", "tokens_per_step"] == 1.0
    per1 = A.tokens_per_step_per_request(t, k=1).set_index("request_id")
    assert per1.loc["r0", "tokens_per_step"] == 2.0


def test_spread_percentiles_match_numpy():
    rng = np.random.default_rng(7)  # synthetic, seeded
    arrays = {f"r{i}": {"ngram": rng.integers(1, 9, size=40).tolist()} for i in range(30)}
    t = _trace(arrays)
    per = A.tokens_per_step_per_request(t)
    s = A.tokens_per_step_spread(t, percentiles=(5, 95))
    assert s["n_requests"].item() == 30
    assert s["p5"].item() == pytest.approx(np.percentile(per["tokens_per_step"], 5))
    assert s["p95"].item() == pytest.approx(np.percentile(per["tokens_per_step"], 95))
    assert s["p5"].item() < s["p95"].item()


def test_draft_position_rate_by_hand():
    # acc_len 2 everywhere, k=3: each step accepts exactly 1 draft token.
    t = _trace({"r0": {"eagle": [2] * 10}})
    r = A.acceptance_by_draft_position(t, k=3).set_index("draft_position")["rate"]
    assert r.tolist() == [1.0, 0.0, 0.0]
    # steps start at 0, 2, 4, 6, 8 -> 5 drafts
    assert A.acceptance_by_draft_position(t, k=3)["drafts"].iloc[0] == 5


def test_draft_position_rate_skips_no_match_steps():
    # n-gram found no match at the odd positions (draft_len 0): those steps are not drafts.
    a = [1, 4, 1, 1, 1, 1, 1, 1]
    dl = [0, 3, 3, 0, 3, 0, 3, 0]
    t = _trace({"r0": {"ngram": a}}, draft_lens={"r0": {"ngram": dl}}, k_max=3)
    # k=3 walk: 0 (no draft) -> 1 (acc 3) -> 5 (no draft) -> 6 (acc 0) -> 7 (no draft)
    r = A.acceptance_by_draft_position(t, k=3)
    assert r["drafts"].iloc[0] == 2
    assert r["rate"].tolist() == [0.5, 0.5, 0.5]
    assert r["conditional_rate"].tolist() == [0.5, 1.0, 1.0]


def test_draft_position_conditional_rate_by_hand():
    # k=3 walk (a step at p produces min(a[p], 4) tokens): 0 (a=4: 3 accepted) -> 4 (a=2: 1) -> 6 (a=3: 2)
    # -> 9 (a=1: 0) -> 10 (a=1: 0) -> 11 = end. 5 drafts; at least 1 accepted: 3, at least 2: 2, all 3: 1.
    t = _trace({"r0": {"eagle": [4, 1, 1, 1, 2, 1, 3, 1, 1, 1, 1]}})
    r = A.acceptance_by_draft_position(t, k=3).set_index("draft_position")
    assert r["drafts"].tolist() == [5, 5, 5]
    assert r["rate"].tolist() == pytest.approx([3 / 5, 2 / 5, 1 / 5])          # the study's: ÷ all drafts
    assert r["conditional_rate"].tolist() == pytest.approx([3 / 5, 2 / 3, 1 / 2])  # ÷ drafts reaching i-1
    # nothing ever accepted: the conditional rate past i=1 has no draft to condition on
    r0 = A.acceptance_by_draft_position(_trace({"r0": {"eagle": [1] * 4}}), k=3)
    assert r0["rate"].tolist() == [0.0, 0.0, 0.0]
    assert r0["conditional_rate"].iloc[0] == 0.0 and r0["conditional_rate"].iloc[1:].isna().all()


def test_draft_position_vs_study_pairs_datasets_and_sides():
    ours = A.acceptance_by_draft_position(
        Trace.concat([_trace({"r0": {"eagle": [4, 1, 1, 1, 2, 1], "early-exit": [2] * 6}}, dataset=d)
                      for d in ("code-edit", "humaneval")]), k=2)
    study = pd.DataFrame([{"dataset": ds, "model": "Llama (published trace)", "proposer": p, "k": k, "draft_position": i,
                           "rate": 0.5 / i, "conditional_rate": 0.6, "drafts": 100}
                          for ds in ("instructcoder", "sharegpt") for p in ("eagle", "ngram") for k in (2, 3)
                          for i in range(1, k + 1)])
    c = A.draft_position_vs_study(ours, study, k=2)
    assert set(c["pair"]) == {"code-edit ↔ instructcoder"}    # humaneval has no counterpart; sharegpt not in ours
    assert set(c["proposer"]) == {"eagle"}                    # early-exit is not EAGLE; ours has no n-gram
    assert set(c["side"]) == {"package", "study"} and set(c["kind"]) == {"unconditional", "conditional"}
    st = c[(c["side"] == "study") & (c["kind"] == "unconditional")].set_index("draft_position")["value"]
    assert st.tolist() == [0.5, 0.25] and not c.attrs["notes"]
    pk = c[(c["side"] == "package") & (c["kind"] == "conditional")].set_index("draft_position")["value"]
    # k=2 walk: 0 (a=4: 2 accepted) -> 3 (a=1: 0) -> 4 (a=2: 1) -> 6 = end: 3 drafts, 2 reach i=1, 1 reaches i=2
    assert pk.tolist() == pytest.approx([2 / 3, 1 / 2])
    # no counterpart at all: the study's side alone, with a note; a k the table lacks: the package's alone
    alone = A.draft_position_vs_study(ours[ours["dataset"] == "humaneval"], study, k=2)
    assert set(alone["side"]) == {"study"} and "no eagle or ngram" in alone.attrs["notes"][0]
    assert set(A.draft_position_vs_study(ours, study, k=5)["side"]) == {"package"}


def test_acceptance_by_output_position_bins_and_caps():
    t = _trace({"r0": {"ngram": [8, 8, 1, 1]}, "r1": {"ngram": [2, 2, 2, 2]}})
    df = A.acceptance_by_output_position(t, k=3, bin_size=2)
    got = df.set_index("position")["tokens_per_step"].to_dict()
    assert got == {0: pytest.approx((4 + 4 + 2 + 2) / 4), 2: pytest.approx((1 + 1 + 2 + 2) / 4)}
    # a bin only one request reaches is dropped with min_requests=2
    t2 = _trace({"r0": {"ngram": [2] * 6}, "r1": {"ngram": [2] * 2}})
    df2 = A.acceptance_by_output_position(t2, k=3, bin_size=2, min_requests=2)
    assert df2["position"].tolist() == [0]


def test_bleu_identical_vs_disjoint_text():
    text = "def add(a, b): return a + b  # adds two numbers together and returns the result"
    info = {"same": {"prompt_text": text, "output_text": text},
            "diff": {"prompt_text": text, "output_text": "completely unrelated words appear here instead now"}}
    t = _trace({"same": {"ngram": [1] * 5}, "diff": {"ngram": [1] * 5}}, info=info)
    b = A.prompt_output_bleu(t).set_index("request_id")["bleu"]
    assert b["same"] == pytest.approx(1.0)
    assert b["diff"] < 0.05


def test_bleu_falls_back_to_token_ids_and_errors_without_either():
    info = {"r0": {"prompt_token_ids": list(range(20)), "output_token_ids": list(range(20))}}
    t = _trace({"r0": {"ngram": [1] * 20}}, info=info)
    b = A.prompt_output_bleu(t)
    assert b["bleu_on"].item() == "token_ids" and b["bleu"].item() == pytest.approx(1.0)
    bare = _trace({"r0": {"ngram": [1] * 5}})
    with pytest.raises(TraceError, match="texts or token ids"):
        A.prompt_output_bleu(bare)


def test_ngram_advantage_and_threshold():
    # Synthetic: high-overlap requests where n-gram accepts a lot, low-overlap where the other proposer wins.
    base = "the quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat today"
    arrays, info = {}, {}
    for i in range(6):
        arrays[f"hi{i}"] = {"ngram": [4] * 20, "eagle": [2] * 20}
        info[f"hi{i}"] = {"prompt_text": base, "output_text": base}
        arrays[f"lo{i}"] = {"ngram": [1] * 20, "eagle": [3] * 20}
        info[f"lo{i}"] = {"prompt_text": base, "output_text": f"entirely different content number {i} here ok"}
    t = _trace(arrays, info=info)
    adv = A.ngram_advantage(t, other="eagle", k=3).set_index("request_id")
    assert adv.loc["hi0", "advantage"] == pytest.approx(2.0)
    # 20 tokens: n-gram 20 steps; eagle 3 per step -> 7 steps -> (20/20) / (20/7)
    assert adv.loc["lo0", "advantage"] == pytest.approx(7 / 20)
    thr, tab = A.overlap_threshold(adv.reset_index(), min_requests=1)
    assert thr is not None and 0.0 < thr <= 0.9
    assert tab["n"].sum() == 12
    assert A.overlap_threshold(adv.reset_index())[0] is None, "6 requests a side cannot carry a threshold (< 10)"


def test_phase_shares_sum_to_one_and_drop_prefill_and_outliers():
    rows = []
    for bs, (d, v, r, o) in {1: (1.0, 2.0, 0.0, 1.0), 8: (1.0, 6.0, 0.5, 0.5)}.items():
        for step in range(3):
            rows.append(dict(run_id="x", engine="synthetic", model="m", method="ngram", k=3, batch_size=bs,
                             step=step, t_draft=d, t_verify=v, t_reject=r, t_other=o, t_total=d + v + r + o,
                             phase="decode"))
    rows.append(dict(rows[0], t_verify=100.0, t_total=102.0, phase="prefill"))
    rows.append(dict(rows[0], t_draft=50.0, t_total=54.0, outlier=True))
    sh = A.phase_shares(pd.DataFrame(rows).fillna({"outlier": False})).set_index("batch_size")
    assert list(sh.columns) == ["model", "method", "k", "steps", "total_s", "ms_per_step", *A.SHARE_COLUMNS]
    assert sh.loc[1, "steps"] == 3 and sh.loc[1, "ms_per_step"] == pytest.approx(4000.0)
    assert sh.loc[1, "verification_share"] == pytest.approx(0.5)
    assert sh.loc[8, "verification_share"] == pytest.approx(0.75)
    cols = [c for c in sh.columns if c.endswith("_share")]
    assert np.allclose(sh[cols].sum(axis=1), 1.0)
    long = A.shares_long(sh.reset_index())
    assert set(long["phase"]) == {"drafting", "verification", "rejection sampling", "overhead"}


def test_oracle_gap_and_hybrid_table():
    sim = pd.DataFrame([
        dict(dataset="d", proposers="ngram", policy="fixed-1", draft_cost="ngram-only", batch_size=1, speedup=1.5),
        dict(dataset="d", proposers="ngram", policy="fixed-3", draft_cost="ngram-only", batch_size=1, speedup=2.0),
        dict(dataset="d", proposers="ngram", policy="oracle", draft_cost="ngram-only", batch_size=1, speedup=2.5),
        dict(dataset="d", proposers="ngram+eagle", policy="oracle-combine", draft_cost="all", batch_size=1,
             speedup=3.0),
    ])
    g = A.oracle_gap(sim)
    assert g["best_fixed"].item() == "fixed-3"
    assert g["gap"].item() == pytest.approx(1.25)
    h = A.hybrid_table(sim)
    assert h["combine (all)"].item() == 3.0 and h["oracle ngram"].item() == 2.5


def test_summary_roundtrip(tmp_path):
    rows = [A.SummaryRow("4 oracle bound", "oracle speedup", "≈2.75x", "2.10x", "simulated", np.float64(2.1))]
    df = A.write_summary(rows, tmp_path / "s.json")
    assert list(df.columns) == ["finding", "quantity", "paper", "this_run", "source", "value", "verdict", "headline",
                          "short"]
    back = A.read_summaries([tmp_path / "s.json"])
    assert back.equals(df)
    md = A.summary_markdown(back)
    assert "| quantity | paper | this run | verdict | source |" in md.splitlines()
    with pytest.raises(TypeError):
        A.write_summary([{"finding": "x"}], None)


def test_trace_files_resolution(tmp_path):
    t = _trace({"r0": {"ngram": [1, 2, 1]}})
    t.to_parquet(tmp_path / "smollm2_code-edit.parquet")
    t.to_parquet(tmp_path / "qwen_sharegpt.parquet")
    assert len(A.trace_files(tmp_path)) == 2
    assert [f.name for f in A.trace_files(tmp_path, model="smollm2")] == ["smollm2_code-edit.parquet"]
    assert [f.name for f in A.trace_files(tmp_path, datasets=["sharegpt"])] == ["qwen_sharegpt.parquet"]
    with pytest.raises(TraceError, match="no such"):
        A.trace_files(tmp_path / "missing.parquet")
    with pytest.raises(TraceError, match="no trace files"):
        A.trace_files(tmp_path, model="llama")


# ---- readers of the committed measurements (recorded real data: data/gpu from the H200, data/cpu) ----------

def test_gpu_phase_shares_match_the_committed_breakdown():
    """The committed data/gpu/phase_breakdown.csv (decode steps) is what phase_shares gives on the committed step
    log: one computation, one set of column names."""
    steps, src = A.gpu_steps()
    assert steps is not None and "H200" in src
    sh = A.phase_shares(steps)
    pb = pd.read_csv(A.data_dir() / "gpu" / "phase_breakdown.csv")
    pb = pb[(pb["steps_kind"] == "decode") & pb["primary"]]
    m = sh.merge(pb, on=["model", "method", "k", "batch_size"])
    assert len(m) == len(pb) and len(m) >= 20
    assert (m["steps_x"] == m["steps_y"]).all()
    for col in A.SHARE_COLUMNS:
        assert np.allclose(m[f"{col}_x"], m[f"{col}_y"], atol=1e-5), col


def test_gpu_speedups_are_throughput_ratios():
    sp, src = A.gpu_speedups()
    runs = pd.read_csv(A.data_dir() / "gpu" / "runs.csv")
    runs = runs[(runs["task"] == "batches") & runs["primary"]]
    base = runs[(runs["method"] == "none") & (runs["model"] == "llama31-8b") & (runs["batch_size"] == 16)]
    ng = runs[(runs["method"] == "ngram") & (runs["model"] == "llama31-8b") & (runs["batch_size"] == 16)]
    row = sp[(sp["model"] == "llama31-8b") & (sp["method"] == "ngram") & (sp["batch_size"] == 16)]
    assert row["speedup"].item() == pytest.approx(ng["output_tok_per_s"].mean() / base["output_tok_per_s"].mean())
    assert row["proposers"].item().startswith("ngram (AL ")
    assert (sp["acceptance"] == "assumed (vLLM synthetic sampler)").sum() >= 1


def test_verify_readers():
    lim, _ = A.gpu_verify_limits()
    assert np.allclose(lim.loc[lim["method"] == "none", "vs_no_sd"], 1.0)
    assert (lim["t_verify_ms"] > lim["floor_ms"]).all()  # nothing beats the HBM floor
    vc, src = A.verify_cost()
    assert vc.loc[vc["k"] == 0, "ratio"].item() == pytest.approx(1.0)
    assert "GB/s" in src
    rows = A.finding2_rows(A.phase_shares(A.gpu_steps()[0]), "s", vc, "v", lim, "l")
    assert any("HBM floor" in r.this_run for r in rows)


def test_combine_puts_ngram_first_so_ties_cost_the_cheap_drafter():
    """SYNTHETIC: both proposers always accept the same; under `winner` a tie must be charged as n-gram, so the
    result equals `ngram-only` (which charges n-gram's rule) and beats `all` (which also pays EAGLE)."""
    t = _trace({f"r{i}": {"eagle": [3] * 30, "ngram": [3] * 30} for i in range(4)},
               draft_lens={f"r{i}": {"eagle": [5] * 30, "ngram": [5] * 30} for i in range(4)}, k_max=5)
    sim = A.simulate_grid(t, "llama3.1-8b-h100", proposers=["eagle", "ngram"], policies=["oracle-combine"],
                          batch_sizes=[1], draft_costs=["ngram-only", "winner", "all"]).set_index("draft_cost")
    assert sim.loc["winner", "speedup"] == pytest.approx(sim.loc["ngram-only", "speedup"])
    assert sim.loc["all", "speedup"] < sim.loc["winner", "speedup"]


def test_cost_model_standins_for_proposers_the_model_lacks():
    t = _trace({"r": {"ngram": [1, 2, 1], "early-exit": [2, 1, 1], "draft": [3, 1, 1]}})
    cm, notes = A.cost_model_for(t, "llama3.1-8b-h100")
    ee = cm.drafters["early-exit"]   # priced by its own depth (80% of the target's layers), never as EAGLE
    assert ee.kind == "per_token" and ee != cm.drafter("eagle")
    assert float(ee.time(1000, 2, 0.0, 1, 1)) == pytest.approx(0.8 * float(cm.forward(1000, 1)))
    d = cm.drafters["draft"]
    assert d.kind == "per_token"
    # one drafted token for one request costs 37.5% of the target's one-token forward at the same KV
    assert float(d.time(1000, 2, 0.0, 1, 1)) == pytest.approx(0.375 * float(cm.forward(1000, 1)))
    assert len(notes) == 2 and any("37.5%" in n for n in notes) and any("80.0%" in n and "own depth" in n
                                                                        for n in notes)
    with pytest.raises(ValueError, match="no drafting model"):
        A.cost_model_for(_trace({"r": {"medusa": [1, 2]}}), "llama3.1-8b-h100")


def test_verify_cost_summary_medians_percentiles_and_ratios():
    from spec_repro.metrics import verify_cost_summary

    raw = pd.DataFrame({"k": [0] * 3 + [3] * 3, "n_tokens": [1] * 3 + [4] * 3, "kv_len": 64,
                        "seconds": [1.0, 2.0, 3.0, 3.0, 4.0, 6.0]})
    df = verify_cost_summary(raw).set_index("k")
    assert df.loc[0, "median_s"] == 2.0 and df.loc[3, "median_s"] == 4.0 and df.loc[3, "repeats"] == 3
    assert df.loc[3, "ratio_to_1_token"] == 2.0
    assert df.loc[3, "p10_s"] == pytest.approx(3.2) and df.loc[0, "p10_s"] == pytest.approx(1.2)
    assert df.loc[3, "p10_ratio_to_1_token"] == pytest.approx(3.2 / 1.2)
