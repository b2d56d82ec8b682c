"""The reporting layer, exactly: hand-built simulation / share / spread tables in, the summary strings out.

Every expected value below was worked out by hand from the input table (not copied from a run), so a change to a
number, a format or the paper's table (``findings.PAPER``) fails here before it reaches figures/SUMMARY.md."""
import numpy as np
import pandas as pd
import pytest

from spec_repro import findings as F
from spec_repro.metrics import oracle_gap


def _rows(rows):
    return [(r.finding, r.quantity, r.paper, r.this_run, r.source, r.value) for r in rows]


def _sim(rows):
    cols = ["dataset", "proposers", "policy", "draft_cost", "batch_size", "speedup"]
    return pd.DataFrame([dict(zip(cols, r)) for r in rows])


def test_finding1_best_proposer_at_the_smallest_batch_and_its_speedup_at_the_largest():
    sim = _sim([("code-edit", "ngram", "oracle", "ngram-only", 1, 2.0), ("code-edit", "eagle", "oracle", "all", 1, 1.5),
                ("code-edit", "ngram", "oracle", "ngram-only", 64, 1.25),
                ("code-edit", "eagle", "oracle", "all", 64, 1.1)]).assign(model="m")
    measured = pd.DataFrame({"dataset": ["llama31-8b dims, random prompt"] * 2, "model": ["llama31-8b"] * 2,
                             "proposers": ["ngram (AL 3.95, dummy weights)"] * 2, "batch_size": [1, 256],
                             "speedup": [3.333, 1.404]})
    rows = F.finding1_rows(sim, measured, sim_source="sim", measured_source="meas")
    assert _rows(rows) == [
        ("1 speedup vs batch", "code-edit (m): best proposer (ngram), bs 1 -> 64 (simulated)",
         "shrinks (1.96x at bs 1, 70B)", "2.00x -> 1.25x", "sim", 2.0),
        ("1 speedup vs batch", "m: datasets where the best proposer's speedup shrinks from the smallest to the largest "
         "batch (simulated)", "every dataset", "1 of 1", "sim", 1.0),
        ("1 speedup vs batch", "llama31-8b dims, random prompt: best proposer (ngram (AL 3.95, dummy weights)), "
         "bs 1 -> 256 (measured vLLM, dummy weights)",
         "shrinks (1.96x at bs 1, 70B)", "3.33x -> 1.40x", "meas", 3.333),
    ]
    dummy = "not comparable (acceptance set by dummy weights)"
    assert [(r.verdict, r.headline) for r in rows] == [("agrees", False), ("agrees", False), (dummy, False)]
    # the measured headline is vLLM with real weights on its default engine (V2), never a dummy-weight run
    assert not F.finding1_rows(None, measured.assign(model="llama3-70b"), sim_source="", measured_source="m")[0].headline
    live = pd.DataFrame({"dataset": "code-edit", "model": "q", "batch_size": [1, 1, 64, 64],
                         "proposers": ["hy (AL 3.7, real weights)", "eagle (AL 3.0, real weights)"] * 2,
                         "speedup": [1.21, 0.89, 0.55, 0.69], "weights": "real"})
    lr = F.finding1_rows(None, None, sim_source="", live=live, live_source="live")
    assert [(r.this_run, r.verdict, r.headline, r.short) for r in lr] == [
        ("1.21x -> 0.55x", "agrees (slower than no SD at bs 64)", False,
         "code-edit, q (vLLM V1, forced): best (hy), bs 1 -> 64")]
    # vLLM's default engine: one headline row per workload, the best configuration at bs 1 named by its method; a
    # host-contended end of the best configuration is named in the verdict (there its speedup is a lower bound)
    v2 = pd.DataFrame({"dataset": ["code-edit"] * 4 + ["sharegpt"] * 4, "model": "q",
                       "batch_size": [1, 1, 64, 64] * 2, "method": ["eagle-k3", "ngram-k5"] * 4,
                       "proposers": ["eagle k=3 (AL 2.6, real weights)", "ngram k=5 (AL 4.6, real weights)"] * 4,
                       "speedup": [1.72, 0.57, 0.92, 0.28, 0.39, 0.62, 0.24, 0.71], "weights": "real",
                       "contended": [False, True, True, True, True, False, False, True]})
    both = F.finding1_rows(None, None, sim_source="", live=live, live_source="live", v2=v2, v2_source="v2")
    assert [(r.quantity, r.this_run, r.source, r.value, r.verdict, r.headline, r.short) for r in both] == [
        ("code-edit (q): best proposer (eagle k=3 (AL 2.6, real weights)), bs 1 -> 64 (measured vLLM default "
         "engine (V2 runner), real weights)", "1.72x -> 0.92x", "v2", 1.72,
         "agrees (slower than no SD at bs 64; host-contended at bs 64: a lower bound there)", True,
         "code-edit, q (vLLM V2): best (eagle-k3), bs 1 -> 64"),
        # sharegpt: n-gram is the best at bs 1 here (0.62 > 0.39), and grows to 0.71 at bs 64
        ("sharegpt (q): best proposer (ngram k=5 (AL 4.6, real weights)), bs 1 -> 64 (measured vLLM default "
         "engine (V2 runner), real weights)", "0.62x -> 0.71x", "v2", 0.62,
         "departs: grows with batch (slower than no SD at bs 1 and 64; host-contended at bs 64: a lower bound "
         "there)", True, "sharegpt, q (vLLM V2): best (ngram-k5), bs 1 -> 64"),
        (lr[0].quantity, "1.21x -> 0.55x", "live", 1.21, "agrees (slower than no SD at bs 64)", False, lr[0].short)]
    slow = F.finding1_rows(None, measured.assign(speedup=[0.73, 0.42]), sim_source="", measured_source="m")
    assert slow[0].verdict == dummy + "; slower than no SD at bs 1 and 256"
    grows = sim.assign(speedup=[1.0, 0.9, 1.3, 1.1])        # ngram best at bs 1 (1.0), then 1.3 at bs 64
    stalled = measured.assign(stalled=[False, True])        # a compilation stall is not the method's speed
    rows = F.finding1_rows(grows, stalled, sim_source="sim", measured_source="meas")
    assert [r.verdict for r in rows] == ["departs: grows with batch", "departs: grows on 1", dummy]
    assert rows[2].this_run == "3.33x -> 3.33x"             # bs 256 dropped: only bs 1 is left


def test_finding2_shares_rejection_and_cpu_verify_cost():
    shares = pd.DataFrame({"model": "m", "method": ["none", "ngram", "ngram"], "k": 3, "batch_size": [1, 1, 64],
                           "verification_share": [0.9, 0.55, 0.7], "rejection_sampling_share": [0.0, 0.01, 0.02]})
    vc = pd.DataFrame({"k": [0, 3, 7], "ratio": [1.0, 1.2, 1.5]})
    assert _rows(F.finding2_rows(shares, "steps", vc, "cpu")) == [
        ("2 verification bottleneck", "m dims, ngram: verification share of decode-step time, bs 1-64",
         "42%-95% (all methods)", "55%-70%", "steps", 0.7),
        ("2 verification bottleneck", "rejection sampling share, max over methods and batches", "< 1.7%", "2.0%",
         "steps", 0.02),
        ("2 verification bottleneck", "CPU (SmolLM2-135M): forward of k+1 = 4 tokens ÷ 1 token", "n/a (GPU study)",
         "1.20", "cpu", 1.2),
        ("2 verification bottleneck", "CPU (SmolLM2-135M): forward of k+1 = 8 tokens ÷ 1 token", "n/a (GPU study)",
         "1.50", "cpu", 1.5),
    ]
    assert _rows(F.finding2_rows(None, "nothing", None, "")) == [
        ("2 verification bottleneck", "verification share of step time", "42%-95%",
         "not measured (no step logs or CPU verify-cost data found)", "nothing", None)]


def test_finding3_spread_on_the_focus_dataset_and_range_across_datasets():
    spread = pd.DataFrame({"dataset": ["code-edit", "code-edit", "sharegpt", "sharegpt"], "model": "m",
                           "proposer": ["ngram", "early-exit", "ngram", "early-exit"], "p5": [1.43, 1.1, 1.0, 1.0],
                           "p50": [2.0, 1.5, 1.5, 1.2], "p95": [12.04, 3.26, 4.0, 2.0]})
    assert _rows(F.finding3_rows(spread, None, source="src")) == [
        ("3 acceptance varies", "code-edit (m): tokens/step 5th-95th pct across requests, ngram",
         "1.1-15.0 (ngram, InstructCoder, 70B)", "1.4-12.0 (95th/5th 8.42)", "src", 12.04),
        ("3 acceptance varies", "code-edit (m): tokens/step 5th-95th pct across requests, early-exit",
         "2.7-7.4 (EAGLE, InstructCoder, 70B)", "1.1-3.3 (95th/5th 2.96)", "src", 3.26),
        ("3 acceptance varies", "code-edit (m): tokens/step 5th-95th pct across requests, ngram", "1.1-15.0",
         "1.4-12.0", "src", 12.04),
        ("3 acceptance varies", "early-exit (m): median tokens/step, range across datasets", "varies by dataset",
         "1.20 (sharegpt) - 1.50 (code-edit)", "src", pytest.approx(1.25)),
        ("3 acceptance varies", "ngram (m): median tokens/step, range across datasets", "varies by dataset",
         "1.50 (sharegpt) - 2.00 (code-edit)", "src", pytest.approx(4 / 3)),
    ]
    rows = F.finding3_rows(spread.assign(proposer=["ngram", "eagle"] * 2, p95=[12.04, 2.0, 4.0, 2.0]), None,
                           source="src")
    recap = [r for r in rows if r.headline]
    assert [(r.paper, r.this_run, r.verdict, r.short) for r in recap] == [
        ("1.1-15.0 / 2.7-7.4", "1.4-12.0 / 1.1-2.0", "departs: narrow (eagle)",
         "code-edit, m: tokens/step p5-p95, ngram / eagle")]


def test_finding3b_overlap_threshold_and_win_shares():
    adv = pd.DataFrame({"bleu": [0.1, 0.2, 0.7, 0.8], "ngram_wins": [False, True, True, True], "other": "eagle"})
    thr = pd.DataFrame([dict(other="eagle", model="m", threshold=0.6, n_below=2, n_above=2, n=4)])
    rows = F.finding3b_rows(adv, thr, source="src")
    assert _rows(rows) == [
        ("3 n-gram vs overlap", "BLEU-4 above which n-gram beats eagle (m)", "≈0.6",
         "0.6 (2 / 2 requests below / above)", "src", 0.6),
        ("3 n-gram vs overlap", "share of requests where n-gram beats eagle (m): BLEU < 0.6 / >= 0.6", "low / high",
         "50% (n=2) / 100% (n=2)", "src", 1.0),
    ]
    assert [r.verdict for r in rows] == ["agrees", "too few requests on one side (< 10)"]
    many = pd.DataFrame({"bleu": [0.1] * 10 + [0.8] * 10, "ngram_wins": [False] * 10 + [True] * 10, "other": "eagle"})
    assert F.finding3b_rows(many, thr, source="src")[1].verdict == "agrees"
    none = thr.assign(threshold=None, n_below=None, n_above=None)
    assert F.finding3b_rows(adv, none, source="src")[0].this_run == "none supported"


def test_finding4_oracle_vs_best_fixed_from_a_simulation_table():
    sim = _sim([("code-edit", "ngram", "fixed-1", "ngram-only", 1, 1.5),
                ("code-edit", "ngram", "fixed-3", "ngram-only", 1, 2.0),
                ("code-edit", "ngram", "oracle", "ngram-only", 1, 2.5),
                ("code-edit", "ngram", "fixed-1", "ngram-only", 16, 1.2),
                ("code-edit", "ngram", "fixed-3", "ngram-only", 16, 1.1),
                ("code-edit", "ngram", "oracle", "ngram-only", 16, 1.8),
                ("sharegpt", "ngram", "fixed-1", "ngram-only", 1, 1.1),
                ("sharegpt", "ngram", "oracle", "ngram-only", 1, 1.3)])
    assert _rows(F.finding4_rows(oracle_gap(sim), source="src")) == [
        ("4 oracle bound", "code-edit, ngram, bs 1: oracle vs best fixed k",
         "≈2.75x vs ≈2.1x", "2.50x vs 2.00x (fixed-3)", "src", 2.5),
        ("4 oracle bound", "code-edit, ngram: oracle ÷ best fixed, bs 1 -> 16", "gap widens with batch size",
         "1.25 -> 1.50", "src", pytest.approx(1.5)),
    ]


def test_finding5_each_oracle_and_oracle_combine_per_accounting():
    sim = _sim([("code-edit", "ngram", "oracle", "ngram-only", 1, 2.5),
                ("code-edit", "eagle", "oracle", "all", 1, 1.6),
                ("code-edit", "ngram+eagle", "oracle-combine", "ngram-only", 1, 3.0),
                ("code-edit", "ngram+eagle", "oracle-combine", "winner", 1, 2.8),
                ("code-edit", "ngram+eagle", "oracle-combine", "all", 1, 2.6),
                ("code-edit", "ngram+eagle", "oracle-combine", "all", 16, 1.4)])
    assert _rows(F.finding5_rows(sim, source="src")) == [
        ("5 hybrid oracle", "code-edit, bs 1: ngram oracle", "≈2.75x (finding 4)", "2.50x", "src", 2.5),
        ("5 hybrid oracle", "code-edit, bs 1: eagle oracle", "≈2.7x", "1.60x", "src", 1.6),
        ("5 hybrid oracle", "code-edit, bs 1: Oracle Combine (ngram+eagle), drafting cost ngram-only", "4.9x",
         "3.00x", "src", 3.0),
        ("5 hybrid oracle", "code-edit, bs 1: Oracle Combine (ngram+eagle), drafting cost winner", "≈4.3x",
         "2.80x", "src", 2.8),
        ("5 hybrid oracle", "code-edit, bs 1: Oracle Combine (ngram+eagle), drafting cost all", "≈3.85x",
         "2.60x", "src", 2.6),
        ("5 hybrid oracle", "code-edit, bs 1: Oracle Combine (ngram+eagle), drafting cost ngram-only / winner / all",
         "4.9x/≈4.3x/≈3.85x", "3.00x/2.80x/2.60x", "src", 3.0),
    ]
    rows = F.finding5_rows(sim, source="src")
    assert [r.headline for r in rows] == [False] * 5 + [True]
    assert rows[-1].verdict == "agrees (all above the best single oracle, 2.50x)"


def test_agreement_rows():
    agree = {"vs_torch_profiler": {"accepted_agreement_rate": 1.0, "steps": 18113},
             "vs_torch_traces": {"accepted_agreement_rate": 0.995, "steps_on_common_prefix": 1000,
                                 "identical_outputs": 150, "requests": 200}}
    assert [r.this_run for r in F.agreement_rows(agree, "src")] == [
        "100.0% of 18113 steps", "99.5% of 1000 steps; 150/200 outputs identical"]
    assert F.agreement_rows(None, "src") == []


def test_summary_markdown_is_the_exact_table():
    df = F.write_summary([F.SummaryRow("4 oracle bound", "a | b", "≈2.75x", "2.10x", "line1\nline2", 2.1, "agrees"),
                          F.SummaryRow("4 oracle bound", "c", "p", "r", "other", None, "departs: narrows"),
                          F.SummaryRow("6b adaptive selector", "d", "n/a", "r2", "line1\nline2", 1.0,
                                       "beyond the study")], None)
    md = F.summary_markdown(df)
    head = "\n".join(F._wrap(F.VERDICT_RULES, F.MAX_LINE)) + "\n\n" + "\n".join(F._wrap(F.TERMS, F.MAX_LINE)) + "\n\n"
    assert md == head + (
        f"## {F.FINDING_TITLES['4']}\n\n"
        "| quantity | paper | this run | verdict | source |\n"
        "|---|---|---|---|---|\n"
        "| a / b | ≈2.75x | 2.10x | agrees | B1 |\n"
        "| c | p | r | departs: narrows | B2 |\n\n"
        "## Beyond the study: a causal proposer-and-length selector\n\n"
        "| quantity | paper | this run | verdict | source |\n"
        "|---|---|---|---|---|\n"
        "| d | — | r2 | beyond the study | B1 |\n\n"
        "## Sources\n\n"
        "- **B1**: line1 line2\n"
        "- **B2**: other\n")
    assert "| A1 |" in F.summary_markdown(df, "A")
    long = F.write_summary([F.SummaryRow("1 speedup vs batch", "q", "p", "r", "x " * 400, 1.0, "agrees")], None)
    assert max(len(line) for line in F.summary_markdown(long).splitlines()) <= F.MAX_LINE


def test_headline_markdown_keeps_headline_rows_in_finding_order_with_keys_per_table():
    ours = F.write_summary([F.SummaryRow("5 hybrid oracle", "combine", "4.9x", "6.17x", "sim ours", 6.17, "agrees",
                                         True),
                            F.SummaryRow("1 speedup vs batch", "b", "p", "r", "sim ours", 1.0, "agrees", True),
                            F.SummaryRow("1 speedup vs batch", "hidden", "p", "r", "sim ours", 1.0, "agrees")], None)
    study = F.write_summary([F.SummaryRow("4 oracle bound", "oracle", "2.75x", "2.76x", "study", 2.76, "agrees",
                                          True)], None)
    tail = "\n".join([""] + F._wrap(F.VERDICT_RULES, F.README_LINE) + [""] + F._wrap(F.TERMS, F.README_LINE)) + "\n"
    assert F.headline_markdown([("published", study), ("ours", ours)]) == (
        "| # | quantity | paper | this run | verdict | src |\n"
        "|---|---|---|---|---|---|\n"
        "| 1 | b | p | r | agrees | B1 |\n"
        "| 4 | oracle | 2.75x | 2.76x | agrees | A1 |\n"
        "| 5 | combine | 4.9x | 6.17x | agrees | B1 |\n\n"
        "- **A1** (published): study\n"
        "- **B1** (ours): sim ours\n") + tail
    # the README words a row by its short form, drops a verdict's parenthesized detail, shows no SmolLM2 row and no
    # more than README_ROWS rows
    many = F.write_summary([F.SummaryRow("4 oracle bound", f"q{i}", "p", "r", "s", 1.0, "agrees: above (2.5x)", True,
                                         short=f"s{i}") for i in range(14)]
                           + [F.SummaryRow("4 oracle bound", "x (smollm2-135m)", "p", "r", "s", 1.0, "agrees", True)],
                           None)
    md = F.headline_markdown([("ours", many, "B")])
    rows = [l for l in md.splitlines() if l.startswith("| 4 |")]
    assert len(rows) == F.README_ROWS and rows[0] == "| 4 | s0 | p | r | agrees: above | B1 |"
    assert "smollm2" not in md and "2 more headline rows are in the summaries." in md


def test_verdicts_of_findings_2_to_5():
    shares = pd.DataFrame({"model": "m", "method": ["ngram", "ngram", "draft_model"], "batch_size": [1, 64, 1],
                           "verification_share": [0.55, 0.7, 0.3], "rejection_sampling_share": [0.01, 0.02, 0.0]})
    assert [r.verdict for r in F.finding2_rows(shares, "s", None, "")] == [
        "departs: below the paper's range (a light drafter)", "agrees", "departs: slightly above, still small"]
    adv = pd.DataFrame({"bleu": [0.1, 0.2, 0.9], "ngram_wins": [False, False, True], "other": "eagle"})
    thr = pd.DataFrame([dict(other="eagle", model="", threshold=0.9, n_below=2, n_above=1, n=3)])
    assert [r.verdict for r in F.finding3b_rows(adv, thr, source="s")] == ["departs: higher",
                                                                          "too few requests on one side (< 10)"]
    draft = thr.assign(other="draft", threshold=None)
    assert F.finding3b_rows(adv.assign(other="draft"), draft, source="s")[0].verdict == \
        "not in the paper (vs draft); departs"
    sim = _sim([("code-edit", "ngram", "oracle", "ngram-only", 1, 2.0), ("code-edit", "eagle", "oracle", "all", 1, 2.5),
                ("code-edit", "ngram+eagle", "oracle-combine", "all", 1, 2.4)]).assign(model="m")
    assert [r.verdict for r in F.finding5_rows(sim, source="s")][-2:] == [
        "departs: not above the best single oracle (2.50x)", "departs: not above the best single oracle (2.50x) with all"]


def test_paper_table_is_the_only_source_of_the_figures_reference_lines():
    assert F.paper_refs("oracle_gap") == {"paper oracle 2.75x": 2.75, "paper fixed 2.1x": 2.1}
    assert F.paper_refs("hybrid", ["ngram", "draft", "early-exit"]) == {
        "combine, ngram-only": 4.9, "combine, winner": 4.3, "combine, all": 3.85, "ngram oracle": 2.75}
    assert F.paper_refs("hybrid", ["ngram", "eagle"]) == {
        "combine, ngram-only": 4.9, "combine, winner": 4.3, "combine, all": 3.85, "ngram oracle": 2.75,
        "eagle oracle": 2.7}
    with pytest.raises(ValueError, match="use 'oracle_gap' or 'hybrid'"):
        F.paper_refs("speedup")


def test_adaptive_rows_the_causal_row_is_the_rule_unless_a_policy_beats_it():
    def row(ds, causal, vs_rule, worst, beats, spread=0.01):
        return dict(dataset=ds, model="m", set="ngram+eagle", batch_size=1, best_fixed=2.0,
                    best_fixed_config="ngram fixed-16", rule=3.0, rule_config="ngram-else-eagle-skip-16-2",
                    best_causal=causal, best_causal_policy="adaptive-rule-oos", combine_winner=4.0,
                    gap_closed=(causal - 2.0) / 2.0, rule_gap_closed=0.5, causal_vs_rule=vs_rule,
                    worst_vs_rule=worst, worst_vs_rule_batch=64, worst_vs_fixed=0.99, beats_rule=beats,
                    learned_spread_max=spread, learned_unstable_any=spread > 0.05, batch_sizes="1-128")
    beat = pd.DataFrame([row("code-edit", 3.3, 1.1, 0.99, True), row("sharegpt", 1.9, 0.95, 0.9, False, 0.08)])
    rows = F.adaptive_rows(beat, source="src")
    assert _rows(rows)[0] == (
        "6b adaptive selector", "code-edit (m), ngram+eagle, bs 1: causal row", "n/a",
        "adaptive-rule-oos 3.30x = 1.100x rule ngram-else-eagle-skip-16-2 3.00x (worst 0.990x); fixed ngram "
        "fixed-16 2.00x; oracle (winner) 4.00x; gap 65%", "src", pytest.approx(1.1))
    assert rows[0].verdict == "beyond the study: beats the rule" and rows[0].headline
    assert [r.this_run for r in rows[1:]] == ["1 of 2 / 2 of 2", "8.0%"]
    assert rows[2].verdict == "beyond the study: unstable (spread > 5% of the mean somewhere)"
    lose = pd.DataFrame([row("code-edit", 2.9, 0.967, 0.96, False)])
    r = F.adaptive_rows(lose, source="src")[0]
    assert r.this_run.startswith("rule ngram-else-eagle-skip-16-2 3.00x; causal adaptive-rule-oos 2.90x (0.967x, "
                                 "worst 0.960x)")
    assert r.verdict == "beyond the study: none beats the rule" and r.value == 3.0
    md = F.summary_markdown(F.write_summary(F.adaptive_rows(beat, source="src") + [r], None))
    assert max(len(line) for line in md.splitlines()) <= F.MAX_LINE


def test_headline_markdown_shows_a_shared_row_once_from_the_later_table():
    shared = F.SummaryRow("2 verification bottleneck", "vllm share", "42%-95%", "57%-71%", "steps", 0.7, "agrees", True)
    a = F.write_summary([shared, F.SummaryRow("4 oracle bound", "o", "p", "r", "study", 1.0, "agrees", True)], None)
    b = F.write_summary([shared], None)
    md = F.headline_markdown([("published", a), ("ours", b)])
    assert md.count("vllm share") == 1 and "| 57%-71% | agrees | B1 |" in md
    # keys are those of each table's own SUMMARY.md: the study row is the published table's second source
    assert "- **A2** (published): study" in md and "- **B1** (ours): steps" in md and "A1" not in md
    # a CSV round trip keeps "n/a" and the boolean flag
    import io
    back = pd.read_csv(io.StringIO(b.assign(paper="n/a").to_csv(index=False)), keep_default_na=False)
    assert "| — | 57%-71% |" in F.headline_markdown([("ours", back)])


def test_committed_summaries_keep_their_line_bound():
    from spec_repro.paths import figures_dir

    for f in (figures_dir() / "SUMMARY.md", figures_dir() / "published" / "SUMMARY.md"):
        if f.exists():
            assert max(len(line) for line in f.read_text().splitlines()) <= F.MAX_LINE, f


def test_committed_readme_table_reads_at_a_glance():
    """The README's generated results table: at most README_ROWS rows of at most README_LINE characters."""
    from spec_repro.paths import repo_root
    from spec_repro.reproduce import README_MARKERS

    text = (repo_root() / "README.md").read_text()
    block = text[text.index(README_MARKERS[0]) + len(README_MARKERS[0]):text.index(README_MARKERS[1])]
    rows = [line for line in block.splitlines() if line.startswith("| ") and not line.startswith("| # ")]
    assert 0 < len(rows) <= F.README_ROWS, len(rows)
    assert max(len(line) for line in block.splitlines()) <= F.README_LINE


def test_committed_findings_tables_are_never_cut():
    """No cell of a committed notebook's findings output (the cells nbval checks) is cut to "..." by pandas."""
    import nbformat

    from spec_repro.paths import repo_root

    for nb in sorted((repo_root() / "notebooks").glob("*.ipynb")):
        for c in nbformat.read(nb, as_version=4).cells:
            if "nbval-check-output" not in c.metadata.get("tags", []):
                continue
            for o in c.get("outputs", []):
                for mime in ("text/plain", "text/html"):
                    text = o.get("data", {}).get(mime, "")
                    assert "..." not in text and "…" not in text, (nb.name, mime)


def test_the_summary_opens_with_a_digest_of_its_headline_rows():
    """SUMMARY.md's first section: one line per headline row (SmolLM2's left to the tables, as in the README), at
    most DIGEST_ROWS, then a line for the rest; the committed summaries open with it."""
    from spec_repro.paths import repo_root

    row = dict(finding="1 speedup", quantity="q", paper="p", this_run="1.5x", verdict="agrees (detail)",
               source="s", headline=True)
    rows = [{**row, "quantity": f"q{i}"} for i in range(F.DIGEST_ROWS + 2)]
    rows += [{**row, "quantity": "smollm2-135m q"}, {**row, "quantity": "not headline", "headline": False}]
    d = F.digest_lines(pd.DataFrame(rows))
    assert d[0] == "## In short" and d[2] == "- 1. q0: 1.5x (paper: p): agrees"
    assert len(d) == 2 + F.DIGEST_ROWS + 2 <= 16 and d[-2] == "- and 2 more headline rows below"
    assert not any("smollm2" in x or "not headline" in x for x in d)
    assert F.digest_lines(pd.DataFrame([{**row, "headline": False}])) == []
    for folder in ("figures", "figures/published"):
        md = (repo_root() / folder / "SUMMARY.md").read_text().splitlines()
        csv = pd.read_csv(repo_root() / folder / "summary.csv")
        start = md.index("## In short")
        assert start < 6 and md[start:start + len(F.digest_lines(csv))] == F.digest_lines(csv)


def test_adaptive_rows_state_the_confidence_policies_x_the_tuned_rule():
    def row(ds, model, skip):
        return dict(dataset=ds, model=model, batch_size=1, rule_config="ngram-else-eagle-skip-16-2", rule=4.0,
                    adaptive_rule_x_rule=0.995, skip_conf=skip, skip_conf_config="ngram-else-eagle-skip-conf-16-0.1-4",
                    skip_conf_x_rule=skip / 4.0, conf_stop_config="conf-stop-0.1-4", conf_stop_x_rule=0.36,
                    ceiling_config="ngram-else-eagle-skip-conf-16-oracle-16", ceiling_x_rule=1.063)
    conf = pd.DataFrame([row("code-edit", "s", 4.01), row("code-edit", "q", np.nan), row("sharegpt", "s", 2.3)])
    summary = pd.DataFrame(columns=["dataset", "model", "set"])
    rows = F.adaptive_rows(summary, source="src", confidence=conf)
    assert [r.quantity for r in rows] == [f"code-edit ({m}), bs 1: x the rule tuned on other workloads (skip-16-2 "
                                        f"4.00x)" for m in ("s", "q")]
    assert rows[0].this_run == ("adaptive-rule 0.995x; skip-conf-16-0.1-4 1.002x; conf-stop-0.1-4 (EAGLE alone) "
                                "0.360x; ceiling (a perfect stop) 1.063x")
    assert rows[0].value == pytest.approx(1.0025) and rows[0].verdict == "beyond the study: none beats the tuned rule"
    assert "no stop policy (no confidence in the trace)" in rows[1].this_run and rows[1].value == pytest.approx(0.995)
    md = F.summary_markdown(F.write_summary(rows, None))
    assert max(len(line) for line in md.splitlines()) <= F.MAX_LINE
