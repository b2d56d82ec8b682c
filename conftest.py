"""Test isolation for everything pytest collects (tests/ and, through nbval, notebooks/): Jupyter's config, data
and runtime folders and IPython's profile folder are a fresh temporary tree, so a test run never writes
``~/.jupyter`` (jupyter_core's ``migrated`` marker), ``~/.local/share/jupyter`` or ``~/.ipython``.

Set in ``pytest_configure``, before any test or nbval kernel starts (kernels inherit the environment); the
``jupyter_dirs`` fixture hands the folders to a test that needs them."""
from __future__ import annotations

import os
import shutil
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


def pytest_unconfigure(config):
    if _root is not None:
        shutil.rmtree(_root, ignore_errors=True)


@pytest.fixture(scope="session")
def jupyter_dirs() -> dict[str, Path]:
    """The isolated Jupyter / IPython folders of this test session, by environment variable."""
    return {var: Path(os.environ[var]) for var in _JUPYTER_VARS}
