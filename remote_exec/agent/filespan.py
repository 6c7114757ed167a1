"""A push's payload sent straight from a job's log file into the client's socket (``sendfile``).

A follow's push used to ``pread`` its bytes into memory and hand them to the connection, which
copied what the socket could not take at once into its own buffer: with twenty connections
following one job, twenty such copies of every chunk (agent CPU 14-20 x one follower's). A
:class:`FileSpan` names the bytes instead (the log's path, a file offset, a size) and
:func:`send_span` has the kernel copy them from the page cache into each socket as it drains.

The range must stay in the file until it is sent: the follower pins it in the log
(:meth:`~.jobs.logfile.LogFile.pin`), so neither the disk cap nor the log budget punches it
out meanwhile. A job that truncates its own log while a span of it is being sent makes the file
shorter than the span: the rest of the span is sent as zeros, so that the frame keeps the length
its header gave (the next look at the log sees the truncation; readers are told what it took).
"""

from __future__ import annotations

import asyncio
import os
import stat
from typing import NamedTuple

__all__ = ["FileSpan", "send_span"]

_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK  # the job can replace its log
_ZEROS = 1 << 20  # zeros written per piece for a span the file no longer holds
_PIECE = 64 * 1024  # copied through the transport when the socket is full: its drain is the wait for room


class FileSpan(NamedTuple):
    """``size`` bytes of the file at ``path`` from file offset ``offset``."""

    path: str
    offset: int
    size: int


async def send_span(writer: asyncio.StreamWriter, span: FileSpan) -> None:
    """Write ``span``'s bytes to ``writer``'s socket (the file's, else zeros: see the module);
    returns once the socket took them all. Cancelled: the connection is being dropped (a frame
    half sent cannot be finished).

    The kernel copies the bytes (``os.sendfile``) while the socket takes them at once. When it
    is full, one :data:`_PIECE` goes through the transport instead, and its drain is the wait
    for room: the connection is read all the while. (``loop.sendfile`` paused reading for each
    span it sent, and nothing yielded between two, so the requests of a connection that was
    being pushed to went unread until its pushes stopped: a follow request waited 11 s.)
    The writer's buffer limits should be 0 (its owner, the connection's outbox, sets them once):
    a drain then returns only when the socket took everything, and the file goes on by kernel
    copy; with higher limits every piece after the first full socket goes through memory.
    """
    transport = writer.transport
    sock = transport.get_extra_info("socket")
    out = sock.fileno() if sock is not None else -1
    sent = 0
    try:
        fd = os.open(span.path, _FLAGS)
    except OSError:
        fd = -1
    if fd >= 0:
        with os.fdopen(fd, "rb", buffering=0) as f:  # (an fd: no blocking open)
            if stat.S_ISREG(os.fstat(fd).st_mode):
                os.set_blocking(fd, True)
                sent = await _send_file(writer, out, f.fileno(), span)
    while sent < span.size:  # the job truncated or replaced its log meanwhile
        n = min(_ZEROS, span.size - sent)
        transport.write(bytes(n))
        sent += n
        await writer.drain()


async def _send_file(writer: asyncio.StreamWriter, out: int, fd: int, span: FileSpan) -> int:
    """Send what the file holds of ``span``; the bytes sent (fewer where the file ends first)."""
    transport = writer.transport
    sent = 0
    while sent < span.size:
        if transport.is_closing():
            raise ConnectionResetError("the connection closed while a push was being sent")
        if out >= 0 and not transport.get_write_buffer_size():  # (else its bytes go first)
            try:
                n = os.sendfile(out, fd, span.offset + sent, span.size - sent)
            except BlockingIOError:
                n = -1  # the socket is full
            if n == 0:
                break  # the file ends before the span does
            if n > 0:
                sent += n
                continue
        piece = os.pread(fd, min(_PIECE, span.size - sent), span.offset + sent)
        if not piece:
            break
        transport.write(piece)
        sent += len(piece)
        await writer.drain()
    return sent
