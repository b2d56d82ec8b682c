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
           "ADAPTIVE_BATCH_SIZES", "adaptive_sets", "adaptive_grid", "adaptive_table", "adaptive_summary",
           "adaptive_report", "tune_rule", "out_of_sample_params", "SWITCH_KN", "SWITCH_KE", "LEARNED_SEEDS",
           "CONF_TS", "CONF_KS", "out_of_sample_policy", "confidence_table"]

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


# ---- causal selectors against the baselines a user would run (spec_repro.adaptive, spec_repro.baselines) -------

ADAPTIVE_BATCH_SIZES = (1, 8, 16, 32, 64, 128)
#: the per-proposer k's of ngram-else-eagle the grid tries (capped at the trace's k_max); the best pair per batch
#: size is the baseline, chosen on the same traces as "the best fixed k"
SWITCH_KN = (4, 8, 12, 16, 20)
SWITCH_KE = (1, 2, 3, 4, 6)
LEARNED_SEEDS = (42, 43, 44, 45, 46)
#: candidate thresholds for out-of-sample tuning (``tune_rule``): around the defaults
RULE_GRID = tuple(dict(copy_run=c, decay=d, lcb=b) for c in (1, 2) for d in (0.8, 0.95) for b in (0.0, 0.5))
#: a spread (max - min over seeds) of adaptive-learned above this share of its mean is reported as unstable
UNSTABLE = 0.05


def adaptive_sets(available: Sequence[str], sets: Sequence[Sequence[str]] | None = None) -> list[list[str]]:
    """Proposer sets the policies run on for one model: ``sets`` (those the model has), or by default the study's
    pair, n-gram + its EAGLE-class partner (``combine_set``); ``sets="all"``: n-gram paired with each other."""
    if sets is not None and sets != "all":
        return [list(s) for s in sets if all(p in available for p in s)]
    if "ngram" not in available:
        return [sorted(available)] if len(available) > 1 else []
    if sets is None:
        pair = combine_set(available)
        return [pair] if len(pair) == 2 else []
    others = [p for p in available if p != "ngram"]
    return [["ngram", p] for p in sorted(others, key=lambda p: (p not in COMBINE_PARTNERS,
                                                                 COMBINE_PARTNERS.index(p) if p in COMBINE_PARTNERS
                                                                 else 0, p))]


def _switch_policies(kmax: int) -> list[str]:
    kn = sorted({min(k, kmax) for k in SWITCH_KN})
    ke = [k for k in SWITCH_KE if k <= kmax]
    return [f"ngram-else-eagle{s}-{a}-{b}" for s in ("", "-skip") for a in kn for b in ke]


def adaptive_grid(trace: Trace, cost_model, *, proposer_sets=None, batch_sizes: Sequence[int] = ADAPTIVE_BATCH_SIZES,
                  proposers: Sequence[str] | None = None, seeds: Sequence[int] = LEARNED_SEEDS,
                  oos_params: dict | None = None, **kw) -> pd.DataFrame:
    """Per model and proposer set (``adaptive_sets``): fixed k = 1..k_max and the oracle of each proposer of the
    set (its own drafting cost), Oracle Combine under ``winner`` / ``all`` (and ``ngram-only``), the baselines
    ``ngram-else-eagle[-skip]-KN-KE`` over ``SWITCH_KN`` x ``SWITCH_KE``, ``adaptive-rule`` with the default
    thresholds and, where ``oos_params`` ({model: RuleParams}) has one, with thresholds tuned on other traces
    (policy ``adaptive-rule-oos``), and ``adaptive-learned`` once per seed (column ``seed``). Columns ``set`` and
    ``seed`` are added. Extra keyword arguments go to ``simulate``."""
    from .simulate import simulate

    kw.setdefault("progress", False)
    Bs = tuple(int(b) for b in batch_sizes)
    parts = []
    for mdl in trace.models:
        tm = trace.select(model=mdl)
        kmax = int(tm.acc["k_max"].max())
        fixed = [f"fixed-{k}" for k in range(1, kmax + 1)] + ["oracle"]
        for props in adaptive_sets([p for p in tm.proposers if proposers is None or p in proposers], proposer_sets):
            name = "+".join(props)
            tp = tm.select(proposers=props)
            for p in props:
                parts.append(simulate(tm.select(proposers=[p]), cost_model, [p], fixed, batch_sizes=Bs,
                                      **kw).assign(set=name))
            parts.append(simulate(tp, cost_model, props, "oracle-combine", ["ngram-only", "winner", "all"]
                                  if "ngram" in props else ["winner", "all"], batch_sizes=Bs, **kw).assign(set=name))
            if "ngram" in props and len(props) == 2:
                parts.append(simulate(tp, cost_model, props, _switch_policies(kmax), batch_sizes=Bs,
                                      **kw).assign(set=name))
            parts.append(simulate(tp, cost_model, props, "adaptive-rule", batch_sizes=Bs, **kw).assign(set=name))
            if oos_params and mdl in oos_params:
                parts.append(simulate(tp, cost_model, props, "adaptive-rule", batch_sizes=Bs,
                                      adaptive_params=oos_params[mdl], **kw)
                             .assign(set=name, policy="adaptive-rule-oos"))
            for seed in seeds:
                parts.append(simulate(tp, cost_model, props, "adaptive-learned", batch_sizes=Bs, seed=int(seed),
                                      **kw).assign(set=name, seed=int(seed)))
    return pd.concat(parts, ignore_index=True)


def tune_rule(trace: Trace, cost_model, *, proposer_sets=None, batch_sizes: Sequence[int] = (1, 16, 64),
              grid: Sequence[dict] = RULE_GRID):
    """Thresholds of ``adaptive-rule`` chosen on ``trace`` alone: the candidate (``RULE_GRID`` around the defaults)
    with the highest mean log speedup over its (dataset, set, batch size) cells. Returns (RuleParams, table of
    every candidate's score). Evaluate the result on OTHER traces for an out-of-sample number."""
    import dataclasses

    from .adaptive import RuleParams
    from .simulate import simulate

    rows = []
    cands = [RuleParams()] + [dataclasses.replace(RuleParams(), **g) for g in grid]
    for prm in cands:
        logs = []
        for mdl in trace.models:
            tm = trace.select(model=mdl)
            for props in adaptive_sets(tm.proposers, proposer_sets):
                d = simulate(tm.select(proposers=props), cost_model, props, "adaptive-rule",
                             batch_sizes=tuple(batch_sizes), adaptive_params=prm, progress=False)
                logs.append(np.log(d["speedup"].to_numpy()))
        rows.append(dict(copy_run=prm.copy_run, decay=prm.decay, prior_a=prm.prior_a, prior_w=prm.prior_w,
                         probe=prm.probe, pool_w=prm.pool_w, lcb=prm.lcb, score=float(np.mean(np.concatenate(logs)))))
    table = pd.DataFrame(rows)
    return cands[int(table["score"].idxmax())], table


def out_of_sample_params(trace: Trace, cost_model, **kw) -> tuple[dict, pd.DataFrame]:
    """Per model of ``trace``: the thresholds ``tune_rule`` picks on the OTHER models' traces (leave one model
    out). Returns ({model: RuleParams}, one row per model naming what it was tuned on); {} with one model."""
    out, rows = {}, []
    models = list(trace.models)
    if len(models) < 2:
        return out, pd.DataFrame(columns=["model", "tuned_on", "copy_run", "decay", "lcb"])
    for mdl in models:
        others = [m for m in models if m != mdl]
        prm, _ = tune_rule(Trace.concat(trace.select(model=m) for m in others), cost_model, **kw)
        out[mdl] = prm
        rows.append(dict(model=mdl, tuned_on=", ".join(others), copy_run=prm.copy_run, decay=prm.decay,
                         lcb=prm.lcb))
    return out, pd.DataFrame(rows)


def _best(d: pd.DataFrame) -> pd.DataFrame:
    """Per batch size the row with the highest speedup."""
    return d.loc[d.groupby("batch_size")["speedup"].idxmax()].set_index("batch_size")


def adaptive_table(sim: pd.DataFrame) -> pd.DataFrame:
    """From ``adaptive_grid`` rows, per dataset, model, proposer set and batch size: the best fixed k of any
    proposer at ANY k (own drafting cost), the rule a user would run (best ``ngram-else-eagle`` pair; ``-skip``
    and not apart), ``adaptive-rule`` (default thresholds), ``adaptive-rule-oos`` (thresholds tuned on other
    traces, where run), ``adaptive-learned`` (mean, min, max over seeds, and whether its spread exceeds
    ``UNSTABLE`` of its mean), the best causal policy (the out-of-sample rule where run, else the default rule, or
    the learned mean if higher and stable) and Oracle Combine under ``winner`` (the bound for a policy that pays
    for what it ran) and ``all``; gap_closed = (best causal - best fixed) / (Oracle Combine winner - best fixed)."""
    out = []
    for (ds, mdl, st), g in sim.groupby(["dataset", "model", "set"], sort=True):
        fx = _best(g[g["policy"].str.startswith("fixed-")])
        sw = g[g["policy"].str.startswith("ngram-else-")]
        rule = _best(sw) if len(sw) else None
        rule_ns = _best(sw[~sw["policy"].str.contains("skip")]) if len(sw) else None
        oc = g[g["policy"] == "oracle-combine"]
        win = oc[oc["draft_cost"] == "winner"].set_index("batch_size")["speedup"]
        al = oc[oc["draft_cost"] == "all"].set_index("batch_size")["speedup"]
        ar = g[g["policy"] == "adaptive-rule"].set_index("batch_size")["speedup"]
        oos = g[g["policy"] == "adaptive-rule-oos"].set_index("batch_size")["speedup"]
        le = g[g["policy"] == "adaptive-learned"].groupby("batch_size")["speedup"]
        le_mean, le_min, le_max, le_n = le.mean(), le.min(), le.max(), le.count()
        for B in sorted(g["batch_size"].unique()):
            r = dict(dataset=ds, model=mdl, set=st, batch_size=int(B),
                     best_fixed=float(fx.loc[B, "speedup"]),
                     best_fixed_config=f"{fx.loc[B, 'proposers']} {fx.loc[B, 'policy']}",
                     rule=float(rule.loc[B, "speedup"]) if rule is not None else np.nan,
                     rule_config=str(rule.loc[B, "policy"]) if rule is not None else "",
                     rule_noskip=float(rule_ns.loc[B, "speedup"]) if rule_ns is not None else np.nan,
                     adaptive_rule=float(ar.get(B, np.nan)), adaptive_rule_oos=float(oos.get(B, np.nan)),
                     learned_mean=float(le_mean.get(B, np.nan)), learned_min=float(le_min.get(B, np.nan)),
                     learned_max=float(le_max.get(B, np.nan)), learned_seeds=int(le_n.get(B, 0)),
                     combine_winner=float(win.get(B, np.nan)), combine_all=float(al.get(B, np.nan)))
            r["learned_spread"] = (r["learned_max"] - r["learned_min"]) / r["learned_mean"]
            r["learned_unstable"] = bool(r["learned_spread"] > UNSTABLE) if np.isfinite(r["learned_spread"]) else False
            cands = {"adaptive-rule-oos" if np.isfinite(r["adaptive_rule_oos"]) else "adaptive-rule":
                     r["adaptive_rule_oos"] if np.isfinite(r["adaptive_rule_oos"]) else r["adaptive_rule"]}
            if np.isfinite(r["learned_mean"]) and not r["learned_unstable"]:
                cands["adaptive-learned"] = r["learned_mean"]
            pol = max(cands, key=cands.get)
            r.update(best_causal_policy=pol, best_causal=float(cands[pol]))
            bf, ow = r["best_fixed"], r["combine_winner"]
            r["gap_closed"] = (r["best_causal"] - bf) / (ow - bf) if ow > bf else np.nan
            r["rule_gap_closed"] = (r["rule"] - bf) / (ow - bf) if ow > bf else np.nan
            r["causal_vs_rule"] = r["best_causal"] / r["rule"]
            r["causal_vs_fixed"] = r["best_causal"] / bf
            out.append(r)
    return pd.DataFrame(out)


def adaptive_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per dataset, model and set, from ``adaptive_table``: the smallest batch size's row, plus over every batch
    size the best causal policy's worst ratio to the rule and to the best fixed k, and whether a causal policy
    beats the rule at all (the bar: >= 1.05x at the smallest batch, >= 0.98x everywhere)."""
    out = []
    for key, g in table.groupby(["dataset", "model", "set"], sort=True):
        g = g.sort_values("batch_size")
        r = g.iloc[0].to_dict()
        r.update(worst_vs_rule=float(g["causal_vs_rule"].min()),
                 worst_vs_rule_batch=int(g.loc[g["causal_vs_rule"].idxmin(), "batch_size"]),
                 worst_vs_fixed=float(g["causal_vs_fixed"].min()),
                 worst_vs_fixed_batch=int(g.loc[g["causal_vs_fixed"].idxmin(), "batch_size"]),
                 beats_rule=bool(r["causal_vs_rule"] >= 1.05 and g["causal_vs_rule"].min() >= 0.98),
                 learned_unstable_any=bool(g["learned_unstable"].any()),
                 learned_spread_max=float(g["learned_spread"].max()),
                 batch_sizes=f"{int(g['batch_size'].min())}-{int(g['batch_size'].max())}")
        out.append(r)
    return pd.DataFrame(out)


def adaptive_report(traces=None, cost_model="llama3.1-8b-h100-per-token", *, model: str | None = None,
                    datasets: Sequence[str] | None = None, proposer_sets=None,
                    batch_sizes: Sequence[int] = ADAPTIVE_BATCH_SIZES, out_of_sample: bool = True,
                    **kw) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The report in one call: load the traces (``load_traces``), give every proposer a drafting model
    (``cost_model_for``), tune the rule's thresholds per model on the other models' traces (``out_of_sample``,
    with two models or more), run ``adaptive_grid`` and tabulate it. Returns (rows, per-batch table, summary)."""
    trace = load_traces(traces, model=model, datasets=datasets)
    cm, _ = cost_model_for(trace, cost_model)
    oos = out_of_sample_params(trace, cm, proposer_sets=proposer_sets)[0] if out_of_sample else {}
    sim = adaptive_grid(trace, cm, proposer_sets=proposer_sets, batch_sizes=batch_sizes, oos_params=oos, **kw)
    table = adaptive_table(sim)
    return sim, table, adaptive_summary(table)


# ---- the drafter's confidence against the tuned rule (spec_repro.baselines: conf-stop, -skip-conf) --------------
#: thresholds T and caps K of the confidence stop that ``out_of_sample_policy`` chooses among
CONF_TS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7)
CONF_KS = (4, 8, 16)


def out_of_sample_policy(trace: Trace, cost_model, proposers: Sequence[str], candidates: Sequence[str], *,
                         batch_sizes: Sequence[int] = (1,)) -> tuple[dict, pd.DataFrame]:
    """Per dataset of ``trace`` (one model): the candidate policy with the highest mean log speedup over the OTHER
    datasets' (dataset, batch size) cells (leave one workload out, as ``out_of_sample_params`` leaves one model
    out). Returns ({dataset: policy}, one row per dataset naming the choice and what it was tuned on); {} with one
    dataset."""
    from .simulate import simulate

    ds_all = sorted(trace.acc["dataset"].astype(str).unique())
    if len(ds_all) < 2:
        return {}, pd.DataFrame(columns=["dataset", "tuned_on", "policy", "score"])
    logs = {}
    for ds in ds_all:
        d = simulate(trace.select(dataset=ds, proposers=list(proposers)), cost_model, list(proposers),
                     list(candidates), batch_sizes=tuple(batch_sizes), progress=False)
        logs[ds] = np.log(d["speedup"].to_numpy()).reshape(len(candidates), -1).mean(axis=1)
    out, rows = {}, []
    for ds in ds_all:
        others = [o for o in ds_all if o != ds]
        score = np.mean([logs[o] for o in others], axis=0)
        i = int(np.argmax(score))
        out[ds] = candidates[i]
        rows.append(dict(dataset=ds, tuned_on=", ".join(others), policy=candidates[i], score=float(score[i])))
    return out, pd.DataFrame(rows)


def confidence_table(trace: Trace, cost_model, *, proposers: Sequence[str] = ("ngram", "eagle"),
                     batch_size: int = 1) -> pd.DataFrame:
    """Per dataset of ``trace`` (one model; its datasets >= 2): every causal policy against the rule tuned the same
    way, at one batch size. ``rule``: the ``ngram-else-eagle-skip`` pair chosen out of sample (on the other
    datasets, ``SWITCH_KN`` x ``SWITCH_KE``); ``adaptive_rule`` (default thresholds); where the trace has the model
    proposer's confidence, ``conf_stop`` (EAGLE alone, its T and K chosen out of sample over ``CONF_TS`` x
    ``CONF_KS``) and ``skip_conf`` (the skip rule with the stop, KN, T, K chosen out of sample); ``ceiling``: the
    skip rule with a perfect stop (``-KN-oracle-K``, the tuned rule's KN, K = k_max): what the confidence signal
    could give at best; ``x_rule`` columns: each over the tuned rule."""
    from .baselines import conf_name, parse_switch
    from .simcore import is_ngram
    from .simulate import simulate

    props = list(proposers)
    mo = next(q for q in props if not is_ngram(q))
    kmax = int(trace.acc["k_max"].max())
    kn = sorted({min(k, kmax) for k in SWITCH_KN})
    ks = [k for k in CONF_KS if k <= kmax]
    rules, _ = out_of_sample_policy(trace, cost_model, props,
                                    [f"ngram-else-eagle-skip-{a}-{b}" for a in kn for b in SWITCH_KE if b <= kmax],
                                    batch_sizes=(batch_size,))
    has_conf = mo in trace.confidence_proposers
    if has_conf:
        stops, _ = out_of_sample_policy(trace, cost_model, [mo], [conf_name("conf-stop", 0, t, k) for t in CONF_TS
                                                                  for k in ks], batch_sizes=(batch_size,))
        skips, _ = out_of_sample_policy(trace, cost_model, props,
                                        [conf_name("ngram-else-eagle-skip-conf", a, t, k) for a in kn
                                         for t in CONF_TS for k in ks], batch_sizes=(batch_size,))
    rows = []
    for ds, rule in rules.items():
        t = trace.select(dataset=ds, proposers=props)
        a = parse_switch(rule)[1]
        pols = [rule, "adaptive-rule", conf_name("ngram-else-eagle-skip-conf", a, None, kmax)]
        if has_conf:
            pols += [skips[ds]]
        d = simulate(t, cost_model, props, pols, batch_sizes=(batch_size,), progress=False).set_index("policy")
        r = dict(dataset=ds, model=str(t.acc["model"].iloc[0]), batch_size=int(batch_size), rule_config=rule,
                 rule=float(d.loc[rule, "speedup"]), adaptive_rule=float(d.loc["adaptive-rule", "speedup"]),
                 ceiling_config=pols[2], ceiling=float(d.loc[pols[2], "speedup"]),
                 skip_conf_config=skips[ds] if has_conf else "", conf_stop_config=stops[ds] if has_conf else "",
                 skip_conf=float(d.loc[skips[ds], "speedup"]) if has_conf else np.nan, conf_stop=np.nan)
        if has_conf:
            r["conf_stop"] = float(simulate(trace.select(dataset=ds, proposers=[mo]), cost_model, [mo], stops[ds],
                                            batch_sizes=(batch_size,), progress=False)["speedup"].iloc[0])
        for c in ("adaptive_rule", "conf_stop", "skip_conf", "ceiling"):
            r[f"{c}_x_rule"] = r[c] / r["rule"]
        rows.append(r)
    return pd.DataFrame(rows)
