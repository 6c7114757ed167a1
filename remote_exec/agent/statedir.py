"""The agent's private state directory and starting the server in it exactly once.

Layout of the directory (mode 0700, owned by the agent's user)::

    agent.sock   the server's Unix socket (0600)
    agent.stream the server's frame-stream socket (0600)
    keeper.sock  the keeper's control socket (0600; see :mod:`remote_exec.agent.keeper`)
    agent.lock   flock'd while a client checks for / starts the server
    agent.log    the keeper's and the servers' stdout and stderr
    jobs/        one dir per job: its metadata and output (see :mod:`remote_exec.agent.jobs.diskjob`)

The server runs as the keeper's child: ``ensure`` starts a keeper (which starts the server) when
none answers, or asks the running keeper to start a server when only the server is gone.
"""

from __future__ import annotations

import errno
import fcntl
import os
import select
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

from ..errors import AgentUnavailableError, UntrustedAgentError
from ..protocol.ownership import check_peer, check_socket, check_state_dir
from .keeper import KEEPER_SOCKET
from .statefile import open_own_file

__all__ = ["describe", "ensure_server", "open_private", "secure_dir", "server_command", "socket_accepts"]

READY_TIMEOUT = 30.0


def describe(exc: OSError) -> str:
    """An OS error in one line: ``No space left on device (ENOSPC): /path``."""
    code = errno.errorcode.get(exc.errno or 0)
    text = exc.strerror or str(exc)
    return f"{text} ({code})" + (f": {exc.filename}" if exc.filename else "") if code else text


def secure_dir(path: Path) -> Path:
    """Create ``path`` 0700 or check that an existing one is ours and private; return it.

    ``mkdir`` may find a directory someone else made first (a predictable name in ``/tmp``), so
    what counts is the check after it, on the inode itself (see :mod:`remote_exec.protocol.ownership`).

    :raises UntrustedAgentError: the directory is a symlink or belongs to another user (who
        could then serve or connect to the agent's socket).
    :raises AgentUnavailableError: it cannot be created.
    """
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        failed: OSError | None = None
    except OSError as exc:  # e.g. a dangling symlink there: the check below names that
        failed = exc
    try:
        check_state_dir(path)
    except OSError as exc:  # missing after a failed mkdir, or cannot be made private (read-only)
        raise AgentUnavailableError(f"cannot create state dir {path}: {describe(failed or exc)}") from None
    return path


def socket_accepts(path: Path) -> bool:
    """True if a server of ours accepts connections on the Unix socket at ``path``.

    :raises UntrustedAgentError: the socket, or the process listening on it, is another user's.
    """
    if not check_socket(path):
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(os.fspath(path))
        except OSError:
            return False
        check_peer(s, path)
    return True


def open_private(path: Path, flags: int) -> int:
    """Open (or create, 0600) a file of ours in the state dir: never through a symlink, never
    another user's file or a hard link to one of ours elsewhere, which a user who could write
    the directory before it was made private may have planted (the agent would then write its
    log through it).

    :raises UntrustedAgentError: the entry is a symlink, not a regular file, or not ours alone.
    """
    try:
        return open_own_file(path, flags)
    except ValueError as exc:  # another user's: refused, and said
        if str(exc) == "a symlink":
            raise UntrustedAgentError(f"cannot open {path} safely: it is a symlink (planted there?)") from None
        raise UntrustedAgentError(
            f"{path} is {exc} and not yours alone: remove it and check who could write {path.parent}"
        ) from None


def _log_tail(path: Path, size: int = 2000) -> str:
    """The last ``size`` bytes of the log at ``path``, for an error message: only a regular file
    (a job can make ``agent.log`` a symlink to ``/dev/zero`` or a FIFO), and only its tail read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return f"(no log: {exc})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return f"(no log: {path} is not a regular file)"
        return os.pread(fd, size, max(0, st.st_size - size)).decode(errors="replace")
    finally:
        os.close(fd)


def server_command(state_dir: Path, extra: list[str], sub: str = "serve") -> list[str]:
    """The argv that runs ``serve`` (or ``sub``) with this very agent (package or frozen bundle)."""
    if getattr(sys, "frozen", False):
        return [sys.executable, sub, "--dir", os.fspath(state_dir), *extra]
    return [sys.executable, "-m", "remote_exec.agent", sub, "--dir", os.fspath(state_dir), *extra]


def ensure_server(state_dir: Path, serve_args: list[str] | None = None) -> bool:
    """Start the server in ``state_dir`` unless one is running; True if this call started it.

    Blocking. Concurrent callers serialise on ``agent.lock``, so exactly one server starts.
    Readiness is the server's own "ready" line on a pipe, written once its socket accepts.

    :raises UntrustedAgentError: the state dir, a socket or file in it, or the server already
        listening there belongs to another user.
    :raises AgentUnavailableError: the server failed to start (its log's tail is in the message).
    """
    secure_dir(state_dir)
    try:
        return _ensure_server(state_dir, serve_args)
    except OSError as exc:  # a full or read-only state dir: one line, not a traceback
        raise AgentUnavailableError(f"cannot start the agent in state dir {state_dir}: {describe(exc)}") from None


def _ensure_server(state_dir: Path, serve_args: list[str] | None) -> bool:
    sock = state_dir / "agent.sock"
    with open(open_private(state_dir / "agent.lock", os.O_WRONLY | os.O_APPEND), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if socket_accepts(sock):
            return False
        log_path = state_dir / "agent.log"
        agent = server_command(state_dir, serve_args or [])
        if socket_accepts(state_dir / KEEPER_SOCKET):
            # The keeper outlived its agent (a handover, or it is restarting a crashed one).
            from .keeperlink import keeper_call  # its module needs asyncio: kept off the relay's start

            answer = keeper_call(state_dir, {"op": "start", "argv": agent}, READY_TIMEOUT)
            if answer is not None and answer.get("ok"):
                return True
            tail = _log_tail(log_path)
            why = answer.get("error") if answer else "the keeper did not answer"
            raise AgentUnavailableError(f"agent server in {state_dir} did not start ({why}):\n{tail}")
        read_fd, write_fd = os.pipe()
        try:
            with open(open_private(log_path, os.O_WRONLY | os.O_APPEND), "ab") as log:
                subprocess.Popen(
                    server_command(state_dir, ["--ready-fd", str(write_fd), "--", *agent], sub="keeper"),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    pass_fds=(write_fd,),
                    start_new_session=True,  # outlive the caller and its terminal
                    close_fds=True,
                )
        finally:
            os.close(write_fd)
        try:
            line = _read_line(read_fd, READY_TIMEOUT)
        finally:
            os.close(read_fd)
        if line != b"ready":
            tail = _log_tail(log_path)
            raise AgentUnavailableError(f"agent server in {state_dir} did not start:\n{tail}")
    return True


def _read_line(fd: int, timeout: float) -> bytes:
    deadline = time.monotonic() + timeout
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return b""
        chunk = os.read(fd, 64)
        if not chunk:
            break  # the server exited before it was ready
        data += chunk
    return data.split(b"\n", 1)[0]
