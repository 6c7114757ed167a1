"""Where an agent lives: its default state dir and the name of its frame-stream socket.

Standard library only: the agent's ``stdio`` relay (run for every channel a host opens into a
sandbox) imports this and not the wire models.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["SOCKET_BUFFER", "STREAM_SOCKET", "default_agent_dir"]

STREAM_SOCKET = "agent.stream"
"""The agent's frame-stream socket (``stdio``-style frames, no HTTP), beside ``agent.sock``."""

SOCKET_BUFFER = 4 << 20
"""Bytes a frame-stream socket may hold in flight: a whole 4 MiB poll answer in one send, not
twenty ~200 KiB ones (Linux caps it at ``net.core.wmem_max``; the default is kept if refused)."""


def default_agent_dir() -> Path:
    """The agent's per-user state dir when none is given (the local sandbox finds it here too).

    ``$REMOTE_EXEC_AGENT_DIR``, else ``$XDG_RUNTIME_DIR/remote-exec``, else ``/tmp/remote-exec-<uid>``.
    ``$XDG_RUNTIME_DIR`` counts only if it is a directory of ours that others cannot write:
    ``su`` and ``sudo`` keep the first user's, and an agent there would be theirs to replace.
    The ``/tmp`` name is predictable; another user who makes it first is refused when it is
    used (:mod:`remote_exec.protocol.ownership`), never trusted.
    """
    env = os.environ.get("REMOTE_EXEC_AGENT_DIR")
    if env:
        return Path(env)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        try:
            st = os.stat(runtime)
        except OSError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022:
            return Path(runtime) / "remote-exec"
    return Path(f"/tmp/remote-exec-{os.geteuid()}")
