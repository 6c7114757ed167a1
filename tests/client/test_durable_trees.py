"""Whole trees (#14), beyond test_durable.py: the grace-period child is proven to have been
started (its trap leaves a mark), and a job re-adopted after a SIGKILL of the agent (so its
processes are the keeper's, not the agent's) loses every descendant to ``kill()`` and to its
timeout; a finished job's leftovers that left its session or were orphaned go with ``kill()`` and with its
timeout (before and after a re-adoption), each after a SIGTERM and the job's grace.
The process table is read directly."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import anyio
import pytest

import remote_exec as rx

from ..conftest import agent_killed, job_dir
from .test_durable import procs_with, wait_until

pytestmark = pytest.mark.anyio

# An own-session child (setsid), a grandchild in a new session (Popen start_new_session), and on
# SIGTERM a child started during the grace period, which also leaves a mark in {mark}.
TREE = (
    "trap 'sleep {t}3 & echo trapped > {mark}' TERM; setsid sleep {t}1 & "
    + sys.executable
    + ' -c \'import subprocess; subprocess.Popen(["sleep", "{t}2"], start_new_session=True)\'; '
    "echo ready; while true; do sleep 0.05; done"
)


async def _started_tree(sb: rx.AsyncSandbox, t: int, mark: Path, timeout: float | None = None) -> rx.ExecRemoteProcess:
    proc = sb.exec_remote(["bash", "-c", TREE.format(t=t, mark=mark)], kill_grace=0.5, timeout=timeout)
    assert await anext(aiter(proc)) == rx.StdoutChunk("ready\n")
    await wait_until("both escaped", lambda: procs_with(f"sleep {t}1") and procs_with(f"sleep {t}2"))
    return proc


async def test_kill_ends_a_readopted_jobs_whole_tree(fresh_agent_dir: Path, tmp_path: Path) -> None:
    mark = tmp_path / "trapped"
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}", response_margin=1.0) as sb:
        proc = await _started_tree(sb, 4610, mark)
        await agent_killed(sb)
        assert [j.state for j in await sb.jobs() if j.job_id == proc.job_id] == ["running"]
        await proc.kill()
        assert procs_with("sleep 4610") == []
    assert mark.read_text() == "trapped\n"  # the grace-period child was started, and is gone too


async def test_timeout_ends_a_readopted_jobs_whole_tree(fresh_agent_dir: Path, tmp_path: Path) -> None:
    mark = tmp_path / "trapped"
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}", response_margin=1.0) as sb:
        proc = await _started_tree(sb, 4620, mark, timeout=4.0)
        await agent_killed(sb)  # the new agent re-arms the timeout from the job's start time
        with anyio.fail_after(30), pytest.raises(rx.ExecTimeoutError):
            await proc.wait()
        assert procs_with("sleep 4620") == []
    assert mark.read_text() == "trapped\n"


async def test_kill_ends_the_grace_child_it_provokes(agent_dir: Path, tmp_path: Path) -> None:
    mark = tmp_path / "trapped"
    async with rx.open_sandbox(f"local://?dir={agent_dir}") as sb:
        proc = await _started_tree(sb, 4630, mark)
        await proc.kill()
        assert procs_with("sleep 4630") == []
    assert mark.read_text() == "trapped\n"


async def test_kill_ends_a_finished_jobs_escaped_leftovers(agent_dir: Path) -> None:
    # Left behind by the leader: a subshell, an own-session sleep, a grandchild orphaned to the
    # keeper (its parent exits at once).
    leftovers = "(while :; do sleep 0.04640; done) & setsid sleep 46401 & (sleep 46402 &) ; echo started"
    async with rx.open_sandbox(f"local://?dir={agent_dir}") as sb:
        proc = sb.exec_remote(["bash", "-c", leftovers], kill_grace=0.5)
        assert (await proc.wait()).stdout == "started\n"  # the leader is gone, its children live
        await wait_until("leftovers up", lambda: procs_with("sleep 46401") and procs_with("sleep 46402"))
        await proc.kill()
        assert procs_with("sleep 4640") == [] and procs_with("sleep 0.04640") == []


# A leftover that ignores SIGTERM but notes it in {mark}, and one in its own session.
LEFTOVERS = "(trap 'echo termed > {mark}' TERM; while :; do sleep 0.0{t}; done) & setsid sleep {t}1 & echo started"


async def _finished_with_leftovers(
    sb: rx.AsyncSandbox, t: int, mark: Path, timeout: float | None = None
) -> rx.ExecRemoteProcess:
    proc = sb.exec_remote(["bash", "-c", LEFTOVERS.format(t=t, mark=mark)], kill_grace=1.0, timeout=timeout)
    res = await proc.wait()
    assert (res.stdout, res.returncode) == ("started\n", 0)  # completed: the leader is gone, not timed out
    await wait_until("leftovers up", lambda: procs_with(f"sleep 0.0{t}") and procs_with(f"sleep {t}1"))
    return proc


async def test_a_finished_jobs_leftovers_get_sigterm_and_grace(agent_dir: Path, tmp_path: Path) -> None:
    mark = tmp_path / "termed"
    async with rx.open_sandbox(f"local://?dir={agent_dir}") as sb:
        proc = await _finished_with_leftovers(sb, 4650, mark)
        await proc.kill()
        assert procs_with("sleep 4650") == [] and procs_with("sleep 0.04650") == []
    assert mark.read_text() == "termed\n"  # SIGTERM first (SIGKILL at once would leave no mark)


async def test_a_finished_jobs_leftovers_end_at_its_timeout(agent_dir: Path, tmp_path: Path) -> None:
    mark = tmp_path / "termed"
    async with rx.open_sandbox(f"local://?dir={agent_dir}") as sb:
        await _finished_with_leftovers(sb, 4660, mark, timeout=4.0)
        await wait_until("leftovers gone", lambda: not procs_with("sleep 4660") and not procs_with("sleep 0.04660"), 30)
    assert mark.read_text() == "termed\n"


async def test_a_readopted_finished_jobs_leftovers_end_at_its_timeout(fresh_agent_dir: Path, tmp_path: Path) -> None:
    mark = tmp_path / "termed"
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}", response_margin=1.0) as sb:
        # 12 s: the job, its end, an agent killed and the next one up must all come before the
        # deadline, whatever the machine's load (6 s was passed on a loaded one).
        proc = await _finished_with_leftovers(sb, 4670, mark, timeout=12.0)
        await agent_killed(sb)  # the next agent finds the job completed and re-arms its timeout
        assert procs_with("sleep 46701")  # the deadline is still ahead
        await wait_until("leftovers gone", lambda: not procs_with("sleep 4670") and not procs_with("sleep 0.04670"), 30)
        assert [j.state for j in await sb.jobs() if j.job_id == proc.job_id] == ["completed"]
    assert mark.read_text() == "termed\n"
    meta = (job_dir(fresh_agent_dir, proc.job_id or "") / "job.json").read_text()
    assert '"tree_ended": true' in meta  # a third agent does not scan for them again


# The leader dies at SIGTERM at once; its child answers SIGTERM by living on for 1 s first.
LINGERING_CHILD = "sh -c 'trap \"sleep 1.{t}; exit 0\" TERM; echo ready; while :; do sleep 0.05; done' & wait"


@pytest.mark.parametrize("how", ["kill", "timeout"])
async def test_the_end_is_told_once_the_tree_is_gone(agent_dir: Path, how: str) -> None:
    """A kill or a timeout is told (``kill()`` returns, the result says so) only after every
    process of the job is gone, not when its leader is: a client that then looks finds none."""
    t = 4620 if how == "kill" else 4621
    timeout = 2.0 if how == "timeout" else None
    async with rx.open_sandbox(f"local://?dir={agent_dir}") as sb:
        proc = sb.exec_remote(["sh", "-c", LINGERING_CHILD.format(t=t)], kill_grace=10, timeout=timeout)
        assert await anext(aiter(proc)) == rx.StdoutChunk("ready\n")
        if how == "kill":
            await proc.kill()
        else:
            with pytest.raises(rx.ExecTimeoutError):
                await proc.wait()
        assert procs_with(f"sleep 1.{t}") == []  # without the hold: the lingering child, still there


async def test_an_agent_killed_while_a_kill_ends_the_tree_leaves_the_true_end(fresh_agent_dir: Path) -> None:
    """The leader is gone (reaped) and its end held while its lingering child is ended: an agent
    SIGKILLed then has already written that end down, and the next one reports "killed", not a
    "completed" with no exit code."""
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}", response_margin=1.0) as sb:
        proc = sb.exec_remote(["sh", "-c", LINGERING_CHILD.format(t=4630)], kill_grace=30)
        assert await anext(aiter(proc)) == rx.StdoutChunk("ready\n")
        leader = proc.pid

        async def kill() -> None:
            with contextlib.suppress(rx.RemoteExecError):
                await proc.kill()

        async with anyio.create_task_group() as tg:
            tg.start_soon(kill)
            await wait_until("the leader is reaped", lambda: not Path(f"/proc/{leader}").exists())
            await agent_killed(sb)  # the child lingers 1.46 s after its SIGTERM: the kill is under way
        assert [j.state for j in await sb.jobs() if j.job_id == proc.job_id] == ["killed"]
