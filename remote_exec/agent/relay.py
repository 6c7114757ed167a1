"""Relays from the agent CLI to the server's Unix socket: one-shot (``call``) and persistent (``stdio``)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import io
import json
import os
import sys
from pathlib import Path

import aiohttp

from ..errors import AgentUnavailableError, RemoteExecError
from ..protocol import frames
from .server import MAX_REQUEST

__all__ = ["relay_call", "relay_stdio"]

_URL = "http://agent/rpc"


def _session(sock: Path) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.UnixConnector(path=os.fspath(sock), limit=0),
        timeout=aiohttp.ClientTimeout(total=None),
        headers={"Content-Type": "application/json"},
    )


def _error_line(line: bytes, exc: RemoteExecError) -> bytes:
    try:
        id_ = json.loads(frames.split(line)[0]).get("id")
    except (ValueError, AttributeError):
        id_ = None
    err = {"code": exc.code, "message": exc.message}
    return json.dumps({"jsonrpc": "2.0", "id": id_, "error": err}, separators=(",", ":")).encode()


async def relay_call(sock: Path, body: bytes) -> int:
    """POST one request; print the response. Exit status 3 if the server cannot be reached."""
    async with _session(sock) as session:
        try:
            async with session.post(_URL, data=body if len(body) < 1 << 20 else io.BytesIO(body)) as resp:
                answer = await resp.read()
        except aiohttp.ClientError as exc:
            sys.stdout.buffer.write(
                _error_line(body, AgentUnavailableError(f"agent server unreachable: {exc}")) + b"\n"
            )
            return 3
    if answer:
        sys.stdout.buffer.write(answer + b"\n")
    sys.stdout.flush()
    return 0


class _Out:
    """Writes whole lines to stdout, in completion order, with flow control."""

    def __init__(self, writer: asyncio.StreamWriter | None) -> None:
        self._writer = writer
        self._lock = asyncio.Lock()

    async def line(self, data: bytes) -> None:
        async with self._lock:
            if self._writer is not None:
                self._writer.write(data)  # two writes, not a concatenation: no copy of a big payload
                self._writer.write(b"\n")
                await self._writer.drain()
            else:
                await asyncio.to_thread(_write_all, data + b"\n")


def _write_all(data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]


async def _stdio_streams() -> tuple[asyncio.StreamReader, _Out]:
    loop = asyncio.get_running_loop()
    for fd in (0, 1):  # 1 MiB pipes: a big request or response crosses in few wakeups
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    reader = asyncio.StreamReader(limit=MAX_REQUEST)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(0, "rb", 0, closefd=False))
    try:
        transport, protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, os.fdopen(1, "wb", 0, closefd=False)
        )
        writer: asyncio.StreamWriter | None = asyncio.StreamWriter(transport, protocol, None, loop)
    except ValueError:  # stdout is a regular file: plain blocking writes, off the loop
        writer = None
    return reader, _Out(writer)


async def relay_stdio(sock: Path) -> int:
    """Relay request lines from stdin to the server and response lines back, concurrently.

    Ends with status 0 at EOF on stdin (after answering what is in flight), or 3 once the server
    is gone (every request then gets an ``AgentUnavailableError`` answer, so the host never
    hangs: it reconnects, which starts a new server, and learns there what became of its jobs).
    """
    reader, out = await _stdio_streams()
    gone = asyncio.Event()
    tasks: set[asyncio.Task[None]] = set()

    async def one(session: aiohttp.ClientSession, line: bytes) -> None:
        try:
            async with session.post(_URL, data=line if len(line) < 1 << 20 else io.BytesIO(line)) as resp:
                answer = await resp.read()
        except aiohttp.ClientError as exc:
            gone.set()
            answer = _error_line(line, AgentUnavailableError(f"agent server connection failed: {exc}"))
        if answer:
            await out.line(answer)

    async with _session(sock) as session:
        while not gone.is_set():
            try:
                line = await frames.read_frame(reader, MAX_REQUEST)
            except frames.FrameError as exc:  # out of step with the host: answer, then end the channel
                await out.line(_error_line(b"", RemoteExecError(f"bad request frame: {exc}")))
                break
            except asyncio.IncompleteReadError:
                break
            except ValueError:  # longer than MAX_REQUEST: answer it, then skip to the next line
                await out.line(_error_line(b"", RemoteExecError(f"request line over {MAX_REQUEST} bytes")))
                continue
            if line is None:
                break
            if not line.startswith(frames.MARK):
                line = line.strip()
            if not line:
                continue
            task = asyncio.create_task(one(session, line))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
    return 3 if gone.is_set() else 0
