"""``AsyncSandbox``: the async face of one sandbox, over one persistent agent channel."""

from __future__ import annotations

from collections.abc import Coroutine
from types import TracebackType
from typing import Any, Literal, Unpack, overload

from ..errors import ExecTimeoutError, JobNotFoundError, ProtocolError
from ..protocol import (
    DEFAULT_MAX_BYTES,
    Empty,
    JobIdParams,
    JobInfo,
    JobStats,
    JobStatsMany,
    JobStatsManyParams,
    JobStatsParams,
    ListParams,
    ListResult,
    Method,
    PruneResult,
    SandboxStats,
    SandboxStatsParams,
    ServerInfo,
    ShellInfo,
)
from ..protocol.names import asked_job_id
from .channel import DEFAULT_LIVENESS, Liveness
from .core import OPEN_TIMEOUT, SandboxCore
from .link import Link
from .logs import OutputSlice, Stream, prune_jobs, read_output
from .ports import PortForward
from .process import RESPONSE_MARGIN, ExecRemoteProcess, attached, launch
from .sandbox_files import SandboxFiles
from .shell import ShellSession, list_shells, open_shell, reattach_shell
from .transport import SandboxTransport
from .types import ExecRemoteOptions, ExecResult, OptionOverrides

__all__ = ["MAX_JOBS_LISTED", "OPEN_TIMEOUT", "AsyncSandbox"]

MAX_JOBS_LISTED = 100_000
"""Most jobs :meth:`AsyncSandbox.jobs` gathers, page after page (an agent keeps far fewer)."""


class AsyncSandbox(SandboxFiles):
    """A sandbox with an agent in it. Use ``async with rx.open_sandbox(url) as sb``.

    Closing the sandbox kills the jobs this object started that still run and were not
    detached (:meth:`ExecRemoteProcess.detach`); other jobs, and the agent, live on.
    """

    def __init__(
        self,
        transport: SandboxTransport,
        *,
        response_margin: float = RESPONSE_MARGIN,
        workspace_root: str | None = None,
        open_timeout: float = OPEN_TIMEOUT,
        liveness: Liveness | None = DEFAULT_LIVENESS,
    ) -> None:
        self.transport = transport
        core = SandboxCore(transport, response_margin=response_margin, open_timeout=open_timeout, liveness=liveness)
        super().__init__(core, workspace_root)

    @property
    def liveness(self) -> Liveness | None:
        """How fast a silent agent is noticed (``None``: by the call deadlines alone); see
        :class:`~remote_exec.client.channel.Liveness`."""
        return self._core.liveness

    @property
    def link(self) -> Link:
        """The agent channel's state (connected, reconnecting, lost, gone...) with change
        events, for views: see :class:`~remote_exec.client.link.Link`."""
        return self._core.link

    @property
    def response_margin(self) -> float:
        """Seconds an answer may lag a long-poll's wait before it is asked again (the core's)."""
        return self._core.response_margin

    @property
    def open_timeout(self) -> float:
        """Seconds the agent has to answer ``server_info`` when the sandbox opens (the core's)."""
        return self._core.open_timeout

    @property
    def url(self) -> str:
        return self.transport.url

    @property
    def closed(self) -> bool:
        """True once :meth:`aclose` was called (or :meth:`open` failed): the sandbox is unusable."""
        return self._core.state == "closed"

    @property
    def info(self) -> ServerInfo:
        """The agent's ``server_info`` as seen when the sandbox opened."""
        return self._core.info

    async def open(self) -> AsyncSandbox:
        """Start (or find) the agent and open the channel. Called by ``async with``.

        Setting the transport up (a container, an SSH connection, the agent's start) takes what
        it takes; then the agent has ``open_timeout`` seconds to answer ``server_info``.
        Cancelling the open closes whatever it had set up.

        :raises AgentUnavailableError: the agent cannot be started or reached, or did not answer
            within ``open_timeout``.
        :raises SandboxError: the agent speaks another protocol version.
        """
        await self._core.open()
        return self

    async def __aenter__(self) -> AsyncSandbox:
        return await self.open() if self._core.state == "new" else self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close port forwards, kill this object's running, undetached jobs; close the channel and transport.

        Idempotent. Shielded from cancellation so nothing leaks.
        """
        await self._core.aclose()

    # -- jobs -----------------------------------------------------------------------------

    @overload
    def exec_remote(
        self,
        command: list[str] | str,
        options: ExecRemoteOptions | None = None,
        *,
        stream: Literal[True] = True,
        **overrides: Unpack[OptionOverrides],
    ) -> ExecRemoteProcess: ...

    @overload
    def exec_remote(
        self,
        command: list[str] | str,
        options: ExecRemoteOptions | None = None,
        *,
        stream: Literal[False],
        **overrides: Unpack[OptionOverrides],
    ) -> Coroutine[Any, Any, ExecResult]: ...

    def exec_remote(
        self,
        command: list[str] | str,
        options: ExecRemoteOptions | None = None,
        *,
        stream: bool = True,
        **overrides: Unpack[OptionOverrides],
    ) -> ExecRemoteProcess | Coroutine[Any, Any, ExecResult]:
        """Start ``command`` in the sandbox.

        A list runs directly; a string runs under ``/bin/sh -c``. With ``stream=True`` (the
        default) the job starts at once and the process handle is returned without awaiting;
        with ``stream=False`` this returns a coroutine: ``await`` it for the :class:`ExecResult`.
        Options come from ``options`` and/or keywords (``timeout=5``, ``cwd="/tmp"``...).
        Without ``cwd`` the job runs in the sandbox's default directory: on ``local://`` this
        process's working directory at the call (a notebook's folder), elsewhere the agent's own.

        Cancelling the awaited ``stream=False`` coroutine kills the job, as :meth:`run` does; a
        streamed handle follows :class:`ExecRemoteProcess`'s rules (cancelling its iteration or
        ``wait()`` kills the job).
        """
        opts = self._located((options or ExecRemoteOptions()).merged(overrides))
        if not stream:
            return self._run(command, opts)
        return self._core.track(launch(self._core.rpc, command, opts, self._core.response_margin))

    def _located(self, opts: ExecRemoteOptions) -> ExecRemoteOptions:
        """``opts`` with the transport's default directory when they name none (see exec_remote)."""
        if opts.cwd is not None:
            return opts
        cwd = self.transport.default_cwd()
        return opts if cwd is None else opts.merged({"cwd": cwd})

    async def run(
        self, command: list[str] | str, options: ExecRemoteOptions | None = None, **overrides: Unpack[OptionOverrides]
    ) -> ExecResult:
        """Run ``command`` to the end: ``exec_remote(command, stream=False)``.

        Cancelling ``run()`` kills the job.

        :raises ExecTimeoutError: the timeout expired (on the last try, with ``timeout_retry``).
        :raises SpawnError: the command could not be started.
        """
        return await self._run(command, (options or ExecRemoteOptions()).merged(overrides))

    async def _run(self, command: list[str] | str, opts: ExecRemoteOptions) -> ExecResult:
        timeouts: list[float | None] = [opts.timeout]
        if opts.timeout_retry and opts.timeout is not None:
            timeouts += [min(opts.timeout, 60.0), min(opts.timeout, 30.0)]
        for i, timeout in enumerate(timeouts):
            proc = self.exec_remote(command, opts.merged({"timeout": timeout}))
            try:
                return await proc.wait()
            except ExecTimeoutError:
                if i == len(timeouts) - 1:
                    raise
        raise AssertionError("unreachable")

    async def jobs(self) -> list[JobInfo]:
        """Running and retained jobs in this sandbox, started by any client, oldest first.

        They come in pages; each must follow the last. Cancelling it abandons the listing;
        nothing changes in the sandbox.

        :raises ProtocolError: a page that does not follow, or more than :data:`MAX_JOBS_LISTED`.
        """
        jobs: list[JobInfo] = []
        after: str | None = None
        while True:
            page = await self._core.rpc.call(Method.EXEC_REMOTE_LIST, ListParams(after=after), ListResult)
            jobs += page.jobs
            if page.next is None:
                return jobs
            if not page.jobs or page.next != page.jobs[-1].job_id or len(jobs) > MAX_JOBS_LISTED:
                raise ProtocolError(f"{self.url}: a job listing that does not end ({len(jobs)} jobs so far)")
            after = page.next

    async def attach(
        self, job_id: str, options: ExecRemoteOptions | None = None, *, offsets: tuple[int, int] | None = None
    ) -> ExecRemoteProcess:
        """A handle on a job started elsewhere (another client, a previous kernel).

        Iterating it replays what the agent still retains from the start, then follows live;
        with ``offsets`` (stdout's, stderr's: byte cursors, e.g. the ends of what
        :meth:`read_output` gave) it goes on from there instead. Its output is text as the job's
        encoding says, or bytes when ``options`` ask ``encoding="base64"``.
        Cancelling ``attach()`` leaves the job as it was (it only reads the job list).

        :raises JobNotFoundError: no such job (or it was released / expired).
        :raises InvalidParamsError: ``job_id`` is not of the job id form (no job has it).
        """
        asked_job_id(job_id)
        for info in await self.jobs():
            if info.job_id == job_id:
                size = None if info.tty_size is None else (info.tty_size.cols, info.tty_size.rows)
                encoding = "base64" if options is not None and options.encoding == "base64" else info.encoding
                facts: OptionOverrides = {"encoding": encoding, "tty": info.tty, "tty_size": size}
                opts = (options or ExecRemoteOptions()).merged(facts)
                # Not tracked: closing this sandbox leaves a job it did not start alone.
                return attached(self._core.rpc, info, opts, self._core.response_margin, offsets)
        raise JobNotFoundError(f"no job {job_id} in {self.url}", job_id=job_id)

    # -- logs and retention (see client/logs.py) -------------------------------------------

    async def read_output(
        self,
        job_id: str,
        stream: Stream = "stdout",
        *,
        offset: int = 0,
        max_bytes: int = DEFAULT_MAX_BYTES,
        since: float | None = None,
    ) -> OutputSlice:
        """Up to ``max_bytes`` of a job's ``stream`` from byte ``offset``, moving no cursor; with
        ``since`` (a wall-clock time, as :func:`time.time`), from where the bytes written at or
        after it begin instead (to the second: up to a second's bytes before it come too).

        Cancelling abandons the read.

        :raises JobNotFoundError: no such job (or it was forgotten).
        :raises InvalidParamsError: ``job_id`` is not of the job id form (no job has it).
        :raises InvalidParamsError: ``offset`` is past the end of the stream.
        """
        job_id = asked_job_id(job_id)
        return await read_output(self._core.rpc, job_id, stream, offset=offset, max_bytes=max_bytes, since=since)

    async def tail_output(self, job_id: str, n_bytes: int, stream: Stream = "stdout") -> OutputSlice:
        """The last ``n_bytes`` (at most 64 MiB) of a job's ``stream``. Cancelling abandons the read.

        :raises JobNotFoundError: no such job (or it was forgotten).
        :raises InvalidParamsError: ``job_id`` is not of the job id form (no job has it).
        """
        return await read_output(self._core.rpc, asked_job_id(job_id), stream, tail=n_bytes, max_bytes=max(1, n_bytes))

    async def forget(self, job_id: str) -> None:
        """Forget an ended job: its record and its logs are removed from the sandbox.

        Cancelling it drops the answer; the agent may still have forgotten the job.

        :raises JobNotFoundError: no such job.
        :raises InvalidParamsError: ``job_id`` is not of the job id form (no job has it).
        :raises InvalidParamsError: the job is still running (kill it first).
        """
        await self._core.rpc.call(Method.EXEC_REMOTE_FORGET, JobIdParams(job_id=asked_job_id(job_id)), Empty)

    async def prune(self, *, older_than: float | None = None, keep: int | None = None) -> PruneResult:
        """Forget ended jobs that ended over ``older_than`` seconds ago or beyond the newest
        ``keep``; running jobs stay. Returns how many went (and their ids, up to a page).
        Cancelling it drops the answer; the agent may still have pruned."""
        return await prune_jobs(self._core.rpc, older_than, keep)

    # -- shell sessions (see client/shell.py) ----------------------------------------------

    async def shell(self, *, cwd: str | None = None, env: dict[str, str] | None = None) -> ShellSession:
        """Open a stateful shell session (bash, else sh) in ``cwd`` with ``env`` added. Without
        ``cwd``: as :meth:`exec_remote` (on ``local://`` this process's working directory).

        It outlives this sandbox handle: reattach with :meth:`reattach_shell`, end with
        ``close()``. Cancelling the open may still leave a session in the agent (it idles out).

        :raises SpawnError: the shell could not be started (e.g. no such ``cwd``).
        """
        return await open_shell(self._core, cwd if cwd is not None else self.transport.default_cwd(), env)

    async def reattach_shell(self, session_id: str) -> ShellSession:
        """A handle on a shell session opened elsewhere (another client, a previous kernel).

        Only looks the session up: cancelling it changes nothing in the sandbox.

        :raises ShellNotFoundError: no such session (or closed long ago).
        :raises ShellClosedError: the session's shell has ended.
        :raises AgentLostError: the session died with the agent that held it.
        """
        return await reattach_shell(self._core, asked_job_id(session_id))

    async def shells(self) -> list[ShellInfo]:
        """Open and recently closed shell sessions in this sandbox, oldest first (a read only).

        Cancelling it abandons the listing; nothing changes in the sandbox.
        """
        return await list_shells(self._core.rpc)

    async def server_info(self) -> ServerInfo:
        """The agent's version, protocol, pid, instance id and capabilities.

        Cancelling it abandons the answer; nothing changes in the sandbox.
        """
        return await self._core.rpc.call(Method.SERVER_INFO, Empty(), ServerInfo)

    # -- resource use (the agent reads /proc only when asked: see agent/metrics.py) ----------

    async def stats(self, *, window: float = 0.5) -> SandboxStats:
        """CPU and memory of the sandbox, disk use of its workspace and of the agent's state dir.

        The CPU rate is since the previous ``stats()`` (of any client) if that was within 30 s,
        else measured over ``window`` seconds (at most 5) first. Only reads: cancelling it
        changes nothing.
        """
        params = SandboxStatsParams(workspace=self.workspace_root, window=window)
        return await self._core.rpc.call(Method.SANDBOX_STATS, params, SandboxStats)

    async def job_stats(self, job_id: str, *, window: float = 0.5) -> JobStats:
        """CPU %, RSS, threads, I/O bytes and process count of a job's whole process tree.

        The CPU rate is since the previous reading of this job if within 30 s, else measured
        over ``window`` seconds first. Only reads: cancelling it changes nothing.

        :raises JobNotFoundError: no such job (or it was released / expired).
        :raises InvalidParamsError: ``job_id`` is not of the job id form (no job has it).
        """
        return await self._core.rpc.call(
            Method.JOB_STATS, JobStatsParams(job_id=asked_job_id(job_id), window=window), JobStats
        )

    async def job_stats_many(self, job_ids: list[str], *, window: float = 0.5) -> dict[str, JobStats]:
        """:meth:`job_stats` of many jobs in one call (one walk of ``/proc`` in the agent): what
        a dashboard watching many jobs asks each second. Jobs the agent does not know (released,
        expired) are left out; at most 1000 ids per call.

        Only reads: cancelling it changes nothing.

        :raises ProtocolError: the agent answered about a job that was not asked for.
        """
        if not job_ids:
            return {}
        params = JobStatsManyParams(job_ids=[asked_job_id(j) for j in job_ids], window=window)
        answer = await self._core.rpc.call(Method.JOB_STATS_MANY, params, JobStatsMany)
        asked = set(job_ids)
        stats = {s.job_id: s for s in answer.stats}
        if not stats.keys() <= asked:
            raise ProtocolError(f"{self.url}: job_stats_many answered about jobs not asked for")
        return stats

    # -- port forwarding (see client/ports.py) ---------------------------------------------

    def forward_port(self, remote_port: int, local_port: int = 0, *, remote_host: str = "127.0.0.1") -> PortForward:
        """Forward ``127.0.0.1:local_port`` on the host to ``remote_host:remote_port`` in the sandbox.

        ``async with sb.forward_port(8000) as fwd:`` listens (``local_port=0``: a free port) and
        yields the :class:`PortForward`; ``fwd.url`` (and ``str(fwd)``) is
        ``http://127.0.0.1:<port>``. Each connection to it is a TCP connection the agent makes
        inside the sandbox, so this reaches servers in sandboxes without network. Only loopback
        targets are allowed unless the agent runs with ``--port-any-host``. Leaving the block
        (or closing the sandbox) closes every tunnelled connection.

        Cancelling the task inside the block leaves it the same way: the listener stops and every
        tunnelled connection is closed at both ends, here and by the agent (shielded, a few
        seconds at most if the agent does not answer), before the cancellation propagates. The
        server in the sandbox is not touched.
        """
        return PortForward(self._core, remote_port, local_port, remote_host=remote_host)
