"""Learning of a disk job's leader's exit, and its status, so that it is never lost.

The agent that spawned the leader is its parent: it reads the exit with ``WNOWAIT`` (the leader
stays a zombie), has the job record it, and only then reaps it. A re-adopted leader is the
keeper's child (the keeper is the subreaper): once it is gone, the keeper, which reaped it, tells
its exit status. Either way the event is the leader's ``pidfd`` turning readable, or a look at
the process table every second on a kernel without pidfds. (A shell session's watch,
:class:`remote_exec.agent.shell.process.ExitWatch`, reaps at once: a shell's end has no record
to write first.)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from typing import Protocol

from ..keeperlink import KeeperLink
from ..procfacts import proc_starttime

__all__ = ["LeaderWatch", "Leader"]

POLL = 1.0  # seconds between looks without a pidfd


class Leader(Protocol):
    """The job whose leader is watched: its pid and ``/proc`` start time (read when needed: a
    freshly spawned job learns its start time after the watch began)."""

    pid: int
    starttime: int | None


class LeaderWatch:
    """Calls ``on_exit(code)`` once the leader has exited (``-signal`` if killed by one, None if
    nobody could tell); ``timers`` is the job's list of timers cancelled when it ends."""

    def __init__(
        self,
        leader: Leader,
        keeper: KeeperLink,
        on_exit: Callable[[int | None], None],
        timers: list[asyncio.TimerHandle],
    ) -> None:
        self._leader = leader
        self._keeper = keeper
        self._on_exit = on_exit
        self._timers = timers
        self._pidfd: int | None = None
        self._collector: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Watch: the leader's pidfd turns readable (a poll of ``/proc`` without one)."""
        loop = asyncio.get_running_loop()
        try:
            self._pidfd = os.pidfd_open(self._leader.pid)
        except OSError:
            self._pidfd = None
        if self._pidfd is not None:
            loop.add_reader(self._pidfd, self._check_exit)
        else:  # no pidfd (a kernel before 5.3): ask the process table now and then
            self._timers.append(loop.call_later(POLL, self._check_exit))

    def stop(self) -> None:
        """Stop watching (the job ended, or the agent hands over); idempotent."""
        if self._pidfd is not None:
            asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None

    def _check_exit(self) -> None:
        """The leader may have exited: have its end recorded durably, *then* reap it.

        Our own child is read with ``WNOWAIT`` (still a zombie), its end saved to job.json,
        then reaped: an agent killed at any point leaves either the record or the zombie (which
        the keeper reaps and records). A re-adopted job is the keeper's child: the keeper
        reaped it and tells us its exit.
        """
        loop = asyncio.get_running_loop()
        pid = self._leader.pid
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            info = None  # not our child (re-adopted): ask the keeper once it is gone
            if proc_starttime(pid) == self._leader.starttime:
                if self._pidfd is None:
                    self._timers.append(loop.call_later(POLL, self._check_exit))
                return  # (a pidfd is readable only once the process exited: not reached)
            self.stop()
            self._collector = loop.create_task(self._collect_exit())
            return
        if info is None or info.si_pid == 0:
            if self._pidfd is None:
                self._timers.append(loop.call_later(POLL, self._check_exit))
            return  # still running
        killed = info.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
        self.stop()
        self._on_exit(-info.si_status if killed else info.si_status)  # saves job.json
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)  # a zombie: returns at once

    async def _collect_exit(self) -> None:
        leader = self._leader
        answer, _ = await self._keeper.request({"op": "exit", "pid": leader.pid, "start": leader.starttime})
        how = answer.get("exit")
        self._on_exit(None if how is None else int(how["code"]))
