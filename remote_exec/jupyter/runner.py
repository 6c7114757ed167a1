"""Running a cell's script: foreground (streamed into the cell) or in the background (a widget).

Thread-safe by construction: the job is read on the blocking API's loop thread, which only
puts chunks on a queue; the cell's own thread takes them off and writes them to
``sys.stdout``/``sys.stderr``. Output written from other threads can land in the wrong cell
(ipykernel 7.0.0, ipykernel#1450); output written by the cell's thread cannot.

An interrupted foreground cell (the notebook's ■, i.e. SIGINT → ``KeyboardInterrupt``) sends
SIGINT to the job's process group, as a terminal's Ctrl-C would, waits ``interrupt_grace``
seconds for it to end, then kills it; a second interrupt kills at once.
"""

from __future__ import annotations

import contextlib
import queue
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from ..blocking import BlockingExecRemoteProcess, BlockingShellSession, Sandbox
from ..client.process import ExecRemoteProcess
from ..errors import JobNotRunningError, RemoteExecError
from ..protocol import JobPolicy
from .background import BackgroundJob
from .display import CellWriter, JobInterrupted, RemoteCommandError
from .follow import Outcome, follow, loop_of
from .job_view import JobView
from .terminal_view import DEFAULT_SIZE, TerminalView, start_cols
from .vt import ScreenWriter

__all__ = ["CellJob", "exit_line", "failure"]

LABEL = "%%exec_remote"


@dataclass(frozen=True)
class CellJob:
    """A cell's script and where and how to run it.

    :ivar session: run in this shell session instead of as a fresh ``bash -c`` job.
    :ivar tags: stored with the job by the agent (which notebook and kernel started it, the
        cell's ``--name``), so a later kernel finds it (``%exec_remote_attach``).
    :ivar policy: what the agent does to the job by itself (not for shell runs).
    :ivar tty: run in a pseudo-terminal, shown in a :class:`TerminalView` (plain text: the
        rendered screen at the end, never the raw control sequences).
    :ivar stdin: keep the job's stdin open (its view shows an input line).
    :ivar merged: its view shows stdout and stderr in one pane, in the order read.
    """

    body: str
    sandbox: Sandbox
    session: BlockingShellSession | None = None
    timeout: float | None = None
    cwd: str | None = None
    env: dict[str, str] | None = None
    interrupt_grace: float = 2.0
    tags: dict[str, str] | None = None
    policy: JobPolicy | None = None
    tty: bool = False
    stdin: bool = False
    merged: bool = False

    def start(self) -> BlockingExecRemoteProcess:
        """Start the script; returns once the agent confirmed it.

        An interrupt while the start is under way stops the job as soon as it exists: the
        notebook's ■ must never leave a job behind, however early it comes.

        :raises SpawnError: it could not be started.
        :raises ShellBusyError: the session is running something else.
        """
        loop = loop_of(self.sandbox)
        starting = loop.portal.start_task_soon(self._start)
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    return BlockingExecRemoteProcess(loop.portal, starting.result(timeout=0.1))
        except KeyboardInterrupt:
            starting.add_done_callback(lambda f: f.exception() or loop.spawn(f.result().kill, 0.5))
            raise JobInterrupted("the remote job was stopped (killed as it started)") from None

    async def _start(self) -> ExecRemoteProcess:
        if self.session is not None:
            return await self.session.async_session.start(self.body, timeout=self.timeout, tags=self.tags).started()
        sb = self.sandbox.async_sandbox
        proc = sb.exec_remote(
            ["bash", "-c", self.body],
            cwd=self.cwd,
            env=self.env,
            timeout=self.timeout,
            label=LABEL,
            tags=self.tags,
            policy=self.policy,
            tty=self.tty,
            tty_size=(start_cols(), DEFAULT_SIZE[1]) if self.tty else None,
            stdin_open=self.stdin,
        )
        return await proc.started()

    # -- foreground --------------------------------------------------------------------------

    def run_foreground(self, *, widget: bool, plain: bool) -> Outcome:
        """Run to the end, streaming into the cell (or into a live widget); see the module doc.

        An interrupted cell raises ``JobInterrupted`` (a ``KeyboardInterrupt``) once the job is gone.
        """
        proc = self.start()
        writer: CellWriter | ScreenWriter = ScreenWriter() if self.tty else CellWriter(plain, merged=self.merged)
        drain: Drain = _sleep_until  # until the watching below is set up
        outcome: Callable[[float | None], Outcome | None]
        try:
            if widget:
                view = JobView(proc, command=self.body, sandbox=self.sandbox.url, live=True, merged=self.merged)
                view.show()
                drain, outcome = _watch_view(view), view.wait
            else:
                drain, outcome = _watch_queue(proc, writer)
            drain(None)
        except KeyboardInterrupt:
            how = self._stop(proc, writer, drain)
            raise JobInterrupted(f"the remote job was stopped ({how})") from None
        result = outcome(None)
        assert result is not None
        if not widget:
            # Plain text always ends with the exit line (nbval compares it); a live cell's text
            # only when it failed: a --no-raise-error cell must still say how it ended.
            failed = result.state != "completed"
            writer.finish(exit_line(result, self.timeout) if plain or failed else None)
        return result

    def _stop(self, proc: BlockingExecRemoteProcess, writer: CellWriter | ScreenWriter, drain: Drain) -> str:
        """SIGINT, wait, kill: returns how the job ended."""
        loop = loop_of(proc)
        try:
            writer.note("[remote_exec] interrupted: SIGINT sent to the job")
            try:
                loop.call(proc.async_process.signal, "SIGINT")
            except JobNotRunningError:
                return "it had ended"
            except RemoteExecError:
                pass  # the kill below still tries
            if drain(time.monotonic() + self.interrupt_grace):
                return "SIGINT"
            writer.note(f"[remote_exec] still running after {self.interrupt_grace:g} s: killed")
            loop.call(proc.async_process.kill, 1.0)
            drain(time.monotonic() + 5.0)
            return f"SIGINT, then killed after {self.interrupt_grace:g} s"
        except KeyboardInterrupt:
            # Interrupted again: kill without waiting. The kill runs on the loop, so it finishes
            # even though this thread stops waiting for it.
            loop.portal.start_task_soon(proc.async_process.kill, 0.0)
            return "killed on a second interrupt"

    # -- background --------------------------------------------------------------------------

    def run_background(self, *, widget: bool, plain: bool, name: str | None = None) -> BackgroundJob:
        """Start the script and return its handle at once; show a live view unless ``widget`` is off.

        The view (or the handle's follower) reads a second handle of its own, and Kill acts
        through a third, so the returned one stays free for the caller to ``wait()`` or iterate,
        and sees a kill as the job's end, with its output (see :class:`BackgroundJob`).
        """
        proc = self.start()
        assert proc.job_id is not None
        watcher, control = self.sandbox.attach(proc.job_id), self.sandbox.attach(proc.job_id)
        view = None
        if widget and not plain:
            url = self.sandbox.url
            if self.tty:
                view = TerminalView(watcher, command=self.body, sandbox=url, control=control)
            else:
                view = JobView(watcher, command=self.body, sandbox=url, control=control, merged=self.merged)
            view.show()
        elif plain:
            print("started in the background")  # no job id: plain output must not vary by run
        else:
            print(f"started job {proc.job_id} in the background")
        return BackgroundJob(proc, control, watcher, view, name)


def _slice(until: float | None) -> float:
    # Wait in short slices: a KeyboardInterrupt is seen between them at the latest.
    return 0.1 if until is None else max(0.0, min(0.1, until - time.monotonic()))


def _sleep_until(until: float | None) -> bool:
    while until is None or time.monotonic() < until:
        time.sleep(_slice(until))
    return False


Drain = Callable[[float | None], bool]
"""Waits (writing output) until the job ended (True) or ``until`` passed (False)."""


def _watch_view(view: JobView) -> Drain:
    def drain(until: float | None) -> bool:
        while view.wait(_slice(until)) is None:
            if until is not None and time.monotonic() >= until:
                return False
        return True

    return drain


def _watch_queue(
    proc: BlockingExecRemoteProcess, writer: CellWriter | ScreenWriter
) -> tuple[Drain, Callable[[float | None], Outcome]]:
    """Follow ``proc`` on the loop into a queue; the returned drain writes from this thread."""
    chunks: queue.Queue[tuple[str, str]] = queue.Queue()
    done: Future[Outcome] = loop_of(proc).portal.start_task_soon(
        follow, proc.async_process, lambda stream, text: chunks.put((stream, text))
    )

    def drain(until: float | None) -> bool:
        while True:
            try:
                stream, text = chunks.get(timeout=_slice(until))
            except queue.Empty:
                if done.done() and chunks.empty():
                    return True
                if until is not None and time.monotonic() >= until:
                    return False
                continue
            writer.write(stream, text)

    return drain, lambda _t: done.result()


def exit_line(outcome: Outcome, timeout: float | None) -> str:
    """The plain-text summary printed after a foreground cell's output."""
    code = outcome.exit_code
    if outcome.state == "timed out":
        return f"timed out after {timeout:g} s" if timeout is not None else "timed out"
    if outcome.state == "killed":
        return "killed" + (f" (exit code {code})" if code is not None else "")
    if outcome.state == "error":
        return f"error: {outcome.error}"
    if outcome.state == "lost":
        return "exit code lost (the job ended while neither the agent nor its keeper ran)"
    return f"exit code: {code}"


def failure(outcome: Outcome, timeout: float | None) -> RemoteCommandError | None:
    """The error a foreground cell raises for ``outcome`` (``None`` when it succeeded)."""
    if outcome.state == "completed":
        return None
    if outcome.state == "failed":
        message = f"the command exited with code {outcome.exit_code}"
    elif outcome.state == "timed out":
        message = f"the command timed out after {timeout:g} s and was killed" if timeout else "timed out"
    elif outcome.state == "killed":
        message = "the job was killed"
    elif outcome.state == "lost":
        message = "the job ended while neither the agent nor its keeper ran: its exit status is lost"
    else:
        message = f"{type(outcome.error).__name__}: {outcome.error}"
    return RemoteCommandError(message, outcome.result)
