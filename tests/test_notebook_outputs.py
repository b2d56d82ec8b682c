"""The committed notebooks' outputs name no machine: no absolute path of a home, a checkout or a virtualenv
(such as tqdm.auto's "IProgress not found" warning, which carries the path of tqdm's file), and the
package's progress bars cannot emit that warning."""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
MACHINE_PATH = re.compile(r"/root/|/home/|/Users/|/work/|/tmp/|\.venv|site-packages|[A-Za-z]:\\\\Users\\\\")


def output_texts(nb: dict):
    """(cell index, text) of every output's text: streams, tracebacks and text-like data (not images)."""
    for i, cell in enumerate(nb.get("cells", [])):
        for out in cell.get("outputs", []):
            texts = [out.get("text", "")] + list(out.get("traceback", []))
            for kind, value in out.get("data", {}).items():
                if kind.startswith("text/") or kind.endswith("json") or kind == "image/svg+xml":
                    texts.append(value if isinstance(value, (str, list)) else json.dumps(value))
            for t in texts:
                yield i, "".join(t) if isinstance(t, list) else str(t)


def machine_paths(nb: dict) -> list[str]:
    hits = []
    for i, text in output_texts(nb):
        for m in MACHINE_PATH.finditer(text):
            line = text[text.rfind("\n", 0, m.start()) + 1:].split("\n", 1)[0]
            hits.append(f"cell {i}: {line[:160]}")
    return hits


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 7


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_machine_path_in_outputs(path):
    hits = machine_paths(json.loads(path.read_text()))
    assert not hits, f"{path.name}: outputs name this machine's paths:\n" + "\n".join(hits)


def test_the_scan_finds_a_path():
    nb = {"cells": [{"cell_type": "code", "outputs": [
        {"output_type": "stream", "name": "stderr",
         "text": ["/home/u/.venv/lib/python3.11/site-packages/tqdm/auto.py:21: TqdmWarning: IProgress "
                  "not found\n"]},
        {"output_type": "execute_result", "data": {"text/plain": ["'fine'"]}}]}]}
    assert len(machine_paths(nb)) == 3 and all(h.startswith("cell 0: /home/u/") for h in machine_paths(nb))


def test_progress_bars_do_not_need_ipywidgets():
    """Without ipywidgets the package's bar is tqdm's plain one (tqdm.auto would warn in a kernel); no module
    of the package imports tqdm.auto itself."""
    from tqdm import tqdm as plain

    from spec_repro.progress import tqdm

    if importlib.util.find_spec("ipywidgets") is None:
        assert tqdm is plain
    users = [p.relative_to(ROOT).as_posix() for p in (ROOT / "spec_repro").rglob("*.py")
             if "tqdm.auto" in p.read_text() and p.name != "progress.py"]
    assert users == []
