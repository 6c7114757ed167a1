"""Shared fixtures: a real agent per test session, reached over every kind of channel."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

import remote_exec as rx
from remote_exec.client.channel import PipeProcess

CHANNELS = ["socket", "stdio"]


def relay_pid(process: PipeProcess) -> int:
    """The pid of a ``local://`` stdio channel's relay (an asyncio subprocess there)."""
    return cast(asyncio.subprocess.Process, process).pid


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the client is built on aiohttp, which is asyncio-only


def agent_pid(state_dir: Path) -> int | None:
    """PID of the agent serving in ``state_dir`` (found by its socket), or None."""
    sock = state_dir / "agent.sock"
    if not sock.exists():
        return None
    with rx.connect(f"local://?dir={state_dir}") as sb:
        return sb.info.pid


def stop_agent(state_dir: Path) -> None:
    pid = agent_pid(state_dir)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)


@pytest.fixture(scope="session")
def agent_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A state dir whose agent is shared by the session's tests and stopped at the end."""
    d = tmp_path_factory.mktemp("agent") / "state"
    yield d
    stop_agent(d)


@pytest.fixture
def fresh_agent_dir(tmp_path: Path) -> Iterator[Path]:
    """A state dir for one test's own agent (for tests that kill or reconfigure it)."""
    d = tmp_path / "state"
    yield d
    with contextlib.suppress(rx.RemoteExecError):
        stop_agent(d)


@pytest.fixture(params=CHANNELS)
def url(request: pytest.FixtureRequest, agent_dir: Path) -> str:
    """The shared agent's URL, once per channel kind."""
    return f"local://?dir={agent_dir}&channel={request.param}"


def run_cli(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "remote_exec.cli", *args], capture_output=True, text=True, timeout=60, **kwargs
    )
