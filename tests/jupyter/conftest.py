"""Fixtures for the notebook face: the shared real agent, an IPython shell with the magics, and
a headless front end that records what widgets send; and for the browser tests, JupyterLab and
Chromium (``lab``, ``browser``, ``page``; their helpers are in ``lab_page.py``)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
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
from .lab_page import BASE_URL, BROWSER_ARGS, CHROMIUM, LABEXTENSION, free_port, unavailable

ROOT = Path(__file__).resolve().parents[2]


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


# -- the browser tests: JupyterLab + Chromium (one server and browser per test module) ----------


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """JupyterLab on 127.0.0.1 under a base URL (as JupyterHub serves one: ``/user/<name>/``), with a
    token, a temp notebook dir and temp Jupyter dirs; jupyter-server-proxy is enabled in it."""
    if not CHROMIUM.exists():
        unavailable(f"{CHROMIUM} is missing (run .ci/setup-browser.sh)")
    try:
        import jupyterlab  # noqa: F401
        import playwright  # noqa: F401
    except ImportError as exc:
        unavailable(f"{exc.name} is not installed (pip install -e '.[test]')")
    root = tmp_path_factory.mktemp("lab")
    notebooks = root / "notebooks"
    notebooks.mkdir()
    # The checkout's prebuilt JupyterLab extension (labextension/built), found before any copy an
    # install left in the environment: what is tested is what is committed.
    ext = root / "jupyter" / "labextensions" / "remote-exec"
    ext.parent.mkdir(parents=True)
    ext.symlink_to(LABEXTENSION)
    port, token = free_port(), secrets.token_hex(16)
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(root / "config"),
        "JUPYTER_PATH": os.pathsep.join(p for p in (str(root / "jupyter"), os.environ.get("JUPYTER_PATH")) if p),
        "JUPYTER_RUNTIME_DIR": str(root / "runtime"),
        "IPYTHONDIR": str(root / "ipython"),
        "JUPYTERLAB_SETTINGS_DIR": str(root / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(root / "workspaces"),
    }
    env.pop("REMOTE_EXEC_NONINTERACTIVE", None)  # the kernel detects its front end itself
    # The checkout's server extensions that the venv's install may predate (what is tested is committed).
    server_config = root / "config" / "jupyter_server_config.d"
    server_config.mkdir(parents=True)
    for name in ("remote_exec_controls.json",):
        shutil.copy(ROOT / "jupyter-config" / "server-config" / name, server_config / name)
    news = root / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text('{"fetchNews": "false", "checkForUpdates": false}')  # no pop-up over the cells
    log = (root / "lab.log").open("wb")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--allow-root",
            "--LabApp.extension_manager=readonly",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}",
            f"--ServerApp.base_url={BASE_URL}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={notebooks}",
            "--LabApp.news_url=",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}{BASE_URL.rstrip('/')}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as r:
                    json.load(r)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        "JupyterLab did not start: " + (root / "lab.log").read_text()[-3000:]
                    ) from None
                time.sleep(0.3)
        # One workspace per notebook: a fresh page must not restore another test's open tabs.
        yield f"{base}/lab/workspaces/{{workspace}}/tree/{{name}}?token={token}", notebooks
    finally:
        server.terminate()
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


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
