"""Pure metrics: a trace or a step/simulation table in, a tidy DataFrame out. Acceptance by position, per-request
spread, prompt-output overlap, phase shares of step time, oracle gaps. Nothing here reads files or formats text."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from .traces import Trace, TraceError

__all__ = [
    "walk_steps", "accepted_histogram", "acceptance_by_output_position", "acceptance_by_draft_position",
    "STUDY_ANALOGUES",
    "draft_position_vs_study", "tokens_per_step_per_request",
    "tokens_per_step_spread", "MIN_OUTPUT_LEN", "LOOP_WINDOW", "LOOP_DOMINATED", "loop_share", "request_outputs",
    "split_by_output_len", "prompt_output_bleu", "ngram_advantage", "ngram_advantage_by_model",
    "overlap_threshold", "overlap_support", "overlap_thresholds", "MIN_OVERLAP_REQUESTS", "verify_cost_summary", "PHASES", "SHARE_COLUMNS", "phase_shares", "shares_long", "oracle_gap", "hybrid_table",
]


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


def accepted_histogram(acc_len: np.ndarray, k: int, drafted: np.ndarray | None = None) -> np.ndarray:
    """Over the steps of a fixed-``k`` greedy run (``walk_steps``), how many drafts had exactly j tokens accepted,
    j = 0..k; ``drafted`` (bool per position): only the steps where the proposer proposed something count."""
    a = np.asarray(acc_len, dtype=np.int64)
    s = walk_steps(a, k)
    if drafted is not None:
        s = s[drafted[s]]
    return np.bincount(np.minimum(a[s] - 1, k), minlength=k + 1)[: k + 1]


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
    proposer, draft_position (1..k), rate, conditional_rate, drafts.

    ``rate`` is the study's (unconditional) rate, which can only fall with i: the i-th token is accepted only
    if every earlier one was. ``conditional_rate`` is drafts whose i-th token was accepted ÷ drafts whose
    (i-1)-th was (i = 1: the same as ``rate``; NaN where no draft reached i-1): whether a proposer gets worse
    deeper into its draft (a head past its training depth) or only looks so because fewer drafts get there."""
    rows = []
    for (ds, mdl, prop), g in trace.acc.groupby(["dataset", "model", "proposer"], observed=True):
        if proposers is not None and prop not in proposers:
            continue
        accepted_hist = np.zeros(k + 1, np.int64)  # accepted_hist[j]: drafts with exactly j accepted
        for _, r in g.sort_values(["request_id", "position"]).groupby("request_id", sort=False, observed=True):
            dl = r["draft_len"]
            drafted = None if dl.isna().all() else (dl.fillna(1).to_numpy(np.int64) > 0)
            accepted_hist += accepted_histogram(r["acc_len"].to_numpy(np.int64), k, drafted)
        drafts = int(accepted_hist.sum())
        reached = accepted_hist[::-1].cumsum()[::-1]  # reached[j]: drafts with at least j tokens accepted
        for i in range(1, k + 1):
            rows.append({"dataset": ds, "model": mdl, "proposer": prop, "draft_position": i,
                         "rate": reached[i] / drafts if drafts else np.nan,
                         "conditional_rate": reached[i] / reached[i - 1] if reached[i - 1] else np.nan,
                         "drafts": drafts})
    return pd.DataFrame(rows)


#: The study's datasets and this package's workload standing in for each (the study's name: the package's).
STUDY_ANALOGUES = {"instructcoder": "code-edit", "sharegpt": "sharegpt", "gsm8k": "gsm-symbolic"}


def draft_position_vs_study(ours: pd.DataFrame, study: pd.DataFrame, *, k: int,
                            proposers: Sequence[str] = ("eagle", "ngram")) -> pd.DataFrame:
    """This package's per-draft-position acceptance (``acceptance_by_draft_position``) beside the study's (the
    committed table ``published.read_draft_position_rates``, at the same ``k``), for the proposer families both
    have, paired by dataset (``STUDY_ANALOGUES``; a trace of the study's own datasets pairs with itself).

    Long format: pair (e.g. ``code-edit ↔ instructcoder``), side (``package`` / ``study``), dataset, model,
    proposer, draft_position, kind (``unconditional``: the study's rate; ``conditional``: given the previous draft
    token accepted), value, drafts. Pairs are those the package's rows reach and proposers those it has among
    ``proposers``; where it reaches none, every pair / proposer of the study is kept (the study's side alone).
    ``attrs["notes"]`` says what could not be paired."""
    to_study = {**{o_ds: st_ds for st_ds, o_ds in STUDY_ANALOGUES.items()}, **{d: d for d in STUDY_ANALOGUES}}
    notes = []
    st = study[study["k"] == k]
    if not len(st):
        notes.append(f"The study's table has no rows at k={k} (it has k = "
                     f"{', '.join(map(str, sorted(study['k'].unique())))}): the package's side alone.")
    o = ours[ours["dataset"].astype(str).isin(to_study) & ours["proposer"].astype(str).isin(proposers)]
    present = sorted(set(o["dataset"].astype(str)))
    if not present:
        notes.append(f"The package's rows have no {' or '.join(proposers)} on a dataset with a study counterpart "
                     f"({', '.join(f'{v} for {k}' for k, v in STUDY_ANALOGUES.items())}); they have datasets "
                     f"{', '.join(sorted(set(ours['dataset'].astype(str)))) or 'none'}, proposers "
                     f"{', '.join(sorted(set(ours['proposer'].astype(str)))) or 'none'}: the study's side alone.")
    label: dict[str, str] = {}
    for d in present:
        label.setdefault(to_study[d], to_study[d] if d == to_study[d] else f"{d} ↔ {to_study[d]}")
    st = st[st["dataset"].astype(str).isin(label or STUDY_ANALOGUES)
            & st["proposer"].astype(str).isin(set(o["proposer"].astype(str)) or set(proposers))]
    rows = []
    for side, d in (("package", o), ("study", st)):
        for r in d.itertuples(index=False):
            st_ds = to_study[str(r.dataset)] if side == "package" else str(r.dataset)
            for kind, col in (("unconditional", "rate"), ("conditional", "conditional_rate")):
                rows.append({"pair": label.get(st_ds, st_ds), "side": side, "dataset": str(r.dataset),
                             "model": str(r.model), "proposer": str(r.proposer),
                             "draft_position": int(r.draft_position), "kind": kind, "value": getattr(r, col),
                             "drafts": int(r.drafts)})
    out = pd.DataFrame(rows, columns=["pair", "side", "dataset", "model", "proposer", "draft_position", "kind",
                                      "value", "drafts"])
    out.attrs["notes"] = notes
    out.attrs["k"] = k
    return out


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


# ---- output length and loops ------------------------------------------------------------------------------

#: outputs shorter than this many tokens are reported apart (:func:`split_by_output_len`)
MIN_OUTPUT_LEN = 32
#: the span length that makes a repeat a loop (:func:`loop_share`)
LOOP_WINDOW = 32
#: an output with at least this loop share is flagged loop-dominated (``request_outputs``' ``looping``)
LOOP_DOMINATED = 0.5


def loop_share(ids: Sequence[int], window: int = LOOP_WINDOW) -> float:
    """Fraction of an output's tokens inside a repeated n-gram loop: a token is inside one when some span of
    ``window`` consecutive output tokens that covers it also occurs earlier in the output (starting at an earlier
    position; the two may overlap, so a short cycle repeated past ``window`` tokens counts). An output shorter
    than ``window`` + 1 tokens has no loop (0.0); an empty one gives NaN."""
    a = np.asarray(ids, dtype=np.int64)
    n = len(a)
    if n == 0:
        return float("nan")
    if n <= window:
        return 0.0
    seen: set[bytes] = set()
    starts = np.zeros(n - window + 1, np.bool_)
    buf = a.tobytes()
    w = window * a.itemsize
    for p in range(n - window + 1):
        key = buf[p * a.itemsize: p * a.itemsize + w]
        if key in seen:
            starts[p] = True
        else:
            seen.add(key)
    cover = np.zeros(n + 1, np.int64)             # tokens covered by a repeated span: a difference array
    idx = np.flatnonzero(starts)
    np.add.at(cover, idx, 1)
    np.add.at(cover, idx + window, -1)
    return float((np.cumsum(cover[:n]) > 0).mean())


def request_outputs(trace: Trace, *, min_len: int = MIN_OUTPUT_LEN, window: int = LOOP_WINDOW) -> pd.DataFrame:
    """Per request: dataset, model, request_id, output_len, ``short`` (output_len < ``min_len``) and
    ``loop_share`` (:func:`loop_share` of its stored output token ids; NaN where the trace has none) and
    ``looping`` (loop_share >= :data:`LOOP_DOMINATED`), computed from the trace, not stored in it."""
    req = trace.requests
    has = "output_token_ids" in req.columns
    rows = []
    for r in req.itertuples(index=False):
        ids = getattr(r, "output_token_ids", None) if has else None
        rows.append({"dataset": r.dataset, "model": r.model, "request_id": r.request_id,
                     "output_len": int(r.output_len), "short": int(r.output_len) < min_len,
                     "loop_share": loop_share(ids, window) if ids is not None else float("nan")})
    out = pd.DataFrame(rows, columns=["dataset", "model", "request_id", "output_len", "short", "loop_share"])
    out["looping"] = out["loop_share"] >= LOOP_DOMINATED
    return out


def split_by_output_len(trace: Trace, min_len: int = MIN_OUTPUT_LEN) -> tuple[Trace, Trace]:
    """(requests with output_len >= ``min_len``, the shorter ones) as two traces: short outputs (a greeting, a
    refusal) are a handful of steps whose tokens per step say little, and are reported apart."""
    key = ["dataset", "model", "request_id"]
    req = trace.requests
    long_req = req["output_len"] >= min_len
    long_ids = req.loc[long_req, key]
    long_acc = trace.acc[key].merge(long_ids.assign(_long=True), on=key, how="left")["_long"].fillna(False)
    long_acc = long_acc.to_numpy(dtype=bool)
    out = []
    for want in (True, False):
        r = req[long_req == want].reset_index(drop=True)
        acc = trace.acc[long_acc == want].reset_index(drop=True)
        out.append(Trace(acc, r, dict(trace.meta)))
    return out[0], out[1]


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


#: Fewest requests a BLEU bin needs to count toward the overlap threshold, and the fewest on each side of it.
MIN_OVERLAP_REQUESTS = 10


def overlap_threshold(adv: pd.DataFrame, edges: Sequence[float] = tuple(np.round(np.arange(0, 1.01, 0.1), 2)),
                      min_requests: int = MIN_OVERLAP_REQUESTS) -> tuple[float | None, pd.DataFrame]:
    """Where n-gram starts to win, on one comparator's rows: the lowest BLEU bin edge from which every higher bin
    holding at least ``min_requests`` requests has a median advantage > 1, provided at least ``min_requests``
    requests lie on each side of it (None otherwise: a bin of one or two requests decides nothing). Also returns
    the per-bin table (bin, n, median advantage, win share, whether the bin counted)."""
    b = pd.cut(adv["bleu"], bins=list(edges), include_lowest=True)
    tab = (adv.assign(bin=b).groupby("bin", observed=True)
           .agg(n=("advantage", "size"), median_advantage=("advantage", "median"),
                ngram_win_share=("ngram_wins", "mean")).reset_index())
    tab["bin_lo"] = [iv.left if iv.left > 0 else 0.0 for iv in tab["bin"]]
    tab["counted"] = tab["n"] >= min_requests
    c = tab[tab["counted"]]
    thr = None
    for i in range(len(c)):
        if (c["median_advantage"].iloc[i:] > 1).all():
            thr = float(max(c["bin_lo"].iloc[i], 0.0))
            break
    if thr is not None and min(overlap_support(adv, thr)) < min_requests:
        thr = None
    tab["bin"] = tab["bin"].astype(str)
    return thr, tab


def overlap_support(adv: pd.DataFrame, threshold: float) -> tuple[int, int]:
    """Requests below / at or above a BLEU threshold."""
    b = adv["bleu"].to_numpy(float)
    return int((b < threshold).sum()), int((b >= threshold).sum())


def overlap_thresholds(adv: pd.DataFrame, min_requests: int = MIN_OVERLAP_REQUESTS) -> pd.DataFrame:
    """``overlap_threshold`` per model and comparator (``adv["other"]``, from ``ngram_advantage_by_model``): other,
    model, threshold (None where the rule finds none), n_below, n_above (requests on each side of it), n."""
    adv = adv if "other" in adv.columns else adv.assign(other="other")
    adv = adv if "model" in adv.columns else adv.assign(model="")
    rows = []
    for (mdl, oth), d in adv.groupby(["model", "other"], sort=True):
        thr, _ = overlap_threshold(d, min_requests=min_requests)
        below, above = overlap_support(d, thr) if thr is not None else (None, None)
        rows.append(dict(other=oth, model=str(mdl), threshold=thr, n_below=below, n_above=above, n=len(d)))
    return pd.DataFrame(rows)


def verify_cost_summary(raw: pd.DataFrame) -> pd.DataFrame:
    """Timed target forwards (k, n_tokens, kv_len, seconds; ``engines.torch.measure_verify_cost``) -> per k: the
    median, p10 and p90 seconds, the repeat count, and the median and p10 ratios to the one-token forward (k = 0;
    on a shared CPU the low percentile is the steadier estimate of the uncontended cost)."""
    g = raw.groupby(["k", "n_tokens", "kv_len"])["seconds"]
    df = g.median().rename("median_s").to_frame()
    df["p10_s"], df["p90_s"], df["repeats"] = g.quantile(0.1), g.quantile(0.9), g.size()
    df = df.reset_index()
    df["ratio_to_1_token"] = df["median_s"] / float(df.loc[df.k == 0, "median_s"].iloc[0])
    df["p10_ratio_to_1_token"] = df["p10_s"] / float(df.loc[df.k == 0, "p10_s"].iloc[0])
    return df


# ---- step-time breakdown ----------------------------------------------------------------------------------

#: The step-timing schema's phase columns and the one name each phase goes by in share tables and figures.
PHASES = {"t_draft": "drafting", "t_verify": "verification", "t_reject": "rejection_sampling", "t_other": "overhead"}
SHARE_COLUMNS = tuple(f"{name}_share" for name in PHASES.values())


def phase_shares(steps: pd.DataFrame, by: Sequence[str] = ("model", "method", "k", "batch_size"),
                 decode_only: bool = True) -> pd.DataFrame:
    """Share of step time in each phase (drafting, verification, rejection sampling, overhead): each phase summed
    over all steps of a group, divided by the summed step time (``t_total``).

    Steps flagged ``outlier`` (JIT compilations, see ``engines.vllm.steps.flag_jit_outliers``) are left out when
    the table has that column; ``decode_only`` keeps only steps marked ``phase == 'decode'`` (no prefill, no
    chunked prefill mixed in) when the table has that column. Returns the ``by`` columns, steps, total_s,
    ms_per_step and ``SHARE_COLUMNS`` (drafting_share, verification_share, rejection_sampling_share,
    overhead_share; they sum to 1 when ``t_total`` is the sum of the phases)."""
    df = steps
    if "outlier" in df.columns:
        df = df[~df["outlier"].astype(bool)]
    if decode_only and "phase" in df.columns:
        df = df[df["phase"].astype(str) == "decode"]
    if df.empty:
        raise TraceError("phase_shares: no steps to summarize")
    g = df.groupby(list(by), observed=True)
    sums = g[list(PHASES) + ["t_total"]].sum()
    out = pd.DataFrame({"steps": g.size(), "total_s": sums["t_total"]})
    out["ms_per_step"] = 1e3 * out["total_s"] / out["steps"]
    for c, name in PHASES.items():
        out[f"{name}_share"] = sums[c] / sums["t_total"]
    return out.reset_index()


def shares_long(shares: pd.DataFrame, by: Sequence[str] = ("model", "method", "k", "batch_size")) -> pd.DataFrame:
    """``phase_shares`` output in long form (one row per phase, named as in figures), for stacked bars."""
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


def top1_prob(logits, ids):
    """softmax(logits)[..., ids], computed in float32 (float64 logits stay float64): a drafter's probability of
    its own greedy token when ``ids`` is the argmax of ``logits`` (its top-1 probability)."""
    import torch

    x = logits if logits.dtype == torch.float64 else logits.float()
    return (x.gather(-1, ids[..., None]).squeeze(-1) - torch.logsumexp(x, dim=-1)).exp()
