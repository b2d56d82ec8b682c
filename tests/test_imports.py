"""No import circle among spec_repro's modules outside ``spec_repro/engines/vllm/``, and none inside that package
(it runs inside vLLM's processes and is checked on its own: its modules among themselves).

The graph is read from the source (AST), not by importing: module A depends on module B when A's file holds
an import of B anywhere, at module level or inside a function or class (a deferred import only hides a
circle from Python's loader, not from the design: the circle costmodel -> paths -> tracefiles -> published
-> simcore -> costmodel ran through function-level imports). Imports under ``if TYPE_CHECKING:`` never run
and do not count. ``from .x import y`` depends on ``x`` (and on ``x.y`` when that is a module); importing
``a.b.c`` also runs the packages ``a.b`` above it, so it depends on them too (``spec_repro`` itself, which
imports nothing, is left out, and so are a module's own packages: Python runs them before the module
whatever it imports, so a package's ``__init__`` that imports its submodules is no circle).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "spec_repro"
SKIP = "spec_repro.engines.vllm"


def _name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(root: Path = PKG) -> dict[str, Path]:
    """spec_repro's modules outside engines/vllm/: dotted name -> file."""
    mods = {_name(f, root): f for f in sorted(root.rglob("*.py"))}
    return {m: f for m, f in mods.items() if m != SKIP and not m.startswith(SKIP + ".")}


def _vllm_modules(root: Path = PKG) -> dict[str, Path]:
    """The modules of spec_repro/engines/vllm/ (the package itself included): dotted name -> file."""
    mods = {_name(f, root): f for f in sorted(root.rglob("*.py"))}
    return {m: f for m, f in mods.items() if m == SKIP or m.startswith(SKIP + ".")}


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes inside ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``) blocks."""
    out: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.If) and ast.unparse(n.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            out |= {id(x) for b in n.body for x in ast.walk(b)}
    return out


def imports_of(name: str, path: Path, known) -> set[str]:
    """The spec_repro modules (of ``known``) that module ``name`` (file ``path``) imports, anywhere in its
    file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skip = _type_checking_nodes(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for n in ast.walk(tree):
        if id(n) in skip:
            continue
        if isinstance(n, ast.Import):
            targets |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom):
            if n.level:
                base = package.split(".")
                base = base[: len(base) - (n.level - 1)]
                mod = ".".join(base + ([n.module] if n.module else []))
            else:
                mod = n.module or ""
            targets.add(mod)
            targets |= {f"{mod}.{a.name}" for a in n.names}   # `from pkg import module`
    deps: set[str] = set()
    for t in targets:
        parts = t.split(".")
        for i in range(2, len(parts) + 1):   # a.b.c runs a.b (and a.b.c); `spec_repro` alone is left out
            if ".".join(parts[:i]) in known:
                deps.add(".".join(parts[:i]))
    # the module itself and its own packages (Python runs those before the module whatever it imports)
    return {d for d in deps if d != name and not name.startswith(d + ".")}


def import_graph(root: Path = PKG, modules=_modules) -> dict[str, set[str]]:
    mods = modules(root)
    return {m: imports_of(m, f, mods) for m, f in mods.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected component with more than one module (Tarjan), written a -> ... -> a
    starting at its alphabetically first module; sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    cycles = []
    for comp in comps:   # the shortest circle through the component's first module (breadth-first)
        start = min(comp)
        prev = {start: None}
        queue, found = [start], None
        while queue and found is None:
            nxt = []
            for v in queue:
                for w in sorted(graph[v] & comp):
                    if w == start:
                        found = v
                        break
                    if w not in prev:
                        prev[w] = v
                        nxt.append(w)
                if found is not None:
                    break
            queue = nxt
        path = [found]
        while path[-1] != start:
            path.append(prev[path[-1]])
        cycles.append(path[::-1] + [start])
    return sorted(cycles)


def test_no_import_circle():
    graph = import_graph()
    assert "spec_repro.costmodel" in graph and "spec_repro.engines.vllm.plugin" not in graph
    cycles = find_cycles(graph)
    assert not cycles, "import circle(s) among spec_repro's modules:\n" + "\n".join(
        " -> ".join(m.removeprefix("spec_repro.") for m in c) for c in cycles)


def test_no_import_circle_inside_the_vllm_package():
    """engines/vllm/ among itself, module-level and function-level imports alike: the shared constants and
    helpers (``common``) sit below the engine and the plugin, which import neither the other."""
    graph = import_graph(modules=_vllm_modules)
    assert {"spec_repro.engines.vllm.plugin", "spec_repro.engines.vllm.engine"} <= set(graph)
    cycles = find_cycles(graph)
    assert not cycles, "import circle(s) inside engines/vllm/:\n" + "\n".join(
        " -> ".join(m.removeprefix("spec_repro.engines.vllm.") for m in c) for c in cycles)


def test_a_circle_inside_the_vllm_package_is_found(tmp_path):
    """The vLLM package's check can fail: a copy of it where the engine imports the plugin inside a function and
    the plugin imports the engine (as they once did) is reported as that circle."""
    vllm = tmp_path / "spec_repro" / "engines" / "vllm"
    vllm.mkdir(parents=True)
    for init in (tmp_path / "spec_repro", vllm.parent, vllm):
        (init / "__init__.py").write_text("")
    (vllm / "engine.py").write_text("def env():\n    from .plugin import HYBRID_OFF\n    return HYBRID_OFF\n")
    (vllm / "plugin.py").write_text("def rpc():\n    from .engine import host_probe\n")
    (vllm / "common.py").write_text("")
    graph = import_graph(tmp_path / "spec_repro", modules=_vllm_modules)
    assert find_cycles(graph) == [["spec_repro.engines.vllm.engine", "spec_repro.engines.vllm.plugin",
                                   "spec_repro.engines.vllm.engine"]]
    (vllm / "plugin.py").write_text("def rpc():\n    from .common import host_probe\n")
    assert find_cycles(import_graph(tmp_path / "spec_repro", modules=_vllm_modules)) == []


def test_a_circle_is_found_and_named(tmp_path):
    """The check can fail: a copy of three modules that import each other in a circle, one of them inside a
    function, is reported as that circle; a TYPE_CHECKING import is not."""
    pkg = tmp_path / "spec_repro"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub.b import f\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import g\n    return g\n")
    (pkg / "c.py").write_text("import spec_repro.a\n")
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .e import x\n")
    (pkg / "e.py").write_text("from . import d\n")
    graph = import_graph(pkg)
    assert graph["spec_repro.sub.b"] == {"spec_repro.c"}
    assert graph["spec_repro.d"] == set() and graph["spec_repro.e"] == {"spec_repro.d"}
    assert find_cycles(graph) == [["spec_repro.a", "spec_repro.sub.b", "spec_repro.c", "spec_repro.a"]]


@pytest.mark.parametrize("line", ["from .c import *", "from spec_repro import c"])
def test_import_forms_resolve(tmp_path, line):
    pkg = tmp_path / "spec_repro"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text(line + "\n")
    (pkg / "c.py").write_text("")
    assert import_graph(pkg)["spec_repro.a"] == {"spec_repro.c"}
