"""spec_repro.plots draws every figure from small SYNTHETIC tables (seeded; no real numbers are implied):
axes are labelled with units, proposers keep one colour across figures, and save() writes PNG + PDF."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from spec_repro import analysis as A  # noqa: E402
from spec_repro import measured as M  # noqa: E402
from spec_repro import plots as P  # noqa: E402
from spec_repro.traces import Trace  # noqa: E402


@pytest.fixture(scope="module")
def trace():
    rng = np.random.default_rng(3)  # synthetic, seeded
    arrays, info = {}, {}
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    for ds in ("code-edit", "sharegpt"):
        for i in range(8):
            rid = f"{ds}-{i}"
            arrays[rid] = {"ngram": rng.integers(1, 9, 48).tolist(), "eagle": rng.integers(1, 5, 48).tolist()}
            prompt = " ".join(rng.choice(words, 30))
            info[rid] = {"prompt_text": prompt,
                         "output_text": prompt if i % 2 else " ".join(rng.choice(words, 30))}
    parts = [Trace.from_arrays({r: a for r, a in arrays.items() if r.startswith(ds)}, prompt_lens={r: 30 for r in arrays},
                               dataset=ds, model="synthetic", request_info=info, k_max=8)
             for ds in ("code-edit", "sharegpt")]
    return Trace.concat(parts)


def _sim():
    rows = []
    for ds in ("code-edit", "sharegpt"):
        for bs in (1, 8, 64):
            for p, base in (("ngram", 2.0), ("eagle", 1.8)):
                for pol, f in (("fixed-1", 0.8), ("fixed-3", 1.0), ("oracle", 1.3)):
                    rows.append(dict(dataset=ds, proposers=p, policy=pol, draft_cost="ngram-only", batch_size=bs,
                                     speedup=base * f / (1 + np.log2(bs) / 8)))
            for acct, f in (("ngram-only", 1.6), ("winner", 1.5), ("all", 1.4)):
                rows.append(dict(dataset=ds, proposers="ngram+eagle", policy="oracle-combine", draft_cost=acct,
                                 batch_size=bs, speedup=2.0 * f / (1 + np.log2(bs) / 8)))
    return pd.DataFrame(rows)


def _labels_ok(fig):
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert axes
    for ax in axes:
        assert ax.get_xlabel() and ax.get_ylabel(), "every visible axis is labelled"


def _figs(trace):
    sim = _sim()
    steps = pd.DataFrame([dict(model="m", method=m, k=3, batch_size=bs, t_draft=d, t_verify=v, t_reject=0.01,
                               t_other=0.1, t_total=d + v + 0.11)
                          for m, d in (("ngram", 0.01), ("eagle", 0.3)) for bs, v in ((1, 1.0), (64, 2.0))])
    shares = A.phase_shares(steps)
    vc = pd.DataFrame({"k": range(1, 9), "ratio": 1 + 0.05 * np.arange(1, 9)})
    adv = A.ngram_advantage(trace, other="eagle")
    thr, _ = A.overlap_threshold(adv)
    return {
        "speedup": P.speedup_vs_batch(sim[sim.policy == "fixed-3"], measured=sim[sim.policy == "oracle"],
                                      source="synthetic"),
        "breakdown": P.time_breakdown(shares, source="synthetic"),
        "verify": P.verify_cost_curve(vc, source="synthetic"),
        "by_pos": P.acceptance_by_position(A.acceptance_by_output_position(trace, k=3), k=3),
        "draft_pos": P.draft_position_rate(A.acceptance_by_draft_position(trace, k=3)),
        "draft_pos_vs_study": P.draft_position_vs_study(A.draft_position_vs_study(
            A.acceptance_by_draft_position(trace, k=3), A.study_draft_position_rates(), k=3)),
        "spread": P.tokens_per_step_spread(A.tokens_per_step_per_request(trace), paper={"ngram": (1.1, 15.0)},
                                            paper_dataset="code-edit"),
        "overlap": P.overlap_vs_advantage(adv, other="eagle", threshold=thr),
        "gap": P.oracle_gap(A.oracle_gap(sim), paper_refs={"paper 2.75x": 2.75}),
        "hybrid": P.hybrid_oracle(sim, paper_refs={"combine, ngram-only": 4.9}, paper_dataset="code-edit"),
        "by_config": P.speedup_by_configuration(_by_config(), source="synthetic"),
        "by_run": P.phases_by_run(pd.DataFrame(
            [dict(config=c, batch_size=b, order=i, verification=2.0, drafting=1.5 + (i % 3), rest=2.0 + (i % 2))
             for b in (1, 8) for i, c in enumerate(["eagle", "idle", "gpu-pr24344"] * 3)]), source="synthetic"),
    }


def test_every_figure_labelled_and_saved(trace, tmp_path):
    figs = _figs(trace)
    for name, fig in figs.items():
        _labels_ok(fig)
        paths = P.save(fig, name, tmp_path)
        assert [p.suffix for p in paths] == [".png", ".pdf"]
        assert all(p.stat().st_size > 1000 for p in paths)
        plt.close(fig)


def test_palette_is_fixed_per_proposer(trace):
    df = A.acceptance_by_output_position(trace, k=3)
    fig = P.acceptance_by_position(df, k=3)
    by_label = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            if line.get_label() in ("ngram", "eagle"):
                by_label.setdefault(line.get_label(), set()).add(tuple(np.round(matplotlib.colors.to_rgb(
                    line.get_color()), 3)))
    plt.close(fig)
    assert by_label["ngram"] == {tuple(np.round(P.PALETTE["ngram"], 3))}
    assert by_label["eagle"] == {tuple(np.round(P.PALETTE["eagle"], 3))}
    assert P.color("ngram") != P.color("eagle")
    assert P.color("something-new") == P.color("something-new")


def test_hybrid_bars_carry_the_values():
    sim = _sim()
    fig = P.hybrid_oracle(sim, batch_size=1)
    texts = {t.get_text() for t in fig.axes[0].texts}
    want = sim[(sim.batch_size == 1) & (sim.dataset == "code-edit") & (sim.policy == "oracle-combine")]
    assert {f"{v:.2f}" for v in want["speedup"]} <= texts
    plt.close(fig)


# ---- honesty and legibility (figures10) -------------------------------------------------------------------


def _two_model_sim():
    a, b = _sim().assign(model="m1"), _sim().assign(model="m2")
    b = b[b.proposers != "eagle"]      # m2 has no eagle
    extra = a[(a.proposers == "eagle") & (a.policy == "oracle")].assign(proposers="draft")
    return pd.concat([a, extra, b], ignore_index=True)


def test_hybrid_paper_ticks_only_on_matching_bar_and_dataset():
    sim = _two_model_sim()
    refs = {"ngram oracle": 2.75, "eagle oracle": 2.7, "draft oracle": 2.7, "combine, winner": 4.3}
    fig = P.hybrid_oracle(sim, paper_refs=refs, paper_dataset="code-edit")
    ticks = [c.get_gid() for ax in fig.axes for c in ax.collections if (c.get_gid() or "").startswith("paper|")]
    assert ticks, "paper ticks are drawn"
    assert all(t.endswith("|code-edit") for t in ticks), "only on the paper's dataset"
    assert not any("draft oracle" in t for t in ticks), "the paper's EAGLE value never lands on a draft bar"
    assert sum("eagle oracle" in t for t in ticks) == 1, "only the model that has eagle gets its tick"
    # every tick sits over the bar of its own label
    for ax in fig.axes:
        bars = {}
        for cont in ax.containers:
            for i, b in enumerate(cont):
                bars[(cont.get_label(), i)] = b
        for c in ax.collections:
            gid = c.get_gid() or ""
            if gid.startswith("paper|"):
                _, lab, ds = gid.split("|")
                b = bars[(lab, 0)]      # code-edit is the first dataset
                (x0, _), (x1, _) = c.get_segments()[0]
                assert b.get_x() - 0.05 <= (x0 + x1) / 2 <= b.get_x() + b.get_width() + 0.05
    assert len([ax for ax in fig.axes if ax.get_visible()]) == 2, "one panel per model"
    assert fig.get_figwidth() <= P.COLUMN_WIDTH_IN + 1e-6
    plt.close(fig)


def _measured():
    rows = []
    for bs in (1, 4, 16):
        for meth, tps in (("eagle", 100.0 * bs), ("ngram", 300.0 * bs)):
            rows.append(dict(dataset="m dims", model="m", method=meth, proposers=f"{meth} (AL 1, dummy weights)",
                             batch_size=bs, speedup=tps / (120.0 * bs), tokens_per_s=tps, base_tokens_per_s=120.0 * bs,
                             synthetic=np.nan, acceptance="as measured"))
    return pd.DataFrame(rows)


def _steps():
    rows = []
    for meth in ("none", "eagle", "ngram"):
        for bs in (1, 4, 16):
            for i in range(50):
                t_draft = 0.001
                if meth == "eagle" and bs == 4 and i == 1:
                    t_draft = 0.8                                 # a JIT stall in drafting
                t_verify = 0.008 + (1.0 if meth == "none" and bs == 16 and i == 2 else 0.0)  # a stall in the forward
                rows.append(dict(spec=f"s-{meth}", run_id=f"m-{meth}-k3-b{bs}", model="m", method=meth, batch_size=bs,
                                 phase="decode", batched_tokens=bs * 4, t_verify=t_verify, t_draft=t_draft,
                                 t_total=t_verify + t_draft + 0.002))
    return pd.DataFrame(rows)


def test_stalled_runs_found_in_drafting_and_in_the_forward():
    st = M.stalled_runs(_steps())
    bad = set(st.loc[st.stalled, "run_id"])
    assert bad == {"m-eagle-k3-b4", "m-none-k3-b16"}


def test_measured_speedup_drops_stalled_points_and_says_so():
    meas = M.flag_stalled_points(_measured(), M.stalled_runs(_steps()))
    assert meas.stalled.sum() == 3, "eagle B=4 (own stall) and eagle + ngram B=16 (baseline stall)"
    assert all(meas.loc[meas.stalled, "stall_reason"].str.contains("stalled"))
    fig = P.speedup_vs_batch(meas, style="acceptance")
    pts = sum(len(l.get_xdata()) for ax in fig.axes for l in ax.get_lines() if (l.get_gid() or "").startswith("line|"))
    assert pts == len(meas) - 3
    notes = " ".join(t.get_text() for t in fig.texts)
    assert "Dropped 3 of 6 measured points" in notes.replace("\n", " ")
    plt.close(fig)
    fig = P.speedup_vs_batch(meas.drop(columns=["stalled", "stall_reason"]), style="acceptance")
    pts = sum(len(l.get_xdata()) for ax in fig.axes for l in ax.get_lines() if (l.get_gid() or "").startswith("line|"))
    assert pts == len(meas), "rows without the stalled column are all kept"
    plt.close(fig)


def _by_config():
    """SYNTHETIC: two workloads, EAGLE at two k and n-gram, the bs-8 points host-contended."""
    return pd.DataFrame([dict(dataset=ds, method=m, runner="V1" if m.startswith("ngram") else "V2", batch_size=bs,
                              speedup=s / (1 + np.log2(bs) / 6), ratio_lo=0.9 * s / (1 + np.log2(bs) / 6),
                              ratio_hi=1.1 * s / (1 + np.log2(bs) / 6), contended=bs == 8)
                         for ds in ("code-edit", "sharegpt") for m, s in (("eagle-k1", 1.2), ("eagle-k3", 1.6),
                                                                           ("ngram-k5", 0.6))
                         for bs in (1, 8, 64)])


def test_configurations_keep_their_colour_and_contended_points_are_hollow():
    from matplotlib.colors import to_rgb

    df = _by_config()
    fig = P.speedup_by_configuration(df, source="synthetic")
    pts = {l.get_gid(): l for ax in fig.axes for l in ax.get_lines() if (l.get_gid() or "").startswith("points|")}
    assert len(pts) == 2 * 3 * 2                                       # per panel and method: clean, contended
    for gid, l in pts.items():
        _, ds, m, kind = gid.split("|")
        assert list(l.get_xdata()) == ([8] if kind == "contended" else [1, 64]), gid
        assert (to_rgb(l.get_markerfacecolor()) == (1.0, 1.0, 1.0)) == (kind == "contended"), gid
    col = {m: to_rgb(pts[f"points|code-edit|{m}|clean"].get_color()) for m in ("eagle-k1", "eagle-k3", "ngram-k5")}
    assert col["ngram-k5"] == pytest.approx(to_rgb(P.PALETTE["ngram"]))  # one k: the proposer's own colour
    assert col["eagle-k1"] != col["eagle-k3"]                           # the k's of one proposer told apart
    assert col == {m: to_rgb(pts[f"points|sharegpt|{m}|clean"].get_color()) for m in col}   # the same in each panel
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[:3] == ["eagle k=1, V2", "eagle k=3, V2", "ngram k=5, V1"] and P.CONTENDED_NOTE in labels
    plt.close(fig)
    fig = P.speedup_by_configuration(df.assign(contended=False))
    assert P.CONTENDED_NOTE not in [t.get_text() for t in fig.legends[0].get_texts()]   # no note without such a point
    plt.close(fig)


def test_cost_models_get_distinct_line_styles_and_markers():
    sim = _sim()
    sim = pd.concat([sim.assign(cost_model="A"), sim.assign(cost_model="B", speedup=sim.speedup * 1.1)])
    fig = P.speedup_vs_batch(sim[sim.policy == "fixed-3"])
    styles = {}
    for ax in fig.axes:
        for l in ax.get_lines():
            gid = l.get_gid() or ""
            if gid.startswith("line|"):
                styles.setdefault(gid.split("|")[2], set()).add((l.get_linestyle(), l.get_marker()))
    assert len(styles["A"]) == len(styles["B"]) == 1 and styles["A"] != styles["B"]
    (ls_a, mk_a), (ls_b, mk_b) = styles["A"].pop(), styles["B"].pop()
    assert ls_a != ls_b and mk_a != mk_b
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "cost model: A" in labels and "cost model: B" in labels
    plt.close(fig)


def _adv(n_hi: int):
    rng = np.random.default_rng(0)
    rows = []
    for other in ("eagle", "early-exit"):
        for i in range(60 + n_hi):
            hi = i >= 60
            bleu = rng.uniform(0.65, 0.95) if hi else rng.uniform(0.0, 0.5)
            rows.append(dict(dataset="code-edit", model=f"m-{other}", request_id=f"{other}-{i}", bleu=bleu,
                             advantage=(2.0 if hi else 0.5) * rng.uniform(0.9, 1.1), other=other))
    d = pd.DataFrame(rows)
    d["ngram_wins"] = d["advantage"] > 1
    return d


def test_overlap_one_panel_per_comparator_and_threshold_needs_support():
    fig = P.overlap_vs_advantage(_adv(30), other="eagle / early-exit", threshold=0.3)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == 2
    assert {ax.get_title().split(" (")[0] for ax in axes} == {"n-gram vs eagle", "n-gram vs early-exit"}
    for ax in axes:
        assert any(l.get_gid() == "threshold" for l in ax.get_lines()), "30 requests above: drawn"
    paper = [ax for ax in axes if any(l.get_gid() == "paper-threshold" for l in ax.get_lines())]
    assert [ax.get_title().split(" (")[0] for ax in paper] == ["n-gram vs eagle"], "paper's line only vs EAGLE"
    plt.close(fig)
    fig = P.overlap_vs_advantage(_adv(2), other="eagle / early-exit", threshold=0.3)
    for ax in fig.axes:
        assert not any(l.get_gid() == "threshold" for l in ax.get_lines()), "2 requests cannot carry a threshold"
    assert "at least 10 requests" in " ".join(t.get_text() for t in fig.texts).replace("\n", " ")
    plt.close(fig)
    # one comparator: the given threshold, still only with support on both sides
    one = _adv(30)
    one = one[one.other == "eagle"]
    fig = P.overlap_vs_advantage(one, other="eagle", threshold=0.6)
    assert any(l.get_gid() == "threshold" for l in fig.axes[0].get_lines())
    plt.close(fig)


def test_figures_fit_a_page_width(trace):
    figs = _figs(trace)
    figs["floor"] = P.verify_vs_floor(pd.DataFrame([dict(model=m, method=me, batch_size=b, t_verify_ms=5.0 * b ** 0.3,
                                                         floor_ms=3.0) for m in ("a", "b", "c", "d", "e")
                                                    for me in ("none", "ngram") for b in (1, 16, 256)]))
    for name, fig in figs.items():
        w, h = fig.get_size_inches()
        assert w <= P.COLUMN_WIDTH_IN + 0.3, f"{name}: {w:.1f} in wide"
        assert h <= 11, f"{name}: {h:.1f} in tall"
        plt.close(fig)


def test_spread_paper_range_only_on_paper_dataset_and_measured_proposers(trace):
    per = A.tokens_per_step_per_request(trace)
    fig = P.tokens_per_step_spread(per, paper={"ngram": (1.1, 15.0), "eagle": (2.7, 7.4)}, paper_dataset="code-edit",
                                   paper_proposers=("ngram",))
    gids = [c.get_gid() for ax in fig.axes for c in ax.collections if (c.get_gid() or "").startswith("paper|")]
    assert gids == ["paper|ngram|code-edit"]
    plt.close(fig)


def test_committed_figures_fit_a_page_width():
    """Every committed figure is at most COLUMN_WIDTH_IN (7 in) wide as saved (PNG pixels ÷ its dpi). The adaptive
    figure (notebook 07) is left to its own notebook's owner and named here."""
    from PIL import Image

    from spec_repro.paths import figures_dir
    from spec_repro.plotstyle import COLUMN_WIDTH_IN

    wide = []
    for f in sorted(figures_dir().rglob("*.png")):
        if f.stem == "07_adaptive":
            continue
        im = Image.open(f)
        dpi = im.info.get("dpi", (120, 120))[0]
        if im.size[0] / dpi > COLUMN_WIDTH_IN + 0.02:
            wide.append((f.name, round(im.size[0] / dpi, 2)))
    assert not wide, wide


def test_batch_axis_labels_every_batch_size():
    """Every batch size is a labelled tick (no point on an unlabelled one); where neighbours are closer than
    ``min_octaves`` (the adaptive figure's narrow panels ask for more room) the labels turn vertical instead."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from spec_repro.plotstyle import _batch_axis

    for bs, m, vertical in (([1, 8, 16, 32, 64, 128], 2.9, True), ([1, 4, 16, 64, 256], 1.9, False)):
        fig, ax = plt.subplots()
        _batch_axis(ax, bs, min_octaves=m)
        labels = ax.get_xticklabels()
        assert [t.get_text() for t in labels] == [str(b) for b in bs]
        assert all((t.get_rotation() == 90) == vertical for t in labels)
        plt.close(fig)
