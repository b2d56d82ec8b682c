"""What the engine (front process) and the plugin (vLLM's worker) share, below both: the environment variables
the engine sets and the plugin reads, the hybrid's ``off`` policy name, the host-speed probe both time, and the
prompt hash the step rows carry. Imports nothing of the package (so neither side imports the other)."""
from __future__ import annotations

import hashlib
import time

ENV_PATH = "SPEC_REPRO_STEP_LOG"
ENV_GAP = "SPEC_REPRO_STEP_GAP_S"
ENV_FORCE = "SPEC_REPRO_STEP_LOG_FORCE"   # "1": try to patch on an unsupported vLLM version anyway
ENV_DRAFT_CG = "SPEC_REPRO_DRAFT_CUDAGRAPHS"  # "1": replay the draft model's CUDA graphs (vLLM PR #47460)
ENV_HYBRID = "SPEC_REPRO_HYBRID"          # a hybrid.POLICIES name: the live n-gram + EAGLE hybrid (method eagle)
ENV_HYBRID_COST = "SPEC_REPRO_HYBRID_COST"  # adaptive-rule's cost model (preset name or file)
ENV_HYBRID_PAD = "SPEC_REPRO_HYBRID_PAD"    # "1": pad every hybrid draft to k (uniform decode batches)
ENV_HYBRID_GRAPHS = "SPEC_REPRO_HYBRID_GRAPHS"   # "0": the device-side hybrid's steps eager (default: CUDA graphs)
HYBRID_OFF = "off"                          # op="hybrid" policy: vLLM's own EAGLE step, uncounted (EAGLE alone)

#: the V2 step timer's variants an overhead task times against vLLM's own methods (``off``), each the ``op=
#: "instrument"`` arguments and whether the run records: ``timer`` is what every timed run uses (all parts, rows
#: built at flush); ``hooks`` its wrappers installed but recording nothing (their Python alone); ``step`` only a
#: row per step (its bounds and accepted counts); ``drain`` rows also built at the sampler, as the V1 timer does
TIMER_VARIANTS = {
    "off": {"on": False, "record": False},
    "timer": {"on": True, "record": True, "parts": None, "defer": True},
    "hooks": {"on": True, "record": False, "parts": None, "defer": True},
    "step": {"on": True, "record": True, "parts": ["step"], "defer": True},
    "drain": {"on": True, "record": True, "parts": None, "defer": False},
}


def host_probe(n: int = 100_000) -> float:
    """Milliseconds a fixed pure-Python loop takes here now (~3-5 ms on an idle core): a reading of the host
    CPU's speed at the time, independent of the engine, for runs whose host phases the host's speed sets (a 1.5B
    target's decode step is mostly host work on an H200). Timed in the driver process, it does NOT track the engine
    core's host speed on the lent H200 (data/gpu/v1-runner/host-drift: r = 0.04-0.12 with the run's drafting time;
    the run's
    own t_other does, ``live.host_index``); it stays recorded beside each run as that evidence. The plugin's
    ``op="probe"`` times it in the engine's worker."""
    t0 = time.perf_counter()
    x = 0
    for i in range(n):
        x += i & 7
    return (time.perf_counter() - t0) * 1e3


def prompt_hash(ids) -> str:
    """sha1 of the prompt's token ids as int32 bytes, first 12 hex digits (a step row's ``new_reqs``)."""
    import numpy as np

    return hashlib.sha1(np.asarray(list(ids), dtype=np.int32).tobytes()).hexdigest()[:12]
