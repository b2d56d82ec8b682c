"""Findings: the paper's numbers (``PAPER``, the only place they live) and this run's summary rows beside them,
one ``finding*_rows`` per finding, plus the summary table's reader, writer and markdown. Each row function takes
the tidy tables ``metrics`` / ``measured`` / the simulator return and formats them; none computes a metric."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from .metrics import MIN_OVERLAP_REQUESTS

__all__ = [
    "PAPER", "paper_refs", "SummaryRow", "FindingsTable", "write_summary", "read_summaries", "summary_markdown", "headline_markdown",
    "FINDING_TITLES", "focus_dataset",
    "finding1_rows", "finding2_rows", "finding3_rows", "finding3b_rows", "finding4_rows", "finding5_rows",
    "agreement_rows", "adaptive_rows",
]

#: The paper's numbers (Liu et al., arXiv:2601.11580): summary rows, figures and notebooks read them here.
PAPER = {
    # finding 1: speedup shrinks with batch size
    "eagle_70b_bs1": 1.96,                 # EAGLE on Llama-3-70B, batch 1
    "gsm8k_8b_bs128": 1.21,                # Llama-3.1-8B on GSM8K, batch 128
    # finding 2: verification dominates a step
    "verify_share": (0.42, 0.95),          # share of execution time, all methods (95%: n-gram, 70B, bs 512)
    "reject_share_max": 0.017,             # rejection sampling stays below this share
    # finding 3: acceptance varies (tokens per step, 5th-95th percentile across requests, InstructCoder, 70B);
    # early-exit is this package's stand-in in EAGLE's role
    "tokens_per_step_p5_p95": {"eagle": (2.7, 7.4), "early-exit": (2.7, 7.4), "ngram": (1.1, 15.0),
                               "draft": (5.6, 18.3)},
    "bleu_threshold": 0.6,                 # prompt-output BLEU-4 above which n-gram beats EAGLE
    # finding 4: oracle bound (InstructCoder, n-gram, Llama-3.1-8B, H100 cost model), batch 1
    "ngram_oracle": 2.75,
    "ngram_best_fixed": 2.1,
    "eagle_oracle": 2.7,
    # finding 5: Oracle Combine (n-gram + EAGLE) on InstructCoder, batch 1, per drafting-cost accounting
    "combine": {"ngram-only": 4.9, "winner": 4.3, "all": 3.85},
}


def _in_range(lo: float, hi: float, what: str) -> str:
    """Verdict of a measured share range [lo, hi] against the paper's verification range."""
    plo, phi = PAPER["verify_share"]
    if hi < plo:
        return f"departs: below the paper's range ({what})"
    return "agrees" if lo <= phi else f"departs: above the paper's range ({what})"


def _verify_range() -> str:
    lo, hi = PAPER["verify_share"]
    return f"{lo:.0%}-{hi:.0%}"


def _combine_text(draft_cost: str) -> str:
    """The paper's Oracle Combine value as it reports it: 4.9x measured, the other two read off its figure."""
    v = PAPER["combine"].get(draft_cost)
    return "n/a" if v is None else (f"{v}x" if draft_cost == "ngram-only" else f"≈{v}x")


def paper_refs(kind: str, proposers=()) -> dict[str, float]:
    """The paper's reference lines for a figure: ``"oracle_gap"`` (notebook 05) or ``"hybrid"`` (notebook 06,
    the EAGLE-oracle line for an EAGLE proposer in ``proposers``)."""
    if kind == "oracle_gap":
        return {f"paper oracle {PAPER['ngram_oracle']}x": PAPER["ngram_oracle"],
                f"paper fixed {PAPER['ngram_best_fixed']}x": PAPER["ngram_best_fixed"]}
    if kind == "hybrid":  # the paper measured n-gram and EAGLE: no reference for any other proposer's bar
        return {**{f"combine, {dc}": v for dc, v in PAPER["combine"].items()}, "ngram oracle": PAPER["ngram_oracle"],
                **{f"{p} oracle": PAPER["eagle_oracle"] for p in proposers if p in ("eagle", "eagle3")}}
    raise ValueError(f"unknown kind {kind!r}; use 'oracle_gap' or 'hybrid'")


@dataclass
class SummaryRow:
    """One line of the reproduction summary: what the paper reported next to what this run measured."""

    finding: str        # e.g. "4 oracle bound"
    quantity: str       # what is compared, e.g. "n-gram oracle speedup, bs 1"
    paper: str          # the paper's value, as published (from PAPER)
    this_run: str       # this run's value, formatted
    source: str         # engine/model/hardware/measured or simulated/cost model
    value: float | None = None  # this run's value as a number, when there is one
    verdict: str = ""   # "agrees", "departs: <why>", or why there is nothing to compare ("not in the paper")
    headline: bool = False  # one of the few rows the README's results table shows
    short: str = ""     # the quantity as the README's results table words it (default: ``quantity``)


class FindingsTable(pd.DataFrame):
    """A findings table that displays whole: no cell cut to "..." (pandas' default ``max_colwidth`` is 50), no row
    or column elided, as HTML (JupyterLab, the repo page) and as text. Otherwise a plain DataFrame."""

    _WHOLE = ("display.max_colwidth", None, "display.max_rows", None, "display.max_columns", None,
              "display.expand_frame_repr", False)

    @property
    def _constructor(self):
        return FindingsTable

    def _repr_html_(self):
        with pd.option_context(*self._WHOLE):
            return super()._repr_html_()

    def __repr__(self):
        with pd.option_context(*self._WHOLE):
            return super().__repr__()


def write_summary(rows: Iterable[SummaryRow | dict], path: str | Path | None) -> pd.DataFrame:
    """Write a notebook's summary rows as JSON (a list of objects) and return them as a DataFrame.

    ``path=None`` only returns the table (notebooks run by nbval write nothing)."""
    recs = [asdict(r) if isinstance(r, SummaryRow) else dict(r) for r in rows]
    for r in recs:
        SummaryRow(**r)  # validates the keys
        if isinstance(r.get("value"), (np.floating, np.integer)):
            r["value"] = float(r["value"])
    if path is not None:
        from .io import atomic_write

        with atomic_write(Path(path)) as f:
            f.write(json.dumps(recs, indent=1) + "\n")
    return FindingsTable(recs, columns=list(SummaryRow.__dataclass_fields__))


def read_summaries(paths: Iterable[str | Path]) -> pd.DataFrame:
    recs = []
    for p in paths:
        recs += [asdict(SummaryRow(**r)) for r in json.loads(Path(p).read_text())]  # older rows get the defaults
    return pd.DataFrame(recs, columns=list(SummaryRow.__dataclass_fields__))


#: Section titles of the summary, by the leading key of ``SummaryRow.finding``.
FINDING_TITLES = {
    "1": "Finding 1: speculative decoding's speedup shrinks as the batch grows (paper: EAGLE 1.96x on "
         "Llama-3-70B at bs 1; Llama-3.1-8B GSM8K 1.21x at bs 128)",
    "2": "Finding 2: verification dominates a step (paper: 42%-95% of execution time, all methods)",
    "3": "Finding 3: acceptance varies by position, request and dataset; n-gram tracks prompt-output overlap "
         "(paper: InstructCoder, Llama-3-70B; n-gram beats EAGLE above BLEU-4 ≈0.6)",
    "4": "Finding 4: an oracle proposal length beats every fixed k (paper: InstructCoder, n-gram, Llama-3.1-8B, "
         "H100 cost model, bs 1)",
    "5": "Finding 5: the hybrid oracle, the best proposer per position (paper: InstructCoder, bs 1, by drafting-cost "
         "accounting ngram-only / winner / all)",
    "6b": "Beyond the study: a causal proposer-and-length selector",
}

MAX_LINE = 300  # characters per line of the summary (a reader scans it; a test holds it)
README_LINE = 140  # characters per row of the README's results table
README_ROWS = 12   # rows of the README's results table at most (the full table: figures/SUMMARY.md)

#: How each verdict is reached, stated once (the summary's header and the README show it).
VERDICT_RULES = (
    "Verdicts follow one rule per finding. 1: agrees when the best proposer's speedup is lower at the largest "
    "batch than at the smallest. 2: agrees when the measured range overlaps the paper's 42%-95%. 3: a spread is "
    "wide when the 95th percentile is at least twice the 5th (the paper's: 2.7x, 13.6x, 3.3x), and agrees when "
    "wide; the overlap threshold agrees within 0.2 of 0.6 with at least 10 requests on each side. 4: agrees when "
    "the oracle beats the best fixed k. 5: agrees when Oracle Combine beats the best single-proposer oracle. A "
    "speedup below 1x is called slower than no SD. Runs on dummy weights are not comparable: their acceptance is "
    "set by the random weights, not by the method. Rows marked \"not ...\" or \"beyond the study\" compare "
    "nothing and show no paper value.")
#: Terms the rows use, defined once.
TERMS = (
    "Terms: tokens/step = tokens one speculative step produces (accepted + 1), per request; best fixed k = the "
    "fastest fixed k over k = 1-7 (\"any\": over every k the trace allows); gap closed = (policy - best fixed k) "
    "÷ (Oracle Combine - best fixed k), with the best fixed k at any k and the oracle paying the same drafting "
    "costs as the policy (winner: only the drafter it verifies); worst = the policy's speedup ÷ the rule's "
    "(ngram-else-eagle), at its worst batch size.")
#: Source keys: A.. = the study's published traces (figures/published), B.. = this package's data (figures/).
KEY_PREFIXES = {"published": "A", "package": "B"}


def _cell(v) -> str:
    return "" if v is None or (isinstance(v, float) and np.isnan(v)) else str(v).replace("|", "/").replace("\n", " ")


def _compares(r) -> bool:
    """Whether a row compares with the paper (rows that do not show no paper value)."""
    v = _cell(r.get("verdict"))
    return not (v.startswith(("not ", "beyond")) or v == "")


def _paper_cell(r) -> str:
    p = _cell(r.get("paper"))
    return p if _compares(r) and p and not p.startswith("n/a") else "—"


def _source_keys(sources: Iterable, prefix: str = "S") -> dict[str, str]:
    """Each distinct source, in order of first appearance -> a short key (S1, S2, ...)."""
    return {src: f"{prefix}{i}" for i, src in enumerate(dict.fromkeys(map(_cell, sources)), 1)}


def summary_markdown(df: pd.DataFrame, prefix: str = "B") -> str:
    """The summary a reader scans: the verdict rules and terms, one section per finding, columns quantity | paper
    | this run | verdict | source key (``prefix``1, 2, ...: the README's keys for the same table), the sources
    listed once at the end. Every line is at most ``MAX_LINE`` characters (longer text wraps)."""
    keys = _source_keys(df["source"], prefix)
    cols = ["quantity", "paper", "this_run", "verdict"]
    out = digest_lines(df) + _wrap(VERDICT_RULES, MAX_LINE) + [""] + _wrap(TERMS, MAX_LINE) + [""]
    for fid, g in df.groupby(df["finding"].astype(str).str.split(" ").str[0], sort=False):
        out.append(f"## {FINDING_TITLES.get(fid, g['finding'].iloc[0])}\n")
        out.append("| " + " | ".join(c.replace("_", " ") for c in cols) + " | source |")
        out.append("|" + "|".join("---" for _ in range(len(cols) + 1)) + "|")
        for _, r in g.iterrows():
            cells = [_paper_cell(r) if c == "paper" else _cell(r.get(c)) for c in cols]
            out.append("| " + " | ".join(cells) + f" | {keys[_cell(r['source'])]} |")
        out.append("")
    out.append("## Sources\n")
    for src, k in keys.items():
        out += _wrap(f"- **{k}**: {src}", MAX_LINE)
    return "\n".join(out) + "\n"


DIGEST_ROWS = 12   # the digest's bullets at most: with its title, a blank line and the "more" line, 15 lines


def digest_lines(df: pd.DataFrame) -> list[str]:
    """The summary's opening digest: one line per headline row (finding, quantity, this run against the paper,
    the verdict without its detail), in the table's order, at most ``DIGEST_ROWS`` of them; none without headline
    rows."""
    if "headline" not in df.columns:
        return []
    h = _headline_rows(df)
    if not len(h):
        return []
    out = ["## In short", ""]
    for _, r in h.head(DIGEST_ROWS).iterrows():
        q = _cell(r.get("short")) or _cell(r["quantity"])
        paper = f" (paper: {_paper_cell(r)})" if _compares(r) else ""
        line = f"- {_cell(r['finding']).split(' ')[0]}. {q}: {_cell(r['this_run'])}{paper}: {_verdict_short(r['verdict'])}"
        out.append(line if len(line) <= MAX_LINE else line[:MAX_LINE - 1] + "…")
    if len(h) > DIGEST_ROWS:
        out.append(f"- and {len(h) - DIGEST_ROWS} more headline rows below")
    return out + [""]


def _wrap(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width=width, subsequent_indent="  ", break_long_words=True,
                         break_on_hyphens=False) or [""]


def _verdict_short(v: str) -> str:
    """A verdict without its parenthesized detail (the README's column; SUMMARY.md has it whole)."""
    import re

    return re.sub(r"\s*\([^)]*\)", "", _cell(v)).strip()


def _headline_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The rows the README's results table shows (and the summary's digest): the ``headline`` ones, the embedded
    SmolLM2's left out."""
    h = df[df["headline"].astype(str).str.lower().isin(["true", "1"])]
    return h[~h["quantity"].astype(str).str.contains("smollm2", case=False)]


def headline_markdown(tables: Sequence[tuple]) -> str:
    """The README's results table: the ``headline`` rows of each (label, summary table[, key prefix]), in finding
    order, at most ``README_ROWS`` rows, each at most ``README_LINE`` characters in tests; the embedded SmolLM2's
    rows stay in SUMMARY.md. Source keys are those of the table's own SUMMARY.md (prefix default: A, B, ... by
    position), listed below with the verdict rules and terms."""
    lines = ["| # | quantity | paper | this run | verdict | src |", "|---|---|---|---|---|---|"]
    parts, keys = [], {}
    for i, t in enumerate(tables):
        label, df = t[0], t[1]
        prefix = t[2] if len(t) > 2 else chr(ord("A") + i)
        if df is None or not len(df) or "headline" not in df.columns:
            continue
        keys[i] = (label, _source_keys(df["source"], prefix))
        h = _headline_rows(df)
        parts += [(label, i, j, r) for j, (_, r) in enumerate(h.iterrows())]
    # a row two runs share (the measured vLLM tables every profile reads) is shown once, from the later table
    seen, kept = set(), []
    for part in reversed(parts):
        r = part[3]
        key = (_cell(r["finding"]), _cell(r["quantity"]), _cell(r["this_run"]))
        if key not in seen:
            seen.add(key)
            kept.append(part)
    order = {k: n for n, k in enumerate(FINDING_TITLES)}
    parts = sorted(kept[::-1], key=lambda t: (order.get(str(t[3]["finding"]).split(" ")[0], len(order)), t[1], t[2]))
    more = len(parts) - README_ROWS
    used: dict[int, dict[str, str]] = {}
    for label, i, j, r in parts[:README_ROWS]:  # noqa: B007
        k = keys[i][1][_cell(r["source"])]
        used.setdefault(i, {})[_cell(r["source"])] = k
        q = _cell(r.get("short")) or _cell(r["quantity"])
        lines.append(f"| {_cell(r['finding']).split(' ')[0]} | {q} | {_paper_cell(r)} | {_cell(r['this_run'])} | "
                     f"{_verdict_short(r['verdict'])} | {k} |")
    notes = []
    if more > 0:
        notes.append(f"{more} more headline row{'s are' if more > 1 else ' is'} in the summaries.")
    notes += [f"- **{k}** ({keys[i][0]}): {src}" for i in sorted(used) for src, k in sorted(used[i].items(),
                                                                                               key=lambda x: int(x[1][1:]))]
    text = [l for n in notes for l in _wrap(n, README_LINE)]
    text += [""] + _wrap(VERDICT_RULES, README_LINE) + [""] + _wrap(TERMS, README_LINE)
    return "\n".join(lines) + "\n\n" + "\n".join(text) + "\n"


# ---- summary rows per finding -----------------------------------------------------------------------------


def focus_dataset(datasets: Iterable[str]) -> str:
    """The dataset a finding's headline number is read on: the study's InstructCoder if present, else the
    package's InstructCoder analogue ``code-edit``, else the first one."""
    ds = sorted(datasets)
    for want in ("instructcoder", "code-edit"):
        if want in ds:
            return want
    return ds[0]


def _x(v: float) -> str:
    return f"{v:.2f}x"


def _who(ds: str, mdl) -> str:
    """A dataset and model, short: the study's published traces say so instead of naming their model."""
    return f"{ds}, published" if "published" in str(mdl) else (f"{ds}, {mdl}" if mdl else ds)


def finding1_rows(sim: pd.DataFrame, measured: pd.DataFrame | None, *, sim_source: str,
                  measured_source: str | None = None, live: pd.DataFrame | None = None,
                  live_source: str | None = None, v2: pd.DataFrame | None = None,
                  v2_source: str | None = None) -> list[SummaryRow]:
    """Finding 1's rows: the simulated speedups per cost model, the measured vLLM runs with dummy weights, vLLM
    with real weights on the runners its folder recorded (``live``, ``measured.live_speedups``: the V1 runner forced
    by default) and vLLM with real weights
    as it runs by default (``v2``, ``measured.v2_speedups``: the V2 runner for EAGLE), the README's measured
    headline, one row per workload. A real-weight row whose best configuration was host-contended at either end
    (``contended``) says so in its verdict: that speedup is a lower bound."""
    rows = []
    paper = f"shrinks ({PAPER['eagle_70b_bs1']}x at bs 1, 70B)"
    parts = []
    if sim is not None and len(sim):
        if "cost_model" in sim.columns:
            parts += [(f"simulated, cost model {c}", g, f"{sim_source}; cost model {c}")
                      for c, g in sim.groupby("cost_model", sort=False)]
        else:
            parts.append(("simulated", sim, sim_source))
    if measured is not None and "stalled" in measured.columns:
        measured = measured[~measured["stalled"].astype(bool)]  # a compilation stall is not the method's speed
    if measured is not None and len(measured):
        parts.append(("measured vLLM, dummy weights", measured, measured_source))
    if v2 is not None and len(v2):
        parts.append(("measured vLLM default engine (V2 runner), real weights", v2, v2_source))
    if live is not None and len(live):
        from .measured import live_runners

        parts.append((f"measured vLLM, real weights, {live_runners(live)}", live, live_source))
    for label, df, src in parts:
        focus = focus_dataset(df["dataset"].unique()) if label.startswith("simulated") else None
        shrinks = []
        for (ds, mdl), g in df.groupby(["dataset", "model"]):
            b0, b1 = g["batch_size"].min(), g["batch_size"].max()   # this model's own batch range
            at0 = g[g["batch_size"] == b0].set_index("proposers")
            at1 = g[g["batch_size"] == b1].set_index("proposers")
            best = at0["speedup"].idxmax()
            v0, v1 = float(at0.at[best, "speedup"]), float(at1["speedup"].get(best, np.nan))
            shrinks.append((mdl, v1 < v0))
            if focus is not None and ds != focus:
                continue
            where = ds if ds.startswith(str(mdl)) else f"{ds} ({mdl})"
            dummy = ((g["weights"].astype(str) == "dummy").all() if "weights" in g.columns else
                     g["proposers"].astype(str).str.contains("dummy weights").all())
            verdict = ("not comparable (acceptance set by dummy weights)" if dummy else
                       "agrees" if v1 < v0 else "departs: grows with batch")
            real = label.startswith("measured vLLM") and "real weights" in label
            default = label.startswith("measured vLLM default engine")
            slow = [int(b) for b, v in ((b0, v0), (b1, v1)) if v < 1]
            notes = [f"slower than no SD at bs {' and '.join(map(str, slow))}"] if slow else []
            if "contended" in g.columns:
                hit = [int(b) for b, at in ((b0, at0), (b1, at1))
                       if best in at.index and bool(at.at[best, "contended"])]
                if hit:
                    notes.append(f"host-contended at bs {' and '.join(map(str, hit))}: a lower bound there")
            if notes and real:    # the README's column drops the parenthesis: its row shows the speedups
                verdict += f" ({'; '.join(notes)})"
            elif notes:
                verdict += "; " + "; ".join(notes)
            name = str(at0.at[best, "method"]) if "method" in at0.columns else best.split(" ")[0]
            short = (f"{mdl} dims (vLLM, dummy weights): best ({name}), bs {b0} -> {b1}" if dummy else
                     f"{_who(ds, mdl)} (vLLM V2): best ({name}), bs {b0} -> {b1}" if default else
                     f"{_who(ds, mdl)} (vLLM V1, forced): best ({name}), bs {b0} -> {b1}" if real else
                     f"{_who(ds, mdl)}: best ({best}), bs {b0} -> {b1}, simulated")
            rows.append(SummaryRow("1 speedup vs batch", f"{where}: best proposer ({best}), bs {b0} -> {b1} ({label})",
                                   paper, f"{_x(v0)} -> {_x(v1)}", src, v0, verdict,
                                   headline=label.startswith("simulated, cost model llama3.1-8b-h100") or default,
                                   short=short))
        if focus is not None:
            for mdl in dict.fromkeys(m for m, _ in shrinks):
                n = [ok for m, ok in shrinks if m == mdl]
                rows.append(SummaryRow("1 speedup vs batch", f"{mdl}: datasets where the best proposer's speedup "
                                       f"shrinks from the smallest to the largest batch ({label})", "every dataset",
                                       f"{sum(n)} of {len(n)}", src, float(sum(n) / len(n)),
                                       "agrees" if all(n) else f"departs: grows on {len(n) - sum(n)}"))
    return rows


def finding2_rows(shares: pd.DataFrame | None, steps_source: str, vc: pd.DataFrame | None, vc_source: str,
                  limits: pd.DataFrame | None = None, limits_source: str = "",
                  cpu_shares: pd.DataFrame | None = None, cpu_source: str = "",
                  live_shares: pd.DataFrame | None = None, live_source: str = "") -> list[SummaryRow]:
    rows = []
    if live_shares is not None and len(live_shares):   # vLLM, real weights, the V1 runner forced (v1-runner/agreement)
        for (model, method), g in live_shares[live_shares["method"].astype(str) != "none"].groupby(["model", "method"]):
            v = g.sort_values("batch_size")
            b = v["batch_size"].tolist()
            rows.append(SummaryRow("2 verification bottleneck", f"{model}, {method}: verification share of "
                                   f"decode-step time, bs {b[0]}-{b[-1]}", f"{_verify_range()} (all methods)",
                                   f"{v['verification_share'].min():.0%}-{v['verification_share'].max():.0%}",
                                   live_source, float(v["verification_share"].max()),
                                   _in_range(v["verification_share"].min(), v["verification_share"].max(),
                                             "a 1.5B target: drafting and host work outweigh its forward")))
    if cpu_shares is not None and len(cpu_shares):
        for (model, method), g in cpu_shares[cpu_shares["method"].astype(str) != "none"].groupby(["model", "method"]):
            rows.append(SummaryRow("2 verification bottleneck", f"CPU torch engine, {model}, {method}: verification "
                                   f"share of decode-step time, bs {g['batch_size'].min()}-{g['batch_size'].max()}",
                                   f"{_verify_range()} (GPU, vLLM)", f"{g['verification_share'].min():.0%}-"
                                   f"{g['verification_share'].max():.0%}", cpu_source,
                                   float(g["verification_share"].max()),
                                   _in_range(g["verification_share"].min(), g["verification_share"].max(), "CPU")))
    if shares is not None and len(shares):
        sd = shares[shares["method"].astype(str) != "none"]
        for (model, method), g in sd.groupby(["model", "method"]):
            v = g.sort_values("batch_size")
            b = v["batch_size"].tolist()
            rows.append(SummaryRow("2 verification bottleneck",
                                   f"{model} dims, {method}: verification share of decode-step time, bs {b[0]}-{b[-1]}",
                                   f"{_verify_range()} (all methods)", f"{v['verification_share'].min():.0%}-"
                                   f"{v['verification_share'].max():.0%}", steps_source,
                                   float(v["verification_share"].max()),
                                   _in_range(v["verification_share"].min(), v["verification_share"].max(),
                                             "a light drafter" if method == "draft_model" else "dummy weights"),
                                   headline=str(model).startswith("llama3-70b") and method == "ngram",
                                   short=f"{model} dims, {method} (vLLM, H200): verification share, bs {b[0]}-{b[-1]}"))
        r = sd["rejection_sampling_share"].max()
        rows.append(SummaryRow("2 verification bottleneck", "rejection sampling share, max over methods and batches",
                               f"< {PAPER['reject_share_max']:.1%}", f"{r:.1%}", steps_source, float(r),
                               "agrees" if r < PAPER["reject_share_max"] else "departs: slightly above, still small"))
    if limits is not None and len(limits):
        for (model, method), g in limits[limits["method"] != "none"].groupby(["model", "method"]):
            g = g.sort_values("batch_size")
            lo, hi = g.iloc[0], g.iloc[-1]
            ratio = (f"{lo.vs_no_sd:.2f} -> {hi.vs_no_sd:.2f}" if pd.notna(lo.vs_no_sd) and pd.notna(hi.vs_no_sd)
                     else "no no-SD run of this model")
            rows.append(SummaryRow("2 verification bottleneck", f"{model} dims, {method}: verify forward ÷ no-SD forward "
                                   f"(k+1 vs 1 token per request), bs {int(lo.batch_size)} -> {int(hi.batch_size)}",
                                   "n/a (not reported)", f"{ratio} (HBM floor "
                                   f"{lo.floor_ms:.1f} / {hi.floor_ms:.1f} ms, measured {lo.t_verify_ms:.1f} / "
                                   f"{hi.t_verify_ms:.1f} ms)", limits_source, float(hi.vs_no_sd),
                                   "not in the paper (its physical limit)"))
    if vc is not None and len(vc):
        g = vc.groupby("k")["ratio"].mean()
        for kk in [3, int(g.index.max())]:
            if kk in g.index:
                rows.append(SummaryRow("2 verification bottleneck", f"CPU (SmolLM2-135M): forward of k+1 = {kk + 1} "
                                       "tokens ÷ 1 token", "n/a (GPU study)", f"{g[kk]:.2f}", vc_source, float(g[kk]),
                                       "not in the paper (CPU analogue)"))
    if not rows:
        rows.append(SummaryRow("2 verification bottleneck", "verification share of step time", _verify_range(),
                               "not measured (no step logs or CPU verify-cost data found)", steps_source,
                               verdict="not measured"))
    return rows


def finding3_rows(spread: pd.DataFrame, by_pos: pd.DataFrame, *, source: str) -> list[SummaryRow]:
    rows = []
    ds = focus_dataset(spread["dataset"].unique())
    for r in spread[spread["dataset"] == ds].itertuples(index=False):
        lo_hi = PAPER["tokens_per_step_p5_p95"].get(r.proposer)
        ref = "EAGLE" if r.proposer == "early-exit" else r.proposer
        paper = f"{lo_hi[0]}-{lo_hi[1]} ({ref}, InstructCoder, 70B)" if lo_hi else "n/a"
        wide = r.p95 >= 2 * r.p5
        rows.append(SummaryRow("3 acceptance varies", f"{ds} ({r.model}): tokens/step 5th-95th pct across "
                               f"requests, {r.proposer}", paper, f"{r.p5:.1f}-{r.p95:.1f} (95th/5th "
                               f"{r.p95 / r.p5:.2f})", source, float(r.p95),
                               ("agrees: wide spread" if wide else "departs: narrow spread") if lo_hi else
                               ("not in the paper (wide spread)" if wide else "not in the paper (narrow spread)")))
    focus = spread[(spread["dataset"] == ds) & spread["proposer"].isin(["ngram", "eagle"])]
    for mdl, g in focus.groupby("model", sort=True) if "model" in focus.columns else []:
        g = g.set_index("proposer").reindex([p for p in ("ngram", "eagle") if p in set(g["proposer"])])
        narrow = [p for p, r in g.iterrows() if r.p95 < 2 * r.p5]
        pp = PAPER["tokens_per_step_p5_p95"]
        rows.append(SummaryRow("3 acceptance varies", f"{ds} ({mdl}): tokens/step 5th-95th pct across requests, "
                               f"{' / '.join(g.index)}", " / ".join(f"{pp[p][0]}-{pp[p][1]}" for p in g.index),
                               " / ".join(f"{r.p5:.1f}-{r.p95:.1f}" for _, r in g.iterrows()), source,
                               float(g["p95"].max()),
                               f"departs: narrow ({', '.join(narrow)})" if narrow else "agrees",
                               headline=True, short=f"{_who(ds, mdl)}: tokens/step p5-p95, "
                               f"{' / '.join(g.index)}"))
    if spread["dataset"].nunique() > 1:
        by = ["model", "proposer"] if "model" in spread.columns else ["proposer"]
        for key, g in spread.groupby(by):
            key = key if isinstance(key, tuple) else (key,)
            who = f"{key[1]} ({key[0]})" if len(key) == 2 else key[0]
            rows.append(SummaryRow("3 acceptance varies", f"{who}: median tokens/step, range across datasets",
                                   "varies by dataset", f"{g['p50'].min():.2f} ({g.loc[g['p50'].idxmin(), 'dataset']})"
                                   f" - {g['p50'].max():.2f} ({g.loc[g['p50'].idxmax(), 'dataset']})", source,
                                   float(g["p50"].max() / g["p50"].min()),
                                   "agrees" if g["p50"].max() >= 1.2 * g["p50"].min() else "departs: about equal"))
    return rows


def finding3b_rows(adv: pd.DataFrame, thresholds: pd.DataFrame, *, source: str) -> list[SummaryRow]:
    """Per comparator (``metrics.overlap_thresholds``): the BLEU-4 above which n-gram wins, and the share of
    requests it wins below / above the paper's threshold."""
    cut = PAPER["bleu_threshold"]
    adv = adv if "other" in adv.columns else adv.assign(other="other")
    rows = []
    for t in thresholds.itertuples(index=False):
        d = adv[adv["other"] == t.other]
        if t.model and "model" in d.columns:
            d = d[d["model"].astype(str) == t.model]
        thr = None if t.threshold is None or pd.isna(t.threshold) else float(t.threshold)
        if thr is None:
            verdict = "departs: no supported threshold (n-gram's edge does not track overlap here)"
        else:
            verdict = "agrees" if abs(thr - cut) <= 0.2 + 1e-9 else f"departs: {'lower' if thr < cut else 'higher'}"
        vs_eagle = t.other in ("eagle", "eagle3")
        if not vs_eagle:
            verdict = f"not in the paper (vs {t.other}); " + verdict.split(":")[0]
        where = f" ({t.model})" if t.model else ""
        run = (f"{thr:.1f} ({int(t.n_below)} / {int(t.n_above)} requests below / above)" if thr is not None
               else "none supported")
        rows.append(SummaryRow("3 n-gram vs overlap", f"BLEU-4 above which n-gram beats {t.other}{where}",
                               f"≈{cut}", run, source, thr, verdict, headline=vs_eagle,
                               short=f"{_who('', t.model).lstrip(', ') or 'all'}: BLEU-4 above which n-gram beats "
                               f"{t.other}"))
        hi, lo = d[d["bleu"] >= cut], d[d["bleu"] < cut]
        both = len(hi) and len(lo)
        rows.append(SummaryRow("3 n-gram vs overlap", f"share of requests where n-gram beats {t.other}{where}: "
                               f"BLEU < {cut} / >= {cut}", "low / high",
                               f"{lo['ngram_wins'].mean():.0%} (n={len(lo)}) / {hi['ngram_wins'].mean():.0%} "
                               f"(n={len(hi)})" if both else f"n={len(lo)} below, n={len(hi)} above", source,
                               float(hi["ngram_wins"].mean()) if len(hi) else None,
                               ("agrees" if hi["ngram_wins"].mean() > lo["ngram_wins"].mean() else
                                "departs: not higher") if min(len(hi), len(lo)) >= MIN_OVERLAP_REQUESTS else
                           f"too few requests on one side (< {MIN_OVERLAP_REQUESTS})"))
    return rows


def finding4_rows(gap: pd.DataFrame, *, source: str) -> list[SummaryRow]:
    rows = []
    ds = focus_dataset(gap["dataset"].unique())
    g = gap[gap["dataset"] == ds]
    b0, b1 = g["batch_size"].min(), g["batch_size"].max()
    if "model" not in g.columns:
        g = g.assign(model="")
    for (mdl, prop), gp in g.groupby(["model", "proposers"]):
        r0 = gp[gp["batch_size"] == b0].iloc[0]
        r1 = gp[gp["batch_size"] == b1].iloc[0]
        paper = f"≈{PAPER['ngram_oracle']}x vs ≈{PAPER['ngram_best_fixed']}x" if prop == "ngram" else "n/a"
        where = f"{ds} ({mdl})" if mdl else ds
        rows.append(SummaryRow("4 oracle bound", f"{where}, {prop}, bs {b0}: oracle vs best fixed k", paper,
                               f"{_x(r0.oracle_speedup)} vs {_x(r0.best_fixed_speedup)} ({r0.best_fixed})", source,
                               float(r0.oracle_speedup),
                               "agrees" if r0.oracle_speedup > r0.best_fixed_speedup else "departs: no gap",
                               headline=prop == "ngram", short=f"{_who(ds, mdl)}, {prop}, bs {b0}: oracle vs best fixed k"))
        rows.append(SummaryRow("4 oracle bound", f"{where}, {prop}: oracle ÷ best fixed, bs {b0} -> {b1}",
                               "gap widens with batch size", f"{r0.gap:.2f} -> {r1.gap:.2f}", source, float(r1.gap),
                               "agrees" if r1.gap > r0.gap else "departs: narrows with batch"))
    return rows


def finding5_rows(sim: pd.DataFrame, *, source: str) -> list[SummaryRow]:
    rows = []
    ds = focus_dataset(sim["dataset"].unique())
    b0 = sim["batch_size"].min()
    d = sim[(sim["dataset"] == ds) & (sim["batch_size"] == b0)]
    multi = d["model"].nunique() > 1 if "model" in d.columns else False
    best_single = (d[d["policy"] == "oracle"].groupby("model" if multi else "policy")["speedup"].max()
                   if len(d) else pd.Series(dtype=float))
    for r in d[d["policy"] == "oracle"].itertuples(index=False):
        paper = {"eagle": f"≈{PAPER['eagle_oracle']}x", "early-exit": f"≈{PAPER['eagle_oracle']}x (EAGLE)",
                 "ngram": f"≈{PAPER['ngram_oracle']}x (finding 4)"}.get(r.proposers, "n/a")
        where = f"{ds} ({r.model})" if multi else ds
        rows.append(SummaryRow("5 hybrid oracle", f"{where}, bs {b0}: {r.proposers} oracle", paper, _x(r.speedup),
                               source, float(r.speedup), "not compared (a single proposer's bound)"))
    oc = d[d["policy"] == "oracle-combine"]
    for r in oc.itertuples(index=False):
        where = f"{ds} ({r.model})" if multi else ds
        single = float(best_single.get(r.model if multi else "oracle", np.nan))
        rows.append(SummaryRow("5 hybrid oracle", f"{where}, bs {b0}: Oracle Combine ({r.proposers}), drafting cost "
                               f"{r.draft_cost}", _combine_text(r.draft_cost), _x(r.speedup), source,
                               float(r.speedup),
                               (f"agrees: above the best single oracle ({_x(single)})" if r.speedup > single else
                                f"departs: not above the best single oracle ({_x(single)})")))
    # one headline row per model and proposer pair: the three accountings side by side
    by = [c for c in ("model", "proposers") if c in oc.columns]
    for key, g in (oc.groupby(by, sort=False) if len(oc) else []):
        key = key if isinstance(key, tuple) else (key,)
        mdl = key[0] if "model" in by else ""
        single = float(best_single.get(mdl if multi else "oracle", np.nan))
        below = [str(c) for c, v in zip(g["draft_cost"], g["speedup"]) if not v > single]
        rows.append(SummaryRow("5 hybrid oracle", f"{_who(ds, mdl)}, bs {b0}: Oracle Combine ({key[-1]}), drafting "
                               f"cost {' / '.join(g['draft_cost'])}",
                               "/".join(_combine_text(c) for c in g["draft_cost"]),
                               "/".join(_x(v) for v in g["speedup"]), source, float(g["speedup"].max()),
                               (f"departs: not above the best single oracle ({_x(single)}) with {', '.join(below)}"
                                if below else f"agrees (all above the best single oracle, {_x(single)})"),
                               headline=True, short=f"{_who(ds, mdl)}, bs {b0}: Combine, "
                               f"{'/'.join(g['draft_cost'])}"))
    return rows


def adaptive_rows(summary: pd.DataFrame, *, source: str,
                  confidence: pd.DataFrame | None = None) -> list[SummaryRow]:
    """Summary rows of notebook 07 (``grids.adaptive_summary``): on the focus dataset, per model and proposer set,
    at the smallest batch size, the best causal policy against the rule a user would run (the best
    ``ngram-else-eagle`` pair), the best fixed k at any k and Oracle Combine (``winner``: the oracle that pays for
    what it ran, as the policies do). Where no causal policy beats the rule (>= 1.05x at the smallest batch and
    >= 0.98x at every batch size), the row's causal policy IS the rule and the verdict says so. Then, per model:
    on how many (dataset, set) pairs a causal policy beats the rule, on how many it stays within 2% of the best
    fixed k, and adaptive-learned's spread over its seeds. ``confidence`` (``grids.confidence_table``): per model,
    on the focus dataset, each causal policy and the ceiling of a confidence stop as "x the tuned rule" (the rule's
    pair chosen on the other workloads)."""
    rows = []
    if confidence is not None and len(confidence):
        focus_c = focus_dataset(confidence["dataset"].unique())
        for _, r in confidence[confidence["dataset"] == focus_c].iterrows():
            def short(cfg):
                return str(cfg).replace("ngram-else-eagle-", "")

            parts = [f"adaptive-rule {r.adaptive_rule_x_rule:.3f}x"]
            if np.isfinite(r.skip_conf):
                parts += [f"{short(r.skip_conf_config)} {r.skip_conf_x_rule:.3f}x",
                          f"{r.conf_stop_config} (EAGLE alone) {r.conf_stop_x_rule:.3f}x"]
            else:
                parts += ["no stop policy (no confidence in the trace)"]
            parts += [f"ceiling (a perfect stop) {r.ceiling_x_rule:.3f}x"]
            value = float(r.skip_conf_x_rule if np.isfinite(r.skip_conf) else r.adaptive_rule_x_rule)
            rows.append(SummaryRow("6b adaptive selector", f"{r.dataset} ({r.model}), bs {int(r.batch_size)}: x the "
                                   f"rule tuned on other workloads ({short(r.rule_config)} {_x(r.rule)})",
                                   "n/a", "; ".join(parts), source, value,
                                   "beyond the study: " + ("a confidence stop beats the tuned rule"
                                                           if value >= 1.05 else "none beats the tuned rule")))
    focus = focus_dataset(summary["dataset"].unique()) if len(summary) else None
    for (ds, mdl, st), g in summary.groupby(["dataset", "model", "set"], sort=True):
        if ds != focus:
            continue
        r = g.iloc[0]
        fixed = f"fixed {r.best_fixed_config} {_x(r.best_fixed)}; oracle (winner) {_x(r.combine_winner)}"
        if r.beats_rule:
            gap = f"gap {r.gap_closed:.0%}" if np.isfinite(r.gap_closed) else "no gap"
            this = (f"{r.best_causal_policy} {_x(r.best_causal)} = {r.causal_vs_rule:.3f}x rule {r.rule_config} "
                    f"{_x(r.rule)} (worst {r.worst_vs_rule:.3f}x); {fixed}; {gap}")
            verdict, value = "beyond the study: beats the rule", float(r.causal_vs_rule)
        else:
            gap = f"gap {r.rule_gap_closed:.0%}" if np.isfinite(r.rule_gap_closed) else "no gap"
            this = (f"rule {r.rule_config} {_x(r.rule)}; causal {r.best_causal_policy} {_x(r.best_causal)} "
                    f"({r.causal_vs_rule:.3f}x, worst {r.worst_vs_rule:.3f}x); {fixed}; {gap}")
            verdict, value = "beyond the study: none beats the rule", float(r.rule)
        rows.append(SummaryRow("6b adaptive selector", f"{ds} ({mdl}), {st}, bs {r.batch_size}: causal row",
                               "n/a", this, source, value, verdict, headline=st.endswith("eagle")))
    for mdl, g in summary.groupby("model", sort=True):
        n = len(g)
        beats = int(g["beats_rule"].sum())
        near = int((g["worst_vs_fixed"] >= 0.98).sum())
        rows.append(SummaryRow("6b adaptive selector", f"{mdl}: pairs (dataset, set) where a causal policy beats the "
                               f"rule (>= 1.05x at bs {int(g['batch_size'].min())}, >= 0.98x at bs "
                               f"{g['batch_sizes'].iloc[0]}) / is within 2% of the best fixed k", "n/a",
                               f"{beats} of {n} / {near} of {n}", source, float(beats / n), "beyond the study"))
        spread = float(g["learned_spread_max"].max())
        if np.isfinite(spread):
            unstable = bool(g["learned_unstable_any"].any())
            rows.append(SummaryRow("6b adaptive selector", f"{mdl}: adaptive-learned, largest spread over its seeds "
                                   f"((max - min) / mean)", "n/a", f"{spread:.1%}", source,
                                   spread, "beyond the study: " + ("unstable (spread > 5% of the mean somewhere)"
                                                                   if unstable else "stable (<= 5%)")))
    return rows


def agreement_rows(agree: dict | None, source: str) -> list[SummaryRow]:
    if not agree:
        return []
    rows = []
    a = agree.get("vs_torch_profiler") or {}
    if a:
        rows.append(SummaryRow("3 acceptance varies", "trace fidelity: vLLM's accepted tokens per step = the profiler's "
                               "prediction from the same outputs (SmolLM2, n-gram)", "n/a",
                               f"{a['accepted_agreement_rate']:.1%} of {a['steps']} steps", source,
                               float(a["accepted_agreement_rate"]), "not in the paper (a fidelity check)"))
    t = agree.get("vs_torch_traces") or {}
    if t:
        rows.append(SummaryRow("3 acceptance varies", "trace fidelity: vLLM vs the committed torch traces (common "
                               "output prefixes)", "n/a",
                               f"{t['accepted_agreement_rate']:.1%} of {t['steps_on_common_prefix']} steps; "
                               f"{t['identical_outputs']}/{t['requests']} outputs identical", source,
                               float(t["accepted_agreement_rate"]), "not in the paper (a fidelity check)"))
    return rows
