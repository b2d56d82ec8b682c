"""Computations behind the notebooks: acceptance by position, per-request spread, prompt-output overlap,
time shares, oracle gaps, and the summary table that ``spec-repro reproduce`` assembles.

Everything here reads the shared trace schema (:mod:`spec_repro.traces`) or the step-timing schema
(``STEP_COLUMNS``) and returns tidy DataFrames that :mod:`spec_repro.plots` draws. No function here invents a
number: each works on the table it is given, and the summary rows carry the source of what they report.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from .traces import Trace, TraceError, read_trace

__all__ = [
    "repo_root", "data_dir", "figures_dir", "trace_files", "load_traces", "walk_steps",
    "acceptance_by_output_position", "acceptance_by_draft_position", "tokens_per_step_per_request",
    "tokens_per_step_spread", "prompt_output_bleu", "ngram_advantage", "overlap_threshold",
    "time_shares", "oracle_gap", "hybrid_table", "SummaryRow", "write_summary", "read_summaries",
    "summary_markdown", "describe_source",
]

# ---- where things live ------------------------------------------------------------------------------------


def repo_root() -> Path:
    """The checkout holding ``data/`` (the package is installed editable), or ``$SPEC_REPRO_ROOT``."""
    env = os.environ.get("SPEC_REPRO_ROOT")
    return Path(env) if env else Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    return repo_root() / "data"


def figures_dir() -> Path:
    return repo_root() / "figures"


def trace_files(traces=None, *, model: str | None = None, datasets: Sequence[str] | None = None) -> list[Path]:
    """Resolve the notebooks' ``traces=`` parameter to files.

    ``None`` means the committed embedded traces (``data/traces/*.parquet``); a string may be a file, a
    directory or a glob; a list mixes those. ``model`` keeps files whose name contains it (case-insensitive,
    e.g. ``"smollm2"``); ``datasets`` keeps files whose name contains one of them."""
    if traces is None:
        items: list = [data_dir() / "traces"]
    elif isinstance(traces, (str, Path)):
        items = [traces]
    else:
        items = list(traces)
    files: list[Path] = []
    for it in items:
        p = Path(it).expanduser()
        if p.is_dir():
            files += sorted(p.glob("*.parquet")) + sorted(p.glob("*.jsonl"))
        elif any(ch in str(it) for ch in "*?["):
            files += sorted(Path().glob(str(it))) if not p.is_absolute() else sorted(Path("/").glob(str(p)[1:]))
        elif p.exists():
            files.append(p)
        else:
            raise TraceError(f"{p}: no such trace file or directory")
    files = [f for f in files if not f.name.endswith(".tmp")]
    if model:
        files = [f for f in files if model.lower() in f.name.lower()]
    if datasets:
        files = [f for f in files if any(d.lower() in f.name.lower() for d in datasets)]
    if not files:
        raise TraceError(f"no trace files found for traces={traces!r}, model={model!r}, datasets={datasets!r}")
    return files


def load_traces(traces=None, *, model: str | None = None, datasets: Sequence[str] | None = None,
                **read_kw) -> Trace:
    """Read and concatenate the trace files ``trace_files`` resolves (parquet or published JSON lines)."""
    files = trace_files(traces, model=model, datasets=datasets)
    t = Trace.concat(read_trace(f, **read_kw) for f in files)
    t.meta["files"] = [str(f) for f in files]
    return t


# ---- acceptance -------------------------------------------------------------------------------------------


def walk_steps(acc_len: np.ndarray, k: int | None) -> np.ndarray:
    """Positions where a greedy run with fixed draft length ``k`` starts each step.

    A step starting at position p produces ``min(acc_len[p], k + 1)`` tokens (``k=None``: the oracle, which
    produces ``acc_len[p]``). Returns the start positions (one per step)."""
    a = np.asarray(acc_len, dtype=np.int64)
    if k is not None:
        a = np.minimum(a, k + 1)
    starts, p, L = [], 0, len(a)
    while p < L:
        starts.append(p)
        p += int(a[p])
    return np.asarray(starts, dtype=np.int64)


def _groups(trace: Trace, proposers: Sequence[str] | None):
    acc = trace.acc
    if proposers is not None:
        trace.check_proposers(proposers)
        acc = acc[acc["proposer"].isin(list(proposers))]
    acc = acc.sort_values(["dataset", "model", "proposer", "request_id", "position"])
    return acc.groupby(["dataset", "model", "proposer", "request_id"], sort=True, observed=True)


def acceptance_by_output_position(trace: Trace, k: int | None = 3, bin_size: int = 16,
                                  proposers: Sequence[str] | None = None, max_position: int | None = None
                                  ) -> pd.DataFrame:
    """Mean tokens one step would produce (accepted + 1, capped at k + 1) by output position.

    Positions are grouped in bins of ``bin_size`` tokens. Returns dataset, model, proposer, position (the
    bin's start), tokens_per_step (mean over every request and position in the bin), n (rows in the bin)."""
    acc = trace.acc
    if proposers is not None:
        acc = acc[acc["proposer"].isin(trace.check_proposers(proposers))]
    if max_position is not None:
        acc = acc[acc["position"] < max_position]
    a = acc["acc_len"].astype(np.int64)
    if k is not None:
        a = a.clip(upper=k + 1)
    df = acc.assign(tokens_per_step=a, position=(acc["position"] // bin_size) * bin_size)
    out = (df.groupby(["dataset", "model", "proposer", "position"], observed=True)
           .agg(tokens_per_step=("tokens_per_step", "mean"), n=("tokens_per_step", "size")).reset_index())
    return out


def acceptance_by_draft_position(trace: Trace, k: int = 3, proposers: Sequence[str] | None = None
                                 ) -> pd.DataFrame:
    """The study's per-position acceptance rate: drafts whose i-th token was accepted ÷ drafts, i = 1..k.

    Steps are those of a fixed-k greedy run (``walk_steps``); a step counts as a draft when the proposer
    proposed something (``draft_len`` > 0; unknown draft_len counts as a draft). Returns dataset, model,
    proposer, draft_position (1..k), rate, drafts."""
    rows = []
    for (ds, mdl, prop), g in trace.acc.groupby(["dataset", "model", "proposer"], observed=True):
        if proposers is not None and prop not in proposers:
            continue
        accepted_hist = np.zeros(k + 1, np.int64)  # accepted_hist[j]: drafts with exactly j accepted
        for _, r in g.sort_values(["request_id", "position"]).groupby("request_id", sort=False, observed=True):
            a = r["acc_len"].to_numpy(np.int64)
            dl = r["draft_len"]
            drafted = np.ones(len(a), bool) if dl.isna().all() else (dl.fillna(1).to_numpy(np.int64) > 0)
            s = walk_steps(a, k)
            s = s[drafted[s]]
            acc_n = np.minimum(a[s] - 1, k)
            accepted_hist += np.bincount(acc_n, minlength=k + 1)[: k + 1]
        drafts = int(accepted_hist.sum())
        for i in range(1, k + 1):
            rows.append({"dataset": ds, "model": mdl, "proposer": prop, "draft_position": i,
                         "rate": accepted_hist[i:].sum() / drafts if drafts else np.nan, "drafts": drafts})
    return pd.DataFrame(rows)


def tokens_per_step_per_request(trace: Trace, k: int | None = None, proposers: Sequence[str] | None = None
                                ) -> pd.DataFrame:
    """Per request and proposer: tokens per step (output length ÷ steps) of a greedy run with draft length k.

    ``k=None`` uses the oracle (every step proposes exactly what will be accepted, up to the trace's k_max),
    which is how the study reports the spread of tokens per step. Returns dataset, model, proposer,
    request_id, steps, output_len, tokens_per_step."""
    rows = []
    for (ds, mdl, prop, rid), g in _groups(trace, proposers):
        a = g["acc_len"].to_numpy(np.int64)
        steps = len(walk_steps(a, k))
        rows.append({"dataset": ds, "model": mdl, "proposer": prop, "request_id": rid, "steps": steps,
                     "output_len": len(a), "tokens_per_step": len(a) / steps})
    return pd.DataFrame(rows)


def tokens_per_step_spread(trace: Trace, k: int | None = None, percentiles: Sequence[float] = (5, 25, 50, 75, 95),
                           proposers: Sequence[str] | None = None) -> pd.DataFrame:
    """Percentiles across requests of per-request tokens per step, per dataset/model/proposer.

    Columns: dataset, model, proposer, n_requests, p5, p25, ... (one column per percentile), mean."""
    per = tokens_per_step_per_request(trace, k=k, proposers=proposers)
    rows = []
    for (ds, mdl, prop), g in per.groupby(["dataset", "model", "proposer"], observed=True):
        v = g["tokens_per_step"].to_numpy(float)
        row = {"dataset": ds, "model": mdl, "proposer": prop, "n_requests": len(v)}
        for q in percentiles:
            row[f"p{q:g}"] = float(np.percentile(v, q))
        row["mean"] = float(v.mean())
        rows.append(row)
    return pd.DataFrame(rows)


# ---- prompt-output overlap --------------------------------------------------------------------------------


def prompt_output_bleu(trace: Trace) -> pd.DataFrame:
    """BLEU-4 (sacrebleu ``sentence_bleu``, 0..1) of each request's output against its prompt as reference.

    Uses the decoded texts when the trace has them (sacrebleu's default 13a tokenizer), else the token ids
    (``tokenize='none'`` on space-joined ids). Returns dataset, model, request_id, bleu, bleu_on."""
    import sacrebleu

    req = trace.requests
    has_text = "prompt_text" in req and "output_text" in req
    has_ids = "prompt_token_ids" in req and "output_token_ids" in req
    if not (has_text or has_ids):
        raise TraceError("prompt-output BLEU needs prompt/output texts or token ids in trace.requests; "
                         "this trace has neither (published files carry token ids; ours carry both)")
    rows = []
    for r in req.itertuples(index=False):
        text_ok = has_text and isinstance(r.prompt_text, str) and isinstance(r.output_text, str)
        if text_ok:
            hyp, ref, tok, on = r.output_text, r.prompt_text, "13a", "text"
        elif has_ids and r.prompt_token_ids is not None and r.output_token_ids is not None:
            hyp = " ".join(map(str, r.output_token_ids))
            ref = " ".join(map(str, r.prompt_token_ids))
            tok, on = "none", "token_ids"
        else:
            continue
        score = min(1.0, sacrebleu.sentence_bleu(hyp, [ref], tokenize=tok).score / 100.0)  # 100.0000001
        rows.append({"dataset": r.dataset, "model": r.model, "request_id": r.request_id, "bleu": score,
                     "bleu_on": on})
    return pd.DataFrame(rows)


def ngram_advantage(trace: Trace, other: str, k: int = 3, ngram: str = "ngram") -> pd.DataFrame:
    """Per request: BLEU-4 prompt-output overlap and n-gram's tokens per step ÷ ``other``'s, at draft length k.

    Returns dataset, model, request_id, bleu, tpt_<ngram>, tpt_<other>, advantage (ratio), ngram_wins."""
    t = trace.select(proposers=[ngram, other])
    per = tokens_per_step_per_request(t, k=k)
    wide = per.pivot_table(index=["dataset", "model", "request_id"], columns="proposer",
                           values="tokens_per_step", observed=True).reset_index()
    wide = wide.rename(columns={ngram: f"tpt_{ngram}", other: f"tpt_{other}"})
    wide.columns.name = None
    out = wide.merge(prompt_output_bleu(t), on=["dataset", "model", "request_id"], how="inner")
    out["advantage"] = out[f"tpt_{ngram}"] / out[f"tpt_{other}"]
    out["ngram_wins"] = out["advantage"] > 1.0
    return out


def overlap_threshold(adv: pd.DataFrame, edges: Sequence[float] = tuple(np.round(np.arange(0, 1.01, 0.1), 2))
                      ) -> tuple[float | None, pd.DataFrame]:
    """Where n-gram starts to win: the lowest BLEU bin edge from which every non-empty higher bin has a
    median advantage > 1 (None if no such edge). Also returns the per-bin table (bin, n, median, win share)."""
    b = pd.cut(adv["bleu"], bins=list(edges), include_lowest=True)
    tab = (adv.assign(bin=b).groupby("bin", observed=True)
           .agg(n=("advantage", "size"), median_advantage=("advantage", "median"),
                ngram_win_share=("ngram_wins", "mean")).reset_index())
    tab["bin_lo"] = [iv.left if iv.left > 0 else 0.0 for iv in tab["bin"]]
    thr = None
    for i in range(len(tab)):
        if (tab["median_advantage"].iloc[i:] > 1).all():
            thr = float(max(tab["bin_lo"].iloc[i], 0.0))
            break
    tab["bin"] = tab["bin"].astype(str)
    return thr, tab


# ---- step-time breakdown ----------------------------------------------------------------------------------

_PHASES = {"t_draft": "drafting", "t_verify": "verification", "t_reject": "rejection sampling",
           "t_other": "overhead"}


def time_shares(steps: pd.DataFrame, by: Sequence[str] = ("model", "method", "k", "batch_size"),
                decode_only: bool = True) -> pd.DataFrame:
    """Share of step time in each phase (drafting, verification, rejection sampling, overhead).

    Sums each phase over all steps of a group, divided by the summed step time. ``decode_only`` drops steps
    marked ``phase == 'prefill'`` when the table has that column. Returns the ``by`` columns, steps, total_s,
    and one ``<phase>_share`` column per phase (shares sum to 1)."""
    df = steps
    if decode_only and "phase" in df.columns:
        df = df[df["phase"].astype(str) != "prefill"]
    if df.empty:
        raise TraceError("time_shares: no steps to summarize")
    by = list(by)
    g = df.groupby(by, observed=True)
    out = g[list(_PHASES) + ["t_total"]].sum()
    for c, name in _PHASES.items():
        out[f"{name.replace(' ', '_')}_share"] = out[c] / out["t_total"]
    out = out.rename(columns={"t_total": "total_s"}).drop(columns=list(_PHASES))
    out.insert(0, "steps", g.size())
    return out.reset_index()


def shares_long(shares: pd.DataFrame, by: Sequence[str] = ("model", "method", "k", "batch_size")) -> pd.DataFrame:
    """``time_shares`` output in long form (one row per phase), for stacked bars."""
    cols = [c for c in shares.columns if c.endswith("_share")]
    long = shares.melt(id_vars=list(by), value_vars=cols, var_name="phase", value_name="share")
    long["phase"] = long["phase"].str.removesuffix("_share").str.replace("_", " ")
    return long


# ---- simulator outputs ------------------------------------------------------------------------------------


def oracle_gap(sim: pd.DataFrame) -> pd.DataFrame:
    """From simulate() rows with ``fixed-K`` and ``oracle`` policies: per dataset/proposers/batch size the best
    fixed k, its speedup, the oracle's speedup and the gap (oracle ÷ best fixed)."""
    fixed = sim[sim["policy"].str.startswith("fixed-")]
    orc = sim[sim["policy"] == "oracle"]
    key = ["dataset", "proposers", "batch_size"]
    best = fixed.loc[fixed.groupby(key)["speedup"].idxmax(), key + ["policy", "speedup"]]
    best = best.rename(columns={"policy": "best_fixed", "speedup": "best_fixed_speedup"})
    out = best.merge(orc[key + ["speedup"]].rename(columns={"speedup": "oracle_speedup"}), on=key)
    out["gap"] = out["oracle_speedup"] / out["best_fixed_speedup"]
    return out.sort_values(key).reset_index(drop=True)


def hybrid_table(sim: pd.DataFrame) -> pd.DataFrame:
    """Oracle rows of simulate(): one column per configuration (each proposer's own oracle, and Oracle
    Combine under each drafting-cost accounting), one row per dataset and batch size."""
    o = sim[sim["policy"].isin(["oracle", "oracle-combine"])].copy()
    o["config"] = np.where(o["policy"] == "oracle", "oracle " + o["proposers"],
                           "combine (" + o["draft_cost"].astype(str) + ")")
    return o.pivot_table(index=["dataset", "batch_size"], columns="config", values="speedup").reset_index()


# ---- summary table ----------------------------------------------------------------------------------------


@dataclass
class SummaryRow:
    """One line of the reproduction summary: what the paper reported next to what this run measured."""

    finding: str        # e.g. "4 oracle bound"
    quantity: str       # what is compared, e.g. "n-gram oracle speedup, bs 1"
    paper: str          # the paper's value, as published (FACTS.md)
    this_run: str       # this run's value, formatted
    source: str         # engine/model/hardware/measured or simulated/cost model
    value: float | None = None  # this run's value as a number, when there is one


def write_summary(rows: Iterable[SummaryRow | dict], path: str | Path | None) -> pd.DataFrame:
    """Write a notebook's summary rows as JSON (a list of objects) and return them as a DataFrame.

    ``path=None`` only returns the table (notebooks run by nbval write nothing)."""
    recs = [asdict(r) if isinstance(r, SummaryRow) else dict(r) for r in rows]
    for r in recs:
        SummaryRow(**r)  # validates the keys
        if isinstance(r.get("value"), (np.floating, np.integer)):
            r["value"] = float(r["value"])
    if path is not None:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(recs, indent=1) + "\n")
    return pd.DataFrame(recs, columns=list(SummaryRow.__dataclass_fields__))


def read_summaries(paths: Iterable[str | Path]) -> pd.DataFrame:
    recs = []
    for p in paths:
        recs += json.loads(Path(p).read_text())
    return pd.DataFrame(recs, columns=list(SummaryRow.__dataclass_fields__))


def summary_markdown(df: pd.DataFrame) -> str:
    """A GitHub-flavoured markdown table (finding, quantity, paper, this run, source)."""
    cols = ["finding", "quantity", "paper", "this_run", "source"]
    head = "| " + " | ".join(c.replace("_", " ") for c in cols) + " |"
    sep = "|" + "|".join("---" for _ in cols) + "|"
    body = ["| " + " | ".join(str(r[c]).replace("|", "/").replace("\n", " ") for c in cols) + " |"
            for _, r in df.iterrows()]
    return "\n".join([head, sep, *body]) + "\n"


def describe_source(trace: Trace) -> str:
    """One line naming what a trace is: models, datasets, proposers, request count, and where it came from."""
    n = trace.requests.groupby("dataset", observed=True).size()
    ds = ", ".join(f"{d} ({c})" for d, c in n.items())
    fmt = "published JSON lines" if any(m.get("format") == "published-jsonl" for m in _metas(trace)) \
        else "spec_repro parquet"
    return (f"model {', '.join(trace.models)}; proposers {', '.join(trace.proposers)}; "
            f"requests per dataset {ds}; {fmt} traces")


def _metas(trace: Trace) -> list[dict]:
    m = trace.meta or {}
    return list(m.get("parts", [])) + [m]
