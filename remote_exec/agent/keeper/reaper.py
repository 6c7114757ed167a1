"""The keeper's children: reaped as they exit, each exit recorded under ``(pid, starttime)``.

The keeper is the subreaper: the agent's jobs, and whatever they daemonised, become its
children when the agent dies. Each is read with ``WNOWAIT`` first (its ``/proc`` start time is
still readable while it is a zombie, so a recycled pid is never taken for the job that had it),
then reaped with its CPU time (counted for its job, see :mod:`..orphancpu`), and its exit
recorded in the same step: by the time a process is gone from the process table, its exit is
here. The agent's own exit goes to ``on_agent_exit`` instead.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ..orphancpu import OrphanCpu
from ..procfacts import proc_starttime

__all__ = ["MAX_EXITS", "Reaper"]

MAX_EXITS = 65536  # exit records kept (a daemonising job may churn through many orphans)


class Reaper:
    """Reaps the keeper's children and keeps their exits.

    :param agent_pid: the agent's pid now (0: none runs).
    :param on_agent_exit: called with the agent's exit (``{"code", "at"}``) once it is reaped.
    :ivar exits: ``"pid:starttime"`` -> ``{"code", "at"}``, oldest first, at most :data:`MAX_EXITS`.
    """

    def __init__(self, agent_pid: Callable[[], int], on_agent_exit: Callable[[dict[str, Any]], None]) -> None:
        self._agent_pid = agent_pid
        self._on_agent_exit = on_agent_exit
        self.exits: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.orphan_cpu = OrphanCpu()  # the CPU time of the jobs' orphans reaped here

    def reap(self) -> None:
        """Reap every child that has exited, recording each one's exit."""
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or info.si_pid == 0:
                return
            pid = info.si_pid
            start = proc_starttime(pid)  # still readable: the zombie is not reaped yet
            agent = pid == self._agent_pid()
            job = None if agent else self.orphan_cpu.job_of(pid)
            usage = None
            with contextlib.suppress(ChildProcessError):
                usage = os.wait4(pid, 0)[2]
            self.orphan_cpu.add(job, usage)  # its CPU stays its job's (see ..orphancpu)
            killed = info.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
            how: dict[str, Any] = {"code": -info.si_status if killed else info.si_status, "at": time.time()}
            if agent:
                self._on_agent_exit(how)
                continue
            self.exits[f"{pid}:{start}"] = how
            while len(self.exits) > MAX_EXITS:
                self.exits.popitem(last=False)

    def exit_of(self, pid: object, start: object) -> dict[str, Any] | None:
        """The recorded exit of process ``pid`` started at ``start`` (reaping first)."""
        self.reap()
        return self.exits.get(f"{pid}:{start}")

    @staticmethod
    def children() -> list[int]:
        """The keeper's live children (zombies left out)."""
        me = str(os.getpid()).encode()
        found = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                with contextlib.suppress(OSError):
                    with open(f"/proc/{name}/stat", "rb") as f:
                        fields = f.read().rsplit(b")", 1)[1].split()
                    if fields[1] == me and fields[0] != b"Z":
                        found.append(int(name))
        return found

    def end_children(self) -> bool:
        """SIGKILL every child (the orphans of the agent's jobs); True once none is left."""
        self.reap()
        kids = self.children()
        for pid in kids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        return not kids
