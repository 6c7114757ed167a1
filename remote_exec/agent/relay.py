"""Relays from the agent CLI to the server: one-shot ``call`` (over HTTP) and persistent ``stdio``.

``stdio`` is a plain byte pipe to the server's frame stream (:mod:`.stream`).
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import socket
import sys
import threading
from pathlib import Path

import aiohttp

from ..errors import AgentUnavailableError, RemoteExecError
from ..protocol import frames
from .stream import SOCKET_BUFFER

__all__ = ["relay_call", "relay_stdio"]

_URL = "http://agent/rpc"
_CHUNK = 1 << 20


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


def relay_stdio(stream_sock: Path) -> int:
    """Copy bytes between stdin/stdout and the server's frame stream, both ways at once.

    The relay does not parse anything: the server reads the frames (see :mod:`.stream`), so a
    byte costs the relay one read and one write. Ends with status 0 at EOF on stdin (once the
    server has answered what was in flight and closed its side), or 3 when the server is gone
    first: the host then sees the channel close, reconnects (which starts a new server) and
    learns there what became of its jobs.
    """
    for fd in (0, 1):  # 1 MiB pipes both ways: a big frame crosses in few wakeups
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(OSError):  # big uploads cross in few sends (see stream.SOCKET_BUFFER)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
    try:
        conn.connect(os.fspath(stream_sock))
    except OSError as exc:
        print(f"remote-exec-agent: cannot reach the agent server: {exc}", file=sys.stderr)
        return 3
    stdin_done = threading.Event()

    def upstream() -> None:
        try:
            while data := os.read(0, _CHUNK):
                conn.sendall(data)
            stdin_done.set()  # EOF from the host: the server answers what is in flight, then closes
            conn.shutdown(socket.SHUT_WR)
        except OSError:  # the server is gone: the loop below sees it too and ends the relay
            pass

    # A daemon thread: when the server goes first, the process exits without waiting for stdin.
    threading.Thread(target=upstream, name="relay-up", daemon=True).start()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    try:
        while n := conn.recv_into(buf):
            out = view[:n]
            while out:
                out = out[os.write(1, out) :]
    except OSError:  # the server reset the connection, or the host closed our stdout
        pass
    return 0 if stdin_done.is_set() else 3
