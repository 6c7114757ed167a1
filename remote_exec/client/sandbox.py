"""``AsyncSandbox``: the async face of one sandbox, over one persistent agent channel."""

from __future__ import annotations

import asyncio
import os
from abc import ABC, abstractmethod
from collections.abc import Coroutine, Sequence
from types import TracebackType
from typing import Any, Literal, Unpack, overload

import anyio

from ..errors import ExecTimeoutError, JobNotFoundError, SandboxError
from ..protocol import PROTOCOL_VERSION, Empty, FileInfo, JobInfo, ListResult, Method, ServerInfo, ShellInfo
from .channel import Channel
from .files import TEXT_LIMIT, FileClient
from .native import NativeCopy
from .ports import PortForward
from .process import RESPONSE_MARGIN, ExecRemoteProcess
from .rpc import RpcClient
from .shell import ShellSession, list_shells
from .transfer import DEFAULT_MAX_BYTES, DEFAULT_MAX_FILES, ProgressBar, TransferResult, download_tree, upload_tree
from .types import ExecRemoteOptions, ExecResult, OptionOverrides

__all__ = ["AsyncSandbox", "SandboxTransport"]


class SandboxTransport(ABC):
    """The seam every sandbox implements: how to reach its agent.

    :ivar url: the sandbox URL this transport was made from.
    """

    url: str

    @abstractmethod
    async def open_channel(self) -> Channel:
        """Make sure an agent runs in the sandbox and return a channel to it."""

    def native_copy(self) -> NativeCopy | None:
        """The transport's own copy command for big files (``None``: the agent channel only)."""
        return None

    async def aclose(self) -> None:
        """Tear down whatever the transport set up (containers, connections...)."""


class AsyncSandbox:
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
    ) -> None:
        self.transport = transport
        self.response_margin = response_margin
        self.workspace_root = workspace_root
        """Absolute path in the sandbox that the file methods stay inside (``None``: anywhere).

        Relative paths are resolved against it; ``..`` above it, an absolute path elsewhere, or
        a symlink leading out of it raise :class:`PathEscapeError`. (Jobs are not confined by it.)"""
        self._rpc: RpcClient | None = None
        self._info: ServerInfo | None = None
        self._procs: list[ExecRemoteProcess] = []
        self._forwards: set[PortForward] = set()  # started and not closed (PortForward adds itself)
        self._state: Literal["new", "open", "closed"] = "new"

    @property
    def url(self) -> str:
        return self.transport.url

    @property
    def closed(self) -> bool:
        """True once :meth:`aclose` was called (or :meth:`open` failed): the sandbox is unusable."""
        return self._state == "closed"

    @property
    def info(self) -> ServerInfo:
        """The agent's ``server_info`` as seen when the sandbox opened."""
        if self._info is None:
            raise RuntimeError("the sandbox is not open yet")
        return self._info

    async def open(self) -> AsyncSandbox:
        """Start (or find) the agent and open the channel. Called by ``async with``.

        :raises AgentUnavailableError: the agent cannot be started or reached.
        :raises SandboxError: the agent speaks another protocol version.
        """
        if self._state != "new":
            raise RuntimeError(f"this sandbox is {self._state}; open a new one with rx.open_sandbox()")
        try:
            channel = await self.transport.open_channel()
        except BaseException:
            self._state = "closed"
            with anyio.CancelScope(shield=True):
                await self.transport.aclose()  # whatever it set up before failing (a connection, a box)
            raise
        self._rpc = RpcClient(channel)
        self._state = "open"
        try:
            self._info = await self.server_info()
        except BaseException:
            await self.aclose()
            raise
        if self._info.protocol_version != PROTOCOL_VERSION:
            await self.aclose()
            raise SandboxError(
                f"agent in {self.url} speaks protocol {self._info.protocol_version}, this client {PROTOCOL_VERSION}"
            )
        return self

    def _client(self) -> RpcClient:
        if self._state != "open" or self._rpc is None:
            raise RuntimeError(f"the sandbox is {self._state}: use it inside `async with rx.open_sandbox(...)`")
        return self._rpc

    async def __aenter__(self) -> AsyncSandbox:
        return await self.open() if self._state == "new" else self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close port forwards, kill this object's running, undetached jobs; close the channel and transport.

        Idempotent. Shielded from cancellation so nothing leaks.
        """
        if self._state == "closed":
            return
        self._state = "closed"
        with anyio.CancelScope(shield=True):
            for forward in list(self._forwards):
                await forward.aclose()
            live = [p for p in self._procs if not p.done]
            if live and self._rpc is not None:
                await asyncio.gather(*(p._kill_quietly() for p in live))
            if self._rpc is not None:
                await self._rpc.channel.aclose()
            await self.transport.aclose()

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
        """
        opts = (options or ExecRemoteOptions()).merged(overrides)
        if not stream:
            return self._run(command, opts)
        return self._track(ExecRemoteProcess._launch(self._client(), command, opts, self.response_margin))

    def _track(self, proc: ExecRemoteProcess) -> ExecRemoteProcess:
        """Kill ``proc`` when this sandbox closes, unless it ended or was detached first."""
        self._procs = [p for p in self._procs if not p.done]
        self._procs.append(proc)
        return proc

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
        """Running and retained jobs in this sandbox, started by any client, oldest first."""
        return (await self._client().call(Method.EXEC_REMOTE_LIST, Empty(), ListResult)).jobs

    async def attach(self, job_id: str, options: ExecRemoteOptions | None = None) -> ExecRemoteProcess:
        """A handle on a job started elsewhere (another client, a previous kernel).

        Iterating it replays what the agent still retains from the start, then follows live.

        :raises JobNotFoundError: no such job (or it was released / expired).
        """
        for info in await self.jobs():
            if info.job_id == job_id:
                opts = (options or ExecRemoteOptions()).merged({"encoding": info.encoding})
                # Not tracked in _procs: closing this sandbox leaves a job it did not start alone.
                return ExecRemoteProcess._attach(self._client(), info, opts, self.response_margin)
        raise JobNotFoundError(f"no job {job_id} in {self.url}", job_id=job_id)

    # -- files (see client/files.py and client/transfer.py) ---------------------------------

    def _files(self) -> FileClient:
        return FileClient(self._client(), self.workspace_root, native=self.transport.native_copy())

    async def write_file(
        self, path: str, data: str | bytes, mode: int | None = None, *, mtime: float | None = None, parents: bool = True
    ) -> FileInfo:
        """Write ``data`` (a ``str`` is encoded as UTF-8) to ``path``, atomically.

        The bytes go to a temporary file beside ``path``, renamed over it once complete: a
        reader sees the old content or the new, never a part, and a failed write leaves the old
        file as it was. ``mode`` sets the permission bits (default: the replaced file's, or
        ``0o666`` less the umask for a new one); ``mtime`` the modification time (seconds);
        ``parents`` creates missing directories. Large data is sent in pipelined chunks.

        :raises RemoteIsADirectoryError: ``path`` is a directory.
        :raises RemotePermissionError: the agent may not write there.
        :raises PathEscapeError: ``path`` leads out of :attr:`workspace_root`.
        """
        raw = data.encode() if isinstance(data, str) else data
        mtime_ns = None if mtime is None else int(mtime * 1e9)
        return await self._files().write_bytes(path, raw, mode=mode, mtime_ns=mtime_ns, parents=parents)

    @overload
    async def read_file(self, path: str, text: Literal[True] = True, *, max_size: int | None = TEXT_LIMIT) -> str: ...

    @overload
    async def read_file(self, path: str, text: Literal[False], *, max_size: int | None = None) -> bytes: ...

    @overload
    async def read_file(self, path: str, text: bool, *, max_size: int | None = ...) -> str | bytes: ...

    async def read_file(self, path: str, text: bool = True, *, max_size: int | None = -1) -> str | bytes:
        """The content of ``path``: a ``str`` (UTF-8) with ``text=True``, else ``bytes``.

        A text read refuses a file over ``max_size`` bytes (64 MiB by default; ``None``: no
        limit); a bytes read has no limit unless given one. For big files, stream to disk with
        :meth:`read_file_to`.

        :raises RemoteFileNotFoundError: no such file.
        :raises RemoteIsADirectoryError: ``path`` is a directory.
        :raises RemotePermissionError: the agent may not read it.
        :raises FileTooLargeError: the file is over ``max_size``.
        :raises FileEncodingError: ``text=True`` and the file is not valid UTF-8.
        :raises PathEscapeError: ``path`` leads out of :attr:`workspace_root`.
        """
        files = self._files()
        if text:
            return await files.read_text(path, max_size=TEXT_LIMIT if max_size == -1 else max_size)
        return await files.read_bytes(path, max_size=None if max_size == -1 else max_size)

    async def read_file_to(self, path: str, local_path: str | os.PathLike[str], *, progress: bool = False) -> FileInfo:
        """Stream ``path`` into the local file ``local_path`` in bounded memory, whatever its size.

        The local file is replaced atomically and gets the remote file's mode (set-id bits
        dropped) and mtime. ``progress`` shows a tqdm bar. Returns the remote file's info.

        :raises RemoteFileNotFoundError: no such file.
        :raises RemoteIsADirectoryError: ``path`` is a directory (use :meth:`download`).
        """
        bar = ProgressBar((await self.stat(path)).size if progress else 0, f"download {path}", progress)
        try:
            return await self._files().read_to(path, local_path, progress=bar.update)
        finally:
            bar.close()

    async def write_file_from(
        self,
        local_path: str | os.PathLike[str],
        path: str,
        *,
        mode: int | None = None,
        keep_mtime: bool = True,
        parents: bool = True,
        progress: bool = False,
    ) -> FileInfo:
        """Stream the local file ``local_path`` to ``path`` in bounded memory, atomically.

        The remote file gets the local one's permission bits (unless ``mode``) and, with
        ``keep_mtime``, its mtime. ``progress`` shows a tqdm bar.

        :raises RemoteIsADirectoryError: ``path`` is a directory.
        :raises PathEscapeError: ``path`` leads out of :attr:`workspace_root`.
        """
        bar = ProgressBar(os.stat(local_path).st_size if progress else 0, f"upload {os.fspath(local_path)}", progress)
        try:
            return await self._files().write_from(
                local_path, path, mode=mode, keep_mtime=keep_mtime, parents=parents, progress=bar.update
            )
        finally:
            bar.close()

    async def list_dir(self, path: str = ".", *, recursive: bool = False, max_entries: int = 100_000) -> list[FileInfo]:
        """The entries of the directory ``path``, sorted by name (symlinks are listed, not followed).

        With ``recursive`` every entry below it, each directory's entries before its
        subdirectories' contents; ``name`` is then the path relative to ``path``.

        :raises RemoteFileNotFoundError: no such directory.
        :raises RemoteNotADirectoryError: ``path`` is a file.
        :raises FileError: more than ``max_entries`` entries.
        """
        return await self._files().list_dir(path, recursive=recursive, max_entries=max_entries)

    async def stat(self, path: str, *, follow: bool = True) -> FileInfo:
        """Type, size, mode and mtime of ``path`` (``follow=False``: of a final symlink itself).

        :raises RemoteFileNotFoundError: no such file or directory.
        """
        return await self._files().stat(path, follow=follow)

    async def exists(self, path: str) -> bool:
        """Whether ``path`` exists (a dangling symlink does not)."""
        try:
            await self._files().stat(path)
        except FileNotFoundError:
            return False
        return True

    async def remove(self, path: str, *, recursive: bool = False, missing_ok: bool = False) -> bool:
        """Remove a file, a symlink (not its target), an empty directory or, with ``recursive``,
        a tree. Returns False when nothing was there (``missing_ok``).

        :raises RemoteFileNotFoundError: nothing there and not ``missing_ok``.
        :raises FileError: a non-empty directory without ``recursive``.
        :raises RemotePermissionError: not allowed, or ``path`` is the workspace root itself.
        """
        return await self._files().remove(path, recursive=recursive, missing_ok=missing_ok)

    async def mkdir(
        self, path: str, *, parents: bool = True, exist_ok: bool = True, mode: int | None = None
    ) -> FileInfo:
        """Create the directory ``path`` (with ``parents``, its missing ancestors too).

        :raises RemoteFileExistsError: it exists and not ``exist_ok``, or a file is in the way.
        """
        return await self._files().mkdir(path, parents=parents, exist_ok=exist_ok, mode=mode)

    async def upload(
        self,
        local_dir: str | os.PathLike[str],
        remote_dir: str,
        *,
        ignore: Sequence[str] = (),
        default_ignores: bool = True,
        gitignore: bool = True,
        max_files: int | None = DEFAULT_MAX_FILES,
        max_bytes: int | None = DEFAULT_MAX_BYTES,
        progress: bool = True,
    ) -> TransferResult:
        """Copy a local project tree into ``remote_dir``; only new or changed files are sent.

        Left out: :data:`~remote_exec.client.transfer.DEFAULT_IGNORES` (``.git``,
        ``node_modules``, ``__pycache__``, ``.venv``, ``.env*`` but ``.env.example``, ``*.pem``,
        ``*.key``; ``default_ignores=False`` sends them), whatever ``.gitignore`` files in the
        tree ignore (``gitignore=False``: nothing), and ``ignore`` (gitignore patterns, which
        win: ``"!.env"`` sends ``.env``). A file is "unchanged" when its size, mode and mtime
        match the remote copy's. ``progress`` shows a tqdm bar (a widget in Jupyter).

        :raises TransferLimitError: more than ``max_files`` files or ``max_bytes`` bytes
            (``None``: no cap) would be selected; the message names the biggest offenders.
        :raises PathEscapeError: ``remote_dir`` leads out of :attr:`workspace_root`.
        """
        return await upload_tree(
            self._files(), local_dir, remote_dir, ignore=ignore, default_ignores=default_ignores,
            gitignore=gitignore, max_files=max_files, max_bytes=max_bytes, progress=progress,
        )  # fmt: skip

    async def download(
        self,
        remote_dir: str,
        local_dir: str | os.PathLike[str],
        *,
        ignore: Sequence[str] = (),
        default_ignores: bool = True,
        gitignore: bool = True,
        max_files: int | None = DEFAULT_MAX_FILES,
        max_bytes: int | None = DEFAULT_MAX_BYTES,
        progress: bool = True,
    ) -> TransferResult:
        """Copy the remote tree ``remote_dir`` into ``local_dir``; only new or changed files are
        fetched. The same ignores (``.gitignore`` files read from the sandbox) and caps as
        :meth:`upload`.

        :raises RemoteFileNotFoundError: ``remote_dir`` does not exist.
        :raises TransferLimitError: over ``max_files`` or ``max_bytes``.
        """
        return await download_tree(
            self._files(), remote_dir, local_dir, ignore=ignore, default_ignores=default_ignores,
            gitignore=gitignore, max_files=max_files, max_bytes=max_bytes, progress=progress,
        )  # fmt: skip

    # -- shell sessions (see client/shell.py) ----------------------------------------------

    async def shell(self, *, cwd: str | None = None, env: dict[str, str] | None = None) -> ShellSession:
        """Open a stateful shell session (bash, else sh) in ``cwd`` with ``env`` added.

        It outlives this sandbox handle: reattach with :meth:`reattach_shell`, end with
        ``close()``. Cancelling the open may still leave a session in the agent (it idles out).

        :raises SpawnError: the shell could not be started (e.g. no such ``cwd``).
        """
        return await ShellSession._open(self, cwd, env)

    async def reattach_shell(self, session_id: str) -> ShellSession:
        """A handle on a shell session opened elsewhere (another client, a previous kernel).

        Only looks the session up: cancelling it changes nothing in the sandbox.

        :raises ShellNotFoundError: no such session (or closed long ago).
        :raises ShellClosedError: the session's shell has ended.
        :raises AgentLostError: the session died with the agent that held it.
        """
        return await ShellSession._reattach(self, session_id)

    async def shells(self) -> list[ShellInfo]:
        """Open and recently closed shell sessions in this sandbox, oldest first (a read only)."""
        return await list_shells(self._client())

    async def server_info(self) -> ServerInfo:
        """The agent's version, protocol, pid, instance id and capabilities."""
        return await self._client().call(Method.SERVER_INFO, Empty(), ServerInfo)

    # -- port forwarding (see client/ports.py) ---------------------------------------------

    def forward_port(self, remote_port: int, local_port: int = 0, *, remote_host: str = "127.0.0.1") -> PortForward:
        """Forward ``127.0.0.1:local_port`` on the host to ``remote_host:remote_port`` in the sandbox.

        ``async with sb.forward_port(8000) as fwd:`` listens (``local_port=0``: a free port) and
        yields the :class:`PortForward`; ``fwd.url`` (and ``str(fwd)``) is
        ``http://127.0.0.1:<port>``. Each connection to it is a TCP connection the agent makes
        inside the sandbox, so this reaches servers in sandboxes without network. Only loopback
        targets are allowed unless the agent runs with ``--port-any-host``. Leaving the block
        (or closing the sandbox) closes every tunnelled connection.
        """
        return PortForward(self, remote_port, local_port, remote_host=remote_host)
