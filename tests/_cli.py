"""``spec-repro`` run in-process for tests: its exit code and what it printed."""
from __future__ import annotations

import sys

from spec_repro.cli import main


def run_cli(args, capsys) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``spec-repro ARGS`` in-process (a SystemExit message counts as stderr)."""
    try:
        code = main([str(a) for a in args])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
    out, err = capsys.readouterr()
    return code, out, err
