"""One shell session: a long-lived interactive shell that runs framed commands one at a time.

The shell is ``bash -i`` (``sh -i`` where bash is missing) without a terminal, in its own
session and process group, with stdin on a socketpair: unlike a pipe, a socket cannot be opened
again through ``/proc/PID/fd/0``, so no other process can read the lines meant for the shell
(see :mod:`.framing`). It is interactive because only an interactive shell treats SIGINT as
Ctrl-C: abort the command line, keep the shell. With no terminal there is no job control, so
commands share the shell's process group, SIGINT to that group reaches the foreground command,
and background jobs ignore it.

**Outliving the agent.** The shell's stdout and stderr are files in its session dir
(:mod:`.follow`), the keeper holds a dup of our end of its stdin and the key of its run secrets
(:mod:`.record`), and the record names the run in progress and the offsets its output starts
at, written before its line is sent. So an agent killed or upgraded leaves the shell running,
idle or busy, with its cwd, variables and functions; the next agent re-adopts it
(:meth:`ShellSession.restore`), re-reads the current run's output from its start offsets
through the same framing (so its bytes and cursors are what they were), and serves runs again.

**Disk.** A durable session's run copies its visible output into a job dir of its own
(:mod:`.runlog`): capped as a job's, kept after the run as a finished job's. So the session's
``out``/``err`` need to keep only what the next agent would re-read: every :data:`DROP_STEP`
bytes of a run the record takes a *checkpoint* (the file offsets up to which the framing has
passed everything on, and how many visible bytes the run had by then), and the files' heads
before it are punched out; between runs the same happens at the offsets a next run's stray
head starts at. A re-adopted run reads on from its checkpoint and skips the visible bytes its
log holds already, so nothing is written to it twice.

Output between runs (a background job writing late) is kept and handed to the next run, as a
terminal would show it at the next prompt. Closing, idle expiry and agent *shutdown* kill the
shell and everything left in its process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from ...errors import SpawnError
from ...protocol import ShellInfo
from ..jobs.environment import job_environment
from ..jobs.proctree import MARKER
from ..procfacts import proc_starttime
from . import signals
from .follow import DROP_STEP, ShellFiles
from .framing import Frame, frame_script, init_script, new_nonce, recovery_lines
from .process import ExitWatch, ShellHome, spawn_shell
from .run import ShellRun
from .runstdin import RunStdin, open_run_stdin
from .store import SessionStore, no_space, run_record, write_private

__all__ = ["ShellSession", "default_shell"]

log = logging.getLogger("remote_exec.agent")

START_TIMEOUT = 10.0  # seconds for a new shell to answer its first frame
STRAY_LIMIT = 1 << 20  # bytes of between-runs output kept for the next run, per stream
MAX_KEYS = 64  # idempotency keys remembered per session


def default_shell() -> list[str]:
    """The shell command line: bash if installed, else the POSIX sh."""
    bash = shutil.which("bash")
    if bash:
        return [bash, "--norc", "--noprofile", "--noediting", "-i"]
    return [shutil.which("sh") or "/bin/sh", "-i"]


class _StdinProtocol(asyncio.Protocol):
    """Our end of the shell's stdin: written to, never read (the shell's end cannot write)."""

    def eof_received(self) -> bool:
        return True  # the shell's end shut its writing half: keep ours open for writing


class ShellSession:
    """A shell and its current run; ``pid`` is the shell's (also its process group and session).

    :ivar closed_reason: why the session closed (``None`` while open).
    :ivar keys: idempotency keys of recent ``shell_run`` calls, mapped to the runs they started.
    :ivar runs: ids of its runs the job registry still holds, oldest first.
    """

    def __init__(
        self,
        session_id: str,
        argv: list[str],
        ttl: float,
        on_closed: Callable[[ShellSession], None],
        *,
        clock: Callable[[], float] = time.monotonic,
        home: ShellHome | None = None,
    ) -> None:
        self.session_id = session_id
        self.argv = argv
        self.ttl = ttl
        self._clock = clock  # monotonic seconds that ``ttl`` is counted in (a test's fake clock)
        self.idle_since = clock()
        self.pid = 0
        self.created_at = time.time()
        self.last_used_at = self.created_at
        self.exit_code: int | None = None
        self.closed_reason: str | None = None
        self.run: ShellRun | None = None
        self.keys: OrderedDict[str, str] = OrderedDict()
        self.runs: deque[str] = deque()  # ids of the runs still in the job registry, oldest first
        self._bash = os.path.basename(argv[0]) == "bash"
        self._on_closed = on_closed
        self.home = home or ShellHome()
        self.starttime: int | None = None
        self.mark: str | None = None
        self._files: ShellFiles | None = None
        self._exit_watch: ExitWatch | None = None
        self._store = SessionStore(self.home, session_id)
        self._stdin: asyncio.WriteTransport | None = None
        self._frame: Frame | None = None
        self._ready: asyncio.Future[None] | None = None
        self._startup_err = bytearray()
        self._stray = {1: bytearray(), 2: bytearray()}
        self._exited = False
        self._closed = asyncio.Event()
        self._interrupt_pending = False
        self._frame_ended = asyncio.Event()
        self._ttl_timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._run_rec: dict[str, Any] | None = None  # the current run's record (its checkpoints)
        self._kept_from = 0  # the files' offsets (summed) of the last checkpoint: what is kept

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self, cwd: str | None, env: dict[str, str] | None, mark: str | None = None) -> None:
        """Start the shell and wait until it ran a first frame; :class:`SpawnError` if it cannot.

        ``mark``: the job marker its processes carry, so that the next agent finds and ends a
        shell it cannot re-adopt (see ``JobController.end_dead_shells``).
        """
        full_env = job_environment(env)
        if mark is not None:
            full_env[MARKER] = mark
        self.mark = mark
        loop = asyncio.get_running_loop()
        # Made before the shell: a full disk then refuses the open with nothing to kill.
        ours, theirs = socket.socketpair()
        try:
            out, err = await self._store.create(ours)
        except BaseException:
            ours.close()
            theirs.close()
            raise
        theirs.shutdown(socket.SHUT_WR)  # the shell's stdin is for reading only
        # Before the spawn: no await may come between the shell's start and its first frame.
        self._stdin, _ = await loop.create_unix_connection(_StdinProtocol, sock=ours)
        try:
            self.pid, self.starttime = spawn_shell(self.argv, theirs.fileno(), out, err, cwd, full_env)
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            self._store.discard()
            self._stdin.close()
            await self._store.release()
            raise SpawnError(f"cannot start the shell {self.argv[0]!r}: {exc}") from None
        finally:
            theirs.close()
            os.close(out)
            os.close(err)
        self._follow((0, 0))
        self._ready = loop.create_future()
        self._frame = self._new_frame()
        self._frame_ended = asyncio.Event()
        self._watch_exit()  # (after the frame: a shell that dies at once fails ``_ready``)
        self._write(
            init_script(self._bash) + frame_script(self._frame.public, self._frame.nonce, ":", None, self._bash)
        )
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), START_TIMEOUT)
        except TimeoutError:
            await self.close("it did not start")
            raise SpawnError(f"the shell {self.argv[0]!r} did not answer within {START_TIMEOUT:.0f} s") from None
        self._save(None)
        self._touch()

    def _follow(self, pos: tuple[int, int]) -> None:
        """Read the output files from ``pos`` on (from the next turn of the loop).

        :raises OSError: a file is missing.
        """
        assert self._store.dir is not None
        self._files = ShellFiles(self._store.dir, pos, self.pid, self._on_data, self.home.inotify)
        self._files.open()

    def _watch_exit(self) -> None:
        self._exit_watch = ExitWatch(self.pid, self.starttime, self.home.keeper, self._on_exit)
        self._exit_watch.start()

    async def resume(
        self, record: dict[str, Any], path: Path, key: bytes, stdin: int, make_run: Callable[[dict[str, Any]], ShellRun]
    ) -> None:
        """Take over the shell an earlier agent left (its ``record``, dir ``path``, ``key`` and our
        end of its ``stdin``, both back from the keeper): the run in progress (or last ended)
        is rebuilt by ``make_run`` and its output re-read from its start offsets, so a poller's
        cursors go on where they were; a shell that ended meanwhile closes with its exit.

        :raises OSError: its files are missing.
        :raises KeyError, ValueError, TypeError: the record is not one (the caller ends the shell).
        """
        self.pid, self.starttime = int(record["pid"]), record["starttime"]
        # The record is a file the shell's user may be able to write: nothing in it may make
        # this agent signal another process (a reused pid) or delete another directory.
        if self.starttime is None or proc_starttime(self.pid) != self.starttime:
            raise ValueError(f"its shell (pid {self.pid}) is gone")
        self._store.adopt(record, path, key)
        self.mark = record.get("mark")
        self.created_at = self.last_used_at = float(record["created_at"])
        sock = socket.socket(fileno=stdin)
        self._stdin, _ = await asyncio.get_running_loop().create_unix_connection(_StdinProtocol, sock=sock)
        run_rec = record.get("run")
        if run_rec is None:
            idle = record["idle"]
            self._follow((int(idle[0]), int(idle[1])))
            self._kept_from = int(idle[0]) + int(idle[1])
        else:
            await self._resume_run(run_rec, make_run)
        self._watch_exit()
        self._touch()

    async def _resume_run(self, run_rec: dict[str, Any], make_run: Callable[[dict[str, Any]], ShellRun]) -> None:
        """Rebuild the run in progress: from its checkpoint if it has one (its log holds what came
        before), else from its start (its stray head re-read, its log's bytes skipped)."""
        start, stray, ck = run_rec["start"], run_rec["stray"], run_rec.get("ck")
        at = ck["at"] if ck is not None else start
        self._follow((int(at[0]), int(at[1])))
        self._kept_from = int(at[0]) + int(at[1])
        assert self._files is not None
        run = self.run = make_run(run_rec)
        self._run_rec = run_rec
        public = str(run_rec["public"])
        self._frame = Frame(public, self._store.nonce(public), self._bash)
        self._frame_ended = asyncio.Event()
        if run_rec.get("log") and self.home.jobs is not None:
            # Its dir is gone if the run ended and was forgotten (retention): then what is left
            # of it is re-read into memory, and the session lives on.
            with contextlib.suppress(OSError):
                run.open_log(self.home.jobs, create=False)
        if run_rec.get("stdin"):
            await self._resume_stdin(run)
        if ck is not None:
            self._frame.resume_started()
            for fd in (1, 2):  # the log holds these already (written after the checkpoint)
                if run.log is not None:
                    run.log.skip[fd] = max(0, run.log.files[fd].end - int(ck["logged"][fd - 1]))
        else:
            for fd in (1, 2):
                head = self._files.replay(fd, int(stray[fd - 1]), int(start[fd - 1]))
                if head:
                    run._on_data(fd, head)
        run.begin(self._files, elapsed=max(0.0, time.time() - run.started_at))

    async def _resume_stdin(self, run: ShellRun) -> None:
        """Feed the run's open stdin again through the write end the keeper held (and from the
        cursor its dir kept). Without that copy the stdin stays closed: writes are refused."""
        keeper, tmpdir = self.home.keeper, self._store.tmpdir
        if keeper is None or tmpdir is None:
            return
        _, fds = await keeper.request({"op": "fd", "key": run.job_id})
        for extra in fds[1:]:
            os.close(extra)
        if not fds:
            return
        if run.log is not None:
            run.stdin.written = run.log.stdin_cursor()
        # The path is ours to name, not the record's (a file the shell's user may write).
        path = os.path.join(tmpdir, f"{run.job_id}.fifo")
        with contextlib.suppress(OSError):
            run.feed = await RunStdin.adopt(path, fds[0], run.job_id, run.stdin, self.pid, keeper)

    def _checkpoint(self, frame: Frame, run: ShellRun) -> None:
        """Every :data:`DROP_STEP` bytes of a run: record how far the framing got, and punch the
        files' heads before it (the run's log holds what they said). See the module docstring."""
        files = self._files
        if files is None or run.log is None or self._run_rec is None or not frame.midway:
            return
        at = [files.pos[fd] - frame.held(fd) for fd in (1, 2)]
        if sum(at) - self._kept_from < DROP_STEP:
            return
        rec = {**self._run_rec, "ck": {"at": at, "logged": run.log.logged()}}
        try:
            self._save(rec)
        except OSError:
            return  # a full disk: the files keep their heads until a record can be written
        self._run_rec = rec
        self._kept_from = sum(at)
        files.drop_before((at[0], at[1]))

    def _checkpoint_idle(self) -> None:
        """Between runs, every :data:`DROP_STEP` bytes of late output: record the offsets the
        kept stray bytes start at, and punch the files' heads before them."""
        files = self._files
        if files is None or self.run is not None or self._frame is not None:
            return
        idle = [files.pos[fd] - len(self._stray[fd]) for fd in (1, 2)]
        if sum(idle) - self._kept_from < DROP_STEP:
            return
        try:
            self._save(None)
        except OSError:
            return
        self._kept_from = sum(idle)
        files.drop_before((idle[0], idle[1]))

    def _new_frame(self) -> Frame:
        public = new_nonce()
        return Frame(public, self._store.nonce(public), self._bash)

    def _save(self, run: dict[str, Any] | None) -> None:
        """Write the record (durable sessions only): where the next agent picks the session up.

        :raises OSError: the disk is full.
        """
        if self._files is None:
            return
        record = {
            "session_id": self.session_id,
            "argv": self.argv,
            "pid": self.pid,
            "starttime": self.starttime,
            "mark": self.mark,
            "tmpdir": self._store.tmpdir,
            "created_at": self.created_at,
            "idle": [self._files.pos[fd] - len(self._stray[fd]) for fd in (1, 2)],
            "run": run,
        }
        self._store.save(record)

    @property
    def open(self) -> bool:
        return self.closed_reason is None and not self._closed.is_set()

    def info(self) -> ShellInfo:
        cwd = None
        if self.open:
            with contextlib.suppress(OSError):
                cwd = os.readlink(f"/proc/{self.pid}/cwd")  # live: follows every `cd`
        run = self.run
        return ShellInfo(
            session_id=self.session_id,
            pid=self.pid,
            program=self.argv[0],
            state="open" if self.open else "closed",
            cwd=cwd,
            busy=run is not None,
            run_id=run.job_id if run is not None else None,
            run_command=run.command if run is not None else None,
            created_at=self.created_at,
            last_used_at=self.last_used_at,
            exit_code=self.exit_code,
            closed_reason=self.closed_reason,
        )

    def _touch(self) -> None:
        self.last_used_at = time.time()
        self.idle_since = self._clock()
        if self._ttl_timer is not None:
            self._ttl_timer.cancel()
            self._ttl_timer = None
        if self.ttl > 0 and self.run is None and self.open:
            self._ttl_timer = asyncio.get_running_loop().call_later(self.ttl, self._expire)

    def expire_idle(self) -> bool:
        """Close the session (in the background) if it sat idle for ``ttl`` by its clock.

        The TTL timer calls this; a test with a fake clock calls it after advancing the clock.
        """
        if self.ttl <= 0 or self.run is not None or not self.open or self._clock() - self.idle_since < self.ttl:
            return False
        self._spawn(self.close(f"idle for {self.ttl:g} s"))
        return True

    def _expire(self) -> None:
        self._ttl_timer = None
        if not self.expire_idle() and self.ttl > 0 and self.run is None and self.open:
            # Not due by the clock yet (a timer may fire a hair early): check again when it is.
            left = max(self.idle_since + self.ttl - self._clock(), 0.001)
            self._ttl_timer = asyncio.get_running_loop().call_later(left, self._expire)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("shell %s: %s failed", self.session_id, task.get_coro(), exc_info=task.exception())

    def detach(self) -> None:
        """Leave the shell to the next agent (a handover): stop reading, kill nothing.

        The keeper holds its stdin and key, the record says where its output is read from.
        """
        for watcher in (self._files, self._exit_watch):
            if watcher is not None:
                watcher.close()
        for timer in (self._ttl_timer,):
            if timer is not None:
                timer.cancel()
        if self._stdin is not None:
            self._stdin.close()  # (the keeper's dup keeps the socket open)
        if self.run is not None:
            self.run.leave()

    async def close(self, reason: str) -> None:
        """Kill the shell and everything in its process group; return once it is gone."""
        if self.closed_reason is None:
            self.closed_reason = reason
        if not self._exited:
            signals.killpg(self.pid, signal.SIGKILL)
        await self._closed.wait()

    async def wait_closed(self) -> None:
        """Return once the shell has ended and its pipes are drained (for any reason)."""
        await self._closed.wait()

    async def aclose(self) -> None:
        """Agent shutdown: kill at once, wait briefly."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.close("the agent shut down"), 2.0)

    # -- runs -----------------------------------------------------------------------------------

    async def begin(self, run: ShellRun, input: bytes | None, stdin_open: bool = False) -> None:
        """Make ``run`` current and send its frame (the caller checked the session is idle).

        ``stdin_open``: the run's stdin is a FIFO fed by ``write_stdin`` (:mod:`.runstdin`).
        """
        assert self._files is not None and self.run is None
        self.run = run  # before any await: a concurrent shell_run now finds the session busy
        if self._ttl_timer is not None:
            self._ttl_timer.cancel()
            self._ttl_timer = None
        self.last_used_at = time.time()
        stdin_path = None
        if stdin_open:
            assert self._store.tmpdir is not None
            try:
                keeper = self.home.keeper if self.home.durable else None
                stdin_path = await open_run_stdin(run, self._store.tmpdir, input, keeper)
            except OSError as exc:
                self.run = None  # the session stays usable; the run ends without having begun
                run.finish(None)
                self._touch()
                raise no_space(exc, f"the stdin of run {run.job_id}") from None
        elif input is not None:
            stdin_path = self._store.input_path(run.job_id)
            try:
                await asyncio.to_thread(write_private, stdin_path, input)
            except OSError as exc:
                self.run = None  # the session stays usable; the run ends without having begun
                self._remove_input(run)
                run.finish(None)
                self._touch()
                raise no_space(exc, f"the input of run {run.job_id}") from None
        if not self.open:
            run.finish(self.exit_code)  # the shell died while the input was being written
            return
        frame = self._new_frame()
        files = self._files
        run_rec = run_record(run, frame.public, self._stray, files.pos)
        try:  # before the line is sent: an agent killed after that finds the run on disk
            run_rec["log"] = run.log is not None
            run_rec["stdin"] = run.feed is not None
            self._save(run_rec)
        except OSError as exc:
            self.run = None  # the session stays usable; the run ends without having begun
            self._remove_input(run)
            run.finish(None)
            self._touch()
            raise no_space(exc, f"the record of run {run.job_id}") from None
        self._run_rec = run_rec
        # Nothing before this run's first stray byte is read again, by this agent or the next.
        kept = (files.pos[1] - len(self._stray[1]), files.pos[2] - len(self._stray[2]))
        files.drop_before(kept)
        self._kept_from = sum(kept)
        for fd, stray in self._stray.items():
            if stray:
                run._on_data(fd, bytes(stray))
                stray.clear()
        self._frame = frame
        self._frame_ended = asyncio.Event()
        run.begin(files)
        self._write(frame_script(frame.public, frame.nonce, run.command, stdin_path, self._bash))

    def interrupt(self) -> None:
        """Ctrl-C: SIGINT to the running command; the shell survives. Nothing runs: nothing to do.

        Returns at once; the signal goes out from a task (see :func:`.signals.interrupt`).
        """
        frame = self._frame
        if self.run is None or frame is None or not self.open:
            return
        if not frame.started:
            self._interrupt_pending = True  # the shell still parses the frame and ignores SIGINT
            return
        resend = functools.partial(self._resend, frame)
        self._spawn(signals.interrupt(self.pid, self.run.started_boot, self._frame_ended, resend))

    def _resend(self, frame: Frame) -> None:
        # Only while ``frame`` is the current one: a recovery line written after its run ended
        # would reach the shell after the next run's line, find the guard holding that run's id,
        # and print this run's sentinels again, into the next run's output.
        if self._frame is frame and not frame.complete:
            self._write(recovery_lines(frame.public, frame.nonce, self._bash))

    def signal_run(self, run: ShellRun, sig: int) -> None:
        """SIGINT is an interrupt; any other signal goes to the processes the run started."""
        if sig == signal.SIGINT:
            self.interrupt()
        else:
            self._spawn(self.signal_processes(run, sig))

    async def signal_processes(self, run: ShellRun, sig: int) -> None:
        """Send ``sig`` to the shell's processes started since ``run`` began (never the shell)."""
        await signals.signal_run_processes(self.pid, run.started_boot, sig)

    def _write(self, data: bytes) -> None:
        if self._stdin is not None and not self._stdin.is_closing():
            self._stdin.write(data)

    # -- pipe callbacks (event loop) --------------------------------------------------------------

    def _on_data(self, fd: int, data: bytes) -> None:
        frame = self._frame
        if frame is None:
            self._keep_stray(fd, data)
            self._checkpoint_idle()
            return
        visible, rest = frame.feed(fd, data)
        if visible:
            self._deliver(fd, visible)
            if self.run is not None:
                self._checkpoint(frame, self.run)
        if self._interrupt_pending and frame.started:
            self._interrupt_pending = False
            self.interrupt()
        if rest:
            self._keep_stray(fd, rest)
        if frame.complete:
            self._frame_complete(frame.exit_code)

    def _deliver(self, fd: int, data: bytes) -> None:
        if self.run is not None:
            self.run._on_data(fd, data)
        elif fd == 2 and len(self._startup_err) < 4096:
            self._startup_err += data  # the first frame's output is startup noise, shown on failure

    def _keep_stray(self, fd: int, data: bytes) -> None:
        stray = self._stray[fd]
        stray += data
        if len(stray) > STRAY_LIMIT:
            del stray[: len(stray) - STRAY_LIMIT]

    def _frame_complete(self, exit_code: int | None) -> None:
        self._frame = None
        self._frame_ended.set()
        self._interrupt_pending = False
        self._run_rec = None
        run, self.run = self.run, None
        self._touch()
        if run is None:
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(None)
            return
        self._remove_input(run)
        run.finish(exit_code)

    def _on_exit(self, code: int | None) -> None:
        self._exited = True
        self.exit_code = code
        signals.killpg(self.pid, signal.SIGKILL)  # the tab closed: what it left running in its group goes too
        if self._files is not None:
            self._files.drain()  # the files hold all the shell wrote: read it to the end
        if self._frame is not None:
            for fd in (1, 2):
                held = self._frame.flush(fd)
                if held:
                    self._deliver(fd, held)
        self._finalize()

    def _finalize(self) -> None:
        if self._closed.is_set():
            return
        if self.closed_reason is None:
            self.closed_reason = f"the shell exited with code {self.exit_code}"
        if self._ttl_timer is not None:
            self._ttl_timer.cancel()
        for watcher in (self._files, self._exit_watch):
            if watcher is not None:
                watcher.close()
        if self._stdin is not None:
            self._stdin.close()
        self._frame = None
        self._frame_ended.set()
        run, self.run = self.run, None
        if run is not None:
            self._remove_input(run)
            run.finish(self.exit_code)  # `exit N` in the run: the run resolves with N
        elif self._ready is not None and not self._ready.done():
            noise = self._startup_err.decode(errors="replace").strip()
            self._ready.set_exception(SpawnError(f"the shell exited with code {self.exit_code} at start: {noise}"))
        self._store.discard()
        self._spawn(self._store.release())
        self._closed.set()
        self._on_closed(self)

    def _remove_input(self, run: ShellRun) -> None:
        self._store.remove_input(run.job_id)
