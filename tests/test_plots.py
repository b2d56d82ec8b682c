"""spec_repro.plots draws every figure from small SYNTHETIC tables (seeded; no real numbers are implied):
axes are labelled with units, proposers keep one colour across figures, and save() writes PNG + PDF."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from spec_repro import analysis as A  # noqa: E402
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
        "spread": P.tokens_per_step_spread(A.tokens_per_step_per_request(trace), paper={"ngram": (1.1, 15.0)},
                                            paper_dataset="code-edit"),
        "overlap": P.overlap_vs_advantage(adv, other="eagle", threshold=thr),
        "gap": P.oracle_gap(A.oracle_gap(sim), paper_refs={"paper 2.75x": 2.75}),
        "hybrid": P.hybrid_oracle(sim, paper_refs={"combine, ngram-only": 4.9}, paper_dataset="code-edit"),
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
