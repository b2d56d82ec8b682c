"""Where the checkout's folders are: ``data/`` and ``figures/`` (like showyourwork's ``paths.data / ...``). It
imports nothing of the package, so every module can ask where data lives without importing the trace readers
(``spec_repro.paths`` re-exports these beside its trace loading, which sits above the readers)."""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["repo_root", "data_dir", "figures_dir"]


def repo_root() -> Path:
    """The checkout holding ``data/`` (the package is installed editable), or ``$SPEC_REPRO_ROOT``."""
    env = os.environ.get("SPEC_REPRO_ROOT")
    return Path(env) if env else Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    return repo_root() / "data"


def figures_dir() -> Path:
    return repo_root() / "figures"
