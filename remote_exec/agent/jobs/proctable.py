"""Reading the process table from /proc: who is still alive in a process group."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple, TypeVar

__all__ = [
    "SessionProcess",
    "group_alive",
    "group_members",
    "prestart",
    "scan",
    "session_members",
    "session_processes",
]

T = TypeVar("T")
# Threads of their own, not the default pool: kills, timeouts and interrupts wait on these scans,
# and must not queue behind file operations stuck in a worker thread (a hung mount, a slow disk).
# Made at the agent's start (prestart): a kill must not need a new thread when a fork bomb holds
# every pid of the box ("can't start new thread" failed 4 kills in 6).
WORKERS = 2
_POOL = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="rx-proctable")


def prestart() -> None:
    """Start this module's threads now, while threads can still be made (blocks until they run)."""
    ready = threading.Barrier(WORKERS + 1)
    try:
        for _ in range(WORKERS):
            _POOL.submit(ready.wait, 10.0)  # each waits: the next submit must make a new thread
    except RuntimeError:  # no thread to be had even now: the scans run inline (see scan)
        ready.abort()
        return
    with contextlib.suppress(threading.BrokenBarrierError):
        ready.wait(10.0)


async def scan(fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` (one of this module's readers) in this module's own threads, or inline on
    the event loop when no thread can be had (every pid taken): slower, never a failure.

    Cancelling the await abandons the result; the scan itself finishes in its thread.
    """
    try:
        future = asyncio.get_running_loop().run_in_executor(_POOL, fn, *args)
    except RuntimeError:  # "can't start new thread"
        return fn(*args)
    return await future


def _proc_stats() -> Iterator[tuple[int, list[bytes]]]:
    """``(pid, fields after the command name)`` of every process in /proc (none without /proc)."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # exited while we looked
        # The command name may itself contain ')' or spaces: split after its last ')'.
        yield int(name), stat[stat.rfind(b")") + 2 :].split()


def group_members(pgid: int) -> list[int]:
    """PIDs of live (non-zombie) processes whose process group is ``pgid``."""
    return [pid for pid, f in _proc_stats() if len(f) > 2 and f[0] != b"Z" and int(f[2]) == pgid]


def group_alive(pgid: int) -> bool:
    """True while any non-zombie process is left in group ``pgid``."""
    try:  # cheap first: no process at all in the group means no /proc scan
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    # Someone is there, maybe only zombies: /proc tells; without it, err on the side of "alive".
    return bool(group_members(pgid)) if os.path.isdir("/proc/self") else True


class SessionProcess(NamedTuple):
    """A live process of a session.

    :ivar started: when it started, in seconds of ``CLOCK_BOOTTIME``.
    :ivar caught: the mask of signals it has handlers for (``SigCgt``; 0 if unreadable).
    """

    pid: int
    pgid: int
    started: float
    caught: int


def session_processes(sid: int) -> list[SessionProcess]:
    """Live (non-zombie) processes in session ``sid``, leader included; empty without /proc."""
    tick = 1.0 / os.sysconf("SC_CLK_TCK")
    found: list[SessionProcess] = []
    for pid, fields in _proc_stats():
        if len(fields) < 20 or fields[0] == b"Z" or int(fields[3]) != sid:
            continue
        found.append(SessionProcess(pid, int(fields[2]), int(fields[19]) * tick, _caught(str(pid))))
    return found


def _caught(pid: str) -> int:
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"SigCgt:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


def session_members(sid: int, started_after: float | None = None) -> list[int]:
    """PIDs of live processes in session ``sid``, leader included.

    With ``started_after`` (seconds of ``CLOCK_BOOTTIME``, the clock /proc start times count
    in), only processes started since then, give or take one clock tick.
    """
    slack = 1.0 / os.sysconf("SC_CLK_TCK")
    return [p.pid for p in session_processes(sid) if started_after is None or p.started >= started_after - slack]
