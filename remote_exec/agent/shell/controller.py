"""The shell session registry: typed operations behind the ``shell_*`` JSON-RPC methods.

Runs are registered with the :class:`~remote_exec.agent.jobs.controller.JobController` as
job-like entries, so they are polled, listed, attached to and killed through the job methods.
Sessions outlive a killed or upgraded agent where a keeper holds their stdin and key: the next
agent re-adopts them (:meth:`ShellController.restore`); an agent's shutdown ends them.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import (
    AgentLostError,
    JobNotFoundError,
    RemoteExecError,
    ServerBusyError,
    ShellBusyError,
    ShellClosedError,
    ShellNotFoundError,
)
from ...protocol import (
    Empty,
    JobIdParams,
    ShellIdParams,
    ShellInfo,
    ShellListParams,
    ShellListResult,
    ShellOpenParams,
    ShellRunParams,
    StartParams,
    StartResult,
)
from ..jobs.controller import JobController
from ..jobs.job import Job
from ..jobs.proctable import scan
from ..jobs.proctree import kill_tree
from ..keeperlink import KeeperLink
from ..statefile import claim_state_dir, same_dir
from .process import ShellHome, default_shell
from .record import read_key, read_record
from .run import ShellRun
from .runlog import RunLog
from .session import MAX_KEYS, ShellSession
from .store import no_space

__all__ = ["ShellController", "ShellLimits"]

log = logging.getLogger("remote_exec.agent")


@dataclass(frozen=True)
class ShellLimits:
    """Bounds on shell sessions.

    :ivar ttl: seconds a session may sit idle (no run) before it is closed; 0 means never.
    :ivar max_open: open sessions at once; more opens get ``ServerBusyError``.
    :ivar max_closed: closed sessions remembered, so a late call gets ``ShellClosedError``
        rather than ``ShellNotFoundError``.
    :ivar retain_runs: runs a session keeps in the job registry besides its latest one
        (pollable, listed, attachable); older ones are released, so a long session does not
        crowd other jobs out of the registry.
    :ivar argv: the shell to run; ``None`` finds bash, else sh.
    """

    ttl: float = 3600.0
    max_open: int = 256
    max_closed: int = 64
    retain_runs: int = 16
    argv: tuple[str, ...] | None = None


class ShellController:
    """Owns every shell session of one agent; ids are ``<state dir id>-sh<n>`` (``n`` from the
    job counter, kept on disk), never reused by a later agent either."""

    def __init__(
        self,
        jobs: JobController,
        limits: ShellLimits | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        home: ShellHome | None = None,
    ) -> None:
        self.jobs = jobs
        self.home = home or ShellHome()
        self._first_seq = jobs.peek_seq() + 1  # ids below it are earlier agents' sessions
        self._clock = clock  # monotonic seconds that ``ttl`` is counted in (tests pass a fake one)
        self.limits = limits or ShellLimits()
        self._sessions: OrderedDict[str, ShellSession] = OrderedDict()
        self._opening = 0  # opens between the limit check and registering (their shell starting)

    @property
    def open_count(self) -> int:
        return sum(1 for s in self._sessions.values() if s.open)

    def _get(self, session_id: str) -> ShellSession:
        session = self._sessions.get(session_id)
        if session is not None:
            return session
        owner, sep, seq = session_id.rpartition("-sh")
        if sep and owner != self.jobs.prefix:
            raise AgentLostError(
                f"shell {session_id} belonged to agent instance {owner}, which is gone; shell sessions "
                f"die with their agent, and this one ({self.jobs.prefix}) is another",
                data={"session_id": session_id},
            )
        if sep and seq.isdigit() and int(seq) < self._first_seq:
            raise AgentLostError(
                f"shell {session_id} was not re-adopted from an earlier agent of this state dir: shell "
                "sessions die with their agent when it shuts down (they outlive it being killed or "
                "upgraded while its keeper holds them)",
                data={"session_id": session_id},
            )
        raise ShellNotFoundError(f"no shell session {session_id}", session_id=session_id)

    def _get_open(self, session_id: str) -> ShellSession:
        session = self._get(session_id)
        if not session.open:
            raise ShellClosedError(
                f"shell {session_id} is closed: {session.closed_reason}",
                session_id=session_id,
                data={"exit_code": session.exit_code},
            )
        return session

    def _closed(self, _: ShellSession) -> None:
        closed = [sid for sid, s in self._sessions.items() if not s.open]
        for sid in closed[: max(0, len(closed) - self.limits.max_closed)]:
            del self._sessions[sid]

    async def open(self, p: ShellOpenParams) -> ShellInfo:
        if self.open_count + self._opening >= self.limits.max_open:
            raise ServerBusyError(
                f"{self.open_count + self._opening} shell sessions are open, the limit of this agent",
                data={"limit": self.limits.max_open},
            )
        argv = list(self.limits.argv) if self.limits.argv else default_shell()
        session = self._session(f"{self.jobs.prefix}-sh{self.jobs.next_seq()}", argv)
        self._opening += 1  # the slot is taken before the await: concurrent opens cannot overshoot
        try:
            mark = f"{self.jobs.prefix}-{session.session_id}"  # the next agent ends it if it cannot adopt it
            await session.start(p.cwd, p.env, mark)  # SpawnError propagates; the session was never registered
        finally:
            self._opening -= 1
        self._sessions[session.session_id] = session
        keeper = self.home.keeper
        if keeper is not None and keeper.present:
            # The keeper's ledger, not the record (the shell's user can rewrite it), names the
            # process the next agent may re-adopt (and signal) as this session's shell.
            answer, _ = await keeper.request({"op": "lead", "key": session.session_id, "pid": session.pid})
            if answer.get("ok") is False:
                log.warning("the keeper did not record shell %s: %s", session.session_id, answer.get("error"))
        return session.info()

    async def run(self, p: ShellRunParams) -> StartResult:
        session = self._get_open(p.session_id)
        if p.idempotency_key is not None and p.idempotency_key in session.keys:
            return StartResult(job_id=session.keys[p.idempotency_key], pid=session.pid)
        if session.run is not None:
            raise ShellBusyError(
                f"shell {p.session_id} is busy with run {session.run.job_id}; a shell runs one command at a "
                "time (wait for it, interrupt it, or open another shell)",
                session_id=p.session_id,
                data={"run_id": session.run.job_id},
            )
        label = f"shell {p.session_id}"
        params = StartParams(
            command=p.command,
            label=label,
            timeout=p.timeout,
            kill_grace=p.kill_grace,
            tags=p.tags,
            output_cap=p.output_cap,
        )

        home = self.jobs.home

        def make(job_id: str, buffer_limit: int, on_done: Callable[[Job], None]) -> ShellRun:
            # Its output in a job dir of its own (see runlog.py), the jobs' spare if ready.
            log = RunLog(home, job_id, params.output_cap)
            try:
                log.open(self.jobs.take_spare(home.root / job_id))
            except OSError as exc:
                raise no_space(exc, f"the output files of run {job_id}") from None
            return ShellRun(job_id, params, buffer_limit, on_done, session, log)

        run = self.jobs.adopt(make, owner=p.session_id)
        run.save()
        session.runs.append(run.job_id)
        while len(session.runs) > self.limits.retain_runs + 1:  # the new run is not finished yet
            with contextlib.suppress(JobNotFoundError):
                await self.jobs.release(JobIdParams(job_id=session.runs.popleft()))
        if p.idempotency_key is not None:
            session.keys[p.idempotency_key] = run.job_id
            while len(session.keys) > MAX_KEYS:
                session.keys.popitem(last=False)
        await session.begin(run, p.input.encode() if p.input is not None else None, p.stdin_open)
        return StartResult(job_id=run.job_id, pid=session.pid)

    async def list(self, p: ShellListParams) -> ShellListResult:
        if p.session_id is not None:
            return ShellListResult(shells=[self._get(p.session_id).info()])
        return ShellListResult(shells=[s.info() for s in self._sessions.values()])

    async def close(self, p: ShellIdParams) -> ShellInfo:
        session = self._get(p.session_id)
        await session.close("closed on request")
        return session.info()

    async def interrupt(self, p: ShellIdParams) -> Empty:
        self._get_open(p.session_id).interrupt()
        return Empty()

    def expire_idle(self) -> int:
        """Close every session idle (no run) for ``ttl`` seconds by the clock; return how many.

        Each session's timer does this in production; a test advances its fake clock and calls
        this instead of waiting out the TTL. The shells are killed in the background
        (``wait_closed()`` on a session waits for it).
        """
        return sum(session.expire_idle() for session in list(self._sessions.values()))

    async def aclose(self, handover: bool = False) -> None:
        """Kill every shell (the agent is shutting down; sessions die with it), or with
        ``handover`` leave them all running for the next agent."""
        for session in list(self._sessions.values()):
            if handover and session.open and self.home.durable:
                session.detach()
            else:
                await session.aclose()

    def _session(self, session_id: str, argv: builtins.list[str]) -> ShellSession:
        return ShellSession(session_id, argv, self.limits.ttl, self._closed, clock=self._clock, home=self.home)

    @property
    def adopted_marks(self) -> set[str]:
        """The process markers of the sessions this agent serves (not to be ended as dead)."""
        return {s.mark for s in self._sessions.values() if s.open and s.mark is not None}

    async def restore(self) -> int:
        """Re-adopt the shells an earlier agent of this state dir left; return how many.

        A session dir the keeper holds no stdin or key for, whose record cannot be read, or
        whose shell is not the recorded process (pid reused) is removed, and its processes are
        ended (``JobController.end_dead_shells`` finds them by their marker).
        """
        root, keeper = self.home.root, self.home.keeper
        if root is None or keeper is None or not keeper.present:
            self.jobs.remove_unlisted_runs()  # no session outlived its agent: neither did a run in progress
            return 0
        try:
            # ``shells`` is a job's to replace: as a symlink to an outside dir, every file there
            # was "a session it cannot describe", and was removed.
            root_fd = claim_state_dir(root)
        except OSError as exc:
            log.warning("no shells dir %s (%s): no session re-adopted", root, exc)
            return 0
        try:
            return await self._restore_from(root, root_fd, keeper)
        finally:
            os.close(root_fd)

    async def _restore_from(self, root: Path, root_fd: int, keeper: KeeperLink) -> int:
        restored = 0
        answer, _ = await keeper.request({"op": "leads"})
        leads = answer.get("leads")  # None: a keeper too old to keep a ledger (the record is all)
        for sid in os.listdir(root_fd):
            entry = root / sid
            fds: builtins.list[int] = []  # (`list` is a method here)
            try:
                record = read_record(entry)
                if record.get("session_id") != sid or not sid.startswith(self.jobs.prefix + "-sh"):
                    raise ValueError("not a session of this state dir")
                if isinstance(leads, dict) and leads.get(sid) != [record.get("pid"), record.get("starttime")]:
                    raise ValueError(f"pid {record.get('pid')} is not a process the keeper started for it")
                _, fds = await keeper.request({"op": "fd", "key": sid})
                _, key_fds = await keeper.request({"op": "fd", "key": f"{sid}.key"})
                fds += key_fds
                if len(fds) != 2:
                    raise ValueError("the keeper holds no stdin or key for it")
                key = read_key(fds[1])
                session = self._session(sid, [str(a) for a in record["argv"]])
                self._sessions[sid] = session
                stdin, fds = fds[0], fds[1:]
                # Its ended runs, which the job re-adoption found: retained as this session's again.
                session.runs.extend(self.jobs.shell_runs(sid))
                await session.resume(record, entry, key, stdin, self._run_maker(session))
                restored += 1
            # The record is a file the shell's user may write: anything in it may be hostile,
            # and a session it cannot describe is ended (IndexError, OverflowError: a short
            # list, a number no file offset can be).
            except (OSError, ValueError, KeyError, TypeError, IndexError, OverflowError, RemoteExecError) as exc:
                log.warning("skipped %s (shell %s): %s; ending it by its marker", entry, sid, exc)
                half = self._sessions.pop(sid, None)
                if half is not None:  # stopped part-way: let go of what it opened, end its run
                    half.detach()
                    if half.run is not None:
                        half.run.finish(None)
                owner, _, seq = sid.rpartition("-sh")
                if owner == self.jobs.prefix and seq.isdigit():  # a name of ours: its marker is no job's
                    await scan(kill_tree, f"{self.jobs.prefix}-{sid}")
                    await keeper.request({"op": "drop", "key": sid})
                    await keeper.request({"op": "drop", "key": f"{sid}.key"})
                if same_dir(root_fd, root):  # the removal goes by path: not if swapped meanwhile
                    self.home.discard(entry)
                else:
                    log.warning("skipped %s: no longer the shells dir checked; nothing removed", root)
            finally:
                for fd in fds:
                    os.close(fd)
        self.jobs.remove_unlisted_runs()
        return restored

    def _run_maker(self, session: ShellSession) -> Callable[[dict[str, Any]], ShellRun]:
        def make_run(rec: dict[str, Any]) -> ShellRun:
            params = StartParams.model_validate(rec["params"])
            started_at, started_boot = float(rec["started_at"]), float(rec["started_boot"])

            def make(job_id: str, buffer_limit: int, on_done: Callable[[Job], None]) -> ShellRun:
                log = RunLog(self.jobs.home, job_id, params.output_cap)
                try:  # its log as the earlier agent left it (what it holds is not written again)
                    log.open(create=False)
                except OSError:  # its dir is gone (the run ended and was forgotten): a new one
                    log.open()
                run = ShellRun(job_id, params, buffer_limit, on_done, session, log)
                run.started_at, run.started_boot = started_at, started_boot
                return run

            job_id = str(rec["job_id"])
            # The record is a file the shell's user may write: it may name only a run of its own
            # session (not take another job's id, its registry entry or its stdin from the keeper).
            if not job_id.startswith(session.session_id + "-") or not job_id.rpartition("-")[2].isdigit():
                raise ValueError(f"{job_id!r} is not a run of shell {session.session_id}")
            self.jobs.unlist(job_id)  # (found ended on disk: the record knows it as in progress)
            run = self.jobs.adopt(make, owner=session.session_id, job_id=job_id)
            session.runs.append(run.job_id)
            return run

        return make_run
