"""The live step-cost model: step-time components fitted on a live run's timed decode steps
(``fit_step_model``; per run host speed: ``host_index``) and the live configurations walked step by step over
profiled requests with them (``_walk``, ``predict``, ``predict_runs``; adaptive-rule's steps: ``rule_steps``)."""
from __future__ import annotations

import re
from pathlib import Path

from .hybrid_jobs import split_k
from .live_runs import COMMITTED, QWEN, TIMED, read_runs, select_rows

FIT_CONFIGS = ("none", "eagle", "ngram")          # the cost model is fitted on these; the hybrids are predicted
PREFILL_CHUNK = 8192          # the live engines' max_num_batched_tokens (engine.VLLMConfig): a prefill step's budget
LIVE_CONFIGS = ("none", "eagle", "ngram", "pr24344", "pr24344-skip")
K = 5


def _lin(X, y, groups=None):
    """Least squares; with ``groups`` every group (a configuration's batch size) weighs alike, however many
    steps it has (bs 1 runs 8x the steps of bs 8 and would otherwise set every slope)."""
    import numpy as np

    X, y = np.asarray(X, float), np.asarray(y, float)
    if groups is not None:
        g = np.asarray(groups)
        _, inv, cnt = np.unique(g, return_inverse=True, return_counts=True)
        w = np.sqrt(1.0 / cnt[inv])
        X, y = X * w[:, None], y * w
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    return [float(c) for c in coef]


HOST_PHASES = ("t_draft", "t_other", "t_reject")    # the host's share of a step: all but the target's forward


def host_index(steps, phase: str = "t_other"):
    """The host's speed during each run, from the run's own steps: the median ``phase`` of its decode steps over
    the median of those run medians in the same engine (``spec``) at the same batch size; 1 = the engine's
    typical host at that size, 1.5 = its host phases take 1.5x as long. Indexed by (spec, run_id).

    Why a run's own phase: the lent H200's host (a KVM guest) runs in slow and fast epochs of ~10-60 s; inside one
    engine its host phases (EAGLE's drafting, t_other) rise 1.5-2.5x together for stretches of runs while the
    target's forward (t_verify) stays flat (data/gpu/v1-runner/rotated-code-edit: across the rotated engine's runs
    at one batch size the run medians of t_other and t_draft correlate at r = 0.93-0.99 within a policy;
    data/gpu/v1-runner/host-drift: r =
    0.99-1.00 over 14-90 runs, where a CPU probe timed in the driver process does not, r = -0.1 to 0.1). The
    default, ``t_other`` (input preparation, bookkeeping, the engine core's scheduling and output processing), is
    what EAGLE alone, the idle hybrid and both device-side policies share: on a quiet host (the 10th percentile
    of a policy's steps) gpu-pr24344's is -6 / -4 / +24 / -6% of gpu-eagle-only's at bs 1 / 8 / 32 / 64 (EAGLE
    alone's 7-35% above both), against the 1.5-2x the epochs move it. ``predict_runs`` scales the step model's
    host terms by it; a batch size's reference cancels there (the host-scaled model is fitted on steps divided by
    the same index), so only the run-to-run ratio matters. The reference is per engine: it tells a policy's host
    apart only where it shares an engine with the configurations fitted (a rotated engine:
    data/gpu/v1-runner/rotated-code-edit), not between engines (one per policy:
    data/gpu/v1-runner/engine-per-policy). The worker's probe read before and after each run (``engine_probe_ms``),
    tried as this index on data/gpu/v1-runner/host-probe, tracks a run's drafting less well than its own t_other and
    predicts no better; where one policy's t_other is not the host's (data/gpu/v1-runner/sharegpt-one-machine,
    gpu-pr24344 at bs 64) the index misses."""
    d = steps[steps["phase"] == "decode"]
    run = d.groupby(["spec", "batch_size", "run_id"])[phase].median()
    return (run / run.groupby(level=["spec", "batch_size"]).transform("median")).droplevel("batch_size")


def fit_step_model(out: str | Path = COMMITTED, configs=FIT_CONFIGS, ragged: bool = True, hybrid_configs=(),
                   per_bs: bool = False, host_scaled: bool = False, workload: str = "code-edit",
                   select: dict | None = None, per_shape: bool = False) -> dict:
    """Step-time components fitted on the decode steps of ``configs`` (``workload``'s, in ``out``), in the package
    cost model's form, seconds: target forward ``F = c_kv*kv + c_tok*n + c0`` (``ragged``: a second F for batches
    that are not uniform, i.e. not every request scheduled 1 + k tokens: vLLM 0.25's V1 runner replays its full
    CUDA graph only for uniform decode batches; without ``ragged`` one F for all, as ``costmodel.fit`` does);
    EAGLE drafting per token ``k*(c_req*m + c0)``, m = requests drafted for; n-gram lookup per request; overhead
    (t_other + t_reject) per step ``o0 + o1*B`` per engine path (no SD; EAGLE, whose path the hybrids take;
    n-gram, synchronous); wall over summed step time per path (async scheduling hides part of a step behind the
    next); prefill ``c0 + c_tok * prompt tokens``; with ``hybrid_configs``, the hybrid's own per-step work
    ``h0 + h1*B`` (its drafting time beyond EAGLE's) fitted on those. Every fit weighs each configuration's batch
    size alike. ``per_bs``: the host terms (overhead, EAGLE's drafting per token, the hybrid's own work) also as
    one mean per batch size (``by_bs``), which ``_walk`` uses for a chunk of that size: the host's cost measured
    at the size predicted instead of a line through all sizes (the line misses bs 8 by 15-20% in sample on
    data/gpu/v1-runner/rotated-code-edit's steps); the target's forward stays the fit; and wall over summed step
    time per batch size
    and path, the hybrids' from their idle counterpart (``hybrid_configs``): async scheduling hides a share of
    no SD's step that grows with the batch, and of the device-side machinery's at bs 32 / 64 only.
    ``host_scaled`` (implies ``per_bs``): every step's host phases (``HOST_PHASES``) divided by its run's
    ``host_index`` first, so the host terms are those of the engine's typical host at each batch size, to be
    scaled back by the index of the run predicted (``_walk``'s ``host``, ``predict_runs``; the index of every run
    of the workload is kept as ``host_index``); the hybrid's own term is then its drafting beyond the
    per-batch-size EAGLE drafting (not beyond the line, which would fold the line's miss at that size into it).
    ``select``: the steps and runs fitted (``live_runs.select_rows``; default ``{"engine_config": "v1-forced"}``,
    the forced V1 runner the committed runs timed; the V2 job's ``v2summary.SELECT``: its V2 grid stage). On the
    V2 runner every decode batch is uniform (EAGLE and the device-side hybrid draft [B, k] each step), so its fits
    take ``ragged=False``; its async overlap is what ``wall_over_steps`` measures, per path and batch size.
    ``per_shape`` (implies ``per_bs``; ``configs`` may name EAGLE at other k, ``eagle-k3``): ``by_shape``, each step
    phase's mean per k and batch size as measured on the configurations fitted (``forward`` t_verify, ``overhead``
    t_other + t_reject, ``draft`` t_draft; k = 0: no SD), which ``_walk`` takes instead of the lines: V2's forward is
    not linear in the tokens verified (data/gpu/live/slower-host: at code-edit bs 64 no SD's 64 tokens take 2.86
    ms, k = 3's ~203 3.02 ms, k = 5's ~301 4.05 ms), nor are its host terms the same at each k; with
    ``hybrid_configs``, ``hybrid``: the idle machinery's whole host step (draft, other, reject) beyond EAGLE alone's
    at its k."""
    import numpy as np
    import pandas as pd

    select = {"engine_config": TIMED} if select is None else select
    s = pd.read_parquet(Path(out) / "steps.parquet")
    s = select_rows(s[s["run_id"].str.startswith(workload)], select)
    missing = [c for c in configs if not (s["config"] == c).any()]
    if missing:
        raise ValueError(f"fit_step_model: no {workload} steps of {', '.join(missing)} where {select} in "
                         f"{Path(out) / 'steps.parquet'} (the fit needs every configuration of {list(configs)})")
    per_bs = per_bs or per_shape
    m = {"ragged": ragged, "fitted_on": list(configs), "host_scaled": host_scaled}
    if host_scaled:     # the index from every run of the engine (its reference cancels: host_index)
        per_bs = True
        m["host_index"] = host_index(s)
        h = pd.Series(list(zip(s["spec"], s["run_id"]))).map(m["host_index"]).fillna(1.0).to_numpy()
        s = s.assign(**{c: s[c] / h for c in HOST_PHASES})
    s = s[s["config"].isin(tuple(configs) + tuple(hybrid_configs))]
    dec = s[s["phase"] == "decode"]
    fit_dec = dec[dec["config"].isin(configs)]
    X = lambda d: np.column_stack([d["kv_tokens"], d["batched_tokens"], np.ones(len(d))])
    grp = lambda d: d["config"] + "/" + d["batch_size"].astype(str)
    if ragged:
        u, r = fit_dec[fit_dec["uniform"]], fit_dec[~fit_dec["uniform"]]
        m["F_uniform"], m["F_ragged"] = _lin(X(u), u["t_verify"], grp(u)), _lin(X(r), r["t_verify"], grp(r))
    else:
        m["F_uniform"] = m["F_ragged"] = _lin(X(fit_dec), fit_dec["t_verify"], grp(fit_dec))
    e = dec[dec["config"] == "eagle"]
    kk = e["num_draft_tokens"] / e["num_reqs"]
    m["eagle_draft"] = _lin(np.column_stack([kk * e["num_reqs"], kk]), e["t_draft"], grp(e))     # per token: c_req, c0
    n = dec[dec["config"] == "ngram"]
    # no n-gram run (the GPU profile's grid): its lookups are inside the hybrid's own term (hybrid_configs)
    m["ngram_draft"] = _lin(np.column_stack([n["num_reqs"]]), n["t_draft"], grp(n)) if len(n) else [0.0]
    path = dec["config"].map(lambda c: c if c in ("none", "ngram") else "eagle")
    for name in ("none", "eagle", "ngram"):
        g = dec[path == name]
        if len(g):
            m[f"overhead_{name}"] = _lin(np.column_stack([np.ones(len(g)), g["num_reqs"]]), g["t_other"] + g["t_reject"],
                                         grp(g))
    runs = read_runs(out)
    runs = select_rows(runs[runs["task"] == "hybrid"], select)
    ratio = (runs.set_index(["config", "run_id"])["wall_s"] / s.groupby(["config", "run_id"])["t_total"].sum()).dropna()
    m["wall_over_steps"] = {c: float(ratio.loc[c].median()) for c in ("none", "eagle", "ngram") if c in configs}
    hy = dec[dec["config"].isin(hybrid_configs)]
    if len(hy):   # the hybrid's own per-step work (n-gram lookups, the policy, mixing): drafting beyond EAGLE's
        eag = np.where(hy["config"].isin(("pr24344", "pr24344-pad", "eagle-only")) | hy["config"].str.startswith("gpu-")
                       | (hy["hybrid_eagle"].fillna(0) > 0),
                       1.0, 0.0)                                                                   # EAGLE ran
        extra = hy["t_draft"] - K * (m["eagle_draft"][0] * hy["num_reqs"] + m["eagle_draft"][1]) * eag
        m["hybrid_overhead"] = _lin(np.column_stack([np.ones(len(hy)), hy["num_reqs"]]), extra, grp(hy))
    if per_bs:   # per batch size: each configuration's mean weighs alike (as the fits' groups do)
        mean_by_bs = lambda d, v: {int(b): float(x) for b, x in
                                   v.groupby([d["batch_size"], d["config"]]).mean().groupby(level=0).mean().items()}
        m["by_bs"] = {f"overhead_{name}": mean_by_bs(dec[path == name], (dec["t_other"] + dec["t_reject"])[path == name])
                      for name in ("none", "eagle", "ngram") if (path == name).any()}
        if len(e):
            m["by_bs"]["eagle_draft"] = mean_by_bs(e, e["t_draft"] / kk)        # per drafted token, whole batch
        if len(hy):
            # beyond the per-batch-size EAGLE drafting that _walk adds with it (not beyond the line: that folded
            # the line's miss at each size into the hybrid's own term, -0.6 ms a step at bs 8 in
            # data/gpu/v1-runner/rotated-code-edit)
            extra = hy["t_draft"] - K * hy["batch_size"].map(m["by_bs"]["eagle_draft"]) * eag
            m["by_bs"]["hybrid_overhead"] = mean_by_bs(hy, pd.Series(extra, index=hy.index))
        # wall over summed step time per batch size: async scheduling hides a share of the step that grows with
        # the batch (no SD 0.89 at bs 1 to 0.77 at bs 64 in data/gpu/v1-runner's sharegpt-one-machine and
        # host-probe: one median for all sizes predicted no SD 10-11% slow at bs 64 IN sample), and the device-side
        # machinery overlaps ~5% of its step at
        # bs 32 / 64 where EAGLE alone overlaps none: the hybrids take their idle counterpart's (``hybrid_configs``)
        bs_of = runs.set_index(["config", "run_id"])["batch_size"]
        wos = pd.DataFrame({"ratio": ratio, "batch_size": bs_of.reindex(ratio.index)}).dropna()
        of = lambda cs: wos[wos.index.get_level_values("config").isin(cs)]
        per = lambda cs: {int(b): float(x) for b, x in of(cs).groupby("batch_size")["ratio"].median().items()}
        m["by_bs"]["wall_over_steps"] = {c: per((c,)) for c in ("none", "eagle", "ngram") if c in configs}
        if len(hy):
            m["by_bs"]["wall_over_steps"]["hybrid"] = per(tuple(hybrid_configs))
    pre = s[s["phase"] != "decode"]
    m["prefill"] = _lin(np.column_stack([np.ones(len(pre)), pre["batched_tokens"]]), pre["t_total"])
    if per_shape:
        m["by_shape"] = shape_terms(dec, configs, hybrid_configs)
    return m


def _k_of(config: str) -> int:
    """The k a configuration ran at: 0 for no SD, its suffix's (``eagle-k3``) or the grid's (``K``)."""
    if config == "none":
        return 0
    return split_k(config)[1] or K


def shape_terms(dec, configs, hybrid_configs=()) -> dict:
    """``fit_step_model``'s ``by_shape``: per k (0 = no SD) and batch size, the mean forward, host overhead and
    drafting of the decode steps of ``configs`` (each configuration's mean weighs alike where two share a k), and
    with ``hybrid_configs`` the idle machinery's host step (draft + other + reject) beyond EAGLE alone's at the
    same k and batch size (``hybrid``, {B: seconds})."""
    d = dec.assign(_k=dec["config"].map(_k_of), _ov=dec["t_other"] + dec["t_reject"])
    fit = d[d["config"].isin(configs)]

    def per(col):
        g = fit.groupby(["_k", "batch_size", "config"])[col].mean().groupby(level=["_k", "batch_size"]).mean()
        out: dict = {}
        for (k, b), v in g.items():
            out.setdefault(int(k), {})[int(b)] = float(v)
        return out

    t = {"forward": per("t_verify"), "overhead": per("_ov"), "draft": per("t_draft")}
    hy = d[d["config"].isin(hybrid_configs)]
    if len(hy):
        host = (hy["t_draft"] + hy["_ov"]).groupby([hy["_k"], hy["batch_size"]]).mean()
        t["hybrid"] = {int(b): float(v - t["draft"][int(k)][int(b)] - t["overhead"][int(k)][int(b)])
                       for (k, b), v in host.items() if int(b) in t["draft"].get(int(k), {})}
    return t


def draft_prefill(draft: dict) -> dict:
    """EAGLE's draft prefill's time a step, {k: {B: seconds}}, from its whole drafting at each k and batch size
    (``shape_terms``' ``draft``, k = 0 left out): V2's EAGLE drafts with one prefill (the accepted tokens' KV for
    the head, and its first token) and k - 1 decode steps, so two k at a batch size give the decode step's time
    (their difference over that of k) and the prefill's (the rest, within [0, the drafting]); one k alone: a
    k-th of its drafting. ``gpu-pr24344-skip`` skips the decode steps and runs the prefill."""
    out: dict = {}
    ks = sorted(k for k in draft if k > 0)
    for k in ks:
        for b, d in draft[k].items():
            other = [j for j in ks if j != k and b in draft[j]]
            if other:
                j = other[0]
                step = (draft[j][b] - d) / (j - k)
                out.setdefault(k, {})[b] = float(min(max(d - (k - 1) * step, 0.0), d))
            else:
                out.setdefault(k, {})[b] = float(d / k)
    return out


def rule_as_run():
    """adaptive-rule's parameters in the committed V1-runner runs (data/gpu/v1-runner/adaptive-rule): each request's
    estimate from its own counts alone, no population prior and no lower bound (``RuleParams(pool_w=0, lcb=0)``).
    The hybrid runner's policy takes ``RuleParams()``: predict a run made with it with ``params=RuleParams()``."""
    from ... import adaptive as AD

    return AD.RuleParams(pool_w=0, lcb=0)


def rule_steps(reqs: list[dict], B: int, k: int = K, cost_model=None,
               params=None) -> list[list[tuple[int, int, bool]]]:
    """adaptive-rule's steps over profiled requests (``load_profiles`` records) at batch size ``B``, as the
    simulator takes them (``adaptive.adaptive_steps``, the decisions the live policy takes step for step:
    tests/test_hybrid.py): per request, per step, (draft tokens verified, tokens accepted, EAGLE drafted).
    ``cost_model``: the rule's (default: the one the live runs priced proposals with, ``hybrid_jobs.ADAPTIVE_COST``);
    ``params``: the rule's ``RuleParams`` (default ``rule_as_run()``, those of the committed runs)."""
    from ... import adaptive as AD
    from ...costmodel import load_cost_model
    from ...simcore import group_arrays
    from ...traces import Trace
    from .hybrid_jobs import ADAPTIVE_COST

    props = ["ngram", "eagle"]
    t = Trace.from_arrays({r["key"]: {q: r["acc"][q] for q in props} for r in reqs},
                          prompt_lens={r["key"]: r["prompt_len"] for r in reqs}, dataset="live", model=QWEN,
                          draft_lens={r["key"]: {"ngram": r["draft_len"]["ngram"]} for r in reqs})
    ids = [r["key"] for r in reqs]
    g = group_arrays(t.acc, t.requests, props, ids)
    cm = load_cost_model(cost_model or ADAPTIVE_COST)
    st = AD.adaptive_steps(g, t.requests, props, "adaptive-rule", int(B), cm, int(k), params or rule_as_run())
    out: list[list] = [[] for _ in reqs]
    for i, p, inp, gen, v, ea in zip(st.req.tolist(), st.p.tolist(), st.inp.tolist(), st.gen.tolist(),
                                     st.verified.tolist(), st.ran[props.index("eagle")].tolist()):
        out[i].append((p, int(inp) - 1 if v in (0, 1) else 0, int(gen) - 1, bool(ea)))
    return [[x[1:] for x in sorted(o)] for o in out]


def _walk(reqs: list[dict], config: str, model: dict, max_tokens: int = 256, k: int = K, host: float = 1.0) -> dict:
    """One chunk of requests decoded together, step by step, as the live engine runs ``config``: returns tokens,
    steps, seconds (the model's), ragged steps. ``host``: the host terms (overhead, drafting, the hybrid's own
    work; not the target's forward or the prefill) times this (a run's ``host_index``). ``adaptive-rule[-pad]``:
    each request's steps are the simulator's (``rule_steps``), its host machinery the hybrid's own term.
    ``<config>-k<N>`` (``eagle-k3``, ``gpu-pr24344-skip-k3``): that configuration at k = N (EAGLE's drafting
    priced per token drafted, the forward by the tokens verified, the hybrid's own term as measured at the fits' k).
    A model with ``by_shape`` (``fit_step_model(per_shape=True)``) prices each decode step by the phases measured at
    its k and batch size instead (the hybrid's own term: its idle machinery's, ``shape_terms``), and the prefill as
    vLLM schedules it, in steps of at most ``PREFILL_CHUNK`` tokens (the line's intercept once a step).
    ``gpu-pr24344-skip`` as V2 runs it (``hybrid_v2.SkipGate``): EAGLE's draft decode steps skipped for the batch
    when every request matched at the step before (no flag before the first decode step), its draft prefill run
    every step (``draft_prefill``; without ``by_shape`` one drafted token's time); on a skipped step a request
    on EAGLE gets the prefill's token and stale ones after it, so it accepts at most one."""
    import numpy as np

    config, at_k = split_k(config)                     # an engine at another k than the fits' (out of sample)
    k = at_k or k
    B = len(reqs)
    p = np.ones(B, int)                                  # tokens produced (1 after prefill)
    P = np.array([r["prompt_len"] for r in reqs])
    shape = model.get("by_shape")
    prefill_only = draft_prefill(shape["draft"]) if shape else None      # the skip's drafting on a skipped step
    n_pre = -(-int(P.sum()) // PREFILL_CHUNK) if shape else 1          # vLLM's chunked prefill: steps of the budget
    t = model["prefill"][0] * n_pre + model["prefill"][1] * P.sum()
    steps = ragged_steps = 0
    path = config if config in ("none", "ngram") else "eagle"
    ov = model[f"overhead_{path}"]
    gpu = config.startswith("gpu-")                    # the device-side hybrid: k tokens per request, uniform
    pad = config.endswith("-pad") or gpu               # every draft padded to k: uniform batches
    base = config.removesuffix("-pad").removeprefix("gpu-")
    rule = base == "adaptive-rule"
    hov = model.get("hybrid_overhead") if base.startswith("pr24344") or base in ("eagle-only", "adaptive-rule") \
        else None
    by = model.get("by_bs", {})                        # per-batch-size host terms (fit_step_model(per_bs=True))
    plan = rule_steps(reqs, B, k) if rule else None
    at = np.zeros(B, int)                              # adaptive-rule: each request's next step in its plan
    lag = gpu and base == "pr24344-skip"               # V2's skip: decided on the step before, the prefill still runs
    skip = False                                       # no flag has reached the host before the first decode step
    while (p < max_tokens).any():
        act = p < max_tokens
        d = np.zeros(B, int)
        a = np.zeros(B, int)
        eagle_for = 0
        for i in np.flatnonzero(act):
            if rule:                                   # the simulator's step: its plan covers the output
                d[i], a[i], ea = plan[i][at[i]]
                eagle_for += ea
                at[i] += 1
                continue
            ng_dl = min(reqs[i]["draft_len"]["ngram"][p[i] - 1], k)
            use_ng = base == "ngram" or (base.startswith("pr24344") and ng_dl > 0)
            if config == "none":
                continue
            if use_ng:
                d[i] = ng_dl
                a[i] = min(reqs[i]["acc"]["ngram"][p[i] - 1] - 1, ng_dl)
            else:
                d[i] = k
                a[i] = min(reqs[i]["acc"]["eagle"][p[i] - 1] - 1, 1 if skip else k)
                eagle_for += 1
        n_act = int(act.sum())
        T = int(act.sum()) * (1 + k) if pad else int((1 + d[act]).sum())
        kv = int((P[act] + p[act]).sum())
        uniform = config == "none" or pad or bool((d[act] == k).all())   # vLLM's uniform decode: 1 + k each
        drafted = base in ("eagle", "pr24344", "eagle-only", "idle") or lag or (
            base in ("pr24344-skip", "adaptive-rule") and bool(eagle_for))
        if shape:                                      # the phases measured at this k and batch size
            kk = 0 if config == "none" else k
            fwd = shape["forward"][kk][B]
            draft = prefill_only[kk][B] if skip else shape["draft"][kk][B]
            step = shape["overhead"][kk][B] + (draft if drafted else 0.0) + (shape["hybrid"][B] if gpu else 0.0)
        else:
            F = model["F_uniform" if uniform else "F_ragged"]
            fwd = F[0] * kv + F[1] * T + F[2]
            step = by.get(f"overhead_{path}", {}).get(B, ov[0] + ov[1] * n_act)        # the host's terms
            if drafted:                                  # EAGLE drafts for the whole batch when it runs
                step += (1 if skip else k) * by.get("eagle_draft", {}).get(
                    B, model["eagle_draft"][0] * n_act + model["eagle_draft"][1])
            if base in ("ngram", "pr24344", "pr24344-skip") and not gpu:   # the device's lookup: in hov
                step += model["ngram_draft"][0] * n_act
            if hov is not None:
                step += by.get("hybrid_overhead", {}).get(B, hov[0] + hov[1] * n_act)
        t += fwd + host * step
        steps += 1
        ragged_steps += not uniform
        p[act] = np.minimum(p[act] + a[act] + 1, max_tokens)
        skip = lag and not eagle_for                   # every request matched: the next step skips
    wos = by.get("wall_over_steps", {}).get("hybrid" if hov is not None else path, {}).get(B)   # per_bs: this size's
    wos = model["wall_over_steps"][path] if wos is None else wos
    return {"tokens": int(B * max_tokens), "steps": steps, "seconds": float(t * wos), "ragged_steps": ragged_steps}


def predict(profiles: list[dict], model: dict, configs=LIVE_CONFIGS, batch_sizes=(1, 8, 32, 64),
            prompts_per_bs: int = 8):
    """Predicted tok/s per configuration and batch size, the hybrid task's chunks (its first max(B, 8) requests
    in chunks of B)."""
    import pandas as pd

    rows = []
    for c in configs:
        for b in batch_sizes:
            part = profiles[:max(b, prompts_per_bs)]
            res = [_walk(part[i:i + b], c, model) for i in range(0, len(part), b)]
            tok, sec = sum(r["tokens"] for r in res), sum(r["seconds"] for r in res)
            rows.append({"config": c, "batch_size": b, "predicted_tok_s": tok / sec,
                         "predicted_steps": sum(r["steps"] for r in res),
                         "predicted_ragged_share": sum(r["ragged_steps"] for r in res) / sum(r["steps"] for r in res)})
    return pd.DataFrame(rows)


def predict_runs(profiles: list[dict], models: dict, runs, index, prompts_per_bs: int = 8):
    """Each measured run predicted at its own host speed: the chunk it ran (``-c<N>`` of its run id: requests
    ``[N*B, (N+1)*B)`` of the hybrid task's first max(B, 8)) walked with ``models[config]`` and ``host`` = the
    run's ``index`` ((spec, run_id) -> ``host_index``; 1 where missing), then per configuration and batch size
    as ``throughput`` aggregates the measured runs: a repeat's tokens over its seconds, the mean over repeats."""
    import pandas as pd

    rows = []
    for r in runs.itertuples(index=False):
        b, c = int(r.batch_size), int(re.search(r"-c(\d+)", r.run_id).group(1))
        w = _walk(profiles[:max(b, prompts_per_bs)][c * b:(c + 1) * b], r.config, models[r.config],
                  host=float(index.get((r.spec, r.run_id), 1.0)))
        rows.append({"config": r.config, "batch_size": b, "repeat": r.repeat, "tokens": w["tokens"],
                     "seconds": w["seconds"]})
    g = pd.DataFrame(rows).groupby(["config", "batch_size", "repeat"])[["tokens", "seconds"]].sum()
    return ((g["tokens"] / g["seconds"]).groupby(level=["config", "batch_size"]).mean()
            .rename("predicted_host_tok_s").reset_index())
