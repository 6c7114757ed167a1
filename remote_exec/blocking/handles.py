"""The blocking handles: a job, a shell session and a port forward, each wrapping its async original.

Their methods are one-liners around the shared portal of :mod:`remote_exec.blocking.sandbox`; a wait
that a user may want to stop (iteration, ``wait()``, ``run()``) is interruptible with Ctrl-C.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future
from types import TracebackType
from typing import Any, Literal, TypeVar

from anyio.from_thread import BlockingPortal

from ..client.link import Link
from ..client.logs import OutputSlice
from ..client.ports import PortForward
from ..client.process import ExecRemoteProcess
from ..client.sandbox import AsyncSandbox
from ..client.shell import ShellSession
from ..client.types import ExecRemoteEvent, ExecResult
from ..errors import SandboxClosedError
from ..protocol import JobInfo, JobStats, PortConnInfo, ShellInfo

__all__ = [
    "BlockingExecRemoteProcess",
    "BlockingPortForward",
    "BlockingShellSession",
    "check_open",
    "interruptible",
]

T = TypeVar("T")


def interruptible(portal: BlockingPortal, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``portal.call`` that, on Ctrl-C, cancels the async call and waits for its cleanup.

    Cancellation runs the async side's cancellation path (which kills the job) to completion
    before ``KeyboardInterrupt`` propagates, so the job is gone when the caller sees it.
    """
    tasks: list[asyncio.Task[Any]] = []

    async def runner() -> T:
        tasks.append(asyncio.current_task())  # type: ignore[arg-type]
        return await fn(*args)

    future: Future[T] = portal.start_task_soon(runner)
    try:
        return future.result()
    except KeyboardInterrupt:
        future.cancel()
        portal.call(_wait_done, tasks)
        raise


async def _wait_done(tasks: list[asyncio.Task[Any]]) -> None:
    if tasks:
        await asyncio.wait(tasks)


def check_open(sandbox: AsyncSandbox | None) -> None:
    """Raise :class:`SandboxClosedError` if ``sandbox`` (a handle's owner) is closed.

    Checked before every call through the portal: once the last blocking sandbox closes, the
    portal's thread stops and anyio would only say "This portal is not running".
    """
    if sandbox is not None and sandbox.closed:
        raise SandboxClosedError(f"{sandbox.url}: the sandbox this handle belongs to is closed; open a new one")


class _Handle:
    """What the blocking handles share: the portal, and the sandbox whose life bounds theirs."""

    def __init__(self, portal: BlockingPortal, sandbox: AsyncSandbox | None) -> None:
        self._portal = portal
        self._sandbox = sandbox

    def _call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        check_open(self._sandbox)
        return self._portal.call(fn, *args)

    def _interruptible(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        check_open(self._sandbox)
        return interruptible(self._portal, fn, *args)


class BlockingExecRemoteProcess(_Handle):
    """Blocking twin of :class:`~remote_exec.ExecRemoteProcess`; iterate it for events.

    Ctrl-C (``KeyboardInterrupt``) while iterating or waiting kills the job, as cancelling the
    async iteration does.
    """

    def __init__(self, portal: BlockingPortal, proc: ExecRemoteProcess, *, sandbox: AsyncSandbox | None = None) -> None:
        super().__init__(portal, sandbox)
        self.async_process = proc

    @property
    def portal(self) -> BlockingPortal:
        """The anyio portal this handle's calls run through (see :attr:`Sandbox.portal`)."""
        return self._portal

    @property
    def job_id(self) -> str | None:
        return self.async_process.job_id

    @property
    def pid(self) -> int | None:
        return self.async_process.pid

    @property
    def info(self) -> JobInfo | None:
        """The agent's record of an attached job (its command, start time, tags), else None."""
        return self.async_process.info

    @property
    def returncode(self) -> int | None:
        return self.async_process.returncode

    @property
    def tty(self) -> bool:
        """True if the job runs in a pseudo-terminal."""
        return self.async_process.tty

    @property
    def link(self) -> Link:
        """The state of the channel the job's sandbox talks over (see :attr:`ExecRemoteProcess.link`);
        listeners run on the background loop thread, reading ``link.status`` is safe from any thread."""
        return self.async_process.link

    @property
    def done(self) -> bool:
        return self.async_process.done

    @property
    def events(self) -> Iterator[ExecRemoteEvent]:
        return self

    def __iter__(self) -> Iterator[ExecRemoteEvent]:
        self.async_process.__aiter__()  # raises RuntimeError if the events were consumed already
        return self

    def __next__(self) -> ExecRemoteEvent:
        try:
            return self._interruptible(self.async_process.__anext__)
        except StopAsyncIteration:
            raise StopIteration from None

    def wait(self) -> ExecResult:
        """Run to the end and return the result (see the async ``wait``)."""
        return self._interruptible(self.async_process.wait)

    def write_stdin(self, data: str | bytes) -> None:
        self._call(self.async_process.write_stdin, data)

    def close_stdin(self) -> None:
        self._call(self.async_process.close_stdin)

    def signal(self, sig: int | str) -> None:
        self._call(self.async_process.signal, sig)

    def resize(self, cols: int, rows: int) -> None:
        self._call(self.async_process.resize, cols, rows)

    def kill(self, grace: float | None = None) -> None:
        self._call(self.async_process.kill, grace)

    def tail(self, n_bytes: int, stream: Literal["stdout", "stderr"] = "stdout") -> OutputSlice:
        return self._portal.call(self.async_process.tail, n_bytes, stream)

    def stats(self, *, window: float = 0.5) -> JobStats:
        """CPU %, RSS, threads, I/O and process count of the job's whole process tree."""
        return self._call(functools.partial(self.async_process.stats, window=window))

    @property
    def hits(self) -> int:
        return self.async_process.hits

    def on_hit(self, listener: Callable[[int], None]) -> Callable[[], None]:
        """As the async twin's: ``listener`` runs on the portal's event-loop thread."""
        return self.async_process.on_hit(listener)

    def release(self) -> None:
        self._call(self.async_process.release)

    def detach(self) -> str | None:
        return self.async_process.detach()

    def __repr__(self) -> str:
        return repr(self.async_process).replace("<ExecRemoteProcess", "<BlockingExecRemoteProcess", 1)


class BlockingShellSession(_Handle):
    """Blocking twin of :class:`~remote_exec.ShellSession`: ``with sb.shell() as sh``.

    Ctrl-C (``KeyboardInterrupt``) during :meth:`run` kills the run (SIGINT, then SIGKILL after
    ``kill_grace``), as cancelling the async ``run()`` does; the shell survives.
    """

    def __init__(self, portal: BlockingPortal, session: ShellSession, *, sandbox: AsyncSandbox | None = None) -> None:
        super().__init__(portal, sandbox)
        self.async_session = session

    @property
    def portal(self) -> BlockingPortal:
        """The anyio portal this handle's calls run through (see :attr:`Sandbox.portal`)."""
        return self._portal

    @property
    def session_id(self) -> str:
        return self.async_session.session_id

    @property
    def url(self) -> str:
        """The URL of the sandbox the shell runs in."""
        return self.async_session.url

    @property
    def pid(self) -> int:
        return self.async_session.pid

    @property
    def info(self) -> ShellInfo:
        return self.async_session.info

    @property
    def closed(self) -> bool:
        return self.async_session.closed

    def start(
        self,
        command: str,
        *,
        timeout: float | None = None,
        input: str | bytes | None = None,
        kill_grace: float = 5.0,
        tags: dict[str, str] | None = None,
        stdin_open: bool = False,
        output_cap: int | None = None,
    ) -> BlockingExecRemoteProcess:
        """Start ``command`` in the shell; returns once the agent confirmed it (see the async twin).

        With ``stdin_open``, ``write_stdin()`` / ``close_stdin()`` on the returned process feed the
        command's stdin.

        :raises ShellBusyError: another run is in progress in this session.
        :raises ShellClosedError: the shell has ended.
        """
        proc = self._call(self._start, command, timeout, input, kill_grace, tags, stdin_open, output_cap)
        return BlockingExecRemoteProcess(self._portal, proc, sandbox=self._sandbox)

    async def _start(
        self,
        command: str,
        timeout: float | None,
        input: str | bytes | None,
        kill_grace: float,
        tags: dict[str, str] | None,
        stdin_open: bool,
        output_cap: int | None,
    ) -> ExecRemoteProcess:
        run = self.async_session.start(
            command,
            timeout=timeout,
            input=input,
            kill_grace=kill_grace,
            tags=tags,
            stdin_open=stdin_open,
            output_cap=output_cap,
        )
        return await run.started()

    def run(
        self, command: str, *, timeout: float | None = None, input: str | bytes | None = None, kill_grace: float = 5.0
    ) -> ExecResult:
        """Run ``command`` in the shell to its end; Ctrl-C kills the run, not the shell.

        :raises ShellBusyError: another run is in progress in this session.
        :raises ShellClosedError: the shell has ended.
        :raises ExecTimeoutError: ``timeout`` expired.
        """
        return self._interruptible(self._run, command, timeout, input, kill_grace)

    async def _run(
        self, command: str, timeout: float | None, input: str | bytes | None, kill_grace: float
    ) -> ExecResult:
        return await self.async_session.run(command, timeout=timeout, input=input, kill_grace=kill_grace)

    def interrupt(self) -> None:
        """Ctrl-C: SIGINT to the running command; the shell lives on."""
        self._call(self.async_session.interrupt)

    def refresh(self) -> ShellInfo:
        """Fetch the session's state from the agent."""
        return self._call(self.async_session.refresh)

    def close(self) -> None:
        """Kill the shell and everything still running in it, for every client."""
        self._call(self.async_session.close)

    def reattach_shell(self, session_id: str) -> BlockingShellSession:
        """A handle on another session in the same sandbox (see :meth:`ShellSession.reattach_shell`).

        :raises ShellNotFoundError: no such session (or closed long ago).
        :raises ShellClosedError: the session's shell has ended.
        """
        return BlockingShellSession(self._portal, self._portal.call(self.async_session.reattach_shell, session_id))

    def __enter__(self) -> BlockingShellSession:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return repr(self.async_session).replace("<ShellSession", "<BlockingShellSession", 1)


class BlockingPortForward(_Handle):
    """Blocking twin of :class:`~remote_exec.PortForward`, already listening when you get it.

    Its listener and tunnels run on the blocking API's event-loop thread, so they keep working
    between notebook cells and while your code blocks. ``with sb.forward_port(8000) as fwd:``
    closes it at the end of the block; or keep it (``fwd = sb.forward_port(8000)``, then
    ``IFrame(fwd.browser_url, 800, 600)``) and :meth:`close` it, or close the sandbox.
    """

    def __init__(self, portal: BlockingPortal, forward: PortForward, *, sandbox: AsyncSandbox | None = None) -> None:
        super().__init__(portal, sandbox)
        self.async_forward = forward

    @property
    def portal(self) -> BlockingPortal:
        """The anyio portal this handle's calls run through (see :attr:`Sandbox.portal`)."""
        return self._portal

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<local_port>`` (also ``str(forward)``)."""
        return self.async_forward.url

    @property
    def browser_url(self) -> str:
        """The URL for the notebook's browser: through the Jupyter server's proxy when there is one."""
        return self.async_forward.browser_url

    @property
    def local_port(self) -> int:
        return self.async_forward.local_port

    @property
    def remote_port(self) -> int:
        return self.async_forward.remote_port

    @property
    def remote_host(self) -> str:
        return self.async_forward.remote_host

    @property
    def accepted(self) -> int:
        """Connections accepted so far."""
        return self.async_forward.accepted

    @property
    def address(self) -> tuple[str, int]:
        return self.async_forward.address

    @property
    def active(self) -> int:
        return self.async_forward.active

    @property
    def closed(self) -> bool:
        return self.async_forward.closed

    @property
    def last_error(self) -> BaseException | None:
        return self.async_forward.last_error

    def connections(self) -> list[PortConnInfo]:
        """The agent's view of this forward's open connections."""
        return self._call(self.async_forward.connections)

    def close(self) -> None:
        """Stop listening and close every tunnelled connection; idempotent (also after the sandbox closed)."""
        if not self.async_forward.closed:
            self._call(self.async_forward.aclose)

    def __enter__(self) -> BlockingPortForward:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return repr(self.async_forward).replace("<PortForward", "<BlockingPortForward", 1)
