"""Where the cgroup hierarchies are and how a process joins one: what the agent (its jobs'
cgroups, :mod:`remote_exec.agent.jobs.cgroup`) and the host (a ``jail://`` box's,
:mod:`remote_exec.sandboxes.jailcgroup`) both need.

Here, not in either, because the agent imports only :mod:`remote_exec.protocol` and
:mod:`remote_exec.errors` (it is bundled small), and one rule of joining (``tasks`` on v1) must
not drift between two copies.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["MOUNT", "V1", "V2", "join_file", "mounts", "own_paths"]

MOUNT = "/sys/fs/cgroup"
V1 = ("pids", "memory", "cpuacct", "freezer")  # the v1 controllers a membership is kept in
V2 = "unified"  # the key of the v2 hierarchy, wherever it is mounted (and where a jail sees it)


def own_paths(pid: int | str = "self") -> dict[str, str]:
    """``pid``'s cgroup path in each hierarchy (of :data:`V1`, and :data:`V2`), from
    ``/proc/PID/cgroup``; empty if it cannot be read."""
    paths: dict[str, str] = {}
    lines: list[str] = []
    with contextlib.suppress(OSError), open(f"/proc/{pid}/cgroup") as f:
        lines = f.read().splitlines()
    for line in lines:
        num, _, rest = line.partition(":")
        ctrls, _, path = rest.partition(":")
        if num == "0" and not ctrls:
            paths[V2] = path
        for c in ctrls.split(","):
            if c in V1:
                paths[c] = path
    return paths


def mounts() -> dict[str, str]:
    """Each mounted hierarchy's root: the v1 controllers of :data:`V1` at ``MOUNT/<name>``, v2 at
    ``MOUNT`` or, on a hybrid host, ``MOUNT/unified`` (keyed :data:`V2`)."""
    found = {c: os.path.join(MOUNT, c) for c in V1}
    for v2 in (MOUNT, os.path.join(MOUNT, V2)):
        if os.path.isfile(os.path.join(v2, "cgroup.controllers")):
            found[V2] = v2
            break
    return {n: m for n, m in found.items() if os.path.isfile(os.path.join(m, "cgroup.procs"))}


def join_file(d: str, hier: str) -> str:
    """The file of cgroup dir ``d`` (in hierarchy ``hier``) a process writes ``0`` ("me") to, to
    join it: ``tasks`` on v1, where a thread moving itself skips the kernel's global thread-group
    lock (``cgroup_threadgroup_rwsem``, whose writer waits for an RCU grace period when no
    migration ran just before: 15-25 ms here), ``cgroup.procs`` on v2, which has no such file.
    A pid, even the writer's own, takes that lock on ``tasks`` too."""
    return os.path.join(d, "cgroup.procs" if hier == V2 else "tasks")
