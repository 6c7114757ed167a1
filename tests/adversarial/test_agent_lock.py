"""``agent.lock`` and ``agent.log`` are a job's to replace too (issue #21, point 7, a variant).

Every client that finds no agent serving takes ``agent.lock`` and writes to ``agent.log`` before it
starts one (``ensure``). A job (the agent's user) replaced ``agent.lock`` by a FIFO: the client's
``open`` blocked for good (a notebook kernel hung, uninterruptibly); by a symlink: every client
was refused ("planted there?") until the user removed it. In the agent's own private state dir
only the agent's user can have put them there, so they are replaced. Another user's plant in a
dir that was left open is still refused (``test_local_takeover.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

import remote_exec as rx
from tests.agent.rawhttp import rpc

from ..conftest import wait_exit
from .conftest import Adversary
from .test_state_files import poison

pytestmark = pytest.mark.anyio


def _client_run(url: str) -> tuple[bool, str]:
    """A client in its own process (a blocked ``open`` cannot be cancelled): ``echo served``."""
    argv = [sys.executable, "-m", "remote_exec.cli", "-s", url, "run", "--", "echo", "served"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()})
    except subprocess.TimeoutExpired:
        return False, "the client blocked for 60 s"
    return done.stdout == b"served\n", done.stderr.decode(errors="replace")[-500:]


@pytest.mark.parametrize(("name", "how"), [("agent.lock", "fifo"), ("agent.lock", "/dev/null"), ("agent.log", "fifo")])
async def test_a_planted_lock_or_log_is_replaced(
    fresh_agent_dir: Path, name: str, how: str, adversary: Adversary
) -> None:
    d, url = fresh_agent_dir, f"local://?dir={fresh_agent_dir}"
    async with rx.open_sandbox(url) as sb:
        agent = sb.info.pid
    await anyio.to_thread.run_sync(rpc, d / "agent.sock", "server_handover")
    assert await anyio.to_thread.run_sync(wait_exit, agent, 30.0)
    poison(d / name, how)
    served, why = await anyio.to_thread.run_sync(_client_run, url)
    replaced = (d / name).is_file() and not (d / name).is_symlink()
    what = "a FIFO" if how == "fifo" else "a symlink"
    adversary.tried("state files", f"{name} replaced by {what} (ensure)", refused=served and replaced)
    assert served and replaced, why


@pytest.mark.parametrize("how", ["fifo", "/dev/zero"])
def test_a_failed_starts_log_tail_reads_only_a_regular_file(tmp_path: Path, how: str, adversary: Adversary) -> None:
    """A failed start quotes ``agent.log``'s tail: it read the whole file, so a job's symlink to
    ``/dev/zero`` filled the client's memory and a FIFO blocked it."""
    from remote_exec.agent.statedir import _log_tail

    log = tmp_path / "agent.log"
    poison(log, how)
    tail = _log_tail(log)  # returns at once, without reading the device
    refused = len(tail) < 200 and "no log" in tail
    adversary.tried("state files", f"agent.log -> {how} in a failed start's message", refused=refused)
    assert refused, tail[:200]
    log.unlink()
    log.write_bytes(b"x" * 5000 + b"the end\n")
    assert _log_tail(log).endswith("the end\n") and len(_log_tail(log)) == 2000
