"""Wire models of ``ping``, ``job_stats`` and ``sandbox_stats``: liveness and resource use.

Every number is bounded: an agent is not trusted, and a dashboard adds these up. A rate (CPU %)
needs two readings; the agent keeps the last reading of what was asked for and answers with the
rate since then, or takes two readings ``window`` seconds apart when it has none recent. So
nothing is sampled while nobody asks.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from .base import JobId, WireModel

__all__ = [
    "HEARTBEAT",
    "HEARTBEAT_ANSWER",
    "MAX_STATS_WINDOW",
    "JobStats",
    "JobStatsParams",
    "JobStatsMany",
    "JobStatsManyParams",
    "SandboxStats",
    "SandboxStatsParams",
]

HEARTBEAT = b'{"jsonrpc":"2.0","id":"hb","method":"ping","params":{}}'
"""The host's heartbeat, byte for byte: an agent answers it without parsing it (any other
spelling of ``ping`` goes through the dispatcher and gets the same answer)."""

HEARTBEAT_ANSWER = b'{"jsonrpc":"2.0","id":"hb","result":{}}'
"""The agent's answer to :data:`HEARTBEAT`."""

MAX_STATS_WINDOW = 5.0
"""Longest window (seconds) a stats call may ask the agent to measure over."""

_Count = Annotated[int, Field(ge=0, le=10_000_000)]
_Bytes = Annotated[int, Field(ge=0, le=1 << 62)]
_Percent = Annotated[float, Field(ge=0, le=100.0 * 4096)]  # 100 per core, 4096 cores at most
_Window = Annotated[float, Field(gt=0, le=MAX_STATS_WINDOW)]


class JobStatsParams(WireModel):
    """Params of ``job_stats``: which job; how long to measure when no recent reading exists."""

    job_id: JobId
    window: _Window = 0.5


class JobStats(WireModel):
    """Resource use of a job's whole process tree (its session: every descendant that did not
    leave it with ``setsid``).

    ``cpu_percent`` is 100 per busy core, averaged over the last ``interval`` seconds, children
    that ended within it included (the time of those their parents waited for); ``rss``
    the sum of the processes' resident memory (shared pages count once per process);
    ``read_bytes``/``write_bytes`` storage I/O since each live process started (0 where
    ``/proc/<pid>/io`` is not readable). A job that ended has no processes and zeros.
    """

    job_id: JobId
    running: bool
    processes: _Count
    threads: _Count
    cpu_percent: _Percent
    rss: _Bytes
    read_bytes: _Bytes
    write_bytes: _Bytes
    interval: Annotated[float, Field(ge=0, le=86_400.0)]


class SandboxStatsParams(WireModel):
    """Params of ``sandbox_stats``: the workspace whose disk use to count (absolute; ``None``:
    the agent's working directory), and the measuring window as for ``job_stats``."""

    workspace: Annotated[str, Field(min_length=1, max_length=4096)] | None = None
    window: _Window = 0.5


class SandboxStats(WireModel):
    """Resource use of the whole sandbox.

    CPU and memory come from the sandbox's cgroup (``cpu.stat``, ``memory.current``,
    ``memory.max``) where it has one, else from ``/proc/stat`` and ``/proc/meminfo`` (then they
    are the host's or VM's); ``source`` says which. ``cpu_percent`` is 100 per busy core.
    Disk use counts the files under the workspace and the agent's state dir, up to
    ``max_entries`` entries each (``disk_truncated`` when a tree had more).
    """

    source: Annotated[str, Field(max_length=16)]
    cpu_count: _Count
    cpu_percent: _Percent
    memory_used: _Bytes
    memory_limit: _Bytes | None
    workspace: Annotated[str, Field(max_length=4096)]
    workspace_bytes: _Bytes
    state_dir_bytes: _Bytes
    disk_free: _Bytes
    disk_truncated: bool
    jobs_running: _Count
    interval: Annotated[float, Field(ge=0, le=86_400.0)]


class JobStatsManyParams(WireModel):
    """Params of ``job_stats_many``: many jobs' resource use in one call (and one ``/proc`` walk).

    Unknown job ids are left out of the answer (a dashboard's list may be a moment old)."""

    job_ids: Annotated[list[JobId], Field(min_length=1, max_length=1000)]
    window: _Window = 0.5


class JobStatsMany(WireModel):
    """Result of ``job_stats_many``: one :class:`JobStats` per known job, in the order asked."""

    stats: Annotated[list[JobStats], Field(max_length=1000)]
