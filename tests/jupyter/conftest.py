"""Fixtures for the notebook face: the shared real agent, an IPython shell with the magics, and
a headless front end that records what widgets send; and for the browser tests, JupyterLab and
Chromium (``lab``, ``browser``, ``page``; the server is in ``labserver.py``, the helpers that
drive a page in ``lab_page.py``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

import remote_exec as rx
from remote_exec.agent.jobs.proctable import group_members
from remote_exec.jupyter import terminal_view
from remote_exec.jupyter.headless import HeadlessFrontEnd

from ..conftest import wait_for as wait_for  # re-exported: the jupyter tests import it from here
from .lab_page import BROWSER_ARGS, CHROMIUM, unavailable
from .labserver import LabServer, running_lab


@pytest.fixture
def jurl(agent_dir: Path) -> str:
    """The shared agent (see tests/conftest.py) as the notebook face reaches it."""
    return f"local://?dir={agent_dir}"


@pytest.fixture
def sb(jurl: str) -> Iterator[rx.Sandbox]:
    with rx.connect(jurl) as sandbox:
        yield sandbox


@pytest.fixture
def front() -> Iterator[HeadlessFrontEnd]:
    with HeadlessFrontEnd() as fe:
        yield fe


@pytest.fixture(autouse=True)
def interactive(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Behave as under a widget front end (an InteractiveShell alone has no kernel), as a kernel
    that just started for a user who never measured a terminal (see start_cols): a runtime dir
    of the test's own."""
    monkeypatch.setenv("REMOTE_EXEC_NONINTERACTIVE", "0")
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "jupyter-runtime"))
    monkeypatch.setattr(terminal_view, "_measured", {"cols": None})


@pytest.fixture
def plain(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain-text mode, as under nbval or a terminal."""
    monkeypatch.setenv("REMOTE_EXEC_NONINTERACTIVE", "1")


@pytest.fixture(scope="session")
def ipython_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ipython")


@pytest.fixture
def ip(jurl: str, ipython_dir: Path) -> Iterator[InteractiveShell]:
    """An IPython shell with ``%load_ext remote_exec`` done and the test agent as default."""
    config = Config()
    config.HistoryManager.hist_file = ":memory:"  # leave the user's ~/.ipython alone
    shell = InteractiveShell.instance(config=config, ipython_dir=str(ipython_dir))
    shell.run_line_magic("load_ext", "remote_exec")
    shell.run_line_magic("exec_remote_config", f"--reset --sandbox {jurl}")
    before = set(shell.user_ns)
    yield shell
    shell.run_line_magic("unload_ext", "remote_exec")
    for name in set(shell.user_ns) - before:
        del shell.user_ns[name]


def gone(pid: int | None, timeout: float = 10.0) -> bool:
    """True once no process is left in the group ``pid`` leads (the local sandbox shares our PIDs)."""
    assert pid is not None
    deadline = time.monotonic() + timeout
    while group_members(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# -- the browser tests: JupyterLab (one server per worker) + Chromium (one per test module) -------


def require_browser() -> None:
    """Skip (fail, with the backends required) where the browser tests cannot run."""
    if not CHROMIUM.exists():
        unavailable(f"{CHROMIUM} is missing (run .ci/setup-browser.sh)")
    try:
        import jupyterlab  # noqa: F401
        import playwright  # noqa: F401
    except ImportError as exc:
        unavailable(f"{exc.name} is not installed (pip install -e '.[test]')")


@pytest.fixture(scope="session")
def lab_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """JupyterLab (see ``labserver.py``), one per worker: the browser modules it runs share it."""
    require_browser()
    with running_lab(tmp_path_factory.mktemp("lab")) as server:
        yield server


@pytest.fixture(scope="module")
def lab(lab_server: LabServer, request: pytest.FixtureRequest) -> Iterator[tuple[str, Path]]:
    """This module's JupyterLab: a URL template (``{workspace}``, ``{name}``) and its notebook
    folder, of its own in the worker's server; its kernels and terminals end with the module."""
    with lab_server.folder(request.module.__name__.rsplit(".", 1)[-1]) as folder:
        yield folder


@pytest.fixture(scope="module")
def browser(lab: tuple[str, Path]) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=BROWSER_ARGS)
        yield b
        b.close()


def new_page(browser: Any, width: int = 1400, height: int = 1000) -> Any:
    """A page in a fresh browser context (close it with ``page.context.close()``), its console
    kept for a failure's report (lab_page.failure_shot writes it out)."""
    context = browser.new_context(viewport={"width": width, "height": height})
    pg = context.new_page()
    pg.set_default_timeout(60_000)
    pg.rx_console = []
    pg.on("console", lambda msg: pg.rx_console.append(f"{msg.type}: {msg.text}"[:2000]))
    pg.on("pageerror", lambda err: pg.rx_console.append(f"pageerror: {err}"[:2000]))
    return pg


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser context per test: its own JupyterLab page, one notebook in it."""
    pg = new_page(browser)
    yield pg
    pg.context.close()
