"""Fixtures for the notebook face: the shared real agent, an IPython shell with the magics, and
a headless front end that records what widgets send."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

import remote_exec as rx
from remote_exec.agent.jobs.proctable import group_members
from remote_exec.jupyter.headless import HeadlessFrontEnd


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
def interactive(monkeypatch: pytest.MonkeyPatch) -> None:
    """Behave as under a widget front end (an InteractiveShell alone has no kernel)."""
    monkeypatch.setenv("REMOTE_EXEC_NONINTERACTIVE", "0")


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


def wait_for(predicate: Callable[[], object], timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def gone(pid: int | None, timeout: float = 10.0) -> bool:
    """True once no process is left in the group ``pid`` leads (the local sandbox shares our PIDs)."""
    assert pid is not None
    deadline = time.monotonic() + timeout
    while group_members(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
