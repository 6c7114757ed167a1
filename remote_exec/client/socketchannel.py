"""``SocketChannel``: the agent's frame-stream socket as a :class:`StdioChannel` (``local://``).

A connection is shaped like a relay process (:class:`PipeProcess`), so the multiplexing, the
heartbeat and the reconnects are :class:`StdioChannel`'s own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

from ..errors import AgentUnavailableError
from ..protocol.ownership import check_peer, check_socket, check_state_dir
from .channel import MAX_RESPONSE, ChannelBroken, PipeProcess, StdioChannel
from .framesocket import FrameSocket

__all__ = ["SocketChannel"]


class _StreamEnd:
    """The writing half of a socket as a :class:`PipeWriter`: ``close()`` half-closes it.

    So a channel closing the way it closes a relay's stdin lets the server answer what is in
    flight before it closes its own half.
    """

    def __init__(self, sock: FrameSocket) -> None:
        self._sock = sock

    def write(self, data: bytes) -> None:
        self._sock.write(data)

    async def drain(self) -> None:
        await self._sock.drain()

    def close(self) -> None:
        self._sock.write_eof()


class _SocketReader:
    """The reading half of a socket as a :class:`PipeReader` that notes when the server is done."""

    def __init__(self, sock: FrameSocket) -> None:
        self._sock = sock
        self.done = asyncio.Event()

    async def readline(self) -> bytes:
        line = await self._sock.readline()
        if not line:
            self.done.set()
        return line

    async def readexactly(self, n: int) -> bytes:
        try:
            return await self._sock.readexactly(n)
        except asyncio.IncompleteReadError:
            self.done.set()
            raise

    async def read(self, n: int = -1) -> bytes:
        data = await self._sock.read(n)
        if not data:
            self.done.set()
        return data


class _SocketPipe:
    """A connection to the agent's frame stream, shaped like a relay process (:class:`PipeProcess`)."""

    def __init__(self, sock: FrameSocket) -> None:
        self.stdin = _StreamEnd(sock)
        self.stdout = _SocketReader(sock)
        self._sock = sock

    def kill(self) -> None:
        self._sock.abort()
        self.stdout.done.set()

    async def wait(self) -> int:
        """Until the server has closed its half (a relay process's exit, for a socket)."""
        await self.stdout.done.wait()
        self._sock.close()
        return 0


class SocketChannel(StdioChannel):
    """The agent's frame stream socket, straight from the host (``local://``): no relay process.

    The same multiplexed frames as :class:`StdioChannel`, over one Unix-socket connection;
    ``on_unavailable`` (re)starts the agent when the socket does not answer.
    """

    def __init__(self, path: Path, on_unavailable: Callable[[], Awaitable[None]]) -> None:
        super().__init__(self._connect)
        self._path = path
        self._on_unavailable = on_unavailable

    async def _open(self) -> FrameSocket:
        """Connect only to our own agent: the directory and the socket must be ours before the
        connect, the listening process ours after it (another local user may have made the
        state dir first); nothing is written before that.

        :raises OSError: there is no socket to connect to.
        :raises UntrustedAgentError: the directory, socket or listener is another user's.
        """
        check_state_dir(self._path.parent)
        if not check_socket(self._path):
            raise FileNotFoundError(f"no agent socket at {self._path}")
        loop = asyncio.get_running_loop()
        _, sock = await loop.create_unix_connection(lambda: FrameSocket(MAX_RESPONSE), os.fspath(self._path))
        try:
            check_peer(sock.get_extra_info("socket"), self._path)
        except BaseException:
            sock.abort()
            raise
        return sock

    async def _connect(self) -> PipeProcess:
        try:
            conn = await self._open()
        except OSError:
            await self._on_unavailable()
            try:
                conn = await self._open()
            except OSError as exc:
                older = await asyncio.to_thread(  # (stats: not on the loop)
                    lambda: not self._path.exists() and (self._path.parent / "agent.sock").exists()
                )
                if older:
                    # Its HTTP socket answers, but it has no frame stream: an agent from an
                    # older remote_exec still serves this directory. Retrying cannot help.
                    raise AgentUnavailableError(
                        f"the agent serving {self._path.parent} is an older version without a frame stream; "
                        "stop it (`remote-exec-agent` exits after its idle timeout, or kill its pid) and retry"
                    ) from exc
                raise ChannelBroken(f"agent stream {self._path}: {exc}") from exc
        raw = conn.get_extra_info("socket")
        with contextlib.suppress(OSError, AttributeError):  # big uploads cross in few sends
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        return _SocketPipe(conn)
