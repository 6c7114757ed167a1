"""When a job's output was written, to the second: what ``remote-exec logs --since`` reads.

A log holds the job's bytes as it wrote them, with no time on them (the job writes its own fd;
the agent is not in the way). The agent looks at every running job's files every second (the
disk cap's sweep) and on every read; each look that finds a stream longer than the last one
appends ``(time, end)`` to the stream's index file beside its log (``stdout.times``): at wall
time ``time`` the stream had ``end`` bytes. The bytes after the end of the last look at or
before a time ``since`` were all first seen after it, so ``offset_at(since)`` is where the
output of ``since`` and later begins — never later than the truth; up to a look's interval
(a second) earlier, or more while no agent looked (the keeper alone keeps no index: bytes
written meanwhile carry the time the next agent first saw them).

Bounded: at most :data:`MAX_ENTRIES` entries; when full, every other older entry goes (the
answer only moves earlier: more output, never less). The file sits in the job's dir, which the
job can write: it is read as untrusted — at most ``2 * MAX_ENTRIES`` records, kept only while
times and ends both grow, and every answer is clamped to the stream by its caller — and written
as every file the agent keeps for a job (:func:`~remote_exec.agent.statefile.open_own_file`: a
symlink, FIFO or hard link in its place is replaced, never written through).
"""

from __future__ import annotations

import contextlib
import math
import os
import struct
import time

from ..statefile import open_own_file

__all__ = ["MAX_ENTRIES", "TimeIndex"]

MAX_ENTRIES = 4096  # 64 KiB of file per stream
_RECORD = struct.Struct("<dQ")  # wall time (s), the stream's end (bytes)
_FLAGS = os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK  # read: the job can replace the file (no symlink, no FIFO)
MIN_STEP = 1.0  # seconds between two entries: at most one a second, whatever the reads


class TimeIndex:
    """The ``(time, end)`` looks of one stream, in memory and in the file at ``path``."""

    __slots__ = ("_entries", "_loaded", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        self._entries: list[tuple[float, int]] = []
        self._loaded = False

    def note(self, end: int, now: float | None = None) -> None:
        """A look found the stream ``end`` bytes long (longer than the last look)."""
        now = time.time() if now is None else now
        entries = self._load()
        if entries and (now < entries[-1][0] + MIN_STEP or end <= entries[-1][1]):
            # Within a second of the last entry: that one's time stays (the bytes are at most a
            # second older than said). A clock set back or a shorter end: nothing to add.
            return
        entries.append((now, end))
        if len(entries) > MAX_ENTRIES:
            del entries[1:-1:2]  # the newest kept exactly: the old ones thinned
            self._rewrite()
        else:
            self._append(entries[-1])

    def offset_at(self, since: float) -> int:
        """Where the bytes written at or after wall time ``since`` begin (0: all of them)."""
        before = [end for t, end in self._load() if t <= since]
        return before[-1] if before else 0

    def _load(self) -> list[tuple[float, int]]:
        if not self._loaded:
            self._loaded = True
            self._entries = _read(self.path)
        return self._entries

    def _append(self, entry: tuple[float, int]) -> None:
        with contextlib.suppress(OSError, ValueError):  # no index: --since answers earlier
            fd = open_own_file(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            try:
                os.write(fd, _RECORD.pack(*entry))
            finally:
                os.close(fd)

    def _rewrite(self) -> None:
        tmp = self.path + ".new"
        with contextlib.suppress(OSError, ValueError):
            fd = open_own_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            try:
                os.write(fd, b"".join(_RECORD.pack(*e) for e in self._entries))
            finally:
                os.close(fd)
            os.replace(tmp, self.path)


def _read(path: str) -> list[tuple[float, int]]:
    """The file's entries: the last ``2 * MAX_ENTRIES`` records, up to the first that does not
    follow its predecessor (times and ends both growing, times finite and >= 0)."""
    try:
        fd = os.open(path, os.O_RDONLY | _FLAGS)
    except OSError:
        return []
    try:
        size = os.fstat(fd).st_size
        n = min(size // _RECORD.size, 2 * MAX_ENTRIES)
        raw = os.pread(fd, n * _RECORD.size, (size // _RECORD.size - n) * _RECORD.size)
    except OSError:
        return []
    finally:
        os.close(fd)
    entries: list[tuple[float, int]] = []
    for t, end in _RECORD.iter_unpack(raw[: len(raw) // _RECORD.size * _RECORD.size]):
        if not (math.isfinite(t) and t >= 0) or (entries and (t < entries[-1][0] or end <= entries[-1][1])):
            break
        entries.append((t, end))
    return entries[-MAX_ENTRIES:]
