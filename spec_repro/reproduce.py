"""``spec-repro reproduce``: run the notebooks headless (papermill: the six on the study's findings and 07, a causal
selector measured against its oracle bound), collect their figures and
summary rows, and write the summary table (finding, paper value, this run's value, source).

A notebook that fails is reported with its failing cell; the others still run. Each notebook receives
``figures_dir`` and ``summary_path`` parameters and writes its rows with ``findings.write_summary``.

The notebooks are jupytext pairs (``notebooks/NAME.py`` in percent format, ``NAME.ipynb`` with outputs). A
default run (profile ``embedded``, no parameters, the repo's ``figures/``) writes each executed notebook back to
``notebooks/NAME.ipynb`` with its outputs, stripped of what changes from run to run (papermill's injected cell,
timings), so a re-run rewrites the same bytes and a run in JupyterLab changes only outputs. The kernel's own log
(ipykernel's start-up and shutdown chatter) goes to ``out_dir/notebooks/NAME.kernel.log``, not to the terminal.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import pandas as pd

from .findings import KEY_PREFIXES, MAX_LINE, read_summaries, summary_markdown
from .paths import repo_root
from .rowlabels import label_rows

__all__ = ["NOTEBOOKS", "PROFILES", "NotebookResult", "reproduce", "notebooks_dir", "parse_parameters",
           "check_injectable", "check_declared", "ParameterError", "RUNNER_PARAMETERS", "clean_executed",
           "source_notebook", "update_readme_results", "README_MARKERS"]

NOTEBOOKS = [
    "01_proposers_vs_batch",
    "02_verification_bottleneck",
    "03_acceptance_behavior",
    "04_ngram_overlap",
    "05_oracle_bound",
    "06_hybrid_oracle",
    "07_adaptive",
]

# Notebooks that read no acceptance traces (they declare no ``traces`` parameter): a run on other traces skips
# them, since what they would write is the default run's, not the traces' (no copies of their figures and rows
# beside the traces' own, e.g. under figures/published).
TRACE_FREE = ("02_verification_bottleneck",)

# Parameters each profile passes to every notebook (a notebook ignores what it does not declare).
PROFILES: dict[str, dict] = {
    # Committed data: embedded traces (data/traces), CPU measurements (data/cpu), H200 logs (data/gpu).
    "embedded": {},
    # A GPU host with vLLM: the notebooks that can run live do so (see their `backend` parameter).
    "gpu": {"backend": "vllm"},
}


def notebooks_dir() -> Path:
    return repo_root() / "notebooks"


# Bounds on a `-p NAME=VALUE` value: its text, its nesting and its element count (with no aliases, what the
# text says is all there is: a value cannot grow while it is read).
MAX_PARAMETER_BYTES = 4096
MAX_PARAMETER_DEPTH = 4
MAX_PARAMETER_ITEMS = 1000

# Notebook parameters `reproduce` sets itself, and the option that sets each instead of `-p`.
RUNNER_PARAMETERS = {
    "figures_dir": "--figures DIR",
    "summary_path": "--out DIR (each notebook's rows go to DIR/summary/NAME.json)",
}


class ParameterError(ValueError):
    """A notebook parameter refused; the message is one line that names the parameter and says why."""


def _data_loader():
    """A YAML loader for a parameter's value that builds plain data only: ``yaml.SafeLoader`` refusing, as it
    parses and before any node is built, an explicit tag (``!!binary``, ``!!python/object``, ``!x``), an
    anchor or alias (``&a``, ``*a``: what an alias bomb multiplies), nesting deeper than
    ``MAX_PARAMETER_DEPTH`` and more than ``MAX_PARAMETER_ITEMS`` nodes."""
    import yaml
    from yaml.events import AliasEvent, CollectionStartEvent

    class DataLoader(yaml.SafeLoader):
        def __init__(self, stream):
            super().__init__(stream)
            self.depth = self.nodes = 0

        def compose_node(self, parent, index):
            event = self.peek_event()
            if isinstance(event, AliasEvent) or getattr(event, "anchor", None) is not None:
                raise ParameterError("YAML anchors and aliases (&, *) are not accepted: write the value out")
            if getattr(event, "tag", None) is not None:
                raise ParameterError(f"YAML tags ({event.tag}) are not accepted: a parameter is plain data "
                                     "(a number, a string, true/false, null, or a list or mapping of those)")
            self.nodes += 1
            if self.nodes > MAX_PARAMETER_ITEMS:
                raise ParameterError(f"more than {MAX_PARAMETER_ITEMS} elements")
            nested = isinstance(event, CollectionStartEvent)
            self.depth += nested
            if self.depth > MAX_PARAMETER_DEPTH:
                raise ParameterError(f"nested deeper than {MAX_PARAMETER_DEPTH} levels")
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= nested

    return DataLoader


def _plain_data(value) -> str | None:
    """None when ``value`` is plain data (None, bool, int, float, str, or a list of those or a mapping from
    strings to those, nested); otherwise what is not (e.g. ``'a date (quote it to give a string)'``)."""
    import datetime

    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "a string that is not valid UTF-8 text (a lone surrogate)"
        return None
    if value is None or isinstance(value, (bool, int, float)):
        return None
    if isinstance(value, list):
        return next((w for w in map(_plain_data, value) if w), None)
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            return "a mapping with a key that is not a string (quote it)"
        return next((w for w in map(_plain_data, [*value, *value.values()]) if w), None)
    if isinstance(value, (datetime.date, datetime.datetime)):
        return "a date (quote it to give a string)"
    return f"a {type(value).__name__}, not plain data"


def _same(a, b) -> bool:
    """``a == b`` with types equal at every level (``True == 1`` and ``[1] == [1.0]`` are not the same
    here)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return a == b


def _short(value, n: int = 60) -> str:
    """``repr(value)``, cut to ``n`` characters."""
    r = repr(value)
    return r if len(r) <= n else r[:n - 3] + "..."


def check_injectable(name: str, value) -> None:
    """Raise ``ParameterError`` unless ``value`` reaches notebook parameter ``name`` as data: plain data whose
    assignment, as papermill writes it into the notebook (``PythonTranslator.codify``), is one assignment to
    ``name`` of a literal that reads back as ``value`` itself (types included). A value papermill cannot write
    as such a literal (bytes, NaN, infinity, an object) is refused, never run."""
    import ast

    from papermill.translators import PythonTranslator

    what = _plain_data(value)
    if what:
        raise ParameterError(f"parameter {name}: {what}")
    try:
        (stmt,) = ast.parse(PythonTranslator.codify({name: value})).body
        ok = (isinstance(stmt, ast.Assign) and [getattr(t, "id", None) for t in stmt.targets] == [name]
              and _same(ast.literal_eval(stmt.value), value))
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        ok = False
    if not ok:
        raise ParameterError(f"parameter {name}: {_short(value)} cannot be passed to a notebook as a Python "
                             "literal that reads back as the same value (e.g. NaN, infinity)")


def parse_parameters(items: Sequence[str]) -> dict:
    """``["NAME=VALUE", ...]`` -> {NAME: value}, each value parsed as YAML (as ``papermill -y`` does) into
    plain data: ``k=5`` is an int, ``batch_sizes=[1, 32]`` a list, ``model=qwen`` a string, ``traces=null``
    None. Refused (``ParameterError``, one line): a name given twice, a parameter ``reproduce`` sets itself
    (``RUNNER_PARAMETERS``), a value over ``MAX_PARAMETER_BYTES`` bytes (UTF-8), YAML tags, anchors and
    aliases, and a value papermill could not write as the same literal (``check_injectable``). Whether a value
    suits what the notebooks declare is ``reproduce``'s check (``check_declared``)."""
    import yaml

    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name.isidentifier():
            raise ParameterError(f"parameter {_short(item)}: expected NAME=VALUE, e.g. batch_sizes='[1, 32]'")
        if name in RUNNER_PARAMETERS:
            raise ParameterError(f"parameter {name} is set by reproduce itself: use "
                                 f"{RUNNER_PARAMETERS[name]}")
        if name in out:
            raise ParameterError(f"parameter {name} given twice")
        size = len(value.encode("utf-8", "surrogateescape"))
        if size > MAX_PARAMETER_BYTES:
            raise ParameterError(f"parameter {name}: a value of {size} bytes; at most {MAX_PARAMETER_BYTES}")
        try:
            out[name] = yaml.load(value, Loader=_data_loader()) if value.strip() else ""
        except ParameterError as e:
            raise ParameterError(f"parameter {name}: {e}") from None
        except yaml.YAMLError as e:
            raise ParameterError(f"parameter {name}: {_short(value)} is not a YAML value "
                                 f"({getattr(e, 'problem', None) or type(e).__name__})") from None
        check_injectable(name, out[name])
    return out


def _kind(value) -> str:
    """What ``value`` is, in words: 'null', 'an int', 'a bool', 'a list', ..."""
    if value is None:
        return "null"
    t = type(value).__name__
    return ("an " if t[0] in "aeiou" else "a ") + t


def _misfit(value, default) -> str | None:
    """None when ``value`` suits a parameter declared ``= default``; otherwise why not. A declared None takes
    any value (the notebook's comment says which); an int takes an int (not a bool), a float an int or a
    float, a bool a bool, a string a string, a list a list whose elements suit the default's (when they share
    one type). An empty string, list or mapping is refused unless the default is one: a declared None means
    'all' or 'the notebook's choice', and an empty value would silently mean something else."""
    empty_default = type(default) is type(value) and not default
    if isinstance(value, (str, list, dict)) and not value and not empty_default:
        return f"{_short(value)} is empty; leave the parameter out for the notebook's default"
    if default is None:
        return None
    if isinstance(default, bool) or isinstance(value, bool):
        fits = isinstance(value, bool) and isinstance(default, bool)
    elif isinstance(default, int):
        fits = isinstance(value, int)
    elif isinstance(default, float):
        fits = isinstance(value, (int, float))
    else:
        fits = isinstance(value, type(default))
    if not fits:
        what = "null" if value is None else f"{_short(value)} is {_kind(value)}"
        return f"{what}; the notebook declares {_kind(default)}"
    if isinstance(default, list) and default and len({type(x) for x in default}) == 1:
        return next((f"element {w}" for w in (_misfit(x, default[0]) for x in value) if w), None)
    return None


def check_declared(parameters: Mapping, declared: Mapping[str, Mapping[str, str]]) -> None:
    """Raise ``ParameterError`` unless each of ``parameters`` suits its declaration in every notebook that
    declares it (``declared``: notebook -> name -> the default's source, as ``papermill.inspect_notebook``
    reads the parameters cell; see ``_misfit``)."""
    import ast

    for name, value in parameters.items():
        for nb, params in declared.items():
            if name not in params:
                continue
            try:
                default = ast.literal_eval(params[name])
            except (ValueError, SyntaxError):   # a default that is an expression: no type to check against
                continue
            why = _misfit(value, default)
            if why:
                raise ParameterError(f"parameter {name}: {why} ({nb} declares {name} = {params[name]})")


def clean_executed(src: Path, dst: Path) -> None:
    """Write the executed notebook ``src`` to ``dst`` as a top-to-bottom run in JupyterLab would leave it, without
    what changes from run to run: papermill's injected-parameters cell (absolute paths) and metadata (timings),
    cell execution timestamps; execution counts renumbered 1, 2, ... Outputs, cell ids and the kernel's
    ``language_info`` stay."""
    import nbformat

    from .io import atomic_write

    nb = nbformat.read(str(src), as_version=4)
    nb.cells = [c for c in nb.cells if "injected-parameters" not in c.metadata.get("tags", [])]
    count = 0
    for c in nb.cells:
        c.metadata.pop("papermill", None)
        c.metadata.pop("execution", None)
        if c.cell_type == "code" and c.get("execution_count") is not None:
            count += 1  # numbered as a top-to-bottom run in JupyterLab numbers them (no injected cell)
            c.execution_count = count
            for o in c.get("outputs", []):
                if "execution_count" in o:
                    o["execution_count"] = count
    nb.metadata.pop("papermill", None)
    with atomic_write(dst) as f:
        f.write(nbformat.writes(nb) + "\n")  # as Jupyter's own save ends the file


def source_notebook(name: str):
    """Notebook ``name`` as ``spec-repro reproduce`` runs it: the code and text of its jupytext source
    ``notebooks/NAME.py`` (the file to edit), with the cell ids and outputs of ``NAME.ipynb`` where the two match,
    so regenerated notebooks keep their ids. Without a ``.py``, the ``.ipynb`` itself."""
    import jupytext
    from jupytext.combine import combine_inputs_with_outputs

    py, ipynb = notebooks_dir() / f"{name}.py", notebooks_dir() / f"{name}.ipynb"
    if not py.exists():
        return jupytext.read(ipynb)
    nb = jupytext.read(py)
    return combine_inputs_with_outputs(nb, jupytext.read(ipynb)) if ipynb.exists() else nb


def _kernel_manager(log: Path):
    """A kernel manager class whose kernel writes its stdout/stderr to ``log``: ipykernel logs its TCP-transport
    warning at start and a 'KeyboardInterrupt caught' line when papermill stops it; neither is about the
    notebook, and cell output travels over the kernel's channels, not these streams."""
    from jupyter_client.manager import AsyncKernelManager

    class _Logged(AsyncKernelManager):
        async def _async_launch_kernel(self, kernel_cmd, **kw):
            f = open(log, "ab")
            kw["stdout"] = kw["stderr"] = f
            try:
                await super()._async_launch_kernel(kernel_cmd, **kw)
            finally:
                f.close()  # the child holds its own descriptor

    return _Logged


@dataclass
class NotebookResult:
    name: str
    ok: bool
    seconds: float
    output: Path
    summary: Path | None = None
    error: str | None = None
    figures: list[str] = field(default_factory=list)


def _describe_failure(e: Exception, executed: Path | None = None) -> str:
    """Name the failing cell of a papermill execution error: its 0-based index in the SOURCE notebook (papermill's
    injected-parameters cell not counted) and its first line."""
    idx = getattr(e, "cell_index", None)
    if idx is None:
        return f"{type(e).__name__}: {e}"
    try:
        import nbformat

        cells = nbformat.read(str(executed), as_version=4).cells[:idx]
        idx -= sum("injected-parameters" in c.metadata.get("tags", []) for c in cells)
    except Exception:  # the executed notebook could not be read: keep papermill's index
        pass
    src = (getattr(e, "source", "") or "").strip().splitlines()
    first = src[0][:80] if src else ""
    return f"cell {idx} (starts {first!r}): {getattr(e, 'ename', type(e).__name__)}: {getattr(e, 'evalue', e)}"


def reproduce(profile: str = "embedded", out_dir: str | Path = "out/reproduce", *,
              figures_dir: str | Path | None = None, notebooks: Sequence[str] | None = None,
              parameters: Mapping | None = None, kernel_name: str | None = None, progress: bool = True,
              timeout_s: int | None = 1800, gpu_deadline_s: float | None = None,
              head: str | Path | None = None) -> tuple[list[NotebookResult], pd.DataFrame]:
    """Run the notebooks; returns per-notebook results and the summary table (written to ``out_dir`` as
    ``summary.md`` and ``summary.csv``, and beside the figures as ``SUMMARY.md``/``summary.csv``; executed
    notebooks go to ``out_dir/notebooks``). ``table.attrs["written"]`` lists every file the run wrote, as
    (where, path): ``"committed"`` for the repository's files a plain run refreshes, ``"out"`` for ``out_dir``,
    ``"figures"`` for a ``figures_dir`` of the caller's.

    Profile ``gpu`` first runs the study's grid live with vLLM into ``out_dir/gpu`` (``engines.vllm.gpu_profile``:
    resumable, ``gpu_deadline_s`` stops it starting new work, ``head`` the EAGLE head), then passes the notebooks
    what it measured (its live tables, Llama-dims runs and traces); ``parameters`` override those."""
    import papermill as pm
    from .progress import tqdm

    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {sorted(PROFILES)}")
    names = list(dict.fromkeys(notebooks or NOTEBOOKS))  # a name given twice runs once
    own = sorted(set(parameters or {}) & set(RUNNER_PARAMETERS))
    if own:
        raise ParameterError(f"parameter {own[0]} is set by reproduce itself: use "
                             f"{RUNNER_PARAMETERS[own[0]]}")
    unknown = [n for n in names if not any((notebooks_dir() / f"{n}{x}").exists() for x in (".py", ".ipynb"))]
    if unknown:
        raise FileNotFoundError(f"no such notebook(s) {unknown} in {notebooks_dir()}; have {NOTEBOOKS}")
    from . import writerule

    # What a run may write (spec_repro.writerule): only a plain run refreshes the committed results (notebooks,
    # figures/, SUMMARY.md, the README table); with parameters, other traces, another profile or --figures
    # everything goes under out_dir (figures in out_dir/figures) or the caller's --figures folder. Neither may
    # be the checkout or one of its committed folders; a --figures folder keeps summaries it did not get from us.
    publish = writerule.is_plain(profile, parameters, figures_dir)
    writerule.check_targets(repo_root(), out=out_dir, figures=figures_dir)
    out = Path(out_dir).resolve()
    fig_dir = Path(figures_dir).resolve() if figures_dir is not None else \
        (repo_root() / "figures" if publish else out / "figures")
    if figures_dir is not None:
        writerule.check_foreign_summaries(fig_dir)
    (out / "notebooks").mkdir(parents=True, exist_ok=True)
    (out / "summary").mkdir(parents=True, exist_ok=True)
    fig_dir.mkdir(parents=True, exist_ok=True)

    import nbformat

    sources = {}
    for name in names:
        sources[name] = out / "notebooks" / f"{name}.source.ipynb"
        nbformat.write(source_notebook(name), str(sources[name]))
    # each notebook's parameters: name -> the default's source text
    declared = {n: {k: v["default"] for k, v in pm.inspect_notebook(str(p)).items()}
                for n, p in sources.items()}

    def planned(parameters: Mapping | None) -> dict[str, dict]:
        """What each notebook gets (what it declares), every value checked to reach it as data (a --figures or
        --out path papermill cannot write as a literal, too)."""
        plan = {}
        for name in names:
            params = {**PROFILES[profile], **(parameters or {}), "figures_dir": str(fig_dir),
                      "summary_path": str(out / "summary" / f"{name}.json")}
            plan[name] = {k: v for k, v in params.items() if k in declared[name]}
            for k, v in plan[name].items():
                check_injectable(k, v)
        return plan

    with_traces = (parameters or {}).get("traces") is not None   # the caller's traces (not the gpu profile's)
    if with_traces:   # other traces: skip what reads none (TRACE_FREE)
        skipped = [n for n in names if "traces" not in declared[n]]
        if skipped and progress:
            print(f"skipped with traces: {', '.join(skipped)} (reads no traces; the default run has its output)")
        for n in skipped:
            sources.pop(n).unlink(missing_ok=True)
            declared.pop(n)
        names = [n for n in names if n not in skipped]
    stray = sorted(set(parameters or {}) - set().union(*declared.values(), set()))
    try:     # a refusal, no GPU or a kill before the notebooks run: no notebook source is left behind
        if stray:
            known = sorted(set().union(*declared.values()) - set(RUNNER_PARAMETERS))
            raise ParameterError(f"unknown notebook parameter(s) {stray}: the notebooks declare {known}")
        check_declared(parameters or {}, declared)
        plan = planned(parameters)
        if profile == "gpu":   # the grid live (long, resumable), once the notebooks and parameters are known good
            from .engines.vllm import gpu_profile

            gpu_profile.run(out / "gpu", head=head, deadline_s=gpu_deadline_s)
            parameters = {**gpu_profile.notebook_parameters(out / "gpu"), **(parameters or {})}
            plan = planned(parameters)
    except BaseException:
        for p in sources.values():
            p.unlink(missing_ok=True)
        raise
    made_by = writerule.config(profile, parameters)
    results: list[NotebookResult] = []
    bar = tqdm(names, desc="notebooks", unit="nb", disable=not progress)
    for name in bar:
        bar.set_postfix_str(name)
        src = sources[name]
        dst = out / "notebooks" / f"{name}.ipynb"
        summ = out / "summary" / f"{name}.json"
        summ.unlink(missing_ok=True)
        writerule.record_config(summ, None)
        before = {p.name: p.stat().st_mtime for p in fig_dir.glob("*.png")}
        params = plan[name]
        log = out / "notebooks" / f"{name}.kernel.log"
        log.unlink(missing_ok=True)
        t0 = time.perf_counter()
        try:
            pm.execute_notebook(str(src), str(dst), parameters=params, cwd=str(notebooks_dir()),
                                kernel_name=kernel_name, progress_bar=False, log_output=False,
                                execution_timeout=timeout_s, kernel_manager_class=_kernel_manager(log))
            ok, err = True, None
        except Exception as e:  # papermill wraps a cell's error; keep going with the others
            ok, err = False, _describe_failure(e, dst)
        src.unlink(missing_ok=True)
        if ok and publish:
            clean_executed(dst, notebooks_dir() / f"{name}.ipynb")
        dt = time.perf_counter() - t0
        figs = sorted(p.name for p in fig_dir.glob("*.png") if before.get(p.name) != p.stat().st_mtime)
        if ok and not summ.exists():
            ok, err = False, "ran, but wrote no summary rows (summary_path)"
        if summ.exists():
            writerule.record_config(summ, made_by)
        results.append(NotebookResult(name, ok, dt, dst, summ if summ.exists() else None, err, figs))
        if not ok:
            tqdm.write(f"FAILED {name}: {err}")
    bar.close()

    # Rows of this run, plus, in a plain run of only some notebooks, those an earlier plain run into the same
    # out_dir left (writerule.mergeable), so `--only` refreshes part of the table without losing the rest; rows
    # made with other parameters are never merged.
    ran = {r.name for r in results}
    kept = [out / "summary" / f"{n}.json" for n in NOTEBOOKS
            if n not in ran and not (with_traces and n in TRACE_FREE)
            and writerule.mergeable(out / "summary" / f"{n}.json", made_by, publish)]
    # every row names what ran: its runner, weights and engine configuration (rowlabels: from the measured
    # sources' engine records, else from what the source says)
    table = label_rows(read_summaries(sorted([r.summary for r in results if r.summary is not None] + kept)))
    head = f"Profile `{profile}`"
    if parameters:
        head += "; parameters " + ", ".join(
            f"`{k}` = " + (", ".join(Path(x).name for x in v) if k == "traces" and isinstance(v, (list, tuple))
                           else f"`{v}`")
            for k, v in parameters.items())
    import textwrap

    prefix = KEY_PREFIXES["published" if _study_traces(parameters) else "package"]
    md = ("# Reproduction summary\n\n" + "\n".join(textwrap.wrap(head + ".", MAX_LINE, break_on_hyphens=False))
          + "\n\n" + summary_markdown(table, prefix))
    failed = [r for r in results if not r.ok]
    if failed:
        md += "\n## Failed notebooks\n\n" + "".join(f"- `{r.name}`: {r.error}\n" for r in failed)
    _write_table(out, {"summary.md": md, "summary.csv": table})
    committed = publish
    # The committed table holds every notebook's rows: a partial run (`--only` into an out_dir that has no
    # plain summary of the others) would drop theirs, so it leaves SUMMARY.md, summary.csv and the README alone.
    missing = [n for n in NOTEBOOKS if n not in ran and (out / "summary" / f"{n}.json") not in kept
               and not (with_traces and n in TRACE_FREE)]
    partial = committed and bool(missing)
    if not partial:     # a copy next to the figures, so figures/ carries the table that goes with them
        _write_table(fig_dir, {"SUMMARY.md": md, "summary.csv": table})
        if not committed:   # the committed figures/ gets no marker: git says who wrote its files
            writerule.mark_written(fig_dir, writerule.SUMMARY_FILES)
    readme = update_readme_results() if committed and not partial else False
    fig_kind = "committed" if committed else "figures" if figures_dir is not None else "out"
    written = [("committed", notebooks_dir() / f"{r.name}.ipynb") for r in results if r.ok and publish]
    written += [(fig_kind, fig_dir / f) for r in results for f in r.figures]
    written += [] if partial else [(fig_kind, fig_dir / f) for f in ("SUMMARY.md", "summary.csv")]
    written += [("committed", repo_root() / "README.md")] if readme else []
    table.attrs["kept"] = (f"{fig_dir / 'SUMMARY.md'}, summary.csv and the README's table left as they were: "
                           f"{', '.join(missing)} did not run and have no summary of a plain run under "
                           f"{out / 'summary'} (run them once, plain, into --out {out}, or run every notebook)"
                           ) if partial else ""
    written += [("out", p) for r in results for p in (r.output, out / "notebooks" / f"{r.name}.kernel.log", r.summary)
                if p is not None and Path(p).exists()]
    written += [("out", out / "summary.md"), ("out", out / "summary.csv")]
    table.attrs["written"] = [(k, str(p)) for k, p in written]
    return results, table


def _write_table(folder: Path, files: Mapping) -> None:
    """Write a summary's files together (name -> markdown text or a table for CSV): into a stage folder, then
    swapped in, so that a failure leaves the folder's earlier pair as it was, never one new and one old."""
    from .io import staged_dir

    with staged_dir(folder, seed=(), last=()) as stage:
        for name, content in files.items():
            if isinstance(content, str):
                (stage / name).write_text(content)
            else:
                content.to_csv(stage / name, index=False)


def _study_traces(parameters: Mapping | None) -> bool:
    """Whether the run's traces are the study's own published files (recognized by sha256, as
    ``published.read_published_jsonl`` does): its summary then uses the published source keys (A..)."""
    from .fetch import sha256_file
    from .traces import STUDY_FILES

    traces = (parameters or {}).get("traces")
    files = [traces] if isinstance(traces, str) else traces
    if not isinstance(files, list) or not files or not all(isinstance(f, str) for f in files):
        return False
    try:
        return all(sha256_file(f) in STUDY_FILES for f in files)
    except OSError:
        return False


README_MARKERS = ("<!-- results:start (generated by spec-repro reproduce from figures/summary.csv and "
                  "figures/published/summary.csv; do not edit) -->", "<!-- results:end -->")


def update_readme_results(readme: Path | None = None) -> bool:
    """Rewrite the README's results table (between ``README_MARKERS``) from the headline rows of the committed
    summaries: this package's own data (``figures/summary.csv``) and the study's published traces
    (``figures/published/summary.csv``, when it exists). Returns whether the README changed."""
    from .findings import headline_markdown
    from .io import atomic_write

    readme = readme or repo_root() / "README.md"
    figs = repo_root() / "figures"
    tables = []
    for label, f, prefix in (("the study's published traces", figs / "published" / "summary.csv", KEY_PREFIXES["published"]),
                             ("this package's data", figs / "summary.csv", KEY_PREFIXES["package"])):
        if f.exists():
            tables.append((label, pd.read_csv(f, keep_default_na=False), prefix))  # "n/a" is text here, not a NaN
    if not readme.exists() or not tables:
        return False
    text = readme.read_text()
    a, b = text.find(README_MARKERS[0]), text.find(README_MARKERS[1])
    if a < 0 or b < a:
        return False
    new = text[:a] + README_MARKERS[0] + "\n\n" + headline_markdown(tables) + "\n" + text[b:]
    if new == text:
        return False
    with atomic_write(readme) as f:
        f.write(new)
    return True
