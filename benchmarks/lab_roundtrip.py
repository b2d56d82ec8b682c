"""JupyterLab in a real headless browser: open a notebook's jupytext source, save it unrun, then run it and save it,
and check what changed on disk.

    python benchmarks/lab_roundtrip.py [--notebook 05_oracle_bound] [--chromium /usr/bin/chromium]

Needs JupyterLab (``pip install -e ".[lab]"``) and Chromium (Debian: ``apt-get install chromium``); exits 2 with a
message when either is missing. Works on a temporary copy of ``notebooks/`` (the repository's files are never
touched), with its own Jupyter config, data and runtime folders and a fresh browser profile. The browser drives
JupyterLab's own commands (``docmanager:open``, ``notebook:run-all-cells``, ``docmanager:save``) over the Chrome
DevTools protocol (``websocket-client``, a dependency of jupyter_server), so the save goes through the same
frontend and jupytext contents manager a user's does.

Checks, printed one per line with PASS / FAIL:
1. the ``.py`` opens as a notebook by default (the default viewer of ``.py`` is jupytext's "Jupytext Notebook");
2. opened and saved without running: the notebook is not marked modified, and the ``.py`` and ``.ipynb`` are
   byte-identical to before;
3. run every cell, then saved: the ``.py`` is byte-identical and the ``.ipynb`` differs only in outputs (sources,
   cell metadata, ids and notebook metadata unchanged).
Exit status 0 when all pass."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, timeout: float) -> str:
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # localhost: never a proxy
            return opener.open(url, timeout=5).read().decode()
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"no answer from {url} in {timeout:.0f} s")


class Page:
    """One browser tab over the DevTools protocol: evaluate JavaScript, awaiting promises."""

    def __init__(self, ws_url: str):
        import websocket

        self.ws = websocket.create_connection(ws_url, timeout=300, suppress_origin=True)
        self.n = 0

    def js(self, expr: str, timeout: float = 300):
        self.n += 1
        self.ws.settimeout(timeout)
        self.ws.send(json.dumps({"id": self.n, "method": "Runtime.evaluate",
                                 "params": {"expression": expr, "awaitPromise": True, "returnByValue": True}}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.n:
                res = msg.get("result", {})
                if "exceptionDetails" in res:
                    raise RuntimeError(f"JavaScript failed: {res['exceptionDetails'].get('exception', res)}")
                return res.get("result", {}).get("value")

    def wait(self, expr: str, timeout: float = 120, what: str = ""):
        t0 = time.time()
        while time.time() - t0 < timeout:
            try:
                if self.js(expr):
                    return
            except RuntimeError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"waited {timeout:.0f} s for {what or expr}")


def _diff(before: dict, paths) -> str:
    """The first lines of a unified diff of each changed file (the metadata of a notebook)."""
    import difflib

    out = []
    for p in paths:
        a, b = before[p].decode(), p.read_text()
        if p.suffix == ".ipynb":
            a, b = (json.dumps(json.loads(x)["metadata"], indent=1, sort_keys=True) for x in (a, b))
        d = list(difflib.unified_diff(a.splitlines(), b.splitlines(), str(p.name), str(p.name), n=0, lineterm=""))
        out += d[:24]
    return "\n".join("    " + line for line in out)


def _strip_outputs(nb: dict) -> dict:
    nb = json.loads(json.dumps(nb))
    for c in nb["cells"]:
        if c["cell_type"] == "code":
            c["outputs"], c["execution_count"] = [], None
    return nb


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--notebook", default="05_oracle_bound", help="notebook name (default 05_oracle_bound)")
    ap.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser") or "",
                    help="the Chromium binary (default: chromium on PATH)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds for the notebook to run (default 600)")
    args = ap.parse_args(argv)
    if not args.chromium or not Path(args.chromium).exists():
        print("error: Chromium not found (Debian: apt-get install chromium); pass --chromium PATH", file=sys.stderr)
        return 2
    try:
        import jupyterlab  # noqa: F401
        import websocket  # noqa: F401
    except ImportError as e:
        print(f"error: {e.name} is not installed (pip install -e \".[lab]\")", file=sys.stderr)
        return 2

    tmp = Path(tempfile.mkdtemp(prefix="spec-repro-lab-"))
    procs = []
    results = []
    try:
        work = tmp / "work"
        (work / "notebooks").mkdir(parents=True)
        shutil.copy(ROOT / "pyproject.toml", work / "pyproject.toml")   # [tool.jupytext]: the pairing settings
        for suffix in (".py", ".ipynb"):
            shutil.copy(ROOT / "notebooks" / f"{args.notebook}{suffix}", work / "notebooks")
        py, ipynb = work / "notebooks" / f"{args.notebook}.py", work / "notebooks" / f"{args.notebook}.ipynb"
        before = {p: p.read_bytes() for p in (py, ipynb)}
        env = {**os.environ, "SPEC_REPRO_ROOT": str(ROOT), "NO_PROXY": "127.0.0.1,localhost"}
        for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
            env[var] = str(tmp / var.lower())
        port, dport, token = _port(), _port(), "spec-repro-check"
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1",
             f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={work}",
             "--LabApp.expose_app_in_browser=True", f"--LabApp.app_settings_dir={ROOT / 'jupyter/lab/settings'}",
             *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])],
            env=env, cwd=work, stdout=open(tmp / "lab.log", "wb"),
            stderr=subprocess.STDOUT))
        _wait_http(f"http://127.0.0.1:{port}/api/status?token={token}", 90)
        procs.append(subprocess.Popen(
            [args.chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp / 'chromium-profile'}",
             f"--remote-debugging-port={dport}", f"http://127.0.0.1:{port}/lab?token={token}"],
            stdout=open(tmp / "chromium.log", "wb"), stderr=subprocess.STDOUT))
        _wait_http(f"http://127.0.0.1:{dport}/json/version", 60)
        tabs = json.loads(_wait_http(f"http://127.0.0.1:{dport}/json/list", 30))
        page = Page(next(t for t in tabs if t.get("type") == "page")["webSocketDebuggerUrl"])
        page.wait("!!(window.jupyterapp && window.jupyterapp.shell && document.querySelector('.jp-LabShell'))",
                  120, "JupyterLab to start")
        page.js("window.jupyterapp.restored")

        factory = page.js(f"window.jupyterapp.docRegistry.defaultWidgetFactory('{py.name}').name")
        results.append((factory == "Jupytext Notebook", f"a .py opens as a notebook by default (viewer: {factory})"))

        rel = f"notebooks/{py.name}"
        page.js(f"window.jupyterapp.commands.execute('docmanager:open', {{path: '{rel}'}})"
                ".then(w => {window._w = w; return w.context.ready}).then(() => true)")
        page.wait("window._w.sessionContext && window._w.sessionContext.session && "
                  "window._w.sessionContext.session.kernel && "
                  "window._w.sessionContext.session.kernel.status === 'idle'", 120, "the kernel")
        time.sleep(2)  # let the kernel's info reach the model
        dirty = page.js("window._w.context.model.dirty")
        results.append((dirty is False, f"opened unrun, not marked modified (dirty = {dirty})"))
        page.js("window._w.context.save().then(() => true)")
        time.sleep(1)
        same = all(p.read_bytes() == b for p, b in before.items())
        results.append((same, "opened and saved without running: .py and .ipynb byte-identical"
                        + ("" if same else "\n" + _diff(before, (py, ipynb)))))

        n_code = page.js("window._w.content.model.cells.length")
        page.js("window.jupyterapp.commands.execute('notebook:run-all-cells').then(() => true)", args.timeout)
        page.wait("window._w.sessionContext.session.kernel.status === 'idle' && "
                  "Array.from({length: window._w.content.model.cells.length}, (_, i) => "
                  "window._w.content.model.cells.get(i)).every(c => c.type !== 'code' || "
                  "c.executionCount !== null)", args.timeout, "every cell to run")
        page.js("window._w.context.save().then(() => true)")
        time.sleep(1)
        results.append((py.read_bytes() == before[py], "run and saved: the .py byte-identical"
                        + ("" if py.read_bytes() == before[py] else "\n" + _diff(before, (py,)))))
        old, new = json.loads(before[ipynb]), json.loads(ipynb.read_text())
        diff = [k for k in ("cells", "metadata", "nbformat", "nbformat_minor")
                if json.dumps(_strip_outputs(old)[k], sort_keys=True) != json.dumps(_strip_outputs(new)[k],
                                                                                        sort_keys=True)]
        results.append((not diff, f"run and saved: the .ipynb differs only in outputs ({n_code} cells; "
                                  f"{'differs also in ' + ', '.join(diff) if diff else 'sources, ids, metadata same'})"))
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        logs = {n: (tmp / n).read_text(errors="replace")[-2000:] for n in ("lab.log",) if (tmp / n).exists()}
        shutil.rmtree(tmp, ignore_errors=True)
    for ok, what in results:
        print(f"{'PASS' if ok else 'FAIL'} {what}")
    if not all(ok for ok, _ in results) and logs:
        print("--- lab.log (tail) ---\n" + logs["lab.log"])
    return 0 if results and all(ok for ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
