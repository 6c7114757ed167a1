"""The shell's output files, read as they grow: what pipes to the agent were before they had to
outlive it.

The shell writes its fds 1 and 2 straight into ``out`` and ``err`` in its session dir, so no byte
depends on the agent reading it: with no agent the shell goes on writing (no SIGPIPE, no full
pipe), and the next agent reads on from where the record says. The agent reads at its own offsets
(``pos``), woken by inotify (a poll every :data:`POLL` seconds where inotify is missing), and
hands each chunk on at once: a run's bytes go to its own log on disk, so nothing piles up in
memory and nothing needs pausing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import Callable
from pathlib import Path

from ..holepunch import BLOCK
from ..jobs.logfile import Inotify, LogFile

__all__ = ["ShellFiles"]

CHUNK = 256 * 1024
BURST = 16  # chunks per stream per turn of the event loop, so one flood does not starve the rest
POLL = 0.05  # seconds between looks at the files without inotify
DROP_STEP = 1 << 20  # bytes no run needs any more before they are punched out of a file


class ShellFiles:
    """``out`` and ``err`` of one session dir, read from ``pos`` on, handed to ``on_data``."""

    def __init__(
        self,
        path: Path,
        pos: tuple[int, int],
        pid: int,
        on_data: Callable[[int, bytes], None],
        inotify: Inotify | None,
    ) -> None:
        self.path = path
        self.pos = {1: pos[0], 2: pos[1]}
        self.closed = False
        self._pid = pid
        self._on_data = on_data
        self._fds = {1: -1, 2: -1}
        self._inotify = inotify
        self._wd = -1
        self._scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._dropped = {1: 0, 2: 0}  # where each file's data begins, as far as we punched

    def open(self) -> None:
        """Open the files and start following them.

        :raises OSError: a file is missing, or is not a regular file (the shell's user can
            replace it: a FIFO would block the agent in ``open``).
        """
        for fd, name in ((1, "out"), (2, "err")):
            self._fds[fd] = os.open(self.path / name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
            if not stat.S_ISREG(os.fstat(self._fds[fd]).st_mode):
                os.close(self._fds[fd])
                self._fds[fd] = -1
                raise OSError(f"{self.path / name} is not a regular file")
        if self._inotify is not None:
            self._wd = self._inotify.watch(os.fspath(self.path), self.wake)
        if self._wd < 0:
            self._timer = asyncio.get_running_loop().call_later(POLL, self._tick)
        self.wake()

    def wake(self) -> None:
        """Something may have been written: read it (soon, once however often it is called)."""
        if not self._scheduled and not self.closed:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _tick(self) -> None:
        self._timer = None
        if not self.closed:
            self.wake()
            self._timer = asyncio.get_running_loop().call_later(POLL, self._tick)

    def _pump(self) -> None:
        self._scheduled = False
        more = False
        for fd in (1, 2):
            for _ in range(BURST):
                if self.closed or not self._read(fd):
                    break
            else:
                more = True
        if more:
            self.wake()

    def _read(self, fd: int) -> bool:
        """Read one chunk of stream ``fd`` and hand it on; False at the end of the file."""
        try:
            data = os.pread(self._fds[fd], CHUNK, self.pos[fd])
        except OSError:
            return False
        if not data:
            return False
        self.pos[fd] += len(data)
        self._on_data(fd, data)
        return True

    def drain(self) -> None:
        """Read everything there is now (the shell exited: nothing more comes)."""
        for fd in (1, 2):
            while not self.closed and self._read(fd):
                pass

    def replay(self, fd: int, start: int, stop: int, limit: int) -> bytes:
        """The bytes of stream ``fd`` in ``[start, stop)`` (a run's stray head, re-read), at
        most the last ``limit`` of them: the span comes from a record the shell's user may have
        written, and a huge one must not become a huge allocation.

        :raises ValueError: a negative offset.
        """
        if start < 0 or stop < 0:
            raise ValueError(f"offsets {start}, {stop} are not a file's")
        start = max(start, stop - limit)
        try:
            return os.pread(self._fds[fd], max(0, stop - start), start)
        except (OSError, OverflowError):
            return b""

    def drop_before(self, offsets: tuple[int, int]) -> None:
        """Free the disk blocks before ``offsets`` (nothing before them is needed again).

        Only once a whole :data:`DROP_STEP` is due: a punch costs two opens, and most runs are short.
        """
        for fd, name, offset in ((1, "out", offsets[0]), (2, "err", offsets[1])):
            if offset - self._dropped[fd] >= DROP_STEP:
                log = LogFile(os.fspath(self.path / name), 0)
                log.drop_head(offset // BLOCK * BLOCK - log.base)
                self._dropped[fd] = log.base

    def close(self) -> None:
        """Stop reading and close the files (the session ended, or this agent leaves it)."""
        if self.closed:
            return
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        if self._wd >= 0 and self._inotify is not None:
            self._inotify.unwatch(self._wd)
            self._wd = -1
        for fd in (1, 2):
            if self._fds[fd] >= 0:
                with contextlib.suppress(OSError):
                    os.close(self._fds[fd])
                self._fds[fd] = -1
