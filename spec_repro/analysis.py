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

from .traces import STUDY_MODEL, Trace, TraceError, read_trace

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
    files = [f for f in files if not f.name.endswith(".tmp") and not f.name.startswith(".")]
    if model:
        files = [f for f in files if model.lower() in f.name.lower()]
    if datasets:
        files = [f for f in files if any(d.lower() in f.name.lower() for d in datasets)]
    if not files:
        raise TraceError(f"no trace files found for traces={traces!r}, model={model!r}, datasets={datasets!r}")
    return files


#: The model the study's published traces were measured with (its JSON lines do not say).
PUBLISHED_MODEL = STUDY_MODEL


def load_traces(traces=None, *, model: str | None = None, datasets: Sequence[str] | None = None,
                published_model: str = PUBLISHED_MODEL) -> Trace:
    """Read and concatenate the trace files ``trace_files`` resolves (parquet or JSON lines). Labels come from
    the data: the study's own JSON-lines files, recognized by content, are labelled ``published_model``; any
    other JSON-lines file by the model its records name (else ``unknown``), never by its extension."""
    files = trace_files(traces, model=model, datasets=datasets)

    def one(f):
        t = read_trace(f)
        if t.meta.get("study_file") and published_model != STUDY_MODEL:
            t.acc["model"], t.requests["model"] = published_model, published_model
            t = Trace(t.acc, t.requests, t.meta)
        return t

    t = Trace.concat(one(f) for f in files)
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
                                  proposers: Sequence[str] | None = None, max_position: int | None = None,
                                  min_requests: int = 1) -> pd.DataFrame:
    """Mean tokens one step would produce (accepted + 1, capped at k + 1) by output position.

    Positions are grouped in bins of ``bin_size`` tokens; bins reached by fewer than ``min_requests`` requests
    are dropped (late positions exist only in long outputs). Returns dataset, model, proposer, position (the
    bin's start), tokens_per_step (mean over every request and position in the bin), n (rows), n_requests."""
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
           .agg(tokens_per_step=("tokens_per_step", "mean"), n=("tokens_per_step", "size"),
                n_requests=("request_id", "nunique")).reset_index())
    return out[out["n_requests"] >= min_requests].reset_index(drop=True)


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


def ngram_advantage_by_model(trace: Trace, other: str | None = None, k: int = 3, ngram: str = "ngram") -> pd.DataFrame:
    """``ngram_advantage`` for every model of the trace, each against ``other`` or, when None, that model's first
    proposer that is not n-gram. Adds an ``other`` column; models without n-gram or another proposer are skipped."""
    parts = []
    for mdl in trace.models:
        tm = trace.select(model=mdl)
        o = other if other in tm.proposers else next((p for p in tm.proposers if p != ngram), None)
        if ngram not in tm.proposers or o is None:
            continue
        parts.append(ngram_advantage(tm, other=o, k=k, ngram=ngram).rename(
            columns={f"tpt_{o}": "tpt_other"}).assign(other=o))
    if not parts:
        raise TraceError(f"no model in the trace has both {ngram!r} and another proposer")
    return pd.concat(parts, ignore_index=True)


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

    Sums each phase over all steps of a group, divided by the summed step time. ``decode_only`` keeps only
    steps marked ``phase == 'decode'`` (no prefill, no chunked prefill mixed in) when the table has that column.
    Returns the ``by`` columns, steps, total_s, ms_per_step and one ``<phase>_share`` column per phase (shares
    sum to 1)."""
    df = steps
    if decode_only and "phase" in df.columns:
        df = df[df["phase"].astype(str) == "decode"]
    if df.empty:
        raise TraceError("time_shares: no steps to summarize")
    by = list(by)
    g = df.groupby(by, observed=True)
    out = g[list(_PHASES) + ["t_total"]].sum()
    for c, name in _PHASES.items():
        out[f"{name.replace(' ', '_')}_share"] = out[c] / out["t_total"]
    out = out.rename(columns={"t_total": "total_s"}).drop(columns=list(_PHASES))
    out.insert(0, "steps", g.size())
    out.insert(2, "ms_per_step", 1e3 * out["total_s"] / out["steps"])
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
    key = ["dataset"] + (["model"] if "model" in sim.columns else []) + ["proposers", "batch_size"]
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
    idx = ["dataset"] + (["model"] if "model" in o.columns else []) + ["batch_size"]
    return o.pivot_table(index=idx, columns="config", values="speedup").reset_index()


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
        from .io import atomic_write

        with atomic_write(Path(path)) as f:
            f.write(json.dumps(recs, indent=1) + "\n")
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
    metas = _metas(trace)
    fmt = "the study's published JSON lines" if any(m.get("study_file") for m in metas) else \
        ("JSON lines (not the study's published files)" if any(m.get("format") == "published-jsonl" for m in metas)
         else "spec_repro parquet")
    return (f"model {', '.join(trace.models)}; proposers {', '.join(trace.proposers)}; "
            f"requests per dataset {ds}; {fmt} traces")


def short_source(trace: Trace) -> str:
    """A one-line source for captions and the summary table: model, requests per dataset, trace kind, engine."""
    metas = _metas(trace)
    published = any(m.get("study_file") for m in metas)
    other_jsonl = any(m.get("format") == "published-jsonl" and not m.get("study_file") for m in metas)
    engines = sorted({f"{m['engine']}" + (f" on {m['device']}" if m.get("device") else "")
                      for m in metas if m.get("engine")})
    kind = "the study's published traces (vLLM, H100)" if published else \
        ("JSON-lines traces (not the study's published files)" if other_jsonl else "spec_repro traces")
    if published and other_jsonl:
        kind += " and other JSON-lines traces"
    eng = f", {'; '.join(engines)}" if engines else ""
    eng += ", collected live just now" if any(m.get("live") for m in metas) else ""
    per_model = []
    for mdl, g in trace.requests.groupby("model", observed=True):
        n = g.groupby("dataset", observed=True).size()
        per_model.append(f"{mdl}: {', '.join(f'{d} {c}' for d, c in n.items())} requests")
    return f"{'; '.join(per_model)}; {kind}{eng}"


def _metas(trace: Trace) -> list[dict]:
    m = trace.meta or {}
    return list(m.get("parts", [])) + [m]


# ---- simulation helpers for the notebooks -----------------------------------------------------------------

#: Drafting models for proposers a cost model has none for, priced per drafted token at a share of the target
#: forward: a draft model at the study's ratio (a draft forward is ≈37.5% of the target's on 8B targets,
#: Qwen3-0.6B for Qwen3-8B; ≈12.5% on 70B); the early-exit self-draft by its own depth (it runs the target's first
#: 80% of layers, the package's default exit), never as a one-layer EAGLE head. A string borrows that proposer's.
DRAFTER_STANDINS = {"early-exit": 0.8, "draft": 0.375}
_STANDIN_WHY = {"early-exit": "its own depth: the target's first 80% of layers",
                "draft": "the study's draft/target forward ratio on 8B targets"}


def cost_model_for(trace: Trace, cost_model, standins: dict | None = None):
    """Load ``cost_model`` (name, path or CostModel) and give every proposer of ``trace`` a drafting model:
    proposers the cost model lacks borrow a stand-in's (``DRAFTER_STANDINS``). Returns (model, notes), the
    notes saying which stand-ins were used, for the notebook to print."""
    import copy

    from .costmodel import Drafter, load_cost_model

    cm = copy.deepcopy(load_cost_model(cost_model))
    standins = {**DRAFTER_STANDINS, **(standins or {})}
    notes = []
    for p in trace.proposers:
        try:
            cm.drafter(p)
        except ValueError:
            s = standins.get(p)
            if s is None:
                raise
            if isinstance(s, float):
                cm.drafters[p] = Drafter("per_token", s * cm.c_kv, s * cm.c_tok, s * cm.c0)
                notes.append(f"proposer {p!r} has no drafting model in {cm.name!r}: charged {s:.1%} of a "
                             f"one-token target forward per drafted token ({_STANDIN_WHY.get(p, 'a stand-in')})")
                continue
            cm.drafters[p] = cm.drafter(s)
            notes.append(f"proposer {p!r} has no drafting model in {cm.name!r}: charged {s!r}'s "
                         f"({cm.drafters[p].kind}) drafting cost")
    return cm, notes


#: Which proposer Oracle Combine pairs with n-gram by default, as the study pairs n-gram with EAGLE.
COMBINE_PARTNERS = ("eagle", "eagle3", "early-exit", "draft", "mtp")


def combine_set(available: Sequence[str], combine: Sequence[str] | None = None) -> list[str]:
    """The proposers Oracle Combine uses for one model: ``combine`` ∩ available, or by default the study's pair,
    n-gram + the first of COMBINE_PARTNERS the model has. N-gram first (see ``simulate_grid``)."""
    if combine is None:
        partner = next((p for p in COMBINE_PARTNERS if p in available), None)
        have = ["ngram", partner] if partner and "ngram" in available else []
    else:
        have = [p for p in combine if p in available]
    return sorted(have, key=lambda p: p != "ngram")


def simulate_grid(trace: Trace, cost_model, *, proposers: Sequence[str], policies: Sequence[str],
                  batch_sizes: Sequence[int], draft_costs: Sequence[str] = ("ngram-only",),
                  combine: Sequence[str] | None = None, **kw) -> pd.DataFrame:
    """Run ``simulate`` for each single proposer under each policy (``fixed-K``/``oracle``) and, for
    ``oracle-combine``, per model for the proposers ``combine_set`` picks (default: n-gram + the EAGLE-like one,
    as the study) under each drafting-cost accounting. Extra keyword arguments go to ``simulate`` (batching,
    sample, seed, progress)."""
    import warnings

    warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm.auto in a kernel without widgets
    from .simulate import simulate

    kw.setdefault("progress", False)
    parts = []
    for pol in policies:
        if pol == "oracle-combine":
            # per model: combine the proposers that model's traces have (e.g. ngram+early-exit for SmolLM2,
            # ngram+draft for the Qwen pair); a model with fewer than two of them has nothing to combine
            for mdl in trace.models:
                tm = trace.select(model=mdl)
                # n-gram first: under the `winner` accounting a tie goes to the first proposer listed, and a tie
                # should cost the cheap lookup, not a model's drafting ("paid only where EAGLE wins")
                have = combine_set([p for p in proposers if p in tm.proposers], combine)
                if len(have) < 2:
                    continue
                for dc in draft_costs:
                    parts.append(simulate(tm.select(proposers=have), cost_model, have, pol, draft_cost=dc,
                                          batch_sizes=tuple(batch_sizes), **kw))
        else:
            for p in proposers:
                parts.append(simulate(trace.select(proposers=[p]), cost_model, [p], pol,
                                      batch_sizes=tuple(batch_sizes), **kw))
    return pd.concat(parts, ignore_index=True)


# ---- adaptive proposer-and-length selectors (spec_repro.adaptive) ------------------------------------------

ADAPTIVE_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)


def adaptive_sets(available: Sequence[str], sets: Sequence[Sequence[str]] | None = None) -> list[list[str]]:
    """Proposer sets the adaptive policies are run on for one model: ``sets`` (those the model has), or by default
    n-gram paired with each other proposer (n-gram + EAGLE, n-gram + draft, ...), as the study pairs them."""
    if sets is not None:
        return [list(s) for s in sets if all(p in available for p in s)]
    if "ngram" not in available:
        return [sorted(available)] if len(available) > 1 else []
    others = [p for p in available if p != "ngram"]
    out = [["ngram", p] for p in sorted(others, key=lambda p: (p not in COMBINE_PARTNERS,
                                                               COMBINE_PARTNERS.index(p) if p in COMBINE_PARTNERS
                                                               else 0, p))]
    return out


def adaptive_grid(trace: Trace, cost_model, *, proposer_sets: Sequence[Sequence[str]] | None = None,
                  batch_sizes: Sequence[int] = ADAPTIVE_BATCH_SIZES, max_fixed_k: int = 7,
                  proposers: Sequence[str] | None = None, long_fixed_k: bool = True, **kw) -> pd.DataFrame:
    """Per model and proposer set (``adaptive_sets``): fixed-1..``max_fixed_k`` and the oracle of each proposer of
    the set (its own drafting cost), Oracle Combine under ``ngram-only``/``winner``/``all``, and ``adaptive-rule``
    / ``adaptive-learned`` (charged ``ran``). Column ``set`` names the proposer set each row belongs to. Extra
    keyword arguments go to ``simulate`` (batching, seed, adaptive_params ...). ``proposers``: consider only
    these. ``long_fixed_k``: also fixed k = ``max_fixed_k`` + 1 .. the trace's k_max (the adaptive policies may
    propose up to k_max, so the summary also names the best fixed k over that whole range)."""
    import warnings

    warnings.filterwarnings("ignore", message="IProgress not found")
    from .simulate import simulate

    kw.setdefault("progress", False)
    Bs = tuple(int(b) for b in batch_sizes)
    parts = []
    for mdl in trace.models:
        tm = trace.select(model=mdl)
        kmax = int(tm.acc["k_max"].max()) if long_fixed_k else max_fixed_k
        fixed = [f"fixed-{k}" for k in range(1, max(kmax, max_fixed_k) + 1)] + ["oracle"]
        singles: dict = {}
        for props in adaptive_sets([p for p in tm.proposers if proposers is None or p in proposers], proposer_sets):
            name = "+".join(props)
            tp = tm.select(proposers=props)
            for p in props:
                if p not in singles:
                    singles[p] = simulate(tm.select(proposers=[p]), cost_model, [p], fixed, batch_sizes=Bs, **kw)
                parts.append(singles[p].assign(set=name))
            parts.append(simulate(tp, cost_model, props, "oracle-combine", ["ngram-only", "winner", "all"]
                                  if "ngram" in props else ["winner", "all"], batch_sizes=Bs, **kw).assign(set=name))
            parts.append(simulate(tp, cost_model, props, ["adaptive-rule", "adaptive-learned"], batch_sizes=Bs,
                                  **kw).assign(set=name))
    return pd.concat(parts, ignore_index=True)


def adaptive_summary(sim: pd.DataFrame, max_fixed_k: int = 7) -> pd.DataFrame:
    """From ``adaptive_grid`` rows, per dataset, model, proposer set and adaptive policy: at the smallest batch
    size the best single-proposer fixed k (own drafting cost), Oracle Combine (``all``), the policy and the share
    of the gap between the two it closes ((policy - best fixed) / (combine - best fixed); NaN where combine does
    not beat the best fixed k) and, for reference, Oracle Combine (``winner``: drafting paid only where a
    proposer wins, the bound for a policy that runs one drafter per step); over every batch size the policy's
    worst ratio to that batch size's best fixed k. "Best fixed k" takes k = 1..``max_fixed_k``; the ``*_any``
    columns take every fixed k the rows hold (up to the trace's k_max with ``adaptive_grid(long_fixed_k=True)``)."""
    key = ["dataset", "model", "set"]
    out = []
    for (ds, mdl, st), g in sim.groupby(key, sort=True):
        fx_all = g[g["policy"].str.startswith("fixed-")]
        fx = fx_all[fx_all["policy"].str[6:].astype(int) <= max_fixed_k]
        best = fx.loc[fx.groupby("batch_size")["speedup"].idxmax()].set_index("batch_size")
        best_any = fx_all.loc[fx_all.groupby("batch_size")["speedup"].idxmax()].set_index("batch_size")
        comb = g[(g["policy"] == "oracle-combine") & (g["draft_cost"] == "all")].set_index("batch_size")["speedup"]
        win = g[(g["policy"] == "oracle-combine") & (g["draft_cost"] == "winner")].set_index("batch_size")["speedup"]
        b0 = int(g["batch_size"].min())
        for pol, a in g[g["policy"].str.startswith("adaptive")].groupby("policy"):
            a = a.set_index("batch_size")["speedup"]
            ratio = a / best["speedup"].reindex(a.index)
            ratio_any = a / best_any["speedup"].reindex(a.index)
            bf, oc, ad = float(best.loc[b0, "speedup"]), float(comb.get(b0, np.nan)), float(a[b0])
            bfa = float(best_any.loc[b0, "speedup"])
            out.append(dict(dataset=ds, model=mdl, set=st, policy=pol, batch_size=b0, best_fixed=bf,
                            best_fixed_config=f"{best.loc[b0, 'proposers']} {best.loc[b0, 'policy']}",
                            combine_all=oc, adaptive=ad,
                            gap_closed=(ad - bf) / (oc - bf) if oc > bf else np.nan,
                            combine_winner=float(win.get(b0, np.nan)),
                            worst_ratio=float(ratio.min()), worst_ratio_batch=int(ratio.idxmin()),
                            best_fixed_any=bfa,
                            best_fixed_any_config=f"{best_any.loc[b0, 'proposers']} {best_any.loc[b0, 'policy']}",
                            gap_closed_any=(ad - bfa) / (oc - bfa) if oc > bfa else np.nan,
                            worst_ratio_any=float(ratio_any.min()), worst_ratio_any_batch=int(ratio_any.idxmin()),
                            batch_sizes=f"{int(a.index.min())}-{int(a.index.max())}"))
    return pd.DataFrame(out)


def adaptive_report(traces=None, cost_model="llama3.1-8b-h100", *, model: str | None = None,
                    datasets: Sequence[str] | None = None, proposer_sets: Sequence[Sequence[str]] | None = None,
                    batch_sizes: Sequence[int] = ADAPTIVE_BATCH_SIZES, **kw) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The adaptive-selector report in one call: load the traces (``load_traces``: default the committed ones),
    give every proposer a drafting model as notebooks 05/06 do (``cost_model_for``), run ``adaptive_grid`` and
    summarise it (``adaptive_summary``). Returns (rows, summary)."""
    trace = load_traces(traces, model=model, datasets=datasets)
    cm, _ = cost_model_for(trace, cost_model)
    sim = adaptive_grid(trace, cm, proposer_sets=proposer_sets, batch_sizes=batch_sizes, **kw)
    return sim, adaptive_summary(sim)


# ---- provenance -------------------------------------------------------------------------------------------

_PROV_KEYS = ("engine", "device", "machine", "hardware", "model_file_sha256", "command", "date", "k_max")


def trace_provenance(trace: Trace) -> str:
    """What the trace is and where it came from (engine, machine, date when the files record them)."""
    parts = [describe_source(trace)]
    seen = []
    for m in _metas(trace):
        bits = []
        for key in _PROV_KEYS:
            v = m.get(key)
            if v in (None, "", [], {}):
                continue
            if isinstance(v, dict):  # machine info: keep what identifies it
                v = ", ".join(f"{a}={v[a]}" for a in ("cpu", "cpu_count", "gpu", "platform") if a in v) or str(v)
            bits.append(f"{key}: {v}")
        line = "; ".join(bits)
        if line and line not in seen:
            seen.append(line)
    if seen:
        parts.append(" | ".join(seen[:3]) + (f" (+{len(seen) - 3} more)" if len(seen) > 3 else ""))
    files = (trace.meta or {}).get("files")
    if files:
        parts.append("files: " + ", ".join(Path(f).name for f in files))
        for f in files:  # the collection manifest next to the file: model checksum, machine, versions, date
            man = Path(f).parent / "MANIFEST.json"
            e = json.loads(man.read_text()).get(Path(f).name) if man.exists() else None
            if not e:
                continue
            m, v = e.get("machine", {}), e.get("versions", {})
            parts.append(f"  {Path(f).name}: {e.get('n_requests', '?')} requests, {e.get('date', '?')}, "
                         f"{e.get('model_file', e.get('model', '?'))} (sha256 {str(e.get('model_file_sha256', '?'))[:12]}), "
                         f"{e.get('engine', '?')} on {e.get('device', '?')} ({m.get('cpu_count', '?')} cores, "
                         f"{m.get('platform', '?')}), torch {v.get('torch', '?')}, "
                         f"{e.get('decoding', '?')} decoding, max {e.get('max_new_tokens', '?')} new tokens")
    return "\n".join(parts)


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


def finding1_rows(sim: pd.DataFrame, measured: pd.DataFrame | None, *, sim_source: str,
                  measured_source: str | None = None) -> list[SummaryRow]:
    rows = []
    paper = "shrinks with batch: EAGLE 1.96x (70B, bs 1); 8B GSM8K 1.21x at bs 128"
    parts = []
    if sim is not None and len(sim):
        if "cost_model" in sim.columns:
            parts += [(f"simulated, cost model {c}", g, f"{sim_source}; cost model {c}")
                      for c, g in sim.groupby("cost_model", sort=False)]
        else:
            parts.append(("simulated", sim, sim_source))
    if measured is not None and len(measured):
        parts.append(("measured vLLM, dummy weights", measured, measured_source))
    for label, df, src in parts:
        for (ds, mdl), g in df.groupby(["dataset", "model"]):
            b0, b1 = g["batch_size"].min(), g["batch_size"].max()   # this model's own batch range
            at0 = g[g["batch_size"] == b0].set_index("proposers")["speedup"]
            at1 = g[g["batch_size"] == b1].set_index("proposers")["speedup"]
            best = at0.idxmax()
            where = ds if ds.startswith(str(mdl)) else f"{ds} ({mdl})"
            rows.append(SummaryRow("1 speedup vs batch", f"{where}: best proposer ({best}), bs {b0} -> {b1} ({label})",
                                   paper, f"{_x(at0[best])} -> {_x(at1.get(best, np.nan))}", src,
                                   float(at0[best])))
    return rows


def finding2_rows(shares: pd.DataFrame | None, steps_source: str, vc: pd.DataFrame | None, vc_source: str,
                  limits: pd.DataFrame | None = None, limits_source: str = "",
                  cpu_shares: pd.DataFrame | None = None, cpu_source: str = "") -> list[SummaryRow]:
    rows = []
    if cpu_shares is not None and len(cpu_shares):
        for (model, method), g in cpu_shares[cpu_shares["method"].astype(str) != "none"].groupby(["model", "method"]):
            rows.append(SummaryRow("2 verification bottleneck", f"CPU torch engine, {model}, {method}: verification "
                                   f"share of decode-step time, bs {g['batch_size'].min()}-{g['batch_size'].max()}",
                                   "42%-95% (GPU, vLLM)", f"{g['verification_share'].min():.0%}-"
                                   f"{g['verification_share'].max():.0%}", cpu_source,
                                   float(g["verification_share"].max())))
    if shares is not None and len(shares):
        sd = shares[shares["method"].astype(str) != "none"]
        for (model, method), g in sd.groupby(["model", "method"]):
            v = g.sort_values("batch_size")
            b = v["batch_size"].tolist()
            rows.append(SummaryRow("2 verification bottleneck",
                                   f"{model} dims, {method}: verification share of decode-step time, bs {b[0]}-{b[-1]}",
                                   "42%-95% (all methods)", f"{v['verification_share'].min():.0%}-"
                                   f"{v['verification_share'].max():.0%}", steps_source,
                                   float(v["verification_share"].max())))
        r = sd["rejection_sampling_share"].max()
        rows.append(SummaryRow("2 verification bottleneck", "rejection sampling share, max over methods and batches",
                               "< 1.7%", f"{r:.1%}", steps_source, float(r)))
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
                                   f"{hi.t_verify_ms:.1f} ms)", limits_source, float(hi.vs_no_sd)))
    if vc is not None and len(vc):
        g = vc.groupby("k")["ratio"].mean()
        for kk in [3, int(g.index.max())]:
            if kk in g.index:
                rows.append(SummaryRow("2 verification bottleneck", f"CPU (SmolLM2-135M): forward of k+1 = {kk + 1} "
                                       "tokens ÷ 1 token", "n/a (GPU study)", f"{g[kk]:.2f}", vc_source, float(g[kk])))
    if not rows:
        rows.append(SummaryRow("2 verification bottleneck", "verification share of step time", "42%-95%",
                               "not measured (no step logs or CPU verify-cost data found)", steps_source))
    return rows


_PAPER_SPREAD = {"eagle": (2.7, 7.4), "early-exit": (2.7, 7.4), "ngram": (1.1, 15.0), "draft": (5.6, 18.3)}


def finding3_rows(spread: pd.DataFrame, by_pos: pd.DataFrame, *, source: str) -> list[SummaryRow]:
    rows = []
    ds = focus_dataset(spread["dataset"].unique())
    for r in spread[spread["dataset"] == ds].itertuples(index=False):
        lo_hi = _PAPER_SPREAD.get(r.proposer)
        ref = "EAGLE" if r.proposer == "early-exit" else r.proposer
        paper = f"{lo_hi[0]}-{lo_hi[1]} ({ref}, InstructCoder, 70B)" if lo_hi else "n/a"
        rows.append(SummaryRow("3 acceptance varies", f"{ds} ({r.model}): tokens/step 5th-95th pct across "
                               f"requests, {r.proposer}", paper, f"{r.p5:.1f}-{r.p95:.1f}", source, float(r.p95)))
    if spread["dataset"].nunique() > 1:
        for prop, g in spread.groupby("proposer"):
            rows.append(SummaryRow("3 acceptance varies", f"{prop}: median tokens/step, range across datasets",
                                   "varies by dataset", f"{g['p50'].min():.2f} ({g.loc[g['p50'].idxmin(), 'dataset']})"
                                   f" - {g['p50'].max():.2f} ({g.loc[g['p50'].idxmax(), 'dataset']})", source,
                                   float(g["p50"].max() / g["p50"].min())))
    return rows


def finding3b_rows(adv: pd.DataFrame, thr: float | None, other: str, *, source: str) -> list[SummaryRow]:
    hi = adv[adv["bleu"] >= 0.6]
    lo = adv[adv["bleu"] < 0.6]
    rows = [SummaryRow("3 n-gram vs overlap", f"BLEU-4 above which n-gram beats {other}", "≈0.6 (vs EAGLE)",
                       f"{thr:.1f}" if thr is not None else "none found", source, thr)]
    rows.append(SummaryRow("3 n-gram vs overlap", f"share of requests where n-gram beats {other}: BLEU < 0.6 | >= 0.6",
                           "low | high", f"{lo['ngram_wins'].mean():.0%} (n={len(lo)}) | "
                           f"{hi['ngram_wins'].mean():.0%} (n={len(hi)})" if len(hi) and len(lo) else
                           f"n={len(lo)} below, n={len(hi)} above", source,
                           float(hi["ngram_wins"].mean()) if len(hi) else None))
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
        paper = "oracle ≈2.75x vs best fixed ≈2.1x (InstructCoder, n-gram)" if prop == "ngram" else "n/a"
        where = f"{ds} ({mdl})" if mdl else ds
        rows.append(SummaryRow("4 oracle bound", f"{where}, {prop}, bs {b0}: oracle vs best fixed k", paper,
                               f"{_x(r0.oracle_speedup)} vs {_x(r0.best_fixed_speedup)} ({r0.best_fixed})", source,
                               float(r0.oracle_speedup)))
        rows.append(SummaryRow("4 oracle bound", f"{where}, {prop}: oracle ÷ best fixed, bs {b0} -> {b1}",
                               "gap widens with batch size", f"{r0.gap:.2f} -> {r1.gap:.2f}", source, float(r1.gap)))
    return rows


_PAPER_COMBINE = {"ngram-only": "4.9x", "winner": "≈4.3x", "all": "≈3.85x"}


def finding5_rows(sim: pd.DataFrame, *, source: str) -> list[SummaryRow]:
    rows = []
    ds = focus_dataset(sim["dataset"].unique())
    b0 = sim["batch_size"].min()
    d = sim[(sim["dataset"] == ds) & (sim["batch_size"] == b0)]
    multi = d["model"].nunique() > 1 if "model" in d.columns else False
    for r in d[d["policy"] == "oracle"].itertuples(index=False):
        paper = {"eagle": "≈2.7x", "early-exit": "≈2.7x (EAGLE)", "ngram": "≈2.75x (finding 4)"}.get(r.proposers,
                                                                                                   "n/a")
        where = f"{ds} ({r.model})" if multi else ds
        rows.append(SummaryRow("5 hybrid oracle", f"{where}, bs {b0}: {r.proposers} oracle", paper, _x(r.speedup),
                               source, float(r.speedup)))
    for r in d[d["policy"] == "oracle-combine"].itertuples(index=False):
        where = f"{ds} ({r.model})" if multi else ds
        rows.append(SummaryRow("5 hybrid oracle", f"{where}, bs {b0}: Oracle Combine ({r.proposers}), drafting cost "
                               f"{r.draft_cost}", _PAPER_COMBINE.get(r.draft_cost, "n/a"), _x(r.speedup), source,
                               float(r.speedup)))
    return rows


def adaptive_rows(summary: pd.DataFrame, *, source: str) -> list[SummaryRow]:
    """Summary rows of notebook 07: per dataset, model and proposer set, the better adaptive policy at the smallest
    batch size against the best fixed k and Oracle Combine (``all``), and its worst ratio to the best fixed k."""
    rows = []
    for (ds, mdl, st), g in summary.groupby(["dataset", "model", "set"], sort=True):
        r = g.loc[g["adaptive"].idxmax()]
        closed = f"{r.gap_closed:.0%} of the gap closed" if np.isfinite(r.gap_closed) else \
            "no gap (Oracle Combine, all <= best fixed k)"
        rows.append(SummaryRow("6b adaptive selector", f"{ds} ({mdl}), {st}, bs {r.batch_size}: best causal policy "
                               f"vs best fixed k and Oracle Combine (all); worst ratio to best fixed k, bs "
                               f"{r.batch_sizes}", "n/a (the study stops at oracles)",
                               f"{r.policy} {_x(r.adaptive)} vs {_x(r.best_fixed)} ({r.best_fixed_config}) and "
                               f"{_x(r.combine_all)}: {closed}; worst {r.worst_ratio:.3f} (bs {r.worst_ratio_batch}). "
                               f"Against any fixed k up to k_max: {_x(r.best_fixed_any)} ({r.best_fixed_any_config}), "
                               f"worst ratio {r.worst_ratio_any:.3f} (bs {r.worst_ratio_any_batch})",
                               source, float(r.gap_closed) if np.isfinite(r.gap_closed) else None))
    return rows


# ---- committed measurements (data/gpu, data/cpu) ----------------------------------------------------------


def _manifest_line(folder: Path, files: Sequence[Path]) -> str:
    """A one-line provenance from ``folder/manifest.json`` entries that mention the files (or all entries)."""
    man = next((folder / n for n in ("MANIFEST.json", "manifest.json") if (folder / n).exists()), folder / "manifest.json")
    if not man.exists():
        return f"files {', '.join(f.name for f in files)} (no manifest.json)"
    data = json.loads(man.read_text())
    names = {f.name for f in files} | {f.stem for f in files}
    hits = [v for k, v in data.items() if isinstance(v, dict) and (k in names or Path(k).name in names
                                                                 or any(n in json.dumps(v) for n in names))]
    hits = hits or [v for v in data.values() if isinstance(v, dict)]
    bits = []
    for v in hits[:1]:
        m = v.get("machine", {}) if isinstance(v.get("machine"), dict) else {}
        gpu = v.get("gpu") or m.get("gpu") or m.get("cpu")
        if isinstance(gpu, str) and "\n" in gpu:   # one nvidia-smi line per GPU: say it once, with the count
            lines = [x.strip() for x in gpu.splitlines() if x.strip()]
            gpu = lines[0] + (f" (x{len(lines)})" if len(set(lines)) == 1 else "; " + "; ".join(lines[1:]))
        ver = v.get("versions", {}) if isinstance(v.get("versions"), dict) else {}
        eng = ", ".join(f"{p} {ver[p]}" for p in ("vllm", "torch") if p in ver)
        bits += [str(x) for x in (gpu, eng, v.get("date")) if x]
    return f"{', '.join(f.name for f in files[:4])}{' ...' if len(files) > 4 else ''}" + \
        (f" ({'; '.join(bits)})" if bits else "")


def gpu_steps(files=None, run_kind: str | None = "study") -> tuple[pd.DataFrame | None, str]:
    """Step-timing logs (STEP_COLUMNS) from ``files`` or the committed ``data/gpu/steps.parquet`` (else every
    ``data/gpu/**/steps*.jsonl``). Steps flagged ``outlier`` (JIT compilations) or not ``primary`` (superseded
    by a later session's re-run, or with imposed acceptance) are dropped; with ``run_kind`` only those runs
    (``study``: the study's batching) when the table says.

    Returns (table or None, a provenance line saying what was read or that nothing was found)."""
    from .traces import read_steps, validate_steps

    folder = data_dir() / "gpu"
    if files is None:
        found = [folder / "steps.parquet"] if (folder / "steps.parquet").exists() else \
            sorted(p for p in folder.rglob("steps*.jsonl"))
    else:
        found = [Path(f) for f in ([files] if isinstance(files, (str, Path)) else files)]
    if not found:
        return None, f"measured: no step-timing logs under {folder} (the GPU runs have not been committed)"
    parts = []
    for f in found:
        if f.suffix == ".parquet":
            d = pd.read_parquet(f)
            if "outlier" in d.columns:
                d = d[~d["outlier"].astype(bool)]
            if "primary" in d.columns:   # runs re-made in a later session, or with imposed acceptance
                d = d[d["primary"].astype(bool)]
            if run_kind and "run_kind" in d.columns:
                d = d[d["run_kind"].astype(str) == run_kind]
            parts.append(validate_steps(d.reset_index(drop=True), str(f)))
        else:
            parts.append(read_steps(f))
    df = pd.concat(parts, ignore_index=True)
    engines = ", ".join(sorted(df["engine"].astype(str).unique()))
    return df, f"measured ({engines} step logs): {_manifest_line(folder, found)}"


def cpu_steps(files=None) -> tuple[pd.DataFrame | None, str]:
    """Step timings of this package's torch engine on the CPU (``data/cpu/steps_*.parquet``), same schema."""
    from .traces import read_steps

    folder = data_dir() / "cpu"
    found = sorted(folder.glob("steps_*.parquet")) if files is None else \
        [Path(f) for f in ([files] if isinstance(files, (str, Path)) else files)]
    if not found:
        return None, f"measured: no torch-engine step logs under {folder}"
    df = pd.concat([read_steps(f) for f in found], ignore_index=True)
    return df, f"measured (spec_repro torch engine step logs): {_manifest_line(folder, found)}"


def _gpu_runs(files) -> tuple[pd.DataFrame, list[Path]]:
    """Timed vLLM runs: the committed ``data/gpu/runs.csv`` (one row per run), or the ``kind == "run"`` records
    of job result files (``results.jsonl``, see engines/vllm_jobs.py)."""
    folder = data_dir() / "gpu"
    if files is None:
        found = [folder / "runs.csv"] if (folder / "runs.csv").exists() else sorted(folder.rglob("results.jsonl"))
    else:
        found = [Path(f) for f in ([files] if isinstance(files, (str, Path)) else files) if Path(f).exists()]
    recs = []
    for f in found:
        if f.suffix == ".csv":
            d = pd.read_csv(f)
            if "primary" in d.columns:   # runs re-made in a later session (data/gpu/README.md)
                d = d[d["primary"].astype(bool)]
            recs += d[d.get("kind", pd.Series("run", index=d.index)) == "run"].to_dict("records")
            continue
        for line in open(f):
            if line.strip():
                r = json.loads(line)
                if r.get("kind") == "run":
                    cfg = r.get("config") or {}
                    r["synthetic_acceptance_length"] = cfg.get("synthetic_acceptance_length")
                    r["load_format"] = cfg.get("load_format")
                    r["source_file"] = str(f)
                    recs.append(r)
    return pd.DataFrame(recs), found


def gpu_speedups(files=None, task: str = "batches") -> tuple[pd.DataFrame | None, str]:
    """Measured end-to-end vLLM speedups: output tokens/s of each SD run ÷ the no-SD run (method ``none``) of the
    same model and batch size, from the job results under ``data/gpu`` (``task='batches'``: the study's batching,
    one prompt copied B times).

    Returns (dataset, model, proposers, method, batch_size, speedup, tokens_per_s, base_tokens_per_s,
    acceptance_length, weights) or None, and a provenance line. ``proposers`` labels each series with how its
    acceptance came about (dummy weights accept almost nothing; vLLM's synthetic sampler imposes a length)."""
    runs, found = _gpu_runs(files)
    folder = data_dir() / "gpu"
    if runs.empty or "task" not in runs or not (runs["task"] == task).any():
        return None, f"measured: no vLLM throughput runs (task {task!r}) under {folder}"
    d = runs[runs["task"] == task].copy()
    d["tokens_per_s"] = d["output_tok_per_s"].astype(float)
    key = ["model", "batch_size"]
    base = (d[d["method"] == "none"].groupby(key, as_index=False)["tokens_per_s"].mean()
            .rename(columns={"tokens_per_s": "base_tokens_per_s"}))
    sd = d[d["method"] != "none"].copy()
    sd["weights"] = np.where(sd["load_format"].astype(str) == "dummy", "dummy", "real")

    sd["synthetic"] = pd.to_numeric(sd["synthetic_acceptance_length"], errors="coerce")
    grp = key + ["method", "weights", "synthetic"]
    sd = (sd.groupby(grp, as_index=False, dropna=False)
          .agg(tokens_per_s=("tokens_per_s", "mean"), acceptance_length=("acceptance_length", "mean")))
    al = sd.groupby(["model", "method", "weights", "synthetic"], dropna=False)["acceptance_length"].transform("mean")

    def label(r, al):
        if pd.notna(r["synthetic"]):
            return f"{r['method']} (synthetic AL {r['synthetic']:g})"
        return f"{r['method']} (AL {al:.2f}, {r['weights']} weights)"

    sd["proposers"] = [label(r, a) for (_, r), a in zip(sd.iterrows(), al)]
    sd["acceptance"] = np.where(sd["synthetic"].notna(), "assumed (vLLM synthetic sampler)", "as measured")
    out = sd.merge(base, on=key)
    out["speedup"] = out["tokens_per_s"] / out["base_tokens_per_s"]
    out["dataset"] = out["model"].astype(str) + " dims, random prompt"
    return out.sort_values(key + ["proposers"]).reset_index(drop=True), \
        f"measured vLLM throughput: {_manifest_line(folder, found)}"


def gpu_cost_model_path() -> Path | None:
    """The cost model fitted to the committed H200 step logs (``data/gpu/costmodel_*.json``), if any."""
    found = sorted((data_dir() / "gpu").glob("costmodel_*.json"))
    return found[0] if found else None


def acceptance_agreement(path=None) -> tuple[dict | None, str]:
    """How well the traces' acceptance matches a production engine's: ``data/gpu/smollm2_agreement.json``
    (SmolLM2-135M, real weights, n-gram in vLLM on the H200 vs this package's profiler and torch traces)."""
    p = Path(path) if path is not None else data_dir() / "gpu" / "smollm2_agreement.json"
    if not p.exists():
        return None, f"no engine-agreement record at {p}"
    return json.loads(p.read_text()), f"measured (vLLM on GPU vs spec_repro torch traces): {_manifest_line(p.parent, [p])}"


def agreement_rows(agree: dict | None, source: str) -> list[SummaryRow]:
    if not agree:
        return []
    rows = []
    a = agree.get("vs_torch_profiler") or {}
    if a:
        rows.append(SummaryRow("3 acceptance varies", "trace fidelity: vLLM's accepted tokens per step = the profiler's "
                               "prediction from the same outputs (SmolLM2, n-gram)", "n/a",
                               f"{a['accepted_agreement_rate']:.1%} of {a['steps']} steps", source,
                               float(a["accepted_agreement_rate"])))
    t = agree.get("vs_torch_traces") or {}
    if t:
        rows.append(SummaryRow("3 acceptance varies", "trace fidelity: vLLM vs the committed torch traces (common "
                               "output prefixes)", "n/a",
                               f"{t['accepted_agreement_rate']:.1%} of {t['steps_on_common_prefix']} steps; "
                               f"{t['identical_outputs']}/{t['requests']} outputs identical", source,
                               float(t["accepted_agreement_rate"])))
    return rows


def gpu_verify_limits(path=None) -> tuple[pd.DataFrame | None, str]:
    """Median decode target-forward (verification) time beside its HBM floor, per model, method and batch size
    (``data/gpu/verify_limits.csv``: floor = (weights streamed + KV read) / datasheet bandwidth). Adds
    ``vs_no_sd``: verification time ÷ the no-SD forward of the same model and batch size (k+1 tokens per
    request vs 1)."""
    p = Path(path) if path is not None else data_dir() / "gpu" / "verify_limits.csv"
    if not p.exists():
        return None, f"measured: no verification-vs-HBM-floor table at {p}"
    df = pd.read_csv(p)
    base = df[df["method"] == "none"][["model", "batch_size", "t_verify_ms"]].rename(
        columns={"t_verify_ms": "base_ms"})
    df = df.merge(base, on=["model", "batch_size"], how="left")
    df["vs_no_sd"] = df["t_verify_ms"] / df["base_ms"]
    return df.drop(columns="base_ms"), f"measured (vLLM step logs): {_manifest_line(p.parent, [p])}"


def verify_cost(path=None) -> tuple[pd.DataFrame | None, str]:
    """The measured cost of verifying k drafts: forward time of k+1 tokens ÷ time of 1 token, per k.

    Reads ``data/cpu/verify_cost.csv`` by default; needs column ``k`` and either ``ratio`` or the two times
    (``t_k1``/``t_1`` or ``seconds_k1``/``seconds_1``)."""
    p = Path(path) if path is not None else data_dir() / "cpu" / "verify_cost.csv"
    if not p.exists():
        return None, f"measured: no verify-cost table at {p}"
    df = pd.read_csv(p)
    if "ratio" not in df.columns and "ratio_to_1_token" in df.columns:
        df["ratio"] = df["ratio_to_1_token"]
    if "ratio" not in df.columns:
        pairs = [("t_k1", "t_1"), ("seconds_k1", "seconds_1"), ("t_kplus1", "t_1")]
        for a, b in pairs:
            if a in df.columns and b in df.columns:
                df["ratio"] = df[a] / df[b]
                break
        else:
            raise TraceError(f"{p}: need a 'ratio' column or time columns {pairs}, have {list(df.columns)}")
    if "k" not in df.columns:
        raise TraceError(f"{p}: need a 'k' column, have {list(df.columns)}")
    src = f"measured on CPU: {_manifest_line(p.parent, [p])}"
    man = p.parent / "MANIFEST.json"
    if man.exists():
        e = json.loads(man.read_text()).get(p.name, {})
        if e.get("weight_bytes") and "median_s" in df and (df["k"] == 0).any():
            t1 = float(df.loc[df["k"] == 0, "median_s"].iloc[0])
            src += (f"; model {e.get('model', '?')}, KV cache {e.get('kv_len', '?')} tokens, "
                    f"{e.get('torch_threads', '?')} threads: a 1-token step ({t1 * 1e3:.1f} ms) reads "
                    f"{e['weight_bytes'] / 1e6:.0f} MB of weights = {e['weight_bytes'] / t1 / 1e9:.1f} GB/s")
    return df, src


# ---- live runs (GPU users; a few seconds on CPU with small settings) --------------------------------------


def live_trace(backend: str, *, model: str | None = None, datasets: Sequence[str] | None = None,
               proposers: Sequence[str] | None = None, n_requests: int = 4, max_new_tokens: int = 64,
               k_max: int = 16, out: str | Path | None = None) -> Trace:
    """Collect fresh acceptance traces now (``spec_repro.collect``) and return them.

    ``backend="torch"`` decodes with the package's engine on CUDA when available, else CPU. ``backend="vllm"``:
    per-position acceptance under greedy decoding is a property of the target's outputs, not of the engine, so
    traces are profiled the same exact way (the torch engine on the GPU); vLLM's own acceptance counters are
    compared with them in ``data/gpu`` (issue 4). Collection is resumable: finished requests are kept under
    ``out`` (default: the cache)."""
    if backend not in ("torch", "vllm"):
        raise ValueError(f"unknown backend {backend!r}; use 'embedded', 'torch' or 'vllm'")
    import torch

    from .collect import collect
    from .models import cache_root

    model = model or "smollm2-135m"
    datasets = list(datasets or ["code-edit", "sharegpt"])
    props = list(proposers or ["ngram", "early-exit"])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = Path(out) if out else cache_root() / "live_traces" / f"{model}_n{n_requests}_t{max_new_tokens}_k{k_max}"
    paths = collect(model, datasets, n=n_requests, max_new_tokens=max_new_tokens, proposers=props, out=out,
                    k_max=k_max, device=device, quiet=True)
    t = Trace.concat(read_trace(p) for p in paths)
    t.meta.update({"files": [str(p) for p in paths], "live": True})
    return t


def live_vllm_job(job: str, out: str | Path | None = None, timeout_s: float = 420) -> Path:
    """Run one of the vLLM device jobs (``spec_repro.engines.vllm_jobs``, e.g. ``llama8b``) now, each engine in
    its own process; returns the folder holding ``results.jsonl`` and ``steps_*.jsonl`` for ``gpu_speedups`` /
    ``gpu_steps``. Needs vLLM and a GPU (the job fails with a clear message otherwise)."""
    import subprocess
    import sys

    from .models import cache_root

    out = Path(out) if out else cache_root() / "live_vllm" / job
    out.mkdir(parents=True, exist_ok=True)
    rc = subprocess.run([sys.executable, "-m", "spec_repro.engines.vllm_jobs", "run", job, "--out", str(out),
                         "--timeout", str(timeout_s)]).returncode
    if rc != 0:
        print(f"vLLM job {job!r}: {rc} engine spec(s) failed; see {out / 'results.jsonl'}")
    return out
