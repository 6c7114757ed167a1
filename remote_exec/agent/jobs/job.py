"""One job: a subprocess in its own process group with two cursor-addressed output buffers.

The subprocess is driven by an :class:`asyncio.SubprocessProtocol`, so output lands in the
buffers straight from the event loop's pipe reads (no per-chunk task hops), and a watched
stream is flow-controlled by pausing the pipe instead of dropping bytes. Readers are served by
the base class, :class:`~.output.JobOutput`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import fcntl
import functools
import os
import pwd
import signal
import subprocess
import time
from collections.abc import Callable

from ...errors import InvalidParamsError, JobNotRunningError, NoSpaceError, SpawnError
from ...protocol import (
    MAX_HITS_KEPT,
    MAX_RULES,
    JobInfo,
    JobState,
    KillResult,
    StartParams,
)
from ..budget import MemoryBudget
from .environment import job_environment
from .output import WATCH_TTL, JobOutput
from .proctable import group_alive, scan
from .proctree import Tree
from .stdin import StdinQueue

__all__ = ["Job"]

F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Linux; a no-op failure elsewhere
PIPE_SIZE = 1 << 20  # the default /proc/sys/fs/pipe-max-size, allowed without privileges
LINGER = 0.5  # after the leader exits, wait this long with no output for inherited pipes to close


class _JobProtocol(asyncio.SubprocessProtocol):
    def __init__(self, job: Job) -> None:
        self._job = job

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Before subprocess_exec() returns: a quick process may exit before spawn() resumes.
        self._job._transport = transport  # type: ignore[assignment]

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self._job._on_data(fd, data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self._job._on_pipe_closed(fd)

    def process_exited(self) -> None:
        self._job._on_exit()

    def resume_writing(self) -> None:  # stdin's queue drained (its high-water mark is 0)
        self._job.stdin.room()


class Job(JobOutput):
    """A running or finished subprocess (its output served to readers by :class:`JobOutput`)."""

    def __init__(
        self,
        job_id: str,
        params: StartParams,
        buffer_limit: int,
        on_done: Callable[[Job], None],
        mark: str | None = None,
    ) -> None:
        super().__init__(job_id, params, buffer_limit)
        # The agent's own name for the job, ``<state dir id>-<n>``: its dir, the marker its
        # processes carry, the keeper's key and its place in listings. The same as ``job_id``
        # unless the client chose the id (then ``job_id`` is the client's, on the wire only).
        self.mark = mark or job_id
        self.pid = 0
        self.started_at = time.time()
        self.ended_at: float | None = None
        self._ending: JobState | None = None  # "killed"/"timed_out" once we started ending it
        self._on_done = on_done
        self._exited = False
        self._exit_event = asyncio.Event()
        self._data_since_linger = False
        self._output_at: float | None = None  # when the job last wrote (wall clock, as JobInfo says)
        self.stdin = StdinQueue(job_id, buffer_limit)
        self._timers: list[asyncio.TimerHandle] = []
        self._terminating: asyncio.Task[None] | None = None
        # The watch rules' last scan (policy.py sets it): run as the job ends, before its end
        # is reported, so the final poll, ``ExecResult`` and ``JobInfo`` carry every hit.
        self.before_end: Callable[[], None] | None = None

    def remove_logs(self) -> None:
        """It is forgotten: delete its logs from disk (it has none here)."""

    def charge_to(self, budget: MemoryBudget) -> None:
        """Charge this job's output buffers and stdin queue to the agent's memory budget
        (the controller calls it before the job starts)."""
        self.stdin.budget = budget
        for buf in self.streams.values():
            buf.budget = budget

    # -- lifecycle -------------------------------------------------------------------------

    async def spawn(self) -> None:
        """Start the process; raises :class:`SpawnError` if it cannot be started."""
        p = self.params
        argv = ["/bin/sh", "-c", p.command] if isinstance(p.command, str) else list(p.command)
        env, kwargs = self._environment()
        wants_stdin = p.stdin_open or p.input is not None
        loop = asyncio.get_running_loop()
        stdin_input = self._decode_input(p.input) if p.input is not None else None
        self.stdin.reserve_input(len(stdin_input or b""))  # ServerBusyError before anything runs
        try:
            await loop.subprocess_exec(
                lambda: _JobProtocol(self),
                *argv,
                stdin=asyncio.subprocess.PIPE if wants_stdin else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=p.cwd,
                env=env,
                start_new_session=True,  # own session and process group: kill reaches the whole tree
                close_fds=True,
                **kwargs,  # type: ignore[arg-type]
            )
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            self.stdin.release()
            if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
                name = errno.errorcode[exc.errno]
                raise NoSpaceError(
                    f"cannot start {argv[0]!r}: the sandbox's disk is full ({name})",
                    data={"errno": name, "job_id": self.job_id},
                ) from None
            raise SpawnError(f"cannot start {argv[0]!r}: {exc}", job_id=self.job_id) from None
        assert self._transport is not None
        self.pid = self._transport.get_pid()
        for fd in (1, 2):
            pipe = self._transport.get_pipe_transport(fd)
            if pipe is not None:
                widen_pipe(pipe.get_extra_info("pipe"))
        self.stdin.attach(self._transport.get_pipe_transport(0), wants_stdin)  # type: ignore[arg-type]
        if stdin_input is not None:
            self.stdin.write(stdin_input, offset=None, eof=not p.stdin_open, reserved=True)
        if p.timeout is not None:
            self._timers.append(loop.call_later(p.timeout, self._begin_end, "timed_out", p.kill_grace))

    def _environment(self) -> tuple[dict[str, str], dict[str, object]]:
        """The job's environment and the user switch for ``subprocess``.

        :raises SpawnError: the user is unknown.
        """
        p = self.params
        env = job_environment(None)
        kwargs: dict[str, object] = {}
        if p.user is not None:
            try:
                pw = pwd.getpwnam(p.user) if not p.user.isdigit() else pwd.getpwuid(int(p.user))
            except KeyError:
                raise SpawnError(f"unknown user {p.user!r}", job_id=self.job_id) from None
            kwargs.update(user=pw.pw_uid, group=pw.pw_gid, extra_groups=os.getgrouplist(pw.pw_name, pw.pw_gid))
            env.update(HOME=pw.pw_dir, USER=pw.pw_name, LOGNAME=pw.pw_name)
        if p.env:
            env.update(p.env)
        if p.policy is not None and p.policy.nice is not None:
            kwargs["preexec_fn"] = functools.partial(_renice, p.policy.nice)
        return env, kwargs

    @property
    def state(self) -> JobState:
        return self._state

    @property
    def running(self) -> bool:
        return self._state == "running"

    async def ended(self) -> None:
        """Wait until the job has ended and its end is recorded; cancelling only stops waiting."""
        await self._done.wait()

    def info(self) -> JobInfo:
        return JobInfo(
            job_id=self.job_id,
            pid=self.pid,
            command=self.params.command,
            label=self.params.label,
            state=self._state,
            exit_code=self.exit_code,
            started_at=self.started_at,
            ended_at=self.ended_at,
            stdout_bytes=self.streams[1].end,
            stderr_bytes=self.streams[2].end,
            last_output_at=self.last_output_at(),  # after the ends: a disk job's look at its files
            stdin_open=self.stdin.open,
            stdin_bytes=self.stdin.written,
            encoding=self.encoding,
            tags=self.params.tags,
            policy=self.params.policy,
            reason=self.reason,
            hits=self.hits[:MAX_HITS_KEPT],
            hits_total=self.hits_total,
            rules_disabled=self.rules_disabled[:MAX_RULES],
            watch_skipped=self.watch_skipped,
        )

    def last_output_at(self) -> float | None:
        """When the job last wrote to stdout or stderr (None: not yet)."""
        return self._output_at

    # -- protocol callbacks (event loop) ----------------------------------------------------

    def _on_data(self, fd: int, data: bytes) -> None:
        buf = self.streams[fd]
        watched = self._watched()
        buf.append(data, keep_unread=watched)
        self._data_since_linger = True
        self._output_at = time.time()
        if watched and buf.wants_pause() and self._transport is not None:
            pipe = self._transport.get_pipe_transport(fd)
            if pipe is not None and fd not in self._paused:
                pipe.pause_reading()  # type: ignore[attr-defined]
                self._paused.add(fd)
                self._timers.append(asyncio.get_running_loop().call_later(WATCH_TTL, self._check_unwatched))
        self._notify()

    def _on_pipe_closed(self, fd: int) -> None:
        if fd == 0:
            self.stdin.room()  # whatever was queued went with the pipe
        if fd in self.streams:
            self.streams[fd].eof = True
            self._paused.discard(fd)
        self._maybe_done()

    def _on_exit(self) -> None:
        self._exited = True
        self._exit_event.set()
        if self._transport is not None:
            self.exit_code = self._transport.get_returncode()
        self._maybe_done()
        if not self._done.is_set():
            # A background child may hold our pipes open forever; stop waiting once they go quiet.
            self._data_since_linger = False
            self._timers.append(asyncio.get_running_loop().call_later(LINGER, self._linger_check))

    def _linger_check(self) -> None:
        if self._done.is_set() or self._transport is None:
            return
        if self._data_since_linger or self._paused:
            self._data_since_linger = False
            self._timers.append(asyncio.get_running_loop().call_later(LINGER, self._linger_check))
            return
        self._close_pipes()

    def _maybe_done(self) -> None:
        if self._done.is_set() or not self._exited or not (self.streams[1].eof and self.streams[2].eof):
            return
        self._state = self._ending or "completed"
        self._last_scan()
        self.ended_at = time.time()
        for t in self._timers:
            t.cancel()
        self._timers.clear()
        if self._transport is not None:
            self._transport.close()
        self.stdin.room()
        self._done.set()
        self._notify()
        self._on_done(self)

    def _last_scan(self) -> None:
        """Let the watch rules see the rest of the output (the streams are complete, the state
        is no longer running: a hit is recorded, its action has nothing left to act on)."""
        scan_rest, self.before_end = self.before_end, None
        if scan_rest is not None:
            scan_rest()

    def _decode_input(self, data: str) -> bytes:
        return base64.b64decode(data, validate=True) if self.encoding == "base64" else data.encode()

    def write_stdin(self, data: bytes, offset: int | None, eof: bool, writer: str | None = None) -> int:
        """Write to stdin at byte ``offset`` (None: append; with ``writer``, that typist's byte);
        a repeated write is not duplicated. Takes only what fits (see :class:`StdinQueue`);
        returns the new bytes taken."""
        if self._transport is None:
            raise JobNotRunningError(f"stdin of job {self.job_id} is not open", job_id=self.job_id)
        return self.stdin.write(data, offset, eof, writer=writer)

    async def write_stdin_encoded(
        self, data: str, offset: int | None, eof: bool, payload: memoryview | None = None, writer: str | None = None
    ) -> int:
        """Decode and write; when nothing fits, wait a while for room and try once more (the
        writer's back-pressure). Cancelling the wait writes nothing."""
        if payload is not None:
            if data:
                raise InvalidParamsError("stdin data came both as params and as payload", data={"job_id": self.job_id})
            raw = bytes(payload)
        else:
            try:
                raw = self._decode_input(data)
            except ValueError as exc:
                raise JobNotRunningError(f"stdin data is not valid base64: {exc}", job_id=self.job_id) from None
        end = (self.stdin.cursor(writer) if offset is None else offset) + len(raw)
        taken = self.write_stdin(raw, offset, eof, writer)
        if taken or end <= self.stdin.cursor(writer):
            return taken
        await self.stdin.wait_room()
        return self.write_stdin(raw, offset, eof, writer) if self.stdin.open else 0

    def tree(self) -> Tree:
        """What names the job's processes (see :mod:`.proctree`): here its leader and session."""
        return Tree(self.mark, self.pid if self.running else 0, self.pid)

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the job's whole process group."""
        if not self.running:
            raise JobNotRunningError(f"job {self.job_id} is {self._state}", job_id=self.job_id)
        _killpg(self.pid, sig)

    async def kill(self, grace: float | None) -> KillResult:
        """SIGTERM the group, SIGKILL it after ``grace``; return once the job has ended."""
        if self.running:
            self._begin_end("killed", self.params.kill_grace if grace is None else grace)
            assert self._terminating is not None
            await asyncio.shield(self._terminating)
            await self._done.wait()
        return KillResult(state=self._state, exit_code=self.exit_code)

    def stop(self, reason: str, grace: float | None = None) -> None:
        """End the job's tree on the agent's own initiative (its policy), ``reason`` recorded;
        ``grace`` (default: the job's ``kill_grace``) between SIGTERM and SIGKILL."""
        if self.running and self._terminating is None:
            self.reason = reason
            self._begin_end("killed", self.params.kill_grace if grace is None else grace)

    def interrupt(self, reason: str) -> None:
        """SIGINT the job's group on the agent's own initiative; the job decides what follows."""
        if self.running and self._terminating is None:
            self.reason = reason
            _killpg(self.pid, signal.SIGINT)

    def _begin_end(self, why: JobState, grace: float) -> None:
        if self._terminating is None and self.running:
            self._ending = why
            self._terminating = asyncio.get_running_loop().create_task(self._terminate(grace))

    async def _terminate(self, grace: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        _killpg(self.pid, signal.SIGTERM)
        if self.stdin.open:
            self.write_stdin(b"", None, eof=True)
        self._resume_all()  # a paused pipe would keep a dying writer blocked
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._exit_event.wait(), grace)
        # The leader may be gone while a TERM-ignoring child lives on in the group: look for it.
        # No event exists for "the group emptied", so this one place polls the process table.
        while loop.time() < deadline and await scan(group_alive, self.pid):  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        if await scan(group_alive, self.pid):
            _killpg(self.pid, signal.SIGKILL)
        await self._exit_event.wait()
        try:
            await asyncio.wait_for(self._done.wait(), 1.0)
        except TimeoutError:
            self._close_pipes()  # a process that left our group still holds them

    def _close_pipes(self) -> None:
        if self._transport is None:
            return
        self._resume_all()
        for fd in (1, 2):
            pipe = self._transport.get_pipe_transport(fd)
            if pipe is not None and not self.streams[fd].eof:
                pipe.close()  # calls pipe_connection_lost -> eof

    async def aclose(self) -> None:
        """Kill the job at once (agent shutdown)."""
        if self.running:
            _killpg(self.pid, signal.SIGKILL)
        for t in self._timers:
            t.cancel()


def widen_pipe(f: object) -> None:
    """Grow a pipe to 1 MiB: 16x fewer reads and wakeups than the 64 KiB default at full speed."""
    fileno = getattr(f, "fileno", None)
    if fileno is not None:
        with contextlib.suppress(OSError, ValueError):
            fcntl.fcntl(fileno(), F_SETPIPE_SZ, PIPE_SIZE)


def _renice(nice: int) -> None:
    """In the child before exec (after the user switch): lower its priority to ``nice``, never
    raise it (an unprivileged process may not, and an agent at nice 5 keeps its jobs there)."""
    os.setpriority(os.PRIO_PROCESS, 0, max(nice, os.getpriority(os.PRIO_PROCESS, 0)))


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
