"""The V2-runner patches' contract with vLLM: which vLLM 0.25.0 methods they wrap (``V2_WRAPPED``) and, in
``v2_contract.json`` (written by ``gpu/v2_contract.py`` from vLLM's source), each one's parameter names. ``check``
compares the running vLLM's classes with it (``inspect.signature``): a method missing or with other parameters is
a different vLLM, and the patches then wrap nothing (one logged line says which)."""
from __future__ import annotations

import inspect
import json
from pathlib import Path

CONTRACT = Path(__file__).with_name("v2_contract.json")

V2_RUNNER_MODULE = "vllm.v1.worker.gpu.model_runner"
V2_SPEC_MODULE = "vllm.v1.worker.gpu.spec_decode.autoregressive.speculator"
V2_SAMPLER_MODULE = "vllm.v1.worker.gpu.sample.sampler"
V2_REJECTION_MODULE = "vllm.v1.worker.gpu.spec_decode.rejection_sampler"
V2_ASYNC_MODULE = "vllm.v1.worker.gpu.async_utils"

#: (module, Class.method) of every method a V2 patch wraps: the step timer's (runner_v2_patches) and the hybrid's
#: (hybrid_v2: __init__, propose, _multi_step_decode)
V2_WRAPPED = (
    (V2_RUNNER_MODULE, "GPUModelRunner.__init__"),
    (V2_RUNNER_MODULE, "GPUModelRunner.execute_model"),
    (V2_RUNNER_MODULE, "GPUModelRunner.prepare_attn"),
    (V2_RUNNER_MODULE, "GPUModelRunner.sample_tokens"),
    (V2_SAMPLER_MODULE, "Sampler.__call__"),
    (V2_REJECTION_MODULE, "RejectionSampler.__call__"),
    (V2_ASYNC_MODULE, "AsyncOutput.get_output"),
    (V2_SPEC_MODULE, "AutoRegressiveSpeculator.propose"),
    (V2_SPEC_MODULE, "AutoRegressiveSpeculator._multi_step_decode"),
)


def load(path: str | Path = CONTRACT) -> dict:
    return json.loads(Path(path).read_text())


def params(fn) -> list[str]:
    """A function's parameter names as ``gpu/v2_contract.py`` writes them (``*args``, ``**kw`` marked)."""
    out = []
    for p in inspect.signature(fn).parameters.values():
        pre = "*" if p.kind is p.VAR_POSITIONAL else "**" if p.kind is p.VAR_KEYWORD else ""
        out.append(pre + p.name)
    return out


def check(classes: dict, names=None, contract: dict | None = None) -> list[str]:
    """Problems of the running vLLM against the contract, for the ``names`` (``module:Class.method`` keys; default
    every one whose class is in ``classes``, a {``module:Class``: class} map). Empty: the patches may wrap them."""
    contract = contract or load()
    want = contract["wrapped"]
    keys = names if names is not None else [k for k in want if k.rsplit(".", 1)[0] in classes]
    problems = []
    for key in keys:
        if key not in want:
            problems.append(f"{key} is not in the contract")
            continue
        cls = classes.get(key.rsplit(".", 1)[0])
        meth = key.rsplit(".", 1)[1]
        fn = cls.__dict__.get(meth) if cls is not None else None
        if fn is None:
            problems.append(f"{key} is missing")
            continue
        fn = getattr(fn, "_spec_repro_orig", fn)          # one of ours already: compare what it wraps
        try:
            have = params(fn)
        except (TypeError, ValueError) as e:
            problems.append(f"{key}: no signature ({e})")
            continue
        if have != want[key]["params"]:
            problems.append(f"{key}{tuple(have)} differs from vLLM {contract.get('vllm')}'s "
                            f"{tuple(want[key]['params'])}")
    return problems
