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


class FileSpan(NamedTuple):
    """``size`` bytes of the file at ``path`` from file offset ``offset``."""

    path: str
    offset: int
    size: int


async def send_span(transport: asyncio.WriteTransport, span: FileSpan) -> None:
    """Write ``span``'s bytes to ``transport`` (the file's, else zeros: see the module); returns
    once they are handed to the socket. Cancelled: the connection is being dropped (a frame
    half sent cannot be finished)."""
    sent = 0
    try:
        fd = os.open(span.path, _FLAGS)
    except OSError:
        fd = -1
    if fd >= 0:
        with os.fdopen(fd, "rb", buffering=0) as f:  # (an fd: no blocking open)
            if stat.S_ISREG(os.fstat(fd).st_mode):
                os.set_blocking(fd, True)
                sent = await asyncio.get_running_loop().sendfile(transport, f, span.offset, span.size)
    while sent < span.size:  # the job truncated or replaced its log meanwhile
        n = min(_ZEROS, span.size - sent)
        transport.write(bytes(n))
        sent += n
