"""A bounded, cursor-addressed byte buffer for one output stream of a job.

Bytes are addressed by their absolute offset in the stream. The buffer keeps the newest
``limit`` bytes; older ones fall out and are reported to a reader as *dropped*, never silently.
While somebody is actively reading, the job applies back-pressure instead of dropping (see
:meth:`StreamBuffer.wants_pause`), so a watched stream loses nothing however fast it is written.
With a :class:`~remote_exec.agent.budget.MemoryBudget`, the bytes held are charged to it, and a
short budget drops old bytes (counted the same way) even below ``limit``.
"""

from __future__ import annotations

import base64
import bisect
from dataclasses import dataclass

from .budget import MemoryBudget

__all__ = ["Slice", "StreamBuffer", "utf8_safe_end"]


def utf8_safe_end(data: bytes | bytearray | memoryview, final: bool) -> int:
    """Return how many leading bytes of ``data`` can be decoded without splitting a character.

    Trailing bytes that could be the start of a valid multi-byte UTF-8 sequence are held back
    unless ``final`` (the stream ended); invalid bytes are not held (they decode to U+FFFD).
    """
    n = len(data)
    if final or n == 0:
        return n
    # A UTF-8 sequence is at most 4 bytes, so only the last 3 bytes can be an incomplete prefix.
    for back in range(1, min(4, n + 1)):
        b = data[n - back]
        if b < 0x80:
            return n  # ASCII: everything before is complete
        if b >= 0xC0:  # a lead byte
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4 if b < 0xF8 else 1
            return n - back if need > back else n
    return n


@dataclass(frozen=True, slots=True)
class Slice:
    """What one read of a stream returned: ``data`` covering ``[start, end)``.

    ``data`` is text or base64 as the read asked, or the raw bytes for a ``raw`` read.
    """

    data: str | bytes
    start: int
    end: int
    dropped: int
    truncated: int = 0  # of ``dropped``: what the job took by truncating its own log


class StreamBuffer:
    """The retained tail of one stream plus the cursor bookkeeping for back-pressure.

    Bytes are kept as the chunks the pipe delivered (a list, with their start offsets), so an
    append is O(1) and trimming drops whole chunks: a full bytearray would be copied on every
    append once its head had been trimmed.
    """

    __slots__ = ("_chunks", "_size", "_starts", "base", "budget", "eof", "limit", "read_cursor")

    def __init__(self, limit: int, budget: MemoryBudget | None = None) -> None:
        self.budget = budget
        self._chunks: list[bytes] = []
        self._starts: list[int] = []  # absolute offset of each chunk
        self._size = 0  # bytes held
        self.base = 0  # absolute offset of the oldest byte held
        self.eof = False
        self.limit = limit
        self.read_cursor = 0  # highest offset returned to any reader

    @property
    def end(self) -> int:
        """Absolute offset one past the newest byte."""
        return self.base + self._size

    def append(self, data: bytes, keep_unread: bool = False) -> None:
        """Add bytes at the end, letting the oldest fall out beyond ``limit``.

        With ``keep_unread`` (somebody is reading), only bytes a reader already has may fall out,
        so the buffer can exceed ``limit`` by what arrives while the producer is being paused.
        When the memory budget is short, others are asked to free memory first (finished jobs'
        output), then this buffer's oldest bytes go too.
        """
        if not data:
            return
        self._starts.append(self.end)
        self._chunks.append(bytes(data))
        self._size += len(data)
        excess = self._size - self.limit
        budget = self.budget
        if budget is not None:
            budget.force(len(data))  # the bytes are here already: charge them, then make room
            if budget.over and max(excess, 0) < budget.over:
                budget.reclaim(budget.over - max(excess, 0))
            excess = min(max(excess, budget.over), self._size)
        if keep_unread:
            excess = min(excess, self.read_cursor - self.base)
        if excess > 0:
            self._trim(excess)

    def _trim(self, n: int) -> None:
        """Drop the oldest ``n`` bytes (``n`` ≤ bytes held)."""
        end = self.end
        drop = 0  # whole chunks to drop
        while drop < len(self._chunks) and len(self._chunks[drop]) <= n:
            n -= len(self._chunks[drop])
            drop += 1
        del self._chunks[:drop], self._starts[:drop]
        if n:  # and a part of the new first chunk
            self._chunks[0] = self._chunks[0][n:]
            self._starts[0] += n
        self.base = self._starts[0] if self._chunks else end
        if self.budget is not None:
            self.budget.release(self._size - (end - self.base))
        self._size = end - self.base

    @property
    def held(self) -> int:
        """Bytes held in memory."""
        return self._size

    def discard(self, n: int | None = None) -> int:
        """Drop the oldest ``n`` bytes (all by default); readers see them as dropped. Returns
        how many were dropped."""
        n = self._size if n is None else min(n, self._size)
        if n > 0:
            self._trim(n)
        return max(n, 0)

    def unread(self) -> int:
        """Bytes written but not yet returned to any reader."""
        return self.end - max(self.read_cursor, self.base)

    def wants_pause(self) -> bool:
        """True when half the buffer is unread, or any is while the memory budget is exhausted:
        time to stop reading from the producer."""
        unread = self.unread()
        if self.budget is not None and unread and self.budget.free() == 0:
            return True
        return unread >= max(self.limit // 2, 1)

    def _bytes(self, start: int, stop: int) -> bytes:
        i = bisect.bisect_right(self._starts, start) - 1
        parts: list[bytes | memoryview] = []
        while start < stop:
            chunk, first = self._chunks[i], self._starts[i]
            lo, hi = start - first, min(len(chunk), stop - first)
            parts.append(chunk if lo == 0 and hi == len(chunk) else memoryview(chunk)[lo:hi])
            start = first + hi
            i += 1
        return parts[0] if len(parts) == 1 and isinstance(parts[0], bytes) else b"".join(parts)

    def mark_read(self, stop: int) -> None:
        """Record that a reader now holds everything before ``stop``."""
        if stop > self.read_cursor:
            self.read_cursor = stop

    def read(self, offset: int, max_bytes: int, encoding: str, peek: bool = False, raw: bool = False) -> Slice:
        """Return the data from ``offset`` on, at most ``max_bytes`` raw bytes of it.

        Text (``utf-8``) is cut on a character boundary while the stream is open; invalid bytes
        become U+FFFD. ``base64`` is byte-exact. A ``raw`` read returns the bytes undecoded (still
        cut on a character boundary for text). A cursor past the end is a caller bug:
        :class:`ValueError`. A ``peek`` does not count as read (back-pressure and trimming ignore it).
        """
        if offset > self.end:
            raise ValueError(f"offset {offset} is past the end of the stream ({self.end} bytes)")
        start = max(offset, self.base)
        dropped = start - offset
        if start == self.end:
            return Slice(b"" if raw else "", start, start, dropped)
        stop = min(self.end, start + max_bytes)
        chunk = self._bytes(start, stop)
        data: str | bytes
        if encoding == "base64":
            data = chunk if raw else base64.b64encode(chunk).decode("ascii")
        else:
            cut = utf8_safe_end(chunk, self.eof and stop == self.end)
            stop = start + cut
            if cut < len(chunk):
                chunk = chunk[:cut]
            data = chunk if raw else str(chunk, "utf-8", "replace")
        if not peek:
            self.mark_read(stop)
        return Slice(data, start, stop, dropped)
