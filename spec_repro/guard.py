"""The output guard every command calls before any heavy work: an output never equals or overwrites
an input, a folder given as ``--out`` is never deleted or emptied, and names behave as a user expects.

- ``out_file(path, what, inputs)``: a file output. A name ending in ``/`` names a folder and is refused (a file
  named like the folder would be written otherwise); a symlink is written through (its target is replaced, the
  link stays); an output that is the same file as one of ``inputs`` (by path or inode) is refused.
- ``out_dir(path, what, inputs)``: a folder that files are written into (never emptied): it must not be one of
  the inputs, nor hold one where an output of the command would go.
- ``head_dir(path, what, inputs)``: a folder the command owns whole (an EAGLE head): a new folder, an empty
  one, or one marked by ``OWNER_MARKER`` from an earlier head; never the current folder, one above it, the home
  folder or the root. ``claim_dir`` creates and marks it.
- ``check_int``/``check_float``/``check_device``: the checks of options the commands share (finite, in range,
  the right type; a device torch can use here).
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Iterable

from .io import OutputError, check_writable, check_writable_dir, clean_stale_temps

__all__ = ["OWNER_MARKER", "out_file", "out_dir", "head_dir", "claim_dir", "is_owned", "same_path",
           "check_int", "check_float", "check_device"]

OWNER_MARKER = ".spec_repro_owned"


def same_path(a: str | Path, b: str | Path) -> bool:
    """True when ``a`` and ``b`` name the same file or folder (through links, ``..`` and hard links)."""
    a, b = Path(a).expanduser(), Path(b).expanduser()
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    return os.path.realpath(a) == os.path.realpath(b)


def _inputs(inputs: Iterable) -> list[Path]:
    return [Path(str(i)).expanduser() for i in inputs if i is not None and str(i) != ""]


def out_file(path: str | Path, what: str = "--out", inputs: Iterable = ()) -> Path:
    """The file to write for output ``path`` (see the module doc); OutputError with one line otherwise."""
    s = str(path)
    p = check_writable(s, what)                # also refuses 'newdir/' (a folder's name)
    if p.is_symlink() and (not p.exists() or p.is_file()):
        p = Path(os.path.realpath(p))  # written through the link: the link stays, its target is replaced
        check_writable(p, what)
    for i in _inputs(inputs):
        if same_path(p, i):
            raise OutputError(f"{what} {s} is also an input ({i}); writing it would destroy that input: "
                              f"give another output name")
    clean_stale_temps(p)                       # what a writer killed mid-write (SIGKILL) left beside it
    return p


def out_dir(path: str | Path, what: str = "--out", inputs: Iterable = (), writes: Iterable[str] = ()) -> Path:
    """A folder that the command writes the files ``writes`` (names) into, never emptied."""
    p = check_writable_dir(path, what)
    for i in _inputs(inputs):
        if same_path(p, i):
            raise OutputError(f"{what} {path} is also an input ({i}); give another output folder")
        for w in writes:
            if same_path(p / w, i):
                raise OutputError(f"{what} {path}: writing {w} there would replace the input {i}; give another "
                                  f"output folder")
    for w in writes:
        clean_stale_temps(p / w)
    return p


def is_owned(path: Path) -> bool:
    return (Path(path) / OWNER_MARKER).is_file()


def head_dir(path: str | Path, what: str = "--out", inputs: Iterable = ()) -> Path:
    """A folder the command owns whole: new, empty, or marked by an earlier run (see the module doc)."""
    s = str(path)
    p = check_writable_dir(s, what)
    if p.is_symlink() and p.is_dir():
        p = Path(os.path.realpath(p))      # the link's folder gets the files; the link stays
    real = Path(os.path.realpath(p))
    cwd = Path(os.path.realpath(Path.cwd()))
    if real == cwd or real in cwd.parents or real == Path(os.path.realpath(Path.home())) or real == Path(real.anchor):
        raise OutputError(f"{what} {s} is the current folder, a folder above it, the home folder or the root; "
                          f"give a new folder for the output (e.g. {what} heads/my-head)")
    for i in _inputs(inputs):
        if same_path(p, i) or Path(os.path.realpath(i)).is_relative_to(real):
            raise OutputError(f"{what} {s} is or holds an input ({i}); give another output folder")
    if p.is_dir() and not is_owned(p) and any(p.iterdir()):
        raise OutputError(f"{what} {s} is a folder holding other files (not written by spec-repro: no "
                          f"{OWNER_MARKER}); nothing was touched: give a new or empty folder")
    return p


def claim_dir(p: Path, command: str) -> Path:
    """Create ``p`` (checked by ``head_dir``) if needed and mark it as written by ``command``."""
    from .io import atomic_write

    p = Path(p)
    p.mkdir(parents=True, exist_ok=True)
    if not is_owned(p):
        with atomic_write(p / OWNER_MARKER) as f:
            f.write(json.dumps({"written_by": command, "note": "spec-repro may replace the files it wrote "
                                                               "here; it never deletes others"}) + "\n")
    return p


# ---- numbers --------------------------------------------------------------------------------------------------
def check_int(name: str, v, lo: int | None = None, hi: int | None = None) -> int:
    """``v`` if it is an int (not a bool) in [lo, hi]; else ValueError naming the option."""
    if isinstance(v, bool) or not isinstance(v, int) or (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = f"{lo if lo is not None else '-inf'}..{f'{hi:,}' if hi is not None else 'inf'}"
        raise ValueError(f"{name} must be an integer in {rng}, got {v!r}")
    return v


def check_float(name: str, v, lo: float | None = None, hi: float | None = None, *, lo_open: bool = False) -> float:
    """``v`` as a float if it is a finite number (not a bool) in [lo, hi] (``lo_open``: > lo); else ValueError."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if ok and lo is not None:
        ok = v > lo if lo_open else v >= lo
    if ok and hi is not None:
        ok = v <= hi
    if not ok:
        lo_s = "" if lo is None else (f" > {lo:g}" if lo_open else f" >= {lo:g}")
        hi_s = "" if hi is None else f" and <= {hi:g}"
        raise ValueError(f"{name} must be a finite number{lo_s}{hi_s}, got {v!r}")
    return float(v)


def check_device(device) -> str:
    """``device`` if torch can place tensors there; ValueError with one line otherwise (no GPU, a typo)."""
    import torch

    try:
        d = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"--device {device!r} is not a torch device (e.g. cpu, cuda, cuda:1, mps)") from None
    if d.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise ValueError(f"--device {device}: no CUDA GPU is visible here (torch {torch.__version__}"
                             f"{', a CPU-only build' if not torch.version.cuda else ''}); use --device cpu")
        if d.index is not None and d.index >= n:
            raise ValueError(f"--device {device}: only {n} CUDA GPU(s) visible (cuda:0..cuda:{n - 1})")
    elif d.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError(f"--device {device}: MPS is not available here; use --device cpu")
    return str(device)
