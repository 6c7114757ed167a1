"""Channels: ways to carry one JSON-RPC request body to the agent and its response back.

- :class:`SocketChannel` talks HTTP to the agent's Unix socket directly (``local://``).
- :class:`StdioChannel` holds ONE persistent ``remote-exec-agent stdio`` process in the sandbox
  and multiplexes every request over its pipes, matched by id.
- :class:`CallChannel` runs one ``remote-exec-agent call`` per request: the fallback for
  transports that cannot hold a stream open.

A channel reports a broken transport as :class:`ChannelBroken` (retry after :meth:`reconnect`)
and a missing response as :class:`TimeoutError` (retry as is); :class:`RpcClient` does both.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

import aiohttp

from ..errors import ProtocolError, TransportError
from ..protocol import frames

__all__ = [
    "CallChannel",
    "Channel",
    "ChannelBroken",
    "PipeProcess",
    "PipeReader",
    "PipeWriter",
    "SocketChannel",
    "SpawnFn",
    "StdioChannel",
]

MAX_RESPONSE = 160 * 1024 * 1024
"""Largest response accepted from a sandbox (a 64 MiB poll of worst-case escaped text fits)."""


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

SpawnFn = Callable[[], Awaitable[PipeProcess]]
_ID_PREFIX = re.compile(rb'^\{"jsonrpc":"2\.0","id":(\d+),')


class ChannelBroken(TransportError):
    """The channel's transport failed; the request may be retried after ``reconnect()``."""


class Channel(ABC):
    """Carries request bodies to the agent. Implementations must be safe for concurrent use."""

    @abstractmethod
    async def request(self, body: bytes, request_id: int, timeout: float) -> bytes:
        """Send ``body`` and return the response body.

        :raises ChannelBroken: the transport failed (reconnect, then retry).
        :raises TimeoutError: no response within ``timeout`` seconds (the request or its
            response may be lost; retrying an idempotent request is safe).
        """

    async def reconnect(self) -> None:
        """Re-establish the transport after :class:`ChannelBroken`."""

    async def aclose(self) -> None:
        """Release the transport. Requests in flight fail with :class:`ChannelBroken`."""


class SocketChannel(Channel):
    """HTTP over the agent's Unix socket; ``on_unavailable`` (re)starts the agent."""

    def __init__(self, path: Path, on_unavailable: Callable[[], Awaitable[None]]) -> None:
        self._path = path
        self._on_unavailable = on_unavailable
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=os.fspath(self._path), limit=0),
                timeout=aiohttp.ClientTimeout(total=None),
                headers={"Content-Type": "application/json"},
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
            )
        return self._session

    async def request(self, body: bytes, request_id: int, timeout: float) -> bytes:
        try:
            async with asyncio.timeout(timeout):
                async with self._get_session().post(
                    "http://agent/rpc", data=body if len(body) < 1 << 20 else io.BytesIO(body)
                ) as resp:
                    if resp.content_length is not None and resp.content_length > MAX_RESPONSE:
                        raise ProtocolError(f"response of {resp.content_length} bytes is over the limit")
                    return (
                        await resp.content.readexactly(resp.content_length)
                        if resp.content_length
                        else await resp.read()
                    )
        except (aiohttp.ClientConnectionError, asyncio.IncompleteReadError, ConnectionError) as exc:
            raise ChannelBroken(f"agent socket {self._path}: {exc or type(exc).__name__}") from exc

    async def reconnect(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        await self._on_unavailable()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


class StdioChannel(Channel):
    """One persistent ``stdio`` relay process; responses are matched to requests by id."""

    def __init__(self, spawn: SpawnFn) -> None:
        self._spawn = spawn
        self._proc: PipeProcess | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[bytes]] = {}
        self._write_lock = asyncio.Lock()
        self._open_lock = asyncio.Lock()
        self._broken: str | None = None

    @property
    def process(self) -> PipeProcess | None:
        """The relay process currently in use (tests kill it to simulate a dropped channel)."""
        return self._proc

    async def _ensure_open(self) -> PipeProcess:
        async with self._open_lock:
            if self._proc is None:
                self._proc = await self._spawn()
                self._broken = None
                self._reader_task = asyncio.get_running_loop().create_task(self._read_loop(self._proc))
            return self._proc

    async def request(self, body: bytes, request_id: int, timeout: float) -> bytes:
        proc = await self._ensure_open()
        if self._broken is not None:
            raise ChannelBroken(self._broken)
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = fut
        try:
            assert proc.stdin is not None
            async with self._write_lock:
                try:
                    proc.stdin.write(body)  # two writes, not a concatenation: no copy of a big payload
                    proc.stdin.write(b"\n")
                    await proc.stdin.drain()
                except (ConnectionError, RuntimeError) as exc:
                    raise ChannelBroken(f"channel stdin closed: {exc}") from exc
            async with asyncio.timeout(timeout):
                return await fut
        finally:
            self._pending.pop(request_id, None)
            if fut.done() and not fut.cancelled():
                fut.exception()  # the channel broke while this request was still being written: seen

    def _deliver(self, frame: bytes) -> None:
        """Hand one response frame to the request waiting for it (unknown ids are dropped)."""
        line = frame
        if frame.startswith(frames.MARK):
            line = frames.split(frame)[0]
        m = _ID_PREFIX.match(line)
        if m is not None:
            request_id = int(m.group(1))
        else:  # not our server's canonical form: parse it properly
            try:
                request_id = json.loads(line).get("id")
            except (ValueError, AttributeError):
                return
        fut = self._pending.get(request_id) if isinstance(request_id, int) else None
        if fut is not None and not fut.done():
            fut.set_result(frame)

    async def _read_loop(self, proc: PipeProcess) -> None:
        assert proc.stdout is not None
        why = "channel closed by the sandbox"
        try:
            while True:
                try:
                    frame = await frames.read_frame(proc.stdout, MAX_RESPONSE)
                except frames.FrameError as exc:
                    why = f"the sandbox sent a bad frame: {exc}"
                    break
                except ValueError:
                    why = f"the sandbox sent a line over {MAX_RESPONSE} bytes"
                    break
                except asyncio.IncompleteReadError:
                    break
                if frame is None:
                    break
                self._deliver(frame)
        finally:
            self._broken = why
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(ChannelBroken(why))

    async def reconnect(self) -> None:
        await self._close_proc()

    async def _close_proc(self, grace: float = 0.0) -> None:
        async with self._open_lock:
            proc, self._proc = self._proc, None
            if proc is None:
                return
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
        await self._close_proc(grace=CLOSE_GRACE)


class CallChannel(Channel):
    """One ``remote-exec-agent call`` process per request (for transports without streams)."""

    def __init__(self, spawn: SpawnFn) -> None:
        self._spawn = spawn

    async def request(self, body: bytes, request_id: int, timeout: float) -> bytes:
        proc = await self._spawn()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            async with asyncio.timeout(timeout):
                proc.stdin.write(body)
                await proc.stdin.drain()
                proc.stdin.close()
                out = await proc.stdout.read()
                code = await proc.wait()
        finally:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        if not out.strip():
            raise ChannelBroken(f"agent call exited {code} without a response")
        return out.strip()
