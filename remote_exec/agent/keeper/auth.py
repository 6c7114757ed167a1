"""Who the keeper serves, and its ledger of the job leaders its agents started (issue #21, points 4 and 7).

**Only its agent.** ``keeper.sock`` is 0600, so every peer is the agent's user, and so is every
job: a job that connected used to get a shell session's run key (``fd``) and forge its run's
end, or drop another job's stdin. Now the ops that hand out or change what the keeper holds
(:data:`AGENT_OPS`) are answered only on a connection made by the agent the keeper itself
spawned, told by the peer's credentials (``SO_PEERCRED``, taken by the kernel at ``connect``).
That pid cannot be a recycled one: the agent is the keeper's child, so its pid stays taken (a
zombie at worst) until the keeper reaps it, and the reap ends the connection's standing (each
spawn is a new generation; a connection belongs to the generation it was accepted in). The
next agent after a handover or a crash is again one the keeper spawned itself, so nothing has to
be announced. ``hello`` (versions and pids, no secret) and ``start`` (what ``ensure`` sends)
stay open to the user's other processes; ``start`` changes the agent's argv only while no agent
runs (see docs/security.md for the residual of a handover).

**The leaders' ledger.** A job's ``job.json`` is the job's to rewrite (it runs as the agent's
user), so its pid and start time cannot say which process the next agent may signal: a forged
one named a process outside the job and the next agent killed its group. The agent tells the
keeper each leader it spawned (``lead``); the keeper checks that the pid is its agent's child and
reads the start time itself. The next agent re-adopts a job as running only if the ledger names
that very process (pid *and* start time) for that job id (``leads``).

Standard library only, like the keeper.
"""

from __future__ import annotations

import socket
import struct
from collections import OrderedDict

from ..procfacts import proc_parent, proc_starttime

__all__ = ["AGENT_OPS", "Leaders", "peer_of"]

AGENT_OPS = frozenset({"exit", "cpu", "exits", "hold", "fd", "drop", "lead", "leads", "leaving"})
MAX_LEADERS = 65536  # jobs a keeper remembers at most (an agent runs 4 096 at once by default)


def peer_of(sock: socket.socket) -> tuple[int, int]:
    """The ``(pid, uid)`` of the process that connected ``sock`` (as the kernel recorded it)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", creds)
    return pid, uid


class Leaders:
    """Job id -> ``(pid, start time)`` of the leader the keeper's agent started for it."""

    def __init__(self) -> None:
        self._by_key: OrderedDict[str, tuple[int, int]] = OrderedDict()

    def add(self, key: str, pid: object, agent_pid: int) -> str | None:
        """Record ``pid`` as job ``key``'s leader; return why not (None: recorded)."""
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            return "not a pid"
        if not agent_pid or proc_parent(pid) != agent_pid:
            return f"pid {pid} is not a child of the agent"
        start = proc_starttime(pid)  # the keeper's own reading: the agent's word is not needed
        if start is None:
            return f"no process {pid}"
        self._by_key.pop(key, None)
        self._by_key[key] = (pid, start)
        while len(self._by_key) > MAX_LEADERS:
            self._by_key.popitem(last=False)
        return None

    def forget(self, key: str) -> None:
        self._by_key.pop(key, None)

    def answer(self) -> dict[str, list[int]]:
        return {key: [pid, start] for key, (pid, start) in self._by_key.items()}
