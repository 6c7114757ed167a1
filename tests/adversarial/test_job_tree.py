"""Issue #21, points 5 and 6: the job's whole tree is the job's, and a kill works at the limit.

Limits used to count a job's tree by session id, so a ``setsid`` child flooded memory or burnt
CPU past them with the job ending 0; a descendant that cleared its environment and was orphaned
outlived ``kill()`` and the timeout; and a fork bomb holding every pid of the box made ``kill()``
fail ("can't start new thread") or a timeout be told while the bomb lived on. Now one membership
(the job's cgroup, united with the keeper's attribution) serves stats, limits, kill and timeout,
and the kill path makes no thread.

Fork bombs and floods run only in a test-made cgroup with pids and memory limits set before the
agent joins it (see :mod:`.limited`); absences are read from the process table by pid and start
time once the end is told.
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest

import remote_exec as rx

from ..client.test_durable import procs_running, procs_with, wait_until
from ..conftest import agent_killed
from .agentproc import agent
from .conftest import Adversary
from .limited import ESCAPED, LimitedCgroup, agent_in, limited_cgroup, live, orphan_left_after, starts

pytestmark = pytest.mark.anyio

AREA = "job tree"
FLOOD_CAP = 512 << 20  # the test cgroup's memory limit: a flood never reaches the machine's


# Each limit case runs with a cgroup per job and with the attribution alone (``--no-cgroups``).
MEMBERSHIP = pytest.mark.parametrize("flags", [(), ("--no-cgroups",)], ids=["cgroup", "attribution"])


@MEMBERSHIP
async def test_a_setsid_memory_flood_is_killed_by_the_memory_limit(
    tmp_path: Path, adversary: Adversary, flags: tuple[str, ...]
) -> None:
    flood = "b = b'x' * (310 << 20); print('flooded', flush=True); import time; time.sleep(20)"
    command = f'setsid {sys.executable} -c "{flood}" & wait'
    state = tmp_path / "state"
    with limited_cgroup(pids_max=256, memory_max=FLOOD_CAP) as group, agent_in(group, state, *flags):
        async with rx.open_sandbox(f"local://?dir={state}") as sb:
            proc = sb.exec_remote(["sh", "-c", command], policy=rx.JobPolicy(memory_limit=64 << 20))
            with anyio.fail_after(60):
                result = await proc.wait()
    held = result.state == "killed" and (result.reason or "").startswith("killed: memory limit 64.0 MiB")
    adversary.tried(AREA, f"setsid child floods 310 MiB against a 64 MiB memory_limit {flags}", refused=held)
    assert held, result


@MEMBERSHIP
async def test_a_setsid_cpu_burner_is_killed_by_the_cpu_limit(
    tmp_path: Path, adversary: Adversary, flags: tuple[str, ...]
) -> None:
    burn = "import time; t = time.time()\nwhile time.time() - t < 12: pass"
    command = f"setsid {sys.executable} -c '{burn}' & wait"
    with agent(tmp_path / "state", *flags):
        async with rx.open_sandbox(f"local://?dir={tmp_path / 'state'}") as sb:
            proc = sb.exec_remote(["sh", "-c", command], policy=rx.JobPolicy(cpu_time=2.0))
            with anyio.fail_after(60):
                result = await proc.wait()
    held = result.state == "killed" and (result.reason or "").startswith("killed: CPU time limit 2 s exceeded")
    adversary.tried(AREA, f"setsid child burns 12 s of CPU against a 2 s cpu_time {flags}", refused=held)
    assert held, result


@pytest.mark.parametrize("how", ["kill", "timeout"])
async def test_an_env_cleared_orphan_ends_with_its_job(agent_dir: Path, adversary: Adversary, how: str) -> None:
    t = 47110 if how == "kill" else 47111
    async with rx.open_sandbox(f"local://?dir={agent_dir}") as sb:
        left = await orphan_left_after(sb, t, how)
    adversary.tried(AREA, f"env-cleared setsid orphan outlives {how}", refused=not left)
    assert not left


async def test_a_readopted_job_loses_its_orphan_to_kill(fresh_agent_dir: Path, adversary: Adversary) -> None:
    """The agent is SIGKILLed after the orphan escaped: the next one re-adopts the job, finds its
    cgroup again, and ``kill()`` ends the orphan (no marker, session or parent names it)."""
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}", response_margin=1.0) as sb:
        proc = sb.exec_remote(["sh", "-c", ESCAPED.format(t=47140)], kill_grace=0.5)
        assert await anext(aiter(proc)) == rx.StdoutChunk("ready\n")
        escaped = starts(await wait_until("the orphan is up", lambda: procs_running("sleep", "47140")))
        await agent_killed(sb)
        with anyio.fail_after(60):
            await proc.kill()
    left = [pid for pid, start in escaped.items() if live(pid, start)]
    adversary.tried(AREA, "env-cleared setsid orphan of a re-adopted job outlives kill", refused=not left)
    assert not left


async def test_stats_count_the_processes_that_left_the_session(agent_dir: Path, adversary: Adversary) -> None:
    command = "for n in 1 2 3; do env -i setsid sleep 4715$n & done; echo ready; wait"
    async with rx.open_sandbox(f"local://?dir={agent_dir}") as sb:
        proc = sb.exec_remote(["sh", "-c", command])
        assert await anext(aiter(proc)) == rx.StdoutChunk("ready\n")
        # Each sleeper exec'd into sleep itself (a forked copy of the shell has its command line
        # too, and one in env's or setsid's exec has none for a moment).
        await wait_until("the sleepers are up", lambda: all(procs_running("sleep", f"4715{n}") for n in (1, 2, 3)))
        stats = await proc.stats(window=0.05)
        await proc.kill()
    adversary.tried(AREA, "3 env-cleared setsid children hidden from stats()", refused=stats.processes == 4)
    assert stats.processes == 4, stats  # the shell and its three sleepers


async def _bomb(group: LimitedCgroup, sb: rx.AsyncSandbox, timeout: float | None) -> rx.ExecRemoteProcess:
    """A fork bomb (each copy forks copies forever, some clearing their environment and leaving
    the session) that takes every pid the test cgroup has left."""
    limit = group.pids_current() + 48
    group.set_pids_max(limit)  # the limit first, then the bomb
    # The leader only waits (it forks nothing): bash gives up on a fork refused for a while, or
    # at once when a SIGCHLD cuts its retry sleep short, and a leader that exits so would end
    # the job before its timeout (a "completed" job whose leftovers are ended, not a timeout).
    copy = "b & env -i setsid sh -c 'while :; do sleep 1; done' & sleep 0.02"
    bomb = f"b(){{ while :; do {copy}; done; }}; b & echo go; exec sleep 300"
    proc = sb.exec_remote(["bash", "-c", bomb], kill_grace=0.2, timeout=timeout)
    assert await anext(aiter(proc)) == rx.StdoutChunk("go\n")
    await wait_until("the bomb holds every pid", lambda: group.pids_current() >= limit - 2, 60)
    return proc


@pytest.mark.parametrize("how", ["kill", "timeout"])
async def test_a_fork_bomb_at_the_pids_limit_is_ended(tmp_path: Path, adversary: Adversary, how: str) -> None:
    state = tmp_path / "state"
    with limited_cgroup(pids_max=256, memory_max=FLOOD_CAP) as group, agent_in(group, state) as agent_pid:
        async with rx.open_sandbox(f"local://?dir={state}") as sb:
            own = group.procs()  # the keeper and the agent
            proc = await _bomb(group, sb, 8.0 if how == "timeout" else None)
            error: BaseException | None = None
            with anyio.fail_after(90):
                try:
                    if how == "kill":
                        await proc.kill()
                    else:
                        with pytest.raises(rx.ExecTimeoutError):
                            await proc.wait()
                except rx.RemoteExecError as exc:
                    error = exc
            left = group.procs() - own  # read right after the end was told
            adversary.agent_peak(agent_pid)
            jobs = {j.job_id: j.state for j in await sb.jobs()}
    ended = error is None and not left and jobs[proc.job_id or ""] in ("killed", "timed_out")
    adversary.tried(AREA, f"fork bomb at the pids limit, ended by {how}", refused=ended)
    assert error is None, error
    assert not left, f"{len(left)} bomb processes still there after the end was told"


async def test_without_cgroups_an_orphan_seen_once_stays_the_jobs(tmp_path: Path, adversary: Adversary) -> None:
    """No cgroup (``--no-cgroups``: the attribution alone). A child that cleared its environment
    and left the session is seen under its parent by one look (a ``stats()``); its parent then
    exits, orphaning it to the keeper. The ledger (pid and start time) keeps it the job's."""
    state, gate = tmp_path / "state", tmp_path / "gate"
    escaped = f"env -i setsid sh -c 'sleep 47120 & while [ ! -e {gate} ]; do sleep 0.05; done' & echo ready; wait"
    with agent(state, "--no-cgroups"):
        async with rx.open_sandbox(f"local://?dir={state}") as sb:
            proc = sb.exec_remote(["sh", "-c", escaped], kill_grace=0.5)
            assert await anext(aiter(proc)) == rx.StdoutChunk("ready\n")
            sleeper = starts(await wait_until("the child is up", lambda: procs_running("sleep", "47120")))
            assert (await proc.stats(window=0.05)).processes >= 3  # seen: the leader, sh, sleep
            gate.touch()  # its parent exits: the sleep is the keeper's now
            await wait_until("orphaned", lambda: not procs_with(str(gate)))
            with anyio.fail_after(60):
                await proc.kill()
    left = [pid for pid, start in sleeper.items() if live(pid, start)]
    adversary.tried(AREA, "no cgroup: env-cleared setsid child, seen, then orphaned, outlives kill", refused=not left)
    assert not left


@pytest.mark.parametrize("how", ["next", "parent"])
async def test_a_frozen_cgroup_made_ahead_takes_the_job_not_the_agent(
    fresh_agent_dir: Path, adversary: Adversary, how: str
) -> None:
    """A job (as the agent's user) makes the next job's freezer cgroup ahead of it, frozen, or
    freezes the jobs' parent (a child is born frozen there). The agent's thread spawns a leader
    from inside a job's cgroups only when its start made them and they are thawed: here the
    next job's own leader joins the frozen cgroup and waits there, the agent goes on answering
    (its thread inside would have been frozen, and every job with it), and the job runs on once
    thawed. (Planted from the test, as root: what a job running as root can do.)"""
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}") as sb:
        first = await sb.run(["cat", "/proc/self/cgroup"])
        assert isinstance(first.stdout, str)
        lines = [line for line in first.stdout.splitlines() if line.split(":")[1:2] == ["freezer"]]
        if not lines or "/remote-exec-" not in lines[0]:
            pytest.skip("no v1 freezer cgroup per job here")
        parent, _, mark = lines[0].split(":", 2)[2].rpartition("/")
        prefix, _, n = mark.rpartition("-")
        parent_dir = Path("/sys/fs/cgroup/freezer" + parent)
        frozen = parent_dir / f"{prefix}-{int(n) + 1}" if how == "next" else parent_dir  # the next start's
        if how == "next":
            frozen.mkdir()  # cgroupfs: never blocks
        answered, inside = False, ""
        try:
            (frozen / "freezer.state").write_text("FROZEN")
            proc = sb.exec_remote(["cat", "/proc/self/cgroup"])
            await proc.started()
            with anyio.move_on_after(20):
                await sb.server_info()
                answered = True
            inside = (parent_dir / f"{prefix}-{int(n) + 1}" / "cgroup.procs").read_text()  # the leader, held
        finally:
            (frozen / "freezer.state").write_text("THAWED")
        with anyio.fail_after(30):
            result = await proc.wait()
    adversary.tried(AREA, f"a frozen freezer cgroup made ahead ({how})", refused=answered)
    assert answered, "the agent froze"
    assert inside.split(), "the next job's leader was not in the frozen cgroup: the test planted nothing"
    assert result.returncode == 0 and f"freezer:{parent}/{prefix}-{int(n) + 1}\n" in str(result.stdout), result
