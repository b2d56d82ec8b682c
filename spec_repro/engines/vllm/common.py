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

#: how the V2 timer records its CUDA events by default: through the driver's ``cuEventRecord`` with the GIL held
#: (``step_timer.driver_record``); torch's ``Event.record`` releases the GIL on every call, five to seven a step, and
#: on a host-bound step another thread may take it there
V2_EVENT_API = "driver"
#: the V2 step timer's variants an overhead task times against vLLM's own methods (``off``), each the ``op=
#: "instrument"`` arguments and whether the run records: ``timer`` is what every timed run uses (all parts, rows
#: built at flush, events through ``V2_EVENT_API``); ``hooks`` its wrappers installed but recording nothing (their
#: Python alone); ``step`` only a row per step (its bounds and accepted counts); ``drain`` rows also built at the
#: sampler, as the V1 timer does; ``toggle`` the timer in blocks of ``toggle`` steps, in each pair of blocks one
#: passed through (which, drawn per pair), each step's start clocked (:func:`toggle_periods`: timed and untimed
#: steps of one run side by side, under the same host speed); ``toggle-torch`` the same, its events recorded with
#: torch's ``Event.record``
TIMER_VARIANTS = {
    "off": {"on": False, "record": False},
    "timer": {"on": True, "record": True, "parts": None, "defer": True},
    "toggle": {"on": True, "record": True, "parts": None, "defer": True, "toggle": 4},
    "toggle-torch": {"on": True, "record": True, "parts": None, "defer": True, "toggle": 4, "event_api": "torch"},
    "hooks": {"on": True, "record": False, "parts": None, "defer": True},
    "step": {"on": True, "record": True, "parts": ["step"], "defer": True},
    "drain": {"on": True, "record": True, "parts": None, "defer": False},
}


def toggle_periods(clock, skip: int = 2, warm: int = 8) -> dict:
    """A ``toggle`` run's clock (each step's ``execute_model`` entry, perf_counter seconds, negative where the
    step was passed through untimed) -> per arm the median period of its steps, in ms: a step's period runs from its
    entry to the next step's. Left out: the run's first ``warm`` steps (the prefill), the first ``skip`` periods
    after each change of arm (the other arm's work still lands there: the previous step's async output is read,
    its host work overlaps) and the run's last step (no next entry). ``toggle_timed_ms`` / ``toggle_free_ms`` and
    the periods kept, ``toggle_periods``; {} where either arm has none. The medians leave out the host's stalls
    (milliseconds long, a step in a hundred on a lent H100), which land in either arm by chance; the host's speed,
    which drifts over tens of steps, is alike in blocks a few steps apart."""
    import numpy as np

    t = np.asarray(clock, dtype=float)
    if t.size < 3:
        return {}
    timed = t > 0
    period = np.diff(np.abs(t))
    change = np.concatenate([[0], np.flatnonzero(timed[1:] != timed[:-1]) + 1])   # where each arm's stretch starts
    pos = np.arange(t.size) - change[np.searchsorted(change, np.arange(t.size), side="right") - 1]
    keep = ((np.arange(t.size) >= warm) & (pos >= skip))[:-1]
    arms = {"timed": period[keep & timed[:-1]], "free": period[keep & ~timed[:-1]]}
    if any(a.size == 0 for a in arms.values()):
        return {}
    return {"toggle_timed_ms": float(np.median(arms["timed"]) * 1e3),
            "toggle_free_ms": float(np.median(arms["free"]) * 1e3),
            "toggle_periods": int(keep.sum())}


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
