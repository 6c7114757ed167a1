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
(:mod:`.record`), and the record names the run in progress and where its output is read from
(:mod:`.output`, which sorts the output and keeps the record). So an agent killed or upgraded
leaves the shell running, idle or busy, with its cwd, variables and functions; the next agent
re-adopts it (:meth:`ShellSession.resume`), re-reads the current run's output through the same
framing (so its bytes and cursors are what they were), and serves runs again.

Closing, idle expiry and agent *shutdown* kill the shell and everything left in its process
group.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...errors import RemoteExecError, SpawnError
from ...protocol import ShellInfo
from ..jobs.environment import job_environment
from ..jobs.proctree import MARKER
from ..procfacts import proc_starttime
from . import signals
from .background import Background
from .framing import Frame, frame_script, init_script, new_nonce, recovery_lines
from .idle import IdleTimer
from .output import ShellOutput
from .process import ExitWatch, ShellHome, launch_shell, reattach_stdin
from .run import ShellRun
from .runstdin import resume_run_stdin, run_input
from .store import SessionStore, no_space

__all__ = ["ShellSession"]

START_TIMEOUT = 10.0  # seconds for a new shell to answer its first frame
MAX_KEYS = 64  # idempotency keys remembered per session


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
        self.idle = IdleTimer(ttl, clock, self._is_idle, self._expire)
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
        self._exit_watch: ExitWatch | None = None
        self._store = SessionStore(self.home, session_id)
        self._stdin: asyncio.WriteTransport | None = None
        self._ready: asyncio.Future[None] | None = None
        self._startup_err = bytearray()
        self._exited = False
        self._closed = asyncio.Event()
        self._interrupt_pending = False
        self._frame_ended = asyncio.Event()
        self.background = Background(session_id)  # (its interrupts, signals and closing)
        self._spawn = self.background.spawn
        self.output = ShellOutput(self._store, self._startup_noise, self._after_feed, self._frame_complete)

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
        # No await from here to the first frame (launch returns right after the spawn).
        self.pid, self.starttime, self._stdin = await launch_shell(self.argv, self._store, cwd, full_env)
        self._follow((0, 0))
        self._ready = loop.create_future()
        frame = self.output.frame = self._new_frame()
        self._frame_ended = asyncio.Event()
        self._watch_exit()  # (after the frame: a shell that dies at once fails ``_ready``)
        self._write(init_script(self._bash) + frame_script(frame.public, frame.nonce, ":", None, self._bash))
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), START_TIMEOUT)
        except TimeoutError:
            await self.close("it did not start")
            raise SpawnError(f"the shell {self.argv[0]!r} did not answer within {START_TIMEOUT:.0f} s") from None
        self.output.save(None)
        self._touch()

    def _follow(self, pos: tuple[int, int]) -> None:
        """Read the output files from ``pos`` on (from the next turn of the loop).

        :raises OSError: a file is missing.
        """
        assert self._store.dir is not None
        self.output.identity = {
            "session_id": self.session_id,
            "argv": self.argv,
            "pid": self.pid,
            "starttime": self.starttime,
            "mark": self.mark,
            "tmpdir": self._store.tmpdir,
            "created_at": self.created_at,
        }
        self.output.follow(self._store.dir, pos, self.pid, self.home.inotify)

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
        self._stdin = await reattach_stdin(stdin)
        run_rec = record.get("run")
        if run_rec is None:
            idle = record["idle"]
            self._follow((int(idle[0]), int(idle[1])))
        else:
            await self._resume_run(run_rec, make_run)
        self._watch_exit()
        self._touch()

    async def _resume_run(self, run_rec: dict[str, Any], make_run: Callable[[dict[str, Any]], ShellRun]) -> None:
        """Rebuild the run in progress: from its checkpoint if it has one (its log holds what came
        before), else from its start (its stray head re-read, its log's bytes skipped)."""
        ck = run_rec.get("ck")
        at = ck["at"] if ck is not None else run_rec["start"]
        self._follow((int(at[0]), int(at[1])))
        run = self.run = make_run(run_rec)
        self._frame_ended = asyncio.Event()
        frame = self._new_frame(str(run_rec["public"]))
        self.output.resume_run(run, frame, run_rec)  # (no await before: the files are read)
        if run_rec.get("stdin") and self.home.keeper is not None and self._store.tmpdir is not None:
            await resume_run_stdin(run, self.home.keeper, self._store.tmpdir, self.pid)

    def _new_frame(self, public: str | None = None) -> Frame:
        public = public or new_nonce()
        return Frame(public, self._store.nonce(public), self._bash)

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
        self.idle.touch()

    def _is_idle(self) -> bool:
        return self.run is None and self.open

    def expire_idle(self) -> bool:
        """Close the session (in the background) if it sat idle for its TTL by its clock."""
        return self.idle.check()

    def _expire(self) -> None:
        self._spawn(self.close(f"idle for {self.idle.ttl:g} s"))

    def detach(self) -> None:
        """Leave the shell to the next agent (a handover): stop reading, kill nothing.

        The keeper holds its stdin and key, the record says where its output is read from.
        """
        self.output.close()
        if self._exit_watch is not None:
            self._exit_watch.close()
        self.idle.cancel()
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
        assert self.output.files is not None and self.run is None
        self.run = run  # before any await: a concurrent shell_run now finds the session busy
        self.idle.cancel()
        self.last_used_at = time.time()
        try:
            keeper = self.home.keeper if self.home.durable else None
            stdin_path = await run_input(run, self._store, input, stdin_open, keeper)
        except RemoteExecError:
            self._abort(run)
            raise
        if not self.open:
            run.finish(self.exit_code)  # the shell died while the input was being written
            return
        frame = self._new_frame()
        try:  # before the line is sent: an agent killed after that finds the run on disk
            self.output.begin_run(run, frame)
        except OSError as exc:
            self._abort(run)
            raise no_space(exc, f"the record of run {run.job_id}") from None
        self._frame_ended = asyncio.Event()
        run.begin()
        self._write(frame_script(frame.public, frame.nonce, run.command, stdin_path, self._bash))

    def _abort(self, run: ShellRun) -> None:
        """``run`` ends without having begun; the session stays usable."""
        self.run = None
        self._remove_input(run)
        run.finish(None)
        self._touch()

    def interrupt(self) -> None:
        """Ctrl-C: SIGINT to the running command; the shell survives. Nothing runs: nothing to do.

        Returns at once; the signal goes out from a task (see :func:`.signals.interrupt`).
        """
        frame = self.output.frame
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
        if self.output.frame is frame and not frame.complete:
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

    def _startup_noise(self, fd: int, data: bytes) -> None:
        if fd == 2 and len(self._startup_err) < 4096:
            self._startup_err += data  # the first frame's output is startup noise, shown on failure

    def _after_feed(self, frame: Frame) -> None:
        if self._interrupt_pending and frame.started:
            self._interrupt_pending = False
            self.interrupt()

    def _frame_complete(self, exit_code: int | None) -> None:
        self.output.end_run()
        self._frame_ended.set()
        self._interrupt_pending = False
        run, self.run = self.run, None
        self._touch()
        if run is None:
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(None)
            return
        self._remove_input(run)
        run.finish(exit_code)  # its log and end saved: the session's files need none of it now
        self.output.checkpoint_idle()

    def _on_exit(self, code: int | None) -> None:
        self._exited = True
        self.exit_code = code
        if self.closed_reason is None:  # no new run while its group is being killed
            self.closed_reason = f"the shell exited with code {code}"
        self.output.flush()
        self._spawn(self._finalize_once_gone())

    async def _finalize_once_gone(self) -> None:
        # The tab closed: what it left running in its group goes too, and the session is closed
        # (its run's end, close()) once that is gone, as a killed job ends once its group is.
        await signals.kill_group(self.pid)
        self._finalize()

    def _finalize(self) -> None:
        if self._closed.is_set():
            return
        if self.closed_reason is None:
            self.closed_reason = f"the shell exited with code {self.exit_code}"
        self.idle.cancel()
        self.output.close()
        if self._exit_watch is not None:
            self._exit_watch.close()
        if self._stdin is not None:
            self._stdin.close()
        self.output.end_run()
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
