"""A job in a pseudo-terminal: a forked copier appends the terminal's output to the job's log.

A plain job writes its log file itself; a terminal has no file side, so a small process forked
from the agent (:mod:`.ptyrelay`) copies the master into ``stdout`` (stderr is the same terminal,
so the ``stderr`` file stays empty). The log is then exactly a plain job's: byte cursors, disk
cap, replay from any offset, and pollers woken by inotify as the file grows.

Outliving the agent: the copier is not the agent, so output keeps reaching the disk while no
agent runs and an agent's SIGKILL loses no byte. The keeper holds a dup of the master (the
``hold`` op, keyed by the job id, as a plain job's stdin pipe is) for keystrokes and resizes,
and the next agent takes it back (the ``fd`` op). The copier's pid and start time are in
``job.json``, so the next agent watches it too.

The end: the leader's exit is seen on its pidfd (as for a plain job), but its last output may
still be in the terminal. The end is recorded once the copier has exited (the master said
``EIO``: every slave fd is closed, all output is on disk), or :data:`DRAIN_LINGER` seconds after
the leader's exit if a leftover (``sleep 300 &``) still holds the terminal open; the copier is
then stopped (what leftovers print after the end is not the job's). With no leftover the copier
is waited for (up to :data:`DRAIN_MAX`): on a loaded machine it may not have run yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import struct
import subprocess
import termios
from typing import Any

from ...errors import JobNotRunningError, SpawnError
from ...protocol import JobInfo, TtySize
from ..procfacts import proc_starttime
from .diskjob import DiskJob
from .job import _killpg
from .proctable import scan, session_members
from .proctree import MARKER
from .ptyrelay import fork_relay
from .spare import SpareDir
from .spawn import spawn_error
from .stdin import remember

__all__ = ["PtyJob"]

log = logging.getLogger("remote_exec.agent")
DRAIN_LINGER = 1.0  # after the leader's exit, wait this long for the copier (leftovers may hold the slave)
DRAIN_MAX = 60.0  # with no leftover, wait this long at most for a copier that has not run yet
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
    """A :class:`DiskJob` whose fds 0, 1 and 2 are one pseudo-terminal, copied to its log."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.master: int | None = None  # for tcgetpgrp and resizes; the stdin pipe writes a dup
        self.size = self.params.tty_size or TtySize()
        self.relay = 0  # the copier's pid and start time (0: none, or gone)
        self.relay_start: int | None = None
        self._relay_fd: int | None = None  # its pidfd, readable once it exited
        self._exit_code: int | None = None
        self._leader_gone = False
        self._linger: asyncio.TimerHandle | None = None
        self._look: asyncio.Task[None] | None = None  # (held: a task nobody holds may be collected)
        self._drain_deadline = 0.0
        self._eof_typed: dict[str, int] = {}  # writer -> its cursor when its Ctrl-D was typed

    def _meta(self) -> dict[str, Any]:
        meta = super()._meta()
        meta["tty"] = True
        meta["tty_size"] = {"cols": self.size.cols, "rows": self.size.rows}
        meta["relay"] = {"pid": self.relay, "start": self.relay_start}
        return meta

    def info(self) -> JobInfo:
        return super().info().model_copy(update={"tty": True, "tty_size": self.size})

    # -- start -----------------------------------------------------------------------------

    async def spawn(self, spare: SpareDir | None = None) -> None:
        """Start the process on a new terminal and its copier; the agent keeps the master.

        A terminal job makes its own dir (``spare`` is not used: its output file is opened for
        the copier, not given to the job).

        :raises SpawnError: no pseudo-terminal can be had here (no ``/dev/pts``), or the process
            cannot be started. :raises NoSpaceError: the disk is full.
        """
        try:
            os.mkdir(self.dir, 0o700)
            log_fd = os.open(self.dir / "stdout", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            os.close(os.open(self.dir / "stderr", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
        except OSError as exc:
            raise spawn_error(exc, self.job_id, "its job dir") from None
        p = self.params
        stdin_input = self._decode_input(p.input) if p.input is not None else None
        try:
            master, slave = os.openpty()
        except OSError as exc:
            os.close(log_fd)
            raise SpawnError(
                f"cannot allocate a pseudo-terminal in this sandbox ({exc}): tty jobs need /dev/ptmx and "
                "a devpts mount on /dev/pts",
                job_id=self.job_id,
            ) from None
        self.stdin.reserve_input(len(stdin_input or b""))
        try:
            os.set_blocking(master, False)
            set_size(slave, self.size)
            self._exec_on(slave)
            # The copier starts before the agent awaits anything: no output waits for it.
            try:
                self.relay = fork_relay(master, log_fd)
            except OSError as exc:
                raise SpawnError(f"cannot start the copier of its terminal: {exc}", job_id=self.job_id) from None
        except BaseException:
            if self.pid:  # started, but no copier could be forked: nobody would ever read it
                _killpg(self.pid, signal.SIGKILL)  # (its zombie goes to the keeper with this agent)
            os.close(master)
            self.stdin.release()
            raise
        finally:
            os.close(slave)
            os.close(log_fd)
        self.starttime = proc_starttime(self.pid)
        self.relay_start = proc_starttime(self.relay)
        await self._tell_leader()
        await self._adopt_master(master)
        if stdin_input is not None:  # typed ahead; a terminal's keyboard stays open (no EOF)
            self.stdin.write(stdin_input, offset=None, eof=False, reserved=True)
        if self.home.keeper.present:
            # The next agent takes the master back from the keeper (keystrokes, resizes).
            dup = os.dup(master)
            try:
                await self.home.keeper.request({"op": "hold", "key": self.mark}, fd=dup)
            finally:
                os.close(dup)
        self.save()

    def _exec_on(self, slave: int) -> None:
        p = self.params
        argv = ["/bin/sh", "-c", p.command] if isinstance(p.command, str) else list(p.command)
        env, switch = self._environment()
        kwargs: dict[str, Any] = dict(switch)
        kwargs["preexec_fn"] = _take_terminal  # one ioctl between fork and exec: no lock taken
        argv, join_fds, within = self._join_cgroup(argv, kwargs, env)  # and the job's cgroup (see .cgroup)
        env[MARKER] = self.mark
        if not (p.env and "TERM" in p.env):
            env["TERM"] = DEFAULT_TERM  # the agent's own TERM (often "dumb" or none) is not the job's
        try:
            with within:
                proc = subprocess.Popen(
                    argv,
                    stdin=slave,
                    stdout=slave,
                    stderr=slave,
                    cwd=p.cwd,
                    env=env,
                    start_new_session=True,
                    close_fds=True,
                    **kwargs,
                )
        except (OSError, ValueError) as exc:
            raise spawn_error(exc, self.job_id, repr(argv[0])) from None
        except subprocess.SubprocessError as exc:
            raise SpawnError(f"cannot start {argv[0]!r}: {exc}", job_id=self.job_id) from None
        finally:
            for fd in join_fds:
                os.close(fd)
        proc.returncode = 0  # never reaped by Popen: the LeaderWatch does, after recording the end
        self.pid = proc.pid

    async def _adopt_master(self, master: int) -> None:
        """Keep ``master`` (keystrokes go to a dup of it) and watch the leader and the copier."""
        os.set_inheritable(master, False)
        self.master = master
        await self._attach_stdin(os.dup(master))
        self._watch_relay()
        self._watch_exit()
        self._arm_timeout()

    def _watch_relay(self) -> None:
        if not self.relay or proc_starttime(self.relay) != self.relay_start:
            self.relay = 0  # gone already (its exit was reaped by the keeper, or by us)
            return
        try:
            self._relay_fd = os.pidfd_open(self.relay)
        except OSError:  # no pidfd (a kernel before 5.3): the linger bounds the wait instead
            return
        asyncio.get_running_loop().add_reader(self._relay_fd, self._relay_exited)

    def _relay_exited(self) -> None:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.relay, os.WNOHANG)  # ours to reap if we forked it (else the keeper's)
        self._unwatch_relay()
        self.relay = 0
        if self._leader_gone:
            self._end_now()

    def _unwatch_relay(self) -> None:
        if self._relay_fd is not None:
            asyncio.get_running_loop().remove_reader(self._relay_fd)
            os.close(self._relay_fd)
            self._relay_fd = None

    # -- re-adoption -------------------------------------------------------------------------

    def take_record(self, meta: dict[str, Any]) -> None:
        relay = meta.get("relay")
        if isinstance(relay, dict):
            self.relay, self.relay_start = int(relay.get("pid") or 0), relay.get("start")

    async def reattach(self) -> None:
        _, fds = await self.home.keeper.request({"op": "fd", "key": self.mark})
        for extra in fds[1:]:
            os.close(extra)
        if not fds:  # no keeper kept the master: no more keystrokes, the copier still copies
            self.stdin.attach(None, False)
            self._watch_relay()
            self._watch_exit()
            self._arm_timeout()
            return
        size = get_size(fds[0])
        if size is not None:
            self.size = size
        await self._adopt_master(fds[0])

    # -- the end -----------------------------------------------------------------------------

    def _leader_exited(self, code: int | None) -> None:
        if self._done.is_set() or self._leader_gone:
            return
        self._leader_gone = True
        self._exit_code = code
        if not self.relay:
            self._end_now()
        else:  # the copier exits at EIO; a leftover holding the terminal gets this long
            self._drain_deadline = asyncio.get_running_loop().time() + DRAIN_MAX
            self._linger = asyncio.get_running_loop().call_later(DRAIN_LINGER, self._linger_over)

    def _linger_over(self) -> None:
        self._linger = None
        self._look = asyncio.get_running_loop().create_task(self._end_unless_draining())

    async def _end_unless_draining(self) -> None:
        # No process of the job's session left: nothing holds the terminal, so the copier
        # reaches EIO by itself once it runs; a loaded machine may not have run it yet, and
        # killing it now would lose the job's last output. Only a leftover holding the terminal
        # (or DRAIN_MAX) ends the wait.
        loop = asyncio.get_running_loop()
        if self.relay and loop.time() < self._drain_deadline and not await scan(session_members, self.pid):
            self._linger = loop.call_later(DRAIN_LINGER, self._linger_over)
            return
        self._end_now()

    def _end_now(self) -> None:
        if not self._done.is_set():
            super()._leader_exited(self._exit_code)

    def finish(self, state: str, code: int | None, ended_at: float | None, save: bool = True) -> None:
        if self._linger is not None:
            self._linger.cancel()
        if self.relay and proc_starttime(self.relay) == self.relay_start:
            # A leftover still holds the terminal: what it prints now is not the job's output.
            with contextlib.suppress(OSError):
                os.kill(self.relay, signal.SIGKILL)
        self._unwatch_relay()
        if self.master is not None:
            os.close(self.master)  # with the keeper's copy dropped, leftovers get their hangup
            self.master = None
        super().finish(state, code, ended_at, save)

    def detach(self) -> None:
        super().detach()
        self._unwatch_relay()

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

    def write_stdin(self, data: bytes, offset: int | None, eof: bool, writer: str | None = None) -> int:
        """Keystrokes. A terminal is never closed by its typist: ``eof`` types the terminal's
        end-of-file key (``VEOF``, Ctrl-D), which ends a reader at the start of a line, once
        ``data`` is all in. The key counts for no writer's cursor (the writer sent none), and a
        writer's repeated eof at the same cursor types it once."""
        taken = super().write_stdin(data, offset, False, writer)
        all_in = (offset + len(data) <= self.stdin.cursor(writer)) if offset is not None else taken == len(data)
        if eof and all_in and self.master is not None:
            at = self.stdin.cursor(writer)
            if writer is None or self._eof_typed.get(writer) != at:
                with contextlib.suppress(OSError, IndexError):
                    key = termios.tcgetattr(self.master)[6][termios.VEOF]  # the slave's, read on the master
                    super().write_stdin(key if isinstance(key, bytes) else b"\x04", None, False)
                if writer is not None:
                    remember(self._eof_typed, writer, at)
        return taken

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
