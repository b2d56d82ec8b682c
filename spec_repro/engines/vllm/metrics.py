"""What one engine run measures: vLLM's own spec-decode counters (``parse_spec_metrics`` of ``llm.get_metrics()``
or of an engine's own stat logger, ``own_counters``; ``diff_spec_metrics`` around a run), the hypervisor's steal
time (``cpu_steal_s``) and the run's record, ``RunResult``. Needs neither vLLM nor a GPU."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Iterable

_SPEC_KEYS = {"num_drafts": "spec_decode_num_drafts", "num_draft_tokens": "spec_decode_num_draft_tokens",
              "num_accepted_tokens": "spec_decode_num_accepted_tokens"}
_PER_POS = "spec_decode_num_accepted_tokens_per_pos"
_GEN = "vllm:generation_tokens"


def parse_spec_metrics(metrics: Iterable) -> dict:
    """vLLM's spec-decode counters from ``llm.get_metrics()`` (Metric objects or their dicts), summed over label
    sets: num_drafts, num_draft_tokens, num_accepted_tokens, accepted_per_pos (list), and the engine's own
    generated-token counter (``vllm:generation_tokens``) as generation_tokens."""
    out = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "accepted_per_pos": [],
           "generation_tokens": 0}
    for m in metrics:
        d = m if isinstance(m, dict) else {"name": getattr(m, "name", ""), "value": getattr(m, "value", None),
                                           "values": getattr(m, "values", None)}
        name = str(d.get("name", "")).removesuffix("_total")
        if name.endswith(_PER_POS):
            vals = [int(v) for v in (d.get("values") or [])]
            acc = out["accepted_per_pos"]
            acc.extend([0] * (len(vals) - len(acc)))
            for i, v in enumerate(vals):
                acc[i] += v
            continue
        if name.endswith(_GEN):
            out["generation_tokens"] += int(d.get("value") or 0)
            continue
        for key, suffix in _SPEC_KEYS.items():
            if name.endswith(suffix):
                out[key] += int(d.get("value") or 0)
    return out


def own_counters(llm) -> list[dict] | None:
    """This engine's own spec-decode and generated-token counters, read from the Prometheus objects its stat logger
    holds, in the form ``parse_spec_metrics`` reads; None where vLLM's objects are not found. ``llm.get_metrics()``
    reads the process-wide registry, and vLLM 0.25's PrometheusStatLogger unregisters every earlier engine's
    collectors when an engine starts (``vllm/v1/metrics/loggers.py``): beside another engine in one process, the
    registry holds the last-started engine's counters, while each engine's logger keeps counting into its own."""
    try:
        prom = next(lg for lg in llm.llm_engine.logger_manager.stat_loggers if hasattr(lg, "spec_decoding_prom"))
        out = [{"name": _GEN, "value": _count(c)} for c in prom.counter_generation_tokens.values()]
        sd = prom.spec_decoding_prom
        if getattr(sd, "spec_decoding_enabled", False):
            for suffix in _SPEC_KEYS.values():
                out += [{"name": f"vllm:{suffix}", "value": _count(c)}
                        for c in getattr(sd, f"counter_{suffix}").values()]
            out += [{"name": f"vllm:{_PER_POS}", "values": [_count(c) for c in cs]}
                    for cs in sd.counter_spec_decode_num_accepted_tokens_per_pos.values()]
        return out
    except (AttributeError, StopIteration, TypeError):
        return None


def _count(counter) -> float:
    """A Prometheus counter's value, through its public ``collect()`` (the ``_total`` sample)."""
    return next(s.value for m in counter.collect() for s in m.samples if s.name.endswith("_total"))


def diff_spec_metrics(after: dict, before: dict) -> dict:
    n = max(len(after["accepted_per_pos"]), len(before["accepted_per_pos"]))
    a = after["accepted_per_pos"] + [0] * (n - len(after["accepted_per_pos"]))
    b = before["accepted_per_pos"] + [0] * (n - len(before["accepted_per_pos"]))
    d = {k: after[k] - before[k] for k in _SPEC_KEYS}
    d["accepted_per_pos"] = [x - y for x, y in zip(a, b)]
    if "generation_tokens" in after and "generation_tokens" in before:
        d["generation_tokens"] = after["generation_tokens"] - before["generation_tokens"]
    return d


def cpu_steal_s(stat: str = "/proc/stat") -> float | None:
    """Seconds of CPU time the hypervisor has taken from this VM, all CPUs together (``/proc/stat``'s steal
    column, in USER_HZ), or None where there is no such file. A step's host phases (EAGLE's drafting, the rest)
    can run up to ~1.8x slower for tens of seconds at a time inside one engine, the GPU's verify time unchanged;
    the lent H200 is a KVM guest: its runs record this beside their wall time."""
    import os

    try:
        with open(stat) as f:
            fields = f.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


@dataclass
class RunResult:
    run_id: str
    model: str
    method: str
    k: int
    batch_size: int
    n_requests: int
    prompt_len: int              # of the first request
    output_tokens: int           # generated, all requests
    wall_s: float
    output_tok_per_s: float
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list = field(default_factory=list)
    acceptance_length: float | None = None       # 1 + accepted / drafts (tokens per step, bonus included)
    acceptance_rate: float | None = None         # accepted / draft tokens
    per_position_rate: list = field(default_factory=list)
    instrumented: bool = False
    label: str = ""
    outputs: list | None = None                  # generated token ids per request (when kept)
    host_steal_s: float | None = None            # CPU time the hypervisor took from this VM during the run
    host_probe_ms: float | None = None           # host_probe() just before the run: the host CPU's speed then
    engine_probe_ms: float | None = None         # host_probe() in the engine's worker just before the run
    engine_probe_end_ms: float | None = None     # ... and just after it (VLLMEngine.engine_probe)
    vllm_generation_tokens: int | None = None    # vLLM's own generated-token counter over the run
    counters: str = "registry"                   # read from: this engine's own logger ("engine") or the registry
    registry_agrees: bool | None = None          # the registry's diff equals the engine's own (alone in a process)

    @classmethod
    def from_counts(cls, *, spec: dict, **kw) -> "RunResult":
        r = cls(**kw, num_drafts=spec["num_drafts"], num_draft_tokens=spec["num_draft_tokens"],
                num_accepted_tokens=spec["num_accepted_tokens"], accepted_per_pos=list(spec["accepted_per_pos"]),
                vllm_generation_tokens=spec.get("generation_tokens"))
        if r.num_drafts > 0:
            r.acceptance_length = 1 + r.num_accepted_tokens / r.num_drafts
            r.per_position_rate = [a / r.num_drafts for a in r.accepted_per_pos]
        if r.num_draft_tokens > 0:
            r.acceptance_rate = r.num_accepted_tokens / r.num_draft_tokens
        return r

    def to_dict(self, with_outputs: bool = False) -> dict:
        d = asdict(self)
        if not with_outputs:
            d.pop("outputs")
        return d
