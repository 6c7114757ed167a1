"""One memory budget for everything the agent holds in RAM on behalf of others.

Per-holder limits (bytes per stream, bytes per request) do not add up to a bound: 150 finished
jobs, 16 half-sent requests or one job that never reads its stdin each stayed within their own
limit while the agent grew past a small sandbox's memory and was OOM-killed with every job. So
every holder of bytes that somebody else decides the size of charges this one budget:

- incoming request frames, as they are read (:mod:`.stream`, HTTP bodies in :mod:`.server`):
  a frame that does not fit is refused and its connection closed;
- stdin queued towards a job (:mod:`.jobs.job`): a write accepts only what fits, so the writer
  waits (back-pressure) instead of the agent buffering;
- retained output (:class:`~remote_exec.agent.buffer.StreamBuffer`): when short, finished jobs'
  output is dropped first (oldest job first), then the oldest bytes of the growing stream;
  every dropped byte is counted and reported to the reader.

Bytes that already arrived (a pipe read) are charged with :meth:`MemoryBudget.force`, which may
overshoot by that one read; everything else is reserved before it is taken in.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

__all__ = ["DEFAULT_BUDGET", "MemoryBudget", "default_budget", "memory_limit"]

DEFAULT_BUDGET = 256 * 1024 * 1024
"""The budget when the sandbox's cgroup sets no memory limit."""
_MIN_BUDGET = 16 * 1024 * 1024

Reclaimer = Callable[[int], int]
"""Frees up to the given number of bytes held elsewhere (e.g. finished jobs' output); returns
how many it released."""


def memory_limit(cgroup: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The memory cgroup's limit in bytes (v2 ``memory.max``, then v1), or None if it sets none."""
    for name in ("memory.max", "memory/memory.limit_in_bytes"):  # cgroup v2, then v1
        with contextlib.suppress(OSError, ValueError):
            text = (cgroup / name).read_text().strip()
            if text != "max":
                return int(text)
    return None


def default_budget(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """A quarter of the cgroup's memory limit (jobs share that limit), at most 256 MiB.

    A sandbox with 512 MiB gives the agent 128 MiB; one without a readable limit gets
    :data:`DEFAULT_BUDGET`. Never less than 16 MiB, below which nothing useful fits.
    """
    limit = memory_limit(cgroup)
    return DEFAULT_BUDGET if limit is None else max(_MIN_BUDGET, min(DEFAULT_BUDGET, limit // 4))


class MemoryBudget:
    """A byte count shared by every holder: reserve before holding, release after.

    Two kinds of use share it. *Holders* (stdin queues, retained output) may fill
    :attr:`holders_limit`, three quarters; *intake* (requests being read and handled) may use
    all that is free. So however full jobs keep the budget, a request still fits: the client's
    next poll or kill is never refused for memory that output holds.

    Single-threaded (the event loop); reclaimers run synchronously inside a reservation.
    """

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"a memory budget must be positive, not {limit}")
        self.limit = limit
        self.holders_limit = limit - limit // 4
        self.used = 0  # by everyone
        self.held = 0  # by holders
        self.peak = 0
        self._reclaimers: list[Reclaimer] = []
        self._freed = asyncio.Event()  # binds to a loop on first wait, not here

    def free(self, intake: bool = False) -> int:
        """Bytes a holder (or, with ``intake``, a request) may still reserve."""
        total = self.limit - self.used
        return max(0, total if intake else min(total, self.holders_limit - self.held))

    @property
    def over(self) -> int:
        """Bytes holders hold beyond what they may (after forced charges); 0 when within."""
        return max(0, self.used - self.limit, self.held - self.holders_limit)

    def add_reclaimer(self, reclaim: Reclaimer) -> None:
        """Register something that can free memory on demand (asked in registration order)."""
        self._reclaimers.append(reclaim)

    def reclaim(self, n: int) -> int:
        """Ask the reclaimers to free ``n`` bytes; return how many they freed."""
        freed = 0
        for reclaim in self._reclaimers:
            if freed >= n:
                break
            freed += reclaim(n - freed)
        return freed

    def _take(self, n: int, intake: bool) -> None:
        self.used += n
        if not intake:
            self.held += n
        self.peak = max(self.peak, self.used)

    def try_reserve(self, n: int, intake: bool = False) -> bool:
        """Reserve ``n`` bytes if they fit (reclaiming if needed); nothing is reserved otherwise."""
        if n > self.free(intake):
            self.reclaim(n - self.free(intake))
        if n > self.free(intake):
            return False
        self._take(n, intake)
        return True

    def reserve_up_to(self, n: int) -> int:
        """Reserve as much of ``n`` as fits a holder (reclaiming if needed); return the amount."""
        if n > self.free():
            self.reclaim(n - self.free())
        got = min(n, self.free())
        self._take(got, False)
        return got

    def force(self, n: int) -> None:
        """Charge a holder ``n`` bytes that are already here (they arrived); may go over."""
        self._take(n, False)

    def release(self, n: int, intake: bool = False) -> None:
        """Give back ``n`` reserved bytes and wake whoever waits for room."""
        if n <= 0:
            return
        self.used -= n
        if not intake:
            self.held -= n
        assert self.used >= 0 and self.held >= 0, "released more than was reserved"
        self._freed.set()
        self._freed = asyncio.Event()

    async def freed(self) -> None:
        """Wait until some reserved bytes are released. Cancelling it changes nothing."""
        await self._freed.wait()
