"""The shell session registry: typed operations behind the ``shell_*`` JSON-RPC methods.

Runs are registered with the :class:`~remote_exec.agent.jobs.controller.JobController` as
job-like entries, so they are polled, listed, attached to and killed through the job methods.
Sessions die with the agent.
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from ...errors import (
    AgentLostError,
    JobNotFoundError,
    ServerBusyError,
    ShellBusyError,
    ShellClosedError,
    ShellNotFoundError,
)
from ...protocol import (
    Empty,
    JobIdParams,
    ShellIdParams,
    ShellInfo,
    ShellListParams,
    ShellListResult,
    ShellOpenParams,
    ShellRunParams,
    StartParams,
    StartResult,
)
from ..jobs.controller import JobController
from ..jobs.job import Job
from .run import ShellRun
from .session import MAX_KEYS, ShellSession, default_shell

__all__ = ["ShellController", "ShellLimits"]


@dataclass(frozen=True)
class ShellLimits:
    """Bounds on shell sessions.

    :ivar ttl: seconds a session may sit idle (no run) before it is closed; 0 means never.
    :ivar max_open: open sessions at once; more opens get ``ServerBusyError``.
    :ivar max_closed: closed sessions remembered, so a late call gets ``ShellClosedError``
        rather than ``ShellNotFoundError``.
    :ivar retain_runs: runs a session keeps in the job registry besides its latest one
        (pollable, listed, attachable); older ones are released, so a long session does not
        crowd other jobs out of the registry.
    :ivar argv: the shell to run; ``None`` finds bash, else sh.
    """

    ttl: float = 3600.0
    max_open: int = 256
    max_closed: int = 64
    retain_runs: int = 16
    argv: tuple[str, ...] | None = None


class ShellController:
    """Owns every shell session of one agent; ids are ``<instance>-sh<n>``, never reused."""

    def __init__(
        self, jobs: JobController, limits: ShellLimits | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.jobs = jobs
        self._clock = clock  # monotonic seconds that ``ttl`` is counted in (tests pass a fake one)
        self.limits = limits or ShellLimits()
        self._sessions: OrderedDict[str, ShellSession] = OrderedDict()
        self._counter = 0
        self._opening = 0  # opens between the limit check and registering (their shell starting)

    @property
    def open_count(self) -> int:
        return sum(1 for s in self._sessions.values() if s.open)

    def _get(self, session_id: str) -> ShellSession:
        session = self._sessions.get(session_id)
        if session is not None:
            return session
        instance, sep, _ = session_id.rpartition("-sh")
        if sep and instance != self.jobs.instance_id:
            raise AgentLostError(
                f"shell {session_id} belonged to agent instance {instance}, which is gone; shell sessions "
                f"die with their agent, and this one ({self.jobs.instance_id}) started after it",
                data={"session_id": session_id},
            )
        raise ShellNotFoundError(f"no shell session {session_id}", session_id=session_id)

    def _get_open(self, session_id: str) -> ShellSession:
        session = self._get(session_id)
        if not session.open:
            raise ShellClosedError(
                f"shell {session_id} is closed: {session.closed_reason}",
                session_id=session_id,
                data={"exit_code": session.exit_code},
            )
        return session

    def _closed(self, _: ShellSession) -> None:
        closed = [sid for sid, s in self._sessions.items() if not s.open]
        for sid in closed[: max(0, len(closed) - self.limits.max_closed)]:
            del self._sessions[sid]

    async def open(self, p: ShellOpenParams) -> ShellInfo:
        if self.open_count + self._opening >= self.limits.max_open:
            raise ServerBusyError(
                f"{self.open_count + self._opening} shell sessions are open, the limit of this agent",
                data={"limit": self.limits.max_open},
            )
        self._counter += 1
        argv = list(self.limits.argv) if self.limits.argv else default_shell()
        session = ShellSession(
            f"{self.jobs.instance_id}-sh{self._counter}", argv, self.limits.ttl, self._closed, clock=self._clock
        )
        self._opening += 1  # the slot is taken before the await: concurrent opens cannot overshoot
        try:
            mark = f"{self.jobs.prefix}-{session.session_id}"  # the next agent ends it if it outlives us
            await session.start(p.cwd, p.env, mark)  # SpawnError propagates; the session was never registered
        finally:
            self._opening -= 1
        self._sessions[session.session_id] = session
        return session.info()

    async def run(self, p: ShellRunParams) -> StartResult:
        session = self._get_open(p.session_id)
        if p.idempotency_key is not None and p.idempotency_key in session.keys:
            return StartResult(job_id=session.keys[p.idempotency_key], pid=session.pid)
        if session.run is not None:
            raise ShellBusyError(
                f"shell {p.session_id} is busy with run {session.run.job_id}; a shell runs one command at a "
                "time (wait for it, interrupt it, or open another shell)",
                session_id=p.session_id,
                data={"run_id": session.run.job_id},
            )
        label = f"shell {p.session_id}"
        params = StartParams(command=p.command, label=label, timeout=p.timeout, kill_grace=p.kill_grace)

        def make(job_id: str, buffer_limit: int, on_done: Callable[[Job], None]) -> ShellRun:
            return ShellRun(job_id, params, buffer_limit, on_done, session)

        run = self.jobs.adopt(make, owner=p.session_id)
        session.runs.append(run.job_id)
        while len(session.runs) > self.limits.retain_runs + 1:  # the new run is not finished yet
            with contextlib.suppress(JobNotFoundError):
                await self.jobs.release(JobIdParams(job_id=session.runs.popleft()))
        if p.idempotency_key is not None:
            session.keys[p.idempotency_key] = run.job_id
            while len(session.keys) > MAX_KEYS:
                session.keys.popitem(last=False)
        await session.begin(run, p.input.encode() if p.input is not None else None, p.stdin_open)
        return StartResult(job_id=run.job_id, pid=session.pid)

    async def list(self, p: ShellListParams) -> ShellListResult:
        if p.session_id is not None:
            return ShellListResult(shells=[self._get(p.session_id).info()])
        return ShellListResult(shells=[s.info() for s in self._sessions.values()])

    async def close(self, p: ShellIdParams) -> ShellInfo:
        session = self._get(p.session_id)
        await session.close("closed on request")
        return session.info()

    async def interrupt(self, p: ShellIdParams) -> Empty:
        self._get_open(p.session_id).interrupt()
        return Empty()

    def expire_idle(self) -> int:
        """Close every session idle (no run) for ``ttl`` seconds by the clock; return how many.

        Each session's timer does this in production; a test advances its fake clock and calls
        this instead of waiting out the TTL. The shells are killed in the background
        (``wait_closed()`` on a session waits for it).
        """
        return sum(session.expire_idle() for session in list(self._sessions.values()))

    async def aclose(self) -> None:
        """Kill every shell (the agent is shutting down; sessions die with it)."""
        for session in list(self._sessions.values()):
            await session.aclose()
