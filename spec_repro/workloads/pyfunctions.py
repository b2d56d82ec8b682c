"""py-functions: code-edit requests built from the public functions of networkx (BSD-3-Clause), read out of its
pinned wheel. A training source for EAGLE heads (``spec-repro train eagle``): code whose edits repeat the prompt,
as InstructCoder's and ``code-edit``'s do, from a source that shares no function with HumanEval (so no
evaluation request of ``code-edit`` or ``humaneval`` has a sibling in training).

Each top-level public function of 8-150 lines (decorators included, tests excluded) gets the edits of
:mod:`spec_repro.workloads.code_edit` (rename, type hints, docstring, for -> while) where they apply.
"""
from __future__ import annotations

import ast

from ._base import WheelSource

SOURCE = WheelSource(
    requirement="networkx==3.4.2",
    sha256="df5d4365b724cf81b8c6a7312509d0c22386097011ad1abe274afd5e9d3bbc5f",
    license="BSD-3-Clause (networkx)",
    homepage="https://networkx.org",
    members=(),                       # every file of the wheel (``build`` keeps networkx/*.py outside tests/)
)
VERSION = 1
MIN_LINES, MAX_LINES = 8, 150


def functions(files: dict[str, str]) -> list[dict]:
    """Problems in code-edit's shape (``prompt`` = the function's source, ``entry_point`` its name), sorted."""
    out = []
    for path in sorted(files):
        try:
            tree = ast.parse(files[path])
        except SyntaxError:
            continue
        lines = files[path].splitlines(keepends=True)
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            start = min([d.lineno for d in node.decorator_list] + [node.lineno])
            if not MIN_LINES <= node.end_lineno - start + 1 <= MAX_LINES:
                continue
            mod = path[:-3].replace("/", ".").removesuffix(".__init__")
            out.append({"task_id": f"networkx:{mod}.{node.name}", "prompt": "".join(lines[start - 1: node.end_lineno]),
                        "canonical_solution": "", "entry_point": node.name, "test": ""})
    return out


def module_files(data: dict[str, bytes]) -> dict[str, str]:
    """The wheel's networkx/*.py sources outside tests/ (path -> text)."""
    return {n: b.decode("utf-8") for n, b in data.items()
            if n.startswith("networkx/") and n.endswith(".py") and "/tests/" not in n}


def build(data: dict[str, bytes]) -> tuple[list[dict], dict]:
    from .code_edit import build_from_problems

    files = module_files(data)
    probs = functions(files)
    records = []
    for r in build_from_problems(probs):
        tid = r["meta"]["task_id"]
        r["id"] = f"py-functions/{tid.split(':', 1)[1]}/{r['meta']['edit']}"
        records.append(r)
    return records, {"derived_from": "networkx 3.4.2 public functions (networkx wheel)", "functions": len(probs),
                     "files": len(files)}
