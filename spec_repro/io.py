"""Safe file output shared by every writer of the package.

- ``atomic_path(path)``: a context manager yielding a temporary name in the destination's folder; on success the
  file is fsynced and renamed over ``path`` (``os.replace``: readers see the old file or the new one, never a cut
  one), on any error the temporary file is removed and ``path`` is left as it was. Temporary names are short
  (``.NAME[:32].PID.XXXX.tmp``) and those of a killed writer are removed at the next write of the same file; a
  symlink is written through (its target replaced, the link kept).
- ``atomic_write(path, mode="w")``: the same, yielding an open file.
- ``check_writable(path)``: refuse, before any heavy work, an output path that cannot be written (a directory,
  a parent that is a file, a read-only folder), with a one-line ``OutputError``.
- ``staged_dir(out)``: a multi-file output written whole: the writers write into a hidden stage folder inside
  ``out``; on success its files replace ``out``'s (the manifest last), on any error the stage is removed and
  ``out`` keeps every file as it was.
- ``exclusive_lock(path)``: an inter-process lock that refuses at once (``LockedError``) when another process
  holds it; the kernel releases it when its holder dies, so a killed run never leaves a stale lock.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["OutputError", "LockedError", "atomic_path", "atomic_write", "write_via", "check_writable",
           "check_writable_dir", "exclusive_lock", "clean_stale_temps", "staged_dir"]


class OutputError(OSError):
    """An output path that cannot be written; the message names it and says why."""

    def __str__(self) -> str:  # OSError's default str would prefix an errno
        return str(self.args[0]) if self.args else ""


class LockedError(RuntimeError):
    """Another process holds the lock of an output."""


def check_writable(path: str | Path, what: str = "output") -> Path:
    """``path`` as a Path if a file can be written there (its folder may not exist yet); else OutputError."""
    p = Path(path).expanduser()
    if str(path) == "" or p.name in ("", ".", ".."):
        raise OutputError(f"{what} {str(path)!r} is not a file name")
    if p.is_dir():
        raise OutputError(f"{what} {p} is a directory; give a file name")
    if str(path).endswith(("/", os.sep)):  # 'newdir/' names a folder: never a file called 'newdir'
        raise OutputError(f"{what} {path} ends in '/', which names a folder; give a file name in it "
                          f"(e.g. {path}{'out.csv' if what == '--out' else 'out'})")
    if p.exists() and not os.access(p, os.W_OK):
        raise OutputError(f"{what} {p} exists and is not writable")
    _check_creatable(p, p.parent, what)
    return p


def _check_creatable(p: Path, anc: Path, what: str) -> None:
    """The nearest existing folder at or above ``anc`` lets ``p`` be created; else OutputError."""
    while not anc.exists():
        if anc.is_symlink():
            raise OutputError(f"{what} {p}: {anc} is a dangling link")
        anc = anc.parent
    if not anc.is_dir():
        raise OutputError(f"{what} {p}: {anc} is a file, not a folder")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise OutputError(f"{what} {p}: folder {anc} is not writable")


def check_writable_dir(path: str | Path, what: str = "output folder") -> Path:
    """``path`` as a Path if it is (or can be created as) a writable folder; else OutputError."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise OutputError(f"{what} {p} is a file, not a folder")
    _check_creatable(p, p, what)
    return p


@contextlib.contextmanager
def atomic_path(path: str | Path, suffix: str | None = None):
    """Yield a temporary path next to ``path``; rename it over ``path`` when the block succeeds.

    The temporary name is hidden and ends in ``.tmp`` (``suffix`` is appended for writers that infer a format
    from the name)."""
    path = Path(path)
    if path.exists() and not path.is_file() and not path.is_dir():
        yield path  # a device or a pipe (/dev/stdout, /dev/null): written in place, never replaced
        return
    if path.is_symlink():  # written through the link: its target is replaced, the link stays
        path = Path(os.path.realpath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    prefix = _tmp_prefix(path)
    clean_stale_temps(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{prefix}{os.getpid()}.", suffix=".tmp" + (suffix or ""))
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        try:  # keep the permissions an existing file had; a new one gets the umask's default
            mode = path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~_UMASK
            os.chmod(tmp, mode)
        except OSError:
            pass
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _tmp_prefix(path: Path) -> str:
    """Hidden and short, whatever the destination's length (a 250-byte name still leaves room): the first 32
    characters of the name, then the writer's pid (so that a later start knows a dead writer's leftovers)."""
    return f".{path.name[:32]}."


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def clean_stale_temps(path: str | Path) -> list[Path]:
    """Remove the temporary files that writers of ``path`` killed mid-write (SIGKILL, power loss) left beside
    it: hidden ``.NAME.PID.XXXX.tmp`` files whose PID is no longer running. Returns what was removed."""
    path = Path(path)
    prefix = _tmp_prefix(path)
    gone = []
    try:
        cands = [p for p in path.parent.iterdir() if p.name.startswith(prefix) and ".tmp" in p.name]
    except OSError:
        return gone
    for p in cands:
        pid = p.name[len(prefix):].split(".", 1)[0]
        if not pid.isdigit() or _alive(int(pid)) or not p.is_file():
            continue
        try:
            p.unlink()
            gone.append(p)
        except OSError:
            pass
    return gone


@contextlib.contextmanager
def atomic_write(path: str | Path, mode: str = "w", **kw):
    """``open(path, mode)`` that replaces ``path`` only when the block finished without error."""
    if not mode.startswith("w"):
        raise ValueError("atomic_write writes whole files: mode must start with 'w'")
    with atomic_path(path) as tmp:
        with open(tmp, mode, **kw) as f:
            yield f
            f.flush()


@contextlib.contextmanager
def staged_dir(out: str | Path, seed=("MANIFEST.json",), last=("MANIFEST.json",)):
    """Yield a hidden stage folder inside ``out`` holding copies of ``out``'s files ``seed`` (a manifest the
    writers update); when the block succeeds, each non-hidden file of the stage is renamed over ``out``'s (those
    in ``last`` after the others), so that a failure before that point leaves ``out`` untouched. The stage is
    removed either way; an ``out`` the block created is removed again when it failed and left it empty."""
    import shutil

    out = Path(out)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(dir=out, prefix=f".stage.{os.getpid()}."))
    ok = False
    try:
        for name in seed:
            if (out / name).is_file():
                shutil.copy2(out / name, stage / name)
        yield stage
        names = sorted((p.name for p in stage.iterdir() if p.is_file() and not p.name.startswith(".")),
                       key=lambda n: (n in last, n))
        for name in names:
            os.replace(stage / name, out / name)
        ok = True
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        if created and not ok and not any(out.iterdir()):
            out.rmdir()


def write_via(writer, path: str | Path, *args, **kw) -> Path:
    """``writer(tmp, *args, **kw)`` (e.g. ``df.to_csv``, ``df.to_parquet``) on a temporary name, then renamed
    over ``path``."""
    with atomic_path(path) as tmp:
        writer(tmp, *args, **kw)
    return Path(path)


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


_UMASK = _umask()  # read once, at import (os.umask can only be read by setting it)


@contextlib.contextmanager
def exclusive_lock(path: str | Path, what: str = "this output"):
    """Hold an exclusive inter-process lock on ``path`` (a lock file) or raise LockedError at once."""
    from filelock import FileLock, Timeout

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise LockedError(f"another process is writing {what} (lock {path} is held); wait for it to finish "
                          f"or use another output") from None
    try:
        yield
    finally:
        lock.release()
