"""A cost model of vLLM's V2 model runner (vLLM's default) fitted on the v2grid's uninstrumented runs, and EAGLE's
throughput on V2 predicted from it beside what was measured (``data/gpu/v2grid/predicted.csv``).

A run records only its wall time, output tokens and vLLM's spec-decode counters, so its steps are counted, not
timed: steps = 1 (the prefill) + the decode steps of a request, 255 for no SD (256 output tokens, EOS ignored: every
request decodes all of them, all together) and num_drafts / B for EAGLE (vLLM drafts for every running request once
a decode step). The prefill is priced as one step: what it costs beyond a decode step is spread over the run's steps
(more per step for EAGLE, which has fewer). num_drafts / B is the mean request's decode steps, while a batch runs
until its slowest request is done: the per-request part of the step time is counted exactly, its fixed part over
the tail steps (fewer requests running) is not, which inflates the fixed part by max / mean steps at B > 1 (1.14 /
1.26 / 1.24 at bs 8 / 32 / 64 in the V1 live run's step logs, EAGLE k = 5, code-edit). A point (method, k,
workload, batch size) pools its runs: per-step time = their wall time over their steps. Only uncontended runs
(hypervisor steal share < ``v2grid.CLEAN_STEAL``) are fitted.

EAGLE's drafting is a per_token drafter with a per-request term: c_step + c_step_req * B + k * (c_tok * B + c0).
On V2 EAGLE's step time at a batch size hardly changes with k (the committed uncontended runs at bs 64: 7.09 ms at
k = 1 on sharegpt, 7.56 at k = 2 on code-edit, 6.84 at k = 3 on sharegpt, beside no SD's 2.85-2.98 ms): what it
costs over no SD is ~1.4 ms plus ~0.02-0.03 ms per request whatever k. Without c_step_req the growth with B can
only go into k * c_tok * B, which prices large k too high at large batches and small k too low.

    python -m spec_repro.engines.vllm.v2fit fit [--check]     # the preset and predicted.csv, a summary
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from ...costmodel import PRESET_DIR, CostModel, CostModelError, Drafter, _lstsq, same_fit
from ...locations import data_dir
from .steps import H200_HBM_BYTES_PER_S, model_dims
from .v2grid import CLEAN_STEAL

NAME = "qwen2.5-coder-1.5b-h200-v2"
PRESET = PRESET_DIR / f"{NAME}.json"
HARDWARE = ("1x NVIDIA H200 (141 GB), vLLM 0.25.0, V2 runner (vLLM's default), async scheduling, CUDA graphs, bf16, "
            "real weights")
SOURCE = (
    "vLLM 0.25.0 as it runs by default (V2 model runner, async scheduling, CUDA graphs, uninstrumented), bf16, real "
    "weights of Qwen/Qwen2.5-Coder-1.5B-Instruct and the package's EAGLE-1 head (data/heads/qwen2.5-coder-1.5b-eagle), "
    "one NVIDIA H200: data/gpu/v2grid/runs.csv, code-edit and sharegpt, bs 1 / 8 / 32 / 64, 256 output tokens a "
    "request (EOS ignored), greedy; uncontended runs only (hypervisor steal share < {clean}): {used}. Per run only "
    "wall time and vLLM's counters: steps = 1 (the prefill, priced as one step) + decode steps per request (255 for "
    "no SD, num_drafts / B for EAGLE: the mean request's; the tail steps of a batch whose requests finish apart are "
    "missed), a point's (workload, B, k) step time = its runs' wall time / their steps. Target F(n) = c_tok * n + c0 "
    "on no SD's points (n = B tokens a step); c_kv = 0 (the records hold one prompt length a chunk, its first "
    "request's, not the batch's KV: the per-request KV read is in c_tok); overhead = 0 (c0 holds the whole fixed "
    "step time: forward and host work are not separable from wall times and every step pays both). EAGLE "
    "(per_token: c_step + c_step_req * B + k * (c_tok * B + c0)) on the EAGLE points' step time minus F(B * (k + "
    "1)): c_step + c_step_req * B is the EAGLE path's work per step whatever k, a fixed part and one per request "
    "in the step (on V2, EAGLE's step time grows with the batch size but hardly with k), k * (...) what grows "
    "with the tokens drafted. Both by non-negative least squares on relative error. Regenerate: python -m "
    "spec_repro.engines.vllm.v2fit fit")
MODEL_CONFIG = Path("gpu") / "configs" / "qwen25_coder_1p5b"


def v2grid_dir() -> Path:
    return data_dir() / "gpu" / "v2grid"


COLUMNS = ("method", "k", "workload", "batch_size", "output_tokens", "wall_s", "num_drafts", "num_accepted_tokens",
           "host_steal_s", "steal_share")


def _runs(runs) -> pd.DataFrame:
    """The no-SD and EAGLE runs on V2 of a runs.csv (a path, a DataFrame, None: the committed one), with ``steps``
    (the estimate above) and ``clean`` (steal share known and under CLEAN_STEAL)."""
    r = pd.read_csv(v2grid_dir() / "runs.csv" if runs is None else runs) if not isinstance(runs, pd.DataFrame) \
        else runs.copy()
    missing = [c for c in COLUMNS if c not in r]
    if missing:
        raise CostModelError(f"v2fit: the runs lack columns {missing} (a v2grid runs.csv: v2grid summarize)")
    r = r[r["method"].isin(["none", "eagle"]) & (r["runner"] == "v2" if "runner" in r else True)].copy()
    B = r["batch_size"].astype(float)
    r["steps"] = 1 + np.where(r["method"] == "eagle", r["num_drafts"] / B, r["output_tokens"] / B - 1)
    r["clean"] = r["steal_share"] < CLEAN_STEAL
    return r


def points(runs=None) -> pd.DataFrame:
    """Runs pooled per method, k, workload, batch size and ``contended`` (not clean): runs, output_tokens, wall_s,
    steps and host_steal_s summed; t_step (s) = wall / steps, tok_s = tokens / wall, steal_share = steal / wall,
    acceptance_length = 1 + accepted / drafts, steps_per_run (mean)."""
    r = _runs(runs).assign(contended=lambda d: ~d["clean"], n=1)
    p = r.groupby(["method", "k", "workload", "batch_size", "contended"], as_index=False).agg(
        runs=("n", "sum"), output_tokens=("output_tokens", "sum"), wall_s=("wall_s", "sum"), steps=("steps", "sum"),
        host_steal_s=("host_steal_s", "sum"), drafts=("num_drafts", "sum"), accepted=("num_accepted_tokens", "sum"))
    p["t_step"] = p["wall_s"] / p["steps"]
    p["tok_s"] = p["output_tokens"] / p["wall_s"]
    p["steal_share"] = p["host_steal_s"] / p["wall_s"]
    p["acceptance_length"] = (1 + p["accepted"] / p["drafts"]).where(p["drafts"] > 0)
    p["steps_per_run"] = p["steps"] / p["runs"]
    return p.drop(columns=["drafts", "accepted"])


def step_time(model: CostModel, B, k):
    """Seconds of a decode step of B requests each verifying k + 1 tokens (k = 0: no SD), priced as the simulator
    prices a batch step of identical requests: F(kv, B * (k + 1)) + EAGLE's drafting (k > 0) + overhead, kv = 0."""
    B, k = np.asarray(B, float), np.asarray(k, float)
    F = model.forward(0.0, B * (k + 1))
    draft = model.drafter("eagle").time(0.0, k + 1, F, B, k) if "eagle" in model.drafters else 0.0
    return F + np.where(k > 0, draft, 0.0) + model.overhead


def _nnls_rel(X, y, t, what):
    """Non-negative least squares of X @ c = y, each row's error relative to the point's step time t."""
    return _lstsq(X / t[:, None], y / t, what)


def fit_v2(runs=None, drop_k: int | None = None) -> CostModel:
    """Preset ``qwen2.5-coder-1.5b-h200-v2`` (``SOURCE`` says how) from a v2grid runs.csv (None: the committed one);
    ``drop_k``: EAGLE's runs at that k left out (the leave-one-k-out model, named ``...-without-k<k>``)."""
    p0 = points(runs)
    p = p0[~p0["contended"]]
    none, eagle = p[p["method"] == "none"], p[(p["method"] == "eagle") & (p["k"] != drop_k)]
    if none.empty:
        raise CostModelError(f"fit_v2: no uncontended no-SD runs (method 'none', steal share < {CLEAN_STEAL}): the "
                             f"target forward is fitted on them")
    if eagle.empty:
        raise CostModelError("fit_v2: no uncontended EAGLE runs" + (f" at k other than {drop_k}" if drop_k else ""))
    B, t = none["batch_size"].to_numpy(float), none["t_step"].to_numpy()
    c_tok, c0 = _nnls_rel(np.column_stack([B, np.ones_like(B)]), t, t, "target forward (no-SD points)")
    base = CostModel(NAME, 0.0, float(c_tok), float(c0), 0.0, target_model="Qwen/Qwen2.5-Coder-1.5B-Instruct",
                     hardware=HARDWARE)
    B, k, t = (eagle[c].to_numpy(float) for c in ("batch_size", "k", "t_step"))
    d_tok, d0, c_step, c_step_req = _nnls_rel(np.column_stack([k * B, k, np.ones_like(k), B]),
                                              t - base.forward(0.0, B * (k + 1)), t, "EAGLE drafting (EAGLE points)")
    m = replace(base, drafters={"eagle": Drafter("per_token", 0.0, float(d_tok), float(d0), c_step=float(c_step),
                                                 catch_up=1.0, c_step_req=float(c_step_req))})
    ks = sorted(int(x) for x in set(eagle["k"]))
    idle = sorted(int(x) for x in set(p0.loc[p0["method"] == "eagle", "k"]) - set(ks) - {drop_k})
    used = (f"{int(none['runs'].sum())} runs of v2grid-none-k0 ({len(none)} points) and {int(eagle['runs'].sum())} of "
            f"v2grid-eagle-k{{{','.join(map(str, ks))}}} ({len(eagle)} points, k = {', '.join(map(str, ks))}"
            + (f"; none at k = {', '.join(map(str, idle))} was uncontended" if idle else "")
            + (f"; k = {drop_k} left out" if drop_k is not None else "") + ")")
    rel = {n: float(np.sqrt(np.mean((g["t_step"].to_numpy() / step_time(m, g["batch_size"], g["k"]) - 1) ** 2)))
           for n, g in (("none", none), ("eagle", eagle))}
    fit = {"clean_steal": CLEAN_STEAL, "runs": {"none": int(none["runs"].sum()), "eagle": int(eagle["runs"].sum())},
           "points": {"none": len(none), "eagle": len(eagle)}, "eagle_k": ks,
           "batch_sizes": sorted(int(x) for x in set(p["batch_size"])), "rms_rel": rel, **hbm_floor()}
    if drop_k is not None:
        fit["left_out_k"] = int(drop_k)
    return replace(m, name=NAME if drop_k is None else f"{NAME}-without-k{drop_k}", fit=fit,
                   source=SOURCE.format(clean=CLEAN_STEAL, used=used)).validate()


def hbm_floor(config=None, hbm: float = H200_HBM_BYTES_PER_S) -> dict:
    """The target's weights (``model_dims``: all, and those a decode step streams: all but the gathered embedding
    rows) and the streamed bytes over the H200's HBM bandwidth: a decode step's floor (s)."""
    d = model_dims(data_dir() / MODEL_CONFIG if config is None else config)
    return {"weight_bytes": d["weight_bytes"], "streamed_weight_bytes": d["streamed_weight_bytes"],
            "hbm_bytes_per_s": hbm, "hbm_floor_s": d["streamed_weight_bytes"] / hbm}


def prediction_table(runs=None) -> pd.DataFrame:
    """Per EAGLE point (uncontended and contended runs apart): measured tok/s beside the prediction B * 256 / (steps *
    t_step) with the measured steps and t_step from the model fitted without that k's runs (``predicted_tok_s``,
    ``ratio`` = measured / predicted) and from the model fitted on all (``in_sample_tok_s``, ``ratio_in_sample``)."""
    p = points(runs)
    p = p[p["method"] == "eagle"].sort_values(["contended", "k", "workload", "batch_size"]).reset_index(drop=True)
    full = fit_v2(runs)
    loko = {k: fit_v2(runs, drop_k=k) for k in sorted(set(p["k"]))}
    t_in = step_time(full, p["batch_size"], p["k"])
    t_out = np.array([float(step_time(loko[k], b, k)) for k, b in zip(p["k"], p["batch_size"])])
    out = p[["workload", "batch_size", "k", "contended", "steal_share", "runs", "acceptance_length", "steps_per_run"]]
    return out.assign(measured_tok_s=p["tok_s"], predicted_tok_s=p["tok_s"] * p["t_step"] / t_out,
                      ratio=t_out / p["t_step"], in_sample_tok_s=p["tok_s"] * p["t_step"] / t_in,
                      ratio_in_sample=t_in / p["t_step"], t_step_ms=p["t_step"] * 1e3, t_pred_ms=t_out * 1e3,
                      t_in_sample_ms=t_in * 1e3)


def summary(model: CostModel, table: pd.DataFrame, none_bs1_s: float) -> str:
    """The coefficients (ms), how the uncontended points fare, how far the contended ones fall (by steal share),
    and the HBM floor beside no SD's bs-1 step."""
    d, f = model.drafters["eagle"], model.fit
    lines = [f"{model.name}: F(n) = {model.c_tok * 1e3:.5f} ms * n + {model.c0 * 1e3:.3f} ms; EAGLE drafting = "
             f"{d.c_step * 1e3:.3f} ms + {d.c_step_req * 1e3:.5f} ms * B + k * ({d.c_tok * 1e3:.5f} ms * B + "
             f"{d.c0 * 1e3:.3f} ms); overhead 0"]
    u = table[~table["contended"]]
    if len(u):
        worst = ", ".join(f"k = {r['k']} {r['workload']} bs {r['batch_size']} {r['ratio']:.2f}x"
                          for r in (u.loc[u["ratio"].idxmax()], u.loc[u["ratio"].idxmin()]))
        lines.append(f"uncontended EAGLE points: {int((u['ratio'] - 1).abs().le(0.1).sum())} of {len(u)} within 10% "
                     f"of the leave-one-k-out prediction ({int((u['ratio_in_sample'] - 1).abs().le(0.1).sum())} in "
                     f"sample); worst (measured / predicted): {worst}")
    for lo, hi in ((CLEAN_STEAL, 0.1), (0.1, np.inf)):
        c = table[table["contended"] & table["steal_share"].between(lo, hi, inclusive="left")]
        if len(c):
            share = f"{lo:g}-{hi:g}" if np.isfinite(hi) else f">= {lo:g}"
            lines.append(f"contended EAGLE points, steal share {share}: {len(c)}, measured median "
                         f"{c['ratio'].median():.2f}x the prediction ({c['ratio'].min():.2f}-{c['ratio'].max():.2f})")
    lines.append(f"HBM floor of a decode step: {f['streamed_weight_bytes'] / 1e9:.2f} GB streamed ("
                 f"{f['weight_bytes'] / 1e9:.2f} GB of weights, the embedding gathered) / "
                 f"{f['hbm_bytes_per_s'] / 1e12:.1f} TB/s = {f['hbm_floor_s'] * 1e3:.3f} ms, "
                 f"{f['hbm_floor_s'] / none_bs1_s:.0%} of no SD's bs-1 step ({none_bs1_s * 1e3:.3f} ms measured)")
    return "\n".join(lines)


def write(runs=None, preset: Path = PRESET, table: Path | None = None, check: bool = False) -> tuple[bool, str]:
    """Fit, write the preset and predicted.csv (``check``: write nothing) and return whether both already held
    the same (the preset's numbers to 1e-9 relative: ``same_fit``) and the summary."""
    from ...io import atomic_write

    table = v2grid_dir() / "predicted.csv" if table is None else Path(table)
    model, tab = fit_v2(runs), prediction_table(runs)
    text = json.dumps(model.to_dict(), indent=2) + "\n"
    csv = tab.to_csv(index=False, float_format="%.6g")
    same = (Path(preset).is_file() and same_fit(json.loads(Path(preset).read_text()), json.loads(text))
            and table.is_file() and table.read_text() == csv)
    if not check and not same:
        for path, body in ((Path(preset), text), (table, csv)):
            with atomic_write(path) as f:
                f.write(body)
    man = table.parent / "MANIFEST.json"
    if not check and man.is_file():                   # the grid's manifest lists the table with its sha256
        import hashlib

        m = json.loads(man.read_text())
        entry = {"file": table.name, "sha256": hashlib.sha256(csv.encode()).hexdigest(),
                 "what": f"EAGLE alone on V2 predicted by the {NAME} preset (leave-one-k-out and in sample) beside "
                         "what was measured (python -m spec_repro.engines.vllm.v2fit fit)"}
        if m.get(table.name) != entry:
            with atomic_write(man) as f:
                f.write(json.dumps({**m, table.name: entry}, indent=1, default=str) + "\n")
    none = points(runs).query("method == 'none' and batch_size == 1 and not contended")
    return same, summary(model, tab, float(none["wall_s"].sum() / none["steps"].sum()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spec_repro.engines.vllm.v2fit", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fit", help=f"write preset {NAME} and data/gpu/v2grid/predicted.csv from the v2grid runs")
    f.add_argument("--runs", default=None, help="a v2grid runs.csv (default: data/gpu/v2grid/runs.csv)")
    f.add_argument("--out", default=str(PRESET), help=f"the preset file (default {PRESET})")
    f.add_argument("--table", default=None, help="the prediction table (default: data/gpu/v2grid/predicted.csv)")
    f.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file differs from the refit")
    a = ap.parse_args(argv)
    try:
        same, text = write(a.runs, Path(a.out), a.table, a.check)
    except (CostModelError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(text)
    print(f"{a.out}, predicted.csv: " + ("match the refit" if same else "DIFFER FROM the refit" if a.check
                                          else "written"))
    return 1 if a.check and not same else 0


if __name__ == "__main__":
    raise SystemExit(main())
