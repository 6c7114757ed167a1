"""The job registry: the jobs of one state dir, their ids, lookup and retention.

It holds the jobs (running and ended), hands out ids (a counter kept on disk, never reused),
finds a job for a request (or says precisely why it is gone), forgets ended jobs past their
retention, and gives back memory and log budget. :class:`~.controller.JobController` adds the
``exec_remote_*`` operations on top.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from ...errors import AgentLostError, InvalidParamsError, JobNotFoundError, ServerBusyError
from ...protocol import JobInfo, StartParams, StartResult
from ..budget import MemoryBudget
from ..statefile import open_own_file, planted, read_state_file
from .home import JobHome
from .job import Job
from .logbudget import evict
from .proctree import Tree

__all__ = ["COUNTER", "JobLimits", "JobRegistry", "Watcher", "seq"]

log = logging.getLogger("remote_exec.agent")
_AGENT_ID = re.compile(r"[0-9a-f]{8}")  # a state dir's or agent instance's id (secrets.token_hex(4))
COUNTER = "counter"  # in the jobs dir: the last job number handed out
GONE_KEPT = 4096  # forgotten jobs whose client-chosen ids still work as a listing's page cursor

J = TypeVar("J", bound=Job)


class Watcher(Protocol):
    """What the registry tells the enforcer of job policies (:mod:`..policy`), if any."""

    def check(self, p: StartParams) -> None:
        """Before the spawn: refuse a policy that cannot be enforced (a bad watch pattern)."""

    def started(self, job: Job, resumed: bool = False) -> None:
        """A job started (``resumed``: was re-adopted, running): watch it if its policy asks."""

    def touched(self, job: Job) -> None:
        """A request named the job: its client is attached."""


@dataclass(frozen=True)
class JobLimits:
    """Bounds that keep the agent's memory and process count finite.

    :ivar buffer_limit: bytes retained per stream per job (older bytes are reported as dropped).
    :ivar max_running: running jobs at once; more starts get ``ServerBusyError``.
    :ivar retain_seconds: how long a finished job stays readable, its record and logs on disk
        (for attach, ``logs`` and dashboards); older ones are forgotten.
    :ivar max_retained: finished jobs kept at most; the oldest are forgotten first.
    """

    buffer_limit: int = 8 * 1024 * 1024
    max_running: int = 4096
    retain_seconds: float = 7 * 24 * 3600.0  # a three-day run's logs outlive the run by days
    max_retained: int = 1000


class JobRegistry:
    r"""The jobs of one state dir; job ids are ``<prefix>-<n>``, never reused.

    With a :class:`JobHome` (the server's case), jobs write to files and outlive this agent:
    ``prefix`` is the state dir's id, so ids stay valid for the next agent, which
    :meth:`~.controller.JobController.restore`\ s them. Without one (unit tests), jobs live in
    memory and die with it.
    """

    def __init__(
        self,
        instance_id: str,
        limits: JobLimits | None = None,
        budget: MemoryBudget | None = None,
        *,
        home: JobHome,
        prefix: str | None = None,
    ) -> None:
        self.instance_id = instance_id  # this agent's (shell sessions carry it: they die with it)
        self.prefix = prefix or instance_id  # job ids carry it
        self.home = home
        self.limits = limits or JobLimits()
        self.budget = budget
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._finished: OrderedDict[str, float] = OrderedDict()  # job_id -> ended (monotonic)
        self._by_key: dict[str, str] = {}
        self._gone: OrderedDict[str, int] = OrderedDict()  # client-chosen id -> counter, of forgotten jobs
        self._starting_ids: dict[str, tuple[StartParams, asyncio.Future[StartResult]]] = {}  # by client-chosen id
        self._counter = _read_counter(home)  # carry on from the previous agents' counter
        self._first_seq = self._counter + 1  # smaller numbers are earlier agents'
        self._spawning = 0  # starts between the limit check and registering (their spawn awaited)
        self.watcher: Watcher | None = None  # the policy enforcer (the server sets it)

    @property
    def running_count(self) -> int:
        return len(self._jobs) - len(self._finished)

    def _check_room(self) -> None:
        busy = self.running_count + self._spawning
        if busy >= self.limits.max_running:
            raise ServerBusyError(
                f"{busy} jobs are running, the limit of this agent", data={"limit": self.limits.max_running}
            )

    def info(self, job_id: str) -> JobInfo:
        """The job's current record (read-only; for the metrics sampler and other readers).

        :raises JobNotFoundError: no such job here.
        """
        return self._get(job_id).info()

    def is_running(self, job_id: str) -> bool:
        """Whether ``job_id`` is a job of this agent still running (no error if unknown)."""
        job = self._jobs.get(job_id)
        return job is not None and job.running

    def running_tree(self, job_id: str) -> Tree | None:
        """What names the job's processes (see :func:`.proctree.tree_members`) while it runs,
        ``None`` once it ended (for the sampler).

        :raises JobNotFoundError: no such job here.
        """
        job = self._get(job_id)
        return job.tree() if job.running else None

    def running_pid(self, job_id: str) -> int | None:
        """The job's pid (its session id) while it runs, ``None`` once it ended (for the sampler).

        :raises JobNotFoundError: no such job here.
        """
        job = self._get(job_id)
        return job.pid if job.running else None

    def _next_id(self) -> str:
        """A new job id. The counter is on disk before the job exists: a forgotten job's id is
        never handed out again by a later agent, which would otherwise start counting from the
        highest id it still finds."""
        self._counter += 1
        with contextlib.suppress(OSError, ValueError):  # a full disk: the spawn fails anyway
            fd = open_own_file(self.home.root / COUNTER, os.O_WRONLY)
            try:
                os.pwrite(fd, b"%20d\n" % self._counter, 0)
            finally:
                os.close(fd)
        return f"{self.prefix}-{self._counter}"

    def _repeat(self, p: StartParams) -> asyncio.Future[StartResult] | None:
        """The answer to a start under a client-chosen id the agent already holds (running,
        ended or still spawning): that job, if ``p`` starts the same command the same way;
        None if the id is new.

        :raises InvalidParamsError: the id has the agent's own form, or names another command.
        """
        assert p.job_id is not None
        if p.job_id.startswith(self.prefix + "-"):
            # Those are the agent's own ids (its jobs, shells and runs): a client's would clash.
            raise InvalidParamsError(
                f"job id {p.job_id} has the form of this agent's own ids ({self.prefix}-...): choose another",
                data={"job_id": p.job_id},
            )
        spawning = self._starting_ids.get(p.job_id)
        known = spawning[0] if spawning is not None else None
        job = self._jobs.get(p.job_id)
        if job is not None:
            known = job.params
        if known is None:
            return None
        if _how(known) != _how(p):
            raise InvalidParamsError(
                f"job id {p.job_id} is taken by another job (another command, directory, user, encoding or "
                "terminal): a client's retry of a start repeats it exactly; choose another id for a new job",
                data={"job_id": p.job_id},
            )
        if spawning is not None and job is None:
            return asyncio.shield(spawning[1])
        assert job is not None
        done: asyncio.Future[StartResult] = asyncio.get_running_loop().create_future()
        done.set_result(StartResult(job_id=job.job_id, pid=job.pid))
        return done

    async def held(self, job_id: str) -> Job:
        """The job ``job_id`` for a client's call, once its start is through: a client names its
        own id before the start's answer comes back (its job may already be writing output), so a
        call on an id still spawning waits for that spawn instead of calling the job unknown.

        :raises JobNotFoundError: no such job, or its spawn failed.
        """
        spawning = self._starting_ids.get(job_id)
        if spawning is not None:
            with contextlib.suppress(Exception):  # a failed spawn: the job is unknown, below
                await asyncio.shield(spawning[1])
        return self._get(job_id)

    def _get(self, job_id: str) -> Job:
        job = self._jobs.get(job_id)
        if job is not None:
            if self.watcher is not None:
                self.watcher.touched(job)
            return job
        instance, sep, _ = job_id.rpartition("-")
        agent, shell, number = instance.rpartition("-sh")
        if sep and shell and agent == self.prefix and number.isdigit() and int(number) < self._first_seq:
            raise AgentLostError(
                f"job {job_id} was a run of shell {instance}, which an earlier agent of this state dir "
                "started and this one holds no record of: the shell was not re-adopted (it ended, or "
                "its agent shut down), or the run was released",
                data={"job_id": job_id, "session_id": instance},
            )
        if sep and shell and agent != self.prefix:
            raise AgentLostError(
                f"job {job_id} was a run of shell {instance}, which died with its agent instance {agent}: "
                "this agent is another one's",
                data={"job_id": job_id, "session_id": instance},
            )
        if sep and instance != self.prefix and not shell and _AGENT_ID.fullmatch(instance):
            # (only an id of the form agents make: a client-chosen "train-3" names no agent)
            raise AgentLostError(
                f"job {job_id} belonged to agent instance {instance}, which is gone; this agent's "
                f"state dir ({self.prefix}) has no record of that job's state or output",
                data={"job_id": job_id},
            )
        raise JobNotFoundError(f"no job {job_id} (never started, released, or expired)", job_id=job_id)

    def _expire(self) -> None:
        now = time.monotonic()
        while self._finished:
            job_id, ended = next(iter(self._finished.items()))
            if now - ended < self.limits.retain_seconds and len(self._finished) <= self.limits.max_retained:
                break
            self._release(job_id)

    def _release(self, job_id: str) -> None:
        job = self._jobs.pop(job_id, None)
        self._finished.pop(job_id, None)
        if job is not None:
            if job.mark != job_id:  # a client's id: its place in listings is kept for page cursors
                self._gone[job_id] = seq(job.mark)
                if len(self._gone) > GONE_KEPT:
                    self._gone.popitem(last=False)
            if job.params.idempotency_key is not None:
                self._by_key.pop(job.params.idempotency_key, None)
            for stream in job.files:
                stream.charge_to(None)  # its bytes leave the log budget with its dir
            job.remove_logs()

    def _job_done(self, job: Job) -> None:
        self._finished[job.job_id] = time.monotonic()
        self._expire()
        self.enforce_log_budget()  # its final size was just read: a quick job may have filled it

    def enforce_log_budget(self) -> int:
        """Keep all logs within the agent's log budget: drop ended jobs' logs (oldest end
        first), then the largest running streams' heads; return the bytes dropped. Uses the
        sizes last seen (no directory walk): the sweep, a job's end and reads keep them fresh."""
        logs = self.home.logs
        if logs is None or logs.over <= 0:
            return 0
        finished = [j.files for j in map(self._jobs.get, self._finished) if j is not None and j.files]
        running = [s for j in self._jobs.values() if j.running for s in j.files]
        dropped = evict(logs, finished, running)
        if dropped:
            log.info("log budget (%d bytes): dropped the head of %d bytes of logs", logs.limit, dropped)
        return dropped

    def next_seq(self) -> int:
        """A number from the job counter (kept on disk): a shell session's, never handed out again."""
        return seq(self._next_id())

    def peek_seq(self) -> int:
        """The last number the counter handed out (to any agent of this state dir)."""
        return self._counter

    def adopt(
        self, make: Callable[[str, int, Callable[[Job], None]], J], owner: str | None = None, job_id: str | None = None
    ) -> J:
        """Register a job made elsewhere (a shell run) so the job methods serve it too.

        ``make(job_id, buffer_limit, on_done)`` builds it; it counts against ``max_running``.
        Its id starts with ``owner`` (a shell session's id) instead of the state dir's. ``job_id``:
        the id it had under an earlier agent (a re-adopted run).

        :raises ServerBusyError: the agent is at its limit of running jobs.
        """
        self._expire()
        self._check_room()
        if job_id is None:
            job_id = self._next_id()
            if owner is not None:
                job_id = f"{owner}-{seq(job_id)}"
        job = make(job_id, self.limits.buffer_limit, self._job_done)
        if self.budget is not None:
            job.charge_to(self.budget)
        self._jobs[job.job_id] = job
        return job


def seq(job_id: str) -> int:
    """The start counter in a job id (``<instance>-<n>``): the listing's order and page cursor."""
    try:
        return int(job_id.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        raise InvalidParamsError(f"not a job id of this agent: {job_id!r}", data={"job_id": job_id}) from None


def _read_counter(home: JobHome) -> int:
    """The last job number an earlier agent handed out (0 if none can be read). A job can replace
    the file (a symlink to ``/dev/zero`` once made every agent read until the OOM killer came):
    it is read as hostile input; a bad one is logged and removed (the next id writes a new one),
    and counting goes on from the ids on disk."""
    path = home.root / COUNTER
    try:
        return max(0, int(read_state_file(path, 64)))
    except FileNotFoundError:
        return 0
    except (OSError, ValueError) as exc:
        log.warning("skipped %s: %s%s", path, exc, "; removed" if planted(exc) else "")
        if planted(exc):
            with contextlib.suppress(OSError):
                os.unlink(path)  # a symlink or FIFO itself, never what it names
        return 0


def _how(p: StartParams) -> tuple[object, ...]:
    """What makes two starts the same job (what a job's record keeps: env values and input
    are never on disk, so a retry after an agent restart is compared without them)."""
    return (p.command, p.cwd, p.user, p.encoding, p.tty)
