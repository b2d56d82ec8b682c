"""The ``spec-repro`` command. Each subcommand keeps its own ``_add_<name>``/``_run_<name>`` pair below
and imports its library module lazily, so ``spec-repro --help`` is instant."""
from __future__ import annotations

import argparse
import sys


# ---- simulate (issue: foundation) ------------------------------------------------------------------------
def _add_simulate(sub):
    p = sub.add_parser("simulate", help="oracle / fixed-k speedup simulation over acceptance traces")
    p.set_defaults(func=_run_simulate)
    return p


def _run_simulate(args):
    raise SystemExit("simulate: not implemented yet")


# ---- registry ---------------------------------------------------------------------------------------------
_COMMANDS = [_add_simulate]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spec-repro", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for add in _COMMANDS:
        add(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
