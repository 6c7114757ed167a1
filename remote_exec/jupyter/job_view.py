"""``JobView``: one job, live — state badge, elapsed time, exit code, stdout and stderr panes.

The view reads the handle it is given to its end (on the background loop), so give it a handle
nobody else iterates: ``JobView.attach(sb, job_id)`` makes a fresh one.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import traitlets

from ..blocking import BlockingExecRemoteProcess, Sandbox
from ..client.types import ExecResult
from ..errors import JobNotRunningError, RemoteExecError
from ._assets import css, esm
from .base import StreamWidget
from .display import format_duration
from .follow import Outcome, follow, loop_of
from .transcript import DEFAULT_TAIL_LINES

__all__ = ["JobView"]


def _command_text(command: list[str] | str | None, fallback: str) -> str:
    if command is None:
        return fallback
    if isinstance(command, str):
        return command
    if command[:2] == ["bash", "-c"] and len(command) == 3:
        return command[2]  # a cell body: show the script, not its wrapper
    return " ".join(command)


class JobView(StreamWidget):
    """A live view of one job, with Interrupt (SIGINT) and Kill buttons and Copy/Download.

    :param proc: the job's handle; the view reads it to its end.
    :param command: what to show as the command line (default: the job id).
    :param sandbox: the sandbox URL, shown next to the job id.
    :param started_at: when the job started (seconds since the epoch; default: now).
    :param live: send output before any view said hello (a cell that blocks cannot answer one).
    :param tail_lines: lines per pane the browser keeps; older ones show as "N lines hidden".
    """

    PANES = {"stdout": "stdout", "stderr": "stderr"}  # noqa: RUF012 - a ClassVar of the base
    _esm = esm("job_view")
    _css = css("job_view")

    command = traitlets.Unicode("").tag(sync=True)
    job_id = traitlets.Unicode("").tag(sync=True)
    sandbox = traitlets.Unicode("").tag(sync=True)
    state = traitlets.Unicode("running").tag(sync=True)
    exit_code = traitlets.Int(None, allow_none=True).tag(sync=True)
    started_at = traitlets.Float(0.0).tag(sync=True)
    ended_at = traitlets.Float(None, allow_none=True).tag(sync=True)
    stdout_chars = traitlets.Int(0).tag(sync=True)
    stderr_chars = traitlets.Int(0).tag(sync=True)
    error = traitlets.Unicode("").tag(sync=True)

    def __init__(
        self,
        proc: BlockingExecRemoteProcess,
        *,
        command: list[str] | str | None = None,
        sandbox: str = "",
        started_at: float | None = None,
        live: bool = False,
        tail_lines: int = DEFAULT_TAIL_LINES,
    ) -> None:
        job_id = proc.job_id or ""
        super().__init__(
            loop_of(proc),
            live=live,
            tail_lines=tail_lines,
            command=_command_text(command, f"job {job_id}"),
            job_id=job_id,
            sandbox=sandbox,
            started_at=time.time() if started_at is None else started_at,
        )
        self.process = proc
        """The handle the view follows."""
        self.outcome: Outcome | None = None
        """How the job ended, once it has."""
        self._done = threading.Event()
        self._loop.spawn(self._run)

    @classmethod
    def attach(cls, sandbox: Sandbox, job_id: str, **kwargs: Any) -> JobView:
        """A view of a job started elsewhere (a previous kernel, another client).

        :raises JobNotFoundError: no such job.
        """
        info = next((j for j in sandbox.jobs() if j.job_id == job_id), None)
        proc = sandbox.attach(job_id)
        if info is not None:
            kwargs.setdefault("command", info.command)
            kwargs.setdefault("started_at", info.started_at)
        kwargs.setdefault("sandbox", sandbox.url)
        return cls(proc, **kwargs)

    # -- the job (loop thread) -------------------------------------------------------------------

    async def _run(self) -> None:
        outcome = await follow(self.process.async_process, self._emit)
        code = outcome.exit_code
        error = "" if outcome.state != "error" else str(outcome.error)
        self._set(state=outcome.state, exit_code=code, ended_at=time.time(), error=error)
        self.outcome = outcome
        await self._drain()
        self._done.set()

    def _counters(self) -> dict[str, Any]:
        chars = self._transcript.chars
        return {"stdout_chars": chars["stdout"], "stderr_chars": chars["stderr"]}

    async def _control(self, what: str) -> None:
        proc = self.process.async_process
        try:
            if what == "kill":
                await proc.kill()
            else:
                await proc.signal("SIGINT")
        except JobNotRunningError:
            pass  # it ended meanwhile: nothing to stop
        except RemoteExecError as exc:
            self._set(error=f"{what} failed: {exc}")

    def _action(self, kind: str, content: dict[str, Any]) -> None:
        if kind in ("kill", "interrupt") and not self._done.is_set():
            self._loop.spawn(self._control, kind)

    # -- Python side -----------------------------------------------------------------------------

    def kill(self) -> None:
        """Kill the job (SIGTERM to its group, SIGKILL after its grace); returns once it is gone."""
        self._loop.call(self._control, "kill")

    def interrupt(self) -> None:
        """Send SIGINT to the job's process group (Ctrl-C)."""
        self._loop.call(self._control, "interrupt")

    @property
    def done(self) -> bool:
        """True once the job ended and the view sent its last update."""
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> Outcome | None:
        """Block until the job ends (or ``timeout`` passes: then ``None``)."""
        return self.outcome if self._done.wait(timeout) else None

    @property
    def result(self) -> ExecResult | None:
        """The job's result once it ended (``None`` if it was killed through this view)."""
        return self.outcome.result if self.outcome is not None else None

    def _plain_text(self) -> str:
        end = self.ended_at if self.ended_at is not None else time.time()
        code = "" if self.exit_code is None else f", exit {self.exit_code}"
        first = self.command.splitlines()[0] if self.command else ""
        lines = [f"[{self.state}] {first}  (job {self.job_id}, {format_duration(end - self.started_at)}{code})"]
        for stream in ("stdout", "stderr"):
            pieces, hidden = self._transcript.tail(stream, 10)
            text = "".join(t for _, t in pieces)
            if text:
                more = f", {hidden} earlier lines hidden" if hidden else ""
                lines.append(f"--- {stream}{more} ---")
                lines.append(text.rstrip("\n"))
        return "\n".join(lines)
