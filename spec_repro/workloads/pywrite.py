"""py-write: HumanEval-shaped write-the-function prompts from the public functions of networkx (BSD-3-Clause), read
out of the same pinned wheel as :mod:`~spec_repro.workloads.pyfunctions`. A training source for EAGLE heads
(``spec-repro train eagle``): code written from a signature and its docstring, as ``humaneval``'s prompts ask,
from a source that shares no function with HumanEval (whose 164 tasks are all evaluation sources).

Each function ``pyfunctions.functions`` selects that has a docstring (and a body after it) becomes one prompt: its
source lines up to the end of the docstring (decorators and signature kept, nothing of the body) under
``humaneval``'s instruction. ``meta["task_id"]`` is the function's py-functions task id (one ``source_key`` across
both workloads); ``meta["canonical_solution"]`` is the body, ``meta["reference"]`` the original function (what a
perfect answer contains), so prompt/output overlap can be measured.
"""
from __future__ import annotations

import ast

from . import humaneval, pyfunctions

SOURCE = pyfunctions.SOURCE
VERSION = 1


def split_function(code: str) -> tuple[str, str] | None:
    """(signature with decorators + docstring, body after it) of the one function in ``code``, split at the line
    where the docstring ends; None without a docstring or without a statement on a later line."""
    fn = ast.parse(code).body[0]
    if not isinstance(fn, ast.FunctionDef) or ast.get_docstring(fn) is None or len(fn.body) < 2:
        return None
    end = fn.body[0].end_lineno
    if fn.body[1].lineno <= end:                 # a statement on the docstring's last line
        return None
    lines = code.splitlines(keepends=True)
    return "".join(lines[:end]), "".join(lines[end:])


def build(data: dict[str, bytes]) -> tuple[list[dict], dict]:
    files = pyfunctions.module_files(data)
    probs = pyfunctions.functions(files)
    records = []
    for p in probs:
        parts = split_function(p["prompt"])
        if parts is None:
            continue
        head, body = parts
        records.append({"id": f"py-write/{p['task_id'].split(':', 1)[1]}", "messages": humaneval.messages(head),
                        "meta": {"task_id": p["task_id"], "entry_point": p["entry_point"],
                                 "canonical_solution": body, "reference": p["prompt"]}})
    return records, {"derived_from": "networkx 3.4.2 public functions with a docstring (networkx wheel)",
                     "functions": len(probs), "skipped_without_docstring": len(probs) - len(records),
                     "files": len(files)}
