"""The copier of a tty job's terminal into its log: a small process forked from the agent.

A terminal's master must be read by someone, and bytes read are only in that reader's memory
until they are written to the log. Were the agent the reader, a SIGKILL between its ``read`` and
its ``write`` would lose them (a flood makes that window likely, not rare). So the copy is done
by a process of its own, forked from the agent (no exec: no binary needed in the sandbox, it
starts in a millisecond and shares the agent's pages): it outlives the agent as the job does
(reparented to the keeper), keeps the output flowing to disk while no agent runs, and exits when
the master says ``EIO`` (every slave fd is closed): its exit is the job's "all output is on
disk". It holds nothing else: fds 0 (the master) and 1 (the log, ``O_APPEND``), its own session.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import time
from typing import NoReturn

__all__ = ["fork_relay"]

READ_CHUNK = 64 * 1024
RETRY_WRITE = 1.0  # the disk refused a write: try again this much later (the job blocks meanwhile)


def fork_relay(master: int, log: int) -> int:
    """Fork the copier of ``master`` into ``log``; return its pid (a child of the caller).

    :raises OSError: the fork failed.
    """
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child; its work is seen in the log it writes
        _child(master, log)
    return pid


def _child(master: int, log: int) -> NoReturn:
    code = 0
    try:
        signal.set_wakeup_fd(-1)  # the agent's loop's, not ours
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        os.setsid()  # signals for the agent's group are not for the copier
        os.dup2(master, 0)
        os.dup2(log, 1)
        os.closerange(2, os.sysconf("SC_OPEN_MAX") if os.sysconf("SC_OPEN_MAX") > 0 else 65536)
        _copy(0, 1)
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def _copy(src: int, dst: int) -> None:
    # The master is non-blocking (the flag is shared with the agent's fds on it, which must stay
    # non-blocking): wait for it with poll, then read what is there.
    poller = select.poll()
    poller.register(src, select.POLLIN)
    while True:
        try:
            data = os.read(src, READ_CHUNK)
        except BlockingIOError:
            poller.poll()
            continue
        except InterruptedError:
            continue
        except OSError as exc:
            if exc.errno == errno.EIO:
                return  # no slave fd is open any more: everything was read
            raise
        if not data:
            return
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(dst, view) :]
            except OSError:
                with contextlib.suppress(InterruptedError):
                    time.sleep(RETRY_WRITE)  # a full disk: hold the bytes, the job waits for room
