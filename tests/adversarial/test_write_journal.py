"""The write journal (``<state>/writes``) is hostile input too (issue #21, point 7, a variant).

The next agent reads every entry there before it serves, to remove the temporary files a killed
agent's uploads left. A job runs as the agent's user, so it can plant entries: a FIFO (the read
blocked the next agent for good), a symlink to ``/dev/zero`` (the read filled its memory), or
make ``writes`` itself a symlink to an outside dir (the next agent unlinked every file there).
With a real ``local://`` agent and its keeper: the agent hands over, the journal is poisoned,
and the next agent must serve, leave the outside dir alone and name what it skipped in
``agent.log``.
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

import remote_exec as rx
from tests.agent.rawhttp import rpc

from ..conftest import wait_exit
from .conftest import Adversary
from .test_state_files import poison

pytestmark = pytest.mark.anyio


async def _handed_over(d: Path) -> str:
    """Run a job in a fresh agent at ``d``, then make that agent hand over (none runs after)."""
    async with rx.open_sandbox(f"local://?dir={d}") as sb:
        kept = await sb.run(["echo", "kept"])
        agent = sb.info.pid
    await anyio.to_thread.run_sync(rpc, d / "agent.sock", "server_handover")
    assert await anyio.to_thread.run_sync(wait_exit, agent, 30.0)
    return kept.job_id or ""


async def _served(d: Path, job_id: str) -> bool:
    with anyio.fail_after(60):  # the FIFO blocked the next agent for good; /dev/zero filled its memory
        async with rx.open_sandbox(f"local://?dir={d}") as sb:
            return (await sb.read_output(job_id)).data == b"kept\n"


async def test_planted_journal_entries_are_skipped(fresh_agent_dir: Path, adversary: Adversary) -> None:
    """A FIFO and a symlink to ``/dev/zero`` among the journal's entries."""
    d = fresh_agent_dir
    kept = await _handed_over(d)
    (d / "writes").mkdir(mode=0o700, exist_ok=True)
    fifo, zero = d / "writes" / "0123456789abcdef", d / "writes" / "fedcba9876543210"
    poison(fifo, "fifo")
    poison(zero, "/dev/zero")
    served = await _served(d, kept)
    log = (d / "agent.log").read_text(errors="replace")
    cases = [
        ("a write journal entry replaced by a FIFO", f"skipped {fifo}: not a regular file" in log),
        ("a write journal entry -> /dev/zero", f"skipped {zero}: a symlink" in log),
    ]
    for case, refused in cases:
        adversary.tried("state files", case, refused=refused and served)
    assert served
    assert all(refused for _, refused in cases), (cases, log[-2000:])


async def test_the_journal_dir_cannot_point_outside(
    fresh_agent_dir: Path, tmp_path: Path, adversary: Adversary
) -> None:
    """``writes`` replaced by a symlink to an outside dir: the next agent empties nothing there."""
    d = fresh_agent_dir
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "canary").write_text("keep me")
    kept = await _handed_over(d)
    poison(d / "writes", os.fspath(outside))
    served = await _served(d, kept)
    log = (d / "agent.log").read_text(errors="replace")
    refused = served and os.listdir(outside) == ["canary"] and f"skipped {d / 'writes'}: a symlink" in log
    adversary.tried("state files", "writes (the write journal) -> an outside dir", refused=refused)
    assert refused, (os.listdir(outside), log[-2000:])
    assert (d / "writes").is_dir() and not (d / "writes").is_symlink()  # a journal again
