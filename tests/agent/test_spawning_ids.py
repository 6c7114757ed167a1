"""Calls on a client-chosen job id whose start is still in flight (CI failure of stop 28: a job
wrote its output, the client read it by the id it chose, and the agent answered "no job" because
the spawn had not returned yet). The job's process runs before its start is through; a call on
its id waits for the start, then acts on the job."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from remote_exec.agent.jobs.controller import JobController
from remote_exec.agent.jobs.diskjob import DiskJob
from remote_exec.agent.jobs.spare import SpareDir
from remote_exec.errors import JobNotFoundError
from remote_exec.protocol import JobIdParams, KillParams, PollParams, ReadParams, SignalParams, StartParams

from .homes import jobs_in

pytestmark = pytest.mark.anyio

CALLS: dict[str, Callable[[JobController], Coroutine[Any, Any, object]]] = {
    "read": lambda jobs: jobs.read(ReadParams(job_id="mine", tail=16)),
    "poll": lambda jobs: jobs.poll(PollParams(job_id="mine")),
    "signal": lambda jobs: jobs.signal(SignalParams(job_id="mine", signal="CONT")),
    "kill": lambda jobs: jobs.kill(KillParams(job_id="mine")),
    "release": lambda jobs: jobs.release(JobIdParams(job_id="mine")),
}


@pytest.fixture
def held_spawns(monkeypatch: pytest.MonkeyPatch) -> tuple[asyncio.Event, asyncio.Event]:
    """Spawns that hold after the process exists: (spawned, let go). A loaded agent's spawn
    returns that late by itself; this makes the window certain."""
    spawned, let_go = asyncio.Event(), asyncio.Event()
    real = DiskJob.spawn

    async def spawn_then_hold(self: DiskJob, spare: SpareDir | None = None) -> None:
        await real(self, spare)
        spawned.set()
        await let_go.wait()

    monkeypatch.setattr(DiskJob, "spawn", spawn_then_hold)
    return spawned, let_go


@pytest.mark.parametrize("call", CALLS)
async def test_a_call_on_an_id_still_spawning_waits_for_the_spawn(
    held_spawns: tuple[asyncio.Event, asyncio.Event], call: str, tmp_path: Path
) -> None:
    spawned, let_go = held_spawns
    jobs = jobs_in(tmp_path)
    try:
        params = StartParams(command=["sh", "-c", "echo hi; exec sleep 60"], job_id="mine")
        start = asyncio.create_task(jobs.start(params))
        await spawned.wait()  # the process runs; its start has not answered
        asked = asyncio.create_task(CALLS[call](jobs))
        await asyncio.sleep(0)  # one step of the call: it reaches the id (no time waited)
        assert not asked.done(), asked.exception()  # unknown to the agent would have been final
        let_go.set()
        assert (await start).job_id == "mine"
        job = jobs._jobs["mine"]
        await asked  # acted on the job, no JobNotFoundError
        if job.running:
            job.send_signal(signal.SIGKILL)
        await job.ended()  # reaped, its pipes closed: nothing left running after the test
    finally:
        await jobs.aclose()


async def test_a_call_on_an_id_whose_spawn_failed_says_no_such_job(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    reached, fail = asyncio.Event(), asyncio.Event()

    async def failing_spawn(self: DiskJob, spare: SpareDir | None = None) -> None:
        reached.set()
        await fail.wait()
        raise OSError("no such program")

    monkeypatch.setattr(DiskJob, "spawn", failing_spawn)
    jobs = jobs_in(tmp_path)
    start = asyncio.create_task(jobs.start(StartParams(command=["true"], job_id="mine")))
    await reached.wait()
    asked = asyncio.create_task(jobs.read(ReadParams(job_id="mine")))
    await asyncio.sleep(0)
    fail.set()
    with pytest.raises(OSError):
        await start
    with pytest.raises(JobNotFoundError, match="no job mine"):
        await asked
