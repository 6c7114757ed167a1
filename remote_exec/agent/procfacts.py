"""Facts about processes that the keeper and the agent both need, from the standard library only
(the keeper imports this module: it stays small).
"""

from __future__ import annotations

import contextlib
import signal

__all__ = ["proc_parent", "proc_session", "proc_starttime", "reset_signals"]


def _stat_field(pid: int, field: int) -> int | None:
    """Field ``field + 3`` of ``/proc/PID/stat`` (counted after the command name, which may hold
    spaces and parentheses), or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[field]) if len(fields) > field else None


def proc_starttime(pid: int) -> int | None:
    """Field 22 of ``/proc/PID/stat`` (clock ticks after boot), or None if there is no such process.

    With the pid it names one process for good: a recycled pid has another start time.
    """
    return _stat_field(pid, 19)


def proc_parent(pid: int) -> int | None:
    """The parent pid of ``pid`` (``/proc/PID/stat`` field 4), or None if there is no such process."""
    return _stat_field(pid, 1)


def proc_session(pid: int) -> int | None:
    """The session id of ``pid`` (``/proc/PID/stat`` field 6; readable while it is a zombie)."""
    return _stat_field(pid, 3)


def reset_signals() -> None:
    """Give ignored signals back their default action: an ignored SIGINT or SIGHUP (a shell's
    background job, ``nohup``) would otherwise be inherited across ``exec`` by every job."""
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGPIPE):
            continue  # SIGPIPE: Python ignores it itself; subprocess restores it for children
        with contextlib.suppress(OSError, ValueError):
            if signal.getsignal(sig) == signal.SIG_IGN:
                signal.signal(sig, signal.SIG_DFL)
