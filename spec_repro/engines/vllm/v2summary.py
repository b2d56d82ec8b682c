"""The V2 hybrid job's raw folder (``v2hybrid`` stages ``lossless`` / ``overhead`` / ``grid``: one
``results.jsonl`` and the plugin's ``steps_*.jsonl`` per stage folder) -> a folder of compact files (``FILE_DOCS``;
``data/gpu/live`` by default) and MANIFEST.json, written through the V1 summary's staging and manifest
(``live_summary.summarize``: a failure leaves the folder as it was).

The V2 rows have the V1 rows' format (``runner_v2_patches`` logs the step timer's columns), so the V1 readers serve:
``live_runs.load`` (every run labelled from its engine's resolved vLLM config: ``labels.run_labels``),
``live_model.fit_step_model`` / ``live_tables.predicted_padded`` (the out-of-sample predictor) and
``live_tables.paired_ratios``, each restricted to the grid stage's V2 engines (``SELECT``). Where V2 differs:

- every decode batch is uniform: EAGLE and the device-side hybrid draft a [B, k] block each step (a request the
  n-gram serves gets its k tokens in EAGLE's slots), so the fits take one target forward (``ragged=False``); the
  V1 runner's second, ragged forward has no V2 counterpart;
- async scheduling overlaps a share of each step with the next one's host work on both no SD and EAGLE: the
  predictor's wall-over-summed-steps ratio is measured per path and batch size on this run (``per_bs``), the
  hybrids' from their idle counterpart ``gpu-eagle-only``.

Files: ``runs.csv`` (every run with ``stage``), ``steps.parquet``, ``lossless.csv`` (each stage folder's runs
against the no-SD engine of the same folder), ``overhead.csv`` (``overhead_table``), ``ratios.csv``
(``ratio_table``), ``predicted.csv`` (``predicted_table``: once a profile ``hybrid_trace*.jsonl`` is in the
folder). ``v2verdict`` reads them back.
"""
from __future__ import annotations

from pathlib import Path

from ...io import write_via
from .hybrid_jobs import eagle_alone, split_k
from .live_runs import OUT, load, read_runs, select_rows
from .live_summary import summarize as _staged, write_lossless, write_manifest, write_runs_steps

SELECT = {"engine_config": "v2-forced", "stage": "grid"}      # the runs and steps the V2 tables read
EAGLE_ALONE = ("eagle",)       # vLLM's EAGLE alone at the grid's k (5); ``eagle-k<N>``: at k = N, in its own engine
HYBRIDS = ("gpu-pr24344", "gpu-pr24344-skip")                 # predicted out of sample, held against EAGLE alone
IDLE = "gpu-eagle-only"        # the device-side machinery with every request on EAGLE: the hybrids' own term
OVERHEAD_LIMIT = 0.03          # the V2 timer may cost at most this share of throughput
WORKLOADS = ("code-edit", "sharegpt")

FILE_DOCS = {
    "runs.csv": "one row per timed run: stage (lossless / overhead / grid), engine spec, configuration (method or "
                "hybrid policy), workload, batch size, repeat, tok/s, wall s, vLLM's spec-decode counters, weights; "
                "what ran, read from each engine's resolved vLLM config: runner (v1/v2) beside runner_forced, "
                "async_scheduling beside async_scheduling_forced, instrumented, engine_config",
    "steps.parquet": "every step the plugin timed (the V1 and V2 timers' columns, stage, spec, engine_config, "
                     "uniform, hybrid counts; t_gc / gc_full: the process's GC seconds and full collections inside "
                     "the step, where the V2 timer counted them; t_timer: the timer's own host seconds in the "
                     "step, where it counted them), per-request detail left out",
    "lossless.csv": "per run: requests whose greedy output equals the no-SD engine's of the same stage at the "
                    "same batch size (equal / total, the first difference)",
    "overhead.csv": "the V2 step timer's cost per engine (no SD, EAGLE), timer variant and batch size: tok/s "
                    "with the variant installed (on) and with vLLM's own methods (off), interleaved repeats; "
                    "overhead_paired = 1 - mean over repeats of on / off; overhead_blocks (± overhead_blocks_ci95, "
                    "blocks_runs): the timer's cost inside toggle runs, its timed steps' median period against "
                    "the untimed steps' of the same run (toggle_table); overhead: overhead_blocks where toggle "
                    "runs exist, else overhead_paired; within_limit: overhead <= 3%. "
                    "timer: what every timed run uses (rows built after each generate call); hooks: its wrappers "
                    "recording nothing; step: a row per step without its phases; drain: rows also built at the "
                    "sampler; overhead_host (± overhead_host_ci95): the same with the engine worker's host "
                    "speed, probed before and after each run, held fixed (host_adjusted)",
    "ratios.csv": "per workload, configuration and batch size of the grid stage: tok/s (mean of repeats); "
                  "vs_eagle_*: the run's tok/s over EAGLE alone's in the same rotated engine and repeat (median, "
                  "min, max over repeats; a configuration suffixed -k3 over eagle-k3 in the k = 3 engine); "
                  "vs_none / vs_ngram / vs_best_other: over the no-SD V2 engine's, the n-gram V1 engine's and the "
                  "faster of the two; vs_best_eagle: over the fastest EAGLE alone at that batch size (best_eagle: "
                  "eagle = k 5, eagle-k3 = k 3, each in its rotated engine) (across engines: means over repeats); "
                  "lossless (the lossless stage's comparison where it ran the shape), equal / compared requests "
                  "and EAGLE alone's",
    "predicted.csv": "each configuration's measured tok/s beside its prediction over the profile of the no-SD "
                     "outputs (hybrid_trace*.jsonl): the step model fitted on this run's no SD and EAGLE-alone V2 "
                     "steps at k 5, the hybrids' own term on gpu-eagle-only's (the hybrids and EAGLE alone at "
                     "another k, suffixed -k3, out of sample); ratio_per_bs = "
                     "measured / predicted with per-batch-size host terms, ratio_host each run at its host speed; "
                     "ratio_shape = measured / predicted with each step phase as measured at its k and batch size "
                     "on no SD and EAGLE alone at every k run (shape_fitted_on), the prefill in vLLM's chunks",
}


def stage_of(spec) -> str | None:
    """The stage an engine spec ran in (``v2hybrid-<stage>-<what>``), or None."""
    parts = str(spec).split("-")
    return parts[1] if len(parts) > 2 and parts[0] == "v2hybrid" else None


def load_v2(raw: str | Path):
    """``live_runs.load`` with each run's and step's ``stage``: its engine spec's, or ``overhead`` for the timer's
    cost runs (random prompts, some with the timer off or partial: never a step model's input)."""
    runs, steps, engines = load(raw)
    if len(runs):
        runs["stage"] = runs["spec"].map(stage_of).where(runs["task"] != "overhead", "overhead")
    if len(steps):
        steps["stage"] = steps["spec"].map(stage_of).where(~steps["run_id"].astype(str).str.startswith("overhead-"),
                                                           "overhead")
    return runs, steps, engines


def summarize(raw: str | Path, out: str | Path = OUT, command: str = "") -> dict:
    """Write ``out``'s files (``FILE_DOCS``) from the V2 job's raw folder through ``live_summary.summarize``'s
    staging: written into a stage folder, swapped in only once MANIFEST.json is written; ``out`` may not overlap
    ``raw`` (``summary.check_raw_out``)."""
    return _staged(raw, out, command, inner=_summarize)


def _summarize(raw: Path, out: Path, final: Path, command: str) -> dict:
    runs, steps, engines = load_v2(raw)
    write_runs_steps(runs, steps, out)
    write_lossless(sorted(raw.rglob("results.jsonl")), out)
    if len(runs) and (runs["task"] == "overhead").any():
        write_via(overhead_table(runs, steps).to_csv, out / "overhead.csv", index=False, float_format="%.6g")
    rt = ratio_table(out)
    if len(rt):
        write_via(rt.to_csv, out / "ratios.csv", index=False, float_format="%.6g")
    pt = predicted_table(out)
    if pt is not None:
        write_via(pt.to_csv, out / "predicted.csv", index=False, float_format="%.6g")
    write_manifest(raw, out, final, command, engines, FILE_DOCS)
    return {"runs": len(runs), "steps": len(steps), "engines": len(engines)}


def overhead_table(runs, steps=None):
    """The timer's cost per engine, timer variant (``common.TIMER_VARIANTS``) and batch size: ``steps.
    overhead_table`` of each variant's runs against the same engine's runs with vLLM's own methods (``off``) in the
    same repeats, ``overhead_paired`` = 1 - mean over repeats of variant / off, with the engine's ``config``,
    ``runner`` and ``engine_config``; ``overhead`` (the paired estimate; the ratio of means where fewer than two
    pairs ran) and ``within_limit`` (overhead <= 3%). Runs without a recorded variant were timed by the timer that
    built its rows at the sampler (``drain``) or ran without it (``off``). With ``steps`` whose rows carry the
    timer's own host seconds (``t_timer``), also ``timer_host_ms`` (per step) and ``timer_host_share`` (of the
    run's wall time: what the timer costs if all of its host work lies on the step's critical path, as on a
    host-bound runner; :func:`timer_host`)."""
    import pandas as pd

    from .steps import overhead_table as table

    r = runs[runs["task"] == "overhead"].copy()
    variant = r["instrumented"].map({True: "drain", False: "off"})
    r["timer"] = r["timer"].fillna(variant) if "timer" in r.columns else variant
    r["session"] = r["engine_config"]
    parts = []
    for v in [v for v in r["timer"].unique() if v != "off" and v not in TOGGLED]:   # toggled: half its steps timed
        g = r[r["timer"].isin(["off", v])].assign(instrumented=lambda d: d["timer"] == v)
        t = table(g).rename(columns={"session": "engine_config"})
        t = t[t["repeats"] > 0]          # an engine that did not time this variant
        t.insert(2, "timer", v)
        parts.append(t)
    ov = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["spec", "timer", "batch_size"])
    host = host_adjusted(r)
    if len(host):
        ov = ov.merge(host, on=["spec", "timer", "batch_size"], how="left")
    first = r.groupby("spec")[["config", "runner"]].first()
    ov.insert(1, "config", ov["spec"].map(first["config"]))
    ov.insert(2, "runner", ov["spec"].map(first["runner"]))
    ov["overhead"] = ov["overhead_paired"].fillna(ov["overhead_mean"])
    blocks = toggle_table(r)
    if len(blocks):       # outer: a toggled variant with no whole-run counterpart (timer-torch) gets its own rows
        ov = ov.merge(blocks, on=["spec", "timer", "batch_size"], how="outer")
        for c in ("config", "runner"):
            ov[c] = ov[c].fillna(ov["spec"].map(first[c]))
        ov["overhead"] = ov["overhead_blocks"].fillna(ov["overhead"])
    ov["within_limit"] = ov["overhead"] <= OVERHEAD_LIMIT
    th = timer_host(r, steps)
    if len(th):
        ov = ov.merge(th, on=["spec", "timer", "batch_size"], how="left")
    return ov.sort_values(["config", "spec", "timer", "batch_size"], kind="stable").reset_index(drop=True)


#: the toggled variants (common.TIMER_VARIANTS) -> the timer whose cost inside runs each measures
TOGGLED = {"toggle": "timer", "toggle-torch": "timer-torch"}


def toggle_table(r):
    """The timer's cost inside runs, per engine spec and batch size (``toggle`` as the ``timer`` variant's,
    ``toggle-torch`` as ``timer-torch``'s: the same timer, its events recorded by torch's ``Event.record``): each
    toggled run's median period of its untimed steps over that of its timed ones (``common.toggle_periods``: blocks
    of a few steps alternate, so both arms run under the same host speed, which drifts 4-12% run to run on a lent
    H100 and swamps a whole-run comparison). ``overhead_blocks`` = 1 - the mean over runs of untimed / timed (a step
    advances as many tokens timed or not: the lossless timer changes no draft), ``overhead_blocks_ci95`` = 1.96 x
    its standard error, ``blocks_runs``. Empty without toggle runs."""
    import numpy as np
    import pandas as pd

    need = {"toggle_timed_ms", "toggle_free_ms"}
    if not need <= set(r.columns):
        return pd.DataFrame()
    g = r[r["timer"].isin(list(TOGGLED))].dropna(subset=sorted(need))
    rows = []
    for (v, spec, b), x in g.groupby(["timer", "spec", "batch_size"]):
        ratio = (x["toggle_free_ms"] / x["toggle_timed_ms"]).to_numpy(float)
        rows.append({"spec": spec, "timer": TOGGLED[v], "batch_size": b, "overhead_blocks": 1 - ratio.mean(),
                     "overhead_blocks_ci95": 1.96 * ratio.std(ddof=1) / np.sqrt(len(ratio)) if len(ratio) > 1
                     else np.nan, "blocks_runs": len(ratio)})
    return pd.DataFrame(rows)


def timer_host(r, steps):
    """Per engine spec, timer variant and batch size, from the overhead runs' steps that carry ``t_timer`` (the
    timer's own host seconds in each step, perf_counter spans of its begin, marks, end and output read):
    ``timer_host_ms`` = the mean per step, ``timer_host_share`` = the mean over runs of their steps' sum over the
    run's wall seconds. Empty where no step carries it."""
    import pandas as pd

    if steps is None or "t_timer" not in getattr(steps, "columns", ()) or steps["t_timer"].isna().all():
        return pd.DataFrame()
    s = steps.dropna(subset=["t_timer"])
    per_run = s.groupby(["spec", "run_id"]).agg(t=("t_timer", "sum"), n=("t_timer", "size")).reset_index()
    m = r.merge(per_run, on=["spec", "run_id"], how="inner")
    if m.empty:
        return pd.DataFrame()
    m = m.assign(share=m["t"] / m["wall_s"], ms=1e3 * m["t"] / m["n"])
    # a toggled variant whose timer ran no whole runs (toggle-torch): its timed steps' host time as that timer's
    # (per step; its share of the wall is not: half its steps are timed)
    whole = set(r["timer"]) - set(TOGGLED)
    alone = m["timer"].map(lambda v: v in TOGGLED and TOGGLED[v] not in whole)
    m.loc[alone, "share"] = float("nan")
    m["timer"] = m["timer"].where(~alone, m["timer"].map(TOGGLED))
    return (m.groupby(["spec", "timer", "batch_size"])
            .agg(timer_host_ms=("ms", "mean"), timer_host_share=("share", "mean")).reset_index())


def host_adjusted(r):
    """Each variant's overhead with the host's speed held fixed: per engine spec and batch size, least squares of
    log tok/s on the variant (against ``off``) and the log of the engine worker's host probe (``engine_probe_ms``
    and ``engine_probe_end_ms``, read just before and after each run, outside its timed window: a 1.5B target's V2
    step is host work, and the host's speed drifts run to run). ``overhead_host`` = 1 - exp(the variant's
    coefficient), ``overhead_host_ci95`` = 1.96 x its standard error; empty where no run has a probe."""
    import numpy as np
    import pandas as pd

    need = {"engine_probe_ms", "engine_probe_end_ms"}
    if not need <= set(r.columns):
        return pd.DataFrame()
    r = r.dropna(subset=sorted(need))
    rows = []
    for (spec, b), g in r.groupby(["spec", "batch_size"]):
        vs = sorted(set(g["timer"]) - {"off"})
        if "off" not in set(g["timer"]) or not vs:
            continue
        X = np.column_stack([np.ones(len(g))] + [(g["timer"] == v).to_numpy(float) for v in vs]
                            + [np.log((g["engine_probe_ms"] + g["engine_probe_end_ms"]).to_numpy(float) / 2)])
        y = np.log(g["output_tok_per_s"].to_numpy(float))
        dof = len(y) - X.shape[1]
        if dof < 2:
            continue
        beta = np.linalg.lstsq(X, y, rcond=None)[0]
        res = y - X @ beta
        cov = (res @ res / dof) * np.linalg.pinv(X.T @ X)
        for i, v in enumerate(vs, start=1):
            rows.append({"spec": spec, "timer": v, "batch_size": b, "overhead_host": 1 - np.exp(beta[i]),
                         "overhead_host_ci95": 1.96 * np.sqrt(cov[i, i])})
    return pd.DataFrame(rows)


def _lossless(out: Path) -> dict:
    """(workload, config, batch size) -> (every compared output equal to no SD's, equal, total) from ``out``'s
    lossless.csv: the ``lossless`` stage's rows where that stage ran the shape (the job's gate: one engine per
    configuration beside no SD, greedy, the same requests), else every stage's. Between separately started engines
    bf16 numerics alone can part outputs (data/gpu/v1-runner/rotated-code-edit: EAGLE alone equal to no SD on 28
    of 32 requests at bs 1, 175 of 256 at bs 64), so ratio_table gives EAGLE alone's counts beside each policy's."""
    import pandas as pd

    f = out / "lossless.csv"
    if not f.exists():
        return {}
    ll = pd.read_csv(f)
    ll["stage"] = ll["spec"].map(stage_of)
    res = {}
    for k, g in ll.groupby(["workload", "config", "batch_size"]):
        gate = g[g["stage"] == "lossless"]
        g = gate if len(gate) else g
        res[k] = (bool((g["equal"] == g["total"]).all()), int(g["equal"].sum()), int(g["total"].sum()))
    return res


def ratio_table(out: str | Path):
    """Per workload, configuration and batch size of the grid stage: ``tok_s`` (``live_throughput.throughput``:
    a repeat's tokens over its wall time, mean over repeats) with its runner and engine_config; ``vs_eagle_*``
    (``live_tables.paired_ratios``: over EAGLE alone in the same rotated V2 engine, at its k, repeat by repeat:
    ``gpu-pr24344-skip-k3`` over ``eagle-k3``); ``vs_none``
    (over the no-SD V2 engine), ``vs_ngram`` (over vLLM's n-gram on V1), ``vs_best_other`` (over the faster of
    those two), ``vs_best_eagle`` (over the fastest EAGLE alone, ``best_eagle``: the grid's k = 5 or ``eagle-k<N>``
    in an engine of its own), each a ratio of means; ``lossless`` with ``equal`` / ``compared`` requests and EAGLE
    alone's ``eagle_equal`` / ``eagle_compared`` at the same shape (``_lossless``; empty: not compared)."""
    import pandas as pd

    from .live_tables import paired_ratios
    from .live_throughput import throughput

    out = Path(out)
    if not (out / "runs.csv").exists():
        return pd.DataFrame()
    runs = select_rows(read_runs(out), {"stage": "grid"})
    ll = _lossless(out)
    parts = []
    for wl in WORKLOADS:
        r = runs[(runs["task"] == "hybrid") & (runs["workload"] == wl)]
        if not len(r):
            continue
        t = throughput(r, out=out, workload=wl)
        lab = r.groupby("config")[["runner", "engine_config"]].first()
        t = t[["config", "batch_size", "tok_s", "tok_s_min", "tok_s_max", "repeats", "acceptance_length"]].copy()
        t.insert(0, "workload", wl)
        t.insert(2, "runner", t["config"].map(lab["runner"]))
        t.insert(3, "engine_config", t["config"].map(lab["engine_config"]))
        tok = t.set_index(["config", "batch_size"])["tok_s"]
        per = lambda c: t["batch_size"].map(tok[c] if c in tok.index.get_level_values(0) else {})   # noqa: E731
        t["vs_none"], t["vs_ngram"] = t["tok_s"] / per("none"), t["tok_s"] / per("ngram")
        t["vs_best_other"] = t["tok_s"] / pd.concat([per("none"), per("ngram")], axis=1).max(axis=1)
        alone = [c for c in t["config"].unique() if split_k(c)[0] in EAGLE_ALONE]
        if alone:       # the fastest EAGLE alone at each batch size, whatever its k
            e = pd.concat([per(c).rename(c) for c in alone], axis=1)
            t["best_eagle"] = e.apply(lambda row: row.idxmax() if row.notna().any() else None, axis=1)
            t["vs_best_eagle"] = t["tok_s"] / e.max(axis=1)
        rot = r[r["run_id"].str.contains("@off-", regex=False) & (r["engine_config"] == SELECT["engine_config"])]
        pr = pd.concat([paired_ratios(out, base=base, workload=wl, select={**SELECT, "spec": spec})   # its own EAGLE
                        for spec, base in rot.groupby("spec")["config"].first().items()]
                       or [paired_ratios(out, base="eagle", workload=wl, select=SELECT)])     # none rotated: empty
        pr = pr.rename(columns=lambda c: c.replace("paired_", "vs_eagle_").replace("pairs", "vs_eagle_pairs"))
        t = t.merge(pr, on=["config", "batch_size"], how="left")
        got = [ll.get((wl, c, b), (None, None, None)) for c, b in zip(t["config"], t["batch_size"])]
        eag = [ll.get((wl, eagle_alone(c), b), (None, None, None)) for c, b in zip(t["config"], t["batch_size"])]
        t["lossless"], t["equal"], t["compared"] = zip(*got) if got else ((), (), ())
        t["eagle_equal"], t["eagle_compared"] = [e[1] for e in eag], [e[2] for e in eag]
        parts.append(t)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def profile_for(out: Path, workload: str) -> Path | None:
    """The profile of ``workload``'s no-SD outputs in ``out``: ``hybrid_trace.jsonl`` (code-edit, ``live
    profile``'s default name) or the highest ``hybrid_trace[_<workload>]_sN.jsonl`` (``live_tables.device_trace``)."""
    from .live_tables import device_trace

    if workload == "code-edit" and (out / "hybrid_trace.jsonl").exists():
        return out / "hybrid_trace.jsonl"
    return device_trace(out, workload)


def predicted_table(out: str | Path):
    """Per workload with a profile in ``out``: ``live_tables.predicted_padded`` on the grid stage's V2 runs
    (``SELECT``): the step model fitted on no SD and EAGLE alone, the hybrids' own per-step term on ``IDLE``, so
    ``HYBRIDS`` are predicted out of sample; per-batch-size host terms (``ratio_per_bs``), each run at its own
    host speed (``ratio_host``: the rotated engine shares one host index) and each phase per shape (``ratio_shape``:
    EAGLE alone at every k in sample, the verdict's). None: no profile or no such runs."""
    import pandas as pd

    from .live_tables import predicted_padded

    out = Path(out)
    if not (out / "steps.parquet").exists():
        return None
    runs = select_rows(read_runs(out), SELECT)
    parts = []
    for wl in WORKLOADS:
        prof = profile_for(out, wl)
        have = set(runs.loc[runs["workload"] == wl, "config"])
        if prof is None or not {"none", "eagle", IDLE} <= have:
            continue
        hyb = tuple(sorted(h for h in have if split_k(h)[0] in HYBRIDS))       # each k the grid ran
        p = predicted_padded(out, prof, idle=IDLE, hybrids=hyb, per_bs=True, host_scaled=True, workload=wl,
                             select=SELECT, shape=True)
        p.insert(0, "workload", wl)
        p["profile"] = prof.name
        parts.append(p)
    return pd.concat(parts, ignore_index=True) if parts else None
