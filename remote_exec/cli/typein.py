"""The lines typed at ``remote-exec shell``'s terminal while a run is in progress go to its stdin.

The terminal stays in its ordinary (canonical) mode, as a local shell leaves it for the command
it runs: the terminal itself echoes and edits the line, and ``os.read`` on it returns one whole
line at a time, or nothing for Ctrl-D at the start of a line (end of input: the run's stdin is
closed, and what is typed after it waits for the next prompt). Ctrl-C stays the terminal's: its
SIGINT reaches the prompt's main thread, which interrupts the run.

The lines are read by a thread, because the main thread is iterating the run's events through
the blocking API. It waits on the terminal and on a wake-up pipe at once, so that it stops the
moment the run ends instead of taking the first line meant for the next prompt.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
from collections.abc import Iterator

from ..blocking import BlockingExecRemoteProcess
from ..errors import RemoteExecError

__all__ = ["typed_lines_to"]

LINE_MAX = 65536  # more than a canonical-mode terminal hands over in one read (4096 on Linux)


@contextlib.contextmanager
def typed_lines_to(proc: BlockingExecRemoteProcess, fd: int) -> Iterator[None]:
    """For the block, forward what is typed on terminal ``fd`` to ``proc``'s stdin (which must
    have been started with ``stdin_open=True``); on the way out the forwarding has stopped."""
    wake_r, wake_w = os.pipe()
    thread = threading.Thread(target=_forward, args=(proc, fd, wake_r), name="remote-exec-typein", daemon=True)
    thread.start()
    try:
        yield
    finally:
        os.write(wake_w, b"x")
        thread.join()
        os.close(wake_r)
        os.close(wake_w)


def _forward(proc: BlockingExecRemoteProcess, fd: int, wake: int) -> None:
    try:
        while True:
            ready, _, _ = select.select([fd, wake], [], [])
            if wake in ready:
                return
            try:
                line = os.read(fd, LINE_MAX)
            except BlockingIOError:  # another reader (none today) took it first
                continue
            except OSError:  # the terminal went away (hang-up): as end of input
                line = b""
            if not line:
                proc.close_stdin()
                return
            proc.write_stdin(line)
    except RemoteExecError:
        # The run ended (its stdin with it) or the link failed: the main thread's iteration
        # says which; nothing typed from here on belongs to this run.
        return
