"""The agent's listening Unix sockets, private before anyone can connect.

A socket file is made by ``bind`` with the mode the umask leaves, and lowering the umask around
the bind (what the agent did) changes it for the whole process: a thread that made a job's dir
meanwhile (the spare dir is made in one) got a dir 0600, which its own user cannot enter. So the
socket is bound, made 0600, and only then listens: until ``listen`` a connect is refused, so
there is no moment where another user could connect (and the state dir is 0700 besides).
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

__all__ = ["private_listener"]


def private_listener(path: Path, backlog: int) -> socket.socket:
    """A non-blocking Unix stream socket listening at ``path``, mode 0600 (a stale socket file
    there is replaced)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(os.fspath(path))
        os.chmod(path, 0o600)
        listener.listen(backlog)
    except BaseException:
        listener.close()
        raise
    listener.setblocking(False)
    return listener
