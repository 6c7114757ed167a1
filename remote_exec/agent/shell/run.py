"""One run of a command in a shell session, served to pollers exactly like a job.

A :class:`ShellRun` is a :class:`~remote_exec.agent.jobs.job.Job` whose output comes from its
session's shell instead of a process of its own. It lives in the job registry under a job id,
so ``exec_remote_poll``, ``exec_remote_list``, ``exec_remote_kill`` and ``attach`` work on it
unchanged, with the same cursors, long polls and follows; only how it is signalled and how it
ends differ. Its output is kept in a job dir of its own (:mod:`.runlog`), capped and retained
as a job's, read by the same log code; a durable session's run outlives the agent as a job does.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable
from typing import Any, Protocol

from ...errors import JobNotRunningError
from ...protocol import StartParams
from ..jobs.job import Job
from ..jobs.jobrecord import start_record
from .runlog import RunLog
from .runstdin import RunStdin

__all__ = ["RunSession", "ShellRun"]

KILL_SETTLE = 1.0  # seconds after SIGKILL of a run's processes for the shell to report back


class RunSession(Protocol):
    """What a run uses of its :class:`~remote_exec.agent.shell.session.ShellSession`, named here
    because that module imports this one (so this one may not import it)."""

    @property
    def session_id(self) -> str: ...

    @property
    def pid(self) -> int: ...

    def interrupt(self) -> None: ...

    def signal_run(self, run: ShellRun, sig: int) -> None: ...

    async def signal_processes(self, run: ShellRun, sig: int) -> None: ...

    async def close(self, reason: str) -> None: ...


class ShellRun(Job):
    """A command running (or run) in a shell session; ``pid`` is the shell's.

    :ivar session_id: the session it ran in.
    :ivar started_boot: ``CLOCK_BOOTTIME`` when it began: its processes are those started since.
    :ivar log: its output on disk (see :mod:`.runlog`), opened by its maker.
    """

    def __init__(
        self,
        job_id: str,
        params: StartParams,
        buffer_limit: int,
        on_done: Callable[[Job], None],
        session: RunSession,
        log: RunLog,
    ) -> None:
        super().__init__(job_id, params, buffer_limit, on_done, log.files)
        assert isinstance(params.command, str)
        self.command: str = params.command
        self._session = session
        self.session_id = session.session_id
        self.pid = session.pid
        self.started_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
        self.feed: RunStdin | None = None  # its open stdin (``stdin_open``), closed when it ends
        self.log = log
        self._begun = False

    def save(self) -> None:
        """Write its ``job.json`` (as it begins, and as it ends)."""
        self.log.save(self._meta())

    def _meta(self) -> dict[str, Any]:
        """Its ``job.json``, in the shape :func:`..jobs.readopt.restore_job` reads (a finished run is a
        finished job to the next agent); ``shell`` tells the job re-adoption to leave a running
        one to the shell controller."""
        meta: dict[str, Any] = {
            "v": 1,
            "job_id": self.job_id,
            "shell": self.session_id,
            **start_record(self.params),
            "started_at": self.started_at,
            "pid": self.pid,
            "starttime": None,  # not the run's own process: nothing may signal it as a job's
            "tree_ended": True,  # its leftovers are the session's (it ends them), not a job's
        }
        if self._done.is_set():
            meta["end"] = {"state": self._state, "exit_code": self.exit_code, "ended_at": self.ended_at}
        return meta

    def remove_logs(self) -> None:
        self.log.close()
        # Through the jobs' trash, off the event loop: unlinks take milliseconds on a loaded
        # disk (seconds for a big log), and a session past ``retain_runs`` releases one run per run.
        self.log.discard()

    def deliver(self, fd: int, data: bytes) -> None:
        """The run's visible bytes of stream ``fd`` (the framing let them through): to its log."""
        self.log.write(fd, data)  # no pause: the bytes go from the session's file to the run's
        self._notify()

    def begin(self, elapsed: float = 0.0) -> None:
        """The session wrote this run's frame: its timeout starts. ``elapsed``: seconds it ran
        already (under an earlier agent), taken off its timeout."""
        self._begun = True
        timeout, grace = self.params.timeout, self.params.kill_grace
        if timeout is not None:
            loop = asyncio.get_running_loop()
            self._timers.append(loop.call_later(max(0.0, timeout - elapsed), self._begin_end, "timed_out", grace))

    def leave(self) -> None:
        """This agent hands the run over to the next one: stop its timers, end nothing."""
        for t in self._timers:
            t.cancel()
        self._timers.clear()
        self._begun = False
        self.log.close()

    def finish(self, exit_code: int | None) -> None:
        """Both sentinels arrived (or the shell ended): the run is over with ``exit_code``."""
        if self._done.is_set():
            return
        self.exit_code = exit_code
        if self.feed is not None:
            self.feed.close()  # unread input is dropped here: it never reaches the shell
        self._begun = False
        self._state = self._ending or "completed"
        self.ended_at = time.time()
        for t in self._timers:
            t.cancel()
        self._timers.clear()
        self._done.set()
        for stream in self.files:
            stream.eof = True
        self.save()  # now a finished job to the next agent too
        self.log.close()
        self._notify()
        self._on_done(self)

    def write_stdin(self, data: bytes, offset: int | None, eof: bool, writer: str | None = None) -> int:
        if self.feed is None:
            raise JobNotRunningError(
                f"run {self.job_id} has no open stdin: it reads the input= given when it started, or "
                "start it with stdin_open=True to write to it",
                job_id=self.job_id,
            )
        if not self._begun:  # not begun yet, or over (its feed is closed)
            raise JobNotRunningError(f"stdin of run {self.job_id} is not open", job_id=self.job_id)
        taken = super().write_stdin(data, offset, eof, writer)
        if taken or eof:
            self.log.save_stdin_cursor(self.stdin.written)  # the next agent's cursor, after a crash
        return taken

    def send_signal(self, sig: int) -> None:
        """SIGINT interrupts the command as Ctrl-C would; other signals go to its processes."""
        if not self.running:
            raise JobNotRunningError(f"run {self.job_id} is {self._state}", job_id=self.job_id)
        self._session.signal_run(self, sig)

    async def _terminate(self, grace: float) -> None:
        # Job.kill() and the timeout land here. Escalate only as far as needed to keep the shell:
        # Ctrl-C; then SIGKILL for what the run started; only then give the whole session up.
        session = self._session
        session.interrupt()
        if await self._ended_within(grace):
            return
        await session.signal_processes(self, signal.SIGKILL)
        session.interrupt()  # the shell ignores a SIGINT its child survived: make it abort the line
        if await self._ended_within(KILL_SETTLE):
            return
        await session.close(f"run {self.job_id} could not be stopped, so its shell was killed")

    async def _ended_within(self, seconds: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._done.wait(), seconds)
        return self._done.is_set()

    async def aclose(self) -> None:
        """Nothing of its own to stop: the session controller closes the shells at shutdown."""
        for t in self._timers:
            t.cancel()
