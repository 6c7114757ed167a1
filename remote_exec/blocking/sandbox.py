"""The blocking twin of the async API, for scripts and plain notebook cells.

Every blocking object wraps its async original and runs it on ONE background event-loop thread
shared by all blocking sandboxes (an anyio blocking portal), so it works the same in a plain
script, inside a running event loop (a notebook cell) and where ``nest_asyncio`` was applied.
Methods are one-liners around ``portal.call``; nothing here is generated at run time.
"""

from __future__ import annotations

import functools
import threading
from types import TracebackType
from typing import Literal, TypeVar, Unpack, overload

from anyio.from_thread import BlockingPortal, BlockingPortalProvider

from ..client.channel import Liveness
from ..client.link import Link
from ..client.logs import OutputSlice, Stream
from ..client.process import ExecRemoteProcess
from ..client.sandbox import AsyncSandbox
from ..client.shell import ShellSession
from ..client.types import ExecRemoteOptions, ExecResult, OptionOverrides
from ..protocol import DEFAULT_MAX_BYTES as READ_BYTES
from ..protocol import JobInfo, JobStats, PruneResult, SandboxStats, ServerInfo, ShellInfo
from ..sandboxes import open_sandbox
from .handles import BlockingExecRemoteProcess, BlockingPortForward, BlockingShellSession, interruptible
from .sandbox_files import BlockingSandboxFiles

__all__ = [
    "BlockingExecRemoteProcess",
    "BlockingPortForward",
    "BlockingShellSession",
    "Sandbox",
    "borrowing",
    "connect",
]

T = TypeVar("T")
_provider = BlockingPortalProvider(backend="asyncio")
_provider_lock = threading.Lock()


def lease_portal() -> BlockingPortal:
    """A lease on the blocking API's shared event-loop thread (started by the first lease)."""
    with _provider_lock:
        return _provider.__enter__()


def release_portal() -> None:
    """Give back a lease taken with :func:`lease_portal` (the last one stops the thread)."""
    with _provider_lock:
        _provider.__exit__(None, None, None)


class Sandbox(BlockingSandboxFiles):
    """Blocking twin of :class:`~remote_exec.AsyncSandbox`: ``with rx.connect(url) as sb``."""

    def __init__(
        self,
        url: str = "local://",
        *,
        response_margin: float | None = None,
        workspace_root: str | None = None,
        open_timeout: float | None = None,
        liveness: float | Liveness | None = None,
    ) -> None:
        portal = lease_portal()
        self._owns_lease = True
        opener = functools.partial(
            open_sandbox,
            url,
            response_margin=response_margin,
            workspace_root=workspace_root,
            open_timeout=open_timeout,
            liveness=liveness,
        )
        try:
            async_sandbox: AsyncSandbox = portal.call(opener)  # the portal awaits what it returns
        except BaseException:
            release_portal()
            raise
        super().__init__(portal, async_sandbox)

    def _release_portal(self) -> None:
        if self._owns_lease:
            release_portal()

    @property
    def portal(self) -> BlockingPortal:
        """The anyio portal this sandbox's calls run through (one event-loop thread shared by the
        blocking objects): ``sb.portal.call(fn, ...)`` runs ``fn`` on it, as async code that
        drives :attr:`async_sandbox` or its handles must."""
        return self._portal

    @property
    def info(self) -> ServerInfo:
        return self.async_sandbox.info

    @property
    def link(self) -> Link:
        """The agent channel's state with change events (see :attr:`AsyncSandbox.link`); listeners
        run on the background loop thread, reading ``link.status`` is safe from any thread."""
        return self.async_sandbox.link

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called (or its pool closed it): the sandbox is unusable."""
        return self._closed or self.async_sandbox.closed

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
        return BlockingExecRemoteProcess(self._portal, proc, sandbox=self.async_sandbox)

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
        self._check_open()
        return interruptible(self._portal, self._run, command, options, overrides)

    async def _run(
        self, command: list[str] | str, options: ExecRemoteOptions | None, overrides: OptionOverrides
    ) -> ExecResult:
        return await self.async_sandbox.run(command, options, **overrides)

    def jobs(self) -> list[JobInfo]:
        """Running and retained jobs in this sandbox, started by any client."""
        return self._call(self.async_sandbox.jobs)

    def attach(
        self, job_id: str, options: ExecRemoteOptions | None = None, *, offsets: tuple[int, int] | None = None
    ) -> BlockingExecRemoteProcess:
        """A handle on a job started elsewhere; iterating replays retained output (or goes on
        from ``offsets``), then follows (see the async twin).

        :raises JobNotFoundError: no such job.
        """
        proc = self._call(functools.partial(self.async_sandbox.attach, offsets=offsets), job_id, options)
        return BlockingExecRemoteProcess(self._portal, proc, sandbox=self.async_sandbox)

    def read_output(
        self,
        job_id: str,
        stream: Stream = "stdout",
        *,
        offset: int = 0,
        max_bytes: int = READ_BYTES,
        since: float | None = None,
    ) -> OutputSlice:
        """Up to ``max_bytes`` of a job's ``stream`` from byte ``offset``, or from wall time
        ``since`` (see the async twin)."""
        read = functools.partial(self.async_sandbox.read_output, offset=offset, max_bytes=max_bytes, since=since)
        return self._call(read, job_id, stream)

    def tail_output(self, job_id: str, n_bytes: int, stream: Stream = "stdout") -> OutputSlice:
        """The last ``n_bytes`` of a job's ``stream``."""
        return self._call(self.async_sandbox.tail_output, job_id, n_bytes, stream)

    def forget(self, job_id: str) -> None:
        """Forget an ended job, its record and logs (a running one is refused)."""
        self._call(self.async_sandbox.forget, job_id)

    def prune(self, *, older_than: float | None = None, keep: int | None = None) -> PruneResult:
        """Forget ended jobs over ``older_than`` seconds old or beyond the newest ``keep``."""
        return self._call(functools.partial(self.async_sandbox.prune, older_than=older_than, keep=keep))

    def shell(self, *, cwd: str | None = None, env: dict[str, str] | None = None) -> BlockingShellSession:
        """Open a stateful shell session (see :meth:`AsyncSandbox.shell`).

        :raises SpawnError: the shell could not be started.
        """
        session = self._call(self._shell, cwd, env)
        return BlockingShellSession(self._portal, session, sandbox=self.async_sandbox)

    async def _shell(self, cwd: str | None, env: dict[str, str] | None) -> ShellSession:
        return await self.async_sandbox.shell(cwd=cwd, env=env)

    def reattach_shell(self, session_id: str) -> BlockingShellSession:
        """A handle on a shell session opened elsewhere (another client, a previous kernel).

        :raises ShellNotFoundError: no such session.
        :raises ShellClosedError: the session's shell has ended.
        """
        return BlockingShellSession(
            self._portal, self._call(self.async_sandbox.reattach_shell, session_id), sandbox=self.async_sandbox
        )

    def shells(self) -> list[ShellInfo]:
        """Open and recently closed shell sessions in this sandbox."""
        return self._call(self.async_sandbox.shells)

    def server_info(self) -> ServerInfo:
        return self._call(self.async_sandbox.server_info)

    def stats(self, *, window: float = 0.5) -> SandboxStats:
        """CPU and memory of the sandbox, disk use of its workspace and the agent's state dir."""
        return self._call(functools.partial(self.async_sandbox.stats, window=window))

    def job_stats(self, job_id: str, *, window: float = 0.5) -> JobStats:
        """CPU %, RSS, threads, I/O and process count of a job's whole process tree."""
        return self._call(functools.partial(self.async_sandbox.job_stats, job_id, window=window))

    def job_stats_many(self, job_ids: list[str], *, window: float = 0.5) -> dict[str, JobStats]:
        """:meth:`job_stats` of many jobs in one call; unknown jobs are left out."""
        return self._call(functools.partial(self.async_sandbox.job_stats_many, job_ids, window=window))

    def forward_port(
        self, remote_port: int, local_port: int = 0, *, remote_host: str = "127.0.0.1"
    ) -> BlockingPortForward:
        """Forward ``127.0.0.1:local_port`` to ``remote_host:remote_port`` in the sandbox, listening at once.

        See :meth:`AsyncSandbox.forward_port`; use it as ``with sb.forward_port(8000) as fwd``
        or keep it open across notebook cells and :meth:`BlockingPortForward.close` it.

        :raises OSError: the local port cannot be bound.
        :raises SandboxError: the sandbox's agent cannot forward ports.
        """
        forward = self.async_sandbox.forward_port(remote_port, local_port, remote_host=remote_host)
        return BlockingPortForward(self._portal, self._call(forward.start), sandbox=self.async_sandbox)


def connect(
    url: str = "local://",
    *,
    response_margin: float | None = None,
    workspace_root: str | None = None,
    open_timeout: float | None = None,
    liveness: float | Liveness | None = None,
) -> Sandbox:
    """Open the sandbox at ``url`` with the blocking API: ``with rx.connect(url) as sb``.

    The keywords are :func:`~remote_exec.open_sandbox`'s: ``workspace_root`` confines the file
    methods (see :attr:`AsyncSandbox.workspace_root`); ``open_timeout`` and ``liveness`` bound
    how long an agent may take to answer at all, and how long a silent one goes unnoticed.

    :raises SandboxError: bad URL or unknown scheme.
    :raises AgentUnavailableError: the agent cannot be started or reached.
    """
    return Sandbox(
        url,
        response_margin=response_margin,
        workspace_root=workspace_root,
        open_timeout=open_timeout,
        liveness=liveness,
    )


def borrowing(async_sandbox: AsyncSandbox, portal: BlockingPortal) -> Sandbox:
    """A blocking face for a sandbox someone else opened (a pool), on that owner's portal lease."""
    face = Sandbox.__new__(Sandbox)
    face._portal, face._owns_lease, face._closed = portal, False, False
    face.async_sandbox = async_sandbox
    return face
