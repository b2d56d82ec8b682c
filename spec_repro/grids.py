"""The simulation grids the notebooks run: every proposer a drafting model (``cost_model_for``), fixed-k /
oracle / Oracle Combine over a trace (``simulate_grid``), and the adaptive selectors against them
(``adaptive_grid``, ``adaptive_summary``, ``adaptive_report``). Each returns the simulator's rows."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from .paths import load_traces
from .traces import Trace

__all__ = ["DRAFTER_STANDINS", "cost_model_for", "COMBINE_PARTNERS", "combine_set", "simulate_grid",
           "ADAPTIVE_BATCH_SIZES", "adaptive_sets", "adaptive_grid", "adaptive_summary", "adaptive_report"]

#: Drafting models for proposers a cost model has none for, priced per drafted token at a share of the target
#: forward: a draft model at the study's ratio (a draft forward is ≈37.5% of the target's on 8B targets,
#: Qwen3-0.6B for Qwen3-8B; ≈12.5% on 70B); the early-exit self-draft by its own depth (it runs the target's first
#: 80% of layers, the package's default exit), never as a one-layer EAGLE head. A string borrows that proposer's.
DRAFTER_STANDINS = {"early-exit": 0.8, "draft": 0.375}
_STANDIN_WHY = {"early-exit": "its own depth: the target's first 80% of layers",
                "draft": "the study's draft/target forward ratio on 8B targets"}


def cost_model_for(trace: Trace, cost_model, standins: dict | None = None, proposers=None):
    """Load ``cost_model`` (name, path or CostModel) and give every proposer of ``trace`` (or of ``proposers``) a
    drafting model: proposers the cost model lacks borrow a stand-in's (``DRAFTER_STANDINS``). Returns (model,
    notes), the notes saying which stand-ins were used, for the notebook (or the CLI) to print."""
    import copy

    from .costmodel import Drafter, load_cost_model

    cm = copy.deepcopy(load_cost_model(cost_model))
    standins = {**DRAFTER_STANDINS, **(standins or {})}
    notes = []
    for p in (proposers if proposers is not None else trace.proposers):
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
