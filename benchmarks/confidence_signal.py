"""Why no causal confidence stop beats the tuned n-gram-else-EAGLE rule on the committed Qwen traces: what the EAGLE
head's own confidence (``Trace.confidence``, teacher-forced with the head of the traces' ``eagle`` column) tells
about acceptance, and where the ceiling's gain comes from.

Per workload (code-edit, sharegpt; bs 1, per-token pricing with the V2 preset ``qwen2.5-coder-1.5b-h200-v2``,
n-gram's drafting priced as in the V1 preset, a fraction of a forward):

- calibration: the mean running product of the head's probabilities at draft depth d against the share of positions
  whose d-th draft is accepted (acc_len > d), d = 1..4;
- discrimination: ROC AUC, among positions whose first d - 1 drafts were accepted, of the d-th draft's acceptance
  by the running product and by the d-th token's own probability, d = 1..8;
- the tuned rule (its k pair chosen on the other Qwen workloads, ``grids.confidence_table``), every stop policy
  against it: the confidence stop chosen out of sample, the best one in sample over T x K (a bound on any
  threshold on the running product), and the ceiling (a perfect stop) capped at the rule's k, 4, 8 and 16.

    PYTHONPATH=. python benchmarks/confidence_signal.py      # ~1 min on 2 cores

Prints one JSON object and writes it to ``benchmarks/results/confidence_signal.json``.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "confidence_signal.json"
MODEL, COST, NGRAM_FROM = "qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-h200-v2", "qwen2.5-coder-1.5b-h200"
WORKLOADS = ("code-edit", "sharegpt")
TS, KS, CAPS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5), (4, 8, 16), (4, 8, 16)


def signal(trace) -> dict:
    """Calibration and discrimination of the head's confidence over every output position of ``trace``."""
    from sklearn.metrics import roc_auc_score

    conf, acc = trace.confidence("eagle"), trace.arrays("eagle")
    C = np.concatenate([conf[k] for k in acc])
    A = np.concatenate([acc[k] for k in acc])
    P = np.cumprod(np.nan_to_num(C, nan=0.0), axis=1)
    out = {"positions": int(len(A)), "calibration": [], "auc": []}
    for d in range(1, 5):
        m = ~np.isnan(C[:, d - 1])
        out["calibration"].append({"depth": d, "mean_running_product": round(float(P[m, d - 1].mean()), 3),
                                   "accepted": round(float((A[m] > d).mean()), 3)})
    for d in range(1, 9):
        m = (A >= d) & ~np.isnan(C[:, d - 1])          # the first d - 1 drafts accepted: the d-th is read
        y = A[m] > d
        out["auc"].append({"depth": d, "reached": int(m.sum()), "accepted_given_reached": round(float(y.mean()), 3),
                           "running_product": round(float(roc_auc_score(y, P[m, d - 1])), 3),
                           "own_probability": round(float(roc_auc_score(y, C[m, d - 1])), 3)})
    return out


def main() -> int:
    from spec_repro.baselines import conf_name, parse_switch
    from spec_repro.costmodel import load_cost_model
    from spec_repro.grids import confidence_table, cost_model_for
    from spec_repro.paths import load_traces
    from spec_repro.simulate import simulate

    traces = load_traces(None, model=MODEL)
    ng = load_cost_model(NGRAM_FROM).drafter("ngram")
    cm, notes = cost_model_for(traces, COST, standins={"ngram": ng.fraction})
    table = confidence_table(traces, cm).set_index("dataset")
    res = {"model": MODEL, "cost_model": COST, "ngram_drafting": f"{ng.fraction:.4f} of a forward per drafted token "
           f"(from {NGRAM_FROM})", "batch_size": 1, "notes": notes, "workloads": {}}
    for w in WORKLOADS:
        t = traces.select(dataset=w, proposers=["ngram", "eagle"])
        row = table.loc[w]
        _, kn, ke = parse_switch(row["rule_config"])
        stops = [conf_name("ngram-else-eagle-skip-conf", kn, T, K) for T in TS for K in KS]
        caps = [conf_name("ngram-else-eagle-skip-conf", kn, None, K) for K in (ke, *CAPS)]
        d = simulate(t, cm, ["ngram", "eagle"], [row["rule_config"], *stops, *caps], batch_sizes=(1,),
                     progress=False).set_index("policy")["speedup"]
        rule = float(d[row["rule_config"]])
        best = max(stops, key=lambda p: d[p])
        res["workloads"][w] = {
            "signal": signal(t),
            "tuned_rule": {"policy": row["rule_config"], "speedup": round(rule, 3)},
            "x_tuned_rule": {
                "adaptive_rule": round(float(row["adaptive_rule_x_rule"]), 3),
                "confidence_stop_out_of_sample": {"policy": row["skip_conf_config"],
                                                  "x": round(float(row["skip_conf_x_rule"]), 3)},
                "confidence_stop_best_in_sample": {"policy": best, "x": round(float(d[best]) / rule, 3)},
                "ceiling_by_cap": {str(K): round(float(d[p]) / rule, 3) for K, p in zip((ke, *CAPS), caps)}}}
    text = json.dumps(res, indent=1)
    OUT.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
