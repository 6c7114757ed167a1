"""Resource use read from ``/proc`` (and cgroup files where present), only when asked.

There is no background sampler: ``job_stats`` and ``sandbox_stats`` read the counters when
called, and keep that one reading per job (and one for the sandbox) so the next call answers
with the rate since then. A call with no reading younger than :data:`STALE` takes two readings
``window`` seconds apart. So an agent nobody watches spends nothing here, and a dashboard
asking once a second costs one ``/proc`` walk per job per second.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from ..errors import AgentLostError, JobNotFoundError
from ..protocol import (
    JobStats,
    JobStatsMany,
    JobStatsManyParams,
    JobStatsParams,
    Method,
    SandboxStats,
    SandboxStatsParams,
)
from .jobs.controller import JobController
from .jobs.proctable import scan
from .jobs.proctree import Tree
from .rpc import Handler
from .treestats import TreeReading, add_orphans, read_trees

__all__ = ["MAX_DISK_ENTRIES", "STALE", "MetricsController", "metrics_methods"]

GATHER = 0.01
"""Seconds a walk of ``/proc`` waits for more ``job_stats`` calls to join it: a dashboard
asking about 100 jobs at once costs one walk, not 100."""

DISK_EVERY = 30.0
"""Seconds a disk-use count serves (walking a big workspace every second would cost more than
everything else here)."""

STALE = 30.0
"""Seconds a kept reading serves as the start of the next rate (older: measure afresh)."""

MAX_DISK_ENTRIES = 200_000
"""Most directory entries counted per tree for disk use (a huge workspace is not walked whole)."""

_TICK = 1.0 / os.sysconf("SC_CLK_TCK")
_CGROUP = Path("/sys/fs/cgroup")


def _empty(at: float) -> TreeReading:
    return TreeReading(at, 0.0, 0, 0, 0, 0, 0)


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _cgroup_dir() -> Path | None:
    """This process's cgroup v2 directory, if it is mounted where we can read it."""
    try:
        line = Path("/proc/self/cgroup").read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    if not line.startswith("0::"):
        return None  # cgroup v1: skip it, /proc serves
    path = _CGROUP / line[3:].lstrip("/")
    return path if (path / "cpu.stat").is_file() else None


class SystemReading(NamedTuple):
    at: float
    source: str
    cpu_seconds: float
    memory_used: int
    memory_limit: int | None


def read_system() -> SystemReading:
    """CPU time and memory of the sandbox: its cgroup's where readable, else the kernel's."""
    cg = _cgroup_dir()
    if cg is not None:
        usage = 0
        for line in (cg / "cpu.stat").read_text().splitlines():
            if line.startswith("usage_usec "):
                usage = int(line.split()[1])
        mem = _read_int(cg / "memory.current")
        if mem is not None:
            return SystemReading(time.monotonic(), "cgroup", usage / 1e6, mem, _read_int(cg / "memory.max"))
    with open("/proc/stat") as f:
        cpu = [int(v) for v in f.readline().split()[1:]]
    busy = sum(cpu) - cpu[3] - (cpu[4] if len(cpu) > 4 else 0)  # all but idle and iowait
    info: dict[str, int] = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            info[key] = int(rest.split()[0]) * 1024
    used = info.get("MemTotal", 0) - info.get("MemAvailable", 0)
    return SystemReading(time.monotonic(), "proc", busy * _TICK, used, info.get("MemTotal"))


def disk_use(root: str, limit: int = MAX_DISK_ENTRIES) -> tuple[int, bool]:
    """Bytes allocated to the files under ``root`` (symlinks not followed); truncated or not."""
    total = seen = 0
    stack = [root]
    while stack:
        try:
            it = os.scandir(stack.pop())
        except OSError:
            continue
        with it:
            for entry in it:
                seen += 1
                if seen > limit:
                    return total, True
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += st.st_blocks * 512
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
    return total, False


@dataclass
class MetricsController:
    """Answers the stats methods from the job registry and ``/proc``; keeps one reading each."""

    jobs: JobController
    state_dir: Path

    def __post_init__(self) -> None:
        self._trees: dict[str, TreeReading] = {}
        self._system: SystemReading | None = None
        self._next: asyncio.Future[dict[str, TreeReading]] | None = None
        self._wanted: dict[str, Tree] = {}
        self._disk: dict[str, tuple[float, tuple[int, bool]]] = {}

    async def job_stats(self, p: JobStatsParams) -> JobStats:
        """The job's tree now, with its CPU rate since the last reading (or over ``window``).

        :raises JobNotFoundError: unknown job. :raises AgentLostError: a job of another instance.
        """
        await self.jobs.held(p.job_id)  # a job still spawning is asked about once it runs
        (stats,) = await self._stats([(p.job_id, self.jobs.running_tree(p.job_id))], p.window)
        return stats

    async def job_stats_many(self, p: JobStatsManyParams) -> JobStatsMany:
        """Many jobs' stats from one walk of ``/proc`` (two if some have no recent reading);
        unknown jobs are left out. Cancelling leaves the walk to whoever shares it."""
        jobs: list[tuple[str, Tree | None]] = []
        for job_id in dict.fromkeys(p.job_ids):
            with contextlib.suppress(JobNotFoundError, AgentLostError):
                jobs.append((job_id, self.jobs.running_tree(job_id)))
        return JobStatsMany(stats=await self._stats(jobs, p.window) if jobs else [])

    async def _stats(self, jobs: list[tuple[str, Tree | None]], window: float) -> list[JobStats]:
        """Stats of ``(job_id, its tree or None once ended)``: one walk for them all, and a
        second one ``window`` later for those with no reading younger than :data:`STALE`."""
        running = {job_id: tree for job_id, tree in jobs if tree is not None}
        for job_id, tree in jobs:
            if tree is None:  # ended: its tree is no longer its own (a pid may be reused)
                self._trees.pop(job_id, None)
        now: dict[str, TreeReading] = {}
        if running:
            walk = await self._walk(running)
            now = {j: walk.get(j) or _empty(time.monotonic()) for j in running}
        fresh = [j for j, r in now.items() if (b := self._trees.get(j)) is None or r.at - b.at > STALE]
        before = {j: self._trees.get(j) for j in now}
        if fresh:
            for j in fresh:
                before[j] = now[j]
            await asyncio.sleep(window)  # the second reading of a rate: a measuring window
            walk = await self._walk({j: running[j] for j in fresh})
            for j in fresh:
                now[j] = walk.get(j) or _empty(time.monotonic())
        self._forget_stale()
        self._trees.update(now)
        return [self._one(job_id, now.get(job_id), before.get(job_id)) for job_id, _ in jobs]

    @staticmethod
    def _one(job_id: str, now: TreeReading | None, before: TreeReading | None) -> JobStats:
        if now is None or before is None:
            return JobStats(
                job_id=job_id,
                running=False,
                processes=0,
                threads=0,
                cpu_percent=0.0,
                rss=0,
                read_bytes=0,
                write_bytes=0,
                interval=0.0,
            )
        span = now.at - before.at
        cpu = max(0.0, now.cpu_seconds - before.cpu_seconds) / span * 100 if span > 0 else 0.0
        return JobStats(
            job_id=job_id,
            running=True,
            processes=now.processes,
            threads=now.threads,
            cpu_percent=min(cpu, 100.0 * 4096),
            rss=now.rss,
            read_bytes=now.read_bytes,
            write_bytes=now.write_bytes,
            interval=span,
        )

    async def _walk(self, trees: dict[str, Tree]) -> dict[str, TreeReading]:
        """The counters of ``trees`` from the next walk (callers within :data:`GATHER` share it).

        Cancelling leaves the walk to the others."""
        self._wanted.update(trees)
        if self._next is None:
            self._next = asyncio.ensure_future(self._walk_soon())
        return await asyncio.shield(self._next)

    async def _walk_soon(self) -> dict[str, TreeReading]:
        await asyncio.sleep(GATHER)  # a batching window: the calls arriving meanwhile join this walk
        # Later callers start the next walk: this one may predate their jobs.
        wanted, self._wanted, self._next = self._wanted, {}, None
        keeper = self.jobs.home.keeper if self.jobs.home is not None else None
        return await add_orphans(keeper, await scan(read_trees, wanted))

    async def _disk_use(self, root: str) -> tuple[int, bool]:
        now = time.monotonic()
        kept = self._disk.get(root)
        if kept is None or now - kept[0] > DISK_EVERY:
            if len(self._disk) > 16:  # a client naming many workspaces: keep this bounded
                self._disk.clear()
            kept = self._disk[root] = (now, await scan(disk_use, root))
        return kept[1]

    def _forget_stale(self) -> None:
        cut = time.monotonic() - STALE
        for job_id in [j for j, r in self._trees.items() if r.at < cut]:
            del self._trees[job_id]

    async def sandbox_stats(self, p: SandboxStatsParams) -> SandboxStats:
        """CPU and memory of the sandbox, disk use of the workspace and the state dir."""
        now = await scan(read_system)
        before = self._system
        if before is None or now.at - before.at > STALE or before.source != now.source:
            before = now
            await asyncio.sleep(p.window)
            now = await scan(read_system)
        self._system = now
        workspace = p.workspace or os.getcwd()
        ws_bytes, ws_cut = await self._disk_use(workspace)
        sd_bytes, sd_cut = await self._disk_use(os.fspath(self.state_dir))
        try:
            vfs = os.statvfs(workspace)
            free = vfs.f_bavail * vfs.f_frsize
        except OSError:
            free = 0
        span = now.at - before.at
        cpu = max(0.0, now.cpu_seconds - before.cpu_seconds) / span * 100 if span > 0 else 0.0
        return SandboxStats(
            source=now.source,
            cpu_count=os.cpu_count() or 1,
            cpu_percent=min(cpu, 100.0 * 4096),
            memory_used=now.memory_used,
            memory_limit=now.memory_limit,
            workspace=workspace[:4096],
            workspace_bytes=ws_bytes,
            state_dir_bytes=sd_bytes,
            disk_free=free,
            disk_truncated=ws_cut or sd_cut,
            jobs_running=self.jobs.running_count,
            interval=span,
        )


def metrics_methods(ctl: MetricsController) -> dict[str, Handler]:
    """The stats methods served by ``ctl``."""
    return {
        Method.JOB_STATS: ctl.job_stats,
        Method.JOB_STATS_MANY: ctl.job_stats_many,
        Method.SANDBOX_STATS: ctl.sandbox_stats,
    }
