"""Step-time cost model: target forward, per-proposer drafting, per-step overhead; presets and a fitter.

All times are seconds. One engine step (prefill, plain decode, or a speculative verify step) costs

    target forward  F(kv, n) = c_kv * kv + c_tok * n + c0
                    kv = tokens held in the KV cache before the pass, n = tokens the pass processes (whole batch)
    drafting        per proposer, one of these kinds (``Drafter``):
                    ``linear``    D(kv, n) = c_kv * kv + c_tok * n + c0, n = that request's input length for the
                                  step; charged at every step (like EAGLE: it runs even when nothing is accepted)
                    ``fraction``  fraction * F of the same step (n-gram lookup); 0 when the proposer proposes
                                  nothing at that step
                    ``per_token`` proposal * (c_kv * kv + c_tok * m + c0) + c_step + c_step_req * m where it
                                  drafts (proposal > 0): k * d1 + d0, one small sequential forward per drafted
                                  token, m = requests in the step (vLLM's EAGLE heads, separate draft models,
                                  early-exit self-drafts); d0 = c_step + c_step_req * m is the drafting path's
                                  fixed work per step, whatever the proposal length (c_step_req, default 0: a
                                  per-request part of it, e.g. vLLM's V2 runner's EAGLE, whose step time over no SD
                                  grows with the batch but hardly with k)
                    ``catch_up``  (any kind, default 0) draft forwards charged when a drafter runs again after
                                  skipping steps of a request (its head or draft model must first process the
                                  tokens it did not see); a per_token drafter's forward is c_kv * kv + c_tok * m + c0,
                                  another kind's its own step time. Charged only where the accounting lets a drafter
                                  skip steps (Oracle Combine ``winner``, the causal policies, ngram-else-X-skip).

EAGLE pricing: the study's fit (preset ``llama3.1-8b-h100``) prices EAGLE ``linear``, independent of k (drafting
16 tokens 2.155 ms vs 2.142 ms for one): right at its measured k = 3, free beyond it. ``llama3.1-8b-h100-per-token``
keeps the study's target forward and overhead and prices EAGLE per drafted token, anchored at the study's k = 3
fit (d1 = D_e(k = 3) / 3, d0 = 0) with one catch-up forward. The H200 presets price EAGLE per token from the
drafting-time sweep (``data/gpu/v1-runner/draft-k``: k = 1-12, bs 1-64, ``fit_drafting`` / ``enter_drafting``,
``python -m
spec_repro.costmodel fit-drafting``): on vLLM 0.25 d0 is nil (0.01 ms on Llama-3.1-8B dims, 0 on Qwen2.5-1.5B's)
and d1 one head forward (0.46-0.69 ms on Llama dims at bs 1-64), so a k-token proposal costs k one-token ones.
    overhead        a constant per step (scheduling, input preparation, rejection sampling, bookkeeping)

Ragged batches (optional second target forward). vLLM 0.25's V1 model runner replays its full CUDA graph only for
a UNIFORM decode batch: every request in the step verifies exactly k + 1 tokens, k = the engine's
``num_speculative_tokens`` (a no-SD engine's decode step, 1 token per request, is uniform for that engine). A
RAGGED decode batch (some request verifies fewer, e.g. n-gram found no match for it and drafts 0 tokens, or its
match was shorter than k) runs the forward without the full graph and pays far more for the same tokens. Measured on
one H200 (vLLM 0.25.0, V1 runner, Qwen2.5-Coder-1.5B, k = 5; ``data/gpu/v1-runner/agreement/steps.parquet``, its
``uniform``
column): median t_verify of n-gram at batch 1 8.55 ms for a 1-token ragged step vs 1.98 ms for a 6-token uniform
one; at batch 8 / 32 / 64 ragged 10.1 / 6.1 / 11.5 ms vs 2.0-3.2 ms uniform. A model may therefore carry

    ragged forward  F_r(kv, n) = c_kv' * kv + c_tok' * n + c0'   (``CostModel.ragged_target``; None by default)

priced instead of F at ragged decode steps: ``forward(kv, n, ragged=mask)``. Without it (every preset fitted
before ``data/gpu/v1-runner/agreement``'s runs) every step is priced with F, exactly as before. Where the simulator
applies it (a
policy with an engine k: fixed-K, dynamic-k, ngram-else-eagle, the adaptive policies; not the oracles, not prefill
or the no-SD baseline) is described in :mod:`spec_repro.simulate`. ``fit`` fits F_r on the ragged decode steps of
a step table with a ``uniform`` column. Preset ``qwen2.5-coder-1.5b-h200`` is such a fit (``fit_live``).

The CUDA-graph cap (optional, with a ragged forward only: ``CostModel.graph_cap``, tokens). vLLM captures its graphs
up to ``max_cudagraph_capture_size`` tokens, by default min(max_num_seqs * (1 + k) * 2, 512,
max_num_batched_tokens) (vLLM 0.25, ``VllmConfig._set_cudagraph_sizes``; 1024 in place of 512 on Blackwell data
centre GPUs): 512 on the H200 wherever max_num_seqs >= B, since B * (1 + k) never exceeds twice the first term. A
decode step verifying more tokens than that runs without any graph, uniform or not, and is priced with the ragged
forward (``graph_less(tokens)``). Measured (``data/gpu/v1-runner/draft-k``, Qwen2.5-Coder-1.5B dims, bs 64, uniform
EAGLE
steps): 3.34 ms at 384 tokens (k = 5), then 12.8 ms at 576 (k = 8) and 16.7 ms at 832 (k = 12), where the uniform
forward predicts 4.11 and 4.94 ms and the ragged one 13.7 and 14.9. ``qwen2.5-coder-1.5b-h200`` has graph_cap 512;
``llama3.1-8b-h200`` has no ragged forward (fitted on uniform steps only), so no cap: its steps past 512 tokens
are priced with F, about half what they cost (the sweep: 22.5 and 24.4 ms measured at 576 and 832 tokens on
Llama-3.1-8B dims beside 11.8 ms at 384). Where the simulator applies the cap: :mod:`spec_repro.simulate`.

A preset is a JSON file (see ``spec_repro/presets/``)::

    {"name": ..., "hardware": ..., "target_model": ..., "source": "provenance text", "units": "seconds",
     "target": {"c_kv": ..., "c_tok": ..., "c0": ..., "ragged": {"c_kv": ..., "c_tok": ..., "c0": ...},
                "graph_cap": 512},
     "overhead": ...,                              (``ragged`` optional; ``graph_cap`` optional, needs ``ragged``)
     "drafters": {"ngram": {"kind": "fraction", "fraction": ...},
                  "eagle": {"kind": "linear", "c_kv": ..., "c_tok": ..., "c0": ...}},
     "fit": {... optional statistics of the fit that produced it ...}}

``load_cost_model(name_or_path)`` reads a preset by name (``PRESETS``) or any such file by path;
``fit(steps)`` fits one from measured step timings (``spec_repro.traces.STEP_COLUMNS``).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd

from .manifests import ManifestError, verify_recorded

__all__ = ["Drafter", "TargetForward", "CostModel", "CostModelError", "FitResult", "PRESETS", "PRESET_DIR",
           "load_cost_model", "fit", "default_drafter_kind", "ragged_steps", "fit_live", "LIVE_PRESET"]

PRESET_DIR = Path(__file__).with_name("presets")
DRAFTER_KINDS = ("linear", "fraction", "per_token")
_DRAFTER_FIELDS = ("c_kv", "c_tok", "c0", "fraction", "c_step", "catch_up", "c_step_req")


def _name_key(name: str) -> str:
    """Proposer names that mean the same drafter compare equal: trace names (``early-exit``, ``draft``) vs.
    step-table method names (``early_exit``, ``draft_model``), case and punctuation ignored."""
    k = re.sub(r"[^a-z0-9]", "", str(name).lower())
    return k[:-5] if k.endswith("model") and len(k) > 5 else k


class CostModelError(ValueError):
    """A cost model that cannot be built, read or used as asked; the message says why."""


# Bounds of a plausible coefficient (seconds, per token or per step; fraction of a target forward): 0, or a
# normal float in this range. Outside it, step times overflow (1e308) or underflow to 0 (denormals): NaN speedups.
_COEF_MIN, _COEF_MAX, _FORWARD_MIN = 1e-30, 1e3, 1e-12


def _num(v, where: str) -> float:
    """A cost-model number: an int or float of JSON, never a bool (``true`` is not 1 s) nor a string."""
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        w, _, key = where.rpartition(": ")
        raise CostModelError(f"{w}: malformed value ({key} must be a number, got {v!r})")
    try:
        return float(v)
    except OverflowError:
        raise CostModelError(f"{where} = {str(v)[:12]}... ({len(str(v))} digits) does not fit a float") from None


def _presets() -> dict[str, Path]:
    """Name -> file: the presets shipped in the package, then (in a checkout) the cost models fitted to this
    package's own measurements, ``data/gpu/costmodel_*.json`` (the H200) and ``data/cpu/costmodel_*.json``."""
    from .locations import data_dir

    out = {}
    data = data_dir()
    for p in sorted(PRESET_DIR.glob("*.json")) + sorted(data.glob("*/costmodel_*.json")):
        try:
            out[json.loads(p.read_text())["name"]] = p
        except (OSError, ValueError, KeyError):
            continue
    return out


#: name -> preset file: ``llama3.1-8b-h100`` (the study's published fit), ``llama3.1-8b-h200`` (fitted to this
#: package's vLLM step logs on the H200), ``qwen2.5-coder-1.5b-h200`` (the H200 live run's Qwen steps, with a ragged
#: forward: ``fit_live``), ``smollm2-135m-cpu`` (fitted to the torch engine's CPU step logs)
PRESETS: dict[str, Path] = _presets()


@dataclass
class Drafter:
    """Drafting-time model of one proposer (see the module docstring for the kinds)."""

    kind: str
    c_kv: float = 0.0
    c_tok: float = 0.0
    c0: float = 0.0
    fraction: float = 0.0
    c_step: float = 0.0     # d0, charged once per step where it drafts (per_token; fraction: the path's host work)
    catch_up: float = 0.0   # draft forwards charged on re-entry after skipped steps
    c_step_req: float = 0.0  # per_token only: seconds per request in the step, once per step where it drafts

    def __post_init__(self) -> None:
        if self.kind not in DRAFTER_KINDS:
            raise CostModelError(f"unknown drafter kind {self.kind!r}; expected one of {DRAFTER_KINDS}")

    def time(self, kv, n, F, m, proposal, always=False):
        """Drafting seconds of one request at one step (numpy arrays broadcast).

        kv: KV tokens before the step; n: the request's input length (proposal + 1); F: the step's target
        forward; m: requests in the step; proposal: tokens drafted; always: charge a ``fraction`` drafter even
        where it proposes nothing (what the released simulator does for the combined proposer)."""
        if self.kind == "linear":
            return self.c_kv * np.asarray(kv, float) + self.c_tok * np.asarray(n, float) + self.c0
        if self.kind == "fraction":
            on = np.ones_like(np.asarray(proposal), bool) if always else np.asarray(proposal) > 0
            return np.where(on, self.fraction * np.asarray(F, float) + self.c_step, 0.0)
        prop = np.asarray(proposal, float)
        fixed = self.c_step + self.c_step_req * np.asarray(m, float) if self.c_step_req else self.c_step
        return prop * (self.c_kv * np.asarray(kv, float) + self.c_tok * np.asarray(m, float) + self.c0) + \
            np.where(prop > 0, fixed, 0.0)

    def forward_time(self, kv, n, F, m):
        """One draft forward (the catch-up after skipped steps): a per_token drafter's per-token time (its
        per-step terms c_step and c_step_req are not charged again), another kind's time for a one-token proposal."""
        if self.kind == "per_token":
            return self.c_kv * np.asarray(kv, float) + self.c_tok * np.asarray(m, float) + self.c0
        return self.time(kv, n, F, m, np.ones_like(np.asarray(F, float)), True)

    def to_dict(self) -> dict:
        extra = {"catch_up": self.catch_up} if self.catch_up else {}
        if self.kind == "fraction":
            return {"kind": "fraction", "fraction": self.fraction, **extra,
                    **({"c_step": self.c_step} if self.c_step else {})}
        if self.c_step:
            extra["c_step"] = self.c_step
        if self.c_step_req:
            extra["c_step_req"] = self.c_step_req
        return {"kind": self.kind, "c_kv": self.c_kv, "c_tok": self.c_tok, "c0": self.c0, **extra}


@dataclass(frozen=True)
class TargetForward:
    """A target forward F(kv, n) = c_kv*kv + c_tok*n + c0 (seconds): ``CostModel.ragged_target``."""

    c_kv: float
    c_tok: float
    c0: float

    def time(self, kv, n):
        return self.c_kv * np.asarray(kv, float) + self.c_tok * np.asarray(n, float) + self.c0

    def to_dict(self) -> dict:
        return {"c_kv": self.c_kv, "c_tok": self.c_tok, "c0": self.c0}


@dataclass
class CostModel:
    """Target forward F(kv, n) = c_kv*kv + c_tok*n + c0, drafters per proposer, overhead per step (seconds);
    optionally a second forward for ragged decode batches (``ragged_target``, see the module docstring)."""

    name: str
    c_kv: float
    c_tok: float
    c0: float
    overhead: float
    drafters: dict[str, Drafter] = field(default_factory=dict)
    hardware: str = ""
    target_model: str = ""
    source: str = ""
    fit: dict | None = None
    ragged_target: TargetForward | None = None   # F of ragged decode batches; None: F everywhere
    graph_cap: int | None = None   # tokens: a decode step verifying more runs graph-less (ragged F); None: no cap

    def forward(self, kv, n, ragged=False):
        """Target forward seconds; vectorised over numpy arrays. ``ragged`` (a bool or a bool array broadcast with
        kv and n): the step is a ragged decode batch, priced with ``ragged_target`` where the model has one (a
        model without one prices every step with its regular F)."""
        F = self.c_kv * np.asarray(kv, float) + self.c_tok * np.asarray(n, float) + self.c0
        if self.ragged_target is None:
            return F
        r = np.asarray(ragged, bool)
        if not r.any():
            return F
        out = np.where(r, self.ragged_target.time(kv, n), F)
        return out[()] if out.ndim == 0 else out

    def graph_less(self, tokens):
        """Whether a decode step whose requests verify ``tokens`` in all (prefill excluded; numpy arrays
        broadcast) runs past the engine's CUDA graphs (``graph_cap``; always False without one)."""
        t = np.asarray(tokens)
        return np.zeros(t.shape, bool) if self.graph_cap is None else t > self.graph_cap

    @property
    def has_ragged(self) -> bool:
        """Whether ragged decode batches have their own target forward."""
        return self.ragged_target is not None

    def drafter(self, proposer: str) -> Drafter:
        if proposer in self.drafters:
            return self.drafters[proposer]
        same = [k for k in self.drafters if _name_key(k) == _name_key(proposer)]
        if same:
            return self.drafters[same[0]]
        raise CostModelError(f"cost model {self.name!r} has no drafting model for proposer {proposer!r}; "
                             f"it has {sorted(self.drafters)} (add one to the preset or fit it)")

    def draft(self, proposer: str, kv, n, F, m, proposal, always=False):
        return self.drafter(proposer).time(kv, n, F, m, proposal, always)

    # ---- I/O ------------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = {"name": self.name, "hardware": self.hardware, "target_model": self.target_model,
             "source": self.source, "units": "seconds",
             "target": {"c_kv": self.c_kv, "c_tok": self.c_tok, "c0": self.c0,
                        **({"ragged": self.ragged_target.to_dict()} if self.ragged_target is not None else {}),
                        **({"graph_cap": self.graph_cap} if self.graph_cap is not None else {})},
             "overhead": self.overhead,
             "drafters": {k: v.to_dict() for k, v in self.drafters.items()}}
        if self.fit:
            d["fit"] = self.fit
        return d

    @classmethod
    def from_dict(cls, d: Mapping, where: str = "cost model") -> "CostModel":
        try:
            t = d["target"]
            drafters = {}
            for k, v in dict(d.get("drafters", {})).items():
                kind = v.get("kind") if isinstance(v, Mapping) else None
                if kind not in DRAFTER_KINDS:
                    raise CostModelError(f"{where}: drafter {k!r} has kind {kind!r}; expected one of {DRAFTER_KINDS}")
                drafters[k] = Drafter(kind, **{x: _num(v[x], f"{where}: drafters.{k}.{x}")
                                               for x in _DRAFTER_FIELDS if x in v})
            if not isinstance(t, Mapping):
                raise CostModelError(f"{where}: target must be an object {{c_kv, c_tok, c0}}, got {t!r}")
            rg = t.get("ragged")
            if rg is not None:
                if not isinstance(rg, Mapping):
                    raise CostModelError(f"{where}: target.ragged must be an object {{c_kv, c_tok, c0}} or null, "
                                         f"got {rg!r}")
                missing = [x for x in ("c_kv", "c_tok", "c0") if x not in rg]
                if missing:
                    raise CostModelError(f"{where}: target.ragged lacks {missing} (need c_kv, c_tok, c0)")
                rg = TargetForward(*(_num(rg[x], f"{where}: target.ragged.{x}") for x in ("c_kv", "c_tok", "c0")))
            cap = t.get("graph_cap")
            if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float))
                                    or not float(cap).is_integer()):
                raise CostModelError(f"{where}: target.graph_cap must be a whole number of tokens or null, got "
                                     f"{cap!r}")
            m = cls(name=str(d["name"]), c_kv=_num(t["c_kv"], f"{where}: target.c_kv"),
                    c_tok=_num(t["c_tok"], f"{where}: target.c_tok"), c0=_num(t["c0"], f"{where}: target.c0"),
                    overhead=_num(d["overhead"], f"{where}: overhead"), drafters=drafters,
                    hardware=str(d.get("hardware", "")),
                    target_model=str(d.get("target_model", "")), source=str(d.get("source", "")),
                    fit=d.get("fit"), ragged_target=rg, graph_cap=None if cap is None else int(cap))
        except KeyError as e:
            raise CostModelError(f"{where}: missing key {e.args[0]!r} (need name, target{{c_kv,c_tok,c0}}, "
                                 f"overhead, drafters)") from e
        except (TypeError, ValueError) as e:
            if isinstance(e, CostModelError):
                raise
            raise CostModelError(f"{where}: malformed value ({e})") from e
        return m.validate(where)

    def validate(self, where: str | None = None) -> "CostModel":
        """Refuse coefficients that would price a step at a negative, zero or non-finite time (they give
        negative speedups or NaN): every coefficient finite and >= 0, and a one-token forward > 0."""
        where = where or f"cost model {self.name!r}"
        named = [("target.c_kv", self.c_kv), ("target.c_tok", self.c_tok), ("target.c0", self.c0),
                 ("overhead", self.overhead)]
        named += [(f"drafters.{k}.{x}", getattr(dr, x)) for k, dr in self.drafters.items()
                  for x in _DRAFTER_FIELDS]
        rt = self.ragged_target
        if rt is not None:
            if not isinstance(rt, TargetForward):
                raise CostModelError(f"{where}: ragged_target must be a TargetForward or None, got {rt!r}")
            named += [(f"target.ragged.{x}", getattr(rt, x)) for x in ("c_kv", "c_tok", "c0")]
        for key, v in named:
            if not isinstance(v, (int, float, np.floating, np.integer)) or isinstance(v, bool):
                raise CostModelError(f"{where}: {key} must be a number, got {v!r}")
            if not np.isfinite(v):
                raise CostModelError(f"{where}: coefficients must be finite numbers ({key} = {v})")
            if v < 0:
                raise CostModelError(f"{where}: {key} = {v} is negative; step times must be >= 0")
            if v != 0 and not _COEF_MIN <= v <= _COEF_MAX:   # 1e308 overflows a step's time, a denormal
                raise CostModelError(f"{where}: {key} = {v:g} is outside {_COEF_MIN:g}..{_COEF_MAX:g} (0 is "
                                     f"allowed): no measured step cost is that {'large' if v > 1 else 'small'}")
        for k, dr in self.drafters.items():
            if dr.kind != "per_token" and dr.c_step_req:
                raise CostModelError(f"{where}: drafters.{k}.c_step_req = {dr.c_step_req:g} on a {dr.kind} drafter; "
                                     f"only a per_token drafter has a cost per request of the steps where it drafts")
        if not self.c_tok + self.c0 >= _FORWARD_MIN:
            raise CostModelError(f"{where}: a one-token target forward costs c_tok + c0 = {self.c_tok + self.c0}"
                                 f" s; it must be > 0 (at least {_FORWARD_MIN:g} s)")
        cap = self.graph_cap
        if cap is not None:
            if isinstance(cap, bool) or not isinstance(cap, (int, np.integer)) or cap < 1:
                raise CostModelError(f"{where}: graph_cap must be a whole number of tokens >= 1 or None, got {cap!r}")
            if rt is None:
                raise CostModelError(f"{where}: graph_cap = {cap} needs a ragged forward (target.ragged): the steps "
                                     f"past the cap run without the CUDA graph and are priced with it")
        if rt is not None and not rt.c_tok + rt.c0 >= _FORWARD_MIN:
            raise CostModelError(f"{where}: a one-token ragged forward costs target.ragged c_tok + c0 = "
                                 f"{rt.c_tok + rt.c0} s; it must be > 0 (at least {_FORWARD_MIN:g} s)")
        return self

    def to_json(self, path: str | Path) -> Path:
        from .io import atomic_write

        path = Path(path)
        with atomic_write(path) as f:
            f.write(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def from_json(cls, path: str | Path) -> "CostModel":
        path = Path(path)
        try:
            d = json.loads(verify_recorded(path).read_text())
        except ManifestError as e:   # changed since its MANIFEST.json recorded its sha256
            raise CostModelError(str(e)) from None
        except OSError as e:
            raise CostModelError(f"{path}: cannot read cost model ({e})") from e
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            raise CostModelError(f"{path}: not JSON ({getattr(e, 'msg', type(e).__name__)})") from e
        if not isinstance(d, dict):
            raise CostModelError(f"{path}: expected a JSON object")
        return cls.from_dict(d, str(path))

    def summary(self) -> str:
        lines = [f"cost model {self.name!r} ({self.hardware or 'hardware ?'}, {self.target_model or 'target ?'})",
                 f"  target forward F(kv, n) = {self.c_kv:.6g}*kv + {self.c_tok:.6g}*n + {self.c0:.6g} s",
                 f"  overhead per step       = {self.overhead:.6g} s"]
        if self.ragged_target is not None:
            r = self.ragged_target
            lines.insert(2, f"  ragged-batch forward    = {r.c_kv:.6g}*kv + {r.c_tok:.6g}*n + {r.c0:.6g} s (decode "
                            f"steps where some request verifies other than k + 1 tokens"
                            + (f", or more than {self.graph_cap} in all)" if self.graph_cap is not None else ")"))
        for k, dr in self.drafters.items():
            if dr.kind == "fraction":
                d0 = f"{dr.c_step:.6g} + " if dr.c_step else ""
                lines.append(f"  drafting {k:<14} = {d0}{dr.fraction:.6g} * F (0 when nothing is proposed)")
            elif dr.kind == "linear":
                lines.append(f"  drafting {k:<14} = {dr.c_kv:.6g}*kv + {dr.c_tok:.6g}*n + {dr.c0:.6g} s per step")
            else:
                d0 = f"{dr.c_step:.6g} + " if dr.c_step else ""
                d0 += f"{dr.c_step_req:.6g}*m + " if dr.c_step_req else ""
                lines.append(f"  drafting {k:<14} = {d0}proposal * ({dr.c_kv:.6g}*kv + {dr.c_tok:.6g}*m + {dr.c0:.6g}) s")
            if dr.catch_up:
                lines.append(f"  {'':<23}   + {dr.catch_up:g} draft forward(s) on re-entry after skipped steps")
        if self.source:
            lines.append(f"  source: {self.source}")
        return "\n".join(lines)

    __str__ = summary


def load_cost_model(name_or_path: "str | Path | CostModel") -> CostModel:
    """A preset by name (see ``PRESETS``) or a preset-format JSON file by path."""
    if isinstance(name_or_path, CostModel):
        return name_or_path
    s = str(name_or_path)
    presets = _presets()
    if s in presets:
        return CostModel.from_json(presets[s])
    p = Path(s).expanduser()
    if p.is_file():
        return CostModel.from_json(p)
    raise CostModelError(f"unknown cost model {s!r}: not a preset ({sorted(presets)}) and no such file")


# ---- fitting ----------------------------------------------------------------------------------------------
def default_drafter_kind(method: str) -> str:
    """n-gram -> ``fraction``; draft models / early-exit self-drafts -> ``per_token``; others -> ``linear``."""
    m = method.lower()
    if m.startswith("ngram") or m.startswith("n-gram"):
        return "fraction"
    if any(w in m for w in ("draft", "early", "layerskip", "self")):
        return "per_token"
    return "linear"


@dataclass
class FitResult:
    """What ``fit`` returns: the fitted ``model``, R² per component, per-step ``residuals`` and counts."""

    model: CostModel
    r2: dict[str, float]
    residuals: pd.DataFrame  # component, row, measured, predicted, residual (seconds)
    n_steps: dict[str, int]

    def rmse(self, component: str) -> float:
        r = self.residuals.loc[self.residuals["component"] == component, "residual"]
        return float(np.sqrt(np.mean(r.to_numpy() ** 2))) if len(r) else float("nan")

    def summary(self) -> str:
        lines = [self.model.summary(), "  fit quality:"]
        for comp in self.n_steps:
            r2 = self.r2.get(comp, float("nan"))
            lines.append(f"    {comp:<20} n={self.n_steps[comp]:>6}  R2={r2:.4f}  rmse={self.rmse(comp) * 1e3:.4f} ms")
        return "\n".join(lines)

    __str__ = summary

    def to_json(self, path: str | Path) -> Path:
        """Write the fitted model as a preset (loadable with ``load_cost_model(path)``), fit statistics included."""
        return self.model.to_json(path)


def _r2(y: np.ndarray, pred: np.ndarray) -> float:
    ss_res = float(np.sum((y - pred) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    return 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan")


def _lstsq(X: np.ndarray, y: np.ndarray, what: str) -> np.ndarray:
    if len(y) < X.shape[1]:
        raise CostModelError(f"fit {what}: {len(y)} steps, need at least {X.shape[1]}")
    # scale columns so the rank test is meaningful for kv ~1e5 next to a constant 1
    scale = np.abs(X).max(axis=0)
    scale[scale == 0] = 1.0
    rank = np.linalg.matrix_rank(X / scale)
    if rank < X.shape[1]:
        raise CostModelError(f"fit {what}: the steps do not vary enough to separate the coefficients (rank "
                             f"{rank} < {X.shape[1]}); measure several batch sizes / context lengths")
    # Non-negative least squares: every term is a time per token or per step, so a negative coefficient would
    # only fit noise inside the measured range and predict negative times outside it (large KV, large batches).
    from scipy.optimize import nnls  # imported here: loading a cost model should not pay for scipy

    coef, _ = nnls(X / scale, y)
    return coef / scale


def ragged_steps(steps: pd.DataFrame) -> np.ndarray | None:
    """The ragged decode steps of a step table (bool per row): ``uniform`` is False and (where the table has a
    ``phase`` column) ``phase == "decode"``. None when the table has no ``uniform`` column. (``uniform``, as
    ``spec_repro.engines.vllm.live`` writes it: k == 0 or batched_tokens == num_reqs * (1 + k).)"""
    if "uniform" not in steps.columns:
        return None
    u = steps["uniform"]
    if u.isna().any():
        raise CostModelError(f"fit: column 'uniform' is null in {int(u.isna().sum())} step(s); it must say, for "
                             f"every step, whether each request verified exactly k + 1 tokens")
    rag = ~u.to_numpy(bool)
    if "phase" in steps.columns:
        rag &= (steps["phase"].astype(str) == "decode").to_numpy()
    return rag


def fit(steps: pd.DataFrame, *, name: str = "fitted", hardware: str = "", target_model: str | None = None,
        source: str = "", kinds: Mapping[str, str] | None = None, include_reject: bool = True,
        min_steps: int = 3, ragged: "bool | str" = "auto", path_overhead: bool = False,
        d0: Mapping[str, float] | None = None) -> FitResult:
    """Least-squares cost model (non-negative coefficients) from measured step timings
    (``spec_repro.traces.STEP_COLUMNS``).

    - target forward: t_verify ~ c_kv*kv_tokens + c_tok*batched_tokens + c0 over every step; with a ragged
      forward (``ragged``: ``"auto"``, the default, when the table has a ``uniform`` column and at least
      ``min_steps`` ragged decode steps (``ragged_steps``); ``True``: require them; ``False``: never), the same
      form fitted apart on the ragged decode steps (``ragged_target``, component ``target:ragged``) and on all
      the other steps (``target``: the uniform ones, and prefill / mixed steps, which the simulator prices with F);
    - drafting, per ``method`` other than ``none`` (kind from ``kinds`` or ``default_drafter_kind``):
      ``linear``: t_draft ~ c_kv*kv_tokens + c_tok*(batched_tokens/num_reqs) + c0 (n per request, as the
      simulator applies it); ``fraction``: t_draft ~ fraction*t_verify through the origin, over steps that
      drafted; ``per_token``: t_draft ~ k*(c_kv*kv_tokens + c_tok*num_reqs + c0), k = num_draft_tokens/num_reqs;
    - overhead: the mean of t_other (+ t_reject when ``include_reject``; the model has no separate term for it);
      with ``path_overhead``, the mean over the no-SD steps (method ``none``), and each drafter's steps' mean
      beyond it goes into that drafter's ``c_step`` (charged once per step where it drafts): an engine path's own
      host work (vLLM's EAGLE path pays ~2 ms more per step than no SD on a 1.5B target), which one overhead
      for every path spreads over no SD too;
    - ``d0``: a per_token drafter's fixed part per drafting step (its ``c_step``), measured elsewhere (the k sweep,
      ``fit_drafting``), for steps of one k where d0 is not separable: the steps' t_draft - d0 is fitted per token.
    Returns a ``FitResult`` with R² per component and a residual table."""
    from .traces import validate_steps

    if ragged not in (True, False, "auto"):
        raise CostModelError(f"fit: ragged must be True, False or 'auto', got {ragged!r}")
    df = validate_steps(steps, "fit steps")
    if df.empty:
        raise CostModelError("fit: no steps")
    rag = ragged_steps(df) if ragged is not False else None
    if ragged is True and (rag is None or rag.sum() < min_steps):
        raise CostModelError(f"fit: ragged=True needs a 'uniform' column and at least {min_steps} ragged decode "
                             f"steps; the steps have " + ("no 'uniform' column" if rag is None else
                                                          f"{int(rag.sum())}"))
    if rag is not None and rag.sum() < min_steps:
        rag = None
    if target_model is None:
        models = df["model"].unique().tolist()
        target_model = models[0] if len(models) == 1 else ", ".join(map(str, models))
    kinds = dict(kinds or {})
    res, r2, counts = [], {}, {}

    def record(comp, idx, y, pred):
        res.append(pd.DataFrame({"component": comp, "row": idx, "measured": y, "predicted": pred,
                                 "residual": y - pred}))
        r2[comp] = _r2(y, pred)
        counts[comp] = len(y)

    kv = df["kv_tokens"].to_numpy(float)
    n = df["batched_tokens"].to_numpy(float)
    reqs = np.maximum(df["num_reqs"].to_numpy(float), 1.0)
    tv = df["t_verify"].to_numpy(float)
    X = np.column_stack([kv, n, np.ones_like(kv)])
    ragged_target = None
    if rag is None:
        c_kv, c_tok, c0 = _lstsq(X, tv, "target forward")
        record("target", df.index.to_numpy(), tv, X @ [c_kv, c_tok, c0])
    else:
        reg = ~rag
        c_kv, c_tok, c0 = _lstsq(X[reg], tv[reg], "target forward (uniform steps)")
        record("target", df.index.to_numpy()[reg], tv[reg], X[reg] @ [c_kv, c_tok, c0])
        coef = _lstsq(X[rag], tv[rag], "ragged target forward (ragged decode steps)")
        ragged_target = TargetForward(*map(float, coef))
        record("target:ragged", df.index.to_numpy()[rag], tv[rag], X[rag] @ coef)

    drafters: dict[str, Drafter] = {}
    for method, g in df[df["method"] != "none"].groupby("method", sort=True):
        kind = kinds.get(method, default_drafter_kind(method))
        if kind not in DRAFTER_KINDS:
            raise CostModelError(f"fit: kind {kind!r} for {method!r}; expected one of {DRAFTER_KINDS}")
        drafted = g["num_draft_tokens"].to_numpy(float) > 0
        idx = g.index.to_numpy()
        y = g["t_draft"].to_numpy(float)
        gkv, gn, greq = kv[idx], n[idx], reqs[idx]
        if kind == "linear":
            Xd = np.column_stack([gkv, gn / greq, np.ones_like(gkv)])
            if len(y) < min_steps:
                raise CostModelError(f"fit drafting {method!r}: {len(y)} steps, need {min_steps}")
            coef = _lstsq(Xd, y, f"drafting {method!r}")
            drafters[method] = Drafter("linear", *map(float, coef))
            record(f"draft:{method}", idx, y, Xd @ coef)
        elif kind == "fraction":
            tvg = tv[idx][drafted]
            if drafted.sum() < min_steps or not (tvg > 0).any():
                raise CostModelError(f"fit drafting {method!r}: fewer than {min_steps} steps that drafted")
            frac = float(np.sum(y[drafted] * tvg) / np.sum(tvg ** 2))
            drafters[method] = Drafter("fraction", fraction=frac)
            record(f"draft:{method}", idx[drafted], y[drafted], frac * tvg)
        else:
            k = g["num_draft_tokens"].to_numpy(float)[drafted] / greq[drafted]
            Xd = np.column_stack([k * gkv[drafted], k * greq[drafted], k])
            several_k = len(np.unique(np.round(k, 6))) > 1   # d0 (c_step) is separable from d1 only then
            fixed = float((d0 or {}).get(method, 0.0))
            if several_k and method in (d0 or {}):
                raise CostModelError(f"fit drafting {method!r}: d0 is given but the steps have several k (fit it)")
            if several_k:
                Xd = np.column_stack([Xd, np.ones_like(k)])
            coef = _lstsq(Xd, y[drafted] - fixed, f"drafting {method!r}")
            drafters[method] = Drafter("per_token", *map(float, coef[:3]),
                                       c_step=float(coef[3]) if several_k else fixed, catch_up=1.0)
            record(f"draft:{method}", idx[drafted], y[drafted], Xd @ coef + fixed)

    to = df["t_other"].to_numpy(float) + (df["t_reject"].to_numpy(float) if include_reject else 0.0)
    if path_overhead:
        base = (df["method"] == "none").to_numpy()
        if base.sum() < min_steps:
            raise CostModelError(f"fit: path_overhead needs at least {min_steps} no-SD steps (method 'none'), "
                                 f"the steps have {int(base.sum())}")
        overhead = float(to[base].mean())
        pred = np.full_like(to, overhead)
        for method, dr in drafters.items():
            on = (df["method"] == method).to_numpy()
            extra = max(0.0, float(to[on].mean()) - overhead)
            drafters[method] = replace(dr, c_step=dr.c_step + extra)
            pred[on] += extra
        record("overhead", df.index.to_numpy(), to, pred)
    else:
        overhead = float(to.mean())
        record("overhead", df.index.to_numpy(), to, np.full_like(to, overhead))

    resid = pd.concat(res, ignore_index=True)
    fit_stats = {"n_steps": counts, "r2": {k: (None if np.isnan(v) else round(v, 6)) for k, v in r2.items()},
                 "rmse_s": {c: float(np.sqrt(np.mean(g["residual"] ** 2))) for c, g in resid.groupby("component")},
                 "runs": sorted(map(str, df["run_id"].unique())), "include_reject": include_reject}
    if ragged_target is not None:
        fit_stats["ragged"] = ("target:ragged fitted on the decode steps with uniform == False, target on all "
                               "other steps")
    model = CostModel(name=name, c_kv=float(c_kv), c_tok=float(c_tok), c0=float(c0), overhead=overhead,
                      drafters=drafters, hardware=hardware, target_model=str(target_model),
                      source=source or f"least-squares fit of {len(df)} measured steps (spec_repro.costmodel.fit)",
                      fit=fit_stats, ragged_target=ragged_target)
    return FitResult(model=model, r2=r2, residuals=resid, n_steps=counts)


# ---- EAGLE's drafting time per k on the H200 (the sweep) ---------------------------------------------------------
#: the sweep's model name -> the H200 preset its fit goes into
SWEEP_TARGETS = {"llama31-8b": "llama3.1-8b-h200", "qwen2.5-coder-1.5b": "qwen2.5-coder-1.5b-h200"}
SWEEP_SOURCE = (
    "EAGLE's drafting time on one NVIDIA H200 (vLLM 0.25.0, V1 runner (forced), vLLM's own scheduling = "
    "async, CUDA graphs, bf16, dummy weights: vLLM's padded drafter batch drafts over every verified token "
    "whatever was accepted, so the time does not depend on the weights), "
    "data/gpu/v1-runner/draft-k/steps.parquet, 2026-12-02: k = 1, 3, 5, 8, 12 x bs 1, 8, 32, 64, 2 repeats, "
    "512-token prompts, 128 output tokens; the decode steps that drafted, t_draft ~ d0 + k * (c_kv*kv + "
    "c_tok*m + c0), m = requests in the step, by non-negative least squares (costmodel.fit, kind per_token). "
    "Regenerate: python -m spec_repro.costmodel fit-drafting")


def sweep_steps(steps: "pd.DataFrame | str | Path | None" = None, model: str | None = None) -> pd.DataFrame:
    """The decode steps that drafted in the drafting-time sweep (default
    ``data/gpu/v1-runner/draft-k/steps.parquet`` of the
    checkout), of ``model`` (the sweep's model names: ``SWEEP_TARGETS``) or of all."""
    from .traces import read_steps

    if steps is None:
        from .locations import v1_runner_dir

        steps = v1_runner_dir("draft-k") / "steps.parquet"
    df = read_steps(steps) if isinstance(steps, (str, Path)) else steps
    keep = (df["phase"].astype(str) == "decode") & (df["num_draft_tokens"] > 0) & (df["method"] == "eagle")
    if model is not None:
        if model not in set(df["model"]):
            raise CostModelError(f"sweep_steps: no steps of {model!r}; the sweep has {sorted(set(df['model']))}")
        keep &= df["model"] == model
    return df[keep.to_numpy()].reset_index(drop=True)


def fit_drafting(steps: "pd.DataFrame | str | Path | None" = None, model: str = "llama31-8b") -> tuple[Drafter, dict]:
    """EAGLE's per_token drafter (d0 = ``c_step``, d1 = c_kv*kv + c_tok*m + c0 per drafted token) fitted on the
    sweep's steps of ``model``, and the fit's record (``SWEEP_SOURCE``, the k and batch sizes, R², RMSE, d0 and d1
    at each batch size) for a preset's ``fit["drafting"]``."""
    df = sweep_steps(steps, model)
    res = fit(df, kinds={"eagle": "per_token"}, ragged=False)
    dr = res.model.drafters["eagle"]
    bss = sorted(int(b) for b in df["batch_size"].unique())
    kv = {str(b): float(df.loc[df["batch_size"] == b, "kv_tokens"].median()) for b in bss}   # the batch's KV
    stats = {"source": SWEEP_SOURCE, "model": model,
             "k": sorted(int(k) for k in df["k"].unique()), "batch_sizes": bss,
             "n_steps": int(res.n_steps["draft:eagle"]), "r2": round(float(res.r2["draft:eagle"]), 6),
             "rmse_s": float(res.model.fit["rmse_s"]["draft:eagle"]), "d0_s": dr.c_step,
             "d1_s": {str(b): dr.c_kv * kv[str(b)] + dr.c_tok * b + dr.c0 for b in bss}, "d1_at_kv_tokens": kv}
    return dr, stats


def with_drafting(model: CostModel, drafter: Drafter, record: dict, method: str = "eagle") -> CostModel:
    """``model`` with ``method``'s drafter replaced by ``drafter`` and ``record`` as its ``fit["drafting"]``
    (the drafter it replaced is kept in the record, as ``replaced``)."""
    old = model.drafters.get(method)
    rec = {**record, **({"replaced": old.to_dict()} if old is not None else {})}
    return replace(model, drafters={**model.drafters, method: drafter}, fit={**(model.fit or {}), "drafting": rec})


# ---- the H200 live run's preset ---------------------------------------------------------------------------------
#: vLLM 0.25's default ``max_cudagraph_capture_size`` on an H200 (Hopper): min(max_num_seqs * (1 + k) * 2, 512,
#: max_num_batched_tokens); a decode step of B <= max_num_seqs requests verifies B * (1 + k), under the first term,
#: so only 512 ever binds (``VllmConfig._set_cudagraph_sizes``; the module docstring): the cap ``fit_live`` gives
VLLM_GRAPH_CAP = 512
#: the preset ``fit_live`` writes (name ``qwen2.5-coder-1.5b-h200``)
LIVE_PRESET = PRESET_DIR / "qwen2.5-coder-1.5b-h200.json"
LIVE_SPECS = ("hybrid-default-none", "hybrid-default-eagle", "hybrid-default-ngram")
LIVE_KINDS = {"eagle": "per_token", "ngram": "fraction"}
LIVE_SOURCE = (
    "costmodel.fit (ragged=True) of the H200 live run's step table data/gpu/v1-runner/agreement/steps.parquet "
    "(vLLM 0.25.0, one NVIDIA H200, V1 model runner (forced), vLLM's own async scheduling for EAGLE and no "
    "SD, synchronous for n-gram, bf16, real weights of Qwen/Qwen2.5-Coder-1.5B-Instruct, k = 5, 2026-12-01): "
    "the decode steps (phase == 'decode') of the code-edit runs (run_id starting with 'code-edit', batch "
    "sizes 1, 8, 32, 64) of the specs hybrid-default-none, hybrid-default-eagle and hybrid-default-ngram "
    "only; target = the uniform steps (every request verified k + 1 tokens: vLLM's full CUDA graph), "
    "target.ragged = the ragged ones (n-gram steps where some request had no or a shorter match); EAGLE per "
    "drafted token, n-gram a fraction of F; overhead = no SD's steps' t_other + t_reject, each method's own "
    "steps' excess over it its c_step (path_overhead: vLLM's EAGLE path pays ~2 ms of host work per step more "
    "than no SD). The hybrid specs (hybrid-default-pr24344[-skip]) and the draft-model agreement runs were "
    "left out so that they can be predicted out of sample. graph_cap = 512 tokens, vLLM 0.25's default "
    "CUDA-graph capture size on the H200 (the live run's steps stay under it: bs 64 x (k + 1) = 384): a "
    "decode step verifying more is priced with the ragged forward (the drafting-time sweep, "
    "data/gpu/v1-runner/draft-k: 12.8 / 16.7 ms measured at 576 / 832 tokens, 13.7 / 14.9 ragged-predicted). "
    "Regenerate: python -m spec_repro.costmodel fit-live")


def live_steps(steps: "pd.DataFrame | str | Path | None" = None) -> pd.DataFrame:
    """The steps ``fit_live`` fits: code-edit decode steps of ``LIVE_SPECS`` from the live run's step table
    (default ``data/gpu/v1-runner/agreement/steps.parquet`` of the checkout)."""
    from .traces import read_steps

    if steps is None:
        from .locations import v1_runner_dir

        steps = v1_runner_dir("agreement") / "steps.parquet"
    df = read_steps(steps) if isinstance(steps, (str, Path)) else steps
    for c in ("spec", "phase", "uniform"):
        if c not in df.columns:
            raise CostModelError(f"fit_live: the step table has no {c!r} column (it must be the live run's "
                                 f"steps.parquet, written by spec_repro.engines.vllm.live summarize)")
    keep = (df["run_id"].astype(str).str.startswith("code-edit") & df["spec"].astype(str).isin(LIVE_SPECS)
            & (df["phase"].astype(str) == "decode"))
    return df[keep.to_numpy()].reset_index(drop=True)


def fit_live(steps: "pd.DataFrame | str | Path | None" = None, out: "str | Path | None" = None,
             sweep: "pd.DataFrame | str | Path | None | bool" = None) -> FitResult:
    """Fit preset ``qwen2.5-coder-1.5b-h200`` (``LIVE_SOURCE`` says on what) from the live run's step table;
    writes it to ``out`` when given (``LIVE_PRESET`` is the committed one). The live run drafted at k = 5 only,
    where EAGLE's d0 is not separable: d0 comes from the drafting-time sweep on Qwen's dims (``sweep``: its step
    table, default the committed ``data/gpu/v1-runner/draft-k``; ``False``: d0 = 0) and d1 from the live run's own
    steps
    (its engine, its host), the sweep's fit recorded beside it in ``fit["drafting"]``."""
    d0, rec = {}, None
    if sweep is not False:
        dr, rec = fit_drafting(sweep, "qwen2.5-coder-1.5b")
        d0 = {"eagle": dr.c_step}
        rec = {**rec, "sweep_drafter": dr.to_dict(),
               "used": "d0 (c_step) from the sweep; d1 fitted on the live run's k = 5 steps with d0 subtracted"}
    res = fit(live_steps(steps), name="qwen2.5-coder-1.5b-h200", d0=d0,
              hardware="1x NVIDIA H200 (141 GB), vLLM 0.25.0, V1 runner (forced), vLLM's own scheduling (async for "
                       "EAGLE / no SD, sync for n-gram), CUDA graphs, bf16, real weights",
              target_model="Qwen/Qwen2.5-Coder-1.5B-Instruct", source=LIVE_SOURCE, kinds=LIVE_KINDS, ragged=True,
              path_overhead=True)
    if rec is not None:
        res.model.fit["drafting"] = rec
    res.model.graph_cap = VLLM_GRAPH_CAP
    res.model.validate()
    if out is not None:
        res.to_json(out)
    return res


def same_fit(a, b, rel: float = 1e-9) -> bool:
    """Two fits (parsed JSON) equal in structure and text, their numbers within ``rel`` relative: a least-squares
    refit's last bits depend on the BLAS it ran on (the committed Llama H200 preset's c_kv reads ...114e-09 on one
    machine and ...126e-09 on another), which a byte comparison of the files would call a different fit."""
    import math

    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_fit(a[k], b[k], rel) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_fit(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return (isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool)
                and not isinstance(b, bool) and math.isclose(a, b, rel_tol=rel, abs_tol=0.0))
    return a == b


def _holds(path: Path, text: str) -> bool:
    """Whether the file at ``path`` holds the fit ``text`` (``same_fit``)."""
    return path.is_file() and same_fit(json.loads(path.read_text()), json.loads(text))


def enter_drafting(steps: "pd.DataFrame | str | Path | None" = None, check: bool = False) -> dict[str, bool]:
    """The drafting-time sweep into the H200 presets: ``llama3.1-8b-h200``'s EAGLE drafter becomes the sweep's fit
    on Llama-3.1-8B dims (its committed one was fitted at k = 3 only: d0 not separable); ``qwen2.5-coder-1.5b-h200``
    is refitted with ``fit_live`` (d0 from the sweep). Writes both (``check``: writes nothing) and returns, per
    preset file, whether it already held that fit (``same_fit``: its numbers to 1e-9 relative)."""
    import dataclasses

    same = {}
    path = PRESETS["llama3.1-8b-h200"]
    base = load_cost_model(path)
    if base.fit and "replaced" in base.fit.get("drafting", {}):   # entered before: start from the drafter it replaced
        old = base.fit["drafting"]["replaced"]
        base = dataclasses.replace(base, drafters={**base.drafters, "eagle": Drafter(
            old["kind"], **{x: float(old[x]) for x in _DRAFTER_FIELDS if x in old})},
            fit={k: v for k, v in base.fit.items() if k != "drafting"})
    dr, rec = fit_drafting(steps, "llama31-8b")
    texts = {path: json.dumps(with_drafting(base, dr, rec).to_dict(), indent=2) + "\n",
             LIVE_PRESET: json.dumps(fit_live(sweep=steps).model.to_dict(), indent=2) + "\n"}
    for p, text in texts.items():
        same[str(p)] = _holds(Path(p), text)
        if not check and not same[str(p)]:
            from .io import atomic_write

            with atomic_write(Path(p)) as f:
                f.write(text)
    return same


def main(argv=None) -> int:
    """``python -m spec_repro.costmodel fit-live [--steps PATH] [--out PATH] [--check]`` /
    ``fit-drafting [--steps PATH] [--check]``."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m spec_repro.costmodel", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    fl = sub.add_parser("fit-live", help="refit preset qwen2.5-coder-1.5b-h200 from "
                        "data/gpu/v1-runner/agreement/steps.parquet")
    fl.add_argument("--steps", default=None,
                    help="step table (default: the checkout's data/gpu/v1-runner/agreement/steps.parquet)")
    fl.add_argument("--out", default=str(LIVE_PRESET), help=f"where to write the preset (default {LIVE_PRESET})")
    fl.add_argument("--check", action="store_true", help="write nothing; exit 1 if --out differs from the refit")
    fd = sub.add_parser("fit-drafting",
                        help="EAGLE's drafting time per k (data/gpu/v1-runner/draft-k) into the H200 presets")
    fd.add_argument("--steps", default=None,
                    help="the sweep's step table (default: data/gpu/v1-runner/draft-k/steps.parquet)")
    fd.add_argument("--check", action="store_true", help="write nothing; exit 1 if a preset differs from the refit")
    a = ap.parse_args(argv)
    if a.cmd == "fit-drafting":
        for model in SWEEP_TARGETS:
            dr, rec = fit_drafting(a.steps, model)
            d1 = ", ".join(f"bs {b}: {v * 1e3:.3f}" for b, v in rec["d1_s"].items())
            print(f"{model}: d0 = {dr.c_step * 1e3:.3f} ms, d1 = {d1} ms per drafted token "
                  f"(R² {rec['r2']:.3f}, {rec['n_steps']} steps)")
        same = enter_drafting(a.steps, check=a.check)
        for p, ok in same.items():
            print(f"{p}: {'matches' if ok else ('DIFFERS FROM' if a.check else 'rewritten from')} the refit")
        return 0 if (all(same.values()) or not a.check) else 1
    res = fit_live(a.steps)
    text = json.dumps(res.model.to_dict(), indent=2) + "\n"
    if a.check:
        same = _holds(Path(a.out), text)
        print(f"{a.out}: {'matches' if same else 'DIFFERS FROM'} the refit")
        return 0 if same else 1
    res.to_json(a.out)
    print(res.summary())
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
