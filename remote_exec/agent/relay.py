"""The agent CLI's persistent ``stdio`` relay to the server (the one-shot HTTP ``call``:
:mod:`.httprelay`).

``stdio`` is a plain byte pipe to the server's frame stream (:mod:`.stream`). Both connect only
to a socket of this user's served by a process of this user's
(:mod:`remote_exec.protocol.ownership`); when they refuse, they answer the host's requests with
the reason (:func:`refuse_stdio`, :func:`error_line`), so the host's error names it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import socket
import stat
import sys
import threading
from pathlib import Path

from ..errors import AgentUnavailableError, RemoteExecError
from ..protocol import frames
from ..protocol.agentdir import SOCKET_BUFFER
from ..protocol.ownership import check_peer, check_socket
from ..protocol.pipes import widen_pipe

__all__ = ["SERVER_INFO_REQUEST", "error_line", "frame_request", "refuse_stdio", "relay_stdio", "stream_call"]

_CHUNK = 1 << 20
_NO_SPLICE = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM}  # splice refused, not a failure
_FOREVER = 365 * 24 * 3600.0  # a socket timeout that never ends: its fd non-blocking, its calls waiting

SERVER_INFO_REQUEST = b'{"jsonrpc":"2.0","id":0,"method":"server_info","params":{}}'
"""The plain request line ``ensure`` and a takeover's version check send over the frame stream."""


def error_line(line: bytes, exc: RemoteExecError) -> bytes:
    """The JSON-RPC error response to the request ``line`` (a frame), with the request's id."""
    try:
        id_ = json.loads(frames.split(line)[0]).get("id")
    except (ValueError, AttributeError):
        id_ = None
    err = {"code": exc.code, "message": exc.message}
    return json.dumps({"jsonrpc": "2.0", "id": id_, "error": err}, separators=(",", ":")).encode()


def relay_stdio(stream_sock: Path) -> int:
    """Copy bytes between stdin/stdout and the server's frame stream, both ways at once.

    The relay does not parse anything: the server reads the frames (see :mod:`.stream`), so a
    byte costs the relay one read and one write. Ends with status 0 at EOF on stdin (once the
    server has answered what was in flight and closed its side), or 3 when the server is gone
    first: the host then sees the channel close, reconnects (which starts a new server) and
    learns there what became of its jobs.
    """
    for fd in (0, 1):  # 1 MiB pipes both ways: a big frame crosses in few wakeups
        widen_pipe(fd)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(OSError):  # big uploads cross in few sends (see agentdir.SOCKET_BUFFER)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
    try:
        check_socket(stream_sock)
        conn.connect(os.fspath(stream_sock))
        check_peer(conn, stream_sock)
    except OSError as exc:
        print(f"remote-exec-agent: cannot reach the agent server: {exc}", file=sys.stderr)
        return 3
    except RemoteExecError as exc:  # not our agent: nothing goes to it, the host hears why
        conn.close()
        return refuse_stdio(exc)
    stdin_done = threading.Event()

    def upstream() -> None:
        try:
            while data := os.read(0, _CHUNK):
                conn.sendall(data)
            stdin_done.set()  # EOF from the host: the server answers what is in flight, then closes
            conn.shutdown(socket.SHUT_WR)
        except OSError:  # the server is gone: the loop below sees it too and ends the relay
            pass

    splices = _is_pipe(1) and hasattr(os, "splice")
    if splices:
        conn.settimeout(_FOREVER)  # before sendall runs in the other thread (see _relay_down)
    # A daemon thread: when the server goes first, the process exits without waiting for stdin.
    threading.Thread(target=upstream, name="relay-up", daemon=True).start()
    _relay_down(conn, splices)
    return 0 if stdin_done.is_set() else 3


def _is_pipe(fd: int) -> bool:
    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        return False


def _relay_down(conn: socket.socket, splices: bool) -> None:
    """Move the server's bytes to stdout until EOF or an error on either side: when stdout is a
    pipe (``splices``) by ``splice``, which the kernel moves without a copy through this process,
    every frame, small or big; else, or where splice is refused (seccomp, gVisor), by ``recv``
    and ``write``.

    Splicing only once a receive filled a 64 KiB buffer left most of a stream copied (a receive
    racing the server's sends rarely found that much). Measured alone (``bench/relay.py``: a
    socket pair, a pipe, the relay in its own process): a small frame crosses in 15 us either
    way, a 64 MiB burst at ~1,000 MB/s spliced against 720-740 copied. Through ``docker://``,
    dockerd, its shim and the CLI copy every byte as well, and the difference is within that
    path's noise (``bench/sandboxes.py``).

    The splice never waits: a blocking ``splice`` waiting for the socket holds the *pipe's* lock,
    and the host's read of stdout waited behind it, a frame already in the pipe with it, until
    more bytes came (seconds, Linux 6.18). Non-blocking, after ``select`` (the socket is then in
    timeout mode, set before the other thread's ``sendall`` starts: its fd non-blocking, while
    ``recv`` and ``sendall`` still wait).
    """
    sock = conn.fileno()
    try:
        while splices:
            try:
                n = os.splice(sock, 1, _CHUNK, flags=os.SPLICE_F_NONBLOCK)
            except BlockingIOError:  # the socket is empty, or stdout is full
                if select.select([sock], [], [], 0)[0]:
                    select.select([], [1], [])  # stdout is full: wait for room
                else:
                    select.select([sock], [], [])  # wait for the server
                continue
            except OSError as exc:
                if exc.errno not in _NO_SPLICE:
                    raise
                splices = False  # refused here (it moved nothing): copy from now on
                break
            if not n:
                return  # EOF: the server closed
            if n < _CHUNK:  # the socket drained (a small frame), or the pipe had less room: wait
                # for the socket (ready at once in the second case, and the splice that follows
                # waits for room)
                select.select([sock], [], [])
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        while n := conn.recv_into(buf):
            out = view[:n]
            while out:
                out = out[os.write(1, out) :]
    except OSError:  # the server reset the connection, or the host closed our stdout
        return


def frame_request(stream_sock: Path, request: bytes, timeout: float = 10.0) -> bytes:
    """Send one plain JSON request line over the frame stream; its answer line (at most
    :data:`_CHUNK` bytes read). The standard library only: the HTTP socket would import aiohttp
    first, in this process (``call``) and in the agent (which loads it at its first HTTP client),
    costing more CPU than the question itself.

    :raises OSError: the server cannot be reached, or did not answer within ``timeout``
        seconds (a frozen agent: each wait on the socket is bounded).
    :raises RemoteExecError: the socket is not our agent's (nothing was sent to it).
    """
    check_socket(stream_sock)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(os.fspath(stream_sock))
        check_peer(conn, stream_sock)
        conn.sendall(request + b"\n")
        conn.shutdown(socket.SHUT_WR)  # one request: the server answers it, then closes
        answer = bytearray()
        while b"\n" not in answer and len(answer) < _CHUNK and (data := conn.recv(_CHUNK)):
            answer += data  # one line is the answer: read no further (bounded by _CHUNK)
    return bytes(answer).split(b"\n", 1)[0]


def stream_call(stream_sock: Path, request: bytes, quiet: bool = False) -> int:
    """Print the answer line of one request over the frame stream (:func:`frame_request`): what
    ``ensure`` asks (``server_info``). Exit status 3 (with the reason as the answer, unless
    ``quiet``) when the server cannot be reached.
    """
    try:
        answer = frame_request(stream_sock, request)
    except OSError as exc:
        if not quiet:
            unreachable = AgentUnavailableError(f"agent server unreachable: {exc}")
            sys.stdout.buffer.write(error_line(request, unreachable) + b"\n")
        return 3
    except RemoteExecError as exc:  # not our agent: nothing was sent to it
        sys.stdout.buffer.write(error_line(request, exc) + b"\n")
        return 3
    sys.stdout.buffer.write(answer + b"\n")
    return 0


def refuse_stdio(exc: RemoteExecError) -> int:
    """Answer every request read from stdin with ``exc`` (by its id) until EOF; return 3.

    A relay that merely exited would leave the host with "channel closed by the sandbox" and
    nothing to act on; an error response carries the class and the reason across.
    """
    stdin = sys.stdin.buffer
    while line := stdin.readline():
        if line.startswith(frames.MARK):  # a payload ahead of the JSON: skip it by its length
            digits = line[1:].strip()
            if not digits.isdigit():
                break
            left = int(digits)
            while left > 0 and (chunk := stdin.read(min(left, _CHUNK))):
                left -= len(chunk)
            line = stdin.readline()
        sys.stdout.buffer.write(error_line(line.rstrip(b"\r\n"), exc) + b"\n")
        sys.stdout.buffer.flush()
    return 3
