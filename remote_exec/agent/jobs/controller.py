"""The job controller: typed operations behind the ``exec_remote_*`` JSON-RPC methods."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import os
import signal
import time
from pathlib import Path

from ...errors import InvalidParamsError
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
from .diskjob import DiskJob
from .home import JobHome
from .proctable import scan
from .proctree import Tree, marked_processes, signal_all, trees_members
from .ptyjob import PtyJob
from .readopt import readopt
from .registry import JobLimits, JobRegistry, Watcher, seq
from .spare import SpareDir, SpareFiles

__all__ = ["JobController", "JobLimits", "Watcher"]

log = logging.getLogger("remote_exec.agent")
SWEEP = 1.0  # seconds between disk-cap checks of running jobs' files
OBSERVE = 2.0  # seconds between looks at the trees of jobs without a cgroup (see _observe_trees)


class JobController(JobRegistry):
    """The ``exec_remote_*`` operations on the registry's jobs, and the registry's life: the
    disk-cap sweeper, re-adoption of an earlier agent's jobs, shutdown and handover."""

    def __init__(
        self,
        instance_id: str,
        limits: JobLimits | None = None,
        budget: MemoryBudget | None = None,
        *,
        home: JobHome,
        prefix: str | None = None,
    ) -> None:
        super().__init__(instance_id, limits, budget, home=home, prefix=prefix)
        self._starting: dict[str, asyncio.Future[StartResult]] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        self._observing: asyncio.Task[None] | None = None
        self._observe_due = 0.0
        # The next job's dir, made ahead (see .spare): off the start's path.
        self._spare = SpareDir(home.root.with_name(home.root.name + ".spare"))

    async def start(self, p: StartParams) -> StartResult:
        """Start ``p``'s job, or answer with the job an earlier attempt of the same start made
        (same ``idempotency_key``, or same client-chosen ``job_id`` and command).

        Cancelled during the spawn: the job is not registered (a retry starts it afresh).
        """
        key = p.idempotency_key
        if p.job_id is not None:
            known = self._repeat(p)
            if known is not None:
                return await known
        if key is not None and key in self._starting:
            # A retry while the first attempt is still spawning: answer with that attempt's job.
            return await asyncio.shield(self._starting[key])
        if key is not None and key in self._by_key:
            known_job = self._jobs[self._by_key[key]]
            return StartResult(job_id=known_job.job_id, pid=known_job.pid)
        self._expire()
        self._check_room()
        if self.watcher is not None:
            self.watcher.check(p)
        self.enforce_log_budget()
        mark = self._next_id()
        job_id = p.job_id or mark
        kind = PtyJob if p.tty else DiskJob
        job = kind(job_id, p, self.limits.buffer_limit, self._job_done, self.home, mark)
        if self.budget is not None:
            job.charge_to(self.budget)
        pending: asyncio.Future[StartResult] = asyncio.get_running_loop().create_future()
        if key is not None:
            self._starting[key] = pending  # registered before the await: no duplicate spawns
        if p.job_id is not None:
            self._starting_ids[p.job_id] = (p, pending)
        self._spawning += 1  # the slot is taken before the await: concurrent starts cannot overshoot
        try:
            spare = None if p.tty else self._spare  # a tty job makes its own dir (see PtyJob.spawn)
            await job.spawn(spare)  # SpawnError propagates; the job was never registered
            if spare is not None:
                spare.refill()  # the next one, in a thread
        except BaseException as exc:
            pending.set_exception(exc if isinstance(exc, Exception) else asyncio.CancelledError())
            pending.exception()  # retrieved: waiters re-raise it, nobody else needs to
            raise
        finally:
            self._spawning -= 1
            if key is not None:
                self._starting.pop(key, None)
            if p.job_id is not None:
                self._starting_ids.pop(p.job_id, None)
        self._jobs[job.job_id] = job
        if key is not None:
            self._by_key[key] = job.job_id
        if self.watcher is not None:
            self.watcher.started(job)
        result = StartResult(job_id=job.job_id, pid=job.pid)
        pending.set_result(result)
        return result

    async def poll(self, p: PollParams) -> PollResult | WithPayload:
        job = await self.held(p.job_id)
        try:
            return await job.poll(p)
        except ValueError as exc:  # a cursor past the end of a stream
            raise InvalidParamsError(str(exc), data={"job_id": p.job_id}) from None

    async def write_stdin(self, p: WriteStdinParams, payload: memoryview | None = None) -> WriteStdinResult:
        job = await self.held(p.job_id)
        written = await job.write_stdin_encoded(p.data, p.offset, p.eof, payload, p.writer)
        return WriteStdinResult(written=written, stdin_bytes=job.stdin.cursor(p.writer))

    async def signal(self, p: SignalParams) -> Empty:
        sig = p.signal if isinstance(p.signal, int) else signal.Signals[p.signal].value
        (await self.held(p.job_id)).send_signal(sig)
        return Empty()

    async def resize(self, p: ResizeParams) -> Empty:
        (await self.held(p.job_id)).resize(TtySize(cols=p.cols, rows=p.rows))
        return Empty()

    async def kill(self, p: KillParams) -> KillResult:
        return await (await self.held(p.job_id)).kill(p.grace)

    async def list(self, p: ListParams) -> ListResult:
        """One page of jobs in the order they were started (the agent's counter), after ``p.after``
        (a job id, or the ``next`` cursor of the page before)."""
        self._expire()
        start = -1 if p.after is None else self._seq_of(p.after)
        jobs = sorted((j for j in self._jobs.values() if seq(j.mark) > start), key=lambda j: seq(j.mark))
        if any(not j.running and j.owns_processes for j in jobs[: p.limit]):
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

    def _seq_of(self, after: str) -> int:
        """The counter of job ``after``: held here, forgotten lately (a page's cursor stays valid
        when its job goes before the next page is asked), or read from an id of the agent's form."""
        job = self._jobs.get(after)
        if job is not None:
            return seq(job.mark)
        return self._gone.get(after) or seq(after)

    async def release(self, p: JobIdParams) -> Empty:
        job = await self.held(p.job_id)
        if job.running:
            await job.kill(None)
        self._release(p.job_id)
        return Empty()

    async def read(self, p: ReadParams) -> WithPayload:
        """Bytes of one stream at an offset (its tail, or from a time), as the payload; moves no cursor."""
        job = await self.held(p.job_id)
        stream = job.streams[1 if p.stream == "stdout" else 2]
        size = stream.end
        if p.tail is not None and p.since is not None:
            raise InvalidParamsError("tail and since exclude each other", data={"job_id": p.job_id})
        if p.tail is not None:
            n = min(p.tail, p.max_bytes)
            offset = max(0, size - n)
        elif p.since is not None:  # the index is the job's file: its answer is clamped to the stream
            at = 0 if stream.times is None else stream.times.offset_at(p.since)
            n, offset = p.max_bytes, min(max(at, 0), size)
        else:
            n, offset = p.max_bytes, p.offset
        try:
            got = stream.read(offset, n, "base64", raw=True)  # base64 + raw: bytes, uncut
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
        job = await self.held(p.job_id)
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
        if self._observing is not None:
            self._observing.cancel()
        self._spare.close()
        for job in list(self._jobs.values()):
            await job.aclose()
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
        if self._observing is not None:
            self._observing.cancel()
        self._spare.close()  # the next agent makes its own
        for job in self._jobs.values():
            job.detach()

    # -- outliving the agent ---------------------------------------------------------------

    async def restore(self) -> int:
        """Re-adopt the jobs of the state dir (a previous agent's); return how many.

        Running ones (same pid and start time) are watched again; those that ended meanwhile
        get the exit the keeper recorded. A job dir without a readable ``job.json`` (the agent
        died while starting it) is removed.
        """
        restored = await readopt(self.home, self.prefix, self.limits.buffer_limit, self._job_done)
        restored.sort(key=lambda j: seq(j.mark))
        kept: dict[str, DiskJob] = {}
        for job in restored:  # two records naming one id (a job can rewrite its job.json): the first keeps it
            if job.job_id in kept:
                log.warning("cannot re-adopt %s: its id %s is another job's; leaving it out", job.mark, job.job_id)
            else:
                kept[job.job_id] = job
        restored = list(kept.values())
        ended = sorted((j for j in restored if not j.running), key=lambda j: j.ended_at or 0.0)
        for job in restored:
            self._jobs[job.job_id] = job
            self._counter = max(self._counter, seq(job.mark))
            if job.params.idempotency_key is not None:
                self._by_key[job.params.idempotency_key] = job.job_id
        for job in restored:
            if job.running and self.watcher is not None:
                self.watcher.started(job, resumed=True)
        for job in ended:
            self._finished[job.job_id] = time.monotonic() - max(0.0, time.time() - (job.ended_at or time.time()))
        self._expire()
        return len(restored)

    def take_spare(self, dest: Path) -> SpareFiles | None:
        """The ready-made job dir renamed to ``dest``, with its files' fds (the caller closes
        them), or None if none is ready (then the caller makes its own); the next is made in a
        thread."""
        files = self._spare.take(dest)
        self._spare.refill()
        return files

    def remove_unlisted_runs(self) -> int:
        """Remove the dirs of shell runs that no re-adopted session took up (their session
        could not be re-adopted, or their record was torn); return how many."""
        gone = 0
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.home.root):
                if entry.name.startswith(self.prefix + "-sh") and entry.name not in self._jobs:
                    self.home.discard(Path(entry.path))
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
        return sorted((i for i in self._finished if i.startswith(session_id + "-")), key=seq)

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
        self._observe_trees()
        self._sweeper = asyncio.get_running_loop().call_later(SWEEP, self.start_sweeper)

    def _observe_trees(self) -> None:
        """Without a cgroup a job's members are known only as they are seen (the ledger of
        :mod:`.proctree`): look at each such running job's tree every :data:`OBSERVE` seconds,
        so that a child is seen under its parent before it can leave (``setsid``, a cleared
        environment, its parent's exit). One walk of ``/proc`` for them all, in a thread."""
        now = time.monotonic()
        if now < self._observe_due or (self._observing is not None and not self._observing.done()):
            return
        self._observe_due = now + OBSERVE
        trees = {j.job_id: j.tree() for j in self._jobs.values() if j.needs_looking}
        if trees:
            self._observing = asyncio.get_running_loop().create_task(self._look(trees))

    @staticmethod
    async def _look(trees: dict[str, Tree]) -> None:
        try:
            await scan(trees_members, trees)
        except Exception:  # a bug here must not end the sweeper
            log.exception("looking at job trees failed")

    async def _find_leftovers(self) -> None:
        found = await scan(marked_processes, self.prefix + "-")
        for job in self._jobs.values():
            if job.owns_processes and not job.running:
                job.leftovers = sorted(found.get(job.mark, ()))
