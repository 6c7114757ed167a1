"""Channels: ways to carry one JSON-RPC request body to the agent and its response back.

- :class:`StdioChannel` holds ONE persistent ``remote-exec-agent stdio`` process in the sandbox
  and multiplexes every request over its pipes as frames (:mod:`remote_exec.protocol.frames`),
  matched by id.
- :class:`~remote_exec.client.socketchannel.SocketChannel` is the same over one connection to
  the agent's frame-stream socket, with no relay process (``local://``).
- :class:`~remote_exec.client.callchannel.CallChannel` runs one ``remote-exec-agent call`` per
  request: the fallback for transports that cannot hold a stream open.

A channel reports a broken transport as :class:`ChannelBroken` (retry after :meth:`reconnect`)
and a missing response as :class:`TimeoutError` (retry as is); :class:`RpcClient` does both.

The persistent channels send a heartbeat (:data:`~remote_exec.protocol.HEARTBEAT`) whenever
nothing arrived for :attr:`Liveness.interval`, idle or not: every frame received counts as a
sign of life, so a busy channel sends none. When nothing at all arrived for
:attr:`Liveness.timeout`, the agent is declared unresponsive: every request in flight fails
with :class:`AgentUnresponsiveError` and the transport is torn down, so the next request
starts afresh. The agent stamps each connection with the time it last heard from it (the
other direction: :class:`remote_exec.agent.stream.Peer`).

Each channel keeps its :class:`~remote_exec.client.link.Link` up to date (connected on every
frame after trouble, reconnecting when the transport broke, lost when the agent went silent,
closed), so views can show it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from ..errors import AgentUnresponsiveError, ChannelBroken, ProtocolError, SandboxClosedError
from ..protocol import HEARTBEAT, MAX_CHUNK, PUSH, frames
from .link import Link

__all__ = [
    "Channel",
    "ChannelBroken",
    "Liveness",
    "OnPush",
    "PipeProcess",
    "PipeReader",
    "PipeWriter",
    "SpawnFn",
    "StdioChannel",
]

MAX_RESPONSE = MAX_CHUNK + 1024 * 1024
"""Largest frame part (JSON line or payload) a channel reads from a sandbox: a file chunk's
payload fits. A longer one breaks the channel with a :class:`ProtocolError` for the requests
in flight; :class:`RpcClient` then bounds each response far tighter, per method, before
parsing it."""


class PipeWriter(Protocol):
    """The writing end of a process's stdin (an asyncio ``StreamWriter`` is one)."""

    def write(self, data: bytes) -> None: ...
    async def drain(self) -> None: ...
    def close(self) -> None: ...


class PipeReader(Protocol):
    """The reading end of a process's stdout (an asyncio ``StreamReader`` is one)."""

    async def readline(self) -> bytes: ...
    async def readexactly(self, n: int) -> bytes: ...
    async def read(self, n: int = -1) -> bytes: ...


class PipeProcess(Protocol):
    """A process in the sandbox with pipes: ``asyncio.subprocess.Process`` or an SSH channel.

    Its stdout reader must accept lines up to :data:`MAX_RESPONSE` bytes.
    """

    @property
    def stdin(self) -> PipeWriter | None: ...
    @property
    def stdout(self) -> PipeReader | None: ...
    def kill(self) -> None: ...
    async def wait(self) -> int: ...


CLOSE_GRACE = 1.0
"""Seconds :meth:`StdioChannel.aclose` lets the relay finish after EOF before killing it."""

# A request up to this size goes with its newline in one write (one send, one wakeup of the
# agent; it read the request, found no newline, and slept until the next send); a bigger one
# (a payload) in two, not copied to be joined.
_JOIN_NEWLINE = 64 * 1024

SpawnFn = Callable[[], Awaitable[PipeProcess]]
_ID_PREFIX = re.compile(rb'^\{"jsonrpc":"2\.0","id":(\d+),')
_PUSH_PREFIX = re.compile(rb'^\{"jsonrpc":"2\.0","method":"exec_remote_push","params":\{"call":(\d{1,18}),')


@dataclass(frozen=True)
class Liveness:
    """How a channel notices a silent agent: a heartbeat after ``interval`` seconds without a
    frame, and the agent declared unresponsive after ``timeout`` seconds without one.

    A freeze is noticed within ``interval + timeout`` seconds (:attr:`bound`) of the last frame.
    """

    interval: float = 2.0
    timeout: float = 6.0

    @classmethod
    def within(cls, bound: float) -> Liveness:
        """The liveness that notices a silent agent within ``bound`` seconds."""
        if not 0 < bound < math.inf:  # nan too: a heartbeat that never waits would spin
            raise ValueError(f"liveness must be a positive number of seconds, not {bound!r}")
        return cls(interval=bound / 4, timeout=bound * 3 / 4)

    @property
    def bound(self) -> float:
        """Seconds from the last frame received until a silent agent is declared unresponsive."""
        return self.interval + self.timeout


DEFAULT_LIVENESS = Liveness()


OnPush = Callable[[frames.Frame], None]
"""Takes one push frame of a request (see :mod:`remote_exec.protocol.follow`), in order, on the
channel's reading task; an exception it raises fails the request with it."""


class Channel(ABC):
    """Carries request bodies to the agent. Implementations must be safe for concurrent use.

    :ivar link: the channel's state, for views (the RPC client sets ``gone`` and ``lost`` too).
    :ivar pushes: whether a request may be answered with push frames before its response (a
        persistent channel); else the caller polls.
    """

    pushes = False

    def __init__(self) -> None:
        self.link = Link()

    @abstractmethod
    async def request(
        self, body: bytes, request_id: int, timeout: float, on_push: OnPush | None = None
    ) -> frames.Frame:
        """Send ``body`` (one frame) and return the response, split into message and payload.

        ``on_push`` (channels with :attr:`pushes`) takes the push frames the agent sends for
        this request before its response; each one restarts ``timeout``, which then bounds
        the silence between frames rather than the whole call.

        :raises ChannelBroken: the transport failed (reconnect, then retry).
        :raises TimeoutError: no response within ``timeout`` seconds (the request or its
            response may be lost; retrying an idempotent request is safe).
        :raises ProtocolError: the response is not a well-formed frame.
        """

    async def reconnect(self) -> None:
        """Re-establish the transport after :class:`ChannelBroken`."""

    async def aclose(self) -> None:
        """Release the transport. Requests in flight fail with :class:`ChannelBroken`."""


@dataclass
class _Taker:
    """A request's push taker, and the response deadline each push restarts."""

    on_push: OnPush
    timeout: float
    deadline: asyncio.Timeout | None = None


class StdioChannel(Channel):
    """One persistent ``stdio`` relay process; responses are matched to requests by id."""

    pushes = True

    def __init__(self, spawn: SpawnFn, liveness: Liveness | None = DEFAULT_LIVENESS) -> None:
        super().__init__()
        self._spawn = spawn
        self._proc: PipeProcess | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._liveness = liveness
        self._last_frame = 0.0
        self._pending: dict[int, asyncio.Future[frames.Frame]] = {}
        self._pushed: dict[int, _Taker] = {}  # request id -> what takes its pushes
        self._write_lock = asyncio.Lock()
        self._open_lock = asyncio.Lock()
        self._broken: str | None = None
        self._broken_by_sandbox = False  # a bad frame: the requests in flight fail as ProtocolError
        self._closed = False

    @property
    def liveness(self) -> Liveness | None:
        """The heartbeat's timing (``None``: none; the per-call deadlines alone then bound a
        wait). A change applies at once, to the connection open now too: a transport that asks
        something while it opens (ssh://'s probe) connects before the sandbox sets its own."""
        return self._liveness

    @liveness.setter
    def liveness(self, value: Liveness | None) -> None:
        self._liveness = value
        task = self._heartbeat_task
        if value is not None and self._proc is not None and (task is None or task.done()):
            self._heartbeat_task = asyncio.get_running_loop().create_task(self._heartbeat(self._proc))

    @property
    def process(self) -> PipeProcess | None:
        """The relay process currently in use (tests kill it to simulate a dropped channel)."""
        return self._proc

    async def _ensure_open(self) -> PipeProcess:
        async with self._open_lock:
            if self._closed:  # after aclose() nothing may start a relay (or an agent) again
                raise SandboxClosedError("the channel is closed")
            if self._proc is None:
                self._proc = await self._spawn()
                self._broken = None
                self._broken_by_sandbox = False
                loop = asyncio.get_running_loop()
                self._last_frame = loop.time()
                self._reader_task = loop.create_task(self._read_loop(self._proc))
                if self._liveness is not None:
                    self._heartbeat_task = loop.create_task(self._heartbeat(self._proc))
            return self._proc

    async def request(
        self, body: bytes, request_id: int, timeout: float, on_push: OnPush | None = None
    ) -> frames.Frame:
        proc = await self._ensure_open()
        if self._broken is not None:
            raise ChannelBroken(self._broken)
        fut: asyncio.Future[frames.Frame] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = fut
        taker = _Taker(on_push, timeout) if on_push is not None else None
        if taker is not None:  # before the write: the first push may come while it drains
            self._pushed[request_id] = taker
        try:
            assert proc.stdin is not None
            async with self._write_lock:
                try:
                    if len(body) <= _JOIN_NEWLINE:  # one send: the agent wakes once per request
                        proc.stdin.write(body + b"\n")
                    else:  # two writes, not a concatenation: no copy of a big payload
                        proc.stdin.write(body)
                        proc.stdin.write(b"\n")
                    await proc.stdin.drain()
                except (ConnectionError, RuntimeError) as exc:
                    raise ChannelBroken(f"channel stdin closed: {exc}") from exc
            async with asyncio.timeout(timeout) as deadline:
                if taker is not None:
                    taker.deadline = deadline
                return await fut
        finally:
            self._pending.pop(request_id, None)
            self._pushed.pop(request_id, None)
            if fut.done() and not fut.cancelled():
                fut.exception()  # the channel broke while this request was still being written: seen

    def _deliver(self, frame: frames.Frame) -> None:
        """Hand one response frame to the request waiting for it (unknown ids are dropped)."""
        line = frame.message
        m = _ID_PREFIX.match(line)
        if m is not None:
            request_id = int(m.group(1))
        elif (p := _PUSH_PREFIX.match(line)) is not None:
            self._push(int(p.group(1)), frame)
            return
        else:  # not our server's canonical form: parse it properly
            try:
                message = json.loads(line)
                request_id = message.get("id")
                if request_id is None and message.get("method") == PUSH:
                    call = message.get("params", {}).get("call")
                    if type(call) is int:
                        self._push(call, frame)
                    return
            except (ValueError, AttributeError, RecursionError):
                return
        fut = self._pending.get(request_id) if isinstance(request_id, int) else None
        if fut is not None and not fut.done():
            fut.set_result(frame)

    def _push(self, request_id: int, frame: frames.Frame) -> None:
        """Hand a push to its request's taker (one for a request no longer waiting is dropped:
        a follow given up on, whose client follows again from its own cursors)."""
        taker = self._pushed.get(request_id)
        fut = self._pending.get(request_id)
        if taker is None or fut is None or fut.done():
            return
        if taker.deadline is not None:
            taker.deadline.reschedule(asyncio.get_running_loop().time() + taker.timeout)
        try:
            taker.on_push(frame)
        except Exception as exc:  # the taker refused it (a lying agent): the request fails with that
            self._pushed.pop(request_id, None)
            fut.set_exception(exc)

    async def _read_loop(self, proc: PipeProcess) -> None:
        assert proc.stdout is not None
        why = "channel closed by the sandbox"
        try:
            while True:
                try:
                    frame = await frames.read_frame(proc.stdout, MAX_RESPONSE)
                except frames.FrameError as exc:
                    why = f"the sandbox sent a bad frame: {exc}"
                    self._broken_by_sandbox = True
                    break
                except ValueError:
                    why = f"the sandbox sent a line over {MAX_RESPONSE} bytes"
                    self._broken_by_sandbox = True
                    break
                except (asyncio.IncompleteReadError, ConnectionError):  # a reset socket: the stream ended
                    break
                if frame is None:
                    break
                self._last_frame = asyncio.get_running_loop().time()
                if self.link.state != "connected":  # the first sign of life after trouble
                    self.link.set("connected")
                self._deliver(frame)
        finally:
            self._broken = why
            if self.link.state in ("connecting", "connected") and not self._closed:
                self.link.set("reconnecting", why)  # lost/gone stay: a broken pipe says no more
            # A broken pipe is retried after a reconnect; a sandbox breaking the protocol is not:
            # it would only send the same again.
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(ProtocolError(why) if self._broken_by_sandbox else ChannelBroken(why))

    async def _heartbeat(self, proc: PipeProcess) -> None:
        """Ping while ``proc`` is the channel's; declare the agent unresponsive when silent.
        Each turn takes :attr:`liveness` as it is now (``None``: the heartbeat stops).

        Cancelled by the teardown of ``proc``; it ends by itself once ``proc`` is replaced.
        """
        loop = asyncio.get_running_loop()
        assert proc.stdin is not None
        while self._proc is proc and self._broken is None:
            if self._liveness is None:
                return
            # A timer, not synchronisation: "nothing arrived for a while" has no event of its own.
            await asyncio.sleep(self._liveness.interval)
            liveness = self._liveness
            if self._proc is not proc or self._broken is not None or liveness is None:
                return
            quiet = loop.time() - self._last_frame
            # Not before the first answer ever (the link still "connecting"): a cold agent on a
            # loaded machine takes longer than a short bound to start, and the open has its own
            # deadline (open_timeout). Once it has answered, silence past the bound is a freeze.
            if quiet >= liveness.timeout and self.link.state != "connecting":
                await self._lose(proc, quiet, liveness)
                return
            if quiet >= liveness.interval * 0.9 and not self._write_lock.locked():
                # A writer in progress is traffic out; only traffic in says the agent lives. The
                # ping must not wait behind it (a frozen agent can stall that write for ever).
                with contextlib.suppress(ConnectionError, RuntimeError, TimeoutError):
                    async with self._write_lock, asyncio.timeout(liveness.interval):
                        proc.stdin.write(HEARTBEAT + b"\n")
                        await proc.stdin.drain()

    async def _lose(self, proc: PipeProcess, quiet: float, liveness: Liveness) -> None:
        why = (
            f"the agent answered nothing, not even a heartbeat, for {quiet:.1f} s "
            f"(liveness bound {liveness.bound:g} s): it is frozen, paused or cut off"
        )
        self._broken = why
        self.link.set("lost", why)
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(AgentUnresponsiveError(why))
        # Torn down, so the next request starts a new relay (or connection, or SSH session):
        # the old one may be stuck in a frozen container or on a dead link.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(liveness.timeout):
                await self._close_proc()

    async def reconnect(self) -> None:
        await self._close_proc()

    async def _close_proc(self, grace: float = 0.0) -> None:
        async with self._open_lock:
            proc, self._proc = self._proc, None
            if proc is None:
                return
            heartbeat, self._heartbeat_task = self._heartbeat_task, None
            if heartbeat is not None and heartbeat is not asyncio.current_task():
                heartbeat.cancel()
            if proc.stdin is not None:
                proc.stdin.close()
            # At EOF the relay exits by itself and the host-side process (`nsenter`, `docker
            # exec`) reaps it; killing that process first would orphan the relay in the sandbox.
            if grace > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(grace):
                        await proc.wait()
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            if self._reader_task is not None:
                await self._reader_task

    async def aclose(self) -> None:
        self._closed = True
        self.link.set("closed")
        await self._close_proc(grace=CLOSE_GRACE)
