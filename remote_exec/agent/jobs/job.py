"""One job's lifecycle: its state, its end, its stdin, its signals and its kill.

A job is served to readers by :class:`~.output.JobOutput` (its two log files); :class:`Job`
adds what every kind of job shares — the process group it signals, the stdin queue, the
timeout and the kill's grace — and leaves how it runs to its launcher: a process of its own
(:class:`~.diskjob.DiskJob`, :class:`~.ptyjob.PtyJob`) or a line in a shell session
(:class:`~remote_exec.agent.shell.run.ShellRun`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import os
import pwd
import signal
import time
from collections.abc import Callable
from typing import ClassVar

from ...errors import InvalidParamsError, JobNotRunningError, SpawnError
from ...protocol import (
    MAX_HITS_KEPT,
    MAX_RULES,
    JobInfo,
    JobState,
    KillResult,
    StartParams,
    TtySize,
)
from ..budget import MemoryBudget
from .environment import job_environment
from .logfile import LogFile
from .output import JobOutput
from .proctree import Tree
from .stdin import StdinQueue

__all__ = ["Job"]


def not_a_tty(job_id: str) -> InvalidParamsError:
    """The error for ``exec_remote_resize`` on a job without a terminal."""
    return InvalidParamsError(f"job {job_id} has no terminal (it was not started with tty)", data={"job_id": job_id})


class Job(JobOutput):
    """A running or finished job (its output served to readers by :class:`JobOutput`).

    :param buffer_limit: bytes its stdin queue may hold.
    :param on_done: called once, as it ends.
    :param streams: its stdout and stderr logs (see :mod:`.logfile`).
    :param mark: the agent's name for it (default: ``job_id``).
    :cvar owns_processes: its processes carry its mark (a process job's do; a shell run's are
        its session's), so what it leaves behind is found by that mark.
    :ivar leftovers: its processes still alive after its leader exited (as last looked).
    """

    owns_processes: ClassVar[bool] = False

    def __init__(
        self,
        job_id: str,
        params: StartParams,
        buffer_limit: int,
        on_done: Callable[[Job], None],
        streams: dict[int, LogFile],
        mark: str | None = None,
    ) -> None:
        super().__init__(job_id, params, streams)
        # The agent's own name for the job, ``<state dir id>-<n>``: its dir, the marker its
        # processes carry, the keeper's key and its place in listings. The same as ``job_id``
        # unless the client chose the id (then ``job_id`` is the client's, on the wire only).
        self.mark = mark or job_id
        self.pid = 0
        self.started_at = time.time()
        self.ended_at: float | None = None
        self._ending: JobState | None = None  # "killed"/"timed_out" once we started ending it
        self._on_done = on_done
        self.stdin = StdinQueue(job_id, buffer_limit)
        self._timers: list[asyncio.TimerHandle] = []
        self._terminating: asyncio.Task[None] | None = None
        # The watch rules' last scan (policy.py sets it): run as the job ends, before its end
        # is reported, so the final poll, ``ExecResult`` and ``JobInfo`` carry every hit.
        self.before_end: Callable[[], None] | None = None
        self.leftovers: list[int] = []

    def remove_logs(self) -> None:
        """It is forgotten: delete its logs from disk (off the event loop)."""
        raise NotImplementedError

    def charge_to(self, budget: MemoryBudget) -> None:
        """Charge the job's stdin queue to the agent's memory budget (the controller calls it
        before the job starts; its output is on disk and holds no memory)."""
        self.stdin.budget = budget

    def _environment(self) -> tuple[dict[str, str], dict[str, object]]:
        """The job's environment and the user switch for ``subprocess``.

        :raises SpawnError: the user is unknown.
        """
        p = self.params
        env = job_environment(None)
        kwargs: dict[str, object] = {}
        if p.user is not None:
            try:
                pw = pwd.getpwnam(p.user) if not p.user.isdigit() else pwd.getpwuid(int(p.user))
            except KeyError:
                raise SpawnError(f"unknown user {p.user!r}", job_id=self.job_id) from None
            kwargs.update(user=pw.pw_uid, group=pw.pw_gid, extra_groups=os.getgrouplist(pw.pw_name, pw.pw_gid))
            env.update(HOME=pw.pw_dir, USER=pw.pw_name, LOGNAME=pw.pw_name)
        if p.env:
            env.update(p.env)
        if p.policy is not None and p.policy.nice is not None:
            kwargs["preexec_fn"] = functools.partial(_renice, p.policy.nice)
        return env, kwargs

    @property
    def state(self) -> JobState:
        return self._state

    @property
    def running(self) -> bool:
        return self._state == "running"

    async def ended(self) -> None:
        """Wait until the job has ended and its end is recorded; cancelling only stops waiting."""
        await self._done.wait()

    def info(self) -> JobInfo:
        return JobInfo(
            job_id=self.job_id,
            pid=self.pid,
            command=self.params.command,
            label=self.params.label,
            state=self._state,
            exit_code=self.exit_code,
            started_at=self.started_at,
            ended_at=self.ended_at,
            stdout_bytes=self.streams[1].end,
            stderr_bytes=self.streams[2].end,
            last_output_at=self.last_output_at(),  # after the ends: a disk job's look at its files
            stdin_open=self.stdin.open,
            stdin_bytes=self.stdin.written,
            encoding=self.encoding,
            tags=self.params.tags,
            policy=self.params.policy,
            reason=self.reason,
            hits=self.hits[:MAX_HITS_KEPT],
            hits_total=self.hits_total,
            rules_disabled=self.rules_disabled[:MAX_RULES],
            watch_skipped=self.watch_skipped,
        )

    def last_output_at(self) -> float | None:
        """When the job last wrote to stdout or stderr (None: not yet): the newer of its log
        files' mtimes, as the last look at their size saw them (a listing has just looked)."""
        return max((f.mtime for f in self.files if f.mtime is not None), default=None)

    def _last_scan(self) -> None:
        """Let the watch rules see the rest of the output (the streams are complete, the state
        is no longer running: a hit is recorded, its action has nothing left to act on)."""
        scan_rest, self.before_end = self.before_end, None
        if scan_rest is not None:
            scan_rest()

    def _decode_input(self, data: str) -> bytes:
        return base64.b64decode(data, validate=True) if self.encoding == "base64" else data.encode()

    def write_stdin(self, data: bytes, offset: int | None, eof: bool, writer: str | None = None) -> int:
        """Write to stdin at byte ``offset`` (None: append; with ``writer``, that typist's byte);
        a repeated write is not duplicated. Takes only what fits (see :class:`StdinQueue`);
        returns the new bytes taken."""
        if self.stdin.pipe is None:  # stdin is /dev/null, or no copy of its pipe was kept
            raise JobNotRunningError(f"stdin of job {self.job_id} is not open", job_id=self.job_id)
        return self.stdin.write(data, offset, eof, writer=writer)

    async def write_stdin_encoded(
        self, data: str, offset: int | None, eof: bool, payload: memoryview | None = None, writer: str | None = None
    ) -> int:
        """Decode and write; when nothing fits, wait a while for room and try once more (the
        writer's back-pressure). Cancelling the wait writes nothing."""
        if payload is not None:
            if data:
                raise InvalidParamsError("stdin data came both as params and as payload", data={"job_id": self.job_id})
            raw = bytes(payload)
        else:
            try:
                raw = self._decode_input(data)
            except ValueError as exc:
                raise JobNotRunningError(f"stdin data is not valid base64: {exc}", job_id=self.job_id) from None
        end = (self.stdin.cursor(writer) if offset is None else offset) + len(raw)
        taken = self.write_stdin(raw, offset, eof, writer)
        if taken or end <= self.stdin.cursor(writer):
            return taken
        await self.stdin.wait_room()
        return self.write_stdin(raw, offset, eof, writer) if self.stdin.open else 0

    def tree(self) -> Tree:
        """What names the job's processes (see :mod:`.proctree`): here its leader and session."""
        return Tree(self.mark, self.pid if self.running else 0, self.pid)

    @property
    def needs_looking(self) -> bool:
        """Whether its tree is known only as it is seen (see :mod:`.proctree`): not here."""
        return False

    def resize(self, size: TtySize) -> None:
        """Set its terminal's size; a job without one refuses."""
        raise not_a_tty(self.job_id)

    def detach(self) -> None:
        """The agent hands over: stop its timers, leave its processes alone."""
        for t in self._timers:
            t.cancel()
        self._timers.clear()

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the job's whole process group."""
        if not self.running:
            raise JobNotRunningError(f"job {self.job_id} is {self._state}", job_id=self.job_id)
        _killpg(self.pid, sig)

    async def kill(self, grace: float | None) -> KillResult:
        """SIGTERM the group, SIGKILL it after ``grace``; return once the job has ended."""
        if self.running:
            self._begin_end("killed", self.params.kill_grace if grace is None else grace)
            assert self._terminating is not None
            await asyncio.shield(self._terminating)
            await self._done.wait()
        return KillResult(state=self._state, exit_code=self.exit_code)

    def stop(self, reason: str, grace: float | None = None) -> None:
        """End the job's tree on the agent's own initiative (its policy), ``reason`` recorded;
        ``grace`` (default: the job's ``kill_grace``) between SIGTERM and SIGKILL."""
        if self.running and self._terminating is None:
            self.reason = reason
            self._begin_end("killed", self.params.kill_grace if grace is None else grace)

    def interrupt(self, reason: str) -> None:
        """SIGINT the job's group on the agent's own initiative; the job decides what follows."""
        if self.running and self._terminating is None:
            self.reason = reason
            _killpg(self.pid, signal.SIGINT)

    def _begin_end(self, why: JobState, grace: float) -> None:
        if self._terminating is None and self.running:
            self._ending = why
            self._terminating = asyncio.get_running_loop().create_task(self._terminate(grace))

    async def _terminate(self, grace: float) -> None:
        """End the job (a kill, its timeout, its policy): the launcher's to say how; returns
        once it ended. Cancelled (the agent stops): what it did so far stays done."""
        raise NotImplementedError

    async def aclose(self) -> None:
        """Kill the job at once (agent shutdown)."""
        if self.running:
            _killpg(self.pid, signal.SIGKILL)
        for t in self._timers:
            t.cancel()


def _renice(nice: int) -> None:
    """In the child before exec (after the user switch): lower its priority to ``nice``, never
    raise it (an unprivileged process may not, and an agent at nice 5 keeps its jobs there)."""
    os.setpriority(os.PRIO_PROCESS, 0, max(nice, os.getpriority(os.PRIO_PROCESS, 0)))


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
