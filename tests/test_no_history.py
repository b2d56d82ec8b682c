"""The product tells results, not its history: no module, script, notebook source, GPU job script or README (the
main one, gpu/'s, every data folder's) recounts development sessions, GPU runs by ordinal, job stages that no
longer exist (``run6``, ``start10``), plan parts (``part w``) or issue numbers. The chronicle is CHANGELOG.md.

A development ``session`` is told apart from the words that stay: the POSIX process session (``setsid``,
``start_new_session``, "process session"), the data identifiers ``sessions.json`` and the ``session`` column of the
steps tables (quoted, in backticks, a table header or in a list of columns) and identifiers that contain the word.
In Python only strings and comments are read (names such as ``_session`` or ``plugin_sessions`` are code).

Each check is a pure function of a file's text, so the tests below also feed it texts that must fail."""
from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

from spec_repro.paths import repo_root

#: what is scanned, relative to the repository root
GLOBS = ("spec_repro/**/*.py", "gpu/*.sh", "gpu/README.md", "notebooks/*.py", "README.md", "data/**/README.md",
         "benchmarks/**/*.py", "benchmarks/**/README.md", "tests/fixtures/**/README.md")

ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|"
            "fourteenth|fifteenth|\\d+(?:st|nd|rd|th)")
QUALIFIER = "(?:GPU|live|device|H200)"
PATTERNS = (
    # "the twelfth session", "the first live session", "the seventh GPU run": a session or a device run counted
    # ("it first runs", "in a second run" of a benchmark are not)
    ("ordinal session or run", re.compile(
        rf"\b(?:{ORDINALS})(?:'s)?\s+(?:(?:{QUALIFIER}\s+)?sessions?|{QUALIFIER}\s+runs?)\b", re.I)),
    # "the tenth's (live9)", "the eighth's": a session by its ordinal alone (fifth and up: "a sixth of it" is not)
    ("ordinal session", re.compile(r"\b(?:fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth)'s\b", re.I)),
    ("issue number", re.compile(r"\bissues?[\s-]*#?\s*\d+", re.I)),
    ("issue deliverable", re.compile(r"\bDeliver(?:able)?\s+\d+\b")),
    # job stages of past runs (gpu/live_job.sh's are vllm piece setup start run stop status pack send)
    ("past job stage", re.compile(r"\b(?:run|start)\d+\b")),
    ("plan part", re.compile(r"\bparts? [a-z](?:'s)?(?= |,|;|:|\)|\.|$)")),
    ("a lost machine", re.compile(r"\b(?:the|its|a|one) machine was lost\b", re.I)),
    ("session", re.compile(r"session", re.I)),
)
# a `session` that is not development history
SESSION_OK = re.compile(
    r"[\w.]session|session(?:s?(?:\.\w|\()|_|Context)"   # in an identifier: sessions.json, _session, sessions()
    r"|[`'\"]sessions?[`'\"]"                  # the data column (or the function), quoted
    r"|\|\s*session\s*\|"                      # a table's header
    r"|(?:, |\(|per )session,|, session[,)]"   # a list of columns: "spec, session, primary"
    r"|process session|POSIX session", re.I)
POSIX = re.compile(r"setsid|start_new_session|new_session|setpgrp")
UPSTREAM_ISSUE = re.compile(r"(?:vLLM|upstream|vllm-project/vllm)\s+issues?", re.I)


def _prose(path: str, text: str) -> list[tuple[int, str]]:
    """(line number, text) of what is read: every line, or in Python only its strings and comments."""
    if not path.endswith(".py"):
        return list(enumerate(text.splitlines(), 1))
    out = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type in (tokenize.STRING, tokenize.COMMENT):
                out += [(tok.start[0] + i, line) for i, line in enumerate(tok.string.splitlines())]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return list(enumerate(text.splitlines(), 1))
    return out


def history_hits(path: str, text: str) -> list[str]:
    """``path:line: kind: text`` for every line of ``text`` that recounts history."""
    raw = text.splitlines()
    hits = []
    for n, line in _prose(path, text):
        for kind, pat in PATTERNS:
            for m in pat.finditer(line):
                if kind == "session":
                    lo, hi = max(m.start() - 2, 0), m.end() + 1
                    near = "\n".join(raw[max(n - 4, 0):n + 3])     # three lines either side
                    if SESSION_OK.search(line[max(lo - 5, 0):hi + 5]) or POSIX.search(near):
                        continue
                if kind == "issue number" and UPSTREAM_ISSUE.search(line[max(m.start() - 30, 0):m.end()]):
                    continue
                hits.append(f"{path}:{n}: {kind}: {line.strip()[:120]}")
                break
            else:
                continue
            break
    return hits


def scanned_files() -> list[Path]:
    root = repo_root()
    files = {p for g in GLOBS for p in root.glob(g) if p.is_file()}
    return sorted(p for p in files if ".ipynb_checkpoints" not in p.parts)


def test_there_are_files_to_scan():
    names = {p.relative_to(repo_root()).as_posix() for p in scanned_files()}
    assert {"README.md", "spec_repro/engines/vllm/live.py", "gpu/live_job.sh", "data/gpu/README.md",
            "data/gpu/v1-runner/README.md", "data/gpu/v2grid/README.md"} <= names


def test_the_product_tells_results_not_history():
    root = repo_root()
    hits = [h for p in scanned_files() for h in history_hits(p.relative_to(root).as_posix(), p.read_text())]
    assert hits == [], "history belongs in CHANGELOG.md:\n" + "\n".join(hits)


# the check fails where it must
@pytest.mark.parametrize("line", [
    "The twelfth GPU session ran sharegpt.", "the head the fifth session trained", "profiled the next session",
    "(the machine was lost before run10's profile)", "the tenth's (live9) bf16 on the H200",
    "`gpu/live_job.sh start8` (`plan --session 6`)", "as issue 18 asked", "see Issue #21",
    "before the issue-18 run", "(issue 18, Deliver 5; part w)", "right after part w on the same machine",
    "part s's sharegpt requests", "the first live session's outputs", "in session 3 the jobs ran side by side",
    "this session's steps", "measured in the third GPU run", "Two sessions in one table",
    "a later session re-made it", "Its machine was lost three times between calls",
])
def test_the_check_can_fail(line):
    assert len(history_hits("x.md", f"# x\n\n{line}\n")) == 1, line


@pytest.mark.parametrize("line", [
    "`sessions.json`: dates and commands of the device runs", "the `session` column of `steps.parquet`",
    "| session | when (UTC) | machine |", "spec, session, primary, run, method", "per session, spec, model",
    "vLLM's PR #24344 rule; 18 issues of timing; tissue 3", "(vLLM issue #45258)",
    "a stall of 0.2 s is a sixth of it", "the run's first 8 requests", "part of the step",
    "a process session of its own (setsid)", "bash gpu/live_job.sh start", "`run_specs` kills a spec's process group",
    "it first runs the grid", "in a second run: 20.1 s", "`__all__ = [\"sessions\"]`",
    "a machine lost between calls loses at most what ran since the last poll",
])
def test_the_check_lets_results_through(line):
    assert history_hits("x.md", f"# x\n\n{line}\n") == [], line


def test_python_is_read_in_its_strings_and_comments_only():
    code = ('session = {"a": 1}\nplugin_sessions = session.get("a")\n'
            'p = subprocess.Popen(cmd, start_new_session=True)\n'
            'x = 1  # its own session does not get the terminal\'s Ctrl-C\n')
    assert history_hits("m.py", code) == []
    bad = 'def f():\n    """Fitted on the seventh session\'s steps."""\n    return 1  # see issue 18\n'
    assert [h.split(":")[1] for h in history_hits("m.py", bad)] == ["2", "3"]
