"""The agent's private state directory and starting the server in it exactly once.

Layout of the directory (mode 0700, owned by the agent's user)::

    agent.sock   the server's Unix socket (0600)
    agent.lock   flock'd while a client checks for / starts the server
    agent.log    the detached server's stdout and stderr
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

from ..errors import AgentUnavailableError

__all__ = ["describe", "ensure_server", "secure_dir", "server_command", "socket_accepts"]

READY_TIMEOUT = 30.0


def describe(exc: OSError) -> str:
    """An OS error in one line: ``No space left on device (ENOSPC): /path``."""
    code = errno.errorcode.get(exc.errno or 0)
    text = exc.strerror or str(exc)
    return f"{text} ({code})" + (f": {exc.filename}" if exc.filename else "") if code else text


def secure_dir(path: Path) -> Path:
    """Create ``path`` 0700 or check that an existing one is ours and private; return it.

    :raises AgentUnavailableError: the directory belongs to another user or is not private
        (another user could then connect to the agent's socket and run commands as us).
    """
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError as exc:
        raise AgentUnavailableError(f"cannot create state dir {path}: {describe(exc)}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise AgentUnavailableError(f"state dir {path} is not a directory")
    if st.st_uid != os.geteuid():
        raise AgentUnavailableError(f"state dir {path} belongs to uid {st.st_uid}, not to us ({os.geteuid()})")
    if st.st_mode & 0o077:
        try:
            os.chmod(path, 0o700)  # ours, merely too open (e.g. made by hand): tighten it
        except OSError as exc:
            raise AgentUnavailableError(f"cannot make state dir {path} private: {describe(exc)}") from None
    return path


def socket_accepts(path: Path) -> bool:
    """True if a server accepts connections on the Unix socket at ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(os.fspath(path))
        except OSError:
            return False
    return True


def server_command(state_dir: Path, extra: list[str]) -> list[str]:
    """The argv that runs ``serve`` with this very agent (Python package or frozen bundle)."""
    if getattr(sys, "frozen", False):
        return [sys.executable, "serve", "--dir", os.fspath(state_dir), *extra]
    return [sys.executable, "-m", "remote_exec.agent", "serve", "--dir", os.fspath(state_dir), *extra]


def ensure_server(state_dir: Path, serve_args: list[str] | None = None) -> bool:
    """Start the server in ``state_dir`` unless one is running; True if this call started it.

    Blocking. Concurrent callers serialise on ``agent.lock``, so exactly one server starts.
    Readiness is the server's own "ready" line on a pipe, written once its socket accepts.

    :raises AgentUnavailableError: the server failed to start (its log's tail is in the message).
    """
    secure_dir(state_dir)
    try:
        return _ensure_server(state_dir, serve_args)
    except OSError as exc:  # a full or read-only state dir: one line, not a traceback
        raise AgentUnavailableError(f"cannot start the agent in state dir {state_dir}: {describe(exc)}") from None


def _ensure_server(state_dir: Path, serve_args: list[str] | None) -> bool:
    sock = state_dir / "agent.sock"
    with open(state_dir / "agent.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if socket_accepts(sock):
            return False
        read_fd, write_fd = os.pipe()
        log_path = state_dir / "agent.log"
        try:
            with open(log_path, "ab") as log:
                subprocess.Popen(
                    server_command(state_dir, [*(serve_args or []), "--ready-fd", str(write_fd)]),
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
            tail = log_path.read_bytes()[-2000:].decode(errors="replace")
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
