"""The study's methods in vLLM, one package (importing it needs neither vLLM nor a GPU).

``engine``: configuration and engine (``VLLMConfig``, ``VLLMEngine``, ...; re-exported here, so
``from spec_repro.engines.vllm import VLLMConfig`` works); ``metrics``: what a run measures (vLLM's spec-decode
counters, ``RunResult``); ``plugin``: per-step phase timing as a vLLM general
plugin (entry point ``spec_repro.engines.vllm.plugin:register``); ``jobs``: the runner of the device jobs
(``python -m spec_repro.engines.vllm.jobs``); ``steps``: step tables -> phase breakdown, overhead, HBM floor;
``summary``: raw device outputs -> ``data/gpu``; ``agreement``: vLLM's acceptance against this package's;
``smollm2``: SmolLM2 prompts and weights for vLLM; ``decode``: greedy decoding with vLLM for ``--engine vllm``;
``hybrid``: the live n-gram + EAGLE hybrid's per-step choice of the proposal to verify and its engine-step pieces
(pure Python, no vLLM; the plugin's ``patch_hybrid`` runs it inside vLLM, ``jobs hybrid`` measures it);
``live``: the live runs' command line (``python -m spec_repro.engines.vllm.live``; its names re-exported from
``live_runs``: a raw live folder read back, ``live_summary``: raw -> a folder of tables, ``live_throughput``: the
measured tables, ``live_profile``: the hybrid task's requests profiled, ``live_model``: the step-cost fit and
prediction, ``live_tables``: measured against predicted).
"""
from .engine import (
    METHODS,
    RunResult,
    VLLMConfig,
    VLLMEngine,
    VLLMEngineError,
    diff_spec_metrics,
    engine_env,
    engine_kwargs,
    parse_spec_metrics,
    random_prompts,
    require_vllm,
    speculative_config,
    study_prompt,
)
from .engine import SUPPORTED_VLLM as SUPPORTED_VLLM

__all__ = [   # as engine.__all__
    "METHODS", "VLLMConfig", "VLLMEngine", "VLLMEngineError", "RunResult", "speculative_config", "engine_kwargs",
    "engine_env", "parse_spec_metrics", "diff_spec_metrics", "require_vllm", "study_prompt", "random_prompts",
]
