"""The top-level README leads with what was found: short, a findings table on its first screen, results not history.

Each check is a pure function of the README's text, so the tests below also feed them texts that must fail."""
from __future__ import annotations

import re
import sys

import pytest

from spec_repro.paths import repo_root

MAX_LINES = 200
FIRST_SCREEN = 40
# the fresh-machine commands the README shows and .ci/run runs (the test one), kept exactly
COMMANDS = ('python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 -e . && spec-repro reproduce '
            '--out out',
            'python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 -e ".[test]" && pytest -q')
CHRONICLE = (re.compile(r"session", re.I),                   # "the twelfth session", "GPU session"
             re.compile(r"\bissues?\s*#?\s*\d+", re.I))       # "issue 18", "issue #21"


def readme_text() -> str:
    return (repo_root() / "README.md").read_text()


def findings_table_line(text: str, within: int = FIRST_SCREEN) -> int | None:
    """1-based line of the first markdown table header that names "paper" and is followed by its separator row and
    at least one body row, all within the first ``within`` lines; None when there is none."""
    lines = text.splitlines()[:within]
    sep = re.compile(r"^\s*\|(\s*:?-{3,}:?\s*\|)+\s*$")
    for i, line in enumerate(lines[:-2]):
        if (line.lstrip().startswith("|") and "paper" in line.lower() and sep.match(lines[i + 1])
                and lines[i + 2].lstrip().startswith("|")):
            return i + 1
    return None


def chronicle_hits(text: str) -> list[str]:
    """The README's lines that tell history rather than results (a session, an issue number)."""
    return [line for line in text.splitlines() if any(p.search(line) for p in CHRONICLE)]


def test_readme_is_short():
    n = len(readme_text().splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines (at most {MAX_LINES})"


def test_findings_table_on_the_first_screen():
    assert findings_table_line(readme_text()) is not None, \
        f"no markdown table with a 'paper' column in README.md's first {FIRST_SCREEN} lines"


def test_readme_tells_results_not_history():
    assert chronicle_hits(readme_text()) == []


def test_fresh_machine_commands_unchanged_and_early():
    lines = readme_text().splitlines()
    for cmd in COMMANDS:
        assert cmd in lines, cmd
        assert lines.index(cmd) < FIRST_SCREEN, f"{cmd!r} not on the first screen"
    ci = (repo_root() / ".ci" / "run").read_text()
    assert COMMANDS[1].replace("pip install ", "pip install -q ") in ci


def test_generated_results_block_is_there_once():
    from spec_repro.reproduce import README_MARKERS

    text = readme_text()
    for marker in README_MARKERS:
        assert text.count(marker) == 1, marker
    assert text.index(README_MARKERS[0]) < text.index(README_MARKERS[1])


# the checks fail where they must
@pytest.mark.parametrize("text", [
    "# x\n\n" + "| a | b |\n|---|---|\n| 1 | 2 |\n",                                        # no "paper" column
    "# x\n" + "\n" * 45 + "| finding | paper |\n|---|---|\n| 1 | 2 |\n",                  # below the first screen
    "# x\n\n| finding | paper |\n| 1 | 2 |\n",                                             # no separator row
    "# x\n\nthe paper | says\n|---|---|\n",                                                 # not a table
])
def test_findings_table_check_can_fail(text):
    assert findings_table_line(text) is None


def test_findings_table_check_finds_a_table():
    assert findings_table_line("# x\n\n| finding | paper | this package |\n|---|---|---|\n| 1 | 2 | 3 |\n") == 3


@pytest.mark.parametrize("line", ["The twelfth session ran sharegpt.", "one GPU session later",
                                  "as issue 18 asked", "see Issue #21", "issues 5 and 6"])
def test_chronicle_check_can_fail(line):
    assert chronicle_hits(f"# x\n\n{line}\n") == [line]


def test_chronicle_check_lets_results_through():
    assert chronicle_hits("vLLM PR #24344's rule; 18 issues of timing; tissue 3\n") == []


def test_length_check_can_fail(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "readme_text", lambda: "line\n" * (MAX_LINES + 1))
    with pytest.raises(AssertionError, match="lines"):
        test_readme_is_short()


BLEU_SUPPORT = r"([\d.]+) \(([\d,]+) / ([\d,]+) requests below / above\)"


def bleu_support(text: str, prefix: str = "") -> tuple[str, ...] | None:
    """A BLEU-4 threshold and its support as a text states it ("0.7 (1,131 / 60 requests below / above)"), the first
    one after ``prefix``."""
    m = re.search(re.escape(prefix) + BLEU_SUPPORT, text)
    return tuple(g.replace(",", "") for g in m.groups()) if m else None


def test_headline_bleu_threshold_is_the_summarys():
    """The hand-written headline row of finding 3 states what the generated summary measured on Qwen."""
    import csv

    rows = csv.DictReader((repo_root() / "figures" / "summary.csv").open())
    got = next(r["this_run"] for r in rows
               if r["quantity"] == "BLEU-4 above which n-gram beats eagle (qwen2.5-coder-1.5b)")
    assert bleu_support(readme_text(), "Qwen: ") == bleu_support(got) is not None


def test_headline_bleu_check_can_fail():
    assert bleu_support("Qwen: 0.7 (1,092 / 52 requests below / above)", "Qwen: ") == ("0.7", "1092", "52")
    assert bleu_support("0.7 (1131 / 60 requests below / above)") == ("0.7", "1131", "60")
    assert bleu_support("Qwen: none supported", "Qwen: ") is None
