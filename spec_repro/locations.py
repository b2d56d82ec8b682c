"""Where the checkout's folders are: ``data/`` and ``figures/`` (like showyourwork's ``paths.data / ...``). It
imports nothing of the package, so every module can ask where data lives without importing the trace readers
(``spec_repro.paths`` re-exports these beside its trace loading, which sits above the readers)."""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["repo_root", "data_dir", "figures_dir", "V1_STUDIES", "v1_runner_dir"]


def repo_root() -> Path:
    """The checkout holding ``data/`` (the package is installed editable), or ``$SPEC_REPRO_ROOT``."""
    env = os.environ.get("SPEC_REPRO_ROOT")
    return Path(env) if env else Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    return repo_root() / "data"


def figures_dir() -> Path:
    return repo_root() / "figures"


#  The committed studies on vLLM 0.25's V1 model runner (forced), ``data/gpu/v1-runner/<name>`` (their README):  the
# folder each holds, by what it holds. New ``live summarize`` output goes elsewhere (``live_runs.OUT``).
V1_STUDIES = ("agreement", "engine-per-policy", "rotated-code-edit", "rotated-sharegpt", "adaptive-rule",
              "sharegpt-two-machines", "sharegpt-one-machine", "host-probe", "reproduce-grid", "draft-k",
              "host-drift")


def v1_runner_dir(study: str | None = None) -> Path:
    """``data/gpu/v1-runner``, or its subfolder ``study`` (one of ``V1_STUDIES``)."""
    root = data_dir() / "gpu" / "v1-runner"
    if study is None:
        return root
    if study not in V1_STUDIES:
        raise ValueError(f"no committed V1-runner study {study!r}; have {', '.join(V1_STUDIES)}")
    return root / study
