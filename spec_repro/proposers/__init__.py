"""Draft proposers for the reference engine (:mod:`spec_repro.engines.torch`) and the acceptance profiler.

One small interface, :class:`Proposer`:

* ``start(contexts)``: a new batch; ``contexts[r]`` = prompt + the prefill's first token of row r.
* ``propose(contexts, k) -> list[list[int]]``: up to ``k`` draft tokens per row given each row's full context
  (prompt + output so far). May return fewer tokens, or none (n-gram without a match).
* ``select(rows)``: only these rows (indices into the current batch) stay; finished requests leave.
* ``method``: the name used in step timings (``ngram``, ``draft_model``, ``early_exit``); ``name`` the one used
  in acceptance traces (``ngram``, ``draft``, ``early-exit``).

Model-based proposers also expose ``model`` (a causal LM whose greedy chain they draft), which the profiler
uses for its single teacher-forced pass. EAGLE-class proposers draft from the target's own features instead:
``features`` names what the target must expose (``"final"`` or aux layer ids; None for every other proposer),
and the engine hands them over with ``add_features(per-row tensors)`` after each target forward.

``make_proposer(name, target=None, **options)`` builds one by name: ``ngram`` (``min_n``, ``max_n``),
``draft`` (``draft_model``), ``early-exit`` (``layers``), ``eagle`` / ``eagle3`` (``eagle_head``: a checkpoint
directory or a loaded :class:`~spec_repro.proposers.eagle.EagleHead`).
"""
from __future__ import annotations

from typing import Sequence

__all__ = ["Proposer", "make_proposer", "PROPOSERS"]

PROPOSERS = ("ngram", "draft", "early-exit", "eagle", "eagle3")


class Proposer:
    name = "proposer"
    method = "proposer"
    model = None
    features = None

    def start(self, contexts: Sequence[Sequence[int]]) -> None:  # noqa: D401 - interface
        pass

    def propose(self, contexts: Sequence[Sequence[int]], k: int) -> list[list[int]]:
        raise NotImplementedError

    def select(self, rows: Sequence[int]) -> None:
        pass


def make_proposer(name: str, target=None, **options) -> Proposer:
    """Build a proposer by name. ``target`` is the target model (needed by ``early-exit``)."""
    key = name.lower().replace("_", "-")
    if key in ("ngram", "n-gram", "prompt-lookup"):
        from .ngram import NgramProposer

        return NgramProposer(**{k: v for k, v in options.items() if k in ("min_n", "max_n")})
    if key in ("draft", "draft-model"):
        from .draft import DraftModelProposer

        if options.get("draft_model") is None:
            raise ValueError("proposer 'draft' needs draft_model= (a causal LM sharing the target's tokenizer)")
        return DraftModelProposer(options["draft_model"])
    if key in ("early-exit", "earlyexit", "self-spec", "layerskip"):
        from .early_exit import EarlyExitProposer

        if target is None:
            raise ValueError("proposer 'early-exit' needs the target model")
        return EarlyExitProposer(target, layers=options.get("layers"))
    if key in ("eagle", "eagle1", "eagle-1", "eagle3", "eagle-3"):
        from .eagle import EagleHead, EagleProposer, load_head

        head = options.get("eagle_head")
        if head is None:
            raise ValueError(f"proposer {name!r} needs an EAGLE head (--eagle-head DIR: a checkpoint in vLLM's "
                             "eagle/eagle3 layout, e.g. from `spec-repro train eagle`)")
        if not isinstance(head, EagleHead):
            if target is None:
                raise ValueError(f"proposer {name!r} needs the target model to load its head")
            head = load_head(head, target)
        want = "eagle3" if "3" in key else "eagle"
        if head.kind != want:
            raise ValueError(f"proposer {name!r} got an {head.kind} head")
        return EagleProposer(head)
    raise ValueError(f"unknown proposer {name!r}; choose from {', '.join(PROPOSERS)}")
