"""One TCP connection the agent made for the host: a socket and the two cursors across it.

The socket is driven by an :class:`asyncio.Protocol`, so bytes from the target land in a
:class:`~remote_exec.agent.buffer.StreamBuffer` straight from the event loop's reads. Nothing is
ever dropped: the buffer only forgets bytes the host acknowledged (by naming a later receive
offset), and reading from the socket pauses while half the buffer is unacknowledged, so a slow
host slows the target down instead of growing the agent. Towards the target, a send is taken
only while the socket's write buffer is under its high-water mark.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from ...errors import InvalidParamsError, PortClosedError
from ...protocol import MAX_WAIT, PortConnInfo, PortRecvParams, PortRecvResult, PortSendParams, PortSendResult
from ..buffer import StreamBuffer
from ..rpc import WithPayload

__all__ = ["PortConnection"]


class _TargetProtocol(asyncio.Protocol):
    def __init__(self, conn: PortConnection) -> None:
        self._conn = conn

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._conn._made(transport)  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        self._conn._on_data(data)

    def eof_received(self) -> bool:
        self._conn._on_eof()
        return True  # keep the socket open: the host may still be sending (a half-close)

    def connection_lost(self, exc: Exception | None) -> None:
        self._conn._on_lost(exc)

    def pause_writing(self) -> None:
        self._conn._writable.clear()

    def resume_writing(self) -> None:
        self._conn._writable.set()


class PortConnection:
    """A connection to ``host:port`` inside the sandbox, read and written by cursors.

    :param buffer_limit: bytes held for the host at most (about; see the module docstring).
    :param write_buffer: bytes queued towards the target before sends wait for it to read.
    :param on_closed: called once, when :meth:`close` ends the connection for good.
    """

    def __init__(
        self,
        conn_id: str,
        host: str,
        port: int,
        buffer_limit: int,
        write_buffer: int,
        on_closed: Callable[[PortConnection], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.conn_id = conn_id
        self._clock = clock  # monotonic seconds for the idle limit (a test's fake clock)
        self.host = host
        self.port = port
        self.buffer = StreamBuffer(buffer_limit)
        self.created_at = time.time()
        self.last_used_at = self.created_at
        self.last_used = clock()
        self.busy = 0  # calls in progress on this connection: it is not idle while any is
        self.sent = 0
        self.received = 0
        self.acked = 0
        self.send_eof = False
        self.recv_eof = False  # the target ended its direction, or the socket is gone
        self.error: str | None = None  # why the connection ended abnormally
        self.closed_reason: str | None = None
        self.finished = False  # closed for good by close(): the buffer is gone too
        self._write_buffer = write_buffer
        self._on_closed = on_closed
        self._transport: asyncio.Transport | None = None
        self._lost = False
        self._paused = False
        self._writable = asyncio.Event()
        self._writable.set()
        self._changed = asyncio.Event()
        self._send_lock = asyncio.Lock()

    # -- connecting ------------------------------------------------------------------------

    async def connect(self, addresses: list[str]) -> None:
        """Connect to the first of ``addresses`` (IP literals) that accepts ``self.port``.

        :raises OSError: every address failed (the first failure is raised).
        """
        loop = asyncio.get_running_loop()
        first: OSError | None = None
        for address in addresses:
            try:
                await loop.create_connection(lambda: _TargetProtocol(self), address, self.port)
                return
            except OSError as exc:
                first = first or exc
        assert first is not None
        raise first

    # -- protocol callbacks (event loop) -----------------------------------------------------

    def _made(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        transport.set_write_buffer_limits(high=self._write_buffer)

    def _on_data(self, data: bytes) -> None:
        self.received += len(data)
        self.buffer.append(data, keep_unread=True)  # only acknowledged bytes ever fall out
        if not self._paused and self.buffer.wants_pause() and self._transport is not None:
            self._transport.pause_reading()
            self._paused = True
        self._notify()

    def _on_eof(self) -> None:
        self.recv_eof = True
        self.buffer.eof = True
        if self.send_eof and self._transport is not None:
            self._transport.close()  # both directions have ended
        self._notify()

    def _on_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._transport = None
        self._paused = False
        self._writable.set()  # wake senders: they find the connection gone
        if not self.recv_eof:
            self.recv_eof = True
            self.buffer.eof = True
            if exc is not None:
                self.error = f"connection to {self.host}:{self.port} reset: {exc}"
            elif not self.send_eof:
                self.error = f"connection to {self.host}:{self.port} lost"
        if self.closed_reason is None:
            self.closed_reason = self.error or ("both directions ended" if self.send_eof else "closed by the target")
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _maybe_resume(self) -> None:
        if self._paused and not self.buffer.wants_pause() and self._transport is not None:
            self._transport.resume_reading()
            self._paused = False

    # -- operations ---------------------------------------------------------------------------

    def touch(self) -> None:
        self.last_used = self._clock()
        self.last_used_at = time.time()

    def _gone(self) -> PortClosedError:
        reason = self.closed_reason or self.error or "closed"
        return PortClosedError(
            f"connection {self.conn_id} to {self.host}:{self.port} has ended: {reason}",
            conn_id=self.conn_id,
            data={"reason": reason},
        )

    async def send(self, p: PortSendParams, payload: memoryview | None) -> PortSendResult:
        """Write the payload from ``p.offset`` on (skipping bytes already taken), then maybe EOF."""
        async with self._send_lock:  # a retry racing its original: one at a time, by offset
            if p.offset > self.sent:
                raise InvalidParamsError(
                    f"send offset {p.offset} is past the {self.sent} bytes sent on {self.conn_id}",
                    data={"conn_id": self.conn_id},
                )
            data = payload if payload is not None else memoryview(b"")
            new = data[self.sent - p.offset :]
            wants_eof = p.eof and not self.send_eof
            if not new and not wants_eof:
                return PortSendResult(offset=self.sent, eof=self.send_eof)  # a repeat: all taken
            if self.send_eof and new:
                raise InvalidParamsError(f"data sent after EOF on {self.conn_id}", data={"conn_id": self.conn_id})
            if self.finished or self._transport is None or self._transport.is_closing():
                raise self._gone()
            if new and not self._writable.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(p.wait, MAX_WAIT)):
                        await self._writable.wait()
                if not self._writable.is_set():  # the target is not reading: take nothing now
                    return PortSendResult(offset=self.sent, eof=self.send_eof)
            transport = self._transport
            if self.finished or transport is None or transport.is_closing():
                raise self._gone()
            if new:
                transport.write(new)
                self.sent += len(new)
            if wants_eof:
                self.send_eof = True
                if transport.can_write_eof():
                    transport.write_eof()
                if self.recv_eof:
                    transport.close()  # both directions have ended
            return PortSendResult(offset=self.sent, eof=self.send_eof)

    async def recv(self, p: PortRecvParams) -> PortRecvResult | WithPayload:
        """The bytes from ``p.offset`` on (acknowledging those before), waiting up to ``p.wait``."""
        buf = self.buffer
        if self.finished:
            return PortRecvResult(offset=p.offset, eof=True, error=self.error or self.closed_reason)
        if p.offset > buf.end:
            raise InvalidParamsError(
                f"receive offset {p.offset} is past the {buf.end} bytes received on {self.conn_id}",
                data={"conn_id": self.conn_id},
            )
        if p.offset < buf.base:
            raise InvalidParamsError(
                f"receive offset {p.offset} is before bytes already acknowledged on {self.conn_id} ({buf.base})",
                data={"conn_id": self.conn_id},
            )
        buf.mark_read(p.offset)  # the acknowledgement: bytes before it may now fall out
        self.acked = max(self.acked, p.offset)
        self._maybe_resume()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(p.wait, MAX_WAIT)
        while True:
            changed = self._changed
            if self.finished:
                return PortRecvResult(offset=p.offset, eof=True, error=self.error or self.closed_reason)
            if p.offset < buf.end:
                piece = buf.read(p.offset, p.max_bytes, "base64", peek=True, raw=True)
                eof = self.recv_eof and piece.end == buf.end
                result = PortRecvResult(offset=piece.end, eof=eof, error=self.error if eof else None)
                assert isinstance(piece.data, bytes)
                return WithPayload(result, piece.data)
            if self.recv_eof:
                return PortRecvResult(offset=p.offset, eof=True, error=self.error)
            remaining = deadline - loop.time()
            if remaining <= 0:
                return PortRecvResult(offset=p.offset)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await changed.wait()

    def close(self, reason: str) -> None:
        """End the connection for good (idempotent): the socket is closed, held bytes dropped.

        Bytes still queued towards the target are flushed first when the target reads; a
        target that does not is cut off (the socket is aborted).
        """
        if self.finished:
            return
        self.finished = True
        if self.closed_reason is None:
            self.closed_reason = reason
        if not self.recv_eof:
            self.error = self.error or reason
            self.recv_eof = True
        transport = self._transport
        if transport is not None:
            if transport.get_write_buffer_size():
                transport.abort()
            else:
                transport.close()
        self.buffer = StreamBuffer(1)  # nobody will read the rest
        self.buffer.eof = True
        self._writable.set()
        self._notify()
        self._on_closed(self)

    def info(self) -> PortConnInfo:
        buf = self.buffer
        return PortConnInfo(
            conn_id=self.conn_id,
            host=self.host,
            port=self.port,
            state="closed" if self.finished or self._lost else "open",
            sent=self.sent,
            received=self.received,
            acked=self.acked,
            buffered=buf.end - buf.base,
            reading_paused=self._paused,
            send_eof=self.send_eof,
            recv_eof=self.recv_eof,
            created_at=self.created_at,
            last_used_at=self.last_used_at,
            closed_reason=self.closed_reason,
        )
