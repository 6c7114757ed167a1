"""The summed counters of each job's tree, from its one membership (see :mod:`.jobs.proctree`):
what ``job_stats`` reports and what ``memory_limit`` and ``cpu_time`` are checked against.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

from .jobs.proctree import Tree, trees_members
from .keeperlink import KeeperLink
from .orphancpu import MAX_KEYS

__all__ = ["TreeReading", "add_orphans", "read_trees"]

_TICK = 1.0 / os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


class TreeReading(NamedTuple):
    """The summed counters of one job's processes at one moment.

    :ivar leader_start: the session leader's start time: with ``session``, names the job to the
        keeper (the CPU of its reaped orphans, see :func:`add_orphans`).
    :ivar whole_cpu: ``cpu_seconds`` is its cgroup's, every process that was ever in it
        included: the keeper's tally of orphans must not be added again.
    """

    at: float
    cpu_seconds: float
    processes: int
    threads: int
    rss: int
    read_bytes: int
    write_bytes: int
    leader_start: int | None = None
    session: int = 0
    whole_cpu: bool = False


def _io(pid: int) -> tuple[int, int]:
    try:
        with open(f"/proc/{pid}/io", "rb") as f:
            vals = dict(line.split(b":", 1) for line in f.read().splitlines() if b":" in line)
        return int(vals.get(b"read_bytes", 0)), int(vals.get(b"write_bytes", 0))
    except (OSError, ValueError):  # not ours to read (another uid), or gone
        return 0, 0


def read_trees(trees: Mapping[str, Tree]) -> dict[str, TreeReading]:
    """One walk of ``/proc``: the summed counters of the live members of each tree, by key.

    CPU is the whole tree's, exited descendants included. With a cgroup it is the cgroup's
    counter. Without, each process's own time plus ``cutime``/``cstime`` (the time of the
    children it waited for, theirs included): a process's time moves into its parent's
    ``cutime`` as the parent reaps it. Zombies are not counted (their time is about to move
    to their reaper: counting them could count it twice, and a CPU limit acts on one
    reading), so a reading may briefly fall short, never over. Orphans reaped by the keeper
    (the subreaper) are added by :func:`add_orphans`.

    Blocking: run it with :func:`.jobs.proctable.scan`."""
    members = trees_members(trees)
    now = time.monotonic()
    out: dict[str, TreeReading] = {}
    for key, pids in members.items():
        tree = trees[key]
        a = [0, 0, 0, 0, 0, 0]
        leader_start = None
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    raw = f.read()
            except OSError:
                continue  # exited while we looked
            # fields[0] is the state; 11/12 utime/stime, 13/14 cutime/cstime; 17 threads; 19 start; 21 rss pages.
            fields = raw[raw.rfind(b")") + 2 :].split()
            if len(fields) < 22 or fields[0] == b"Z":
                continue
            if pid == tree.session:
                leader_start = int(fields[19])
            a[0] += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
            r, w = _io(pid)
            a[1] += 1
            a[2] += int(fields[17])
            a[3] += int(fields[21]) * _PAGE
            a[4] += r
            a[5] += w
        whole = tree.cgroup.cpu_seconds() if tree.cgroup is not None else None
        cpu = whole if whole is not None else a[0] * _TICK
        out[key] = TreeReading(now, cpu, a[1], a[2], a[3], a[4], a[5], leader_start, tree.session, whole is not None)
    return out


async def add_orphans(keeper: KeeperLink | None, readings: dict[str, TreeReading]) -> dict[str, TreeReading]:
    """``readings`` with the CPU of each tree's orphans the keeper reaped added (those whose
    CPU is not their cgroup's already).

    A keeper too old for the ``cpu`` op, or none, adds nothing. Its answer is checked (only the
    keys asked, finite non-negative seconds). Cancelling drops the keeper link (see
    :meth:`~.keeperlink.KeeperLink.request`)."""
    keys = {
        f"{r.session}:{r.leader_start}": k
        for k, r in readings.items()
        if r.leader_start is not None and not r.whole_cpu
    }
    if keeper is None or not keeper.present or not keys:
        return readings
    answer, fds = await keeper.request({"op": "cpu", "keys": list(keys)[:MAX_KEYS]})
    for fd in fds:
        os.close(fd)
    sums: Any = answer.get("cpu")
    out = dict(readings)
    for key, seconds in sums.items() if isinstance(sums, dict) else ():
        k = keys.get(key)
        if k is not None and isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds >= 0:
            r = out[k]
            out[k] = TreeReading(r.at, r.cpu_seconds + seconds, *r[2:])
    return out
