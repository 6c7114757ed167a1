"""``BackgroundJob``: the handle a ``%%exec_remote --bg --name VAR`` cell stores in ``VAR``.

It tells the truth without ``wait()``: ``state``, ``done``, ``returncode`` and ``wait()`` follow
the job's one feed (:class:`~remote_exec.client.feed.JobFeed`), the reader its view subscribes
to as well, on the background loop. Kill and Interrupt act through one control handle, whether
pressed in the view or called here, so they end the same way: ``wait()`` returns
``ExecResult(state="killed")`` with the output up to the kill; it never raises
``JobKilledError``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import Future

from ..blocking import BlockingExecRemoteProcess
from ..client.feed import JobFeed
from ..client.process import ExecRemoteProcess
from ..client.types import ExecRemoteEvent, ExecResult
from ..errors import ExecTimeoutError, JobNotRunningError
from .follow import JobState, Outcome, loop_of
from .job_view import JobView

__all__ = ["BackgroundJob"]


class BackgroundJob:
    """A job started by a ``--bg`` cell.

    :ivar process: a handle nobody else reads: iterate it, or write to its stdin.
    :ivar view: the cell's live view (``None`` with ``--no-widget`` or in plain-text mode).
    """

    def __init__(
        self,
        process: BlockingExecRemoteProcess,
        control: BlockingExecRemoteProcess,
        watcher: BlockingExecRemoteProcess,
        view: JobView | None,
        name: str | None = None,
    ) -> None:
        self.process = process
        self.view = view
        self.name = name
        self._control = control
        self._loop = loop_of(watcher)
        # The job's feed reads the watcher (the view's handle too): one reader, one end.
        self._followed: Future[Outcome] = self._loop.portal.start_task_soon(_ended, watcher.async_process)

    @property
    def job_id(self) -> str:
        return self.process.job_id or ""

    @property
    def pid(self) -> int | None:
        """The job's process id inside the sandbox (its process group's too)."""
        return self.process.pid

    def __iter__(self) -> Iterator[ExecRemoteEvent]:
        """The job's events from its start (stdout, stderr, the end), as the process handle
        gives them; the cell's view reads a handle of its own, so both see everything. Once."""
        return iter(self.process)

    def _outcome(self) -> Outcome | None:
        f = self._followed
        return f.result() if f.done() else None

    @property
    def state(self) -> JobState:
        """``running`` until the job ended, then ``completed``, ``failed``, ``killed``, ``timed out``
        or ``error`` (as the view shows it)."""
        outcome = self._outcome()
        return "running" if outcome is None else outcome.state

    @property
    def done(self) -> bool:
        """True once the job ended (seen by the view or follower: no ``wait()`` needed)."""
        return self._outcome() is not None

    @property
    def returncode(self) -> int | None:
        """The exit code once the job ended (negative: the signal that ended it), else ``None``."""
        outcome = self._outcome()
        return outcome.exit_code if outcome is not None else None

    def wait(self) -> ExecResult:
        """Block until the job ends and return its result, killed jobs included
        (``result.state == "killed"``). Ctrl-C (the notebook's ■) kills the job.

        :raises ExecTimeoutError: the job's timeout expired (``.result`` holds the partial output).
        :raises RemoteExecError: the job could not be followed to its end (its sandbox is gone).
        """
        try:
            outcome = self._followed.result()  # (a Ctrl-C interrupts the wait, as portal.call's)
        except KeyboardInterrupt:
            self.kill(0.5)  # the job is gone when the caller sees the interrupt
            raise
        if outcome.result is None:
            assert outcome.error is not None  # (the feed reads a handle nobody kills through)
            raise outcome.error
        if outcome.state == "timed out" and isinstance(outcome.error, ExecTimeoutError):
            raise outcome.error
        return outcome.result

    def kill(self, grace: float | None = None) -> None:
        """Kill the job (SIGTERM to its group, SIGKILL after ``grace``); returns once it is gone.
        The same as the view's Kill button; a job that has ended is left alone."""
        with contextlib.suppress(JobNotRunningError):
            self._control.kill(grace)

    def interrupt(self) -> None:
        """SIGINT to the job's process group (Ctrl-C), as the view's Interrupt button sends."""
        self.signal("SIGINT")

    def signal(self, sig: int | str) -> None:
        """Send ``sig`` (``"SIGUSR1"``, ``"TERM"``, ``15``) to the job's process group; a job
        that has ended is left alone."""
        with contextlib.suppress(JobNotRunningError):
            self._control.signal(sig)

    def write_stdin(self, data: str | bytes) -> None:
        """Write to the job's stdin (a ``--stdin`` cell), after whatever the view's input line
        sent: both go through one handle, one write at a time.

        :raises JobNotRunningError: its stdin is closed, or the job ended.
        """
        self._control.write_stdin(data)

    def close_stdin(self) -> None:
        """Close the job's stdin (EOF), as Ctrl+D in the view's input line does."""
        self._control.close_stdin()

    def __repr__(self) -> str:
        code = "" if self.returncode is None else f" exit {self.returncode}"
        name = f" {self.name}" if self.name else ""
        return f"<BackgroundJob{name} job_id={self.job_id!r} {self.state}{code}>"


async def _ended(proc: ExecRemoteProcess) -> Outcome:
    return await JobFeed.of(proc).ended()
