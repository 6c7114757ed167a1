"""``widen_pipe``: grow a pipe to 1 MiB, for every side that moves bulk bytes through one.

Here, not in the host client, because the agent imports only :mod:`remote_exec.protocol` and
:mod:`remote_exec.errors` (it is bundled small) and widens its pipes too.
"""

from __future__ import annotations

import contextlib
import fcntl
from typing import Protocol

__all__ = ["F_SETPIPE_SZ", "PIPE_SIZE", "widen_pipe"]

F_SETPIPE_SZ: int = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Linux; a no-op failure elsewhere
PIPE_SIZE = 1 << 20  # the default /proc/sys/fs/pipe-max-size, allowed without privileges


class _HasFileno(Protocol):
    def fileno(self) -> int: ...


def widen_pipe(pipe: int | _HasFileno, size: int = PIPE_SIZE) -> None:
    """Grow ``pipe`` (a descriptor or an object with ``fileno()``) to ``size`` bytes.

    The default 64 KiB costs a read, a write and a wakeup every 64 KiB; at 1 MiB a big message
    crosses in 16x fewer. A failure (above ``/proc/sys/fs/pipe-max-size`` for an unprivileged
    user, not a pipe, closed, not Linux) leaves the pipe as it was: slower, not wrong.
    """
    with contextlib.suppress(OSError, ValueError):  # ValueError: fileno() of a closed file
        fcntl.fcntl(pipe if isinstance(pipe, int) else pipe.fileno(), F_SETPIPE_SZ, size)
