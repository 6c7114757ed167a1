"""``<state>/shells`` is a job's to replace too (issue #21, point 7, a variant of the trash case).

The next agent looks through every entry of ``shells`` to re-adopt the sessions an earlier agent
left, and removes each entry it cannot re-adopt. A job (the agent's user) replaced ``shells`` by
a symlink to an outside dir, and the next agent emptied that dir (every file there "a session it
cannot describe"); an entry of ``shells`` that is a symlink to an outside dir must not make the
agent delete what is behind it either. With a real ``local://`` agent and its keeper.
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


def _outside(at: Path) -> Path:
    at.mkdir()
    (at / "canary").write_text("keep me")
    (at / "sub").mkdir()
    (at / "sub" / "canary").write_text("keep me too")
    return at


def _intact(at: Path) -> bool:
    return sorted(os.listdir(at)) == ["canary", "sub"] and os.listdir(at / "sub") == ["canary"]


async def test_the_shells_dir_cannot_point_outside(fresh_agent_dir: Path, tmp_path: Path, adversary: Adversary) -> None:
    """``shells`` replaced by a symlink to an outside dir, then (next start) one entry of it."""
    d, url = fresh_agent_dir, f"local://?dir={fresh_agent_dir}"
    whole, entry = _outside(tmp_path / "whole"), _outside(tmp_path / "entry")
    async with rx.open_sandbox(url) as sb:
        sh = await sb.shell()
        assert (await sh.run("echo hi")).stdout == "hi\n"
        kept = await sb.run(["echo", "kept"])

    async def next_agent() -> bool:
        async with rx.open_sandbox(url) as sb:
            agent = sb.info.pid
            served = (await sb.read_output(kept.job_id or "")).data == b"kept\n"
        await anyio.to_thread.run_sync(rpc, d / "agent.sock", "server_handover")
        assert await anyio.to_thread.run_sync(wait_exit, agent, 30.0)
        return served

    with anyio.fail_after(120):
        assert await next_agent()  # the first agent gone: no agent runs now
        poison(d / "shells", os.fspath(whole))
        served = await next_agent()
        log = (d / "agent.log").read_text(errors="replace")
        whole_refused = served and _intact(whole) and f"skipped {d / 'shells'}: a symlink" in log
        poison(d / "shells" / "rx-evil", os.fspath(entry))
        served = await next_agent()
        entry_refused = served and _intact(entry) and not (d / "shells" / "rx-evil").exists()
    adversary.tried("state files", "shells -> an outside dir", refused=whole_refused)
    adversary.tried("state files", "an entry of shells -> an outside dir", refused=entry_refused)
    assert whole_refused, (os.listdir(whole), log[-2000:])
    assert entry_refused, os.listdir(entry)


async def test_a_jobs_dir_swapped_for_a_symlink_does_not_stop_the_agent_for_good(
    fresh_agent_dir: Path, tmp_path: Path, adversary: Adversary
) -> None:
    """A job moves ``jobs`` away and puts a symlink to an outside dir there (or a file): every
    next agent refused to start ("a symlink"), for good. Now it is replaced by an empty dir."""
    d, url = fresh_agent_dir, f"local://?dir={fresh_agent_dir}"
    outside = _outside(tmp_path / "outside")
    async with rx.open_sandbox(url) as sb:
        await sb.run(["sh", "-c", f"mv {d}/jobs {d}/jobs.moved && ln -s {outside} {d}/jobs"])
        agent = sb.info.pid
    await anyio.to_thread.run_sync(rpc, d / "agent.sock", "server_handover")
    assert await anyio.to_thread.run_sync(wait_exit, agent, 30.0)
    with anyio.fail_after(60):
        try:
            async with rx.open_sandbox(url) as sb:
                served = (await sb.run(["echo", "served"])).stdout == "served\n"
        except rx.AgentUnavailableError as exc:
            served, why = False, str(exc)
        else:
            why = ""
    log = (d / "agent.log").read_text(errors="replace")
    refused = served and _intact(outside) and f"skipped {d / 'jobs'}: a symlink" in log
    adversary.tried("state files", "jobs -> an outside dir (the next agent never started)", refused=refused)
    assert refused, (why[-500:], os.listdir(outside), log[-1500:])
    assert (d / "jobs").is_dir() and not (d / "jobs").is_symlink()
