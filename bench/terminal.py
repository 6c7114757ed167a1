"""Keystroke-to-echo latency in the terminal widget, in a real browser (JupyterLab + Chromium).

A TerminalView on a PTY job (``cat``: the terminal's line discipline echoes each key) is put in
a notebook; each key is typed into xterm.js in the page (``term.input(key, true)``, what its
keyboard handler calls, the terminal focused) and timed there until the echo is in the terminal's buffer and until it
is drawn: browser -> Jupyter Server -> kernel -> agent -> PTY echo -> agent -> kernel -> browser.
Target: median <= 30 ms on a local sandbox.

Measured twice: with the server extension the wheel enables (``remote_exec.jupyter.nodelay``:
``TCP_NODELAY`` on kernel websockets) and without it (a stock Jupyter Server, whose Nagle delay
holds each echo for the browser's delayed ACK).

    python bench/terminal.py [--keys 200] [--out bench/results/terminal.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat

TARGET_MS = 30.0
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "terminal.json"
CHROMIUM = "/usr/bin/chromium"

# Type `n` keys one after the other, each timed until its echo moved the cursor (parsed into the
# buffer) and until the next frame drew it; Ctrl+U clears the line every 40 keys.
MEASURE = """async (n) => {
  const t = document.querySelector(".rx-term-screen").rxTerminal;
  const buf = () => t.buffer.active;
  const until = (pred) => new Promise((resolve) => {
    if (pred()) return resolve();
    const d = t.onWriteParsed(() => { if (pred()) { d.dispose(); resolve(); } });
  });
  const parsed = [], drawn = [];
  for (let i = 0; i < n; i++) {
    if (i % 40 === 0) { t.input("\\x15", true); await until(() => buf().cursorX === 0); }
    const x0 = buf().cursorX;
    const t0 = performance.now();
    t.input("abcdefghijklmnopqrstuvwxyz"[i % 26], true);
    await until(() => buf().cursorX === x0 + 1);
    parsed.push(performance.now() - t0);
    await new Promise((r) => requestAnimationFrame(() => r()));  // xterm draws in this frame
    drawn.push(performance.now() - t0);
  }
  return { parsed, drawn };
}"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def jupyterlab(root: Path, nodelay: bool = True) -> Iterator[str]:
    """JupyterLab on 127.0.0.1 with temp config dirs; yields the URL of ``bench.ipynb``."""
    port, token = free_port(), secrets.token_hex(16)
    (root / "config").mkdir(exist_ok=True)
    extensions = {"ServerApp": {"jpserver_extensions": {"remote_exec.jupyter.nodelay": nodelay}}}
    (root / "config" / "jupyter_server_config.json").write_text(json.dumps(extensions))
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(root / "config"), "JUPYTER_RUNTIME_DIR": str(root / "rt")}
    env["IPYTHONDIR"] = str(root / "ipython")
    env["JUPYTERLAB_SETTINGS_DIR"] = str(root / "settings")
    env["JUPYTERLAB_WORKSPACES_DIR"] = str(root / "workspaces")
    env.pop("REMOTE_EXEC_NONINTERACTIVE", None)
    args = [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ServerApp.ip=127.0.0.1"]
    args += [f"--ServerApp.port={port}", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}"]
    args += ["--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    with (root / "lab.log").open("wb") as log:
        server = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 90
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=2):
                        break
                except OSError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("JupyterLab did not start") from None
                    time.sleep(0.3)
            yield f"http://127.0.0.1:{port}/lab/workspaces/bench/tree/bench.ipynb?token={token}"
        finally:
            server.terminate()
            server.wait(15)


def typed_in_browser(root: Path, setup: str, last: str, nodelay: bool, keys: int, measure_js: str = MEASURE) -> Any:
    """Run ``setup`` (it shows a TerminalView of a ``cat`` job) in a notebook in JupyterLab in
    Chromium, type ``keys`` keys into the terminal with ``measure_js`` (after 20 to warm up),
    then run ``last`` (it ends the job and the agent); return what ``measure_js`` returned."""
    from playwright.sync_api import sync_playwright

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(setup), nbformat.v4.new_code_cell(last)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nbformat.write(nb, root / "bench.ipynb")
    with jupyterlab(root, nodelay) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(90_000)
        page.goto(url)
        page.locator(".jp-StatusBar-TextItem", has_text="(ipykernel) | Idle").wait_for()
        cells = page.locator(".jp-NotebookPanel:visible .jp-Notebook .jp-Cell")
        cells.nth(0).locator(".jp-InputArea-editor").click()
        page.keyboard.press("Shift+Enter")
        page.locator(".rx-term-screen .xterm-screen").wait_for()
        page.locator(".rx-badge", has_text="running").wait_for()
        page.locator(".rx-term-screen .xterm-screen").click()  # a view sends input while it has the focus
        page.evaluate(measure_js, 20)  # warm up: the first keys pay for connections and JIT
        result = page.evaluate(measure_js, keys)
        cells.nth(1).locator(".jp-InputArea-editor").click()
        page.keyboard.press("Shift+Enter")
        page.locator(".jp-NotebookPanel:visible .jp-Cell").nth(1).locator(".jp-InputPrompt", has_text="[2]").wait_for()
        browser.close()
    return result


def measure(keys: int, nodelay: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rx-bench-term-") as tmp:
        root = Path(tmp)
        setup = (
            "import remote_exec as rx\nfrom remote_exec.jupyter import TerminalView\n"
            f"sb = rx.connect('local://?dir={root}/agent')\n"
            "proc = sb.exec_remote(['cat'], tty=True)\nTerminalView(proc)"
        )
        last = "proc.kill(); pid = sb.info.pid; sb.close(); import os, signal; os.kill(pid, signal.SIGTERM)"
        result: dict[str, list[float]] = typed_in_browser(root, setup, last, nodelay, keys)
    return {name: summary(values) for name, values in result.items()}


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "n": len(values),
        "median_ms": statistics.median(ordered),
        "p90_ms": ordered[int(0.9 * (len(ordered) - 1))],
        "p99_ms": ordered[int(0.99 * (len(ordered) - 1))],
        "max_ms": ordered[-1],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=200, help="keystrokes timed (default 200)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    results = {
        "with TCP_NODELAY": measure(args.keys, nodelay=True),
        "stock server": measure(args.keys, nodelay=False),
    }
    for server, rows in results.items():
        for name, r in rows.items():
            print(
                f"{server:<17} echo {name:<7} n={r['n']:<4} median {r['median_ms']:6.1f} ms  "
                f"p90 {r['p90_ms']:6.1f} ms  p99 {r['p99_ms']:6.1f} ms  max {r['max_ms']:6.1f} ms"
            )
    passed = results["with TCP_NODELAY"]["drawn"]["median_ms"] <= TARGET_MS
    print(f"target: median keystroke-to-echo drawn <= {TARGET_MS:g} ms: {'met' if passed else 'MISSED'}")
    report = {
        "bench": "terminal",
        "target_ms": TARGET_MS,
        "passed": passed,
        "results": results,
        "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release()},
        "load_1min": os.getloadavg()[0],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
