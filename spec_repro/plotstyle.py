"""The figures' common look: one colour per proposer (``PALETTE``), phase colours, the widest a figure is drawn
(``COLUMN_WIDTH_IN``), ``save`` (PNG at dpi 120 + PDF), and the layout helpers every figure of
:mod:`spec_repro.plots` shares (facets, legends below, notes, source captions, batch and log axes)."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

__all__ = ["PALETTE", "PHASE_COLORS", "ACCOUNTING_HATCH", "COLUMN_WIDTH_IN", "color", "palette_for", "save"]

_CB = sns.color_palette("colorblind", 10)
# One colour per proposer, everywhere. Combined proposers get their own colours.
PALETTE: dict[str, tuple] = {
    "none": (0.45, 0.45, 0.45),
    "ngram": _CB[0],
    "eagle": _CB[1],
    "eagle3": _CB[9],
    "early-exit": _CB[4],
    "draft": _CB[2],
    "draft_model": _CB[2],
    "mtp": _CB[6],
    "ngram+eagle": _CB[5],
    "ngram+early-exit": _CB[5],
    "ngram+draft": _CB[8],
}
_EXTRA = sns.color_palette("dark", 10)
PHASE_COLORS = {"drafting": _CB[1], "verification": _CB[0], "rejection sampling": _CB[4], "overhead": _CB[7]}
ACCOUNTING_HATCH = {"ngram-only": "", "winner": "//", "all": "xx"}

# "paper" context: 8-10 pt text, meant for figures drawn at most COLUMN_WIDTH_IN wide (no shrinking)
sns.set_theme(style="whitegrid", context="paper", font_scale=1.0)


def color(name: str):
    """The fixed colour of a proposer (or proposer combination); unknown names get a stable extra colour."""
    if name in PALETTE:
        return PALETTE[name]
    return _EXTRA[sum(map(ord, name)) % len(_EXTRA)]


def palette_for(names: Sequence[str]) -> dict:
    return {n: color(n) for n in names}


def save(fig, name: str, out_dir: str | Path | None = None, dpi: int = 120) -> list[Path]:
    """Write ``<out_dir>/<name>.png`` and ``.pdf`` (out_dir defaults to the repo's ``figures/``)."""
    if out_dir is None:
        from .locations import figures_dir

        out_dir = figures_dir()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from .io import atomic_path

    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    with atomic_path(paths[0]) as tmp:                  # a failure never leaves a cut figure
        fig.savefig(tmp, dpi=dpi, bbox_inches="tight", format="png")
    # Fixed metadata so an unchanged figure is byte-stable across runs.
    with atomic_path(paths[1]) as tmp:
        fig.savefig(tmp, bbox_inches="tight", format="pdf", metadata={"CreationDate": None, "ModDate": None})
    return paths


COLUMN_WIDTH_IN = 7.0   # the widest a figure is drawn (inches): a paper's text width; panels wrap below it


def _note(fig, text: str):
    """A visible note printed under the figure (above the source): what was left out, and why."""
    fig._spec_notes = getattr(fig, "_spec_notes", []) + [text]


MAX_NOTES = 1   # caveats printed under a figure (besides its source line)


def _one_line(text: str, width: int) -> str:
    """``text`` on one line of at most ``width`` characters: whole ``; ``-separated clauses while they fit, else
    the first clause cut at a word, ending in an ellipsis."""
    import textwrap

    text = " ".join(text.split())
    if len(text) <= width:
        return text
    parts, out = text.split("; "), ""
    for part in parts:
        cand = f"{out}; {part}" if out else part
        if len(cand) + 2 > width:
            break
        out = cand
    return (out + " …") if out else textwrap.shorten(text, width, placeholder=" …")


def _compact_counts(text: str) -> str:
    """Request counts per dataset ("code-edit 300, gsm-symbolic 300, humaneval 164 requests") as their total
    ("764 requests, 3 datasets"): the per-dataset counts are in the notebook's printed provenance."""
    import re

    def total(m):
        ns = [int(n) for n in re.findall(r" (\d+)(?=,| requests)", m.group(0))]
        return f"{sum(ns)} requests, {len(ns)} datasets"

    return re.sub(r"[\w.-]+ \d+(?:, [\w.-]+ \d+)+ requests", total, text)


def _finish(fig, source: str | None):
    """Every figure's last step: the layout, then under it the shared legend (if any), one caveat (the first note)
    and the data's source, each on one line, stacked so that nothing overlaps."""

    fig.tight_layout()
    renderer = fig.canvas.get_renderer()
    y = min([ax.get_tightbbox(renderer).transformed(fig.transFigure.inverted()).y0
             for ax in fig.axes if ax.get_visible()] + [0.0])
    leg = getattr(fig, "_spec_legend", None)
    if leg is not None:
        # no wider than the figure: fewer legend columns until it fits (a figure stays COLUMN_WIDTH_IN wide)
        while leg.get_window_extent(renderer).width > 0.95 * fig.bbox.width and leg._ncols > 1:
            handles, labels = leg.legend_handles, [t.get_text() for t in leg.texts]
            new = fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=leg._ncols - 1,
                             frameon=False, fontsize=leg.texts[0].get_fontsize(), handlelength=leg.handlelength,
                             columnspacing=leg.columnspacing)
            leg.remove()
            fig._spec_legend = leg = new
        leg.set_bbox_to_anchor((0.5, y - 0.005), transform=fig.transFigure)
        y = leg.get_window_extent(renderer).transformed(fig.transFigure.inverted()).y0
    # At most two short grey lines under a figure: the data's source and one caveat (the first note), each cut
    # to one line; the detail belongs in the notebook's text.
    def width(size):   # characters on one line of the figure at ``size`` pt (DejaVu Sans: ~0.55 em a character)
        return max(40, int(0.97 * fig.get_figwidth() * 72 / (0.56 * size)))

    notes = getattr(fig, "_spec_notes", [])[:MAX_NOTES]
    lines = [(_one_line(n, width(7.0)), 7.0, "0.15") for n in notes]
    if source:
        lines.append((_one_line("Source: " + _compact_counts("; ".join(source.splitlines())), width(6.5)), 6.5,
                      "0.35"))
    for text, size, col in lines:
        t = fig.text(0.01, y - 0.01, text, ha="left", va="top", fontsize=size, color=col)
        y = t.get_window_extent(renderer).transformed(fig.transFigure.inverted()).y0
    return fig


def _panels(df: pd.DataFrame | None) -> pd.DataFrame | None:
    """With several models in one table, label each dataset panel with its model too ("code-edit · qwen...")."""
    if df is None or "model" not in df.columns or df["model"].nunique() <= 1:
        return df
    ds, mdl = df["dataset"].astype(str), df["model"].astype(str)
    already = [d.startswith(m) for d, m in zip(ds, mdl)]   # e.g. "llama31-8b dims, random prompt"
    return df.assign(dataset=np.where(already, ds, ds + " · " + mdl))


def _title(ax, panel: str, fontsize: float = 8.5):
    """A panel's title: dataset and model on two lines (narrow panels)."""
    ax.set_title(str(panel).replace(" · ", "\n"), fontsize=fontsize)


def _is_paper_panel(panel: str, paper_dataset: str | None) -> bool:
    return paper_dataset is None or panel == paper_dataset or panel.startswith(f"{paper_dataset} · ")


def _batch_axis(ax, values, min_octaves: float = 1.9):
    """Log2 batch-size axis with every batch size in ``values`` as a labelled tick (a point never sits on an
    unlabelled tick); where two neighbours are closer than ``min_octaves`` (narrow panels need more), the labels
    turn vertical and a little smaller instead of being dropped."""
    from matplotlib.ticker import FixedLocator, NullFormatter

    vals = sorted({int(v) for v in values})
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(vals))
    crowded = any(np.log2(b) - np.log2(a) < min_octaves for a, b in zip(vals, vals[1:]))
    ax.set_xticklabels([str(v) for v in vals], rotation=90 if crowded else 0, fontsize=7 if crowded else None)
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("batch size (requests)")


def _plain_log(ax, axis: str = "y"):
    """Log scale with plain tick labels (1.5, 2, 3 ...) instead of 10^x."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    from matplotlib.ticker import FixedLocator

    fmt = FuncFormatter(lambda v, _: f"{v:g}")
    a = ax.yaxis if axis == "y" else ax.xaxis
    lo, hi = (ax.get_ylim() if axis == "y" else ax.get_xlim())
    dense = [0.1, 0.2, 0.3, 0.5, 0.7, 1, 1.2, 1.5, 2, 3, 5, 7, 10, 15, 20, 30, 50, 100, 200, 300, 500]
    sparse = [0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500]
    a.set_major_locator(FixedLocator(sparse if lo > 0 and hi / lo > 12 else dense))
    a.set_major_formatter(fmt)
    a.set_minor_formatter(NullFormatter())


def _facets(n: int, ncols: int = 3, w: float = 4.0, h: float = 3.2, max_width: float | None = None):
    """``n`` panels in ``ncols`` columns; the panel width shrinks (height with it, to at least 1.9 in) so that
    the figure is at most ``max_width`` (default ``COLUMN_WIDTH_IN``) wide."""
    ncols = max(1, min(ncols, n))
    nrows = int(np.ceil(n / ncols))
    w_eff = min(w, (max_width or COLUMN_WIDTH_IN) / ncols)
    h_eff = max(1.9, h * w_eff / w)
    fig, axes = plt.subplots(nrows, ncols, figsize=(w_eff * ncols, h_eff * nrows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def _legend_below(fig, axes, ncol: int = 4, order: Sequence[str] | None = None, extra=()):
    """One legend for all panels, centred under the figure (``_finish`` places it under the lowest axis);
    ``order`` puts those labels first, in that order; ``extra`` appends (handle, label) pairs."""
    handles, labels = {}, []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in handles and not lab.startswith("_"):
                handles[lab] = h
                labels.append(lab)
        if ax.get_legend():
            ax.get_legend().remove()
    if order:
        labels = [lab for lab in order if lab in handles] + [lab for lab in labels if lab not in order]
    pairs = [(handles[lab], lab) for lab in labels] + list(extra)
    if pairs:
        fig._spec_legend = fig.legend([h for h, _ in pairs], [lab for _, lab in pairs], loc="upper center",
                                      bbox_to_anchor=(0.5, 0.0), ncol=min(ncol, len(pairs)), frameon=False,
                                      fontsize=8, handlelength=2.6, columnspacing=1.2)
