"""What ran behind each row of the reproduction summary: the runner, the weights and the engine configuration
(``summary.csv``'s ``runner``, ``weights`` and ``configuration`` columns, ``findings.read_summaries``).

A measured vLLM row's source ends in ``[runner: ...; weights: ...; configuration: ...]`` (``label_text``), written
by ``measured`` from the engine records of the runs it read (each engine's resolved vLLM config where recorded,
else its config: ``engines.vllm.labels.run_labels``). ``row_labels`` reads that back; a row without it (simulated,
the CPU engine, the traces, a summary written before sources carried it) is labelled from what its source says:

- simulated: no runner (``simulated``), the traces' weights, configuration = the cost model;
- this package's torch engine on the CPU: ``spec_repro torch (CPU)``, real weights;
- traces: the outputs' decoder (this package's collection with vLLM, or the study's vLLM on H100s), real weights,
  greedy decoding, acceptance profiled over the outputs (no runner's timing in it);
- a vLLM source that names its runner (``V1 runner (forced)``, ``default engine ... V2 runner``) that runner.

``not recorded`` is what a row gets when its source says none of these.
"""
from __future__ import annotations

import re
from typing import Iterable

LABEL_RE = re.compile(r"\[runner: (?P<runner>[^;\]]+); weights: (?P<weights>[^;\]]+); "
                      r"configuration: (?P<configuration>[^\]]+)\]")
COLUMNS = ("runner", "weights", "configuration")
UNKNOWN = "not recorded"


def label_text(engines: Iterable[dict]) -> str:
    """``[runner: ...; weights: ...; configuration: ...]`` for the engines (dicts with ``method``, ``runner``,
    ``weights``, ``engine_config``) behind a row: one runner, or each method's where they differ (``none v2,
    ngram v1``); weights and configurations joined by ``/``. Empty when there are none."""
    engines = list(engines)
    if not engines:
        return ""
    by_method: dict[str, set] = {}
    for e in engines:
        by_method.setdefault(str(e.get("method")), set()).add(str(e.get("runner") or UNKNOWN))
    runners = {r for s in by_method.values() for r in s}
    runner = next(iter(runners)) if len(runners) == 1 else \
        ", ".join(f"{m} {'/'.join(sorted(s))}" for m, s in sorted(by_method.items()))
    weights = "/".join(sorted({str(e.get("weights") or UNKNOWN) for e in engines}))
    conf = "/".join(sorted({str(e.get("engine_config") or UNKNOWN) for e in engines}))
    return f"[runner: {runner}; weights: {weights}; configuration: {conf}]"


def _weights(text: str, default: str) -> str:
    if "dummy weights" in text:
        return "dummy"
    return "real" if "real weights" in text else default


def row_labels(quantity: str, source: str) -> dict:
    """The row's ``runner``, ``weights`` and ``configuration`` (module docstring)."""
    source, text = str(source or ""), f"{quantity or ''} {source or ''}"
    m = LABEL_RE.search(source)
    if m:
        return {k: v.strip() for k, v in m.groupdict().items()}
    cm = re.search(r"cost model ([\w.\-]+)", text)
    if source.startswith("simulated"):
        traces = "the study's published traces" if "published" in source else "this package's traces"
        return {"runner": "simulated", "weights": f"real ({traces})",
                "configuration": f"cost model {cm.group(1)}" if cm else UNKNOWN}
    if "spec_repro torch engine" in source or source.startswith("measured on CPU") or "CPU torch engine" in text:
        return {"runner": "spec_repro torch (CPU)", "weights": "real", "configuration": "eager, float32"}
    if "V1 runner (forced)" in text:
        return {"runner": "v1", "weights": _weights(text, UNKNOWN), "configuration": "v1-forced"}
    if "default engine" in text and "V2 runner" in text:
        return {"runner": "none v2, eagle v2, ngram v1", "weights": _weights(text, UNKNOWN),
                "configuration": "default"}
    if "published traces" in source:
        return {"runner": "the study's vLLM (H100): outputs only", "weights": "real",
                "configuration": "greedy decoding, acceptance profiled over the outputs"}
    if "spec_repro traces" in source:
        return {"runner": "vLLM decoding (collect): outputs only", "weights": "real",
                "configuration": "greedy decoding, acceptance profiled over the outputs"}
    return {"runner": UNKNOWN, "weights": _weights(text, UNKNOWN), "configuration": UNKNOWN}


def label_rows(df):
    """``df`` (summary rows: ``quantity``, ``source``) with the ``COLUMNS`` filled where missing or empty."""
    df = df.copy()
    labs = [row_labels(q, s) for q, s in zip(df["quantity"], df["source"])]
    for c in COLUMNS:
        have = df[c] if c in df.columns else None
        df[c] = [lab[c] if have is None or not isinstance(have.iloc[i], str) or not have.iloc[i] else have.iloc[i]
                 for i, lab in enumerate(labs)]
    return df
