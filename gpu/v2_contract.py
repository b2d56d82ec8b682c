"""Write spec_repro/engines/vllm/v2_contract.json: the vLLM 0.25.0 methods the plugin's V2-runner patches wrap
(``runner_v2_patches.V2_WRAPPED``), each with its parameter names as read from vLLM's source by ``ast`` (no vLLM
import, no GPU). The plugin's runtime guard (``v2_contract.check``) compares the running vLLM's methods
(``inspect.signature``) with this file and patches nothing when one differs.

    python gpu/v2_contract.py --src /path/to/site-packages      # the folder that holds vllm/ (the 0.25.0 wheel)
    python gpu/v2_contract.py --src DIR --check                   # exit 1 when the committed file differs
"""
from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "spec_repro" / "engines" / "vllm" / "v2_contract.json"
sys.path.insert(0, str(ROOT))


def params_of(fn: ast.FunctionDef) -> list[str]:
    """Parameter names in ``inspect.signature`` order (positional-only, positional, *args, keyword-only, **kw)."""
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args]
    if a.vararg:
        names.append("*" + a.vararg.arg)
    names += [x.arg for x in a.kwonlyargs]
    if a.kwarg:
        names.append("**" + a.kwarg.arg)
    return names


def read_method(src: Path, module: str, qualname: str) -> dict:
    path = src / (module.replace(".", "/") + ".py")
    tree = ast.parse(path.read_text())
    cls_name, meth = qualname.split(".")
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name), None)
    if cls is None:
        raise SystemExit(f"{path}: no class {cls_name}")
    fn = next((n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == meth),
              None)
    if fn is None:
        raise SystemExit(f"{path}: {cls_name} defines no {meth}")
    return {"module": module, "qualname": qualname, "params": params_of(fn),
            "file": str(path.relative_to(src)), "line": fn.lineno}


def build(src: Path) -> dict:
    from spec_repro.engines.vllm.v2_contract import V2_WRAPPED

    vf = src / "vllm" / "_version.py"
    version = None
    for line in (vf.read_text().splitlines() if vf.is_file() else []):
        if line.startswith("__version__ =") and ("'" in line or '"' in line):
            version = line.rsplit("=", 1)[1].strip().strip("'\"")
    return {"vllm": version, "what": "the vLLM methods the V2-runner patches wrap, with their parameters as read "
            "from vLLM's source (gpu/v2_contract.py)",
            "wrapped": {f"{m}:{q}": read_method(src, m, q) for m, q in V2_WRAPPED}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", required=True, help="the folder holding vllm/ (vLLM 0.25.0's source)")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    a = ap.parse_args(argv)
    if not (Path(a.src) / "vllm").is_dir():
        print(f"v2_contract: no vllm/ under --src {a.src}", file=sys.stderr)
        return 2
    new = build(Path(a.src))
    if a.check:
        old = json.loads(Path(a.out).read_text())
        same = old.get("wrapped") == new["wrapped"]
        print("same" if same else "differs")
        return 0 if same else 1
    Path(a.out).write_text(json.dumps(new, indent=1) + "\n")
    print(f"wrote {a.out}: {len(new['wrapped'])} methods")
    return 0


if __name__ == "__main__":
    sys.exit(main())
