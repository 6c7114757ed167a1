"""A process in a pod over one exec WebSocket of the API server, as a :class:`PipeProcess`.

The API server's exec subresource speaks the *channel* protocols: each binary message starts
with a channel byte (0 stdin, 1 stdout, 2 stderr, 3 error, 4 resize) followed by the bytes of
that stream. ``v5.channel.k8s.io`` (Kubernetes 1.30+, KEP-4006) adds a CLOSE message
(``255`` then the channel) that half-closes stdin; ``v4.channel.k8s.io`` cannot say EOF at all,
so over v4 :attr:`WsExecProcess.can_close_stdin` is false and whoever uploads bytes says how
many instead (``head -c N``: see :mod:`~remote_exec.sandboxes.inject`). When the command ends
the server sends a ``metav1.Status`` on channel 3 (``Success``, or ``Failure`` with the code
in ``details.causes[reason=ExitCode]``) and closes the socket.

Nothing here is a thread or a process: one aiohttp WebSocket per exec. stdout is read on
demand (no task reads ahead), so a slow reader holds the server back through TCP, never the
host's memory; stderr is dropped (as the other transports' ``spawn`` does) but its last bytes
are kept for an error message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable

import aiohttp

from .k8swatch import obj, text

__all__ = ["CHANNEL_PROTOCOLS", "WsExecProcess", "exit_status"]

V5 = "v5.channel.k8s.io"
V4 = "v4.channel.k8s.io"
CHANNEL_PROTOCOLS = (V5, V4)
"""What the client offers, best first (kubernetes_asyncio offers v4 only unless told:
tomplus/kubernetes_asyncio#403)."""

STDIN, STDOUT, STDERR, ERROR = 0, 1, 2, 3
_CLOSE = 255
_STDIN_CHUNK = 256 * 1024  # one message per chunk: a stdin write of MiBs is many frames, not one
_MAX_STATUS = 64 * 1024  # a Status on the error channel is a few hundred bytes
_STDERR_KEPT = 2048
KILLED = -9
# CLOSING too: what a receive gets while our own close() is under way (a kill during a read).
_ENDS = (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR)
CLOSING: set[asyncio.Task[None]] = set()
"""Every exec socket's close still in progress (see :meth:`WsExecProcess._close_socket`);
:meth:`~remote_exec.sandboxes.k8sapi.KubeApi.release` waits for them before its session closes."""


def exit_status(status: bytes) -> tuple[int, str]:
    """The exit code a ``metav1.Status`` on the error channel reports, and its message.

    ``Success`` is 0; ``Failure`` with an ``ExitCode`` cause is that code; any other failure
    (the container is gone, the command was not found) is 126 with the server's message. The
    bytes come from the API server and are parsed as untrusted: bounded, and a code only from
    0 to 255.
    """
    try:
        body = json.loads(status[:_MAX_STATUS])
    except (ValueError, RecursionError):  # (RecursionError: JSON nested too deep)
        return 126, f"an unreadable status from the API server: {text(status[:200])}"
    if not isinstance(body, dict):
        return 126, "an unreadable status from the API server"
    if body.get("status") == "Success":
        return 0, ""
    message = text(body.get("message") or body.get("reason") or "exec failed", 500)
    causes = obj(body, "details").get("causes")
    for cause in causes if isinstance(causes, list) else ():
        if isinstance(cause, dict) and cause.get("reason") == "ExitCode":
            code = cause.get("message", "")
            if isinstance(code, str) and code.isascii() and code.isdecimal() and len(code) <= 3 and int(code) <= 255:
                return int(code), message
    return 126, message


class _Stdout:
    """A :class:`~remote_exec.client.channel.PipeReader` over the stdout channel."""

    def __init__(self, proc: WsExecProcess, limit: int) -> None:
        self._proc = proc
        self._limit = limit

    def _take(self, n: int) -> bytes:
        proc = self._proc
        out = bytes(proc.buf[proc.pos : proc.pos + n])
        proc.pos += len(out)
        if proc.pos == len(proc.buf):  # all read: an idle channel holds nothing (500 of them, 0 bytes)
            proc.buf.clear()
            proc.pos = 0
        elif proc.pos > 1 << 16 and proc.pos * 2 > len(proc.buf):  # compact now and then, not per read
            del proc.buf[: proc.pos]
            proc.pos = 0
        return out

    async def readline(self) -> bytes:
        proc = self._proc
        start = proc.pos
        while True:
            end = proc.buf.find(b"\n", start)
            if end >= 0:
                if end + 1 - proc.pos > self._limit:
                    raise ValueError(f"a line longer than {self._limit} bytes from the pod")
                return self._take(end + 1 - proc.pos)
            if proc.available > self._limit:
                raise ValueError(f"a line longer than {self._limit} bytes from the pod")
            start = len(proc.buf)
            if not await proc.fill():
                return self._take(proc.available)

    async def readexactly(self, n: int) -> bytes:
        proc = self._proc
        while proc.available < n:
            if not await proc.fill():
                raise asyncio.IncompleteReadError(self._take(proc.available), n)
        return self._take(n)

    async def read(self, n: int = -1) -> bytes:
        proc = self._proc
        if n < 0:
            while await proc.fill():
                pass
            return self._take(proc.available)
        if not proc.available:
            await proc.fill()
        return self._take(min(n, proc.available))


class _Stdin:
    """A :class:`~remote_exec.client.channel.PipeWriter` over the stdin channel: :meth:`write`
    queues, :meth:`drain` sends (one message per chunk), :meth:`close` sends what is queued
    and then, over v5, the CLOSE of stdin."""

    def __init__(self, proc: WsExecProcess) -> None:
        self._proc = proc
        self._queued: list[bytes] = []
        self._lock = asyncio.Lock()  # drains and the close go out in the order they were asked
        self._closing: asyncio.Task[None] | None = None

    def write(self, data: bytes) -> None:
        if self._closing is not None or self._proc.ws.closed:
            raise ConnectionResetError("the exec WebSocket's stdin is closed")
        if data:
            self._queued.append(data)

    async def drain(self) -> None:
        async with self._lock:
            await self._send_queued()

    async def _send_queued(self) -> None:
        ws = self._proc.ws
        while self._queued:
            data = self._queued.pop(0)
            for start in range(0, len(data), _STDIN_CHUNK):
                try:
                    await ws.send_bytes(b"\x00" + data[start : start + _STDIN_CHUNK])
                except (ConnectionError, RuntimeError) as exc:
                    raise ConnectionResetError(f"the exec WebSocket closed: {exc}") from exc

    def close(self) -> None:
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(self._close())

    async def _close(self) -> None:
        async with self._lock:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await self._send_queued()
                if self._proc.can_close_stdin:
                    await self._proc.ws.send_bytes(bytes((_CLOSE, STDIN)))


class WsExecProcess:
    """One command running in a pod's container, reached over one exec WebSocket.

    :ivar ws: the WebSocket (its negotiated protocol is ``v5`` or ``v4.channel.k8s.io``).
    :ivar can_close_stdin: v5: closing stdin is an EOF the command reads; v4: it is not.
    :ivar message: the server's words when the command could not run or failed (empty else).
    """

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, limit: int) -> None:
        self.ws = ws
        self.can_close_stdin = ws.protocol == V5
        self.buf = bytearray()
        self.pos = 0
        self.message = ""
        self._stderr = b""
        self._code: int | None = None
        self._ended = asyncio.Event()
        self._read_lock = asyncio.Lock()
        self._stdin = _Stdin(self)
        self._stdout = _Stdout(self, limit)
        self._limit = limit
        self.on_end: Callable[[WsExecProcess], None] | None = None
        """Called once its socket is closed (the transport forgets it then)."""
        self._closer: asyncio.Task[None] | None = None

    @property
    def stdin(self) -> _Stdin:
        return self._stdin

    @property
    def stdout(self) -> _Stdout:
        return self._stdout

    @property
    def returncode(self) -> int | None:
        return self._code if self._ended.is_set() else None

    @property
    def available(self) -> int:
        return len(self.buf) - self.pos

    @property
    def stderr_tail(self) -> bytes:
        """The last bytes the command wrote to stderr (for an error message)."""
        return self._stderr

    async def fill(self) -> bool:
        """Read messages until stdout has more bytes (True) or the socket has ended (False).

        One reader at a time; cancelling it loses nothing (a message is either appended or
        still in the socket)."""
        async with self._read_lock:
            before = len(self.buf)
            while len(self.buf) == before:
                if self._ended.is_set():
                    return False
                msg = await self.ws.receive()
                if msg.type is aiohttp.WSMsgType.BINARY and msg.data:
                    self._take_message(msg.data)
                elif msg.type in _ENDS:
                    self._end()
            return True

    def _take_message(self, data: bytes) -> None:
        channel, payload = data[0], data[1:]
        if channel == STDOUT:
            self.buf += payload
        elif channel == STDERR:
            self._stderr = (self._stderr + payload)[-_STDERR_KEPT:]
        elif channel == ERROR and payload:
            self._code, self.message = exit_status(payload)

    def _end(self) -> None:
        if self._ended.is_set():
            return
        if self._code is None:  # closed without a Status: the stream broke, not the command
            self._code = KILLED
            self.message = self.message or "the exec stream closed without an exit status"
        self._ended.set()
        self._close_socket()

    def _close_socket(self) -> None:
        if self._closer is None:
            self._closer = closer = asyncio.get_running_loop().create_task(self._close_ws())
            # The loop keeps only a weak reference to a task: a closer whose process nobody holds
            # any more would be collected half-way, its socket left open. Held here until done.
            CLOSING.add(closer)
            closer.add_done_callback(CLOSING.discard)

    async def _close_ws(self) -> None:
        # The connection's transport, taken before the close releases it: aiohttp ends a TLS
        # connection by sending close_notify and waiting (up to 30 s) for the server's, so a
        # loop that ended meanwhile left the socket open (a ResourceWarning in a later test, in
        # CI). After the WebSocket's own close handshake nothing is left to say: it is aborted.
        conn = getattr(self.ws, "_conn", None)  # (aiohttp has no public handle on it)
        transport = getattr(conn, "transport", None)
        try:
            with contextlib.suppress(Exception):  # a socket already broken has nothing left to close
                await self.ws.close()
        finally:
            if transport is not None:
                transport.abort()
                await asyncio.sleep(0)  # the socket closes in the loop's next turn: let it come
        if self.on_end is not None:
            self.on_end(self)

    def kill(self) -> None:
        """Close the socket: the API server ends the exec (a real kubelet may leave the command
        running in the container, as ``kubectl exec`` does: the agent's relay reads the EOF
        of its stdin and exits).

        :raises ProcessLookupError: it has ended already.
        """
        if self._ended.is_set():
            raise ProcessLookupError("the exec has ended")
        if self._code is None:  # a Status already read (its close not yet) stays the truth
            self._code = KILLED
        self._ended.set()
        self._close_socket()

    async def wait(self) -> int:
        """Its exit status (``-9`` when it was killed or the stream broke without a Status).

        Drives the socket itself while nobody reads stdout and what is unread stays under the
        reader's bound; past it, stdout must be read first (as with a pipe). Cancelling
        abandons the wait only."""
        while not self._ended.is_set():
            if self.available > self._limit:
                await self._ended.wait()
                break
            if self._read_lock.locked():  # a reader is at it: wait for its turn to end, then look again
                async with self._read_lock:
                    continue
            if not await self.fill():
                break
        if self._closer is not None:
            await asyncio.shield(self._closer)
        assert self._code is not None
        return self._code
