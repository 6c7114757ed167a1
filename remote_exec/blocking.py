"""The blocking twin of the async API, for scripts and plain notebook cells.

Every blocking object wraps its async original and runs it on ONE background event-loop thread
shared by all blocking sandboxes (an anyio blocking portal), so it works the same in a plain
script, inside a running event loop (a notebook cell) and where ``nest_asyncio`` was applied.
Methods are one-liners around ``portal.call``; nothing here is generated at run time.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future
from types import TracebackType
from typing import Any, Literal, TypeVar, Unpack, overload

from anyio.from_thread import BlockingPortal, BlockingPortalProvider

from .client.process import ExecRemoteProcess
from .client.sandbox import AsyncSandbox
from .client.shell import ShellSession
from .client.types import ExecRemoteEvent, ExecRemoteOptions, ExecResult, OptionOverrides
from .protocol import JobInfo, ServerInfo, ShellInfo
from .sandboxes import open_sandbox

__all__ = ["BlockingExecRemoteProcess", "BlockingShellSession", "Sandbox", "connect"]

T = TypeVar("T")
_provider = BlockingPortalProvider(backend="asyncio")
_provider_lock = threading.Lock()


def _interruptible(portal: BlockingPortal, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
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


class BlockingExecRemoteProcess:
    """Blocking twin of :class:`~remote_exec.ExecRemoteProcess`; iterate it for events.

    Ctrl-C (``KeyboardInterrupt``) while iterating or waiting kills the job, as cancelling the
    async iteration does.
    """

    def __init__(self, portal: BlockingPortal, proc: ExecRemoteProcess) -> None:
        self._portal = portal
        self.async_process = proc

    @property
    def job_id(self) -> str | None:
        return self.async_process.job_id

    @property
    def pid(self) -> int | None:
        return self.async_process.pid

    @property
    def returncode(self) -> int | None:
        return self.async_process.returncode

    @property
    def done(self) -> bool:
        return self.async_process.done

    @property
    def events(self) -> Iterator[ExecRemoteEvent]:
        return self

    def __iter__(self) -> Iterator[ExecRemoteEvent]:
        return self

    def __next__(self) -> ExecRemoteEvent:
        try:
            return _interruptible(self._portal, self.async_process.__anext__)
        except StopAsyncIteration:
            raise StopIteration from None

    def wait(self) -> ExecResult:
        """Run to the end and return the result (see the async ``wait``)."""
        return _interruptible(self._portal, self.async_process.wait)

    def write_stdin(self, data: str | bytes) -> None:
        self._portal.call(self.async_process.write_stdin, data)

    def close_stdin(self) -> None:
        self._portal.call(self.async_process.close_stdin)

    def signal(self, sig: int | str) -> None:
        self._portal.call(self.async_process.signal, sig)

    def kill(self, grace: float | None = None) -> None:
        self._portal.call(self.async_process.kill, grace)

    def release(self) -> None:
        self._portal.call(self.async_process.release)

    def detach(self) -> str | None:
        return self.async_process.detach()

    def __repr__(self) -> str:
        return repr(self.async_process).replace("<ExecRemoteProcess", "<BlockingExecRemoteProcess", 1)


class BlockingShellSession:
    """Blocking twin of :class:`~remote_exec.ShellSession`: ``with sb.shell() as sh``.

    Ctrl-C (``KeyboardInterrupt``) during :meth:`run` kills the run (SIGINT, then SIGKILL after
    ``kill_grace``), as cancelling the async ``run()`` does; the shell survives.
    """

    def __init__(self, portal: BlockingPortal, session: ShellSession) -> None:
        self._portal = portal
        self.async_session = session

    @property
    def session_id(self) -> str:
        return self.async_session.session_id

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
        self, command: str, *, timeout: float | None = None, input: str | bytes | None = None, kill_grace: float = 5.0
    ) -> BlockingExecRemoteProcess:
        """Start ``command`` in the shell; returns once the agent confirmed it (see the async twin).

        :raises ShellBusyError: another run is in progress in this session.
        :raises ShellClosedError: the shell has ended.
        """
        proc = self._portal.call(self._start, command, timeout, input, kill_grace)
        return BlockingExecRemoteProcess(self._portal, proc)

    async def _start(
        self, command: str, timeout: float | None, input: str | bytes | None, kill_grace: float
    ) -> ExecRemoteProcess:
        return await self.async_session.start(command, timeout=timeout, input=input, kill_grace=kill_grace).started()

    def run(
        self, command: str, *, timeout: float | None = None, input: str | bytes | None = None, kill_grace: float = 5.0
    ) -> ExecResult:
        """Run ``command`` in the shell to its end; Ctrl-C kills the run, not the shell.

        :raises ShellBusyError: another run is in progress in this session.
        :raises ShellClosedError: the shell has ended.
        :raises ExecTimeoutError: ``timeout`` expired.
        """
        return _interruptible(self._portal, self._run, command, timeout, input, kill_grace)

    async def _run(
        self, command: str, timeout: float | None, input: str | bytes | None, kill_grace: float
    ) -> ExecResult:
        return await self.async_session.run(command, timeout=timeout, input=input, kill_grace=kill_grace)

    def interrupt(self) -> None:
        """Ctrl-C: SIGINT to the running command; the shell lives on."""
        self._portal.call(self.async_session.interrupt)

    def refresh(self) -> ShellInfo:
        """Fetch the session's state from the agent."""
        return self._portal.call(self.async_session.refresh)

    def close(self) -> None:
        """Kill the shell and everything still running in it, for every client."""
        self._portal.call(self.async_session.close)

    def __enter__(self) -> BlockingShellSession:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return repr(self.async_session).replace("<ShellSession", "<BlockingShellSession", 1)


class Sandbox:
    """Blocking twin of :class:`~remote_exec.AsyncSandbox`: ``with rx.connect(url) as sb``."""

    def __init__(self, url: str = "local://", *, response_margin: float | None = None) -> None:
        with _provider_lock:
            self._portal = _provider.__enter__()  # a lease on the shared loop thread
        self._closed = False
        try:
            self.async_sandbox: AsyncSandbox = self._portal.call(self._open, url, response_margin)
        except BaseException:
            self._release_portal()
            raise

    @staticmethod
    async def _open(url: str, response_margin: float | None) -> AsyncSandbox:
        return await open_sandbox(url, response_margin=response_margin)

    def _release_portal(self) -> None:
        with _provider_lock:
            _provider.__exit__(None, None, None)

    def _call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        if self._closed:
            raise RuntimeError("this sandbox is closed; open a new one with rx.connect()")
        return self._portal.call(fn, *args)

    @property
    def url(self) -> str:
        return self.async_sandbox.url

    @property
    def info(self) -> ServerInfo:
        return self.async_sandbox.info

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the sandbox (see :meth:`AsyncSandbox.aclose`); idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._portal.call(self.async_sandbox.aclose)
        finally:
            self._release_portal()

    @overload
    def exec_remote(
        self,
        command: list[str] | str,
        options: ExecRemoteOptions | None = None,
        *,
        stream: Literal[True] = True,
        **overrides: Unpack[OptionOverrides],
    ) -> BlockingExecRemoteProcess: ...

    @overload
    def exec_remote(
        self,
        command: list[str] | str,
        options: ExecRemoteOptions | None = None,
        *,
        stream: Literal[False],
        **overrides: Unpack[OptionOverrides],
    ) -> ExecResult: ...

    def exec_remote(
        self,
        command: list[str] | str,
        options: ExecRemoteOptions | None = None,
        *,
        stream: bool = True,
        **overrides: Unpack[OptionOverrides],
    ) -> BlockingExecRemoteProcess | ExecResult:
        """Start ``command``; returns once the agent confirmed the start (see the async twin).

        :raises SpawnError: the command could not be started.
        """
        if not stream:
            return self.run(command, options, **overrides)
        proc: ExecRemoteProcess = self._call(self._start, command, options, overrides)
        return BlockingExecRemoteProcess(self._portal, proc)

    async def _start(
        self, command: list[str] | str, options: ExecRemoteOptions | None, overrides: OptionOverrides
    ) -> ExecRemoteProcess:
        return await self.async_sandbox.exec_remote(command, options, **overrides).started()

    def run(
        self, command: list[str] | str, options: ExecRemoteOptions | None = None, **overrides: Unpack[OptionOverrides]
    ) -> ExecResult:
        """Run ``command`` to the end; Ctrl-C kills the job.

        :raises ExecTimeoutError: the timeout expired.
        :raises SpawnError: the command could not be started.
        """
        if self._closed:
            raise RuntimeError("this sandbox is closed; open a new one with rx.connect()")
        return _interruptible(self._portal, self._run, command, options, overrides)

    async def _run(
        self, command: list[str] | str, options: ExecRemoteOptions | None, overrides: OptionOverrides
    ) -> ExecResult:
        return await self.async_sandbox.run(command, options, **overrides)

    def jobs(self) -> list[JobInfo]:
        """Running and retained jobs in this sandbox, started by any client."""
        return self._call(self.async_sandbox.jobs)

    def attach(self, job_id: str, options: ExecRemoteOptions | None = None) -> BlockingExecRemoteProcess:
        """A handle on a job started elsewhere; iterating replays retained output, then follows.

        :raises JobNotFoundError: no such job.
        """
        proc = self._call(self.async_sandbox.attach, job_id, options)
        return BlockingExecRemoteProcess(self._portal, proc)

    def shell(self, *, cwd: str | None = None, env: dict[str, str] | None = None) -> BlockingShellSession:
        """Open a stateful shell session (see :meth:`AsyncSandbox.shell`).

        :raises SpawnError: the shell could not be started.
        """
        session = self._call(self._shell, cwd, env)
        return BlockingShellSession(self._portal, session)

    async def _shell(self, cwd: str | None, env: dict[str, str] | None) -> ShellSession:
        return await self.async_sandbox.shell(cwd=cwd, env=env)

    def reattach_shell(self, session_id: str) -> BlockingShellSession:
        """A handle on a shell session opened elsewhere (another client, a previous kernel).

        :raises ShellNotFoundError: no such session.
        :raises ShellClosedError: the session's shell has ended.
        """
        return BlockingShellSession(self._portal, self._call(self.async_sandbox.reattach_shell, session_id))

    def shells(self) -> list[ShellInfo]:
        """Open and recently closed shell sessions in this sandbox."""
        return self._call(self.async_sandbox.shells)

    def server_info(self) -> ServerInfo:
        return self._call(self.async_sandbox.server_info)


def connect(url: str = "local://", *, response_margin: float | None = None) -> Sandbox:
    """Open the sandbox at ``url`` with the blocking API: ``with rx.connect(url) as sb``.

    :raises SandboxError: bad URL or unknown scheme.
    :raises AgentUnavailableError: the agent cannot be started or reached.
    """
    return Sandbox(url, response_margin=response_margin)
