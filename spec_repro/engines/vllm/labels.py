"""Labels that say what ran: the model runner vLLM used, whether the timing plugin was on, async scheduling.

vLLM 0.25 has two GPU model runners and picks one itself (``VllmConfig.use_v2_model_runner``): V2 for dense
generate models with no SD or EAGLE, V1 for n-gram (V2 lists it as unsupported). The plugin's step timing hooks
the V1 runner (``runner_patches``) and the V2 runner (``runner_v2_patches``); the committed timed runs forced V1
(``VLLMConfig.model_runner="v1"``, i.e. ``VLLM_USE_V2_MODEL_RUNNER=0``), ``v2-forced`` forces V2
(``VLLM_USE_V2_MODEL_RUNNER=1``) for timed V2 runs. Every run row therefore carries

- ``runner`` (``v1`` / ``v2``): the runner that ran, read from vLLM (``resolved_engine``: the front process's
  resolved ``VllmConfig``, which is the config the engine core receives; or the worker's log line, ``runner_from_log``),
  ``runner_forced`` beside it (``v1`` when the package forced it, empty when vLLM chose);
- ``async_scheduling`` (bool): vLLM's resolved ``scheduler_config.async_scheduling``, with
  ``async_scheduling_forced`` (the value the package passed; empty: vLLM's choice);
- ``instrumented`` (bool): the plugin timed the run's steps;
- ``runner_source``: ``vllm_config`` / ``log`` (read from vLLM), or ``config`` (inferred from the recorded engine
  configuration and vLLM 0.25's rules, for runs recorded before vLLM was asked).

Engine configurations (``engine_config``): ``default`` only where vLLM chose everything (no forced runner, no forced
async scheduling); ``v1-forced`` the V1 runner forced, vLLM's own scheduling (``default`` in tables that predate
the runner labels); ``study-like`` V1 forced and synchronous (the study's vLLM 0.10). ``relabel_runs`` turns an
older runs table (``default`` on a forced V1 runner, ``vllm-default``) into these labels.
"""
from __future__ import annotations

import re

# engine configuration -> VLLMConfig fields
ENGINE_CONFIGS = {"v1-forced": {"async_scheduling": None, "model_runner": "v1"},
                  "study-like": {"async_scheduling": False, "model_runner": "v1"},
                  "default": {"async_scheduling": None, "model_runner": "default"},
                  "v2-forced": {"async_scheduling": None, "model_runner": "v2"}}
LEGACY_CONFIGS = {"vllm-default": "default"}       # older labels that still name a configuration above
UNTIMED_CONFIGS = ("default",)      # vLLM's own choice, kept uninstrumented (what a user runs); v2-forced times V2
# how a figure, table or README names each configuration
DISPLAY = {"v1-forced": "V1 runner (forced)", "study-like": "V1 runner (forced), synchronous",
           "default": "vLLM's choice (V2 runner where it allows)", "v2-forced": "V2 runner (forced)"}
V2_UNSUPPORTED_METHODS = ("ngram", "ngram_gpu", "suffix", "custom_class")   # vLLM 0.25: these run on V1 only
SYNC_METHODS = ("ngram", "draft_model", "custom_class", "suffix")   # vLLM 0.25 turns async scheduling off for them


def engine_config_label(model_runner: str | None, async_scheduling: bool | None) -> str:
    """The configuration a forced runner / forced async setting makes (``model_runner``: ``v1``, ``v2`` or
    ``default``/None = vLLM's choice; ``async_scheduling``: None = vLLM's choice)."""
    forced = None if model_runner in (None, "", "default") else str(model_runner)
    if forced is None and async_scheduling is None:
        return "default"
    if forced == "v1" and async_scheduling is None:
        return "v1-forced"
    if forced == "v1" and async_scheduling is False:
        return "study-like"
    parts = [f"{forced}-forced" if forced else "runner-default",
             *([] if async_scheduling is None else ["async" if async_scheduling else "sync"])]
    return "-".join(parts)


def canonical_config(name: str) -> str:
    """A configuration name as this package spells it now (``vllm-default`` -> ``default``)."""
    return LEGACY_CONFIGS.get(name, name)


def vllm_runner(method: str, model_runner: str | None) -> str:
    """The runner vLLM 0.25 runs for a dense Qwen2/Llama target (``config/vllm.py``): the forced one, else V1 for
    the methods V2 does not support, V2 otherwise. An inference: ``resolved_engine`` reads it from vLLM itself."""
    if model_runner in ("v1", "v2"):
        return model_runner
    return "v1" if method in V2_UNSUPPORTED_METHODS else "v2"


def vllm_async(method: str, async_scheduling: bool | None) -> bool:
    """Async scheduling as vLLM 0.25 resolves it: the forced value, else on except for the synchronous methods."""
    if async_scheduling is not None:
        return bool(async_scheduling)
    return method not in SYNC_METHODS


# ---- reading what vLLM ran -----------------------------------------------------------------------------------
_V2_LOG = re.compile(r"Using V2 Model Runner", re.I)
_V1_LOG = re.compile(r"VLLM_USE_V2_MODEL_RUNNER=0|Using V1 Model Runner|MRv2 does not yet support|"
                     r"not supported by the v2 model runner|using the V1 model runner", re.I)


def runner_from_log(text: str) -> str | None:
    """``v2`` when vLLM's worker logged "Using V2 Model Runner", ``v1`` when it logged a V1 choice or a V2
    refusal, None when the log says neither (the V1 runner logs nothing of its own in 0.25)."""
    if _V2_LOG.search(text):
        return "v2"
    if _V1_LOG.search(text):
        return "v1"
    return None


def resolved_engine(llm) -> dict:
    """What vLLM resolved for a built ``vllm.LLM``: ``runner`` (``v1``/``v2``) from its ``VllmConfig
    .use_v2_model_runner`` and ``async_scheduling`` from ``scheduler_config.async_scheduling``, both read in this
    (front) process, whose resolved config is the one sent to the engine core (same environment, same config);
    ``runner_source`` says where it came from (``vllm_config``) or None when vLLM's layout hides it."""
    out = {"runner": None, "async_scheduling": None, "runner_source": None}
    vc = None
    for path in (("llm_engine", "vllm_config"), ("llm_engine", "engine_core", "vllm_config")):
        obj = llm
        for a in path:
            obj = getattr(obj, a, None)
        if obj is not None:
            vc = obj
            break
    if vc is None:
        return out
    try:
        v2 = vc.use_v2_model_runner
        out["runner"] = None if v2 is None else ("v2" if v2 else "v1")
        out["runner_source"] = "vllm_config"
    except Exception:
        pass
    try:
        a = vc.scheduler_config.async_scheduling
        out["async_scheduling"] = None if a is None else bool(a)
    except Exception:
        pass
    return out


def run_labels(cfg: dict, engine: dict) -> dict:
    """The label columns of one run row from its engine's config and record (``engine["resolved"]``: what
    ``resolved_engine`` read; older records have none and are inferred from the config, ``runner_source=config``)."""
    method = cfg.get("method") or "none"
    forced_runner = cfg.get("model_runner")
    forced_runner = None if forced_runner in (None, "", "default") else forced_runner
    forced_async = cfg.get("async_scheduling")
    res = engine.get("resolved") or {}
    runner = res.get("runner") or vllm_runner(method, forced_runner)
    asy = res.get("async_scheduling")
    return {"runner": runner, "runner_forced": forced_runner,
            "runner_source": res.get("runner_source") or "config",
            "async_scheduling": vllm_async(method, forced_async) if asy is None else bool(asy),
            "async_scheduling_forced": forced_async,
            "engine_config": engine_config_label(forced_runner, forced_async)}


def relabel_runs(runs, engines: dict | None = None):
    """An older runs table with the labels above: ``runner``, ``runner_forced``, ``runner_source``,
    ``async_scheduling`` (resolved), ``async_scheduling_forced`` (the old ``async_scheduling`` column: what was
    passed) and ``engine_config`` from the forced settings. ``engines``: spec -> engine record (its ``config`` and
    ``resolved``), else the row's own ``model_runner`` / ``async_scheduling`` / ``method``. Idempotent: a table
    that already has ``async_scheduling_forced`` keeps its resolved columns."""
    import pandas as pd

    df = runs.copy()
    if "method" not in df.columns or "engine_config" not in df.columns:     # not a vLLM run table: nothing to label
        return df
    if "async_scheduling_forced" in df.columns and "runner" in df.columns:
        df["engine_config"] = df["engine_config"].map(lambda v: canonical_config(v) if isinstance(v, str) else v)
        return df
    rows = []
    for _i, r in df.iterrows():
        e = (engines or {}).get(r.get("spec"), {})
        cfg = dict(e.get("config") or {})
        for key in ("method", "model_runner", "async_scheduling"):
            if key not in cfg and key in r and not (isinstance(r[key], float) and pd.isna(r[key])):
                cfg[key] = r[key]
        cfg.setdefault("method", r.get("method"))
        if cfg.get("async_scheduling") is not None:
            cfg["async_scheduling"] = bool(cfg["async_scheduling"])
        rows.append(run_labels(cfg, e))
    lab = pd.DataFrame(rows, index=df.index)
    df = df.drop(columns=[c for c in ("async_scheduling",) if c in df.columns])
    for c in lab.columns:
        df[c] = lab[c]
    if "instrumented" in df.columns:
        df["instrumented"] = df["instrumented"].fillna(False).astype(bool)
    return df
