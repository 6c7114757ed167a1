"""The shell process of a session: where it lives, how it starts, and how its end is learnt
whether this agent started it or re-adopted it from an earlier one.

Not asyncio's subprocess: its child watcher would reap the shell, and only this agent could
learn how it ended. The shell is watched with a pidfd; our own child is reaped here, and one
an earlier agent started is the keeper's child (the subreaper), which reaps it and tells its
exit (``{"op": "exit"}``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ...errors import SpawnError
from ..jobs.home import JobHome
from ..jobs.logfile import Inotify
from ..jobs.spawn import popen_session
from ..keeperlink import KeeperLink
from ..procfacts import proc_starttime

__all__ = ["ExitWatch", "ShellHome", "ShellStdin", "default_shell", "launch_shell", "reattach_stdin", "spawn_shell"]


@dataclass(frozen=True)
class ShellHome:
    """What every session of one agent shares.

    :ivar root: ``<state dir>/shells``, where durable sessions keep their dirs; ``None`` (tests
        of the controller alone) keeps the output files in the session's temporary dir.
    :ivar keeper: holds each session's stdin and key while no agent runs (absent: sessions die
        with their agent).
    :ivar inotify: wakes the readers of the output files.
    :ivar jobs: where a durable session's runs keep their output, as jobs do (see :mod:`.runlog`);
        its trash also takes ended sessions' dirs, deleted off the event loop.
    """

    root: Path | None = None
    keeper: KeeperLink | None = None
    inotify: Inotify | None = None
    jobs: JobHome | None = None

    def discard(self, path: Path) -> None:
        """Remove a session's dir without blocking the event loop on the unlink of its files."""
        if self.jobs is not None:
            self.jobs.discard(path)
        else:
            shutil.rmtree(path, ignore_errors=True)

    @property
    def durable(self) -> bool:
        return self.root is not None and self.keeper is not None and self.keeper.present


def default_shell() -> list[str]:
    """The shell command line: bash if installed, else the POSIX sh."""
    bash = shutil.which("bash")
    if bash:
        return [bash, "--norc", "--noprofile", "--noediting", "-i"]
    return [shutil.which("sh") or "/bin/sh", "-i"]


class ShellStdin(asyncio.Protocol):
    """Our end of the shell's stdin: written to, never read (the shell's end cannot write)."""

    def eof_received(self) -> bool:
        return True  # the shell's end shut its writing half: keep ours open for writing


def spawn_shell(
    argv: list[str], stdin: int, out: int, err: int, cwd: str | None, env: dict[str, str]
) -> tuple[int, int | None]:
    """fork+exec the shell in its own session; return its pid and start time.

    :raises OSError, ValueError, subprocess.SubprocessError: it cannot start.
    """
    proc = popen_session(argv, stdin, out, err, cwd, env)
    proc.returncode = 0  # Popen must never reap it (its __del__ would): ExitWatch does
    return proc.pid, proc_starttime(proc.pid)


class ShellFilesMaker(Protocol):
    """What :func:`launch_shell` uses of a :class:`~.store.SessionStore` (named here: that module
    imports this one)."""

    async def create(self, ours: socket.socket) -> tuple[int, int]: ...

    def discard(self) -> None: ...

    async def release(self) -> None: ...


async def launch_shell(
    argv: list[str], store: ShellFilesMaker, cwd: str | None, env: dict[str, str]
) -> tuple[int, int | None, asyncio.WriteTransport]:
    """Make the session's files (``store``), then start the shell with its stdin on a socketpair
    and its stdout and stderr on the files; return its pid, start time and our end of its stdin.
    Returns right after the spawn (no await after it).

    :raises NoSpaceError: the disk is full (nothing to kill: the files come first).
    :raises SpawnError: it cannot start (what was made is removed).
    """
    ours, theirs = socket.socketpair()
    try:
        out, err = await store.create(ours)
    except BaseException:
        ours.close()
        theirs.close()
        raise
    theirs.shutdown(socket.SHUT_WR)  # the shell's stdin is for reading only
    stdin, _ = await asyncio.get_running_loop().create_unix_connection(ShellStdin, sock=ours)
    try:
        pid, starttime = spawn_shell(argv, theirs.fileno(), out, err, cwd, env)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        store.discard()
        stdin.close()
        await store.release()
        raise SpawnError(f"cannot start the shell {argv[0]!r}: {exc}") from None
    finally:
        theirs.close()
        os.close(out)
        os.close(err)
    return pid, starttime, stdin


async def reattach_stdin(fd: int) -> asyncio.WriteTransport:
    """Our end of a re-adopted shell's stdin, from ``fd`` (the keeper's copy, taken over)."""
    sock = socket.socket(fileno=fd)
    stdin, _ = await asyncio.get_running_loop().create_unix_connection(ShellStdin, sock=sock)
    return stdin


class ExitWatch:
    """Calls ``on_exit(code)`` once when the shell ``pid`` (started at ``starttime``) has ended."""

    def __init__(
        self, pid: int, starttime: int | None, keeper: KeeperLink | None, on_exit: Callable[[int | None], None]
    ) -> None:
        self.pid = pid
        self.starttime = starttime
        self._keeper = keeper
        self._on_exit = on_exit
        self._pidfd: int | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._fired = False

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(OSError):
            self._pidfd = os.pidfd_open(self.pid)
        if self._pidfd is not None:
            loop.add_reader(self._pidfd, self.check)
        self.check()

    def check(self) -> None:
        """Look whether the shell ended (a pidfd turns readable then; without one, every second)."""
        if self._fired:
            return
        loop = asyncio.get_running_loop()
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:  # not our child (re-adopted), or reaped already
            if proc_starttime(self.pid) == self.starttime and self.starttime is not None:
                self._later()
                return
            self._stop()
            self._task = loop.create_task(self._ask_keeper())
            return
        if pid == 0:
            self._later()
            return
        self._stop()
        self._fire(os.waitstatus_to_exitcode(status))

    def _later(self) -> None:
        if self._pidfd is None:
            self._timer = asyncio.get_running_loop().call_later(1.0, self.check)

    async def _ask_keeper(self) -> None:
        how = None
        if self._keeper is not None:
            answer, _ = await self._keeper.request({"op": "exit", "pid": self.pid, "start": self.starttime})
            how = answer.get("exit")
        self._fire(None if not isinstance(how, dict) else int(how["code"]))

    def _fire(self, code: int | None) -> None:
        if not self._fired:
            self._fired = True
            self._on_exit(code)

    def _stop(self) -> None:
        if self._pidfd is not None:
            asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def close(self) -> None:
        """Stop watching (this agent leaves the shell to the next)."""
        self._fired = True
        self._stop()
        if self._task is not None:
            self._task.cancel()
