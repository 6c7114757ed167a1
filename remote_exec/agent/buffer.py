"""A bounded, cursor-addressed byte buffer for one output stream of a job.

Bytes are addressed by their absolute offset in the stream. The buffer keeps the newest
``limit`` bytes; older ones fall out and are reported to a reader as *dropped*, never silently.
While somebody is actively reading, the job applies back-pressure instead of dropping (see
:meth:`StreamBuffer.wants_pause`), so a watched stream loses nothing however fast it is written.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

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
    """What one read of a stream returned: encoded ``data`` covering ``[start, end)``."""

    data: str
    start: int
    end: int
    dropped: int


class StreamBuffer:
    """The retained tail of one stream plus the cursor bookkeeping for back-pressure."""

    __slots__ = ("_buf", "base", "eof", "limit", "read_cursor")

    def __init__(self, limit: int) -> None:
        self._buf = bytearray()
        self.base = 0  # absolute offset of _buf[0]
        self.eof = False
        self.limit = limit
        self.read_cursor = 0  # highest offset returned to any reader

    @property
    def end(self) -> int:
        """Absolute offset one past the newest byte."""
        return self.base + len(self._buf)

    def append(self, data: bytes, keep_unread: bool = False) -> None:
        """Add bytes at the end, letting the oldest fall out beyond ``limit``.

        With ``keep_unread`` (somebody is reading), only bytes a reader already has may fall out,
        so the buffer can exceed ``limit`` by what arrives while the producer is being paused.
        """
        self._buf += data
        excess = len(self._buf) - self.limit
        if keep_unread:
            excess = min(excess, self.read_cursor - self.base)
        if excess > 0:
            del self._buf[:excess]  # O(1): bytearray advances its start pointer
            self.base += excess

    def unread(self) -> int:
        """Bytes written but not yet returned to any reader."""
        return self.end - max(self.read_cursor, self.base)

    def wants_pause(self) -> bool:
        """True when half the buffer is unread: time to stop reading from the producer."""
        return self.unread() >= max(self.limit // 2, 1)

    def read(self, offset: int, max_bytes: int, encoding: str) -> Slice:
        """Return the data from ``offset`` on, at most ``max_bytes`` raw bytes of it.

        Text (``utf-8``) is cut on a character boundary while the stream is open; invalid bytes
        become U+FFFD. ``base64`` is byte-exact. A cursor past the end reads as empty.
        """
        if offset > self.end:
            raise ValueError(f"offset {offset} is past the end of the stream ({self.end} bytes)")
        start = max(offset, self.base)
        dropped = start - offset
        if start == self.end:
            return Slice("", start, start, dropped)
        stop = min(self.end, start + max_bytes)
        view = memoryview(self._buf)[start - self.base : stop - self.base]
        try:
            if encoding == "base64":
                data = base64.b64encode(view).decode("ascii")
            else:
                final = self.eof and stop == self.end
                cut = utf8_safe_end(view, final)
                stop = start + cut
                data = str(view[:cut], "utf-8", "replace")
        finally:
            view.release()
        if stop > self.read_cursor:
            self.read_cursor = stop
        return Slice(data, start, stop, dropped)
