"""A real agent of the tests' own, started with chosen limits, stopped (or killed) at the end."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from ..conftest import wait_exit

AGENT = [sys.executable, "-m", "remote_exec.agent"]


def start_agent(state_dir: Path, *args: str) -> int:
    """Start the agent in ``state_dir`` with ``args`` (``--max-shells 4``...); return its pid."""
    out = subprocess.run(
        [*AGENT, "ensure", "--dir", str(state_dir), *args], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    return int(json.loads(out)["result"]["pid"])


@contextlib.contextmanager
def agent(state_dir: Path, *args: str) -> Iterator[int]:
    """An agent for one test; SIGKILLed at the end if SIGTERM did not stop it (a failing test)."""
    pid = start_agent(state_dir, *args)
    try:
        yield pid
    finally:
        stop_agent(pid)


def stop_agent(pid: int) -> None:
    """SIGTERM agent ``pid``; SIGKILL it if it has not exited 10 s later (a failing test)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if not wait_exit(pid, 10):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        wait_exit(pid, 10)
