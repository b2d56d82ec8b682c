"""The plugin's state in one vLLM process: what it patched, what it disabled and why, the hybrid's policy, which
model runner ran (``runner``: ``v1`` / ``v2``, set by the wrappers of the runner that executes); the V1 runner
layout it was written against (V2's is ``v2_contract``). Shared by the import hook, the runner patches and the
hybrid glue."""
from __future__ import annotations

import logging
import threading

logger = logging.getLogger("spec_repro.vllm_plugin")

PLUGIN_VERSION = 3   # 1: events resolved inside the step; 2: resolved while the GPU runs; 3: + lazy batch shape
SUPPORTED_VERSIONS = ("0.25.",)           # prefixes of vllm.__version__
RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
WORKER_MODULE = "vllm.v1.worker.gpu_worker"

# method -> parameter names that must be present (the layout this plugin was written against)
RUNNER_METHODS = {
    "execute_model": ("scheduler_output",),
    "sample_tokens": ("grammar_output",),
    "_model_forward": (),
    "_sample": ("logits", "spec_decode_metadata"),
    "propose_draft_token_ids": ("scheduler_output",),
}

_state = {"registered": False, "disabled_reason": None, "patched": False, "draft_cudagraphs": False,
          "hybrid": None, "hybrid_error": None, "hybrid_pad": False, "hybrid_now": None, "hybrid_installed": False,
          "runner": None, "v2_patched": False, "v2_disabled_reason": None}

_ORIG: dict[str, object] = {}
_lock = threading.Lock()

