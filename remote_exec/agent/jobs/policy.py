"""The enforcer of job policies: what the agent does to a job by itself, client or no client.

One ticker (every :data:`TICK` seconds, only while a running job has an active policy) checks
each watched job: is a client attached (:func:`attached`), has it been silent too long, is its
tree over its memory or CPU limit (one ``/proc`` walk for all of them), and runs its watch rules
over the output written since the last tick (:mod:`.watch`). A job nobody gave a policy costs
nothing here. The checks live in the agent, so they hold while the host is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

from ...errors import InvalidParamsError
from ...protocol import JobPolicy, StartParams
from ..keeperlink import KeeperLink
from ..stream import CURRENT_PEER, Peers
from ..treestats import add_orphans, read_trees
from .job import Job
from .proctable import scan
from .watch import RuleScanner, compile_rules

__all__ = ["PEER_SILENT", "TICK", "PolicyWatcher"]

log = logging.getLogger("remote_exec.agent")

TICK = 1.0
"""Seconds between checks of the limits and rules: they act within about this much of being
passed. The idle and disconnect checks of a job run every :data:`TICK` or every twentieth of
its timeout, whichever is longer: an hour's idle timeout is checked every 3 minutes, so a
hundred quiet jobs with such policies cost next to nothing."""

PEER_SILENT = 30.0
"""Seconds an open connection may go unheard before it no longer counts as attached. Clients
send a heartbeat every 2 s (``Liveness.interval``), so only a frozen client or a cut link (a
relay whose SSH session hangs) goes this quiet."""


@dataclass
class _Watched:
    """One job's policy state between ticks."""

    job: Job
    policy: JobPolicy
    rules: RuleScanner | None
    peers: set[int] = field(default_factory=set)  # connections that named the job
    attached_at: float = field(default_factory=time.monotonic)
    output_at: float = field(default_factory=time.monotonic)
    ends: tuple[int, int] = (0, 0)
    due: float = 0.0  # the next idle and disconnect check

    @property
    def every(self) -> float:
        """Seconds between this job's idle and disconnect checks (see :data:`TICK`)."""
        periods = [self.policy.idle_timeout or 0.0]
        if self.policy.on_disconnect == "kill":
            periods.append(self.policy.disconnect_grace)
        return max(TICK, min((p for p in periods if p), default=TICK) / 20)


class PolicyWatcher:
    """Enforces the policies of one registry's jobs (the registry's :class:`Watcher`)."""

    def __init__(self, peers: Peers, keeper: KeeperLink | None = None) -> None:
        self._peers = peers
        self._keeper = keeper  # counts the CPU of the orphans it reaped (see ..orphancpu)
        self._watched: dict[str, _Watched] = {}
        self._task: asyncio.Task[None] | None = None

    def check(self, p: StartParams) -> None:
        """Compile the watch rules before the spawn: a bad pattern refuses the start.

        :raises InvalidParamsError: a pattern that does not compile.
        """
        if p.policy is not None and p.policy.on_output:
            try:
                compile_rules(p.policy.on_output)
            except ValueError as exc:
                raise InvalidParamsError(f"bad watch rule: {exc}") from None

    def started(self, job: Job, resumed: bool = False) -> None:
        """Watch ``job`` if its policy asks for anything; its starter counts as attached.

        A ``resumed`` job (re-adopted from an earlier agent) has its rules go on from the
        output's end: what they saw then already had its effect (an interrupt is not resent).
        """
        policy = job.params.policy
        if policy is None or not policy.active:
            return
        rules = RuleScanner(job, policy.on_output, resumed) if policy.on_output else None
        if not job.running:
            if rules is not None and not resumed:
                rules.finish()  # it ended during its spawn, before anyone could read its end
            return
        self._watched[job.job_id] = _Watched(job, policy, rules)
        if rules is not None:
            job.before_end = rules.finish  # the rules see all output before the end is reported
        self.touched(job)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    def touched(self, job: Job) -> None:
        """The request being handled named ``job``: its connection is attached to it.

        A request from no frame-stream connection (HTTP, one ``agent call`` per request) counts
        as a client seen now: such a client is attached while it asks at least once a grace."""
        w = self._watched.get(job.job_id)
        if w is None:
            return
        w.attached_at = time.monotonic()
        peer = CURRENT_PEER.get()
        if peer is not None and len(w.peers) < 1024:
            w.peers.add(peer.id)

    async def aclose(self) -> None:
        """Stop enforcing (the agent is going away; the next one resumes from the job records)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while self._watched:
            await asyncio.sleep(TICK)  # a periodic check, as the disk-cap sweeper's
            try:
                await self._tick()
            except Exception:  # a bug here must not end enforcement for every other job
                log.exception("job policy check failed")

    async def _tick(self) -> None:
        now = time.monotonic()
        for job_id, w in list(self._watched.items()):
            if not w.job.running:  # its rules read the rest as it ended (RuleScanner.finish)
                del self._watched[job_id]
                continue
            if w.rules is not None:
                w.rules.scan()
            if now >= w.due:
                w.due = now + w.every
                self._check_output(w, now)
                self._check_clients(w, now)
        trees = {j: w for j, w in self._watched.items() if w.job.running and _limits(w.policy)}
        if trees:
            wanted = {j: w.job.tree() for j, w in trees.items()}
            readings = await add_orphans(self._keeper, await scan(read_trees, wanted))
            for j, w in trees.items():
                r = readings.get(j)
                if r is None:
                    continue
                limit, cpu = w.policy.memory_limit, w.policy.cpu_time
                if limit is not None and r.rss > limit:
                    # No grace: a tree past its memory may take the sandbox down meanwhile.
                    w.job.stop(f"killed: memory limit {_size(limit)} exceeded ({_size(r.rss)} resident)", 0.0)
                elif cpu is not None and r.cpu_seconds > cpu:
                    w.job.stop(f"killed: CPU time limit {cpu:g} s exceeded ({r.cpu_seconds:.1f} s used)")

    def _check_output(self, w: _Watched, now: float) -> None:
        ends = (w.job.streams[1].end, w.job.streams[2].end)
        if ends != w.ends:
            w.ends, w.output_at = ends, now
        idle = w.policy.idle_timeout
        if idle is not None and now - w.output_at >= idle:
            w.output_at = now  # once per silent stretch, not once per tick
            why = f"no output for {idle:g} s"
            if w.policy.idle_action == "kill":
                w.job.stop(f"killed: {why}")
            else:
                w.job.interrupt(f"interrupted: {why}")

    def _check_clients(self, w: _Watched, now: float) -> None:
        if w.policy.on_disconnect != "kill":
            return
        open_peers = self._peers.open
        w.peers &= open_peers.keys()
        silent = max(w.policy.disconnect_grace, PEER_SILENT)
        if any(now - open_peers[i].last_seen < silent for i in w.peers):
            w.attached_at = now
        elif now - w.attached_at >= w.policy.disconnect_grace:
            w.job.stop(f"killed: no client attached for {w.policy.disconnect_grace:g} s")


def _limits(policy: JobPolicy) -> bool:
    return policy.memory_limit is not None or policy.cpu_time is not None


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"
