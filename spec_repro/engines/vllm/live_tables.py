"""A live folder's measured-vs-predicted tables: the predictor against the measured tok/s
(``measured_vs_predicted``, ``predicted_padded``), the device-side hybrid's comparison per batch size
(``device_hybrid_table``, paired repeat by repeat: ``paired_ratios``), and the prediction tables recomputed in place
(``retable``)."""
from __future__ import annotations

import re
from pathlib import Path

from ...io import write_via
from .hybrid_jobs import split_k
from .live_model import FIT_CONFIGS, fit_step_model, predict, predict_runs
from .live_profile import load_profiles
from .live_runs import COMMITTED, QWEN, TIMED, read_runs, select_rows, whole_repeats
from .live_throughput import throughput


def measured_vs_predicted(out: str | Path = COMMITTED, profiles_path=None):
    """Measured tok/s (``throughput``, mean of 3 repeats, with min and max) beside three predictions over the
    run's own outputs (``hybrid_trace.jsonl``), every cost model fitted on the run's steps:
    ``one_F``: one target forward for every batch (the package's cost-model form, as ``costmodel.fit`` fits it),
    no SD / EAGLE / n-gram alone; ``ragged``: + a second forward for ragged batches; ``mended``: + the hybrid's
    own per-step work, fitted on the OTHER hybrid (pr24344's term predicts pr24344-skip and the reverse), so
    both hybrids stay out of sample. ``ratio_*`` = measured / predicted."""
    prof = load_profiles(profiles_path)
    t = throughput(out=out)
    res = t[t["model"] == "qwen2.5-coder-1.5b"][["config", "batch_size", "tok_s", "tok_s_min", "tok_s_max"]]
    parts = {"one_F": predict(prof, fit_step_model(out, ragged=False)),
             "ragged": predict(prof, fit_step_model(out, ragged=True))}
    mended = [predict(prof, fit_step_model(out, ragged=True), configs=FIT_CONFIGS)]
    for fit_on, pred in (("pr24344-skip", "pr24344"), ("pr24344", "pr24344-skip")):
        mended.append(predict(prof, fit_step_model(out, ragged=True, hybrid_configs=(fit_on,)), configs=(pred,)))
    import pandas as pd

    parts["mended"] = pd.concat(mended, ignore_index=True)
    for name, p in parts.items():
        p = p.rename(columns={"predicted_tok_s": f"pred_{name}"})[["config", "batch_size", f"pred_{name}"] +
                                                                    (["predicted_ragged_share"] if name == "ragged" else [])]
        res = res.merge(p, on=["config", "batch_size"])
        res[f"ratio_{name}"] = res["tok_s"] / res[f"pred_{name}"]
    return res.rename(columns={"predicted_ragged_share": "ragged_share"}).reset_index(drop=True)


def predicted_padded(out: str | Path, profiles_path=None, idle: str = "eagle-only",
                     hybrids=("pr24344-pad", "pr24344-skip-pad"), per_bs: bool = False, host_scaled: bool = False,
                     workload: str = "code-edit", select: dict | None = None, shape: bool = False):
    """The GPU profile's run (its ``live`` folder: no SD, EAGLE, the idle hybrid, the padded hybrids) beside the
    predictor over ``hybrid_trace.jsonl`` (the same 64 code-edit requests' no-SD outputs,
    data/gpu/v1-runner/agreement's):
    the step model fitted on this run's no SD and EAGLE steps, the hybrid's own per-step work fitted on the idle
    hybrid (``eagle-only``: the same lookups, bookkeeping and host reads, every request on EAGLE), so both padded
    hybrids are predicted out of sample. ``ratio`` = measured / predicted; ``per_bs``: also the prediction with
    per-batch-size host terms (``predicted_per_bs_tok_s``, ``ratio_per_bs``); ``host_scaled``: also each run
    predicted at its own host speed (``predict_runs`` with ``fit_step_model(host_scaled=True)``, the same split in
    sample / out of sample; ``predicted_host_tok_s``, ``ratio_host``): the hybrid's host index is read from its
    own runs' t_other, its drafting from the idle hybrid's fitted term. EAGLE alone at another k (``eagle-k<N>``, an
    engine of its own) is predicted out of sample by the EAGLE path's terms; a hybrid at another k (``hybrids``
    may name ``<hybrid>-k<N>``) by them and its idle counterpart's term. ``workload``: the runs, steps and fits of
    that workload (``profiles_path`` then the profile of its requests). ``idle`` may map each hybrid to its own
    idle configuration (None: no hybrid term, the EAGLE path's terms alone), e.g. data/gpu/v1-runner/adaptive-rule's
    ``{"adaptive-rule-pad": "eagle-only-pad", "gpu-pr24344": None}``: the host-side machinery's term for the
    host-side policy, none for the device-side one (its idle counterpart did not run there). ``select``: the runs
    and steps measured and fitted (default: every run measured, the forced V1 runner's fitted). ``shape``: also
    the prediction from each step phase measured at its k and batch size (``fit_step_model(per_shape=True)``, fitted
    on no SD and EAGLE alone at every k the run has, so ``eagle-k<N>`` is in sample there; the hybrid's own term its
    idle configuration's whole host step beyond EAGLE's; the prefill in vLLM's chunks): ``predicted_shape_tok_s``,
    ``ratio_shape``, ``shape_fitted_on``."""
    prof = load_profiles(profiles_path)
    t = throughput(out=out, workload=workload, select=select)
    res = t[t["model"] == QWEN][["config", "batch_size", "tok_s", "tok_s_min", "tok_s_max", "acceptance_length"]]
    # which idle configuration's hybrid term prices each hybrid (None: none, the EAGLE path's terms alone)
    idle_of = dict(idle) if isinstance(idle, dict) else {h: idle for h in hybrids}
    idles = sorted({i for i in idle_of.values() if i})
    # each model fitted once; per_bs only adds its ``by_bs`` terms, which the line prediction leaves out
    kw = dict(configs=("none", "eagle"), ragged=False, workload=workload, select=select)
    fits = {None: fit_step_model(out, per_bs=per_bs, **kw)}
    fits.update({i: fit_step_model(out, hybrid_configs=(i,), per_bs=per_bs, **kw) for i in idles})
    model_of = {"none": None, "eagle": None, **{i: i for i in idles}, **{h: idle_of.get(h) for h in hybrids},
                **{c: None for c in res["config"] if split_k(c)[0] == "eagle" and split_k(c)[1]}}   # other k
    import pandas as pd

    def pred(by_bs: bool):
        use = {k: m if by_bs else {x: v for x, v in m.items() if x != "by_bs"} for k, m in fits.items()}
        return pd.concat([predict(prof, use[m], configs=tuple(c for c, mm in model_of.items() if mm == m))
                          for m in use if any(mm == m for mm in model_of.values())], ignore_index=True)

    p = pred(False)
    res = res.merge(p[["config", "batch_size", "predicted_tok_s", "predicted_steps"]], on=["config", "batch_size"])
    res["ratio"] = res["tok_s"] / res["predicted_tok_s"]
    if per_bs:     # the mended form: host terms per batch size (fit_step_model's per_bs), the same split in/out
        q = pred(True).rename(columns={"predicted_tok_s": "predicted_per_bs_tok_s"})
        res = res.merge(q[["config", "batch_size", "predicted_per_bs_tok_s"]], on=["config", "batch_size"])
        res["ratio_per_bs"] = res["tok_s"] / res["predicted_per_bs_tok_s"]
    if shape:      # every phase as measured at its k and batch size; EAGLE at every k fitted (in sample)
        ks = tuple(sorted(c for c in res["config"] if split_k(c)[0] == "eagle" and split_k(c)[1]))
        skw = {**kw, "configs": ("none", "eagle", *ks)}
        sfits = {None: fit_step_model(out, per_shape=True, **skw)}
        sfits.update({i: fit_step_model(out, hybrid_configs=(i,), per_shape=True, **skw) for i in idles})
        q = pd.concat([predict(prof, sfits[m], configs=tuple(c for c, mm in model_of.items() if mm == m))
                       for m in sfits if any(mm == m for mm in model_of.values())], ignore_index=True)
        q = q.rename(columns={"predicted_tok_s": "predicted_shape_tok_s"})
        res = res.merge(q[["config", "batch_size", "predicted_shape_tok_s"]], on=["config", "batch_size"])
        res["ratio_shape"] = res["tok_s"] / res["predicted_shape_tok_s"]
        res["shape_fitted_on"] = res["config"].map(lambda c: "in sample" if c in skw["configs"] + tuple(idles)
                                                   else "out of sample")
    if host_scaled:
        hfits = {None: fit_step_model(out, host_scaled=True, **kw)}
        hfits.update({i: fit_step_model(out, hybrid_configs=(i,), host_scaled=True, **kw) for i in idles})
        runs = read_runs(out)
        runs = select_rows(runs, {"engine_config": TIMED} if select is None else select)
        runs = runs[(runs["task"] == "hybrid") & (runs["workload"] == workload) & (runs["model"] == QWEN)
                    & runs["config"].isin(res["config"])]
        q = predict_runs(prof, {c: hfits[model_of.get(c)] for c in res["config"]}, runs,
                         hfits[None]["host_index"])      # every run of the workload: alike in every fit
        res = res.merge(q, on=["config", "batch_size"])
        res["ratio_host"] = res["tok_s"] / res["predicted_host_tok_s"]
    res["fitted_on"] = res["config"].map(lambda c: "in sample" if c in ("none", "eagle", *idles) else
                                         "out of sample")
    return res.reset_index(drop=True)


SINGLES = ("eagle", "ngram")       # the single proposers a hybrid is held against


def device_trace(out: str | Path, workload: str = "code-edit") -> Path | None:
    """The device-side hybrid's profile in ``out`` (``hybrid_trace_sN.jsonl``; another workload's
    ``hybrid_trace_<workload>_sN.jsonl``), the highest N, or None."""
    pat = re.compile(r"hybrid_trace_s(\d+)\.jsonl" if workload == "code-edit" else
                     rf"hybrid_trace_{re.escape(workload)}_s(\d+)\.jsonl")
    found = sorted((int(m.group(1)), p) for p in Path(out).glob("hybrid_trace_*.jsonl")
                   if (m := pat.fullmatch(p.name)))
    return found[-1][1] if found else None     # the highest N (s10 after s9)


def paired_ratios(out: str | Path, base: str = "eagle", workload: str = "code-edit", select: dict | None = None):
    """A rotated engine's policies against ``base`` (EAGLE alone: ``off``) REPEAT BY REPEAT: each repeat ran every
    policy back to back in one engine (a Latin-square order), so ``tok_s(policy, r) / tok_s(base, r)`` compares
    runs minutes apart on one process (a repeat a deadline cut is left out). Per configuration and batch size: the
    median and the min / max of those ratios over the repeats. Only the configurations of rotated runs (run ids
    ``...@policy-rN``); ``select``: of the runs it selects (``live_runs.select_rows``)."""
    import pandas as pd

    none = pd.DataFrame(columns=["config", "batch_size", "paired_median", "paired_min", "paired_max", "pairs"])
    r = select_rows(read_runs(out), select)
    r = r[(r["task"] == "hybrid") & (r["workload"] == workload) & r["run_id"].str.contains("@", regex=False)]
    if not (r["config"] == base).any():          # no rotated engine, or none with the base among its policies
        return none
    g = r.groupby(["config", "batch_size", "repeat"]).agg(tok=("output_tokens", "sum"), wall=("wall_s", "sum"),
                                                         chunks=("wall_s", "size")).reset_index()
    g = whole_repeats(g, ["config", "batch_size"])         # a repeat a deadline cut: no pair
    g["tok_s"] = g["tok"] / g["wall"]
    b = g[g["config"] == base].set_index(["batch_size", "repeat"])["tok_s"]
    g["ratio"] = g["tok_s"] / pd.Series(list(zip(g["batch_size"], g["repeat"]))).map(b).to_numpy()
    return (g[g["config"] != base].groupby(["config", "batch_size"])["ratio"]
            .agg(paired_median="median", paired_min="min", paired_max="max", pairs="count").reset_index())


def table_args(out: str | Path) -> dict:
    """``device_hybrid_table``'s hybrids and idle configurations for the run in ``out``: the device-side rule
    against its idle machinery, and where adaptive-rule ran (data/gpu/v1-runner/adaptive-rule) also adaptive-rule
    against the host-side machinery idle (eagle-only), gpu-pr24344 then without a hybrid term unless its own idle
    counterpart ran beside it."""
    import pandas as pd

    cfgs = set(pd.read_csv(Path(out) / "runs.csv", usecols=["config"])["config"].astype(str))
    if "adaptive-rule-pad" not in cfgs:
        return {}
    return {"hybrid": ("gpu-pr24344", "adaptive-rule-pad"),
            "idle": {"gpu-pr24344": "gpu-eagle-only" if "gpu-eagle-only" in cfgs else None,
                     "adaptive-rule-pad": "eagle-only-pad"}}


def device_hybrid_table(out: str | Path, profiles_path=None, hybrid: str = "gpu-pr24344",
                        idle: str = "gpu-eagle-only", host_scaled: bool | None = None, workload: str = "code-edit"):
    """A device-side hybrid's run (``out``: no SD, EAGLE, n-gram, ``idle``, ``gpu-eagle-only``, ``gpu-pr24344``)
    per configuration and batch size: measured tok/s (mean, min, max of the repeats), ``vs_best_single`` (over the
    faster of EAGLE and n-gram at that batch size), ``vs_eagle`` (for ``idle``: the plugin's
    overhead), ``predicted_padded``'s prediction and ratio, and ``steps`` / ``predicted_steps``: decode steps per
    repeat, measured (the step log) over predicted (the profile of the same requests), which separates the
    acceptance half of a prediction from the cost half; a rotated engine's ``paired_*`` ratios over EAGLE
    alone (``paired_ratios``) and the prediction with per-batch-size host terms (``ratio_per_bs``); ``host_scaled``:
    each run predicted at its own host speed too (``ratio_host``: ``predicted_padded``); None: where the run has a
    rotated engine (its policies share one engine's host index), not where each policy ran in an engine of
    its own (where the index cannot tell engines' hosts apart). ``workload``: that workload's runs (e.g.
    sharegpt) against the profile of its requests (``device_trace(out, workload)``)."""
    import pandas as pd

    if host_scaled is None:
        host_scaled = bool(pd.read_csv(Path(out) / "runs.csv", usecols=["spec"])["spec"].astype(str)
                           .str.contains("-rotate", regex=False).any())

    profiles_path = profiles_path or device_trace(out, workload)
    hybrids = (hybrid,) if isinstance(hybrid, str) else tuple(hybrid)     # several: e.g. v1-runner/adaptive-rule's
    res = predicted_padded(out, profiles_path, idle=idle, hybrids=hybrids, per_bs=True, host_scaled=host_scaled,
                           workload=workload)
    t = throughput(out=out, workload=workload)
    t = t[t["model"] == QWEN]
    extra = t[~t["config"].isin(res["config"])][["config", "batch_size", "tok_s", "tok_s_min", "tok_s_max",
                                                  "acceptance_length"]]
    res = pd.concat([res, extra.assign(fitted_on="not predicted")], ignore_index=True)
    best = res[res["config"].isin(SINGLES)].groupby("batch_size")["tok_s"].max()
    eagle = res[res["config"] == "eagle"].set_index("batch_size")["tok_s"]
    res["vs_best_single"] = res["tok_s"] / res["batch_size"].map(best)
    res["vs_eagle"] = res["tok_s"] / res["batch_size"].map(eagle)
    s = pd.read_parquet(Path(out) / "steps.parquet", columns=["config", "batch_size", "phase", "run_id"])
    s = s[(s["phase"] == "decode") & s["run_id"].str.startswith(workload)]
    by = [s["config"], s["batch_size"]]
    per_rep = s.groupby(by).size() / s["run_id"].str.extract(r"-r(\d+)$")[0].groupby(by).nunique()
    res["steps"] = [per_rep.get((c, b), float("nan")) for c, b in zip(res["config"], res["batch_size"])]
    res["steps_over_predicted"] = res["steps"] / res["predicted_steps"]
    res = res.merge(paired_ratios(out, workload=workload), on=["config", "batch_size"], how="left")   # rotated only
    return res.sort_values(["batch_size", "config"]).reset_index(drop=True)


TABLES = {"device_hybrid.csv": "code-edit", "device_hybrid_sharegpt.csv": "sharegpt"}   # file -> its workload


def _write_table(out: Path, name: str, workload: str, ta: dict) -> None:
    """``device_hybrid_table`` of ``workload`` into ``out / name`` (``summarize``, ``retable``)."""
    write_via(device_hybrid_table(out, workload=workload, **ta).to_csv, out / name, index=False, float_format="%.6g")


def retable(out: str | Path, why: str, command: str = "") -> list[str]:
    """Recompute a live folder's prediction tables (``TABLES``, those it has) from its committed measurements
    (runs.csv, steps.parquet, the profile) with this package's step model, after the model changed; each file's
    manifest entry keeps where and when it was measured and gains its new sha256 and ``recomputed`` (date, command,
    ``why``). Returns the files rewritten; a file whose bytes come out the same is left alone."""
    import datetime as dt

    from ...provenance import sha256_file, update_entry

    out = Path(out)
    ta = table_args(out)
    done = []
    for name, wl in TABLES.items():
        f = out / name
        if not f.exists():
            continue
        before = sha256_file(f)
        _write_table(out, name, wl, ta)
        if sha256_file(f) == before:
            continue
        update_entry(out / "MANIFEST.json", name, sha256=sha256_file(f), recomputed={
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "why": why,
            "command": command or "python -m spec_repro.engines.vllm.live retable"})
        done.append(name)
    return done
