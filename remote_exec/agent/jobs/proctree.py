"""Finding and ending every process of a job, whatever session or parent it ended up in.

A job's processes are (a) the leader's descendants by parent pid, and (b) every process whose
environment carries the job's marker ``REMOTE_EXEC_JOB=<job id>`` (set at spawn and inherited),
with *their* descendants. (a) catches children that cleaned their environment; (b) catches
those that left the tree: a ``setsid`` daemon, or a child orphaned when its parent died, which
the keeper (the child subreaper) adopts instead of the job. ``/proc/PID/environ`` is readable
for processes of the same user, which is every job of this agent.

Killing is a loop (scan, SIGKILL everything found, again) until a scan finds nothing, since a
process may fork while it is being killed. :func:`end_tree` is the graceful form every end of a
job uses (kill, timeout, a finished job's leftovers): SIGTERM, the grace, then that loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Iterable

from .proctable import scan

__all__ = ["MARKER", "end_tree", "job_processes", "kill_tree", "marked_processes", "signal_all"]

MARKER = "REMOTE_EXEC_JOB"
KILL_ROUNDS = 200
TREE_POLL = 0.05  # seconds between process-table scans while a kill's grace runs


def _table() -> tuple[dict[int, int], dict[int, bytes]]:
    """``(ppid of each live process, its job marker value or b"")``."""
    ppids: dict[int, int] = {}
    marks: dict[int, bytes] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return ppids, marks
    key = MARKER.encode() + b"="
    for name in names:
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[0] in (b"Z", b"X"):
            continue  # a zombie holds nothing: its parent reaps it
        ppids[pid] = int(fields[1])
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        i = env.find(b"\0" + key) if not env.startswith(key) else -1
        if env.startswith(key) or i >= 0:
            start = (0 if i < 0 else i + 1) + len(key)
            stop = env.find(b"\0", start)
            marks[pid] = env[start : stop if stop >= 0 else len(env)]
    return ppids, marks


def _closure(roots: Iterable[int], ppids: dict[int, int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, ppid in ppids.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = [r for r in roots if r in ppids]
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.add(pid)
        todo.extend(children.get(pid, ()))
    return found


def job_processes(job_id: str, leader: int = 0) -> set[int]:
    """Live processes of job ``job_id`` (``leader``: its first process, if still alive)."""
    ppids, marks = _table()
    want = job_id.encode()
    roots = [pid for pid, mark in marks.items() if mark == want]
    if leader:
        roots.append(leader)
    return _closure(roots, ppids) - {os.getpid()}


def marked_processes(prefix: str) -> dict[str, set[int]]:
    """Live processes of every job whose id starts with ``prefix``, by job id."""
    ppids, marks = _table()
    want = prefix.encode()
    by_job: dict[str, set[int]] = {}
    for pid, mark in marks.items():
        if mark.startswith(want):
            by_job.setdefault(mark.decode(errors="replace"), set()).add(pid)
    me = os.getpid()
    return {job: _closure(pids, ppids) - {me} for job, pids in by_job.items()}


def signal_all(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def kill_tree(job_id: str, leader: int = 0) -> int:
    """SIGKILL every process of the job until none is left; return how many were signalled.

    Blocking (a few /proc scans): run it in a thread.
    """
    total = 0
    for _ in range(KILL_ROUNDS):
        pids = job_processes(job_id, leader)
        if not pids:
            return total
        signal_all(pids, signal.SIGKILL)
        total += len(pids)
    return total


async def end_tree(job_id: str, leader: int, grace: float, after_term: Callable[[], None] | None = None) -> None:
    """SIGTERM every process of the job (``leader``'s group too, if given), wait up to ``grace``
    seconds for them to go, then SIGKILL what is left, children forked meanwhile included.

    ``after_term`` runs right after the SIGTERMs (a job closes its stdin there). Cancelling
    stops the wait: what got SIGTERM may live on.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    # The leader's group first, in one kill: a shell and its child get SIGTERM together, so the
    # shell dies of its own before it can report the child's death ("Terminated" on the job's
    # stderr, when one by one reached the child first and a loaded machine ran the shell between).
    if leader:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(leader, signal.SIGTERM)
    signal_all(await scan(job_processes, job_id, leader), signal.SIGTERM)  # what left the group
    if after_term is not None:
        after_term()
    # No event exists for "every process of the tree is gone": poll the table during grace.
    while loop.time() < deadline:
        if not await scan(job_processes, job_id, leader):
            break
        await asyncio.sleep(TREE_POLL)
    await scan(kill_tree, job_id, leader)
