"""One budget for the bytes of every job's logs on disk, across all jobs of the agent.

The per-stream cap bounds one stream; 1 000 retained jobs at 1 GiB each do not add up to a
bound. Where the state dir is a tmpfs (``docker+image://``'s ``/tmp``, a jail's, a pod's
``emptyDir`` in memory) its pages are charged to the sandbox's memory cgroup: 24 jobs writing
8 MiB each filled a 192 MiB container and the OOM killer took the agent. So the logs of all
jobs share one budget, by default a quarter of the state dir's file system and, on a tmpfs,
also at most a quarter of the memory cgroup's limit.

Sizes are tracked incrementally: every :class:`~.logfile.LogFile` reports the change in the
disk blocks its file takes (``st_blocks * 512``, never the apparent size: a job's sparse 20 GB
stdout takes 40 KiB and counts as that, where counting its size once punched out every other
finished job's output) when it learns its size (a read, the sweep, the job's end) or drops its
head; no directory walk. Over the budget, :func:`evict` drops heads with the same
hole punch as the per-stream cap (exact ``*_dropped`` counts, never silent): finished jobs'
logs first, oldest end first, then the running streams, the largest first (leveled down to a
common size). A finished job whose logs are all dropped stays listed with its exit code until
the retention rules (age, count) forget it.

What is written between two checks (a sweep a second, each job's end, each start) can pass the
budget: the bound is the budget plus what running jobs write in that time.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

from ..budget import memory_limit

__all__ = ["LogBudget", "default_log_budget", "evict", "is_tmpfs"]

MIN_LOG_BUDGET = 4 * 1024 * 1024
TMPFS_MAGIC = 0x01021994


class LogFile(Protocol):
    """What eviction needs of a stream's log (:class:`~.logfile.LogFile` is one): no import of
    it here, since a log file reports its size changes to the budget."""

    @property
    def held(self) -> int: ...

    def drop_head(self, n: int) -> int: ...


class LogBudget:
    """Bytes of disk taken by all streams' logs (their blocks, summed) against ``limit``."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"a log budget must be positive, not {limit}")
        self.limit = limit
        self.used = 0

    def charge(self, delta: int) -> None:
        self.used += delta

    @property
    def over(self) -> int:
        return max(0, self.used - self.limit)


def evict(budget: LogBudget, finished: Iterable[Sequence[LogFile]], running: Iterable[LogFile]) -> int:
    """Drop heads until ``budget`` holds (as far as whole 4 KiB blocks allow); return the bytes dropped.

    ``finished``: ended jobs' streams, oldest end first: their logs go first, whole. Then
    ``running``: the largest streams are cut down to a common level, so one flooding job
    loses its head before a quiet one loses anything.
    """
    dropped = 0
    for streams in finished:
        for stream in streams:
            if budget.over <= 0:
                return dropped
            dropped += stream.drop_head(budget.over)
    if budget.over <= 0:
        return dropped
    big = sorted(running, key=lambda s: s.held, reverse=True)
    # The level L with sum(max(0, held - L)) >= over: each stream above it keeps L bytes.
    need, level, count, total = budget.over, 0, len(big), 0
    for i, stream in enumerate(big):
        total += stream.held
        following = big[i + 1].held if i + 1 < len(big) else 0
        if total - (i + 1) * following >= need:
            count, level = i + 1, max(following, (total - need) // (i + 1))
            break
    for stream in big[:count]:
        if stream.held > level:
            dropped += stream.drop_head(stream.held - level)
    return dropped


def is_tmpfs(path: Path) -> bool:
    """Whether ``path`` is on a tmpfs (its pages are memory: charged to the memory cgroup)."""
    target = os.path.realpath(path)
    best, fstype = "", ""
    with contextlib.suppress(OSError), open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
        for line in f:
            fields, _, rest = line.partition(" - ")
            parts = fields.split()
            if len(parts) < 5 or not rest:
                continue
            mount = parts[4].encode().decode("unicode_escape")  # \040 for a space
            inside = target == mount or target.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) >= len(best):
                best, fstype = mount, rest.split()[0]
    return fstype == "tmpfs"


def default_log_budget(root: Path, cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """A quarter of the file system holding ``root``; on a tmpfs, also at most a quarter of the
    memory cgroup's limit (the pages are memory). Never below 4 MiB."""
    budget: int | None = None
    with contextlib.suppress(OSError):
        st = os.statvfs(root)
        budget = st.f_blocks * st.f_frsize // 4
    if is_tmpfs(root):
        mem = memory_limit(cgroup)
        if mem is not None:
            budget = mem // 4 if budget is None else min(budget, mem // 4)
    return max(MIN_LOG_BUDGET, budget if budget is not None else 1 << 40)
