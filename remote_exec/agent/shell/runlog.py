"""A durable shell run's output on disk: its own job dir, as a job's, capped as a job's.

The agent copies each run's visible bytes (what the framing lets through) from the session's
``out``/``err`` into ``<state dir>/jobs/<run id>/stdout`` and ``stderr``, read by the same
:class:`~remote_exec.agent.jobs.logfile.LogFile` as a job's logs: the same byte cursors, the
same per-stream cap (``output_cap``, default the agent's 1 GiB) that punches the head out and
reports ``*_dropped``, the same agent-wide log budget. The dir is the jobs' ready-made spare
(see ``agent/jobs/spare.py``), renamed: a run's path creates no file. ``job.json`` is written
in place when the run begins (with ``shell``: its session; the next agent's shell controller re-adopts it, the job
re-adoption leaves it alone) and again when it ends (with its ``end``): a finished run is then
a finished job to the next agent, listed, readable and attachable with its exit code, kept
and forgotten by the jobs' retention rules.

So the session's own files need to keep only what the next agent would re-read: from the
run's last checkpoint on (see :mod:`.session`), not the run's whole output.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
from typing import Any

from ..jobs.home import JobHome
from ..jobs.jobrecord import read_stdin_cursor
from ..jobs.logfile import LogFile
from ..jobs.spare import SpareFiles
from ..statefile import open_own_file

__all__ = ["RunLog"]

log = logging.getLogger("remote_exec.agent")

FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
META_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW


class RunLog:
    """The two log files of one run and its ``job.json``.

    :ivar files: stdout's and stderr's :class:`LogFile` (what polls read).
    :ivar skip: visible bytes per stream to drop before writing, because the log holds them
        already (a re-adopted run re-derives what an earlier agent wrote).
    """

    def __init__(self, home: JobHome, job_id: str, cap: int | None) -> None:
        self.dir = home.root / job_id
        self.cap = cap or home.cap
        self.files: dict[int, LogFile] = {}
        self.skip = {1: 0, 2: 0}
        self._fds = {1: -1, 2: -1}
        self._meta = -1
        self._home = home
        self._lost = False

    def discard(self) -> None:
        """Delete the run's dir (it was forgotten) without blocking the event loop."""
        self._home.discard(self.dir)

    def open(self, spare: SpareFiles | None = None, create: bool = True) -> None:
        """Open the dir and the files, and charge them to the log budget: ``spare``'s (the jobs'
        ready-made dir, renamed to ours already: no file to create on the run's path), else made
        here (``create``), else an earlier agent's (re-adopted: what they hold is not written
        again).

        :raises OSError: they cannot be made or are missing.
        """
        if spare is not None:
            self._fds[1], self._fds[2], self._meta = spare
        else:
            try:
                if create:
                    os.mkdir(self.dir, 0o700)
                for fd, name in ((1, "stdout"), (2, "stderr")):
                    self._fds[fd] = open_own_file(self.dir / name, FLAGS)
                self._meta = open_own_file(self.dir / "job.json", META_FLAGS)
            except OSError:
                self.close()
                raise
            except ValueError as exc:  # another user's file in the way (open_own_file)
                self.close()
                raise OSError(errno.EPERM, str(exc)) from None
        for fd, name in ((1, "stdout"), (2, "stderr")):
            self.files[fd] = LogFile(os.fspath(self.dir / name), self.cap, timed=True)
            self.files[fd].charge_to(self._home.logs)
        if spare is None and not create:  # the bytes an earlier agent wrote are re-derived: skip them
            self.skip = {fd: self.files[fd].end for fd in (1, 2)}

    def write(self, fd: int, data: bytes) -> None:
        """Append the run's visible ``data`` of stream ``fd``, then apply the cap."""
        skip = self.skip[fd]
        if skip:
            self.skip[fd] = max(0, skip - len(data))
            data = data[skip:]
            if not data:
                return
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fds[fd], view) :]
        except OSError as exc:
            # A full disk: what is not written is not in the log. Said once, in the agent's log.
            if not self._lost:
                self._lost = True
                log.warning("cannot write the output of shell run %s: %s", self.dir.name, exc)
        self.files[fd].enforce_cap()

    def logged(self) -> list[int]:
        """The visible bytes per stream the framing has let through for the run so far."""
        return [self.files[fd].end - self.skip[fd] for fd in (1, 2)]

    def save(self, meta: dict[str, Any]) -> None:
        """Write ``job.json`` in place (a ``pwrite`` and an ``ftruncate``: no create or rename on
        a run's path). An agent killed mid-write leaves it torn: the job re-adoption leaves a
        shell run's dir alone then, and the session's re-adoption writes it again (the session's
        record names the run until the next one begins). A full disk: the older one stays."""
        data = memoryview(json.dumps(meta).encode())
        with contextlib.suppress(OSError):
            at = 0
            while at < len(data):
                at += os.pwrite(self._meta, data[at:], at)
            os.ftruncate(self._meta, len(data))

    def save_stdin_cursor(self, written: int) -> None:
        """Keep the run's stdin cursor (bytes taken), so a writer resumes exactly after a restart."""
        with contextlib.suppress(OSError, ValueError):
            fd = open_own_file(self.dir / "stdin_bytes", META_FLAGS)
            try:
                os.pwrite(fd, b"%20d\n" % written, 0)
            finally:
                os.close(fd)

    def stdin_cursor(self) -> int:
        """The cursor :meth:`save_stdin_cursor` kept (0 if none)."""
        return read_stdin_cursor(self.dir) or 0

    def close(self) -> None:
        """Close the files (the run ended: its logs stay for readers, as a job's)."""
        for fd in (1, 2):
            if self._fds[fd] >= 0:
                with contextlib.suppress(OSError):
                    os.close(self._fds[fd])
                self._fds[fd] = -1
        if self._meta >= 0:
            with contextlib.suppress(OSError):
                os.close(self._meta)
            self._meta = -1
