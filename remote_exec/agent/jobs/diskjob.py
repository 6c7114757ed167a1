"""A job whose output goes to files in its own job dir, and which a later agent can re-adopt.

Layout of ``<state>/jobs/<job_id>/`` (dir 0700, files 0600, owned by the agent's user)::

    job.json     what was started and how (argv, label, cwd, encoding, timeout, pid and its
                 ``/proc`` start time; env *names* only, never values), its watch hits (see
                 :mod:`.hitrecord`), then its end
    stdout       the job's fd 1, O_APPEND, read at byte offsets (see :mod:`.logfile`)
    stderr       the job's fd 2
    stdin_bytes  the stdin cursor (bytes taken so far), so writers resume exactly after a restart

How the record is written and read back is :mod:`.jobrecord`'s; how the leader's exit is
learnt (as its parent, or from the keeper for a re-adopted job) is :mod:`.exitwatch`'s.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from ...errors import JobNotRunningError, SpawnError
from ...protocol import JobInfo, KillResult, StartParams, WatchHit
from ..procfacts import proc_starttime
from .cgroup import JobCgroup
from .exitwatch import LeaderWatch
from .hitrecord import dump_hits, should_save
from .home import JobHome
from .job import Job, _killpg
from .jobrecord import (
    start_record,
    write_first_record,
    write_record,
    write_stdin_cursor,
    write_stdin_writers,
)
from .logfile import LogFile
from .proctable import scan
from .proctree import MARKER, Tree, end_tree, tree_members
from .spare import SpareDir
from .spawn import joined, popen_session, spawn_error
from .stdin import StdinPipeProtocol

__all__ = ["LOST_REASON", "DiskJob"]

log = logging.getLogger("remote_exec.agent")


LOST_REASON = "its exit status was lost: the job ended while neither the agent nor its keeper ran"


class DiskJob(Job):
    """A process job with its output on disk, which a later agent can re-adopt."""

    owns_processes = True

    def __init__(
        self,
        job_id: str,
        params: StartParams,
        buffer_limit: int,
        on_done: Callable[[Job], None],
        home: JobHome,
        mark: str | None = None,
    ) -> None:
        self.home = home
        self.dir = home.root / (mark or job_id)
        cap = params.output_cap or home.cap
        logs = {fd: LogFile(os.fspath(self.dir / name), cap, timed=True) for fd, name in ((1, "stdout"), (2, "stderr"))}
        for stream in logs.values():
            stream.charge_to(home.logs)
        super().__init__(job_id, params, buffer_limit, on_done, logs, mark)
        self.starttime: int | None = None
        self.cgroup: JobCgroup | None = None
        self.tree_ended = False  # its leftovers were ended at its timeout (kept in job.json)
        self._tree_task: asyncio.Task[None] | None = None
        self._wd = -1
        self._waiters = 0
        self._exits = LeaderWatch(self, home.keeper, self._leader_exited, self._timers)
        self._hits_saved_at = 0.0
        # While a kill or timeout ends the tree, the leader's exit is held here and the job's
        # end is told once the tree is gone: a client told "killed" finds none of its processes.
        self._ending_tree = False
        self._held_exit: tuple[int | None, float] | None = None

    def remove_logs(self) -> None:
        self.home.discard(self.dir)  # off the event loop: a big log's unlink takes seconds

    # -- metadata --------------------------------------------------------------------------

    def _meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "v": 1,
            "job_id": self.mark,  # the dir's name (re-adoption checks it)
            "client_id": None if self.job_id == self.mark else self.job_id,
            **start_record(self.params),
            "reason": self.reason,
            "started_at": self.started_at,
            "pid": self.pid,
            "starttime": self.starttime,
        }
        if self._done.is_set():
            meta["end"] = {"state": self._state, "exit_code": self.exit_code, "ended_at": self.ended_at}
        elif self._held_exit is not None:  # told once the tree is gone; on disk now (see _leader_exited)
            code, at = self._held_exit
            meta["end"] = {"state": self._ending or "completed", "exit_code": code, "ended_at": at}
        if self.tree_ended:
            meta["tree_ended"] = True
        meta.update(dump_hits(self))
        return meta

    def record_hit(self, hit: WatchHit) -> None:
        """Record the hit, and save it with the job (see :mod:`.hitrecord`): the next agent
        restores it, so no hit is lost or told twice across a restart."""
        super().record_hit(hit)
        if should_save(self, self._hits_saved_at):
            self._hits_saved_at = time.monotonic()
            self.save()

    def save(self) -> None:
        """Write ``job.json`` atomically (see :func:`.jobrecord.write_record`)."""
        write_record(self.dir, self._meta())

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
                raise spawn_error(exc, self.job_id, "its job dir") from None
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
        await self._tell_leader()
        if self.stdin.open and self.stdin.pipe is not None and self.home.keeper.present:
            # The keeper keeps a copy of the write end: our death must not give the job EOF.
            pipe = self.stdin.pipe.get_extra_info("pipe")
            if pipe is not None:
                dup = os.dup(pipe.fileno())
                try:
                    await self.home.keeper.request({"op": "hold", "key": self.mark}, fd=dup)
                finally:
                    os.close(dup)
        if meta_fd >= 0:
            write_first_record(meta_fd, self._meta())
        else:
            self.save()

    async def _tell_leader(self) -> None:
        """Tell the keeper which process leads this job: the next agent re-adopts (and may
        signal) only a process in the keeper's ledger, never one a rewritten job.json names."""
        if self.home.keeper.present:
            answer, _ = await self.home.keeper.request({"op": "lead", "key": self.mark, "pid": self.pid})
            if answer.get("ok") is False:
                log.warning("the keeper did not record job %s's leader: %s", self.job_id, answer.get("error"))

    async def _exec(self, out: int, err: int) -> None:
        p = self.params
        argv = ["/bin/sh", "-c", p.command] if isinstance(p.command, str) else list(p.command)
        env, kwargs = self._environment()
        env[MARKER] = self.mark  # how the job's processes are found wherever they go
        wants_stdin = p.stdin_open or p.input is not None
        stdin_input = self._decode_input(p.input) if p.input is not None else None
        self.stdin.reserve_input(len(stdin_input or b""))
        stdin_r, stdin_w = os.pipe2(os.O_CLOEXEC) if wants_stdin else (subprocess.DEVNULL, -1)
        what = repr(argv[0])  # what errors name: the job's command, not the trampoline's sh
        join_fds: list[int] = []
        try:
            # Not asyncio's subprocess: its child watcher reaps the job the moment it exits, and
            # an agent killed before it wrote that exit down lost it for good (nobody else can
            # wait() a reaped process). Here the agent watches a pidfd, writes the end into
            # job.json, and only then reaps (:mod:`.exitwatch`); dying in between leaves a
            # zombie the keeper (the subreaper) reaps and records instead.
            argv, join_fds, within = self._join_cgroup(argv, kwargs, env)
            with within:
                proc = popen_session(argv, stdin_r, out, err, p.cwd, env, **kwargs)
        except (OSError, ValueError) as exc:
            self.stdin.release()
            if stdin_w >= 0:
                os.close(stdin_w)
            raise spawn_error(exc, self.job_id, what) from None
        except subprocess.SubprocessError as exc:
            self.stdin.release()
            if stdin_w >= 0:
                os.close(stdin_w)
            raise SpawnError(f"cannot start {what}: {exc}", job_id=self.job_id) from None
        finally:
            if stdin_r >= 0:
                os.close(stdin_r)
            for fd in join_fds:
                os.close(fd)
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

    def _join_cgroup(
        self, argv: list[str], kwargs: dict[str, object], env: dict[str, str]
    ) -> tuple[list[str], list[int], AbstractContextManager[None]]:
        """The job's cgroup made if it can be; then :func:`.spawn.joined`'s argv, fds and context."""
        home = self.home.cgroups
        self.cgroup = home.make(self.mark) if home is not None else None
        return joined(self.cgroup, home, argv, kwargs, env, self.params.cwd)

    def tree(self) -> Tree:
        """The job's leader (while it runs), session, start time and cgroup (see :mod:`.proctree`)."""
        return Tree(self.mark, self.pid if self.running else 0, self.pid, self.starttime, self.cgroup)

    @property
    def needs_looking(self) -> bool:
        """Running with no cgroup: its members are known only as they are seen (see :mod:`.proctree`)."""
        return self.running and self.cgroup is None

    def _tree_gone(self) -> None:
        """The tree was seen empty: its cgroup goes (a later agent sweeps one left behind)."""
        if self.cgroup is not None and self.cgroup.remove():
            self.cgroup = None

    async def _attach_stdin(self, fd: int) -> None:
        os.set_blocking(fd, False)
        loop = asyncio.get_running_loop()
        transport, _ = await loop.connect_write_pipe(lambda: StdinPipeProtocol(self.stdin), os.fdopen(fd, "wb", 0))
        self.stdin.attach(transport, True)

    def _arm_timeout(self) -> None:
        p = self.params
        if p.timeout is not None and self.running:
            left = max(0.0, self.started_at + p.timeout - time.time())
            self._timers.append(asyncio.get_running_loop().call_later(left, self._begin_end, "timed_out", p.kill_grace))

    # -- re-adoption -----------------------------------------------------------------------

    def take_record(self, meta: dict[str, Any]) -> None:
        """Take what a subclass keeps in ``job.json`` beyond the start params (nothing here)."""

    async def reattach(self) -> None:
        """Watch the re-adopted leader again: its stdin from the keeper's copy, its timeout."""
        if self.params.stdin_open:
            _, fds = await self.home.keeper.request({"op": "fd", "key": self.mark})
            if fds:
                await self._attach_stdin(fds[0])
                for extra in fds[1:]:
                    os.close(extra)
        self._watch_exit()
        self._arm_timeout()

    def _watch_exit(self) -> None:
        """Learn of the leader's exit (see :mod:`.exitwatch`): :meth:`_leader_exited` is called."""
        self._exits.start()

    # -- the end ---------------------------------------------------------------------------

    def _leader_exited(self, code: int | None) -> None:
        if self._done.is_set():
            return
        if self._ending_tree:
            # The leader is reaped: its exit exists only here now. On disk at once, so an agent
            # that dies before the tree is gone leaves the true end to the next one.
            self._held_exit = (code, time.time())
            self.save()
            return
        self.finish(self._ending or "completed", code, time.time())

    def finish(self, state: str, code: int | None, ended_at: float | None, save: bool = True) -> None:
        """Record the job's end (``save``: in ``job.json`` too) and tell whoever waits for it."""
        if state == "completed" and code is None:
            # Nobody reaped it and lived to write the code down (agent and keeper both gone when
            # it ended, or a record this agent cannot trust): say so, never "completed" unknown.
            state = "lost"
            self.reason = self.reason or LOST_REASON
        self._state = state  # type: ignore[assignment]
        self.exit_code = code
        self.ended_at = ended_at if ended_at is not None else time.time()
        for stream in self.files:
            stream.eof = True
        self._last_scan()  # before the cap may punch out what the rules have not seen
        for stream in self.files:
            stream.enforce_cap()
        for t in self._timers:
            t.cancel()
        self._timers.clear()
        self._arm_leftovers_timeout()
        self._exits.stop()
        if self.stdin.pipe is not None and not self.stdin.pipe.is_closing():
            self.stdin.pipe.close()
        self.stdin.open = False
        self.stdin.room()
        if self.home.keeper.present:
            asyncio.get_running_loop().create_task(self.home.keeper.request({"op": "drop", "key": self.mark}))
        self._done.set()
        self._tree_gone()  # kept while leftovers run (their timeout or the agent's end removes it)
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
        await end_tree(self.tree(), grace)
        self._tree_gone()
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

    def write_stdin(self, data: bytes, offset: int | None, eof: bool, writer: str | None = None) -> int:
        if self.stdin.pipe is None:  # stdin is /dev/null, or the keeper had no copy of its pipe
            raise JobNotRunningError(f"stdin of job {self.job_id} is not open", job_id=self.job_id)
        taken = self.stdin.write(data, offset, eof, writer=writer)
        # Written once the bytes are in: an agent killed in between (microseconds) leaves a
        # cursor short of them, and a retry writes them again. At least once, never lost.
        if taken or eof:
            write_stdin_cursor(self.dir, self.stdin.written)
        if taken and writer is not None:  # the next agent skips this typist's retried keys too
            write_stdin_writers(self.dir, self.stdin.writers)
        if eof and not self.stdin.open and self.home.keeper.present:
            asyncio.get_running_loop().create_task(self.home.keeper.request({"op": "drop", "key": self.mark}))
        return taken

    async def kill(self, grace: float | None) -> KillResult:
        """End the job's whole tree: SIGTERM, then SIGKILL after ``grace`` to whatever is left,
        descendants in other sessions and children forked during the grace included. On an
        ended job, ends its leftovers the same way. Returns once none of its processes is left."""
        if not self.running:
            found: set[int] = await scan(tree_members, self.tree())
            if self.leftovers or found:
                await self._end_leftovers(self.params.kill_grace if grace is None else grace)
            return KillResult(state=self._state, exit_code=self.exit_code)
        return await super().kill(grace)

    async def _terminate(self, grace: float) -> None:
        def close_stdin() -> None:
            if self.stdin.open:
                self.write_stdin(b"", None, eof=True)

        self._ending_tree = True
        try:
            await end_tree(self.tree(), grace, close_stdin)
            self._tree_gone()
        finally:  # cancelled too (the agent stops): the held end is told, not lost
            self._ending_tree = False
            if self._held_exit is not None and not self._done.is_set():
                code, at = self._held_exit
                self.finish(self._ending or "completed", code, at)
        await self._done.wait()

    async def aclose(self) -> None:
        """The agent is shutting down: end the tree now (the controller sweeps leftovers)."""
        if self.running:
            _killpg(self.pid, signal.SIGKILL)
        if self.cgroup is not None:
            await self.cgroup.kill_async()  # members that left the group and cleared their marker too
        for t in self._timers:
            t.cancel()

    def detach(self) -> None:
        """The agent hands over: stop watching, leave the process alone."""
        super().detach()
        self._exits.stop()
