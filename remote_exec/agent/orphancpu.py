"""The CPU time of orphans: a job's processes whose parent exited first, reaped by the keeper.

A process's CPU time moves into its parent's ``cutime`` when the parent waits for it, which is
how a job's tree keeps counting children that ended (see :func:`~.treestats.read_trees`). An
orphan is reparented to the keeper (the subreaper), so its time would leave the tree when the
keeper reaps it: the keeper adds it (``wait4``'s rusage: its own time and its waited-for
children's) to the job it belonged to, keyed by the job's session leader as ``pid:starttime``
(a recycled pid has another start time), and answers the agent's ``cpu`` op with the sums.

The keeper imports this module (standard library only); the agent asks with
:func:`~.treestats.add_orphans`.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from .procfacts import proc_session, proc_starttime

if TYPE_CHECKING:
    from resource import struct_rusage

__all__ = ["MAX_KEYS", "MAX_SESSIONS", "OrphanCpu"]

MAX_SESSIONS = 4096
"""Jobs whose orphans' time the keeper keeps (the oldest are forgotten: ended long ago)."""

MAX_KEYS = 1024
"""Jobs one ``cpu`` request may ask about."""


class OrphanCpu:
    """The keeper's ledger: CPU seconds of reaped orphans by their job's ``pid:starttime``."""

    def __init__(self) -> None:
        self._seconds: OrderedDict[str, float] = OrderedDict()

    def job_of(self, pid: int) -> str | None:
        """The key of the job ``pid`` (a zombie not yet reaped) belongs to: its session's leader,
        if that is another process still there to name it (a job's leader reaped by the keeper
        ended its job: its time counts for nobody)."""
        sid = proc_session(pid)
        if sid is None or sid in (0, pid):
            return None
        start = proc_starttime(sid)
        return None if start is None else f"{sid}:{start}"

    def add(self, job: str | None, usage: struct_rusage | None) -> None:
        """Count ``usage`` (of a child just reaped) for ``job``."""
        if job is None or usage is None:
            return
        self._seconds[job] = self._seconds.pop(job, 0.0) + usage.ru_utime + usage.ru_stime
        while len(self._seconds) > MAX_SESSIONS:
            self._seconds.popitem(last=False)

    def answer(self, keys: object) -> dict[str, float]:
        """The ``cpu`` op: the sums of the jobs named (those with orphans reaped so far)."""
        if not isinstance(keys, list):
            return {}
        return {k: self._seconds[k] for k in keys[:MAX_KEYS] if isinstance(k, str) and k in self._seconds}
