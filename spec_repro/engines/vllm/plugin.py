"""Per-step phase timing for vLLM, as a vLLM *general plugin* (no fork of vLLM).

Supported: vLLM 0.25.x with the V1 GPU model runner (``vllm/v1/worker/gpu_model_runner.py``; the engine's
``model_runner="v1"``, ``VLLM_USE_V2_MODEL_RUNNER=0``) or the V2 one (``vllm/v1/worker/gpu/model_runner.py``:
``model_runner="v2"``, or vLLM's own choice for EAGLE and no SD). On any other version or layout the plugin warns
once and stays off; vLLM runs unchanged (V2: every wrapped method checked against ``v2_contract.json``).

The plugin, one job per module (as vLLM's own ``v1/spec_decode/``):

* ``import_hook``: ``register`` (the ``vllm.general_plugins`` entry point, re-exported here), the post-import
  hook that patches the V1 runner and worker modules, the version/layout checks, the worker RPC
  (``spec_repro_steps``) the engine controls it through;
* ``step_timer``: per-step phase timing (CUDA events from a pool, resolved lazily into one JSON row per step:
  ``t_verify``, ``t_reject``, ``t_draft``, ``t_other``);
* ``runner_patches``: the timer's wrappers of ``GPUModelRunner`` and the opt-in draft-model CUDA-graph fix
  (vLLM PR #47460); ``runner_v2_patches``: the timer's wrappers of V2's runner, sampler and EAGLE speculator
  (``v2_contract``: the methods wrapped and their vLLM 0.25.0 signatures);
* ``hybrid_runner``: the live n-gram + EAGLE hybrid wrapped around the runner's drafting (host and device-side
  policies, padding, the GPU checks read in vLLM 0.25's source); ``hybrid_v2``: the device-side policies inside
  V2's EAGLE speculator (vLLM's own token buffer read, no host round trip);
* ``state``: the plugin's per-process state; ``common``: what the engine and the plugin share.

Activation: only when ``SPEC_REPRO_STEP_LOG``, ``SPEC_REPRO_DRAFT_CUDAGRAPHS=1`` or ``SPEC_REPRO_HYBRID`` is set in
the environment of the vLLM processes (the engine's ``step_log=``, ``draft_cudagraphs=``, ``hybrid=`` options).
This module only re-exports the names the engine, the jobs and the tests use.
"""
from __future__ import annotations

from .common import (ENV_DRAFT_CG, ENV_FORCE, ENV_GAP, ENV_HYBRID, ENV_HYBRID_COST, ENV_HYBRID_GRAPHS,  # noqa: F401
                     ENV_HYBRID_PAD, ENV_PATH, HYBRID_OFF, host_probe, prompt_hash)
from .hybrid_runner import (_build_hybrid, _DeviceCounts, _DeviceHybrid, _gpu_hybrid_step, _hybrid_off,  # noqa: F401
                            _hybrid_step, _live_hybrid, patch_hybrid, set_hybrid)
from .import_hook import _on_import, _worker_rpc, check_layout, check_version, register, status  # noqa: F401
from .runner_patches import instrument, patch_draft_cudagraphs  # noqa: F401
from .runner_v2_patches import instrument_v2  # noqa: F401
from .state import (PLUGIN_VERSION, RUNNER_METHODS, RUNNER_MODULE, SUPPORTED_VERSIONS, WORKER_MODULE,  # noqa: F401
                    _ORIG, _state)
from .step_timer import StepRecorder, _recorder, build_row, phase_times, quick_meta, step_meta  # noqa: F401
