"""The job registry: typed operations behind the ``exec_remote_*`` JSON-RPC methods."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import os
import shutil
import signal
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from ...errors import AgentLostError, InvalidParamsError, JobNotFoundError, ServerBusyError
from ...protocol import (
    MAX_PAGE_ITEMS,
    PAGE_BYTES,
    Empty,
    JobIdParams,
    JobInfo,
    KillParams,
    KillResult,
    ListParams,
    ListResult,
    PollParams,
    PollResult,
    PruneParams,
    PruneResult,
    ReadParams,
    ReadResult,
    ResizeParams,
    SignalParams,
    StartParams,
    StartResult,
    TtySize,
    WriteStdinParams,
    WriteStdinResult,
)
from ..budget import MemoryBudget
from ..rpc import WithPayload
from .diskjob import DiskJob, JobHome
from .job import Job
from .logbudget import evict
from .proctable import scan
from .proctree import marked_processes, signal_all
from .ptyjob import PtyJob, not_a_tty
from .readopt import readopt
from .spare import SpareDir, SpareFiles

__all__ = ["JobController", "JobLimits", "Watcher"]

log = logging.getLogger("remote_exec.agent")
COUNTER = "counter"  # in the jobs dir: the last job number handed out
SWEEP = 1.0  # seconds between disk-cap checks of running jobs' files

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


class JobController:
    r"""Owns the jobs of one state dir; job ids are ``<prefix>-<n>``, never reused.

    With a :class:`JobHome` (the server's case), jobs write to files and outlive this agent:
    ``prefix`` is the state dir's id, so ids stay valid for the next agent, which
    :meth:`restore`\ s them. Without one (unit tests), jobs live in memory and die with it.
    """

    def __init__(
        self,
        instance_id: str,
        limits: JobLimits | None = None,
        budget: MemoryBudget | None = None,
        home: JobHome | None = None,
        prefix: str | None = None,
    ) -> None:
        self.instance_id = instance_id  # this agent's (shell sessions carry it: they die with it)
        self.prefix = prefix or instance_id  # job ids carry it
        self.home = home
        self._sweeper: asyncio.TimerHandle | None = None
        self.limits = limits or JobLimits()
        self.budget = budget
        if budget is not None:
            budget.add_reclaimer(self._reclaim)
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._finished: OrderedDict[str, float] = OrderedDict()  # job_id -> ended (monotonic)
        self._by_key: dict[str, str] = {}
        self._starting: dict[str, asyncio.Future[StartResult]] = {}
        self._counter = 0
        if home is not None:  # carry on from the previous agents' counter
            with contextlib.suppress(OSError, ValueError):
                self._counter = int((home.root / COUNTER).read_bytes())
        self._first_seq = self._counter + 1  # smaller numbers are earlier agents'
        self._spawning = 0  # starts between the limit check and registering (their spawn awaited)
        self.watcher: Watcher | None = None  # the policy enforcer (the server sets it)
        # The next job's dir, made ahead (see .spare): off the start's path.
        self._spare = SpareDir(home.root.with_name(home.root.name + ".spare")) if home is not None else None

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
        if self.home is not None:
            with contextlib.suppress(OSError):  # a full disk: the spawn fails anyway
                fd = os.open(self.home.root / COUNTER, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
                try:
                    os.pwrite(fd, b"%20d\n" % self._counter, 0)
                finally:
                    os.close(fd)
        return f"{self.prefix}-{self._counter}"

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
        if sep and instance != self.prefix and not shell:
            what = "state dir" if self.home is not None else "agent instance"
            raise AgentLostError(
                f"job {job_id} belonged to agent instance {instance}, which is gone; this agent's "
                f"{what} ({self.prefix}) has no record of that job's state or output",
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
            for buf in job.streams.values():
                buf.discard()  # gives its bytes back to the memory budget
            if job.params.idempotency_key is not None:
                self._by_key.pop(job.params.idempotency_key, None)
            for stream in job.files:
                stream.charge_to(None)  # its bytes leave the log budget with its dir
            job.remove_logs()

    def _reclaim(self, n: int) -> int:
        """Free ``n`` bytes of the memory budget by dropping finished jobs' output, oldest job
        first: a running job's newest output matters more than an old result nobody fetched.
        Readers see the bytes as dropped; the jobs stay listed with their exit codes."""
        freed = 0
        for job_id in self._finished:
            for buf in self._jobs[job_id].streams.values():
                freed += buf.discard(n - freed)
                if freed >= n:
                    return freed
        return freed

    def _job_done(self, job: Job) -> None:
        self._finished[job.job_id] = time.monotonic()
        self._expire()
        self.enforce_log_budget()  # its final size was just read: a quick job may have filled it

    def enforce_log_budget(self) -> int:
        """Keep all logs within the agent's log budget: drop ended jobs' logs (oldest end
        first), then the largest running streams' heads; return the bytes dropped. Uses the
        sizes last seen (no directory walk): the sweep, a job's end and reads keep them fresh."""
        logs = self.home.logs if self.home is not None else None
        if logs is None or logs.over <= 0:
            return 0
        finished = [j.files for j in map(self._jobs.get, self._finished) if j is not None and j.files]
        running = [s for j in self._jobs.values() if j.running for s in j.files]
        dropped = evict(logs, finished, running)
        if dropped:
            log.info("log budget (%d bytes): dropped the head of %d bytes of logs", logs.limit, dropped)
        return dropped

    async def start(self, p: StartParams) -> StartResult:
        key = p.idempotency_key
        if key is not None and key in self._starting:
            # A retry while the first attempt is still spawning: answer with that attempt's job.
            return await asyncio.shield(self._starting[key])
        if key is not None and key in self._by_key:
            known = self._jobs[self._by_key[key]]
            return StartResult(job_id=known.job_id, pid=known.pid)
        self._expire()
        self._check_room()
        if self.watcher is not None:
            self.watcher.check(p)
        self.enforce_log_budget()
        job_id = self._next_id()
        job: Job
        if self.home is not None:
            kind = PtyJob if p.tty else DiskJob
            job = kind(job_id, p, self.limits.buffer_limit, self._job_done, self.home)
        elif p.tty:
            raise InvalidParamsError("tty jobs need the agent's job dir (an agent served with a state dir)")
        else:
            job = Job(job_id, p, self.limits.buffer_limit, self._job_done)
        if self.budget is not None:
            job.charge_to(self.budget)
        pending: asyncio.Future[StartResult] = asyncio.get_running_loop().create_future()
        if key is not None:
            self._starting[key] = pending  # registered before the await: no duplicate spawns
        self._spawning += 1  # the slot is taken before the await: concurrent starts cannot overshoot
        try:
            if isinstance(job, DiskJob) and not isinstance(job, PtyJob):  # a tty job makes its own dir
                await job.spawn(self._spare)  # SpawnError propagates; the job was never registered
                assert self._spare is not None
                self._spare.refill()  # the next one, in a thread
            else:
                await job.spawn()
        except BaseException as exc:
            pending.set_exception(exc if isinstance(exc, Exception) else asyncio.CancelledError())
            pending.exception()  # retrieved: waiters re-raise it, nobody else needs to
            raise
        finally:
            self._spawning -= 1
            if key is not None:
                self._starting.pop(key, None)
        self._jobs[job.job_id] = job
        if key is not None:
            self._by_key[key] = job.job_id
        if self.watcher is not None:
            self.watcher.started(job)
        result = StartResult(job_id=job.job_id, pid=job.pid)
        pending.set_result(result)
        return result

    def next_seq(self) -> int:
        """A number from the job counter (kept on disk): a shell session's, never handed out again."""
        return _seq(self._next_id())

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
                job_id = f"{owner}-{_seq(job_id)}"
        job = make(job_id, self.limits.buffer_limit, self._job_done)
        if self.budget is not None:
            job.charge_to(self.budget)
        self._jobs[job.job_id] = job
        return job

    def take_spare(self, dest: Path) -> SpareFiles | None:
        """The ready-made job dir renamed to ``dest``, with its files' fds (the caller closes
        them), or None if none is ready (then the caller makes its own); the next is made in a
        thread."""
        if self._spare is None:
            return None
        files = self._spare.take(dest)
        self._spare.refill()
        return files

    def remove_unlisted_runs(self) -> int:
        """Remove the dirs of shell runs that no re-adopted session took up (their session
        could not be re-adopted, or their record was torn); return how many."""
        if self.home is None:
            return 0
        gone = 0
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.home.root):
                if entry.name.startswith(self.prefix + "-sh") and entry.name not in self._jobs:
                    shutil.rmtree(entry.path, ignore_errors=True)
                    gone += 1
        return gone

    def unlist(self, job_id: str) -> None:
        """Take a job out of the registry, its logs left on disk (a finished shell run that the
        job re-adoption found, whose session re-adopts it as its run in progress)."""
        job = self._jobs.pop(job_id, None)
        self._finished.pop(job_id, None)
        if job is not None:
            for stream in job.files:
                stream.charge_to(None)

    def shell_runs(self, session_id: str) -> builtins.list[str]:
        """Ids of the ended jobs that are runs of shell ``session_id``, oldest first."""
        return sorted((i for i in self._finished if i.startswith(session_id + "-")), key=_seq)

    async def poll(self, p: PollParams) -> PollResult | bytes | WithPayload:
        job = self._get(p.job_id)
        try:
            return await job.poll(p)
        except ValueError as exc:  # a cursor past the end of a stream
            raise InvalidParamsError(str(exc), data={"job_id": p.job_id}) from None

    async def write_stdin(self, p: WriteStdinParams, payload: memoryview | None = None) -> WriteStdinResult:
        job = self._get(p.job_id)
        written = await job.write_stdin_encoded(p.data, p.offset, p.eof, payload)
        return WriteStdinResult(written=written, stdin_bytes=job.stdin.written)

    async def signal(self, p: SignalParams) -> Empty:
        sig = p.signal if isinstance(p.signal, int) else signal.Signals[p.signal].value
        self._get(p.job_id).send_signal(sig)
        return Empty()

    async def resize(self, p: ResizeParams) -> Empty:
        job = self._get(p.job_id)
        if not isinstance(job, PtyJob):
            raise not_a_tty(p.job_id)
        job.resize(TtySize(cols=p.cols, rows=p.rows))
        return Empty()

    async def kill(self, p: KillParams) -> KillResult:
        return await self._get(p.job_id).kill(p.grace)

    async def list(self, p: ListParams) -> ListResult:
        """One page of jobs in the order they were started (their ids' counter), after ``p.after``."""
        self._expire()
        start = -1 if p.after is None else _seq(p.after)
        jobs = sorted((j for j in self._jobs.values() if _seq(j.job_id) > start), key=lambda j: _seq(j.job_id))
        if any(not j.running and isinstance(j, DiskJob) for j in jobs[: p.limit]):
            await self._find_leftovers()
        page: list[JobInfo] = []
        size = 0
        for job in jobs:
            if len(page) >= p.limit or size >= PAGE_BYTES:
                return ListResult(jobs=page, next=page[-1].job_id)
            info = job.info()
            page.append(info)
            size += len(info.model_dump_json())
        return ListResult(jobs=page)

    async def release(self, p: JobIdParams) -> Empty:
        job = self._get(p.job_id)
        if job.running:
            await job.kill(None)
        self._release(p.job_id)
        return Empty()

    async def read(self, p: ReadParams) -> WithPayload:
        """Bytes of one stream at an offset (or its tail), as the payload; moves no cursor."""
        job = self._get(p.job_id)
        stream = job.streams[1 if p.stream == "stdout" else 2]
        size = stream.end
        if p.tail is not None:
            n = min(p.tail, p.max_bytes)
            offset = max(0, size - n)
        else:
            n, offset = p.max_bytes, p.offset
        try:
            got = stream.read(offset, n, "base64", peek=True, raw=True)  # base64 + raw: bytes, uncut
        except ValueError as exc:
            raise InvalidParamsError(str(exc), data={"job_id": p.job_id}) from None
        assert isinstance(got.data, bytes)
        state = job.state
        result = ReadResult(
            offset=got.start,
            dropped=got.dropped,
            size=max(size, got.end),
            state=state,
            exit_code=None if state == "running" else job.exit_code,
        )
        return WithPayload(result, got.data)

    async def forget(self, p: JobIdParams) -> Empty:
        """Forget an ended job: its record and its logs go (a running one is refused)."""
        job = self._get(p.job_id)
        if job.running:
            raise InvalidParamsError(
                f"job {p.job_id} is still running: kill it first, then forget it", data={"job_id": p.job_id}
            )
        self._release(p.job_id)
        return Empty()

    async def prune(self, p: PruneParams) -> PruneResult:
        """Forget ended jobs older than ``p.older_than`` seconds or beyond the newest ``p.keep``."""
        now = time.monotonic()
        ended = list(self._finished.items())  # oldest end first
        doomed = {job_id for job_id, at in ended if p.older_than is not None and now - at > p.older_than}
        if p.keep is not None:
            doomed.update(job_id for job_id, _ in ended[: max(0, len(ended) - p.keep)])
        gone = [job_id for job_id, _ in ended if job_id in doomed]
        for job_id in gone:
            self._release(job_id)
        return PruneResult(forgotten=len(gone), job_ids=gone[:MAX_PAGE_ITEMS])

    async def aclose(self) -> None:
        """Kill every job's whole tree, leftovers of ended jobs included (an explicit shutdown:
        everything ends), then give the killed jobs a moment to have their ends recorded."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._spare is not None:
            self._spare.close()
        for job in list(self._jobs.values()):
            await job.aclose()
        if self.home is not None:
            for _ in range(50):  # a few rounds: a process may fork while we kill
                found = await scan(marked_processes, self.prefix + "-")
                if not found:
                    break
                signal_all(set().union(*found.values()), signal.SIGKILL)
            running = [j.ended() for j in self._jobs.values() if j.running]
            if running:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.gather(*running), 1.0)

    def detach(self) -> None:
        """The agent hands its jobs over: leave every process running, stop watching them."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._spare is not None:
            self._spare.close()  # the next agent makes its own
        for job in self._jobs.values():
            if isinstance(job, DiskJob):
                job.detach()

    # -- outliving the agent ---------------------------------------------------------------

    async def restore(self) -> int:
        """Re-adopt the jobs of the state dir (a previous agent's); return how many.

        Running ones (same pid and start time) are watched again; those that ended meanwhile
        get the exit the keeper recorded. A job dir without a readable ``job.json`` (the agent
        died while starting it) is removed.
        """
        home = self.home
        if home is None:
            return 0
        restored = await readopt(home, self.prefix, self.limits.buffer_limit, self._job_done)
        restored.sort(key=lambda j: _seq(j.job_id))
        ended = sorted((j for j in restored if not j.running), key=lambda j: j.ended_at or 0.0)
        for job in restored:
            self._jobs[job.job_id] = job
            self._counter = max(self._counter, _seq(job.job_id))
            if job.params.idempotency_key is not None:
                self._by_key[job.params.idempotency_key] = job.job_id
        for job in restored:
            if job.running and self.watcher is not None:
                self.watcher.started(job, resumed=True)
        for job in ended:
            self._finished[job.job_id] = time.monotonic() - max(0.0, time.time() - (job.ended_at or time.time()))
        self._expire()
        return len(restored)

    async def end_dead_shells(self, adopted: set[str] | frozenset[str] = frozenset()) -> int:
        """End the shells (and their runs) an earlier agent of this state dir left behind and
        this one did not re-adopt (their markers are not in ``adopted``).

        They carry the marker ``<state dir id>-<state dir id>-sh<n>``; this agent's own shells
        start after this runs. Returns how many processes were killed.
        """
        total = 0
        for _ in range(50):  # a process may fork while we kill
            found = await scan(marked_processes, self.prefix + "-")
            pids = set().union(*(p for mark, p in found.items() if "-sh" in mark and mark not in adopted))
            if not pids:
                break
            signal_all(pids, signal.SIGKILL)
            total += len(pids)
        return total

    def start_sweeper(self) -> None:
        """Check running jobs' files against their disk cap every :data:`SWEEP` seconds (and
        make the next job's dir if none is ready)."""
        if self._spare is not None:
            self._spare.refill()
        for job in self._jobs.values():
            if job.running:
                for stream in job.files:
                    stream.enforce_cap()
        self.enforce_log_budget()
        self._sweeper = asyncio.get_running_loop().call_later(SWEEP, self.start_sweeper)

    async def _find_leftovers(self) -> None:
        found = await scan(marked_processes, self.prefix + "-")
        for job in self._jobs.values():
            if isinstance(job, DiskJob) and not job.running:
                job.leftovers = sorted(found.get(job.job_id, ()))


def _seq(job_id: str) -> int:
    """The start counter in a job id (``<instance>-<n>``): the listing's order and page cursor."""
    try:
        return int(job_id.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        raise InvalidParamsError(f"not a job id of this agent: {job_id!r}", data={"job_id": job_id}) from None
