"""A job in a pseudo-terminal: the agent reads the terminal's master and appends to the job's log.

A plain job writes its log file itself; a terminal has no file side, so here the agent is the
reader: the master is non-blocking, read by the event loop (``add_reader``), each chunk appended
to ``stdout`` (stderr is the same terminal, so the ``stderr`` file stays empty). The log is
then exactly what a plain job's is: byte cursors, disk cap, replay from any offset.

Outliving the agent: the keeper holds a dup of the master (the ``hold`` op, keyed by the job
id, as a plain job's stdin pipe is). While no agent runs nobody reads it: the job blocks once
the terminal's buffer is full, and loses nothing; the hangup a closed terminal would send
never comes. The next agent takes the master back (the ``fd`` op) and reads on.

The end: the leader's exit is seen on its pidfd (as for a plain job), but its last output may
still be in the terminal. The reader goes on until the master says ``EIO`` (every slave fd is
closed), and the job's end is recorded only then, or :data:`DRAIN_LINGER` seconds after the
exit if a leftover (``sleep 300 &``) still holds the terminal open.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import signal
import struct
import subprocess
import termios
from typing import Any

from ...errors import InvalidParamsError, JobNotRunningError, SpawnError
from ...protocol import JobInfo, TtySize
from ..procfacts import proc_starttime
from .diskjob import DiskJob, _spawn_error
from .job import _killpg
from .proctree import MARKER

__all__ = ["PtyJob"]

log = logging.getLogger("remote_exec.agent")
READ_CHUNK = 64 * 1024
READS_PER_WAKEUP = 16  # at most 1 MiB per callback: a flood never starves the agent's other work
DRAIN_LINGER = 1.0  # after the leader's exit, wait this long for EIO (leftovers may hold the slave)
RETRY_WRITE = 1.0  # the disk was full: try the log again after this long (the job blocks meanwhile)
DEFAULT_TERM = "xterm-256color"


def set_size(fd: int, size: TtySize) -> None:
    """Set the terminal's size (``TIOCSWINSZ``); the kernel sends SIGWINCH to its foreground group."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", size.rows, size.cols, 0, 0))


def get_size(fd: int) -> TtySize | None:
    """The terminal's size now (``TIOCGWINSZ``), None if it cannot be read or is out of range."""
    try:
        rows, cols, _, _ = struct.unpack("HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
        return TtySize(cols=cols, rows=rows)
    except (OSError, ValueError):
        return None


def _take_terminal() -> None:  # pragma: no cover - runs in the child between fork and exec
    # Popen's start_new_session made us a session leader with no terminal; fd 0 is the slave.
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class PtyJob(DiskJob):
    """A :class:`DiskJob` whose fds 0, 1 and 2 are one pseudo-terminal that the agent reads."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.master: int | None = None  # read by the event loop; the stdin pipe writes a dup
        self.size = self.params.tty_size or TtySize()
        self._log = -1  # our O_APPEND fd on ``stdout``
        self._drained = False  # EIO seen: no slave fd is open any more
        self._exit_code: int | None = None
        self._leader_gone = False
        self._linger: asyncio.TimerHandle | None = None
        self._retry: asyncio.TimerHandle | None = None
        self._pending = b""  # a chunk the disk refused, written again by _retry_append

    def _meta(self) -> dict[str, Any]:
        meta = super()._meta()
        meta["tty"] = True
        meta["tty_size"] = {"cols": self.size.cols, "rows": self.size.rows}
        return meta

    def info(self) -> JobInfo:
        return super().info().model_copy(update={"tty": True, "tty_size": self.size})

    # -- start -----------------------------------------------------------------------------

    async def spawn(self) -> None:
        """Start the process on a new terminal; the agent keeps its master.

        :raises SpawnError: no pseudo-terminal can be had here (no ``/dev/pts``), or the process
            cannot be started. :raises NoSpaceError: the disk is full.
        """
        try:
            os.mkdir(self.dir, 0o700)
            self._log = os.open(self.dir / "stdout", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            os.close(os.open(self.dir / "stderr", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
        except OSError as exc:
            raise _spawn_error(exc, self.job_id, "its job dir") from None
        p = self.params
        stdin_input = self._decode_input(p.input) if p.input is not None else None
        try:
            master, slave = os.openpty()
        except OSError as exc:
            raise SpawnError(
                f"cannot allocate a pseudo-terminal in this sandbox ({exc}): tty jobs need /dev/ptmx and "
                "a devpts mount on /dev/pts",
                job_id=self.job_id,
            ) from None
        self.stdin.reserve_input(len(stdin_input or b""))
        try:
            set_size(slave, self.size)
            self._exec_on(slave)
        except BaseException:
            os.close(master)
            self.stdin.release()
            raise
        finally:
            os.close(slave)
        self.starttime = proc_starttime(self.pid)
        await self._adopt_master(master)
        if stdin_input is not None:  # typed ahead; a terminal's keyboard stays open (no EOF)
            self.stdin.write(stdin_input, offset=None, eof=False, reserved=True)
        if self.home.keeper.present:
            # The keeper's copy keeps the terminal alive (no SIGHUP) while no agent runs.
            dup = os.dup(master)
            try:
                await self.home.keeper.request({"op": "hold", "key": self.job_id}, fd=dup)
            finally:
                os.close(dup)
        self.save()

    def _exec_on(self, slave: int) -> None:
        p = self.params
        argv = ["/bin/sh", "-c", p.command] if isinstance(p.command, str) else list(p.command)
        env, switch = self._environment()
        kwargs: dict[str, Any] = dict(switch)
        env[MARKER] = self.job_id
        if not (p.env and "TERM" in p.env):
            env["TERM"] = DEFAULT_TERM  # the agent's own TERM (often "dumb" or none) is not the job's
        try:
            proc = subprocess.Popen(
                argv,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                cwd=p.cwd,
                env=env,
                start_new_session=True,
                close_fds=True,
                preexec_fn=_take_terminal,  # one ioctl between fork and exec: no lock taken
                **kwargs,
            )
        except (OSError, ValueError) as exc:
            raise _spawn_error(exc, self.job_id, repr(argv[0])) from None
        except subprocess.SubprocessError as exc:
            raise SpawnError(f"cannot start {argv[0]!r}: {exc}", job_id=self.job_id) from None
        proc.returncode = 0  # never reaped by Popen: _check_exit does, after recording the end
        self.pid = proc.pid

    async def _adopt_master(self, master: int) -> None:
        """Read ``master`` from now on, and write keystrokes to a dup of it."""
        os.set_blocking(master, False)
        os.set_inheritable(master, False)
        self.master = master
        if self._log < 0:
            self._log = os.open(self.dir / "stdout", os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        await self._attach_stdin(os.dup(master))
        asyncio.get_running_loop().add_reader(master, self._on_readable)
        self._watch_exit()
        self._arm_timeout()

    # -- re-adoption -------------------------------------------------------------------------

    async def _reattach(self) -> None:
        _, fds = await self.home.keeper.request({"op": "fd", "key": self.job_id})
        for extra in fds[1:]:
            os.close(extra)
        if not fds:
            # Nobody kept the terminal (no keeper): the job got its hangup when the agent died.
            self._drained = True
            self.stdin.attach(None, False)
            self._watch_exit()
            self._arm_timeout()
            return
        size = get_size(fds[0])
        if size is not None:
            self.size = size
        await self._adopt_master(fds[0])

    # -- the reader --------------------------------------------------------------------------

    def _on_readable(self) -> None:
        assert self.master is not None
        got = False
        for _ in range(READS_PER_WAKEUP):
            try:
                data = os.read(self.master, READ_CHUNK)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno != errno.EIO:
                    log.warning("job %s: reading its terminal failed: %s", self.job_id, exc)
                data = b""
            if not data:  # EIO: every slave fd is closed; all output has been read
                self._drained = True
                self._stop_reading()
                if self._leader_gone:
                    self._end_now()
                break
            if not self._append(data):
                break
            got = True
        if got:
            self._notify()

    def _append(self, data: bytes) -> bool:
        """Append to the log; False if the disk refused (reading pauses, the job blocks)."""
        view = memoryview(data)
        while view:
            try:
                n = os.write(self._log, view)
            except OSError as exc:
                log.warning("job %s: cannot append to its log (%s); retrying", self.job_id, exc)
                # The unwritten rest stays in memory (at most one chunk) until the disk has room.
                self._pending = bytes(view)
                self._stop_reading()
                self._retry = asyncio.get_running_loop().call_later(RETRY_WRITE, self._retry_append)
                return False
            view = view[n:]
        return True

    def _retry_append(self) -> None:
        self._retry = None
        data, self._pending = self._pending, b""
        if self._append(data) and self.master is not None and not self._drained:
            asyncio.get_running_loop().add_reader(self.master, self._on_readable)
            self._notify()

    def _stop_reading(self) -> None:
        if self.master is not None:
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(self.master)

    # -- the end -----------------------------------------------------------------------------

    def _leader_exited(self, code: int | None) -> None:
        if self._done.is_set() or self._leader_gone:
            return
        self._leader_gone = True
        self._exit_code = code
        self._exited = True
        self._exit_event.set()
        if self._drained or self.master is None:
            self._end_now()
        else:  # the reader finishes on EIO; a leftover holding the terminal gets this long
            self._linger = asyncio.get_running_loop().call_later(DRAIN_LINGER, self._end_now)

    def _end_now(self) -> None:
        if self._done.is_set():
            return
        if self.master is not None and not self._drained:
            self._on_readable()  # what is in the terminal now goes to the log first
            if self._done.is_set():
                return
        super()._leader_exited(self._exit_code)

    def _finish(self, state: str, code: int | None, ended_at: float | None, save: bool = True) -> None:
        for t in (self._linger, self._retry):
            if t is not None:
                t.cancel()
        self._stop_reading()
        if self.master is not None:
            os.close(self.master)  # with the keeper's copy dropped, leftovers get their hangup
            self.master = None
        if self._log >= 0:
            os.close(self._log)
            self._log = -1
        super()._finish(state, code, ended_at, save)

    def detach(self) -> None:
        super().detach()
        self._stop_reading()

    # -- operations --------------------------------------------------------------------------

    def send_signal(self, sig: int) -> None:
        """Signal the terminal's foreground process group, as a key such as Ctrl-C does (an
        interactive shell's running command, not the shell); the job's group if none is set."""
        if not self.running:
            raise JobNotRunningError(f"job {self.job_id} is {self._state}", job_id=self.job_id)
        pgrp = -1
        if self.master is not None:
            with contextlib.suppress(OSError):
                pgrp = os.tcgetpgrp(self.master)
        _killpg(pgrp if pgrp > 0 else self.pid, sig)

    def resize(self, size: TtySize) -> None:
        """Set the terminal's size; its foreground group gets SIGWINCH. Saved with the job."""
        if not self.running or self.master is None:
            raise JobNotRunningError(f"job {self.job_id} is {self._state}", job_id=self.job_id)
        set_size(self.master, size)
        self.size = size
        self.save()

    async def _terminate(self, grace: float) -> None:
        # A terminal's end is a hangup first (what closing a terminal window sends), then the
        # usual TERM/KILL of the whole tree.
        _killpg(self.pid, signal.SIGHUP)
        await super()._terminate(grace)


def not_a_tty(job_id: str) -> InvalidParamsError:
    """The error for ``exec_remote_resize`` on a job without a terminal."""
    return InvalidParamsError(f"job {job_id} has no terminal (it was not started with tty)", data={"job_id": job_id})
