"""A live run's raw device folder read back (``gpu/live_job.sh``'s ``results*.jsonl`` and the plugin's
``steps_*.jsonl``): its runs and engine steps with the configuration each measured (``load``), and the runs table
of a summarized folder (``read_runs``)."""
from __future__ import annotations

import json
from pathlib import Path

from ...paths import data_dir, v1_runner_dir
from .labels import engine_config_label, run_labels

OUT = data_dir() / "gpu" / "live"         # where `live summarize` writes new tables by default
#  the committed V1-runner (forced) study the readers default to: real-weight agreement, the host-side hybrids on
# code-edit and the Llama-dims baselines (data/gpu/v1-runner/README.md)
COMMITTED = v1_runner_dir("agreement")
QWEN = "qwen2.5-coder-1.5b"               # the live runs' target (real weights)

ENGINE_NOTES = {
    "v1-forced": "the V1 runner forced (VLLM_USE_V2_MODEL_RUNNER=0: the plugin's hooks live there; vLLM itself picks "
                 "V2 for EAGLE and no SD on a dense target), vLLM's own scheduling: async where vLLM allows it (off "
                 "for n-gram and the draft model). Labelled `default` in tables made before the runner was recorded",
    "study-like": "synchronous V1 runner (both forced), as the study's vLLM 0.10 ran",
    "default": "vLLM chose everything: its runner (V2 for EAGLE and no SD, V1 for n-gram) and async scheduling; "
               "timed only where vLLM ran V1 (the plugin's hooks are the V1 runner's). Labelled `vllm-default` in "
               "older specs",
    "v2-forced": "the V2 runner forced (VLLM_USE_V2_MODEL_RUNNER=1: the plugin's V2 hooks, runner_v2_patches), vLLM's "
                 "own scheduling (async for EAGLE and no SD); EAGLE drafts a uniform [B, k] block every step",
}


TIMED = "v1-forced"      # the configuration the plugin timed the live runs on (the V1 runner, forced)


def select_rows(df, select: dict | None):
    """The rows of ``df`` whose columns equal ``select``'s values (e.g. ``{"engine_config": "v2-forced", "stage":
    "grid"}``); None: all. A column ``df`` lacks selects nothing (no row)."""
    if not select:
        return df
    mask = None
    for col, val in select.items():
        m = (df[col] == val) if col in df.columns else (df.index != df.index)
        mask = m if mask is None else mask & m
    return df[mask]


def read_runs(out: str | Path = COMMITTED):
    """``out``'s runs.csv with the runner labels (``labels.relabel_runs``: a table written before they existed,
    its forced V1 runner called ``default``, reads as ``v1-forced``)."""
    import pandas as pd

    from .labels import relabel_runs

    from ...manifests import verify_recorded

    return relabel_runs(pd.read_csv(verify_recorded(Path(out) / "runs.csv")))


def _config(cfg: dict) -> str | None:
    """The configuration a run measured: vLLM's method, the hybrid policy, ``<policy>-pad``, ``ngram-pad``."""
    from .jobs import config_label

    return config_label(cfg) if cfg else None


def _cfg_fields(cfg: dict, engine: dict) -> dict:
    return {"config": _config(cfg), "hybrid": cfg.get("hybrid"), "hybrid_pad": bool(cfg.get("hybrid_pad")),
            "model_runner": cfg.get("model_runner"), "load_format": cfg.get("load_format"),
            "weights": "dummy" if cfg.get("load_format") == "dummy" else "real (q4_k_m GGUF, bf16)",
            "dtype": cfg.get("dtype"), "draft": Path(cfg["draft"]).name if cfg.get("draft") else None,
            "instrumented": bool(engine.get("instrumented")), "max_num_seqs": cfg.get("max_num_seqs"),
            **run_labels(cfg, engine)}      # runner, async scheduling (read from vLLM where recorded), engine_config


def step_configs(run_ids, ecfg: dict, spec: str = ""):
    """The configuration of each step row of an engine (``ecfg``: its config): the engine's, or for a rotated
    engine (``hybrid_rotate``) the policy its run id names (``<w>-b<B>-c<chunk>@<policy>-r<repeat>``)."""
    import pandas as pd

    run_ids = pd.Series(run_ids)
    if not ecfg.get("hybrid_rotate"):
        return pd.Series([_config(ecfg) or spec] * len(run_ids), index=run_ids.index)
    from .jobs import rotated_run_config

    pol = run_ids.str.extract(r"@(.+)-r-?\d+$")[0]
    return pol.map({p: _config(rotated_run_config(ecfg, p)) for p in ecfg["hybrid_rotate"]})


def whole_repeats(g, keys: list[str], count: str = "chunks"):
    """The rows of a per-repeat table (``count``: its runs) whose repeat holds as many runs as the fullest repeat
    of its ``keys``: a repeat a deadline cut holds only its first chunks (other prompts) and is left out."""
    return g[g[count] == g.groupby(keys)[count].transform("max")]


def latest(recs: list[dict]) -> list[dict]:
    """A results file's records with each run measured again later dropped: a spec restarted in the same folder
    (its engine stopped and started anew) runs its run ids again, and the later measurement stands."""
    runs = [bool(d.get("kind") == "run" and d.get("run_id")) for d in recs]     # a run without an id stays
    last = {(d["spec"], d["run_id"]): i for i, (d, r) in enumerate(zip(recs, runs)) if r}
    return [d for i, (d, r) in enumerate(zip(recs, runs)) if not r or last[(d["spec"], d["run_id"])] == i]


def latest_steps(df, extra: list[dict]):
    """(df, extra) of one step log with each run id's rows from its last block only (``latest``'s rule: a
    restarted engine logs a run id again); rows without a run id (an engine's warm-up) stay."""
    import numpy as np
    import pandas as pd

    rid = df["run_id"].astype(str).to_numpy(dtype=object)
    block = pd.Series(np.cumsum(np.r_[True, rid[1:] != rid[:-1]]), index=df.index)
    keep = (rid == "") | (block == block.groupby(rid).transform("max")).to_numpy()
    return df[keep].reset_index(drop=True), [x for x, k in zip(extra, keep) if k]


def load(raw: str | Path):
    """(runs, steps, engines) from a raw folder (searched recursively); a run measured again later in the same
    file, and its steps, give way to the later measurement (``latest``)."""
    import pandas as pd

    from ...traces import read_step_records

    raw = Path(raw)
    recs = [d for f in sorted(raw.rglob("results*.jsonl"))
            for d in latest([json.loads(x) for x in open(f) if x.strip()])]
    engines = {d["spec"]: d for d in recs if d.get("kind") == "engine"}
    runs = []
    for d in recs:
        if d.get("kind") != "run":
            continue
        e = engines.get(d["spec"], {})
        row = {k: v for k, v in d.items() if k not in ("outputs", "keys", "config", "kind")}
        row.pop("engine_config", None)       # the spec's own label: replaced by what its forced settings make
        row.update(_cfg_fields(d.get("config") or e.get("config") or {}, e))   # a rotated engine's run: its policy's
        if "instrumented" in d:          # the run's own (an overhead task turns the timer off for half its runs)
            row["instrumented"] = bool(d["instrumented"])
        for c in ("per_position_rate", "accepted_per_pos"):
            row[c] = json.dumps(row.get(c))
        runs.append(row)
    parts = []
    for f in sorted(raw.rglob("steps_*.jsonl")):
        spec = f.stem[len("steps_"):]
        df, extra = latest_steps(*read_step_records(f))
        df["t_sched"] = [x.get("t_sched", 0.0) for x in extra]
        df["outputs_known"] = [x.get("outputs_known", True) for x in extra]
        for key in ("t_gc", "gc_full", "t_timer"):   # the V2 timer's GC pauses and own host seconds in each step
            if any(key in x for x in extra):
                df[key] = [x.get(key) for x in extra]
        for key in ("ngram", "eagle", "none", "ngram_tokens", "eagle_tokens", "pad_tokens", "pad_accepted"):
            df[f"hybrid_{key}"] = [(x.get("hybrid") or {}).get(key) for x in extra]
        df["spec"] = spec
        df["config"] = step_configs(df["run_id"], engines.get(spec, {}).get("config") or {}, spec)
        ecfg = engines.get(spec, {}).get("config") or {}
        df["engine_config"] = engine_config_label(ecfg.get("model_runner"), ecfg.get("async_scheduling"))
        parts.append(df)
    steps = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if len(steps):
        steps["uniform"] = (steps["k"] == 0) | (steps["batched_tokens"] == steps["num_reqs"] * (1 + steps["k"]))
    return pd.DataFrame(runs), steps, list(engines.values())
