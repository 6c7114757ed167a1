"""A job whose output goes to files in its own job dir, and which a later agent can re-adopt.

Layout of ``<state>/jobs/<job_id>/`` (dir 0700, files 0600, owned by the agent's user)::

    job.json     what was started and how (argv, label, cwd, encoding, timeout, pid and its
                 ``/proc`` start time; env *names* only, never values), then its end
    stdout       the job's fd 1, O_APPEND, read at byte offsets (see :mod:`.logfile`)
    stderr       the job's fd 2
    stdin_bytes  the stdin cursor (bytes taken so far), so writers resume exactly after a restart

The agent that spawned a job learns its end from asyncio (it is the parent). A re-adopted job
is the keeper's child (the agent died, the keeper is the subreaper): its end is a ``pidfd``
turning readable, and its exit status comes from the keeper, which reaped it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from ...errors import JobNotRunningError, NoSpaceError, SpawnError
from ...protocol import JobInfo, JobPolicy, KillResult, StartParams
from ..budget import MemoryBudget
from ..buffer import StreamBuffer
from ..keeperlink import KeeperLink
from ..procfacts import proc_starttime
from .job import Job, _killpg
from .logbudget import LogBudget
from .logfile import Inotify, LogFile
from .proctable import scan
from .proctree import MARKER, end_tree, job_processes
from .spare import SpareDir

__all__ = ["DiskJob", "JobHome", "popen_session"]


@dataclass
class JobHome:
    """What every disk job of one agent shares: where job dirs live, the inotify fd, the keeper.

    :ivar cap: the default disk cap per stream (a start may set its own).
    :ivar logs: the agent-wide budget of all streams' bytes on disk (see :mod:`.logbudget`).
    """

    root: Path
    keeper: KeeperLink
    inotify: Inotify | None
    cap: int
    logs: LogBudget | None = None


class _StdinProtocol(asyncio.BaseProtocol):
    """For a job's stdin pipe (ours at spawn, or the fd the keeper held for a re-adopted job)."""

    def __init__(self, job: DiskJob) -> None:
        self._job = job

    def connection_lost(self, exc: Exception | None) -> None:
        self._job.stdin.room()

    def resume_writing(self) -> None:
        self._job.stdin.room()


class DiskJob(Job):
    """A process job with its output on disk; ``leftovers`` are its processes after its leader exited."""

    def __init__(
        self, job_id: str, params: StartParams, buffer_limit: int, on_done: Callable[[Job], None], home: JobHome
    ) -> None:
        super().__init__(job_id, params, buffer_limit, on_done)
        self.home = home
        self.dir = home.root / job_id
        cap = params.output_cap or home.cap
        # LogFile serves StreamBuffer's read interface (read, end, eof, mark_read, wants_pause).
        files = {1: LogFile(os.fspath(self.dir / "stdout"), cap), 2: LogFile(os.fspath(self.dir / "stderr"), cap)}
        self.files = list(files.values())
        for stream in self.files:
            stream.charge_to(home.logs)
        self.streams = cast("dict[int, StreamBuffer]", files)
        self.starttime: int | None = None
        self.leftovers: list[int] = []
        self.tree_ended = False  # its leftovers were ended at its timeout (kept in job.json)
        self._tree_task: asyncio.Task[None] | None = None
        self._wd = -1
        self._waiters = 0
        self._pidfd: int | None = None
        self._collector: asyncio.Task[None] | None = None

    def charge_to(self, budget: MemoryBudget) -> None:
        self.stdin.budget = budget  # output is on disk: only the stdin queue holds memory

    def remove_logs(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- metadata --------------------------------------------------------------------------

    def _meta(self) -> dict[str, Any]:
        p = self.params
        meta: dict[str, Any] = {
            "v": 1,
            "job_id": self.job_id,
            "command": p.command,
            "label": p.label,
            "cwd": p.cwd,
            "user": p.user,
            "env_names": sorted(p.env or {}),  # values may be secrets: never on disk
            "encoding": p.encoding,
            "timeout": p.timeout,
            "kill_grace": p.kill_grace,
            "stdin_open": p.stdin_open,
            "output_cap": p.output_cap,
            "idempotency_key": p.idempotency_key,
            "tags": p.tags,  # the starter's notes (notebook, kernel, name): what finds it after a restart
            "policy": None if p.policy is None else p.policy.model_dump(mode="json"),
            "reason": self.reason,
            "started_at": self.started_at,
            "pid": self.pid,
            "starttime": self.starttime,
        }
        if self._done.is_set():
            meta["end"] = {"state": self._state, "exit_code": self.exit_code, "ended_at": self.ended_at}
        if self.tree_ended:
            meta["tree_ended"] = True
        return meta

    def save(self) -> None:
        """Write ``job.json`` atomically (a crash leaves the old or the new one, never half)."""
        tmp = self.dir / "job.json.tmp"
        with contextlib.suppress(OSError):  # a full disk: the job runs on, its record is older
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(self._meta(), f)
            os.replace(tmp, self.dir / "job.json")

    def _save_first(self, fd: int) -> None:
        """The first record, written into the spare's empty ``job.json`` (no file to create, no
        rename). A crash mid-write leaves a torn record, which the next agent treats as none,
        as it treats a crash before the record: the start never answered, so it ends the job's
        processes and removes the dir."""
        try:
            view = memoryview(json.dumps(self._meta()).encode())
            while view:
                view = view[os.write(fd, view) :]
        except OSError:
            pass  # a full disk: as in save(), the job runs on
        finally:
            os.close(fd)

    def _save_stdin_cursor(self) -> None:
        with contextlib.suppress(OSError):
            fd = os.open(self.dir / "stdin_bytes", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            try:
                os.pwrite(fd, b"%20d\n" % self.stdin.written, 0)
            finally:
                os.close(fd)

    # -- start -----------------------------------------------------------------------------

    async def spawn(self, spare: SpareDir | None = None) -> None:
        """Start the process with its fds 1 and 2 on the job's files (``spare``'s, if it has one).

        :raises SpawnError: it cannot be started. :raises NoSpaceError: the disk is full.
        """
        files = spare.take(self.dir) if spare is not None else None
        meta_fd = -1
        if files is not None:
            out, err, meta_fd = files
        else:
            try:
                os.mkdir(self.dir, 0o700)
                out = os.open(self.dir / "stdout", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
                err = os.open(self.dir / "stderr", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                raise _spawn_error(exc, self.job_id, "its job dir") from None
        try:
            await self._exec(out, err)
        except BaseException:
            if meta_fd >= 0:
                os.close(meta_fd)
            raise
        finally:
            os.close(out)
            os.close(err)
        self.starttime = proc_starttime(self.pid)
        if self.stdin.open and self.stdin.pipe is not None and self.home.keeper.present:
            # The keeper keeps a copy of the write end: our death must not give the job EOF.
            pipe = self.stdin.pipe.get_extra_info("pipe")
            if pipe is not None:
                dup = os.dup(pipe.fileno())
                try:
                    await self.home.keeper.request({"op": "hold", "key": self.job_id}, fd=dup)
                finally:
                    os.close(dup)
        if meta_fd >= 0:
            self._save_first(meta_fd)
        else:
            self.save()

    async def _exec(self, out: int, err: int) -> None:
        p = self.params
        argv = ["/bin/sh", "-c", p.command] if isinstance(p.command, str) else list(p.command)
        env, kwargs = self._environment()
        env[MARKER] = self.job_id  # how the job's processes are found wherever they go
        wants_stdin = p.stdin_open or p.input is not None
        stdin_input = self._decode_input(p.input) if p.input is not None else None
        self.stdin.reserve_input(len(stdin_input or b""))
        stdin_r, stdin_w = os.pipe2(os.O_CLOEXEC) if wants_stdin else (subprocess.DEVNULL, -1)
        try:
            # Not asyncio's subprocess: its child watcher reaps the job the moment it exits, and
            # an agent killed before it wrote that exit down lost it for good (nobody else can
            # wait() a reaped process). Here the agent watches a pidfd, writes the end into
            # job.json, and only then reaps (:meth:`_check_exit`); dying in between leaves a
            # zombie the keeper (the subreaper) reaps and records instead.
            proc = popen_session(argv, stdin_r, out, err, p.cwd, env, **kwargs)
        except (OSError, ValueError) as exc:
            self.stdin.release()
            if stdin_w >= 0:
                os.close(stdin_w)
            raise _spawn_error(exc, self.job_id, repr(argv[0])) from None
        except subprocess.SubprocessError as exc:
            self.stdin.release()
            if stdin_w >= 0:
                os.close(stdin_w)
            raise SpawnError(f"cannot start {argv[0]!r}: {exc}", job_id=self.job_id) from None
        finally:
            if stdin_r >= 0:
                os.close(stdin_r)
        proc.returncode = 0  # Popen must never reap it (its __del__ would): _check_exit does
        self.pid = proc.pid
        if stdin_w >= 0:
            await self._attach_stdin(stdin_w)
        else:
            self.stdin.attach(None, False)
        if stdin_input is not None:
            self.stdin.write(stdin_input, offset=None, eof=not p.stdin_open, reserved=True)
        self._watch_exit()
        self._arm_timeout()

    async def _attach_stdin(self, fd: int) -> None:
        os.set_blocking(fd, False)
        loop = asyncio.get_running_loop()
        transport, _ = await loop.connect_write_pipe(lambda: _StdinProtocol(self), os.fdopen(fd, "wb", 0))
        self.stdin.attach(transport, True)

    def _arm_timeout(self) -> None:
        p = self.params
        if p.timeout is not None and self.running:
            left = max(0.0, self.started_at + p.timeout - time.time())
            self._timers.append(asyncio.get_running_loop().call_later(left, self._begin_end, "timed_out", p.kill_grace))

    # -- re-adoption -----------------------------------------------------------------------

    @classmethod
    async def restore(
        cls,
        meta: dict[str, Any],
        buffer_limit: int,
        on_done: Callable[[Job], None],
        home: JobHome,
        exits: dict[str, Any],
    ) -> DiskJob:
        """The job ``meta`` (its ``job.json``) describes, as this agent finds it now.

        Alive (same pid *and* start time): running again, its stdin re-opened from the keeper's
        copy. Gone: ended, with the exit status the keeper recorded (``exit_code`` None if
        nobody could reap it, e.g. the agent reaped it and died before writing it down).
        """
        params = StartParams(
            command=meta["command"],
            cwd=meta.get("cwd"),
            user=meta.get("user"),
            stdin_open=bool(meta.get("stdin_open")),
            timeout=meta.get("timeout"),
            kill_grace=meta.get("kill_grace", 5.0),
            encoding=meta.get("encoding", "utf-8"),
            label=meta.get("label"),
            idempotency_key=meta.get("idempotency_key"),
            output_cap=meta.get("output_cap"),
            tags=meta.get("tags"),
            tty=bool(meta.get("tty", False)),
            tty_size=meta.get("tty_size"),
            policy=_policy(meta.get("policy")),
        )
        job = cls(meta["job_id"], params, buffer_limit, on_done, home)
        job.reason = meta.get("reason") if isinstance(meta.get("reason"), str) else None
        job.pid, job.starttime, job.started_at = int(meta.get("pid") or 0), meta.get("starttime"), meta["started_at"]
        job._restored(meta)
        with contextlib.suppress(OSError, ValueError):
            job.stdin.written = int((job.dir / "stdin_bytes").read_bytes())
        job.tree_ended = bool(meta.get("tree_ended"))
        end = meta.get("end")
        if end is not None:
            job._finish(end["state"], end.get("exit_code"), end.get("ended_at"), save=False)
        elif job.pid and job.starttime is not None and proc_starttime(job.pid) == job.starttime:
            await job._reattach()
        else:
            how = exits.get(f"{job.pid}:{job.starttime}")
            job._finish("completed", None if how is None else how["code"], None if how is None else how["at"])
        return job

    def _restored(self, meta: dict[str, Any]) -> None:
        """Take what a subclass keeps in ``job.json`` beyond the start params (nothing here)."""

    async def _reattach(self) -> None:
        if self.params.stdin_open:
            _, fds = await self.home.keeper.request({"op": "fd", "key": self.job_id})
            if fds:
                await self._attach_stdin(fds[0])
                for extra in fds[1:]:
                    os.close(extra)
        self._watch_exit()
        self._arm_timeout()

    def _watch_exit(self) -> None:
        """Learn of the leader's exit: its pidfd turns readable (a poll of ``/proc`` without one)."""
        loop = asyncio.get_running_loop()
        try:
            self._pidfd = os.pidfd_open(self.pid)
        except OSError:
            self._pidfd = None
        if self._pidfd is not None:
            loop.add_reader(self._pidfd, self._check_exit)
        else:  # no pidfd (a kernel before 5.3): ask the process table now and then
            self._timers.append(loop.call_later(1.0, self._check_exit))

    def _check_exit(self) -> None:
        """The leader may have exited: record its end durably, *then* reap it.

        Our own child is read with ``WNOWAIT`` (still a zombie), its end saved to job.json,
        then reaped: an agent killed at any point leaves either the record or the zombie (which
        the keeper reaps and records). A re-adopted job is the keeper's child: the keeper
        reaped it and tells us its exit.
        """
        loop = asyncio.get_running_loop()
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            info = None  # not our child (re-adopted): ask the keeper once it is gone
            if proc_starttime(self.pid) == self.starttime:
                if self._pidfd is None:
                    self._timers.append(loop.call_later(1.0, self._check_exit))
                return  # (a pidfd is readable only once the process exited: not reached)
            self._stop_watching()
            self._collector = loop.create_task(self._collect_exit())
            return
        if info is None or info.si_pid == 0:
            if self._pidfd is None:
                self._timers.append(loop.call_later(1.0, self._check_exit))
            return  # still running
        killed = info.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
        self._stop_watching()
        self._leader_exited(-info.si_status if killed else info.si_status)  # saves job.json
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)  # a zombie: returns at once

    def _stop_watching(self) -> None:
        if self._pidfd is not None:
            asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None

    async def _collect_exit(self) -> None:
        answer, _ = await self.home.keeper.request({"op": "exit", "pid": self.pid, "start": self.starttime})
        how = answer.get("exit")
        self._leader_exited(None if how is None else int(how["code"]))

    # -- the end ---------------------------------------------------------------------------

    def _leader_exited(self, code: int | None) -> None:
        if self._done.is_set():
            return
        self._exited = True
        self._exit_event.set()
        self._finish(self._ending or "completed", code, time.time())

    def _finish(self, state: str, code: int | None, ended_at: float | None, save: bool = True) -> None:
        self._state = state  # type: ignore[assignment]
        self.exit_code = code
        self.ended_at = ended_at if ended_at is not None else time.time()
        self._exited = True
        self._exit_event.set()
        for stream in self.files:
            stream.eof = True
        self._last_scan()  # before the cap may punch out what the rules have not seen
        for stream in self.files:
            stream.enforce_cap()
        for t in self._timers:
            t.cancel()
        self._timers.clear()
        self._arm_leftovers_timeout()
        self._stop_watching()
        if self.stdin.pipe is not None and not self.stdin.pipe.is_closing():
            self.stdin.pipe.close()
        self.stdin.open = False
        self.stdin.room()
        if self.home.keeper.present:
            asyncio.get_running_loop().create_task(self.home.keeper.request({"op": "drop", "key": self.job_id}))
        self._done.set()
        if save:
            self.save()
        self._notify()
        self._on_done(self)

    def _arm_leftovers_timeout(self) -> None:
        """A job that completed before its ``timeout`` may have left processes behind
        (``sleep 300 &``): they are part of the job, so its timeout ends them too, with the
        same SIGTERM and ``kill_grace`` as a running job's tree. A killed or timed-out job's tree
        was ended already; a restored job whose timeout passed while no agent ran is ended now."""
        p = self.params
        if p.timeout is None or self._state != "completed" or self.tree_ended:
            return
        left = max(0.0, self.started_at + p.timeout - time.time())
        self._timers.append(asyncio.get_running_loop().call_later(left, self._timeout_leftovers))

    def _timeout_leftovers(self) -> None:
        if self._tree_task is None:
            self._tree_task = asyncio.get_running_loop().create_task(self._end_leftovers(self.params.kill_grace))

    async def _end_leftovers(self, grace: float) -> None:
        """End what the job left running: SIGTERM, ``grace`` seconds, SIGKILL for the rest."""
        await end_tree(self.job_id, 0, grace)
        self.leftovers = []
        if not self.tree_ended:
            self.tree_ended = True
            self.save()  # the next agent does not scan for them again

    # -- watching ------------------------------------------------------------------------

    def _wait_begin(self) -> bool:
        self._waiters += 1
        if self._waiters == 1 and self.home.inotify is not None:
            self._wd = self.home.inotify.watch(os.fspath(self.dir), self._notify)
        # No inotify (no instance to be had), or no watch (the user's inotify watches are used
        # up): the job writes its files behind our back, so only a look at them tells.
        return self._wd >= 0

    def _wait_end(self) -> None:
        self._waiters -= 1
        if self._waiters == 0 and self._wd >= 0 and self.home.inotify is not None:
            self.home.inotify.unwatch(self._wd)
            self._wd = -1

    # -- operations ------------------------------------------------------------------------

    def info(self) -> JobInfo:
        return super().info().model_copy(update={"leftovers": self.leftovers[:1024]})

    def write_stdin(self, data: bytes, offset: int | None, eof: bool) -> int:
        if self.stdin.pipe is None:  # stdin is /dev/null, or the keeper had no copy of its pipe
            raise JobNotRunningError(f"stdin of job {self.job_id} is not open", job_id=self.job_id)
        taken = self.stdin.write(data, offset, eof)
        if taken or eof:
            self._save_stdin_cursor()
        if eof and not self.stdin.open and self.home.keeper.present:
            asyncio.get_running_loop().create_task(self.home.keeper.request({"op": "drop", "key": self.job_id}))
        return taken

    async def kill(self, grace: float | None) -> KillResult:
        """End the job's whole tree: SIGTERM, then SIGKILL after ``grace`` to whatever is left,
        descendants in other sessions and children forked during the grace included. On an
        ended job, ends its leftovers the same way. Returns once none of its processes is left."""
        if not self.running:
            found: set[int] = await scan(job_processes, self.job_id, 0)
            if self.leftovers or found:
                await self._end_leftovers(self.params.kill_grace if grace is None else grace)
            return KillResult(state=self._state, exit_code=self.exit_code)
        return await super().kill(grace)

    async def _terminate(self, grace: float) -> None:
        def close_stdin() -> None:
            if self.stdin.open:
                self.write_stdin(b"", None, eof=True)

        await end_tree(self.job_id, self.pid, grace, close_stdin)
        await self._done.wait()

    async def aclose(self) -> None:
        """The agent is shutting down: end the tree now (the controller sweeps leftovers)."""
        if self.running:
            _killpg(self.pid, signal.SIGKILL)
        for t in self._timers:
            t.cancel()

    def detach(self) -> None:
        """The agent hands over: stop watching, leave the process alone."""
        for t in self._timers:
            t.cancel()
        self._stop_watching()


def popen_session(
    argv: list[str], stdin: int, out: int, err: int, cwd: str | None, env: dict[str, str], **kwargs: Any
) -> subprocess.Popen[bytes]:
    """fork+exec in a session of its own (SIGINT and kills reach its group only), fds closed;
    synchronous like asyncio's own ``subprocess_exec`` (it waits for the exec). Jobs and shells."""
    return subprocess.Popen(
        argv,
        stdin=stdin,
        stdout=out,
        stderr=err,
        cwd=cwd,
        env=env,
        start_new_session=True,
        close_fds=True,
        **kwargs,
    )


def _policy(raw: object) -> JobPolicy | None:
    """The policy a job.json recorded (``None`` if absent, or not one this agent reads)."""
    try:
        return None if raw is None else JobPolicy.model_validate(raw)
    except ValueError:
        return None


def _spawn_error(exc: OSError | ValueError, job_id: str, what: str) -> Exception:
    import errno

    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        name = errno.errorcode[exc.errno]
        return NoSpaceError(
            f"cannot start {what}: the sandbox's disk is full ({name})", data={"errno": name, "job_id": job_id}
        )
    return SpawnError(f"cannot start {what}: {exc}", job_id=job_id)
