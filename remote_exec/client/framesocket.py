"""The agent's socket read with two copies per byte: the kernel's into a reused buffer, one into ``bytes``.

asyncio's ``StreamReader`` copies every byte three times on the way to a frame's payload (into
its buffer, out of it as ``bytes``, and again when the buffer's head is dropped), which held the
host to about two thirds of what a plain pipe carries. :class:`FrameSocket` is a
:class:`asyncio.BufferedProtocol`: while a payload is awaited (:meth:`readexactly`), the kernel
writes straight into a payload buffer kept for the next payload (:class:`_Spares`), and one copy
makes the payload ``bytes``; lines (a frame's JSON) go through a small buffer as before. It
offers what :class:`~.channel.PipeReader` and the channel's writer need, and nothing else.

Bounds: a line longer than ``limit`` is a :class:`ValueError` (as ``StreamReader``'s); at most
:data:`HIGH_WATER` bytes are read ahead of the reader, then the socket is paused until it reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

__all__ = ["HIGH_WATER", "FrameSocket"]

CHUNK = 256 * 1024  # the line buffer's size to start with, and what one receive asks for at least
HIGH_WATER = 1 << 20  # bytes read ahead of the reader before the socket is paused


class _Spares:
    """Payload buffers kept for the next payload (of any connection of this process, any loop:
    the blocking API runs its own): at most :attr:`KEEP` of them, none over :attr:`LARGEST`
    bytes. A fresh buffer per payload cost more than the payload's own copies (zeroing it, and
    the page faults of memory the allocator had given back). Taken by one payload at a time."""

    KEEP = 2
    LARGEST = 16 << 20

    def __init__(self) -> None:
        self._free: list[bytearray] = []
        self._lock = threading.Lock()

    def take(self, n: int) -> bytearray:
        if n > self.LARGEST:
            return bytearray(n)  # (never kept: no spare is grown for it)
        with self._lock:
            buf = self._free.pop() if self._free else None
        if buf is None:
            return bytearray(n)
        if len(buf) < n:
            buf.extend(bytes(n - len(buf)))  # grown once: this size is kept for the next
        return buf

    def give(self, buf: bytearray) -> None:
        if len(buf) > self.LARGEST:
            return
        try:  # a view of it that outlived its payload (a receive still pending): never reused
            buf.append(0)
            buf.pop()
        except BufferError:
            return
        with self._lock:
            if len(self._free) < self.KEEP:
                self._free.append(buf)


_SPARES = _Spares()


class FrameSocket(asyncio.BufferedProtocol):
    """One connection: its reading half (``readline``, ``readexactly``, ``read``) and its writing
    half (``write``, ``drain``, ``write_eof``).

    :param limit: the longest line accepted.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._buf = bytearray(CHUNK)
        self._start = 0  # the unread bytes are _buf[_start:_end]
        self._end = 0
        self._payload: memoryview | None = None  # a readexactly's target, filled by the kernel
        self._filled = 0
        self._waiter: asyncio.Future[None] | None = None
        self._eof = False
        self._error: BaseException | None = None
        self._read_paused = False
        self._write_paused = False
        self._drains: list[asyncio.Future[None]] = []  # writers waiting for room (several tasks write)
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.Event()

    # -- asyncio.BufferedProtocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._payload is not None:
            return self._payload[self._filled :]
        if self._start == self._end and len(self._buf) > 4 * CHUNK:
            self._buf = bytearray(CHUNK)  # a long line came and went: give its room back
            self._start = self._end = 0
        if len(self._buf) - self._end < CHUNK // 4:
            unread = self._end - self._start
            if self._start:  # move the unread bytes to the front
                self._buf[:unread] = self._buf[self._start : self._end]
                self._start, self._end = 0, unread
            if len(self._buf) - self._end < CHUNK // 4:
                self._buf.extend(bytes(len(self._buf)))  # a long line: grow (bounded by readline)
        return memoryview(self._buf)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._payload is not None:
            self._filled += nbytes
            if self._filled >= len(self._payload):
                self._payload = None  # complete (its reader holds it): what follows is lines again
        else:
            self._end += nbytes
            if self._end - self._start >= HIGH_WATER and self._waiter is None and self.transport is not None:
                self.transport.pause_reading()  # nobody reads: stop until someone does
                self._read_paused = True
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return True  # keep our half open: the channel closes it when it is done

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._error = exc
        self._wake()
        self._release_drains()
        self.closed.set()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._release_drains()

    def _release_drains(self) -> None:
        drains, self._drains = self._drains, []
        for waiter in drains:
            if not waiter.done():
                waiter.set_result(None)

    # -- reading -----------------------------------------------------------------------------

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _wait(self) -> None:
        if self._error is not None:
            raise ConnectionResetError(str(self._error))
        if self._read_paused and self.transport is not None:
            self._read_paused = False
            self.transport.resume_reading()
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def readline(self) -> bytes:
        """One line with its newline; the rest of the stream at EOF (``b""``: nothing left)."""
        scanned = 0  # bytes past _start known to hold no newline (_start moves when the buffer is compacted)
        while True:
            at = self._buf.find(b"\n", self._start + scanned, self._end)
            if at >= 0:
                line = bytes(self._buf[self._start : at + 1])
                self._start = at + 1
                return line
            scanned = self._end - self._start
            if self._end - self._start > self._limit:
                raise ValueError(f"a line over {self._limit} bytes")
            if self._eof:
                rest = bytes(self._buf[self._start : self._end])
                self._start = self._end
                return rest
            await self._wait()

    async def readexactly(self, n: int) -> bytes:
        """``n`` bytes: the kernel writes them into a reused buffer (:class:`_Spares`), and one
        copy makes them ``bytes``. (A fresh buffer per payload cost more than the bytes' own
        copies: zeroing it, and the page faults of memory the allocator had given back.)

        :raises asyncio.IncompleteReadError: EOF first.
        """
        have = min(n, self._end - self._start)
        if have == n:  # all buffered already (a small payload): no spare needed
            data = bytes(self._buf[self._start : self._start + n])
            self._start += n
            return data
        target = _SPARES.take(n)
        view = memoryview(target)[:n]
        view[:have] = self._buf[self._start : self._start + have]
        self._start += have
        self._filled = have
        self._payload = view
        try:
            while self._filled < n:
                if self._eof:
                    raise asyncio.IncompleteReadError(bytes(view[: self._filled]), n)
                await self._wait()
            return bytes(view)
        finally:
            self._payload = None
            view.release()
            _SPARES.give(target)

    async def read(self, n: int = -1) -> bytes:
        """What is buffered (at most ``n``), waiting for some; ``b""`` at EOF. ``n < 0``: all
        of it up to EOF, as ``StreamReader.read`` (unbounded: a caller that reads what a sandbox
        sends reads in pieces, :func:`~.callchannel.read_bounded`)."""
        if n < 0:
            parts = []
            while chunk := await self.read(CHUNK):
                parts.append(chunk)
            return b"".join(parts)
        while self._end == self._start and not self._eof:
            await self._wait()
        stop = min(self._end, self._start + n)
        data = bytes(self._buf[self._start : stop])
        self._start = stop
        return data

    # -- writing -----------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    async def drain(self) -> None:
        """Until the transport takes more (its buffer below the high-water mark)."""
        if self._error is not None or (self.transport is not None and self.transport.is_closing()):
            raise ConnectionResetError("the connection is closed")
        if self._write_paused:
            waiter = asyncio.get_running_loop().create_future()
            self._drains.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._drains:  # cancelled: no longer waiting
                    self._drains.remove(waiter)

    def write_eof(self) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            if self.transport is not None and not self.transport.is_closing() and self.transport.can_write_eof():
                self.transport.write_eof()

    def get_extra_info(self, name: str) -> Any:
        return None if self.transport is None else self.transport.get_extra_info(name)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
