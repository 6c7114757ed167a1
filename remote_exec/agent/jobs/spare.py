"""The next job's directory, made before any start asks for it.

A job's directory and its two log files are three file-system metadata operations. On a quiet
disk they cost microseconds; on a loaded one (ext4's journal shared with other work) each can
take milliseconds, and a start waits on them before it can exec: they were most of a loaded
agent's first byte. So the agent keeps one such directory ready, ``<state>/jobs.spare`` (0700,
its ``stdout``, ``stderr`` and an empty ``job.json`` 0600 and open, exactly a job dir's, and the
files a job's first output and end would create, empty: :data:`_MADE_AHEAD`), and a
start renames it to ``jobs/<job id>`` (one metadata operation, atomic, the open fds follow it)
and writes the job's first record into that ``job.json`` in place (later records replace it
atomically, see ``DiskJob.save``). The next spare is
made in a thread after each start and by the once-a-second sweep (after a failure, e.g. a full
disk): never on a start's path, and never blocking the event loop, where it would delay the poll
that follows every start. It holds no job and no id, so nothing is lost with
it: an agent that dies leaves at most an empty spare, which the next one removes and remakes.
A spare is made under ``jobs.spare.new`` and renamed into place whole, so ``jobs.spare`` is
either absent or complete (with all its files) to a start and to anyone who looks.

``jobs.spare`` is a job's to replace (jobs run as the agent's user): swapped for a symlink to an
outside dir, it became the next job's dir (its output shown was that dir's ``stdout``, its records
written there). So the spare's dir is held open from its making, its files are made through that
fd, and a start takes it only while ``jobs.spare`` is that very dir, checked again after the
rename (``statefile.same_dir``); otherwise the start makes its own dir.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import threading
from pathlib import Path
from typing import NamedTuple

from ..statefile import open_state_dir, same_dir

__all__ = ["SpareDir", "SpareFiles"]

log = logging.getLogger("remote_exec.agent")

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
# Files a job's first output and its end would otherwise create on their way to the reader (a
# create cost 130-300 us on the agent's loop on these machines' ext4, an open of one made ahead
# 12 us, by strace): the streams' time indexes (:mod:`.timeindex`, noted at the first output)
# and the temporary file of the next record (:func:`.jobrecord.write_record`, at the job's end).
# Empty: read as none. A shell run's dir keeps its ``job.json.tmp`` unused (its record is
# written in place).
_MADE_AHEAD = ("stdout.times", "stderr.times", "job.json.tmp")


class SpareFiles(NamedTuple):
    """The open fds of a spare's files, moved with it."""

    stdout: int
    stderr: int
    meta: int


class SpareDir:
    """One ready job dir at ``path`` (the jobs dir's sibling, so a rename moves it into place)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._making = path.with_name(path.name + ".new")
        self._fds: SpareFiles | None = None
        self._dir = -1  # an fd of the spare's dir itself, while there is one
        self._stale = True  # a previous agent's spare may be there: removed before the first fill
        self._closed = False
        self._filling = False
        # fill() runs in a thread; take() on the event loop never waits for it (no spare yet:
        # the start makes its own dir).
        self._lock = threading.Lock()

    @property
    def ready(self) -> bool:
        return self._fds is not None

    def refill(self) -> None:
        """Make the spare in a thread if there is none and none is being made; returns at once."""
        if self._fds is None and not self._filling and not self._closed:
            self._filling = True
            asyncio.get_running_loop().run_in_executor(None, self._fill_locked)

    def _fill_locked(self) -> None:
        try:
            with self._lock:
                self.fill()
        finally:
            self._filling = False
        if self._closed:  # closed while this fill ran: close() left what it made to this thread
            self._discard_locked()

    def fill(self) -> None:
        """Make the spare if there is none (a failure leaves none: a start then makes its own).
        Blocking: :meth:`refill` runs it in a thread."""
        if self._fds is not None or self._closed:
            return
        if self._stale:
            self._unplant()
            shutil.rmtree(self.path, ignore_errors=True)
            self._stale = False
        shutil.rmtree(self._making, ignore_errors=True)  # a fill that died half-way
        fds: list[int] = []
        try:
            os.mkdir(self._making, 0o700)
            fds.append(open_state_dir(self._making))
            for name in ("stdout", "stderr"):
                fds.append(os.open(name, _FLAGS, 0o600, dir_fd=fds[0]))
            meta_flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
            fds.append(os.open("job.json", meta_flags, 0o600, dir_fd=fds[0]))
            for name in _MADE_AHEAD:
                os.close(os.open(name, meta_flags, 0o600, dir_fd=fds[0]))
            self._unplant()
            os.rename(self._making, self.path)
            if not same_dir(fds[0], self.path):
                raise OSError(f"{self.path} is not the dir just made")
        except (OSError, ValueError):
            self._discard(fds)
            return
        self._dir = fds[0]
        self._fds = SpareFiles(*fds[1:])

    def _unplant(self) -> None:
        # A symlink or file a job put where the spare goes: the rename would fail on it for good.
        with contextlib.suppress(OSError):
            if not os.path.isdir(self.path) or os.path.islink(self.path):
                os.unlink(self.path)
                log.warning("skipped %s: not a dir of ours; removed", self.path)

    def take(self, dest: Path) -> SpareFiles | None:
        """Move the spare to ``dest`` and return its files' fds (the caller closes them), or
        None if there is none (or the rename failed): the caller makes the dir itself."""
        if not self._lock.acquire(blocking=False):
            return None  # being made right now
        try:
            fds, self._fds = self._fds, None
            dfd, self._dir = self._dir, -1
            if fds is None:
                return None
            try:
                if not same_dir(dfd, self.path):
                    raise OSError(f"{self.path} was replaced")
                os.rename(self.path, dest)
                if not same_dir(dfd, dest):  # swapped between the check and the rename
                    self._unmake(dest)
                    raise OSError(f"{self.path} was replaced")
            except OSError as exc:
                log.warning("skipped %s: %s; the job makes its own dir", self.path, exc)
                self._discard([dfd, *fds])
                return None
            os.close(dfd)
            return fds
        finally:
            self._lock.release()

    @staticmethod
    def _unmake(dest: Path) -> None:
        """Remove what a job swapped in and a rename moved to ``dest`` (never what it points to)."""
        if os.path.islink(dest) or not os.path.isdir(dest):
            os.unlink(dest)
        else:
            shutil.rmtree(dest)

    def close(self) -> None:
        """No more spares (shutdown, handover): remove the one there is. Never waits: it runs
        on the event loop, and a fill in progress (a loaded disk) removes what it made itself."""
        self._closed = True
        if not self._lock.acquire(blocking=False):
            return  # the fill's thread holds it: that thread sees ``_closed`` once done, and discards
        try:
            fds, self._fds = self._fds, None
            if fds is not None:
                self._discard(fds)
        finally:
            self._lock.release()

    def _discard_locked(self) -> None:
        with self._lock:  # (in the fill's thread: it may wait)
            fds, self._fds = self._fds, None
            dfd, self._dir = self._dir, -1
            if fds is not None:
                self._discard([dfd, *fds])

    def _discard(self, fds: tuple[int, ...] | list[int]) -> None:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(self._making, ignore_errors=True)
        shutil.rmtree(self.path, ignore_errors=True)
