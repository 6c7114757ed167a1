"""The per-stream disk cap while no agent runs, applied by the keeper.

The agent punches the head out of a stream past its cap (:mod:`.jobs.logfile`) once a second.
While no agent runs (the keeper backs off from an agent that keeps dying young, stops restarting
one that died young five times in a row until a client connects, and waits for the next agent
during a handover) nobody would, and a job's files would grow without bound. So the keeper does
the same, once a second, while it has no agent: the same cap (the job's ``output_cap`` from its
``job.json``, else the agent's ``--disk-cap``), the same 4 KiB-rounded punch from offset 0. The
next agent finds where each stream's data begins with ``lseek(SEEK_DATA)``, as after any restart,
and reports the bytes dropped exactly. Never while an agent runs: then the two could race.

Standard library only, like the keeper.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat

from ..holepunch import BLOCK, DEFAULT_CAP, data_start, punch_head
from ..statefile import open_state_dir, read_state_file

__all__ = ["CapSweeper", "disk_cap_of"]

MAX_META = 1 << 20  # a job.json is a few hundred bytes; a bigger one is not ours


def disk_cap_of(agent_argv: list[str]) -> int:
    """The ``--disk-cap`` the agent is started with (the default if none)."""
    with contextlib.suppress(ValueError, IndexError):
        return int(agent_argv[agent_argv.index("--disk-cap") + 1])
    return DEFAULT_CAP


class CapSweeper:
    """Applies each job stream's cap under ``jobs_root``; caps read once per job dir."""

    def __init__(self, jobs_root: str) -> None:
        self.jobs_root = jobs_root
        self._caps: dict[str, int | None] = {}  # job dir -> its own output_cap (None: the default)

    def sweep(self, default_cap: int) -> int:
        """One pass over every job dir; return the bytes newly dropped."""
        dropped = 0
        try:
            entries = list(os.scandir(self.jobs_root))
        except OSError:
            return 0
        seen = set()
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                continue
            seen.add(entry.name)
            try:  # the dir itself, never a symlink a job swapped in: names resolve against it
                dir_fd = open_state_dir(entry.path)
            except (OSError, ValueError):
                continue
            try:
                if entry.name not in self._caps:
                    self._caps[entry.name] = _own_cap(dir_fd)
                cap = self._caps[entry.name] or default_cap
                for name in ("stdout", "stderr"):
                    dropped += self._enforce(dir_fd, name, cap)
            finally:
                os.close(dir_fd)
        for gone in set(self._caps) - seen:
            del self._caps[gone]
        return dropped

    def _enforce(self, dir_fd: int, name: str, cap: int) -> int:
        try:  # O_NONBLOCK: a FIFO a job put there must not block the keeper in open()
            fd = os.open(name, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
        except OSError:
            return 0
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return 0
            size = st.st_size
            if size <= cap:
                return 0
            base = data_start(fd, size)
            new_base = (size - cap) // BLOCK * BLOCK
            if size - base <= cap or new_base <= base:
                return 0
            if punch_head(fd, new_base):
                return 0  # unsupported here (the agent logs that once): the file grows
            return new_base - base
        finally:
            os.close(fd)


def _own_cap(dir_fd: int) -> int | None:
    try:
        meta = json.loads(read_state_file("job.json", MAX_META, dir_fd=dir_fd))
        cap = meta.get("output_cap") if isinstance(meta, dict) else None
    except (OSError, ValueError):
        return None
    return cap if isinstance(cap, int) and cap > 0 else None
