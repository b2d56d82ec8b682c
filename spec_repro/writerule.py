"""What a ``spec-repro reproduce`` run may write: one rule, checked here before anything is written.

The rule:

1. **Committed files change only in a plain run.** The checkout's notebooks (``notebooks/NAME.ipynb``), figures
   (``figures/``), summaries (``figures/SUMMARY.md``, ``figures/summary.csv``) and the README's results table are
   rewritten only by a *plain* run: profile ``embedded``, no ``-p``, no ``--traces``, no ``--figures``
   (``is_plain``). Every other run writes under ``--out`` (figures in ``OUT/figures``) or in a ``--figures`` folder
   of the caller's, never in the checkout's committed folders.
2. **Outputs never land on the checkout's committed folders.** ``--out`` and ``--figures`` may not be, contain or
   lie inside the checkout's ``figures/``, ``notebooks/`` or ``data/``, nor be the checkout root or a folder above
   it (``check_targets``): paths are resolved first, so ``.``, ``..`` and links count as what they name. A plain
   run's committed outputs go where the package puts them, not where an option says.
3. **A summary table holds rows of one configuration.** Each notebook's rows (``OUT/summary/NAME.json``) are
   recorded with the configuration that made them (``OUT/summary/NAME.made_by.json``: the profile and the
   parameters, ``record_config``). When ``--only`` runs part of the notebooks, a plain run completes its table
   with the rows an earlier run left in ``OUT/summary`` only when that run was plain too (``mergeable``); rows
   made with other parameters, or of unknown origin, are never merged, and the committed table is then left as
   it was (it would lose the other notebooks' rows). A run that is not plain merges nothing: its table holds its
   own rows.
4. **A folder keeps files the package did not write.** Before a notebook runs, a ``--figures`` folder holding a
   ``SUMMARY.md`` or ``summary.csv`` that the package did not write there (no ``MARKER`` naming its sha256:
   a user's file, or one edited since) is refused with one line (``check_foreign_summaries``); after writing,
   the marker records what was written (``mark_written``).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Mapping

from .fetch import sha256_file

__all__ = ["WriteRuleError", "COMMITTED_DIRS", "MARKER", "SUMMARY_FILES", "is_plain", "check_targets",
           "config", "record_config", "recorded_config", "mergeable", "check_foreign_summaries", "mark_written"]

#: The checkout's folders of committed results and inputs: no output option may name them, contain them or
#: lie inside them.
COMMITTED_DIRS = ("figures", "notebooks", "data")
#: The marker file, in a folder the package writes summaries into, naming each file it wrote there (sha256).
MARKER = ".spec_repro_written.json"
#: The summary files written beside the figures.
SUMMARY_FILES = ("SUMMARY.md", "summary.csv")


class WriteRuleError(ValueError):
    """An output refused by the write rule; the message is one line naming the option, the path and why."""


def is_plain(profile: str, parameters: Mapping | None, figures_dir) -> bool:
    """A run that may refresh the committed files: profile ``embedded``, no parameters (``--traces`` arrives as
    the ``traces`` parameter), no ``--figures``."""
    return profile == "embedded" and not parameters and figures_dir is None


def _real(p) -> Path:
    return Path(os.path.realpath(Path(p).expanduser()))


def check_targets(root: Path, **targets) -> None:
    """Refuse (``WriteRuleError``) each of ``targets`` (option -> path, None skipped) that resolves to the
    checkout root or a folder above it, or that is, holds or lies inside one of its ``COMMITTED_DIRS``."""
    root = _real(root)
    committed = [root / d for d in COMMITTED_DIRS]
    for what, path in targets.items():
        if path is None:
            continue
        p = _real(path)
        opt = "--" + what.replace("_", "-")
        if p == root or p in root.parents:
            raise WriteRuleError(f"{opt} {path} is the checkout ({root}) or a folder above it: a run would write "
                                 f"over its committed notebooks, figures and summaries; give a folder of its own "
                                 f"(e.g. {opt} out/reproduce)")
        for c in committed:
            if p == c or c.is_relative_to(p) or p.is_relative_to(c):
                raise WriteRuleError(f"{opt} {path} is, holds or lies inside the checkout's committed {c.name}/: "
                                     f"only a plain run (no -p, --traces or --figures) refreshes it, by itself; "
                                     f"give a folder of its own (e.g. {opt} out/reproduce)")


def config(profile: str, parameters: Mapping | None) -> dict:
    """The configuration that makes a notebook's summary rows: the profile and the parameters (JSON data)."""
    return json.loads(json.dumps({"profile": profile, "parameters": dict(parameters or {})}, sort_keys=True,
                                 default=str))


def _config_path(summary: Path) -> Path:
    return summary.with_name(summary.stem + ".made_by.json")


def record_config(summary: Path, cfg: dict | None) -> None:
    """Record beside ``summary`` the configuration ``cfg`` that made it; ``None`` removes the record."""
    from .io import atomic_write

    path = _config_path(Path(summary))
    if cfg is None:
        path.unlink(missing_ok=True)
        return
    with atomic_write(path) as f:
        f.write(json.dumps(cfg, sort_keys=True) + "\n")


def recorded_config(summary: Path) -> dict | None:
    """The configuration recorded beside ``summary``; None when there is none or it cannot be read."""
    try:
        data = json.loads(_config_path(Path(summary)).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def mergeable(summary: Path, cfg: dict, plain: bool) -> bool:
    """Whether an earlier run's ``summary`` may complete this run's table: only in a plain run, and only when the
    summary exists and was recorded as made by the same (plain) configuration ``cfg``."""
    return plain and Path(summary).is_file() and recorded_config(summary) == cfg


def _marker(folder: Path) -> dict:
    try:
        data = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def check_foreign_summaries(folder: Path, what: str = "--figures") -> None:
    """Refuse (``WriteRuleError``) a ``folder`` holding a summary file (``SUMMARY_FILES``) that the package did not
    write there, or that was changed since: it would be replaced."""
    folder = Path(folder)
    written = _marker(folder)
    for name in SUMMARY_FILES:
        f = folder / name
        if f.exists() and written.get(name) != (sha256_file(f) if f.is_file() else None):
            raise WriteRuleError(f"{what} {folder}: it holds a {name} that spec-repro did not write (or that was "
                                 f"changed since); nothing was written: move it, or give another folder")


def mark_written(folder: Path, names: Iterable[str]) -> None:
    """Record in ``folder``'s marker the sha256 of each file ``names`` the package just wrote there."""
    from .io import atomic_write

    folder = Path(folder)
    written = _marker(folder)
    written.update({n: sha256_file(folder / n) for n in names if (folder / n).is_file()})
    with atomic_write(folder / MARKER) as f:
        f.write(json.dumps(written, indent=1, sort_keys=True) + "\n")
