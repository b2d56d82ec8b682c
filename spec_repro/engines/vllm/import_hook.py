"""The import hook: ``register`` (the ``vllm.general_plugins`` entry point, through ``plugin.register``) installs a
post-import hook that patches the V1 model runner, the V2 model runner (``vllm/v1/worker/gpu/model_runner.py``:
``runner_v2_patches``, ``hybrid_v2``) and the worker module in whichever process imports them. vLLM's worker
imports V2's runner module only when it runs V2 (``v1/worker/gpu_worker.py``), so the V2 patches follow the runner
the worker actually runs; the wrappers of the runner that executes set the status's ``runner`` (``v1``/``v2``).

Activation: only when ``SPEC_REPRO_STEP_LOG=<path>`` is set in the environment of the vLLM processes (the
engine option ``step_log=`` sets it). vLLM loads general plugins in every process (``vllm.plugins.
load_general_plugins``: the front process, the engine core and each worker); ``register()`` only installs an
import hook, so the model runner is patched in whichever process imports it (the worker) and nowhere else.

Control from the front process (``LLM.collective_rpc("spec_repro_steps", kwargs={...})``, see
``spec_repro.engines.vllm.VLLMEngine``): ``op="context"`` sets run_id/model/method/k/batch_size/detail/record,
``op="instrument"`` with ``on=False`` restores vLLM's original methods, V1's and V2's (for overhead measurements;
``parts=`` / ``defer=`` install a variant of the V2 timer: ``common.TIMER_VARIANTS``),
``op="flush"`` writes pending rows and returns how many rows were written so far, ``op="clock"`` returns the
``toggle`` variant's clock of the last run, ``op="hybrid"`` with
``policy=`` switches the installed hybrid between runs (``set_hybrid``: one engine measures EAGLE alone, the idle
hybrid and the hybrids interleaved, so engine-to-engine host noise cancels), ``op="probe"`` times
``common.host_probe`` in the worker (``VLLMEngine.engine_probe``: the host's speed where t_draft and t_other
accrue, read just before and after each run, outside its timed window).
"""
from __future__ import annotations

import importlib
import importlib.abc
import os
import sys
import warnings

from .common import ENV_DRAFT_CG, ENV_FORCE, ENV_HYBRID, ENV_PATH, host_probe
from .hybrid_runner import patch_hybrid, set_hybrid
from .runner_patches import _guard, instrument, patch_draft_cudagraphs
from .runner_v2_patches import install as install_v2_timer
from .runner_v2_patches import clock_read, clock_reset, instrument_v2, v2_classes
from .v2_contract import V2_ASYNC_MODULE, V2_REJECTION_MODULE, V2_RUNNER_MODULE, V2_SAMPLER_MODULE, V2_SPEC_MODULE
from .state import PLUGIN_VERSION, RUNNER_METHODS, RUNNER_MODULE, SUPPORTED_VERSIONS, WORKER_MODULE, _ORIG, _state, \
    logger
from .step_timer import _recorder


def register() -> None:
    """Entry point of the ``vllm.general_plugins`` group. Idempotent; a no-op unless SPEC_REPRO_STEP_LOG,
    SPEC_REPRO_DRAFT_CUDAGRAPHS or SPEC_REPRO_HYBRID is set."""
    if _state["registered"] or not (os.environ.get(ENV_PATH) or os.environ.get(ENV_DRAFT_CG) == "1"
                                    or os.environ.get(ENV_HYBRID)):
        return
    _state["registered"] = True
    ok, why = check_version()
    if not ok and os.environ.get(ENV_FORCE) != "1":
        _disable(why)
        return
    mod = sys.modules.get(RUNNER_MODULE)
    if mod is not None:
        _on_import(RUNNER_MODULE, mod)
    wmod = sys.modules.get(WORKER_MODULE)
    if wmod is not None:
        _on_import(WORKER_MODULE, wmod)
    v2mod = sys.modules.get(V2_RUNNER_MODULE)
    if v2mod is not None:
        _on_import(V2_RUNNER_MODULE, v2mod)
    if not any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PostImportFinder())


def check_version(version: str | None = None) -> tuple[bool, str]:
    """(supported?, reason). ``version`` defaults to the installed vLLM's."""
    if version is None:
        try:
            import vllm

            version = getattr(vllm, "__version__", "unknown")
        except Exception as e:  # pragma: no cover - only without vLLM
            return False, f"vLLM cannot be imported ({e})"
    if any(version.startswith(p) for p in SUPPORTED_VERSIONS):
        return True, f"vLLM {version}"
    return False, (f"vLLM {version} is not a supported version (supported: "
                   f"{', '.join(p + 'x' for p in SUPPORTED_VERSIONS)}); set {ENV_FORCE}=1 to try anyway")


def check_layout(runner_cls) -> list[str]:
    """Problems with the model runner class's layout (empty list = the plugin can patch it)."""
    import inspect

    problems = []
    for name, params in RUNNER_METHODS.items():
        fn = getattr(runner_cls, name, None)
        if fn is None or not callable(fn):
            problems.append(f"{runner_cls.__name__}.{name} is missing")
            continue
        try:
            have = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            continue
        for p in params:
            if p not in have:
                problems.append(f"{runner_cls.__name__}.{name} has no parameter {p!r}")
    return problems


def status() -> dict:
    """The plugin's state; ``patched``: the timing wrappers of the runner that runs are installed (V2's when the
    worker runs V2, else V1's)."""
    patched = _state["v2_patched"] if _state["runner"] == "v2" else _state["patched"]
    return {"registered": _state["registered"], "patched": patched, "version": PLUGIN_VERSION,
            "runner": _state["runner"], "v1_patched": _state["patched"], "v2_patched": _state["v2_patched"],
            "v2_disabled_reason": _state["v2_disabled_reason"],
            "disabled_reason": _state["disabled_reason"], "path": os.environ.get(ENV_PATH),
            "draft_cudagraphs": _state["draft_cudagraphs"], "hybrid": _state["hybrid"],
            "hybrid_error": _state["hybrid_error"], "hybrid_pad": _state["hybrid_pad"],
            "hybrid_now": _state["hybrid_now"] or _state["hybrid"]}


def _disable(why: str) -> None:
    _state["disabled_reason"] = why
    msg = f"spec_repro step timing DISABLED: {why}"
    logger.warning(msg)
    warnings.warn(msg, RuntimeWarning, stacklevel=2)
    print(f"[spec_repro] {msg}", file=sys.stderr, flush=True)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Patches the V1 / V2 model runner and worker modules right after they are imported (in whichever process)."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in (RUNNER_MODULE, WORKER_MODULE, V2_RUNNER_MODULE):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _PatchingLoader(spec.loader, fullname)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner, name):
        self.inner, self.name = inner, name

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        _on_import(self.name, module)

    def __getattr__(self, item):  # get_source, is_package, ... for tools that ask the loader
        return getattr(self.inner, item)


def _on_import(name: str, module) -> None:
    try:
        if name == RUNNER_MODULE:
            cls = getattr(module, "GPUModelRunner", None)
            if cls is None:
                _disable(f"{RUNNER_MODULE} has no GPUModelRunner")
                return
            problems = check_layout(cls)
            if problems:
                _disable("unsupported model-runner layout: " + "; ".join(problems))
                return
            if os.environ.get(ENV_DRAFT_CG) == "1":
                patch_draft_cudagraphs(cls)
            if os.environ.get(ENV_HYBRID):
                patch_hybrid(cls)
            if not os.environ.get(ENV_PATH):
                return
            _ORIG["runner_cls"] = cls
            _ORIG["async_out_cls"] = getattr(module, "AsyncGPUModelRunnerOutput", None)
            instrument(True)
        elif name == V2_RUNNER_MODULE:
            _on_v2_import(module)
        elif name == WORKER_MODULE:
            worker_cls = getattr(module, "Worker", None)
            if worker_cls is not None:
                worker_cls.spec_repro_steps = _worker_rpc
    except Exception as e:  # never break vLLM because of the timer
        _disable(f"patching {name} failed: {type(e).__name__}: {e}")


def _on_v2_import(module) -> None:
    """V2's runner module imported: the V2 classes the contract names (the EAGLE speculator's module is imported
    here: vLLM imports it only when it builds the speculator), the hybrid first, then the timer around it."""
    mods = {V2_RUNNER_MODULE: module}
    for m in (V2_SAMPLER_MODULE, V2_REJECTION_MODULE, V2_ASYNC_MODULE, V2_SPEC_MODULE):
        try:
            mods[m] = importlib.import_module(m)
        except Exception as e:        # the classes' absence is reported by the contract check
            mods[m] = None
            print(f"[spec_repro] {m} not importable: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    classes = v2_classes(mods)
    if os.environ.get(ENV_HYBRID):
        from .hybrid_v2 import patch_hybrid_v2

        patch_hybrid_v2(classes)
    if os.environ.get(ENV_PATH):
        install_v2_timer(classes)


def _worker_rpc(self, op: str = "status", **kw):
    """``Worker.spec_repro_steps``: called through ``LLM.collective_rpc("spec_repro_steps", kwargs=...)``."""
    rec = _recorder()
    _guard(rec.flush)
    if op == "context":
        rec.set_context(**kw)
        clock_reset(kw.get("run_id", ""))
    elif op == "instrument":
        instrument(bool(kw.get("on", True)))
        instrument_v2(bool(kw.get("on", True)), parts=kw.get("parts"), defer=kw.get("defer"),
                      toggle=kw.get("toggle"), event_api=kw.get("event_api"))
    elif op == "clock":      # the toggle variant's clock of the run just made (runner_v2_patches._CLOCK)
        return {"clock": clock_read(), "pid": os.getpid()}
    elif op == "hybrid":
        set_hybrid(kw.get("policy"))
    elif op == "probe":      # the host's speed in THIS process (the engine core's worker), between runs
        return {"probe_ms": host_probe(), "pid": os.getpid()}
    return {**status(), "rows": rec.rows_written, "pid": os.getpid(), "context": dict(rec.ctx)}
