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

__all__ = ["NOTEBOOKS", "PROFILES", "NotebookResult", "reproduce", "notebooks_dir", "parse_parameters",
           "clean_executed", "source_notebook", "update_readme_results", "README_MARKERS"]

NOTEBOOKS = [
    "01_proposers_vs_batch",
    "02_verification_bottleneck",
    "03_acceptance_behavior",
    "04_ngram_overlap",
    "05_oracle_bound",
    "06_hybrid_oracle",
    "07_adaptive",
]

# Parameters each profile passes to every notebook (a notebook ignores what it does not declare).
PROFILES: dict[str, dict] = {
    # Committed data: embedded traces (data/traces), CPU measurements (data/cpu), H200 logs (data/gpu).
    "embedded": {},
    # A GPU host with vLLM: the notebooks that can run live do so (see their `backend` parameter).
    "gpu": {"backend": "vllm"},
}


def notebooks_dir() -> Path:
    return repo_root() / "notebooks"


def parse_parameters(items: Sequence[str]) -> dict:
    """``["NAME=VALUE", ...]`` -> {NAME: value}, each value parsed as YAML (as ``papermill -y`` does): ``k=5`` is
    an int, ``batch_sizes=[1, 32]`` a list, ``model=qwen`` a string, ``traces=null`` None."""
    import yaml

    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name.isidentifier():
            raise ValueError(f"parameter {item!r}: expected NAME=VALUE, e.g. batch_sizes='[1, 32]'")
        try:
            out[name] = yaml.safe_load(value) if value.strip() else ""
        except yaml.YAMLError as e:
            raise ValueError(f"parameter {name}: {value!r} is not a YAML value ({e.problem})") from None
    return out


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
    names = list(notebooks or NOTEBOOKS)
    unknown = [n for n in names if not any((notebooks_dir() / f"{n}{x}").exists() for x in (".py", ".ipynb"))]
    if unknown:
        raise FileNotFoundError(f"no such notebook(s) {unknown} in {notebooks_dir()}; have {NOTEBOOKS}")
    out = Path(out_dir).resolve()
    publish = profile == "embedded" and not parameters and figures_dir is None
    # only a plain run refreshes the committed results (notebooks, figures/, SUMMARY.md, the README table); with
    # parameters, other traces or another profile everything goes under out_dir, figures in out_dir/figures
    fig_dir = Path(figures_dir).resolve() if figures_dir is not None else \
        (repo_root() / "figures" if publish else out / "figures")
    (out / "notebooks").mkdir(parents=True, exist_ok=True)
    (out / "summary").mkdir(parents=True, exist_ok=True)
    fig_dir.mkdir(parents=True, exist_ok=True)

    import nbformat

    sources = {}
    for name in names:
        sources[name] = out / "notebooks" / f"{name}.source.ipynb"
        nbformat.write(source_notebook(name), str(sources[name]))
    declared = {n: set(pm.inspect_notebook(str(p))) for n, p in sources.items()}
    stray = sorted(set(parameters or {}) - set().union(*declared.values()))
    if stray:
        for p in sources.values():
            p.unlink(missing_ok=True)
        known = sorted(set().union(*declared.values()) - {"figures_dir", "summary_path"})
        raise ValueError(f"unknown notebook parameter(s) {stray}: the notebooks declare {known}")
    if profile == "gpu":   # the grid live (long, resumable), once the notebooks and parameters are known good
        from .engines.vllm import gpu_profile

        try:
            gpu_profile.run(out / "gpu", head=head, deadline_s=gpu_deadline_s)
        except BaseException:        # no GPU, a kill: leave no half-written notebook sources behind
            for p in sources.values():
                p.unlink(missing_ok=True)
            raise
        parameters = {**gpu_profile.notebook_parameters(out / "gpu"), **(parameters or {})}
    results: list[NotebookResult] = []
    bar = tqdm(names, desc="notebooks", unit="nb", disable=not progress)
    for name in bar:
        bar.set_postfix_str(name)
        src = sources[name]
        dst = out / "notebooks" / f"{name}.ipynb"
        summ = out / "summary" / f"{name}.json"
        summ.unlink(missing_ok=True)
        before = {p.name: p.stat().st_mtime for p in fig_dir.glob("*.png")}
        params = {**PROFILES[profile], **(parameters or {}), "figures_dir": str(fig_dir),
                  "summary_path": str(summ)}
        params = {k: v for k, v in params.items() if k in declared[name]}  # each notebook gets what it declares
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
        results.append(NotebookResult(name, ok, dt, dst, summ if summ.exists() else None, err, figs))
        if not ok:
            tqdm.write(f"FAILED {name}: {err}")
    bar.close()

    # Rows of every notebook with a summary in out_dir: this run's, plus (when only some notebooks ran) those
    # an earlier run into the same out_dir left, so `--only` refreshes part of the table without losing the rest.
    ran = {r.name for r in results}
    kept = [out / "summary" / f"{n}.json" for n in NOTEBOOKS if n not in ran and (out / "summary" / f"{n}.json").exists()]
    table = read_summaries(sorted([r.summary for r in results if r.summary is not None] + kept))
    from .io import atomic_path, atomic_write

    with atomic_path(out / "summary.csv") as tmp:
        table.to_csv(tmp, index=False)
    head = f"Profile `{profile}`"
    if parameters:
        head += "; parameters " + ", ".join(
            f"`{k}` = " + (", ".join(Path(x).name for x in v) if k == "traces" and isinstance(v, (list, tuple))
                           else f"`{v}`")
            for k, v in parameters.items())
    import textwrap

    prefix = KEY_PREFIXES["published" if fig_dir == repo_root() / "figures" / "published" else "package"]
    md = ("# Reproduction summary\n\n" + "\n".join(textwrap.wrap(head + ".", MAX_LINE, break_on_hyphens=False))
          + "\n\n" + summary_markdown(table, prefix))
    failed = [r for r in results if not r.ok]
    if failed:
        md += "\n## Failed notebooks\n\n" + "".join(f"- `{r.name}`: {r.error}\n" for r in failed)
    with atomic_write(out / "summary.md") as f:
        f.write(md)
    committed = fig_dir in (repo_root() / "figures", repo_root() / "figures" / "published")
    # The committed table holds every notebook's rows: a partial run (`--only` into an out_dir that has no
    # summary of the others) would drop theirs, so it leaves SUMMARY.md, summary.csv and the README alone.
    missing = [n for n in NOTEBOOKS if n not in ran and not (out / "summary" / f"{n}.json").exists()]
    partial = committed and bool(missing)
    if not partial:     # a copy next to the figures, so figures/ carries the table that goes with them
        with atomic_write(fig_dir / "SUMMARY.md") as f:
            f.write(md)
        with atomic_path(fig_dir / "summary.csv") as tmp:
            table.to_csv(tmp, index=False)
    readme = update_readme_results() if committed and not partial else False
    fig_kind = "committed" if committed else "figures"
    written = [("committed", notebooks_dir() / f"{r.name}.ipynb") for r in results if r.ok and publish]
    written += [(fig_kind, fig_dir / f) for r in results for f in r.figures]
    written += [] if partial else [(fig_kind, fig_dir / f) for f in ("SUMMARY.md", "summary.csv")]
    written += [("committed", repo_root() / "README.md")] if readme else []
    table.attrs["kept"] = (f"{fig_dir / 'SUMMARY.md'}, summary.csv and the README's table left as they were: "
                           f"{', '.join(missing)} did not run and have no summary under {out / 'summary'} (run "
                           f"them once into --out {out}, or run every notebook)") if partial else ""
    written += [("out", p) for r in results for p in (r.output, out / "notebooks" / f"{r.name}.kernel.log", r.summary)
                if p is not None and Path(p).exists()]
    written += [("out", out / "summary.md"), ("out", out / "summary.csv")]
    table.attrs["written"] = [(k, str(p)) for k, p in written]
    return results, table


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
