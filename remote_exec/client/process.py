"""``ExecRemoteProcess``: the host's handle on one job, streaming its events as the agent pushes
them (:mod:`~remote_exec.client.follower`), or by cursor polls where the channel cannot push."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import secrets
import signal as _signal
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Literal

import anyio

from ..errors import ExecTimeoutError, JobKilledError, JobNotFoundError, JobNotRunningError, ProtocolError
from ..protocol import (
    DEFAULT_MAX_BYTES,
    Empty,
    FollowParams,
    JobIdParams,
    JobInfo,
    JobStats,
    JobStatsParams,
    KillParams,
    KillResult,
    Method,
    PollParams,
    PollResult,
    ResizeParams,
    SignalParams,
    StartParams,
    StartResult,
    TtySize,
    WriteStdinParams,
    WriteStdinResult,
)
from .follower import FOLLOW_BUDGET, Follower
from .link import Link
from .logs import OutputSlice, read_output
from .rpc import RpcClient
from .tail import Tail
from .types import (
    Completed,
    ExecRemoteEvent,
    ExecRemoteOptions,
    ExecResult,
    StderrChunk,
    StdoutChunk,
    StreamTruncated,
)

__all__ = ["ExecRemoteProcess", "attached", "kill_quietly", "launch", "new_job_id", "starting"]

STDIN_CHUNK = 4 * 1024 * 1024  # bytes per write_stdin request: a small agent budget takes it whole
MAX_POLL_BYTES = 4 * 1024 * 1024  # the largest poll a busy job grows to (from the protocol's 1 MiB)
RESPONSE_MARGIN = 5.0
"""Seconds a long-poll response may lag its wait before we re-ask. A poll's deadline, retries
included, is its wait plus three margins (25 s with the default 10 s wait): a re-asked poll
whose answer was lost finds its data ready and answers at once."""


class ExecRemoteProcess:
    """A job in the sandbox: iterate it for events, or ``await proc.wait()`` for the result.

    It is "hot": the job starts when ``exec_remote()`` returns, before any ``await``.
    Iterate once (``async for ev in proc`` or ``proc.events``); events arrive in order and end
    with :class:`Completed`, or with :class:`~remote_exec.ExecTimeoutError` if the job's
    ``timeout`` expired.

    Cancelling the task that iterates (or waits on) the process kills the job (unless it was
    detached, or ``kill_on_cancel`` is False, the default for :meth:`AsyncSandbox.attach`
    handles). Breaking out of the loop does not: the job runs on until :meth:`kill`, or the
    sandbox is closed.
    """

    def __init__(self, rpc: RpcClient, options: ExecRemoteOptions, *, response_margin: float = RESPONSE_MARGIN) -> None:
        self._rpc = rpc
        self.options = options
        self._margin = response_margin
        self._job_id: str | None = None
        self._pid: int | None = None
        self._start_task: asyncio.Task[StartResult] | None = None
        self._offsets = [0, 0]
        self._max_bytes = DEFAULT_MAX_BYTES
        empty = b"" if options.encoding == "base64" else ""
        self._tails = (Tail(options.output_limit, empty), Tail(options.output_limit, empty))
        self._queue: deque[ExecRemoteEvent] = deque()
        self._queued = 0  # bytes (or characters) of the chunks in _queue
        self._final: PollResult | None = None
        self._timeout_error: ExecTimeoutError | None = None
        self._killed = False
        self._detached = False
        self._ended = False
        self._stdin_offset = 0
        self._stdin_lock = asyncio.Lock()  # (see _write)
        # A terminal has many typists (every view of it sends keystrokes): this handle is one,
        # with a cursor of its own bytes, so its retried write is never typed twice.
        self._writer = secrets.token_urlsafe(12)
        self._kill_task: asyncio.Task[None] | None = None
        self.kill_on_cancel = True
        self._iterated = False
        self._hits = 0
        self._hit_listeners: list[Callable[[int], None]] = []
        self._follower: Follower | None = None
        self.info: JobInfo | None = None
        """The agent's record of the job when this handle was made by ``attach`` (its command,
        ``started_at``, label and tags), else ``None``."""

    def _on_started(self, task: asyncio.Task[StartResult]) -> None:
        # The pid (and a shell run's id) are there as soon as the agent answered, awaited or not;
        # a failure is retrieved here (no "never retrieved" warning) and raised on first use.
        if not task.cancelled() and task.exception() is None and self._pid is None:
            self._job_id, self._pid = task.result().job_id, task.result().pid

    async def started(self) -> ExecRemoteProcess:
        """Wait until the agent has started the job; return ``self``.

        Cancelling ``started()`` does not cancel the start: the job starts and is tracked (and
        killed when the sandbox closes) as if it had not been awaited.

        :raises SpawnError: the command could not be started.
        """
        if self._pid is None and self._start_task is not None:
            res = await asyncio.shield(self._start_task)
            self._job_id, self._pid = res.job_id, res.pid
        return self

    @property
    def job_id(self) -> str | None:
        """The job's id: chosen by this client, so known as soon as ``exec_remote()`` returns
        (a shell run's, chosen by the agent: ``None`` until its start has been confirmed)."""
        return self._job_id

    @property
    def pid(self) -> int | None:
        """The job's PID inside the sandbox (``None`` until started)."""
        return self._pid

    @property
    def tty(self) -> bool:
        """True if the job runs in a pseudo-terminal (``tty=True``)."""
        return self.options.tty

    @property
    def returncode(self) -> int | None:
        """The exit code once the end has been read, else ``None``."""
        return self._final.exit_code if self._final is not None else None

    @property
    def connection(self) -> RpcClient:
        """The connection this handle talks over (the sandbox's): what a job's feed is
        shared on (:class:`~remote_exec.client.feed.JobFeed`)."""
        return self._rpc

    @property
    def link(self) -> Link:
        """The state of the channel this handle talks over (its sandbox's ``link``): a view of the
        job shows it beside the job's own state."""
        return self._rpc.channel.link

    # -- events ---------------------------------------------------------------------------

    @property
    def events(self) -> AsyncIterator[ExecRemoteEvent]:
        """The event iterator (the process itself)."""
        return self

    def __aiter__(self) -> ExecRemoteProcess:
        if self._iterated and self._ended and not self._queue:  # ran to its end (a kill or detach stops it quietly)
            raise RuntimeError(
                "this process's events were consumed already (a process is iterated once); "
                "its result stays available: await proc.wait() or read proc.returncode"
            )
        self._iterated = True
        return self

    async def __anext__(self) -> ExecRemoteEvent:
        while True:
            if self._queue:
                if len(self._queue) == 1 and self._follower is not None:
                    self._follower.start()  # the last one waiting: ask for more while it is used
                ev = self._queue.popleft()
                if isinstance(ev, StdoutChunk | StderrChunk):
                    self._queued -= len(ev.data)
                return ev
            if self._timeout_error is not None:
                err, self._timeout_error = self._timeout_error, None
                self._ended = True
                raise err
            if self._ended or self._killed or self._detached:
                raise StopAsyncIteration
            try:
                await (self._await_push() if self._rpc.channel.pushes else self._poll_once())
            except anyio.get_cancelled_exc_class():
                # The reader was cancelled: the job goes with it (see the class's docstring).
                if self.kill_on_cancel and not self._detached:
                    with anyio.CancelScope(shield=True):
                        await kill_quietly(self)
                raise

    async def _await_push(self) -> None:
        # A job whose id this client chose is followed at once, the follow sent behind its start
        # on the same connection: the agent holds a call on an id still spawning until the spawn
        # is through, so the first push leaves as the job writes, without a round trip between
        # the start's answer and the follow (a start that failed, or a follow that overtook its
        # start, fails the follow as "unknown job": the start's own answer says what happened).
        early = self._pid is None and self._job_id is not None
        if not early:
            await self.started()
        if self._follower is None:
            assert self._job_id is not None
            self._follower = Follower(
                self._rpc,
                self._job_id,
                self._follow_params,
                self._apply,
                lambda: self._final is not None,
                self.options.poll_interval + self._margin,
                lambda: self._queued,
            )
        try:
            await self._follower.more(lambda: bool(self._queue))
        except Exception as exc:
            if not early:
                raise
            overtaken = isinstance(exc, JobNotFoundError)
            if overtaken:
                self._follower = None  # (its call failed for good): the next turn follows anew
            await self._known_start()  # what the start met says more than its follow's failure
            if not overtaken:
                raise
        await self._known_start()

    async def _known_start(self) -> None:
        """Wait for the start's answer: events go out with the job's pid known. A start that
        failed (SpawnError...) raises, and nothing an early follow brought is kept for later."""
        if self._pid is None:
            try:
                await self.started()
            except Exception:
                self._queue.clear()
                raise

    def _follow_params(self) -> FollowParams:
        assert self._job_id is not None
        return FollowParams(
            job_id=self._job_id,
            stdout_offset=self._offsets[0],
            stderr_offset=self._offsets[1],
            hits=self._hits,
            max_bytes=self._max_bytes,
            budget=FOLLOW_BUDGET,
            wait=self.options.poll_interval,
        )

    async def _poll_once(self) -> None:
        await self.started()
        assert self._job_id is not None
        wait = self.options.poll_interval
        params = PollParams(
            job_id=self._job_id,
            stdout_offset=self._offsets[0],
            stderr_offset=self._offsets[1],
            wait=wait,
            max_bytes=self._max_bytes,
            binary=True,  # raw bytes beside the JSON: no escaping, no base64
            hits=self._hits,  # a rule's new match answers at once, output or not
        )
        result, payload = await self._rpc.call_with_payload(
            Method.EXEC_REMOTE_POLL,
            params,
            PollResult,
            timeout=wait + self._margin,
            deadline=wait + 3 * self._margin,
            max_payload=2 * params.max_bytes,
        )
        self._apply(result, payload)

    def _apply(self, r: PollResult, payload: memoryview | None = None) -> None:
        """Take one poll's answer, or one push (the same checks: see the follower)."""
        # The agent is not trusted: each cursor must move by exactly the bytes it sent plus the
        # bytes it says were dropped, so it cannot fake progress, skip output, or claim an end
        # it did not deliver.
        if r.payload_sizes is None:
            raise ProtocolError(f"job {self._job_id}: the agent answered a binary poll without its payload sizes")
        n_out, n_err = r.payload_sizes
        if r.stdout or r.stderr or (payload is None and n_out + n_err) or (payload and len(payload) != n_out + n_err):
            raise ProtocolError(
                f"job {self._job_id}: poll payload of {0 if payload is None else len(payload)} bytes "
                f"(and {len(r.stdout) + len(r.stderr)} characters of text), expected {n_out + n_err} bytes"
            )
        for n, before, after, dropped, stream in (
            (n_out, self._offsets[0], r.stdout_offset, r.stdout_dropped, "stdout"),
            (n_err, self._offsets[1], r.stderr_offset, r.stderr_dropped, "stderr"),
        ):
            if (r.stdout_truncated, r.stderr_truncated)[stream == "stderr"] > dropped:
                raise ProtocolError(f"job {self._job_id}: more {stream} bytes truncated than dropped")
            if after != before + n + dropped:
                raise ProtocolError(
                    f"job {self._job_id}: the agent moved the {stream} cursor from {before} to {after} "
                    f"with {n} bytes and {dropped} dropped"
                )
        advanced = max(r.stdout_offset - self._offsets[0], r.stderr_offset - self._offsets[1])
        if advanced * 10 >= self._max_bytes * 9:
            # A fast producer: fewer, bigger polls halve the per-request overhead each step.
            self._max_bytes = min(self._max_bytes * 2, MAX_POLL_BYTES)
        b64 = self.options.encoding == "base64"
        view = payload if payload is not None else memoryview(b"")
        for piece, dropped, lost, tail, event in (
            (view[:n_out], r.stdout_dropped, r.stdout_truncated, self._tails[0], StdoutChunk),
            (view[n_out:], r.stderr_dropped, r.stderr_truncated, self._tails[1], StderrChunk),
        ):
            tail.dropped += dropped
            if lost:  # told in order: before what the job wrote after its truncation
                self._queue.append(StreamTruncated("stdout" if event is StdoutChunk else "stderr", lost))
            if not piece:
                continue
            # The agent cut text on a character boundary; "replace" matches its JSON path.
            data: str | bytes
            if b64:  # the payload itself when it is all one stream's (it is bytes: no copy)
                whole = type(piece.obj) is bytes and len(piece) == len(piece.obj)
                data = piece.obj if whole else bytes(piece)  # type: ignore[assignment]
            else:
                data = str(piece, "utf-8", "replace")
            tail.add(data)
            self._queue.append(event(data))
            self._queued += len(data)
        self._offsets = [r.stdout_offset, r.stderr_offset]
        if r.hits > self._hits:  # a poll may bring hits without output: no event says so
            self._hits = r.hits
            for listener in list(self._hit_listeners):
                listener(r.hits)
        if r.state == "running":
            return
        self._final = r
        if r.state == "timed_out":
            self._timeout_error = ExecTimeoutError(
                f"job {self._job_id} timed out after {self.options.timeout} s and was killed",
                job_id=self._job_id,
                result=self._result(),
            )
        else:
            tails = self._tails[0].value(), self._tails[1].value()
            self._queue.append(Completed(self._exit_code(), *tails, reason=r.reason))
            self._ended = True

    def _exit_code(self) -> int:
        return self._final.exit_code if self._final is not None and self._final.exit_code is not None else -1

    def _result(self) -> ExecResult:
        state = self._final.state if self._final is not None else "running"
        code = self._exit_code()
        return ExecResult(
            success=code == 0 and state == "completed",
            returncode=code,
            stdout=self._tails[0].value(),
            stderr=self._tails[1].value(),
            stdout_truncated=self._tails[0].dropped,
            stderr_truncated=self._tails[1].dropped,
            job_id=self._job_id or "",
            state=state,
            reason=self._final.reason if self._final is not None else None,
        )

    async def wait(self) -> ExecResult:
        """Run to the end, consuming the remaining events; return the result.

        Cancelling ``wait()`` kills the job.

        :raises ExecTimeoutError: the job's timeout expired (``.result`` holds the partial output).
        :raises JobKilledError: this handle killed the job.
        """
        while True:  # not `async for`: wait() after a finished iteration returns the result
            try:
                await self.__anext__()
            except StopAsyncIteration:
                break
        if self._killed:
            raise JobKilledError(f"job {self._job_id} was killed by this handle", job_id=self._job_id)
        return self._result()

    # -- control --------------------------------------------------------------------------

    async def write_stdin(self, data: str | bytes) -> None:
        """Write to the job's stdin (needs ``stdin_open=True``, or ``tty``: keystrokes, appended
        after any other viewer's). A retried write is never doubled.

        Cancelling it may leave a prefix of ``data`` delivered (what the agent had taken); the
        job and its stdin stay as they were.

        :raises JobNotRunningError: stdin is closed or the job ended.
        """
        await self._write(data, eof=False)

    async def close_stdin(self) -> None:
        """Close the job's stdin (EOF); a no-op once the job has ended or its stdin is closed. On a
        ``tty`` job it types the terminal's end-of-file key (Ctrl-D) instead, as a typist would.

        Cancelling it leaves stdin open or closed, whichever the agent got; call it again.
        """
        with contextlib.suppress(JobNotRunningError):  # ended, or stdin closed: EOF either way
            await self._write(b"", eof=True)

    async def _write(self, data: str | bytes, eof: bool) -> None:
        raw = data.encode() if isinstance(data, str) else data
        if self.options.encoding == "utf-8":
            _text(raw)  # the same check, and error, as the job's input
        # One write at a time on this handle's cursor: two at once would both start from the same
        # offset, and the agent would take the second for a retry of the first and drop it. The
        # lock is taken before anything is awaited (asyncio's lock serves waiters first come,
        # first served), so writes go in the order they were called: writes called before the
        # job's start had come back once went after later ones that found it started (soak).
        async with self._stdin_lock:
            await self.started()
            assert self._job_id is not None
            await self._write_at_cursor(raw, eof, self._writer if self.options.tty else None)

    async def _write_at_cursor(self, raw: bytes, eof: bool, writer: str | None) -> None:
        assert self._job_id is not None
        # The agent takes what fits its memory budget and says where its stdin cursor is now; the
        # rest goes again from there (each call waits a while in the agent when nothing fits).
        # Chunks keep each request small enough for an agent with a small budget to take in.
        start = self._stdin_offset
        while True:
            done = self._stdin_offset - start
            chunk = raw[done : done + STDIN_CHUNK]
            last = done + len(chunk) == len(raw)
            params = WriteStdinParams(job_id=self._job_id, offset=self._stdin_offset, eof=eof and last, writer=writer)
            answer = await self._rpc.call(
                Method.EXEC_REMOTE_WRITE_STDIN, params, WriteStdinResult, payload=chunk if chunk else None
            )
            if answer.stdin_bytes is None:  # an agent that takes everything
                self._stdin_offset += len(chunk)
            else:
                self._stdin_offset = max(self._stdin_offset, min(answer.stdin_bytes, start + len(raw)))
            if self._stdin_offset - start >= len(raw):  # the call that took the last byte applied eof
                break

    async def resize(self, cols: int, rows: int) -> None:
        """Set the terminal size of a ``tty`` job; its foreground program gets SIGWINCH.

        Cancelling it abandons the answer; the agent may still apply the size.

        :raises JobNotRunningError: the job ended, or is not a ``tty`` job.
        """
        await self.started()
        assert self._job_id is not None
        await self._rpc.call(Method.EXEC_REMOTE_RESIZE, ResizeParams(job_id=self._job_id, cols=cols, rows=rows), Empty)

    async def signal(self, sig: int | str) -> None:
        """Send a signal (``"SIGINT"``, ``signal.SIGUSR1``...) to the job's process group.

        Cancelling it abandons the answer; the signal may still be delivered by the agent.
        """
        await self.started()
        assert self._job_id is not None
        name: int | str = sig.name if isinstance(sig, _signal.Signals) else sig
        await self._rpc.call(Method.EXEC_REMOTE_SIGNAL, SignalParams(job_id=self._job_id, signal=name), Empty)

    async def kill(self, grace: float | None = None) -> None:
        """Stop the job: SIGTERM to its group, SIGKILL after ``grace`` (default ``kill_grace``).

        Means "not interested": iteration stops and buffered output is discarded. Returns once
        every process of the job is gone, descendants in their own session included. On an
        ended job it ends the job's leftovers (``sleep 300 &`` in a finished script); a second
        ``kill()`` waits for the first. Cancelling ``kill()`` does not stop the kill, which
        completes in the agent.
        """
        if self._kill_task is None:
            if self._ended:
                await self._do_kill(grace)  # leftovers only: the result stays what it was
                return
            self._killed = True
            self._queue.clear()
            self._queued = 0
            if self._follower is not None:
                self._follower.cancel()
            self._kill_task = asyncio.get_running_loop().create_task(self._do_kill(grace))
        await asyncio.shield(self._kill_task)

    async def _do_kill(self, grace: float | None) -> None:
        await self.started()
        assert self._job_id is not None
        grace = self.options.kill_grace if grace is None else grace
        await self._rpc.call(
            Method.EXEC_REMOTE_KILL,
            KillParams(job_id=self._job_id, grace=grace),
            KillResult,
            timeout=grace + self._margin,
        )

    async def stats(self, *, window: float = 0.5) -> JobStats:
        """CPU %, RSS, threads, I/O bytes and process count of the job's whole process tree.

        The CPU rate is since the previous reading of this job (by any client) if within 30 s,
        else measured over ``window`` seconds (at most 5) first. Only reads: cancelling it
        changes nothing.

        :raises JobNotFoundError: the job was released or expired.
        :raises SpawnError: the command could not be started.
        """
        await self.started()
        assert self._job_id is not None
        params = JobStatsParams(job_id=self._job_id, window=window)
        return await self._rpc.call(Method.JOB_STATS, params, JobStats)

    @property
    def hits(self) -> int:
        """Watch-rule matches of the job (its policy's ``on_output``) as of the last poll read;
        ``sb.jobs()`` lists them (rule, stream, byte offset, time)."""
        return self._hits

    def on_hit(self, listener: Callable[[int], None]) -> Callable[[], None]:
        """Call ``listener`` with the new :attr:`hits` whenever a poll brings more (a rule may fire
        with no new output, so no event comes with it). It runs on the event loop that polls
        and must not block. Returns the function that stops it."""
        self._hit_listeners.append(listener)

        def stop() -> None:
            if listener in self._hit_listeners:
                self._hit_listeners.remove(listener)

        return stop

    async def tail(self, n_bytes: int, stream: Literal["stdout", "stderr"] = "stdout") -> OutputSlice:
        """The last ``n_bytes`` of the job's ``stream`` (its log on disk), whatever this handle has
        read; moves no cursor. Cancelling abandons the read.

        :raises JobNotFoundError: the job was forgotten.
        """
        await self.started()
        assert self._job_id is not None
        return await read_output(self._rpc, self._job_id, stream, tail=n_bytes, max_bytes=max(1, n_bytes))

    async def release(self) -> None:
        """Tell the agent to forget the job (killing it if it still runs).

        Cancelling it abandons the answer; the agent may still release (and kill) the job.
        """
        await self.started()
        assert self._job_id is not None
        self._killed = self._killed or not self._ended
        await self._rpc.call(Method.EXEC_REMOTE_RELEASE, JobIdParams(job_id=self._job_id), Empty)

    def detach(self) -> str | None:
        """Stop tracking the job and leave it running; return its id (for ``attach`` later)."""
        self._detached = True
        return self._job_id

    @property
    def done(self) -> bool:
        """True once the end was read, or the job was killed or detached through this handle."""
        return self._ended or self._killed or self._detached

    def __repr__(self) -> str:
        state = "killed" if self._killed else self._final.state if self._final else "running"
        return f"<ExecRemoteProcess job_id={self._job_id!r} pid={self._pid} {state}>"


# -- construction: the sandbox, its shells and attach make handles with these (module functions, so
# the handle's private state is only ever set here, beside the class) ----------------------------


def launch(rpc: RpcClient, command: list[str] | str, options: ExecRemoteOptions, margin: float) -> ExecRemoteProcess:
    """A handle on ``command``, whose ``exec_remote_start`` is sent now (the handle is "hot")."""
    raw_input = options.input.encode() if isinstance(options.input, str) else options.input
    if raw_input is not None and options.encoding == "base64":
        wire_input: str | None = base64.b64encode(raw_input).decode()
    else:
        wire_input = _text(raw_input) if raw_input is not None else None
    params = StartParams(
        command=command,
        cwd=options.cwd,
        env=options.env,
        user=options.user,
        input=wire_input,
        stdin_open=options.stdin_open,
        timeout=options.timeout,
        kill_grace=options.kill_grace,
        encoding=options.encoding,
        label=options.label,
        tags=options.tags,
        idempotency_key=secrets.token_hex(8),
        job_id=new_job_id(),
        output_cap=options.output_cap,
        tty=options.tty,
        tty_size=None if options.tty_size is None else TtySize(cols=options.tty_size[0], rows=options.tty_size[1]),
        policy=options.policy,
    )
    # A start whose answer is lost is retried by the RPC layer with these same params: under the
    # same id, which the agent answers with the job the first attempt made.
    start = rpc.call(Method.EXEC_REMOTE_START, params, StartResult)
    return starting(rpc, start, options, margin, job_id=params.job_id)


def new_job_id() -> str:
    """A fresh job id of the safe form: ``j`` and 16 random hex digits (64 bits: no two starts
    of one agent collide in practice, and the agent refuses a clash with another command)."""
    return "j" + secrets.token_hex(8)


def starting(
    rpc: RpcClient,
    start: Coroutine[Any, Any, StartResult],
    options: ExecRemoteOptions,
    margin: float,
    job_id: str | None = None,
) -> ExecRemoteProcess:
    """A handle on the job that ``start`` (an RPC answering with its id) is starting now, under
    ``job_id`` if the client chose it (None: the agent's answer names it)."""
    proc = ExecRemoteProcess(rpc, options, response_margin=margin)
    proc._job_id = job_id
    if options.input is not None and not options.tty:  # queued first: our writes continue after it
        # (a terminal's typed-ahead input is no typist's: this handle's own bytes start at 0)
        proc._stdin_offset = len(options.input.encode() if isinstance(options.input, str) else options.input)
    task = asyncio.get_running_loop().create_task(_checked(start, job_id))
    task.add_done_callback(proc._on_started)
    proc._start_task = task
    return proc


def attached(
    rpc: RpcClient,
    info: JobInfo,
    options: ExecRemoteOptions,
    margin: float,
    offsets: tuple[int, int] | None = None,
) -> ExecRemoteProcess:
    """A handle on the running or retained job ``info`` that someone else started, following
    from ``offsets`` (stdout's, stderr's) or from the start."""
    if offsets is not None and min(offsets) < 0:
        raise ValueError(f"offsets are byte cursors >= 0, not {offsets}")
    proc = ExecRemoteProcess(rpc, options, response_margin=margin)
    proc._job_id, proc._pid = info.job_id, info.pid
    if offsets is not None:
        proc._offsets = list(offsets)
    proc.info = info
    # Our writes continue where the job's stdin is; at a terminal, a new typist's own bytes at 0.
    proc._stdin_offset = 0 if options.tty else info.stdin_bytes
    proc.kill_on_cancel = False  # someone else's job: interrupting the watcher must not kill it
    return proc


async def kill_quietly(proc: ExecRemoteProcess) -> None:
    """Kill ``proc``, giving up after its grace and a response margin; errors are swallowed
    (whoever calls this is on a way out that matters more: a cancellation, a close)."""
    try:
        with anyio.move_on_after(proc.options.kill_grace + proc._margin):
            await proc.kill()
    except Exception:
        pass


async def _checked(start: Coroutine[Any, Any, StartResult], job_id: str | None) -> StartResult:
    """``start``'s answer, which must name the id the client chose (its form was checked as
    the answer was parsed: ``StartResult.job_id`` is of the safe form)."""
    res = await start
    if job_id is not None and res.job_id != job_id:
        raise ProtocolError(f"the agent started job {job_id} under another id, refused: {res.job_id!r}")
    return res


def _text(raw: bytes) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise ValueError("input is not valid UTF-8: use encoding='base64' to send bytes") from None
