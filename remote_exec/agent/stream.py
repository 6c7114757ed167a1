"""The agent's frame stream: JSON-RPC frames over one long-lived Unix-socket connection.

HTTP costs a header parse, a request object and a response object per call, and the ``stdio``
relay used to pay all of that again to re-post every line. On this socket a connection carries
the same newline-delimited frames as the ``stdio`` channel (:mod:`remote_exec.protocol.frames`),
many requests in flight at once, answers in completion order and matched by ``id``. So the
relay only copies bytes between its pipes and the socket, and a local host can talk to it
directly. The HTTP endpoint stays for one-shot ``call`` and for tools such as ``curl``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import json
import logging
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ..errors import RemoteExecError, ServerBusyError
from ..protocol import frames
from ..protocol.agentdir import SOCKET_BUFFER, STREAM_SOCKET
from .filespan import FileSpan, send_span
from .intake import Intake, LineTooLong, read_frame

__all__ = ["CURRENT_PEER", "CURRENT_SEND", "STREAM_SOCKET", "Peer", "Peers", "serve_frames"]

log = logging.getLogger("remote_exec.agent")
_Part = bytes | FileSpan  # of a frame: its header, JSON and newline, and its payload's bytes or spans
_WRITE_CHUNK = 1 << 20


def widen_socket(writer: asyncio.StreamWriter) -> None:
    """Ask for :data:`SOCKET_BUFFER` bytes of send buffer on a stream's socket."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)


@dataclass
class Peer:
    """One client connection to the frame stream, and when it was last heard from.

    A host sends a heartbeat (``ping``) every few seconds even when idle (see
    :class:`remote_exec.client.channel.Liveness`), so a ``last_seen`` older than the host's
    liveness bound means the client is frozen or gone even if its connection looks open (the
    relay of a cut SSH link, a suspended laptop).
    """

    id: int
    opened: float = field(default_factory=time.monotonic)
    last_seen: float = field(default_factory=time.monotonic)
    frames: int = 0


class Peers:
    """The open frame-stream connections of an agent (read by policies, never by clients)."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self.open: dict[int, Peer] = {}

    def add(self) -> Peer:
        peer = Peer(next(self._ids))
        self.open[peer.id] = peer
        return peer

    def remove(self, peer: Peer) -> None:
        self.open.pop(peer.id, None)

    def last_seen(self) -> float | None:
        """When any connected client was last heard from (``None``: no client connected)."""
        return max((p.last_seen for p in self.open.values()), default=None)


CURRENT_PEER: contextvars.ContextVar[Peer | None] = contextvars.ContextVar("remote_exec_peer", default=None)
"""The connection whose request is being handled (``None``: an HTTP call, or no request).
Set in :func:`serve_frames`' task, so every request task of that connection inherits it: the
policy enforcer learns from it which connections are attached to which job."""


CURRENT_SEND: contextvars.ContextVar[Callable[..., Awaitable[None]] | None] = contextvars.ContextVar(
    "remote_exec_send", default=None
)
"""Writes a frame (its parts: JSON, then payload) on the connection whose request is being
handled, returning once written (``None``: an HTTP call, which has no connection to push on).
What ``exec_remote_follow`` pushes with."""


def _error_frame(exc: RemoteExecError) -> bytes:
    err = {"code": exc.code, "message": exc.message}
    return json.dumps({"jsonrpc": "2.0", "id": None, "error": err}, separators=(",", ":")).encode()


class _Outbox:
    """Writes whole answers to one connection, small ones ahead of queued big ones.

    A hundred busy jobs can queue a hundred 4 MiB poll answers; in arrival order, a ``kill`` or a
    ``server_info`` behind them would wait for all of them (a second or more). Small answers
    overtake the queue, so one waits at most for the big answer already on its way.
    """

    SMALL = 64 * 1024

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        # A drain returns once the socket took everything: one answer at a time is written, and
        # a push's file span goes on by kernel copy after each wait (see send_span).
        writer.transport.set_write_buffer_limits(high=0)
        self._small: deque[tuple[tuple[_Part, ...], asyncio.Future[None]]] = deque()
        self._big: deque[tuple[tuple[_Part, ...], asyncio.Future[None]]] = deque()
        self._pumping = False

    async def send(self, answer: bytes, payload: bytes | tuple[FileSpan, ...] | None = None) -> None:
        """Queue ``answer`` (a frame, or with ``payload`` a message whose payload goes ahead of
        it: bytes, or spans of files sent from the page cache); return once it is written (the
        first caller writes for all)."""
        done = asyncio.get_running_loop().create_future()
        parts: tuple[_Part, ...]
        if payload is None:
            parts = (answer,)
        elif isinstance(payload, tuple):
            parts = (frames.payload_header(sum(span.size for span in payload)), *payload, answer)
        else:
            parts = (frames.payload_header(len(payload)), payload, answer)
        size = sum(p.size if isinstance(p, FileSpan) else len(p) for p in parts)
        (self._small if size <= self.SMALL else self._big).append((parts, done))
        if not self._pumping:
            self._pumping = True
            try:
                while self._small or self._big:
                    parts, waiter = (self._small or self._big).popleft()
                    try:
                        # The parts go separately (joining them would copy the payload again), the
                        # newline with a small last one (a send less, a wakeup less of the reader).
                        *ahead, last = parts
                        for part in ahead:
                            if isinstance(part, FileSpan):
                                await send_span(self._writer, part)
                            else:
                                self._writer.write(part)
                        assert isinstance(last, bytes)
                        if len(last) <= self.SMALL:
                            self._writer.write(last + b"\n")
                        else:
                            self._writer.write(last)
                            self._writer.write(b"\n")
                        await self._writer.drain()
                        # A turn of the loop between answers: the connection's requests are read
                        # however long the queue stays full (a socket that takes each push at
                        # once would otherwise never let the loop look for them).
                        await asyncio.sleep(0)
                    except BaseException as exc:  # the connection is gone: so is every answer queued
                        for _, w in (*self._small, *self._big, (parts, waiter)):
                            if w is not done and not w.done():  # ours: the raise below tells us
                                w.set_exception(ConnectionResetError(str(exc) or type(exc).__name__))
                        self._small.clear()
                        self._big.clear()
                        raise
                    if not waiter.done():
                        waiter.set_result(None)
            finally:
                self._pumping = False
        await done


async def serve_frames(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    handle: Callable[[frames.Frame], Awaitable[bytes | None]],
    max_request: int,
    intake: Intake | None = None,
    peers: Peers | None = None,
) -> None:
    """Answer the frames of one connection until its EOF, then close it.

    Every request runs as its own task (a long poll does not hold up the calls behind it);
    answers are written whole, one at a time, small ones first (see :class:`_Outbox`). At EOF
    the answers still due are written before the connection closes. A malformed frame header
    ends the connection (the stream is out of step), after an error answer saying why; so does
    a frame that does not fit the memory budget (``intake`` charges its bytes as they arrive
    and releases them once it is answered). Every frame read, a heartbeat included, stamps the
    connection's :class:`Peer` in ``peers``.
    """
    tasks: set[asyncio.Task[None]] = set()
    intake = intake or Intake(None)
    peers = peers or Peers()
    peer = peers.add()
    CURRENT_PEER.set(peer)  # this connection's task: the request tasks below copy its context
    widen_socket(writer)
    send = _Outbox(writer).send
    CURRENT_SEND.set(send)

    async def one(frame: frames.Frame, held: int) -> None:
        try:
            answer = await handle(frame)
            del frame  # the request's bytes go before its answer is written
            if answer is not None:
                with contextlib.suppress(ConnectionError):
                    await send(answer)
        finally:
            intake.answered(held)

    try:
        while True:
            try:
                read = await read_frame(reader, intake, max_request)
            except frames.FrameError as exc:
                await send(_error_frame(RemoteExecError(f"bad request frame: {exc}")))
                break
            except LineTooLong:  # answer it, go on with the next line
                await send(_error_frame(RemoteExecError(f"request line over {max_request} bytes")))
                continue
            except ServerBusyError as exc:  # the rest of the frame is still coming: out of step
                log.warning("closing a connection: %s", exc.message)
                await send(_error_frame(exc))
                break
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            if read is None:
                break
            peer.last_seen = time.monotonic()
            peer.frames += 1
            frame, held = read
            if frame.payload is None and not frame.message.strip():
                intake.release(held)
                continue  # a blank line
            intake.handled(held)
            task = asyncio.create_task(one(frame, held))
            del frame, read  # the task holds it now; this loop must not while it waits for the next
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
    except ConnectionError:
        pass
    finally:
        peers.remove(peer)
        for task in tasks:
            task.cancel()
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
