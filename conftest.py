"""Test isolation for everything pytest collects (tests/ and, through nbval, notebooks/): Jupyter's config, data
and runtime folders and IPython's profile folder are a fresh temporary tree, so a test run never writes
``~/.jupyter`` (jupyter_core's ``migrated`` marker), ``~/.local/share/jupyter`` or ``~/.ipython``.

Set in ``pytest_configure``, before any test or nbval kernel starts (kernels inherit the environment); the
``jupyter_dirs`` fixture hands the folders to a test that needs them.

Garbage collection: before each test, what the previous one left is collected and whatever is still alive
(imported modules, fixtures, caches) is moved out of the collector's reach (``gc.freeze``), so that the
collector's full passes during a test go over what that test allocates, not over torch, transformers, pandas and
the earlier tests' fixtures again each time (a full pass over this process takes 0.3 to 0.7 s, and the tests
trigger over a hundred of them). Reference counting still frees frozen objects; the only difference is when
cyclic garbage is reclaimed, which no test checks (and the collection before each test takes the cycles a test
leaves behind)."""
from __future__ import annotations

import gc
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

_JUPYTER_VARS = ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR")
_root: Path | None = None


def pytest_configure(config):
    global _root
    _root = Path(tempfile.mkdtemp(prefix="spec-repro-jupyter-"))
    for var in _JUPYTER_VARS:
        d = _root / var.lower()
        d.mkdir()
        os.environ[var] = str(d)
    os.environ["JUPYTER_PLATFORM_DIRS"] = "1"   # jupyter_core's platformdirs layout: no migration step


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before each test: collect what the previous test left (a pass over what it allocated only: the rest is
    frozen), then freeze what is left alive."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """``--threads N`` of a command run in-process (``spec_repro.cli.main``) sets torch's thread count for the
    whole process: put back what the test started with, so that one test's setting does not carry into the rest
    of the session."""
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    yield
    torch = sys.modules.get("torch")
    if torch is not None and before is not None and torch.get_num_threads() != before:
        torch.set_num_threads(before)


def pytest_unconfigure(config):
    gc.unfreeze()
    if _root is not None:
        shutil.rmtree(_root, ignore_errors=True)


@pytest.fixture(scope="session")
def jupyter_dirs() -> dict[str, Path]:
    """The isolated Jupyter / IPython folders of this test session, by environment variable."""
    return {var: Path(os.environ[var]) for var in _JUPYTER_VARS}
