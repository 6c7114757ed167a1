"""What the browser tests share: where JupyterLab and Chromium are, and how a test drives a
notebook in the page (open it, run a cell, wait for it or the kernel, take screenshots).

The fixtures that start them (``lab``, ``browser``, ``page``) are in ``conftest.py``.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest

from ..conftest import wait_for

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
LABEXTENSION = Path(__file__).resolve().parents[2] / "labextension" / "built"
CELLS = ".jp-NotebookPanel:visible .jp-Notebook .jp-Cell"  # of the notebook on screen
BASE_URL = "/user/rx-test/"  # the kernel must find it: forwarded ports go through <base>proxy/<port>/
BROWSER_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def unavailable(reason: str) -> None:
    if os.environ.get("REMOTE_EXEC_REQUIRE_BACKENDS") == "1":
        pytest.fail(f"browser test required but cannot run: {reason}")
    pytest.skip(reason)


def serving_jupyter(server: subprocess.Popen[bytes], runtime: Path, token: str, log: Path, path: str = "/") -> str:
    """The base URL of a Jupyter server started with ``--ServerApp.port=0`` and
    ``JUPYTER_RUNTIME_DIR=runtime``, once it answers its status with its token.

    The port is the one the server bound, read from its ``jpserver-<pid>.json``: a port picked
    here and handed to it was free only until another test's process took it in the seconds the
    server took to import (a CI run's lab got a stranger's bytes back: ``BadStatusLine``).

    :raises AssertionError: the server exited, or did not answer within 90 s (its log's tail).
    """
    info = runtime / f"jpserver-{server.pid}.json"
    deadline = time.monotonic() + 90
    base = None
    while True:
        try:
            if base is None:
                port = json.loads(info.read_text())["port"]
                base = f"http://127.0.0.1:{int(port)}{path.rstrip('/')}"
            with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as r:
                json.load(r)
            return base
        except (OSError, ValueError, KeyError, http.client.HTTPException):
            if server.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("Jupyter did not start: " + log.read_text()[-3000:]) from None
            time.sleep(0.3)


def shot(page: Any, name: str, cell: Any = None) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    if cell is not None:
        cell.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def run_cell(page: Any, index: int) -> Any:
    """Click into cell ``index``, run it with Shift+Enter; return the cell's locator."""
    cell = page.locator(CELLS).nth(index)
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")
    return cell


def run_first_cell(page: Any) -> None:
    """Run cell 0 (the set-up) and wait for ``[1]``; press again if the first press was lost.

    A run requested while the page is still connecting to the new kernel can vanish; the
    set-up cell is idempotent, so asking again is safe.
    """
    for attempt in range(3):
        cell = run_cell(page, 0)
        try:
            cell.locator(".jp-InputPrompt", has_text=re.compile(r"\[[1-9*]")).wait_for(timeout=15_000)
            break
        except Exception:
            if attempt == 2:
                raise
    wait_done(cell)


def wait_done(cell: Any) -> None:
    """Wait until the cell shows ``[N]:`` (it has finished running)."""
    cell.locator(".jp-InputPrompt", has_text=re.compile(r"\[\d+\]")).wait_for()


@contextlib.contextmanager
def failure_shot(page: Any, name: str) -> Iterator[None]:
    """On failure, keep what the page looked like (PNG and HTML) next to the other screenshots."""
    try:
        yield
    except BaseException:
        shot(page, f"{name}-failure")
        (ARTIFACTS / f"{name}-failure.html").write_text(page.content())
        console = getattr(page, "rx_console", None)
        if console is not None:
            (ARTIFACTS / f"{name}-failure-console.txt").write_text("\n".join(console[-500:]))
        raise


def open_notebook(page: Any, lab: tuple[str, Path], name: str, cells: list[str]) -> None:
    url, notebooks = lab
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nbformat.write(nb, notebooks / name)
    page.goto(url.format(workspace=Path(name).stem, name=name))
    page.locator(CELLS).first.wait_for()
    kernel_idle(page)


def setup_cell(agent_dir: Path) -> str:
    """The first cell of these tests' notebooks: the extension and a ``local://`` sandbox."""
    return f"%load_ext remote_exec\n%exec_remote_config --sandbox local://?dir={agent_dir}"


def open_and_run(page: Any, lab: tuple[str, Path], name: str, cells: list[str]) -> Any:
    """Open a notebook of ``cells`` (the first a :func:`setup_cell`), run the set-up and cell 1;
    return cell 1's locator once it has run."""
    open_notebook(page, lab, name, cells)
    run_first_cell(page)
    cell = run_cell(page, 1)
    wait_done(cell)
    return cell


def kernel_idle(page: Any) -> None:
    """Wait until the status bar says the notebook's kernel is up and idle.

    The toolbar's indicator says "idle" before a kernel exists; the status bar names the kernel.
    """
    page.locator(".jp-StatusBar-TextItem", has_text="(ipykernel) | Idle").wait_for(timeout=90_000)


def restart_kernel(page: Any) -> None:
    """Restart the notebook's kernel from the toolbar and wait until the new one is idle."""
    page.locator("jp-button[data-command='notebook:restart-kernel']").first.click()
    page.locator(".jp-Dialog button", has_text="Restart").click()
    kernel_idle(page)


def save_until(page: Any, path: Path, fresh: Callable[[], bool], timeout: float = 60.0) -> None:
    """Save the notebook (Ctrl+S) until ``fresh()`` holds for the file: a view's record is
    rewritten by the kernel some time after the view itself shows the output, and a save stores
    the record the page holds at that moment, so one save may catch an older one."""
    deadline = time.monotonic() + timeout
    while True:
        page.locator(".jp-NotebookPanel:visible .jp-Notebook").click()
        page.keyboard.press("Control+s")
        try:
            wait_for(lambda: path.stat().st_size and fresh(), timeout=2, what="a fresh save")
            return
        except (AssertionError, KeyError, ValueError):  # not yet, or a file being written
            if time.monotonic() > deadline:
                raise AssertionError(f"no save of {path.name} was fresh within {timeout:.0f} s") from None
