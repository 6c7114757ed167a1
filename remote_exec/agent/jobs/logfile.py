"""A job's output stream as a file in its job dir, read at byte offsets, its head dropped by
punching a hole once it passes its cap.

The job writes the file itself (its fd 1 or 2 is the file, opened ``O_APPEND``): no pipe to the
agent, so no SIGPIPE when the agent dies, output keeps flowing while no agent runs, and the
agent's memory does not grow with output. A reader's cursor is a file offset, so it stays valid
across agents.

The cap: once ``size - base`` passes ``cap``, the agent punches ``[0, new_base)`` out of the
file (``fallocate(PUNCH_HOLE | KEEP_SIZE)``, ``new_base`` rounded down to 4 KiB): the blocks are
freed, offsets do not move, and a reader before ``new_base`` is told exactly how many bytes it
missed (``*_dropped``). ``base`` is recovered after a restart from ``lseek(SEEK_DATA)`` (the
first byte that is not a hole). Where punching is unsupported (``EOPNOTSUPP``: some FUSE and
network file systems) the cap cannot be applied: the file grows and the agent logs it once.

A truncation: the job may truncate its own log (``: > /dev/stdout`` opens its fd 1's file with
``O_TRUNC``) and write on from offset 0. Seen as a file shorter than the agent last saw it, it
moves the stream's ``shift`` (the stream offset of the file's byte 0) to the end the agent had
seen: offsets never go back, what the job writes afterwards follows, and a reader whose cursor
was before that end is told exactly how many of the bytes it missed the truncation took
(``*_truncated``, part of ``*_dropped``), instead of its cursor being "past the end". The
residual: bytes the job wrote and truncated between two looks of the agent are unknown to it,
and a job that writes back more than it truncated away before the agent looks is read on as if
nothing had happened (the agent looks on every poll and read, and every second while it runs).
The shift is the agent's own: a later agent counts from the file again.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import logging
import os
import stat
import struct
from typing import TYPE_CHECKING

from ..buffer import Slice, utf8_safe_end
from ..filespan import FileSpan
from ..holepunch import BLOCK, data_start, punch_head
from .timeindex import TimeIndex

if TYPE_CHECKING:
    from .logbudget import LogBudget

__all__ = ["Inotify", "LogFile"]

log = logging.getLogger("remote_exec.agent")
MAX_CUTS = 64  # truncations remembered per stream (older ones: counted as dropped only)
# The job can replace its log (it runs as the agent's user): never through a symlink, never
# blocked in open() by a FIFO, and only a regular file is read or punched.
_FLAGS = os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
_libc = ctypes.CDLL(None, use_errno=True)  # inotify's calls


class LogFile:
    """One output stream of one job: ``path`` and what the agent knows of it.

    No fd is held between reads: 5 000 jobs cost no descriptors.
    """

    __slots__ = (
        "_alloc",
        "_size",
        "_warned",
        "base",
        "cap",
        "cuts",
        "eof",
        "ledger",
        "mtime",
        "path",
        "pins",
        "shift",
        "times",
    )

    def __init__(self, path: str, cap: int, *, timed: bool = False) -> None:
        self.path = path
        self.cap = cap
        self.eof = False  # set when the job ended (the leader exited)
        self._size = 0
        self._alloc = 0  # bytes of disk blocks the file holds (st_blocks * 512), as last seen
        self.mtime: float | None = None  # the file's mtime at the last look, once it holds bytes
        self._warned = False
        self.ledger: LogBudget | None = None
        self.shift = 0  # the stream offset of the file's byte 0: moved by a truncation
        self.cuts: list[tuple[int, int]] = []  # stream ranges truncations took (the last MAX_CUTS)
        self.pins: list[int] = []  # file offsets of spans being sent (see ..filespan): never punched
        self.base = self._find_base()
        # When its bytes were written, to the second (``logs --since``): a job's own logs only.
        self.times = TimeIndex(path + ".times") if timed else None

    @property
    def held(self) -> int:
        """Bytes of disk the stream's file takes, as last seen (no stat): its allocated blocks,
        never its apparent size. A job can make its log sparse (``truncate -s 20G`` on its own
        stdout: 20 GB long, 40 KiB on disk); counted by size, that once made the log budget punch
        out every other finished job's output."""
        return self._alloc

    def charge_to(self, ledger: LogBudget | None) -> None:
        """Count this stream's bytes in ``ledger`` (the agent's log budget); None stops counting."""
        if self.ledger is not None:
            self.ledger.charge(-self.held)
        self.ledger = ledger
        if ledger is not None:
            ledger.charge(self.held)

    def _moved(self, size: int, base: int, st: os.stat_result) -> None:
        """The size, base or blocks changed: tell the ledger by how much the blocks held did."""
        alloc = st.st_blocks * 512
        if self.ledger is not None:
            self.ledger.charge(alloc - self._alloc)
        self._size, self.base, self._alloc = size, base, alloc

    def _find_base(self) -> int:
        try:
            fd = _open_regular(self.path, os.O_RDONLY)
        except OSError:
            return 0
        try:
            st = os.fstat(fd)
            self._size = st.st_size
            self._alloc = st.st_blocks * 512
            self.mtime = st.st_mtime if st.st_size else None
            return data_start(fd, st.st_size)
        except OSError:
            return 0
        finally:
            os.close(fd)

    @property
    def end(self) -> int:
        """Bytes written so far (the stream's: the file's size past the shift). The same stat
        gives ``mtime``: when the job last wrote, taken only when the size grew (a head punched
        out of a quiet job's log by the log budget changes the file's mtime, not its size: it is
        no output). A file shorter than last seen was truncated by the job (see the module)."""
        with contextlib.suppress(OSError):
            st = os.stat(self.path, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                return self._size  # replaced by the job (a symlink, a FIFO): not its output
            size = st.st_size
            if size != self._size:
                # The job can set its log's mtime (touch its own fd 1): only a sane one is kept.
                self.mtime = st.st_mtime if size and 0 <= st.st_mtime < 1e11 else None
                if size < self._size:
                    self._truncated(st)
            grew = size > self._size
            if size != self._size or st.st_blocks * 512 != self._alloc:
                self._moved(size, self.base, st)
            if grew and self.times is not None:
                self.times.note(self.shift + size)
        return self.shift + self._size

    def _truncated(self, st: os.stat_result) -> None:
        """The job truncated the file: what was held is gone; the stream goes on after it."""
        lost = (self.shift + self.base, self.shift + self._size)
        if lost[1] > lost[0]:
            self.cuts = [*self.cuts[-(MAX_CUTS - 1) :], lost]
        self.shift += self._size
        self._moved(0, 0, st)  # (the ledger is told of the blocks that went with the file's old size)
        log.info("%s was truncated by its job: %d bytes lost", self.path, lost[1] - lost[0])

    def lost_to_cuts(self, start: int, stop: int) -> int:
        """How many bytes of stream range ``[start, stop)`` truncations took."""
        return sum(max(0, min(stop, hi) - max(start, lo)) for lo, hi in self.cuts)

    def enforce_cap(self) -> int:
        """Punch the head out if the stream passed its cap; return the bytes newly dropped."""
        size = self.end - self.shift  # in the file
        if size - self.base <= self.cap:
            return 0
        return self._punch((size - self.cap) // BLOCK * BLOCK)

    def drop_head(self, n: int) -> int:
        """Drop about ``n`` bytes of the head (the log budget's eviction); return how many went.

        Rounded up to a whole 4 KiB block, but never into the last partial block: the job may
        still be appending to it (or a leftover of a finished one), and a punch there would
        lose bytes written after our ``stat`` without a count.
        """
        if n <= 0:
            return 0
        size = self.end - self.shift  # in the file
        return self._punch(min(-(-(self.base + n) // BLOCK) * BLOCK, size // BLOCK * BLOCK))

    def pin(self, file_offset: int) -> bool:
        """Keep the file from ``file_offset`` on out of every punch until :meth:`unpin`; False
        (nothing pinned) if it was punched out already: a span of it can no longer be sent."""
        if file_offset < self.base:
            return False
        self.pins.append(file_offset)
        return True

    def unpin(self, file_offset: int) -> None:
        self.pins.remove(file_offset)

    def _punch(self, new_base: int) -> int:
        """Punch ``[0, new_base)`` (block-aligned, never past a pin) out of the file; return the
        bytes newly dropped."""
        if self.pins:
            new_base = min(new_base, min(self.pins) // BLOCK * BLOCK)
        if new_base <= self.base:
            return 0
        try:
            fd = _open_regular(self.path, os.O_WRONLY)
        except OSError:
            return 0
        try:
            err = punch_head(fd, new_base)
            if err:
                if not self._warned:
                    self._warned = True
                    log.warning("cannot drop the head of %s (%s): its cap is not applied", self.path, os.strerror(err))
                return 0
            st = os.fstat(fd)  # the blocks freed: what the budget counts
        finally:
            os.close(fd)
        dropped = new_base - self.base
        self._moved(self._size, new_base, st)
        return dropped

    def read(self, offset: int, max_bytes: int, encoding: str, raw: bool = False) -> Slice:
        """The data from ``offset`` on, at most ``max_bytes`` of it: bytes (``raw``), else text
        (base64 for a ``base64`` job; UTF-8 cut before an incomplete character of a running
        job, so none is split between two reads). Reading moves nothing: cursors are the readers'.

        :raises ValueError: ``offset`` is past the end of the stream.
        """
        end, start, truncated, stop = self._extent(offset, max_bytes)
        dropped = start - offset
        chunk = b""
        if stop > start:
            try:
                fd = _open_regular(self.path, os.O_RDONLY)
            except OSError:
                fd = -1
            if fd >= 0:
                try:
                    chunk = os.pread(fd, stop - start, start - self.shift)
                finally:
                    os.close(fd)
        stop = start + len(chunk)
        data: str | bytes
        if encoding == "base64":
            data = chunk if raw else base64.b64encode(chunk).decode("ascii")
        else:
            cut = utf8_safe_end(chunk, self.eof and stop == end)
            if cut < len(chunk):
                chunk = chunk[:cut]
                stop = start + cut
            data = chunk if raw else str(chunk, "utf-8", "replace")
        return Slice(data, start, stop, dropped, truncated)

    def _extent(self, offset: int, max_bytes: int) -> tuple[int, int, int, int]:
        """What a read from ``offset`` covers: the stream's end, where the bytes still held
        start (past what the cap or a truncation dropped), how many of the dropped a truncation
        took, and where the read stops.

        :raises ValueError: ``offset`` is past the end of the stream.
        """
        end = self.end
        if offset > end:
            raise ValueError(f"offset {offset} is past the end of the stream ({end} bytes)")
        start = max(offset, self.shift + self.base)
        truncated = self.lost_to_cuts(offset, start) if self.cuts else 0
        return end, start, truncated, min(end, start + max_bytes)

    def span(self, offset: int, max_bytes: int, encoding: str) -> tuple[Slice, FileSpan]:
        """What :meth:`read` with ``raw`` would give (``data`` empty), and the file's bytes it
        covers, to be sent by :func:`~..filespan.send_span`. Only the last three bytes of a
        text job's span are read (where a character may be cut).

        :raises ValueError: ``offset`` is past the end of the stream.
        """
        end, start, truncated, stop = self._extent(offset, max_bytes)
        if encoding != "base64" and stop > start and not (self.eof and stop == end):
            n = min(3, stop - start)
            try:
                fd = _open_regular(self.path, os.O_RDONLY)
            except OSError:
                last = b""
            else:
                try:
                    last = os.pread(fd, n, stop - n - self.shift)
                finally:
                    os.close(fd)
            stop -= len(last) - utf8_safe_end(last, False)
        return Slice(b"", start, stop, start - offset, truncated), FileSpan(self.path, start - self.shift, stop - start)


def _open_regular(path: str, mode: int) -> int:
    """``path`` opened with ``mode`` if it is a regular file (see ``_FLAGS``).

    :raises OSError: it is not (or cannot be opened)."""
    fd = os.open(path, mode | _FLAGS)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a regular file")
    return fd


class Inotify:
    """One inotify fd for the agent: a watch per job dir only while a poller waits on the job.

    ``watch(path, callback)`` returns a handle for ``unwatch`` (-1: no watch could be added); the
    callback runs on every change under the dir (a write to either stream). The event loop reads
    the fd: no thread.
    """

    IN_MODIFY = 0x2
    _EVENT = struct.Struct("iIII")

    def __init__(self) -> None:
        self.fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        self._callbacks: dict[int, list[object]] = {}  # wd -> [callback, refs]
        self._warned = False

    @property
    def available(self) -> bool:
        return bool(self.fd >= 0)

    def watch(self, path: str, callback: object) -> int:
        wd = int(_libc.inotify_add_watch(self.fd, path.encode(), self.IN_MODIFY))
        if wd < 0:
            if not self._warned:  # ENOSPC: the user's inotify watches are used up (a sysctl)
                self._warned = True
                err = os.strerror(ctypes.get_errno())
                log.warning("cannot watch %s with inotify (%s): waiting polls look at its files instead", path, err)
            return -1
        entry = self._callbacks.setdefault(wd, [callback, 0])
        entry[1] = int(entry[1]) + 1  # type: ignore[call-overload]
        return wd

    def unwatch(self, wd: int) -> None:
        entry = self._callbacks.get(wd)
        if entry is None:
            return
        entry[1] = int(entry[1]) - 1  # type: ignore[call-overload]
        if int(entry[1]) <= 0:  # type: ignore[call-overload]
            del self._callbacks[wd]
            _libc.inotify_rm_watch(self.fd, wd)

    def on_readable(self) -> None:
        """Dispatch the events the fd holds (called by the event loop)."""
        try:
            data = os.read(self.fd, 65536)
        except OSError:
            return
        fired: set[int] = set()
        pos = 0
        while pos + self._EVENT.size <= len(data):
            wd, _, _, length = self._EVENT.unpack_from(data, pos)
            pos += self._EVENT.size + length
            fired.add(wd)
        for wd in fired:
            entry = self._callbacks.get(wd)
            if entry is not None:
                entry[0]()  # type: ignore[operator]
