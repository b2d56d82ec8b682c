"""`spec-repro reproduce -p NAME=VALUE`: a parameter reaches a notebook as data, never as code. Each class of
hostile value is refused with one line before any notebook runs: code in a YAML tag (``!!binary`` bytes broke
out of papermill's quoting and ran in the kernel), an alias bomb (expanded for minutes), a value of the wrong
type or empty (``max_fixed_k=true`` ran as 1, ``datasets=[]`` as every dataset), a value papermill cannot
write back as the same literal, a parameter reproduce sets itself (``figures_dir``); ``--only X X`` runs X
once. Notebook execution is replaced by a stub here: nothing runs a kernel."""
from __future__ import annotations

import ast
import base64
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spec_repro import reproduce as R
from spec_repro.reproduce import ParameterError, check_declared, check_injectable, parse_parameters

from _cli import run_cli

NB = "05_oracle_bound"


def _payload(marker) -> str:
    """Python that, run in a kernel, creates ``marker``: as papermill would inject it from bytes."""
    return f'"; open("{marker}", "w").close()  #'


def cli(args, capsys) -> tuple[int, str]:
    """(exit code, stderr) of ``spec-repro ARGS`` in-process."""
    code, _out, err = run_cli(args, capsys)
    return code, err


@pytest.fixture()
def no_notebook_runs(monkeypatch):
    """papermill's execution replaced by a stub that fails the test: a refused parameter runs nothing."""
    import papermill as pm

    monkeypatch.setattr(pm, "execute_notebook", lambda *a, **k: pytest.fail("a notebook ran"))


def _one_error_line(err: str, *needles: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], lines[0]


# ---- code in a parameter -----------------------------------------------------------------------------------
def test_papermill_would_run_bytes_as_code(tmp_path):
    """Why the check exists: papermill writes bytes as ``"{value}"`` unescaped, so the injected cell holds
    more than one statement; check_injectable refuses such a value (and anything not plain data)."""
    from papermill.translators import PythonTranslator

    marker = tmp_path / "pwned"
    value = _payload(marker).encode()
    code = PythonTranslator.codify({"model": value})
    assert len(ast.parse(code).body) > 1
    exec(compile(code, "injected-parameters", "exec"), {})      # the payload is live: it makes the marker
    assert marker.exists()
    for bad in (value, bytearray(b"x"), object(), {1: 2}, float("nan"), float("inf"), [1, b"x"]):
        with pytest.raises(ParameterError, match="parameter model"):
            check_injectable("model", bad)


@pytest.mark.parametrize("value", [
    "!!binary {b64}",
    "!!python/object/apply:os.system ['touch {marker}']",
    "!!python/name:os.system",
    "!!str {marker}",
    "! {marker}",
    "[1, !!binary {b64}]",
])
def test_tagged_values_are_refused_and_nothing_runs(value, tmp_path, capsys, no_notebook_runs):
    marker = tmp_path / "pwned"
    v = value.format(b64=base64.b64encode(_payload(marker).encode()).decode(), marker=marker)
    with pytest.raises(ParameterError, match="YAML tags .* are not accepted"):
        parse_parameters([f"model={v}"])
    code, err = cli(["reproduce", "--only", NB, "--out", tmp_path / "o", "-p", f"model={v}"], capsys)
    assert code == 2
    _one_error_line(err, "parameter model", "YAML tags")
    assert not marker.exists()


def test_reproduce_refuses_bytes_given_in_python(tmp_path, no_notebook_runs):
    """reproduce() called with parameters (not through the CLI) checks them too, before any notebook runs."""
    marker = tmp_path / "pwned"
    with pytest.raises(ParameterError, match="parameter model"):
        R.reproduce("embedded", tmp_path / "o", figures_dir=tmp_path / "f", notebooks=[NB], progress=False,
                    parameters={"model": _payload(marker).encode()})
    assert not marker.exists()
    assert not list((tmp_path / "o" / "notebooks").glob("*.source.ipynb"))   # no half-written sources left


# ---- alias bomb and size -----------------------------------------------------------------------------------
def _bomb(levels: int = 9, width: int = 9) -> str:
    """A YAML alias bomb: ``levels`` anchors, each a list of ``width`` aliases of the one before."""
    rows = ['a0: &a0 ["lol"]']
    for i in range(1, levels):
        rows.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]")
    return "{" + ", ".join(rows) + "}"


def test_alias_bomb_is_refused_fast(tmp_path):
    """Refused at its first anchor, in well under a second; run in a child process with a time limit, so that
    a bomb that is expanded fails this test instead of hanging it."""
    bomb = _bomb()
    assert len(bomb) < 600
    timer = ("import sys, time\nfrom spec_repro.reproduce import ParameterError, parse_parameters\n"
             "t0 = time.perf_counter()\ntry:\n    parse_parameters([sys.argv[1]])\n"
             "except ParameterError as e:\n    print(f'{time.perf_counter() - t0:.3f} {e}')\n")
    r = subprocess.run([sys.executable, "-c", timer, f"batch_sizes={bomb}"], capture_output=True, text=True,
                       timeout=60)
    seconds, _, msg = r.stdout.strip().partition(" ")
    assert "anchors and aliases" in msg, (r.stdout, r.stderr)
    assert float(seconds) < 1.0
    r = subprocess.run([sys.executable, "-m", "spec_repro.cli", "reproduce", "--only", NB, "--out",
                        str(tmp_path / "o"), "-p", f"batch_sizes={bomb}"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and not r.stdout
    _one_error_line(r.stderr, "parameter batch_sizes", "anchors and aliases")
    for small in ("[&a 1, *a]", "&a 5", "{x: &a [1], y: *a}"):
        with pytest.raises(ParameterError, match="anchors and aliases"):
            parse_parameters([f"batch_sizes={small}"])


def test_size_nesting_and_element_count_are_bounded():
    t0 = time.perf_counter()
    for value, msg in (("x" * (R.MAX_PARAMETER_BYTES + 1), "bytes; at most"),
                       ("é" * (R.MAX_PARAMETER_BYTES // 2 + 1), "bytes; at most"),
                       ("[" * 3000, "nested deeper"),
                       ("[[[[[1]]]]]", "nested deeper"),
                       ("[" + ",".join(["1"] * (R.MAX_PARAMETER_ITEMS + 1)) + "]", "more than")):
        with pytest.raises(ParameterError, match=msg):
            parse_parameters([f"batch_sizes={value}"])
    assert time.perf_counter() - t0 < 5.0
    assert parse_parameters(["proposer_sets=[[ngram, draft], [ngram, eagle]]"]) == \
        {"proposer_sets": [["ngram", "draft"], ["ngram", "eagle"]]}


# ---- values that must read back as themselves --------------------------------------------------------------
def test_values_round_trip_through_papermill_or_are_refused():
    from papermill.translators import PythonTranslator

    for text, msg in ((".nan", "cannot be passed"), (".inf", "cannot be passed"),
                      ("-.inf", "cannot be passed"), ("2024-01-01", "a date"),
                      ("{1: 2}", "key that is not a string"), ("=", "not a YAML value"),
                      ('"\\udcff"', "not valid UTF-8"), ('{"\\udcff": 1}', "not valid UTF-8")):
        with pytest.raises(ParameterError, match=msg):
            parse_parameters([f"x={text}"])
    got = parse_parameters(['a="q\\"uo\\\\te é\\n"', "b=[1, true, null, 1.5, {c: d}]", "c=data/x=y.json"])
    assert got == {"a": 'q"uo\\te é\n', "b": [1, True, None, 1.5, {"c": "d"}], "c": "data/x=y.json"}
    for k, v in got.items():
        back = ast.literal_eval(PythonTranslator.translate(v))
        assert back == v and type(back) is type(v)


# ---- the declared type -------------------------------------------------------------------------------------
DECLARED = {NB: {"max_fixed_k": "7", "batch_sizes": "[1, 4, 16, 64]", "datasets": "None", "model": "None",
                 "cost_model": '"llama3.1-8b-h100"'},
            "other": {"max_fixed_k": "7", "ratio": "0.5", "flag": "True", "empty_ok": "[]"}}


@pytest.mark.parametrize("text, msg", [
    ("max_fixed_k=true", "True is a bool; the notebook declares an int"),
    ("max_fixed_k=7.5", "is a float; the notebook declares an int"),
    ("max_fixed_k=null", "null; the notebook declares an int"),
    ("max_fixed_k='7'", "is a str; the notebook declares an int"),
    ("batch_sizes=[1, true]", "element True is a bool"),
    ("batch_sizes=[1, '8']", "element '8' is a str"),
    ("batch_sizes=8", "is an int; the notebook declares a list"),
    ("batch_sizes=[]", "is empty"),
    ("datasets=[]", "is empty"),
    ("datasets={}", "is empty"),
    ("model=", "is empty"),
    ("model=''", "is empty"),
    ("cost_model=[a]", "is a list; the notebook declares a str"),
    ("flag=1", "is an int; the notebook declares a bool"),
    ("ratio=true", "is a bool; the notebook declares a float"),
])
def test_a_value_that_does_not_suit_the_declaration_is_refused(text, msg):
    params = parse_parameters([text])
    with pytest.raises(ParameterError, match=msg):
        check_declared(params, DECLARED)


def test_values_that_suit_the_declaration_pass():
    for text in ("max_fixed_k=5", "batch_sizes=[1, 32]", "datasets=[code-edit]", "model=null", "model=qwen",
                 "cost_model=data/gpu/fit.json", "ratio=1", "ratio=0.25", "flag=false", "empty_ok=[]",
                 "datasets=code-edit"):
        check_declared(parse_parameters([text]), DECLARED)


@pytest.mark.parametrize("p, msg", [("max_fixed_k=true", "True is a bool; the notebook declares an int"),
                                    ("datasets=[]", "[] is empty"),
                                    ("batch_sizes=[1, 2.5]", "element 2.5 is a float")])
def test_cli_refuses_a_misfit_against_the_real_notebook(p, msg, tmp_path, capsys, no_notebook_runs):
    code, err = cli(["reproduce", "--only", NB, "--out", tmp_path / "o", "-p", p], capsys)
    assert code == 2
    _one_error_line(err, msg, f"{NB} declares")
    assert not list((tmp_path / "o" / "notebooks").glob("*.source.ipynb"))


# ---- parameters reproduce sets itself, names given twice ---------------------------------------------------
def test_runner_parameters_are_refused_with_the_option_to_use(tmp_path, capsys, no_notebook_runs):
    with pytest.raises(ParameterError, match="figures_dir is set by reproduce itself: use --figures"):
        parse_parameters(["figures_dir=X"])
    for p, option in (("figures_dir=X", "--figures"), ("summary_path=s.json", "--out")):
        code, err = cli(["reproduce", "--only", NB, "--out", tmp_path / "o", "-p", p], capsys)
        assert code == 2
        _one_error_line(err, f"parameter {p.partition('=')[0]} is set by reproduce itself: use {option}")
    with pytest.raises(ParameterError, match="use --figures"):
        R.reproduce("embedded", tmp_path / "o", notebooks=[NB], progress=False,
                    parameters={"figures_dir": "X"})


def test_a_parameter_given_twice_is_refused(tmp_path, capsys, no_notebook_runs):
    with pytest.raises(ParameterError, match="given twice"):
        parse_parameters(["max_fixed_k=3", "max_fixed_k=4"])
    tr = tmp_path / "t.parquet"
    committed = R.repo_root() / "data" / "traces" / "smollm2-135m__code-edit.parquet"
    code, err = cli(["reproduce", "--only", NB, "--out", tmp_path / "o", "-p", f"traces={tr}",
                     "--traces", committed], capsys)
    assert code == 2
    _one_error_line(err, "traces given twice")


# ---- --only X X --------------------------------------------------------------------------------------------
def test_only_with_a_notebook_twice_runs_it_once(tmp_path, capsys, monkeypatch):
    import papermill as pm

    from spec_repro.analysis import SummaryRow, write_summary

    ran = []

    def fake_execute(src, dst, parameters=None, **kw):
        ran.append(src)
        assert Path(src).exists(), "the notebook's source was removed before it ran"
        write_summary([SummaryRow("5 test", "q", "paper", "run", "stub", 1.0)], parameters["summary_path"])

    monkeypatch.setattr(pm, "execute_notebook", fake_execute)
    code, err = cli(["reproduce", "--only", NB, NB, "--out", tmp_path / "o", "--figures", tmp_path / "f"],
                    capsys)
    assert code == 0, err
    assert len(ran) == 1
