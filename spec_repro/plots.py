"""One seaborn function per figure. Every function takes the tidy table that :mod:`spec_repro.analysis` (or
``simulate``) returns, labels its axes with units, colours proposers with one fixed palette, draws the
paper's reference values where they are meaningful, and puts the data's source in the caption.

``save(fig, name)`` writes ``figures/<name>.png`` (dpi 120) and ``.pdf``; the common look and layout helpers live
in :mod:`spec_repro.plotstyle`.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from .findings import PAPER
from .metrics import MIN_OVERLAP_REQUESTS, SHARE_COLUMNS, overlap_support, overlap_threshold

__all__ = [
    "PALETTE", "PHASE_COLORS", "COLUMN_WIDTH_IN", "color", "palette_for", "save", "speedup_vs_batch",
    "speedup_by_configuration", "CONTENDED_NOTE",
    "time_breakdown", "verify_vs_floor", "verify_cost_curve", "drafting_vs_k", "acceptance_by_position", "draft_position_rate",
    "draft_position_vs_study", "tokens_per_step_spread",
    "overlap_vs_advantage", "oracle_gap", "hybrid_oracle", "adaptive_vs_batch",
]

from .plotstyle import (_CB, ACCOUNTING_HATCH, COLUMN_WIDTH_IN, PALETTE, PHASE_COLORS, _batch_axis,  # noqa: F401
                        _facets, _finish, _is_paper_panel, _legend_below, _note, _panels, _plain_log, _title, color,
                        palette_for, save)


# ---- finding 1 --------------------------------------------------------------------------------------------


_STYLE_LS = ["-", "--", ":", "-."]
_STYLE_MK = ["o", "s", "^", "D"]
_STYLE_MK_NAME = {"o": "●", "s": "■", "^": "▲", "D": "◆"}


def _drop_stalled(df: pd.DataFrame | None, fig_notes: list) -> pd.DataFrame | None:
    """Drop measured points marked ``stalled`` (``measured.gpu_speedups`` marks them); record a note saying how
    many and which. Rows without the column are kept as they are."""
    if df is None or not len(df) or "stalled" not in df.columns:
        return df
    bad = df[df["stalled"].astype(bool)]
    if len(bad):
        fig_notes.append(f"Dropped {len(bad)} of {len(df)} measured points: first-use compilation stalls (listed in "
                         "the notebook).")
    return df[~df["stalled"].astype(bool)].drop(columns=[c for c in ("stalled", "stall_reason") if c in df])


def _proposer_legend(props: Sequence[str]) -> list[tuple[str, str]]:
    """One legend entry per proposer colour: (base name, label). Series of one proposer that differ only in their
    acceptance length (one per model) share it, the lengths as a range ("ngram (AL 3.94-3.97, dummy weights)");
    a synthetic-acceptance series is told apart by its line style, not by an entry of its own."""
    import re

    out: dict[str, list[str]] = {}
    for p in props:
        out.setdefault(p.split(" ")[0], []).append(p)
    pairs = []
    for base, ps in out.items():
        real = [p for p in ps if "synthetic" not in p] or ps
        als = [float(m.group(1)) for p in real if (m := re.search(r"\bAL ([\d.]+)", p))]
        rest = sorted({re.sub(r"^.*?\(|\)$", "", re.sub(r"\bAL [\d.]+,? ?", "", p)).strip(", ") for p in real
                       if "(" in p} - {""})
        if len(real) == 1 and len(ps) == 1:
            pairs.append((base, real[0]))
            continue
        inner = []
        if als:
            lo, hi = min(als), max(als)
            inner.append(f"AL {lo:.2f}" if lo == hi else f"AL {lo:.2f}-{hi:.2f}")
        inner += rest
        pairs.append((base, f"{base} ({', '.join(inner)})" if inner else base))
    return pairs


def speedup_vs_batch(sim: pd.DataFrame, measured: pd.DataFrame | None = None, *, title: str = "",
                     source: str | None = None, paper_refs: Mapping[str, float] | None = None,
                     style: str | None = None, paper_dataset: str | None = None, ncols: int | None = None):
    """Speedup vs batch size, one panel per dataset, one colour per proposer (simulated rows of ``simulate``:
    dataset, proposers, batch_size, speedup). ``style`` (default ``cost_model`` when the rows hold several) gives
    each of its values its own line style AND marker (solid ●, dashed ■, dotted ▲, dash-dot ◆), named in the
    legend. ``measured`` (dataset, proposers, batch_size, speedup) adds measured points, thin dash-dot with
    hollow squares. ``paper_refs`` draws labelled reference lines, only on ``paper_dataset``'s panels (every
    panel when None).

    Measured vLLM rows (``measured.gpu_speedups``, passed as ``sim`` or ``measured``) lose the points marked
    ``stalled`` (their run or no-SD baseline hit a first-use compilation); the figure says how many and which."""
    notes: list[str] = []
    sim = _drop_stalled(sim, notes)
    measured = _drop_stalled(measured, notes)
    sim, measured = _panels(sim), _panels(measured)
    datasets = sorted(sim["dataset"].unique())
    if measured is not None and len(measured):
        datasets = sorted(set(datasets) | set(measured["dataset"].unique()))
    n = len(datasets)
    fig, axes = _facets(n, ncols=ncols or (2 if n <= 4 else 3), w=3.5, h=2.7)
    props = sorted(set(sim["proposers"]) | (set(measured["proposers"]) if measured is not None else set()))
    if style is None and "cost_model" in sim.columns and sim["cost_model"].nunique() > 1:
        style = "cost_model"
    levels = sorted(sim[style].astype(str).unique()) if style else [None]
    sty = {lv: (_STYLE_LS[i % 4], _STYLE_MK[i % 4]) for i, lv in enumerate(levels)}
    for ax, ds in zip(axes, datasets):
        d = sim[sim["dataset"] == ds]
        for (p, lv), g in d.groupby(["proposers", d[style].astype(str) if style else pd.Series("", index=d.index)]):
            g = g.sort_values("batch_size")
            ls, mk = sty[lv if style else None]
            ax.plot(g["batch_size"], g["speedup"], ls=ls, marker=mk, ms=3.5, lw=1.3, color=color(p.split(" ")[0]),
                    label=f"_{p}|{lv}", gid=f"line|{p}|{lv}")
        if measured is not None and len(measured):
            m = measured[measured["dataset"] == ds]
            for p, g in m.groupby("proposers"):
                g = g.sort_values("batch_size")
                ax.plot(g["batch_size"], g["speedup"], ls="-.", lw=1, marker="s", ms=5, mfc="none",
                        color=color(p.split(" ")[0]), label=f"_{p}|measured")
        ax.axhline(1.0, color="0.2", lw=0.8, ls=":")
        if _is_paper_panel(ds, paper_dataset):
            for lab, v in (paper_refs or {}).items():
                ax.axhline(v, color="0.5", lw=0.8, ls="--")
                ax.annotate(lab, (ax.get_xlim()[0], v), fontsize=6.5, color="0.35", va="bottom")
        _batch_axis(ax, pd.concat([d["batch_size"]] + ([m["batch_size"]] if measured is not None and len(measured)
                                                       else [])))
        _title(ax, ds)
        ax.set_ylabel("speedup vs no SD (×)")
    from matplotlib.lines import Line2D

    extra = [(Line2D([], [], color=color(base), lw=4), lab) for base, lab in _proposer_legend(props)]
    if style:
        synth = sorted({p.split("synthetic AL ")[1].rstrip(")") for p in props if "synthetic AL " in p})
        extra += [(Line2D([], [], color="0.15", ls=sty[lv][0], marker=sty[lv][1], ms=4, lw=1.3),
                   f"{style.replace('_', ' ')}: {lv}" + (f", AL {', '.join(synth)}" if synth and "synthetic" in lv
                                                         else "")) for lv in levels]
    if measured is not None and len(measured):
        extra.append((Line2D([], [], color="0.15", ls="-.", marker="s", mfc="none", lw=1), "measured"))
    _legend_below(fig, axes, ncol=3, extra=extra)
    for t in notes:
        _note(fig, t)
    fig.suptitle(title or "Speedup vs batch size", fontsize=10)
    return _finish(fig, source)


CONTENDED_NOTE = "hollow: host-contended (hypervisor steal ≥ 1% of the run): a lower bound"


def _config_style(methods: Sequence[str]) -> dict[str, tuple]:
    """(colour, marker) per configuration ``<proposer>-k<k>``: a proposer's palette colour, its k's told apart
    by shade (light: small k) and marker."""
    import re

    from matplotlib.colors import to_rgb

    out, by = {}, {}
    for m in methods:
        by.setdefault(re.sub(r"-k\d+$", "", m), []).append(m)
    for base, ms in by.items():
        ms = sorted(ms, key=lambda m: int(re.search(r"-k(\d+)$", m).group(1)) if re.search(r"-k(\d+)$", m) else 0)
        c = np.array(to_rgb(color(base)))
        for i, m in enumerate(ms):
            f = -0.55 + 1.15 * i / (len(ms) - 1) if len(ms) > 1 else 0.0   # < 0: towards white, > 0: black
            shade = c + (1 - c) * -f if f < 0 else c * (1 - f)
            out[m] = (tuple(np.clip(shade, 0, 1)), _STYLE_MK[i % 4] if len(ms) > 1 else "v")
    return out


def speedup_by_configuration(df: pd.DataFrame, *, title: str = "", source: str | None = None,
                             label: Mapping[str, str] | None = None):
    """Measured speedup vs batch size, one panel per dataset, one line per configuration (``method``, e.g.
    ``eagle-k3``: a proposer's colour, its k by shade and marker), the spread over repeats as a bar
    (``ratio_lo`` / ``ratio_hi`` where present) and a 1.0 line. Points marked ``contended`` (the host took time
    from the run: ``measured.v2_speedups``) are drawn hollow: their speedup is a lower bound. ``label``: the
    legend text per method (default: the method as "eagle k=3", its ``runner`` after it where given)."""
    from matplotlib.lines import Line2D

    datasets = sorted(df["dataset"].unique())
    fig, axes = _facets(len(datasets), ncols=2, w=3.5, h=3.0)
    methods = sorted(df["method"].unique(), key=lambda m: (not m.startswith("eagle"), m))
    sty = _config_style(methods)
    contended = df["contended"].astype(bool) if "contended" in df else pd.Series(False, index=df.index)
    top = 1.08 * max(df["speedup"].max(), df["ratio_hi"].max() if "ratio_hi" in df else 0, 1.0)   # panels share y
    for ax, ds in zip(axes, datasets):
        d = df[df["dataset"] == ds]
        for m in methods:
            g = d[d["method"] == m].sort_values("batch_size")
            if not len(g):
                continue
            c, mk = sty[m]
            ax.plot(g["batch_size"], g["speedup"], color=c, lw=1.3, label=f"_{m}", gid=f"line|{ds}|{m}")
            if {"ratio_lo", "ratio_hi"} <= set(g.columns):
                ax.vlines(g["batch_size"], g["ratio_lo"], g["ratio_hi"], color=c, lw=0.8, alpha=0.5)
            hollow = contended.loc[g.index]
            for h, pts in g.groupby(hollow):
                ax.plot(pts["batch_size"], pts["speedup"], ls="none", marker=mk, ms=5.5, mew=1.2, color=c,
                        mfc="white" if h else c, zorder=3, label=f"_{m}|{'contended' if h else 'clean'}",
                        gid=f"points|{ds}|{m}|{'contended' if h else 'clean'}")
        ax.axhline(1.0, color="0.2", lw=0.9, ls="--")
        ax.set_ylim(0, top)
        _batch_axis(ax, d["batch_size"])
        _title(ax, ds)
        ax.set_ylabel("speedup vs no SD (×)")
    runner = df.groupby("method")["runner"].first().to_dict() if "runner" in df else {}
    label = {m: m.replace("-k", " k=") + (f", {runner[m]}" if m in runner else "") for m in methods} | dict(label or {})
    extra = [(Line2D([], [], color=sty[m][0], marker=sty[m][1], ms=5, lw=1.3), label[m]) for m in methods]
    extra.append((Line2D([], [], color="0.2", lw=0.9, ls="--"), "1.0: as fast as no SD"))
    if contended.any():
        extra.append((Line2D([], [], color="0.3", marker="o", mfc="white", ms=5, lw=0), CONTENDED_NOTE))
    _legend_below(fig, axes, ncol=2, extra=extra)
    fig.suptitle(title or "Measured speedup vs batch size, per configuration", fontsize=10)
    return _finish(fig, source)


# ---- finding 2 --------------------------------------------------------------------------------------------


def time_breakdown(shares: pd.DataFrame, *, x: str = "batch_size", facet="method", title: str = "",
                   source: str | None = None, paper_verify_range: tuple[float, float] | None = PAPER["verify_share"]):
    """Stacked shares of step time (output of ``metrics.phase_shares``): one panel per ``facet`` value, one
    bar per ``x``. The paper's range of verification's share is shaded for reference."""
    phases = [c for c in SHARE_COLUMNS if c in shares.columns]
    if not isinstance(facet, str):  # several columns: one panel per combination
        shares = shares.assign(_facet=shares[list(facet)].astype(str).agg(" · ".join, axis=1))
        facet = "_facet"
    facets = list(dict.fromkeys(shares[facet]))
    fig, axes = _facets(len(facets), ncols=min(3, len(facets)), w=3.6, h=2.6)
    method_of = dict(zip(shares[facet], shares["method"].astype(str))) if "method" in shares.columns else {}
    order = ["verification_share", "drafting_share", "rejection_sampling_share", "overhead_share"]
    for ax, f in zip(axes, facets):
        d = shares[shares[facet] == f].sort_values(x)
        xs = [str(v) for v in d[x]]
        bottom = np.zeros(len(d))
        plain = method_of.get(f) == "none"
        for c in [c for c in order if c in phases]:
            name = c.removesuffix("_share").replace("_", " ")
            v = d[c].to_numpy(float)
            if plain and name == "verification":  # no speculation: the target forward is plain decoding
                ax.bar(xs, v, bottom=bottom, color=PHASE_COLORS[name], label="target forward, no SD (plain decoding)",
                       width=0.75, hatch="///", edgecolor="white", lw=0)
            else:
                ax.bar(xs, v, bottom=bottom, color=PHASE_COLORS[name], label=name, width=0.75)
            bottom += v
        if paper_verify_range:
            lo, hi = paper_verify_range
            ax.axhline(lo, color="k", lw=0.8, ls="--")
            ax.axhline(hi, color="k", lw=0.8, ls="--")
        ax.set_ylim(0, 1.0)
        _title(ax, str(f), fontsize=8)
        ax.set_xlabel(x.replace("_", " ") + (" (requests)" if x == "batch_size" else ""), fontsize=8)
        ax.set_ylabel("share of step time", fontsize=8)
        ax.tick_params(axis="x", rotation=45, labelsize=7)
    _legend_below(fig, axes, ncol=3)
    sup = title or "Where a decode step's time goes"
    if paper_verify_range:
        sup += (f"\n(dashed lines: the paper's range of verification's share, {paper_verify_range[0]:.0%}-"
                f"{paper_verify_range[1]:.0%}, H100, vLLM 0.10)")
    fig.suptitle(sup, y=1.06, fontsize=10)
    return _finish(fig, source)


def verify_vs_floor(limits: pd.DataFrame, *, title: str = "", source: str | None = None, ncols: int = 3):
    """Measured verification (target forward) time vs batch size beside its HBM floor (``gpu_verify_limits``):
    a panel per model (``ncols`` a row); colour = method; solid line with hollow markers = measured, dotted =
    floor (weights + KV bytes ÷ HBM bandwidth)."""
    from matplotlib.lines import Line2D

    models = sorted(limits["model"].unique())
    fig, axes = _facets(len(models), ncols=ncols, w=3.0, h=2.4)
    marks = {"none": "^", "ngram": "o", "eagle": "s", "eagle3": "P", "draft_model": "D", "mtp": "X"}
    for ax, mdl in zip(axes, models):
        d = limits[limits["model"] == mdl]
        for i, (meth, g) in enumerate(d.groupby("method")):
            g = g.sort_values("batch_size")   # each later method a size smaller: coinciding markers nest, not hide
            ax.plot(g["batch_size"], g["t_verify_ms"], marker=marks.get(meth, "o"), mfc="none", ms=max(3.0, 8 - 1.6 * i),
                    mew=1.1, lw=max(0.9, 2.2 - 0.45 * i), alpha=0.9, color=color(meth), label=f"_{meth} measured",
                    zorder=2 + i)
            ax.plot(g["batch_size"], g["floor_ms"], ls=":", lw=1.2, color=color(meth), label=f"_{meth} HBM floor")
        _batch_axis(ax, d["batch_size"])
        ax.set_yscale("log")
        _plain_log(ax)
        ax.set_ylabel("target forward (ms, log)")
        _title(ax, f"{mdl} dims")
    methods = sorted(limits["method"].unique())
    extra = [(Line2D([], [], color=color(m), marker=marks.get(m, "o"), mfc="none", lw=1.2), m) for m in methods]
    extra += [(Line2D([], [], color="0.2", lw=1.2, marker="o", mfc="none"), "measured (median decode step)"),
              (Line2D([], [], color="0.2", lw=1.2, ls=":"), "HBM floor (bytes ÷ bandwidth)")]
    _legend_below(fig, axes, ncol=4, extra=extra)
    fig.suptitle(title or "Verification time per decode step vs its memory-bandwidth floor", fontsize=10)
    return _finish(fig, source)


def phases_by_run(runs: pd.DataFrame, *, title: str = "", source: str | None = None):
    """One engine's timed runs in the order they ran (``measured.live_rotated_runs``): a panel per batch size,
    x = the run's position, y = the median ms of each decode-step phase (colour), the marker the run's policy.
    What the host sets (drafting, the rest) and what the GPU sets (verification) can be told apart at a glance."""
    from matplotlib.lines import Line2D

    marks = dict(zip(dict.fromkeys(runs["config"]), ("o", "s", "^", "D", "v", "P")))
    phases = {"verification": PHASE_COLORS["verification"], "drafting": PHASE_COLORS["drafting"],
              "rest": PHASE_COLORS["overhead"]}
    sizes = sorted(runs["batch_size"].unique())
    fig, axes = _facets(len(sizes), ncols=2, w=3.6, h=2.5)
    for ax, b in zip(axes, sizes):
        d = runs[runs["batch_size"] == b]
        for ph, col in phases.items():
            ax.plot(d["order"], d[ph], color=col, lw=0.8, alpha=0.6, label=f"_{ph}")
            for cfg, g in d.groupby("config", sort=False):
                ax.scatter(g["order"], g[ph], color=col, marker=marks[cfg], s=9, lw=0, label=f"_{ph} {cfg}")
        ax.set_ylim(0, None)
        ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
        ax.set_xlabel("timed run, in the order run" + (" (8 chunks a repeat)" if b == 1 else ""), fontsize=8)
        ax.set_ylabel("median ms per decode step", fontsize=8)
        _title(ax, f"batch size {b}")
    extra = [(Line2D([], [], color=c, lw=1.5), {"rest": "the rest (host: scheduling, outputs)"}.get(p, p))
             for p, c in phases.items()]
    extra += [(Line2D([], [], color="0.3", marker=m, lw=0, ms=4), "eagle (EAGLE alone)" if c == "eagle" else c)
              for c, m in marks.items()]
    _legend_below(fig, axes, ncol=4, extra=extra)
    fig.suptitle(title or "One engine, its policies switched run by run: each phase's median step time", fontsize=10)
    return _finish(fig, source)


def drafting_vs_k(runs: pd.DataFrame, fits: pd.DataFrame, *, title: str = "", source: str | None = None):
    """EAGLE's drafting time per step vs k (``measured.drafting_sweep``): a panel per target, each timed run's
    median (points, colour = batch size), the fitted d0 + k * d1 at each batch size (lines) and k head forwards at
    the HBM floor (dashed grey): how far above the floor the drafter runs, and whether it has a fixed part."""
    from matplotlib.lines import Line2D

    models = sorted(runs["model"].unique())
    sizes = sorted(runs["batch_size"].unique())
    pal = dict(zip(sizes, sns.color_palette("viridis", len(sizes))))
    fig, axes = _facets(len(models), ncols=2, w=3.6, h=2.9)
    kk = np.linspace(0, runs["k"].max(), 50)
    for ax, m in zip(axes, models):
        d, f = runs[runs["model"] == m], fits[fits["model"] == m]
        for b, g in d.groupby("batch_size"):
            ax.scatter(g["k"], g["draft_ms"], s=12, color=pal[b], lw=0, alpha=0.85, label=f"_{b}")
            fb = f[f["batch_size"] == b].iloc[0]
            ax.plot(kk, fb["d0_ms"] + kk * fb["d1_ms"], color=pal[b], lw=1.0, label=f"_{b} fit")
        ax.plot(kk, kk * f["floor_ms"].iloc[0], ls="--", color="0.45", lw=1.0, label="_floor")
        ax.set_xticks(sorted(d["k"].unique()))
        ax.set_ylim(0, None)
        ax.set_xlabel("draft tokens per step, k", fontsize=8)
        ax.set_ylabel("drafting, median ms per decode step", fontsize=8)
        r2 = f["r2"].iloc[0]
        _title(ax, f"{m} dims · d0 = {f['d0_ms'].iloc[0]:.2f} ms, R² {r2:.2f}")
    extra = [(Line2D([], [], color=pal[b], marker="o", ms=4, lw=1.0), f"bs {b}") for b in sizes]
    extra += [(Line2D([], [], color="0.45", ls="--", lw=1.0), "k head forwards at the HBM floor")]
    _legend_below(fig, axes, ncol=len(extra), extra=extra)
    fig.suptitle(title or "EAGLE's drafting time grows by one head forward per drafted token\n(points: each timed "
                 "run's median; lines: the fit d0 + k·d1 at each batch size)", fontsize=10)
    return _finish(fig, source)


def verify_cost_curve(df: pd.DataFrame, *, x: str = "k", y: str = "ratio", hue: str | None = None,
                      title: str = "", source: str | None = None):
    """Cost of verifying k draft tokens: forward time of k+1 tokens ÷ time of 1 token, vs k."""
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    sns.lineplot(data=df, x=x, y=y, hue=hue, marker="o", ax=ax)
    kk = np.sort(df[x].unique())
    ax.plot(kk, kk + 1, ls=":", color="0.5", label="k+1 (cost ∝ tokens)")
    ax.axhline(1.0, ls="--", color="0.3", lw=0.8, label="1 (free verification)")
    ax.set_xlabel("draft tokens verified per step, k")
    ax.set_ylabel("forward time (k+1 tokens) ÷ time (1 token)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.set_title(title or "Verification cost vs draft length")
    return _finish(fig, source)


# ---- finding 3 --------------------------------------------------------------------------------------------


def acceptance_by_position(df: pd.DataFrame, *, k: int | None = 3, title: str = "", source: str | None = None,
                           min_requests: int | None = None):
    """Mean tokens per step by output position (``metrics.acceptance_by_output_position``), a panel per
    dataset, a line per proposer; a grey dotted line (right axis) counts the requests that reach each bin."""
    df = _panels(df)
    datasets = sorted(df["dataset"].unique())
    fig, axes = _facets(len(datasets), ncols=3, w=3.6, max_width=COLUMN_WIDTH_IN - 0.5)  # room for the right axes
    pal = palette_for(sorted(df["proposer"].unique()))
    for ax, ds in zip(axes, datasets):
        d = df[df["dataset"] == ds]
        sns.lineplot(data=d, x="position", y="tokens_per_step", hue="proposer", palette=pal, ax=ax,
                     drawstyle="steps-post")
        ax.set_ylim(1, (k + 1) if k else None)
        _title(ax, ds)
        ax.set_xlabel("output position (tokens)")
        ax.set_ylabel(f"mean tokens/step (k={k})" if k else "mean tokens/step (oracle)", fontsize=7.5)
        reach = d.groupby("position")["n_requests"].max()
        tw = ax.twinx()
        tw.plot(reach.index, reach.values, color="0.55", ls=":", lw=1, drawstyle="steps-post")
        tw.set_ylim(0, None)
        tw.tick_params(labelsize=7.5, colors="0.3", pad=1)
        tw.set_ylabel("requests reaching bin", fontsize=7.5, color="0.3", labelpad=2)
        tw.set_xlabel(ax.get_xlabel())  # the twin's x axis is hidden; labelled like its panel
        tw.grid(False)
    _legend_below(fig, axes)
    cut = f" (bins reached by < {min_requests} dropped)" if min_requests else ""
    fig.suptitle(title or f"Acceptance by output position: mean over the requests reaching each bin{cut};\n"
                 "grey dotted line, right axis: how many requests reach the bin", y=1.04, fontsize=9)
    return _finish(fig, source)


def draft_position_rate(df: pd.DataFrame, *, title: str = "", source: str | None = None):
    """The study's per-position acceptance rate (``metrics.acceptance_by_draft_position``)."""
    df = _panels(df)
    datasets = sorted(df["dataset"].unique())
    fig, axes = _facets(len(datasets), ncols=3, w=3.2, h=2.9)
    pal = palette_for(sorted(df["proposer"].unique()))
    for ax, ds in zip(axes, datasets):
        sns.lineplot(data=df[df["dataset"] == ds], x="draft_position", y="rate", hue="proposer", palette=pal,
                     marker="o", ax=ax)
        ax.set_ylim(0, 1)
        ax.set_xticks(sorted(df["draft_position"].unique()))
        _title(ax, ds)
        ax.set_xlabel("draft token index i")
        ax.set_ylabel("P(i-th draft token accepted)")
    _legend_below(fig, axes)
    fig.suptitle(title or "Per-position acceptance rate", y=1.03)
    return _finish(fig, source)


_KIND_HEAD = {"unconditional": ("study's definition (unconditional)", "P(i-th draft token accepted)"),
              "conditional": ("given the previous draft token accepted", "P(i-th accepted | (i-1)-th accepted)")}


def draft_position_vs_study(cmp: pd.DataFrame, *, title: str = "", source: str | None = None):
    """The package's per-draft-position acceptance beside the study's (``metrics.draft_position_vs_study``): a
    row per dataset pair, the study's unconditional rate on the left, the conditional one on the right; colour =
    proposer, line style = whose trace (the study's: dashed, squares; the package's: solid / dotted)."""
    from matplotlib.lines import Line2D

    k = cmp.attrs.get("k")
    pairs = list(dict.fromkeys(cmp.sort_values(["side", "pair"])["pair"]))  # the package's pairs first
    pairs = sorted(pairs, key=lambda p: ("↔" not in p, p))
    nrow = max(len(pairs), 1)
    fig, axs = plt.subplots(nrow, 2, figsize=(COLUMN_WIDTH_IN - 0.3, 2.35 * nrow + 0.4), squeeze=False, sharey=True)
    props = sorted(cmp["proposer"].unique())
    sides = list(dict.fromkeys(zip(cmp.sort_values("side")["side"], cmp.sort_values("side")["model"])))
    styles = {}
    pkg = [s for s in sides if s[0] == "package"]
    for i, s_ in enumerate(pkg):
        styles[s_] = {"ls": ["-", ":", "-."][i % 3], "marker": ["o", "^", "D"][i % 3], "lw": 1.6, "ms": 4.5}
    for s_ in sides:
        if s_[0] == "study":
            styles[s_] = {"ls": "--", "marker": "s", "lw": 1.3, "ms": 4.0, "mfc": "white"}
    for row, pair in enumerate(pairs):
        for col, kind in enumerate(("unconditional", "conditional")):
            ax = axs[row][col]
            d = cmp[(cmp["pair"] == pair) & (cmp["kind"] == kind)]
            for (side, mdl, prop), g in d.groupby(["side", "model", "proposer"], sort=True):
                g = g.sort_values("draft_position")
                ax.plot(g["draft_position"], g["value"], color=color(prop), **styles[(side, mdl)])
            ax.set_ylim(0, 1.02)
            if k:
                ax.set_xticks(range(1, int(k) + 1))
            head, ylab = _KIND_HEAD[kind]
            ax.set_title(f"$\\bf{{{head.replace(' ', '~')}}}$\n{pair}" if row == 0 else pair, fontsize=8.5)
            ax.set_ylabel(ylab if col == 0 else "", fontsize=7.5)
            ax.set_xlabel("draft token index i", fontsize=7.5)
        axs[row][1].set_ylabel(_KIND_HEAD["conditional"][1], fontsize=7.5)
        axs[row][1].tick_params(labelleft=True)
    extra = [(Line2D([], [], color=color(p), lw=2.2), p) for p in props]
    for s_ in sides:
        side, mdl = s_
        who = (f"study: {mdl.replace(' (published trace)', '')} (its published traces, vLLM, H100)"
               if side == "study" else f"package: {mdl} (this notebook's trace)")
        extra.append((Line2D([], [], color="0.25", **styles[s_]), who))
    _legend_below(fig, list(axs.flat), ncol=2, extra=extra)
    if any(side != "study" and "(published trace)" in str(mdl) for side, mdl in sides):
        _note(fig, "The notebook's trace IS the study's here: n-gram's two lines differ only in counting no-match "
              "steps as drafts.")
    for n in cmp.attrs.get("notes", []):
        _note(fig, n)
    _note(fig, "n-gram: steps where its lookup found no match are not drafts.")
    kk = f" at k={k}" if k else ""
    fig.suptitle(title or f"Per-draft-position acceptance{kk}:\nthis package's traces beside the study's "
                 "(Llama-3.1-8B-Instruct, H100)", y=1.01, fontsize=9.5)
    return _finish(fig, source)


def tokens_per_step_spread(per_request: pd.DataFrame, *, title: str = "", source: str | None = None,
                           paper: Mapping[str, tuple[float, float]] | None = None, k_label: str = "oracle",
                           paper_dataset: str | None = None,
                           paper_proposers: Sequence[str] = ("ngram", "eagle", "draft")):
    """Per-request tokens per step (``metrics.tokens_per_step_per_request``): box = 25-75th percentile,
    whiskers = 5th-95th, a panel per model (rows), datasets along x, a box per proposer. ``paper`` maps proposer
    -> (p5, p95): drawn as a black I-beam right of that proposer's box, only on ``paper_dataset`` (the paper's
    InstructCoder run or its analogue; nowhere when None) and only for the proposers the paper measured,
    ``paper_proposers`` (a stand-in such as early-exit never gets EAGLE's range)."""
    from matplotlib.lines import Line2D

    df = per_request.copy()
    if "model" not in df.columns:
        df["model"] = ""
    models = sorted(df["model"].astype(str).unique())
    props = sorted(df["proposer"].unique())
    datasets = sorted(df["dataset"].unique())
    fig, axs = plt.subplots(len(models), 1, figsize=(COLUMN_WIDTH_IN, 2.3 * len(models) + 0.3), squeeze=False)
    axes = list(axs.flat)
    drawn = False
    for ax, mdl in zip(axes, models):
        d = df[df["model"].astype(str) == mdl]
        sns.boxplot(data=d, x="dataset", y="tokens_per_step", hue="proposer", hue_order=props, order=datasets,
                    palette=palette_for(props), whis=(5, 95), fliersize=1.0, linewidth=0.7, saturation=1.0,
                    gap=0.3, legend=False, ax=ax)
        ax.set_yscale("log")
        ax.set_ylabel(f"tokens/step per request\n({k_label}, log)")
        ax.set_xlabel("dataset" if ax is axes[-1] else " ")
        ax.axhline(1, color="0.3", lw=0.8, ls=":")
        yt = [1, 1.5, 2, 3, 5, 8, 12, 17]
        ax.set_yticks(yt)
        ax.set_yticklabels([f"{v:g}" for v in yt])
        ax.yaxis.set_minor_formatter(plt.NullFormatter())
        _title(ax, mdl)
        for i, ds in enumerate(datasets if paper and paper_dataset else []):
            if not _is_paper_panel(ds, paper_dataset):
                continue
            present = [p for p in props if p in set(d.loc[d["dataset"] == ds, "proposer"])]
            for j, p in enumerate(props):
                if p in paper and p in present and p in set(paper_proposers or ()):
                    lo, hi = paper[p]
                    slot = 0.8 / len(props)               # the proposer's own slot: never over a neighbour's box
                    x0 = i - 0.4 + j * slot + 0.08 * slot
                    ax.add_patch(plt.Rectangle((x0, lo), 0.84 * slot, hi - lo, fill=False, ec="k", ls="--",
                                               lw=0.9, zorder=0.5))
                    ax.hlines([lo, hi], x0, x0 + 0.84 * slot, color="k", lw=1.6, zorder=0.6,
                              gid=f"paper|{p}|{ds}")
                    drawn = True
        if ax.get_legend():
            ax.get_legend().remove()
    extra = [(plt.Rectangle((0, 0), 1, 1, color=color(p)), p) for p in props]
    if drawn:
        extra.append((plt.Rectangle((0, 0), 1, 1, fill=False, ec="k", ls="--", lw=0.9),
                      f"paper 5th-95th (InstructCoder, 70B), on {paper_dataset}"))
    _legend_below(fig, axes, ncol=5, extra=extra)
    fig.suptitle(title or "Spread of tokens per step across requests (box 25-75%, whiskers 5-95%)", fontsize=10)
    return _finish(fig, source)


# ---- finding 3b: overlap --------------------------------------------------------------------------------


def overlap_vs_advantage(adv: pd.DataFrame, *, other: str, threshold: float | None = None,
                         paper_threshold: float | None = PAPER["bleu_threshold"], title: str = "",
                         source: str | None = None, min_requests: int = MIN_OVERLAP_REQUESTS,
                         paper_other: str = "eagle"):
    """Per request: prompt-output BLEU-4 vs n-gram's tokens-per-step ratio over the comparator (log scale), one
    panel per model and comparator (``adv["other"]``, from ``metrics.ngram_advantage_by_model``; else ``other``),
    colour = dataset. Each 0.1-wide BLEU bin is labelled with its request count (n=).

    Each panel's threshold ("n-gram wins above") is ``metrics.overlap_threshold`` over that panel's rows:
    only bins of at least ``min_requests`` (default 10) requests count, and at least that many must lie on each
    side; where there is none, the panel says so. ``threshold`` is ignored (kept for old callers: a pooled value
    belongs to no single comparator). The paper's threshold (``paper_threshold``, measured vs EAGLE) is drawn only
    in the ``paper_other`` panel."""
    adv = adv.copy()
    if "other" not in adv.columns:
        adv["other"] = other
    if "model" not in adv.columns:
        adv["model"] = ""
    panels = list(dict.fromkeys(zip(adv["model"].astype(str), adv["other"].astype(str))))
    fig, axes = _facets(len(panels), ncols=2, w=3.5 if len(panels) > 1 else 5.0, h=3.0)  # one panel: room for
    datasets = sorted(adv["dataset"].unique())                                              # its title and notes
    pal = dict(zip(datasets, sns.color_palette("tab10", len(datasets))))
    edges = np.round(np.arange(0, 1.01, 0.1), 2)
    for ax, (mdl, oth) in zip(axes, panels):
        d = adv[(adv["other"].astype(str) == oth) & (adv["model"].astype(str) == mdl)]
        for ds, g in d.groupby("dataset"):
            ax.scatter(g["bleu"], g["advantage"], s=9, alpha=0.6, color=pal[ds], lw=0, label=ds)
        ax.set_yscale("log")
        ax.axhline(1.0, color="0.2", lw=0.9)
        ax.set_xlim(-0.02, 1.02)
        lo_y, hi_y = d["advantage"].min(), d["advantage"].max()
        ax.set_ylim(lo_y / 1.15, hi_y * 1.6)
        _plain_log(ax)
        counts = np.histogram(d["bleu"].clip(0, 1), bins=edges)[0]
        for a, b, n in zip(edges[:-1], edges[1:], counts):
            if n:
                ax.text((a + b) / 2, 0.97, f"{n}", transform=ax.get_xaxis_transform(), ha="center", va="top",
                        fontsize=6, color="0.25")
        ax.text(0.0, 1.005, "n per 0.1 bin:", transform=ax.transAxes, ha="left", va="bottom", fontsize=6,
                color="0.25")
        if paper_threshold is not None and oth == paper_other:
            ax.axvline(paper_threshold, color="0.4", ls="--", lw=1, gid="paper-threshold",
                       label=f"paper: n-gram wins above {paper_threshold} (vs EAGLE)")
        thr, _ = overlap_threshold(d, min_requests=min_requests)
        if thr is not None:
            below, above = overlap_support(d, thr)
            ax.axvline(thr, color=color("ngram"), ls="-.", lw=1.2, gid="threshold",
                       label="this run: n-gram wins above (panel title)")
            found = f"this run: wins above {thr:.1f} ({below} below, {above} above)"
        else:
            found = "this run: no supported threshold"
        ax.set_xlabel("prompt-output overlap, BLEU-4 (0-1)")
        ax.set_ylabel(f"tokens/step n-gram ÷ {oth} (log)")
        ax.set_title(f"n-gram vs {oth}" + (f" ({mdl})" if mdl else "") + f"\n{found}", fontsize=8, pad=10)
    for ax in axes:
        for h in ax.collections:
            h.set_sizes([9])
    _legend_below(fig, axes, ncol=3)
    _note(fig, f"Threshold drawn only with at least {min_requests} requests each side; top: requests per 0.1 bin.")
    sup = title or "n-gram's advantage vs prompt-output overlap, per comparator"
    if len(panels) == 1 and not title:    # one comparator: no "per comparator"
        sup = "n-gram's advantage vs prompt-output overlap"
    fig.suptitle(sup, fontsize=10)
    return _finish(fig, source)


# ---- findings 4 and 5 -------------------------------------------------------------------------------------


_PAPER_LS = [(0, (1, 2)), (0, (4, 2, 1, 2)), (0, (6, 3))]


def oracle_gap(gap: pd.DataFrame, *, title: str = "", source: str | None = None,
               paper_refs: Mapping[str, float] | None = None, paper_dataset: str | None = None):
    """Best fixed k vs oracle speedup by batch size (``metrics.oracle_gap``): a panel per dataset, solid =
    oracle, dashed = best fixed k, colour = proposer."""
    gap = _panels(gap)
    datasets = sorted(gap["dataset"].unique())
    fig, axes = _facets(len(datasets), ncols=3, w=3.6, max_width=COLUMN_WIDTH_IN - 0.15)  # room for the label boxes
    for ax, ds in zip(axes, datasets):
        d = gap[gap["dataset"] == ds]
        for p, g in d.groupby("proposers"):
            g = g.sort_values("batch_size")
            ax.plot(g["batch_size"], g["oracle_speedup"], marker="o", color=color(p), label=f"{p} oracle")
            ax.plot(g["batch_size"], g["best_fixed_speedup"], marker="s", ls="--", color=color(p),
                    label=f"{p} best fixed k")
        ax.axhline(1.0, color="0.2", lw=1, ls=":")
        if _is_paper_panel(ds, paper_dataset):
            for (lab, v), pls in zip((paper_refs or {}).items(), _PAPER_LS):
                ax.axhline(v, color="0.35", lw=0.9, ls=pls, zorder=1, label=lab)
        _batch_axis(ax, gap["batch_size"])
        _title(ax, ds + (" · (paper's lines: InstructCoder)" if paper_refs and paper_dataset
                         and _is_paper_panel(ds, paper_dataset) else ""))
        ax.set_ylabel("speedup over no SD (×)")
    _legend_below(fig, axes, ncol=4, order=[f"{p} {w}" for p in sorted(gap["proposers"].unique())
                                            for w in ("oracle", "best fixed k")])   # the paper's lines last
    fig.suptitle(title or "Oracle proposal length vs best fixed k", y=1.03)
    return _finish(fig, source)


def _config_label(cfg: str, d: pd.DataFrame) -> str:
    """A bar's legend label: the proposers it combines and how drafting is charged, not the accounting alone."""
    if cfg.endswith(" oracle"):
        return f"{cfg.removesuffix(' oracle')}: its own oracle"
    names = d["proposers"].dropna()
    who = str(names.iloc[0]) if len(names) else "combined"
    dc = cfg.split(", ")[1]
    how = {"ngram-only": "n-gram's drafting cost only", "winner": "the winner's drafting cost",
           "all": "every proposer's drafting cost"}.get(dc, dc)
    return f"Oracle Combine ({who}), {how}"


def hybrid_oracle(sim: pd.DataFrame, *, batch_size: int = 1, title: str = "", source: str | None = None,
                  paper_refs: Mapping[str, float] | None = None, paper_dataset: str | None = None,
                  paper_proposers: Sequence[str] = ("ngram", "eagle"), ncols: int = 1):
    """Oracle Combine (each drafting-cost accounting) vs each proposer's own oracle at one batch size: grouped
    bars per dataset, one panel per model (``ncols`` panels a row). Rows of ``simulate`` with policies
    ``oracle`` and ``oracle-combine``.

    ``paper_refs`` maps a bar's label ("ngram oracle", "combine, winner", ...) to the paper's value, drawn as a
    black tick across that one bar, and only (a) on ``paper_dataset`` (the paper's InstructCoder run or its
    analogue; every dataset when None) and (b) on bars of the proposers the paper measured,
    ``paper_proposers`` (a "draft oracle" or "early-exit oracle" bar never gets the paper's EAGLE value;
    an Oracle Combine bar only when every proposer it combines is one of them)."""
    o = sim[(sim["batch_size"] == batch_size) & sim["policy"].isin(["oracle", "oracle-combine"])].copy()
    o["config"] = np.where(o["policy"] == "oracle", o["proposers"] + " oracle",
                           "combine, " + o["draft_cost"].astype(str))
    if "model" not in o.columns:
        o["model"] = ""
    singles = sorted(o.loc[o["policy"] == "oracle", "config"].unique())
    combos = [f"combine, {a}" for a in ("ngram-only", "winner", "all") if f"combine, {a}" in set(o["config"])]
    order = singles + combos
    models = sorted(o["model"].astype(str).unique())
    datasets = sorted(o["dataset"].unique())
    ncols = max(1, min(ncols, len(models)))
    nrows = int(np.ceil(len(models) / ncols))
    fig, axs = plt.subplots(nrows, ncols, figsize=(COLUMN_WIDTH_IN, 2.5 * nrows + 0.3), squeeze=False)
    for ax in axs.flat[len(models):]:
        ax.set_visible(False)
    axes = list(axs.flat[: len(models)])
    width = 0.84 / max(1, len(order))
    paper_set = set(paper_proposers or ())
    handles, ticks, readable = {}, 0, {}
    ymax = float(np.nanmax(list(o["speedup"]) + list((paper_refs or {}).values()) + [1.0]))
    for ax, mdl in zip(axes, models):
        om = o[o["model"].astype(str) == mdl]
        tick_at = {}
        for i, ds in enumerate(datasets):
            if paper_dataset is not None and not _is_paper_panel(ds, paper_dataset):
                continue
            cell = om[om["dataset"] == ds]
            for lab, v in (paper_refs or {}).items():
                if lab not in order or lab not in set(cell["config"]):
                    continue
                if lab.endswith(" oracle"):
                    ok = lab.removesuffix(" oracle") in paper_set
                else:
                    combined = set("+".join(cell.loc[cell["config"] == lab, "proposers"].astype(str)).split("+"))
                    ok = combined <= paper_set
                if not ok:
                    continue
                tick_at[(ds, lab)] = v
        for j, cfg in enumerate(order):
            d = om[om["config"] == cfg].set_index("dataset").reindex(datasets)
            if cfg.endswith(" oracle"):
                c, hatch = color(cfg.removesuffix(" oracle")), ""
            else:
                names = d["proposers"].dropna()
                c = color(names.iloc[0]) if len(names) else color("ngram+eagle")
                hatch = ACCOUNTING_HATCH.get(cfg.split(", ")[1], "")
            xs = np.arange(len(datasets)) + (j - (len(order) - 1) / 2) * width
            bars = ax.bar(xs, d["speedup"], width=width * 0.92, color=c, hatch=hatch, edgecolor="white", lw=0.3,
                          label=cfg)
            readable.setdefault(cfg, _config_label(cfg, d))
            handles.setdefault(cfg, bars)
            for ds, b, v in zip(datasets, bars, d["speedup"]):
                t = tick_at.get((ds, cfg))
                if t is not None:
                    ax.hlines(t, b.get_x() - width * 0.04, b.get_x() + width * 0.96, color="k", lw=2.0, zorder=5,
                              label=f"_paper {cfg} {ds}", gid=f"paper|{cfg}|{ds}")
                    ticks += 1
                    handles.setdefault("paper", ax.collections[-1])
                if np.isfinite(v):
                    ax.text(b.get_x() + b.get_width() / 2, max(v, t or 0) + 0.03 * ymax, f"{v:.2f}", ha="center",
                            va="bottom", fontsize=6.5, rotation=90)
        ax.axhline(1.0, color="0.2", lw=0.8, ls=":")
        ax.set_xticks(np.arange(len(datasets)))
        ax.set_xticklabels(datasets)
        ax.set_xlim(-0.5, len(datasets) - 0.5)
        ax.set_ylim(0, ymax * 1.28)
        ax.set_xlabel("dataset" if ax in axes[-ncols:] else "")
        ax.set_ylabel(f"oracle speedup,\nbatch {batch_size} (×)")
        ax.set_title(mdl or "", fontsize=9)
        ax.grid(axis="x", visible=False)
    for ax in axes:
        if not ax.get_xlabel():
            ax.set_xlabel(" ")
    pairs = [(handles[c], readable[c]) for c in order]
    if "paper" in handles:
        pairs.append((handles["paper"], "paper (InstructCoder, Llama-3.1-8B, H100)"))
    fig._spec_legend = fig.legend([h for h, _ in pairs], [lab for _, lab in pairs], loc="upper center",
                                  bbox_to_anchor=(0.5, 0.0), ncol=2, frameon=False, fontsize=7.5)
    if paper_refs:
        shown = sorted(paper_set)
        _note(fig, "Black ticks: the paper's values, only on "
              + (f"{paper_dataset}" if paper_dataset else "every dataset")
              + f" and for {', '.join(shown)} (and their Oracle Combine)." + ("" if ticks else " None matched."))
    fig.suptitle(title or f"Oracle Combine vs single-proposer oracles (batch {batch_size})", fontsize=10)
    return _finish(fig, source)


# ---- beyond the study: adaptive selectors -------------------------------------------------------------------

def adaptive_vs_batch(table: pd.DataFrame, *, title: str = "", source: str | None = None):
    """``grids.adaptive_table`` rows: one panel per dataset (and model) for the study's pair (n-gram + the EAGLE-
    class proposer; the first set of each model where several were run), speedup by batch size of the four things
    a reader compares: the rule a user would run (best ``ngram-else-eagle`` pair), the best causal policy, the
    best fixed k (any proposer, any k) and Oracle Combine (``winner``, the bound for a policy paying what it ran)."""
    first = table.groupby("model")["set"].transform(lambda s: sorted(s.unique(), key=lambda x: not x.endswith(
        ("eagle", "eagle3")))[0])
    t = _panels(table[table["set"] == first])
    panels = sorted(t["dataset"].unique())
    ncols = min(5, max(len(panels), 1))
    fig, axes = _facets(len(panels), ncols=ncols, w=2.3)
    # (column, label, colour, style, marker, width, alpha): the best causal policy wide and pale underneath, the
    # rule thin on top, so that where the two coincide both stay visible
    lines = (("combine_winner", "Oracle Combine (winner)", "0.55", "--", None, 1.6, 1.0),
             ("best_causal", "best causal policy", _CB[4], "-", "o", 4.0, 0.45),
             ("best_fixed", "best fixed k (any k)", "0.15", ":", "^", 1.6, 1.0),
             ("rule", "rule: ngram-else-eagle (best k pair)", _CB[1], "-", "s", 1.1, 1.0))
    for ax, ds in zip(axes, panels):
        d = t[t["dataset"] == ds].sort_values("batch_size")
        for col, label, c, ls, mk, lw, alpha in lines:
            ax.plot(d["batch_size"], d[col], color=c, ls=ls, marker=mk, ms=5.5 if lw > 2 else 3, lw=lw,
                    alpha=alpha, label=label)
        ax.axhline(1.0, color="0.2", lw=0.8, ls=":")
        _batch_axis(ax, d["batch_size"], min_octaves=2.9)     # narrow panels: labels vertical when crowded
        _title(ax, ds, fontsize=8)
    for i, ax in enumerate(axes[:len(panels)]):   # axis labels once per row / column: the panels are narrow
        ax.set_ylabel("speedup (×)" if i % ncols == 0 else "")
        ax.set_xlabel("batch size" if i >= len(panels) - ncols else "")
    _legend_below(fig, axes, order=[lab for _, lab, *_ in lines])
    fig.suptitle(title or "Causal selectors vs the rule a user would run, fixed k and the oracle", y=1.02)
    return _finish(fig, source)
