"""Finding and ending every process of a job, whatever session or parent it ended up in.

One membership serves ``stats()``, the limits, ``kill()`` and the timeout (:func:`tree_members`):

- the job's cgroup (:mod:`.cgroup`), where one could be made: its leader joined it before
  ``exec``, so every descendant is born in it and none leaves by ``setsid``, ``setpgid``, a
  cleared environment or being orphaned;
- united with attribution from ``/proc``, which serves alone where there is no cgroup: the
  leader, the processes of its session (a child that cleared its environment and was orphaned
  but did not ``setsid``), every process whose environment carries the job's marker
  ``REMOTE_EXEC_JOB=<job id>`` (set at spawn, inherited), every process seen as a member
  before (the *ledger*, by pid and start time: a recycled pid has another start time), and
  all their descendants by parent pid. Orphans are reparented to the keeper (the subreaper),
  where the ledger, their session or their marker still names their job.

Killing is a loop (a pass through the cgroup, a scan, SIGKILL to everything found, again) until
a scan finds nothing, since a process may fork while it is being killed. :func:`end_tree` is the
graceful form every end of a job uses (kill, timeout, a finished job's leftovers): SIGTERM, the
grace, then that loop. The loop makes no thread or process (the scans run in threads made at
start, else inline; see :func:`.proctable.scan`): it works with every pid of the box taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

from .cgroup import JobCgroup
from .proctable import scan

__all__ = [
    "MARKER",
    "Tree",
    "end_tree",
    "forget",
    "job_processes",
    "kill_all",
    "kill_tree",
    "marked_processes",
    "signal_all",
    "tree_members",
    "trees_members",
]

MARKER = "REMOTE_EXEC_JOB"
KILL_ROUNDS = 200  # the blocking form's bound (an unkillable process must not hang its thread)
TREE_POLL = 0.05  # seconds between process-table scans while a kill's grace runs
MAX_LEDGER = 65536  # members remembered per job (a fork bomb is bounded by its pids limit)
MAX_JOBS = 4096  # jobs whose members are remembered
QUICK_POLL = 0.005  # seconds between the first passes of a kill (most trees are gone by then)
SLOW_POLL = 1.0  # seconds between passes of a kill that has gone on for KILL_ROUNDS (a D-state member)


class Tree(NamedTuple):
    """What names a job's processes: its id (the marker), its leader while it runs (0 after),
    its session (the leader's pid, kept after its end), the leader's start time (``/proc``
    ticks: only processes started since can be of its session), and its cgroup if it has one."""

    job_id: str
    leader: int = 0
    session: int = 0
    since: int | None = None
    cgroup: JobCgroup | None = None


class _Proc(NamedTuple):
    ppid: int
    sid: int
    start: int
    mark: bytes | None


# job id -> {pid: start time} of the members seen at the last look (see the module's docstring);
# the least recently seen jobs are forgotten past MAX_JOBS (a job whose tree emptied goes at once)
_ledger: OrderedDict[str, dict[int, int]] = OrderedDict()
_ledger_lock = threading.Lock()  # scans run in two threads


class _Table(NamedTuple):
    """One walk of ``/proc``, indexed once for every tree looked up in it."""

    procs: dict[int, _Proc]
    children: dict[int, list[int]]
    by_mark: dict[bytes, list[int]]
    by_sid: dict[int, list[int]]


# One walk of /proc shared by the scans that wait for it (see _table). A walk costs a read of two
# files per process of the machine; 1 000 jobs killed at once (a sandbox closed with its jobs)
# made 1 000 kills each walk /proc several times: O(jobs x processes), 11 s at load 4.5, and the
# scan threads stayed busy with abandoned walks long after, which held up the agent's shutdown.
_walk = threading.Condition()
_walks_started = 0  # walks begun so far (a walk's number is its rank)
_walking = False
_last_walk: tuple[int, _Table] | None = None  # the newest finished walk and its number


def _table() -> _Table:
    """Every live process, from a walk of ``/proc`` begun after this call: callers that arrive
    while a walk runs wait for it to end and share the next one (never one begun before they
    asked, which could miss what they just forked or signalled). Blocking, like the walk."""
    global _walks_started, _walking, _last_walk
    with _walk:
        after = _walks_started  # a walk numbered above this began after the call
        while True:
            if _last_walk is not None and _last_walk[0] > after:
                return _last_walk[1]
            if not _walking:
                break
            _walk.wait()
        _walks_started += 1
        number, _walking = _walks_started, True
    table = None
    try:
        table = _walk_proc()
        return table
    finally:
        with _walk:
            _walking = False
            if table is not None:
                _last_walk = (number, table)
            _walk.notify_all()


def _walk_proc() -> _Table:
    """Every live (non-zombie) process: its parent, session, start time and job marker."""
    table: dict[int, _Proc] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        names = []
    key = MARKER.encode() + b"="
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) < 20 or fields[0] in (b"Z", b"X"):
            continue  # a zombie holds nothing: its parent reaps it
        mark: bytes | None = None
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            env = b""
        i = 0 if env.startswith(key) else env.find(b"\0" + key) + 1
        if i > 0 or env.startswith(key):
            start = i + len(key)
            stop = env.find(b"\0", start)
            mark = env[start : stop if stop >= 0 else len(env)]
        table[int(name)] = _Proc(int(fields[1]), int(fields[3]), int(fields[19]), mark)
    children: dict[int, list[int]] = {}
    by_mark: dict[bytes, list[int]] = {}
    by_sid: dict[int, list[int]] = {}
    for pid, p in table.items():
        children.setdefault(p.ppid, []).append(pid)
        by_sid.setdefault(p.sid, []).append(pid)
        if p.mark is not None:
            by_mark.setdefault(p.mark, []).append(pid)
    return _Table(table, children, by_mark, by_sid)


def _closure(roots: Iterable[int], t: _Table) -> set[int]:
    found: set[int] = set()
    todo = [r for r in roots if r in t.procs]
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.add(pid)
        todo.extend(t.children.get(pid, ()))
    return found


def _members(tree: Tree, t: _Table) -> set[int]:
    table = t.procs
    roots = list(t.by_mark.get(tree.job_id.encode(), ()))
    if tree.leader and (tree.since is None or (tree.leader in table and table[tree.leader].start == tree.since)):
        roots.append(tree.leader)  # (not a process that took its pid since)
    if tree.session and tree.since is not None:
        since = tree.since
        roots.extend(pid for pid in t.by_sid.get(tree.session, ()) if table[pid].start >= since)
    with _ledger_lock:
        seen = dict(_ledger.get(tree.job_id, {}))
    roots.extend(pid for pid, start in seen.items() if pid in table and table[pid].start == start)
    if tree.cgroup is not None:
        roots.extend(tree.cgroup.members())
    found = _closure(roots, t) - {os.getpid()}
    with _ledger_lock:
        if found:
            _ledger[tree.job_id] = {pid: table[pid].start for pid in list(found)[:MAX_LEDGER]}
            _ledger.move_to_end(tree.job_id)
            while len(_ledger) > MAX_JOBS:
                _ledger.popitem(last=False)
        else:
            _ledger.pop(tree.job_id, None)
    return found


def trees_members(trees: Mapping[str, Tree]) -> dict[str, set[int]]:
    """Live processes of each tree (by key), from one walk of ``/proc``. Blocking: see :func:`scan`."""
    table = _table()
    return {key: _members(tree, table) for key, tree in trees.items()}


def tree_members(tree: Tree) -> set[int]:
    """Live processes of ``tree``. Blocking (a walk of ``/proc``): see :func:`scan`."""
    return _members(tree, _table())


def forget(job_id: str) -> None:
    """Drop the ledger of a job whose tree was seen empty."""
    with _ledger_lock:
        _ledger.pop(job_id, None)


def job_processes(job_id: str, leader: int = 0) -> set[int]:
    """Live processes of job ``job_id`` (``leader``: its first process, if still alive)."""
    return tree_members(Tree(job_id, leader))


def marked_processes(prefix: str) -> dict[str, set[int]]:
    """Live processes of every job whose id starts with ``prefix``, by job id."""
    t = _table()
    want = prefix.encode()
    me = os.getpid()
    return {
        mark.decode(errors="replace"): _closure(pids, t) - {me}
        for mark, pids in t.by_mark.items()
        if mark.startswith(want)
    }


def signal_all(pids: Iterable[int], sig: int) -> set[int]:
    """Send ``sig`` to each of ``pids``; return those it may not signal (another uid's)."""
    refused: set[int] = set()
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            refused.add(pid)
    return refused


def kill_tree(job_id: str, leader: int = 0, cgroup: JobCgroup | None = None) -> int:
    """SIGKILL every process of the job until none is left; return how many were signalled.

    Blocking (a few /proc scans): run it in a thread, or where blocking is meant.
    """
    tree = Tree(job_id, leader, cgroup=cgroup)
    total = 0
    for _ in range(KILL_ROUNDS):
        if cgroup is not None:
            cgroup.kill()
        pids = tree_members(tree)
        if not pids:
            forget(job_id)
            break
        signal_all(pids, signal.SIGKILL)
        total += len(pids)
    return total


async def kill_all(tree: Tree) -> None:
    """SIGKILL every member of ``tree``, again and again (the membership read afresh each
    pass), until a look finds none. No new thread, process or memory of note is needed: the
    cgroup's kill is a write, the scans run in the threads made at start (inline without).
    Cancelling stops the loop: what is left lives on.
    """
    refused: set[int] = set()
    passes = 0
    if tree.cgroup is None or not await tree.cgroup.kill_async():
        refused = await _stop_all(tree)
    while True:
        passes += 1
        if tree.cgroup is not None:
            await tree.cgroup.kill_async()
        pids = await scan(tree_members, tree) - refused
        if not pids:
            forget(tree.job_id)
            return
        # A member we may not signal (a setuid program's) cannot be ended by us: not waited for.
        refused |= signal_all(pids, signal.SIGKILL)
        # Let the killed exit before the next look; a member that outlives many SIGKILLs is
        # stuck in the kernel (an I/O that does not return): look less often, never give up.
        # The first looks come soon: the end is told only once the tree is seen empty.
        await asyncio.sleep(QUICK_POLL if passes < 20 else TREE_POLL if passes < KILL_ROUNDS else SLOW_POLL)


async def _stop_all(tree: Tree) -> set[int]:
    """Without a cgroup's atomic kill, a freezer of signals: SIGSTOP every member, look again
    (a child forked before its parent stopped is found under it), until a look finds none left
    running; then SIGKILL them all at once. So no member is orphaned (its parent killed) before
    it was seen, as one killed while its children run could be. Returns those we may not signal."""
    stopped, refused = await _stopped(tree)
    refused |= signal_all(stopped, signal.SIGKILL)  # a stopped process dies of SIGKILL too
    return refused


async def _stopped(tree: Tree) -> tuple[set[int], set[int]]:
    """SIGSTOP every member until a look finds none left running: ``(stopped, refused)``."""
    stopped: set[int] = set()
    refused: set[int] = set()
    try:
        for _ in range(KILL_ROUNDS):
            pids = await scan(tree_members, tree) - stopped - refused
            if not pids:
                break
            no = signal_all(pids, signal.SIGSTOP)
            refused |= no
            stopped |= pids - no
    except BaseException:  # cancelled (the agent stops): nothing may stay stopped for good
        signal_all(stopped, signal.SIGCONT)
        raise
    return stopped, refused


async def end_tree(tree: Tree, grace: float, after_term: Callable[[], None] | None = None) -> None:
    """SIGTERM every process of the job (the leader's group too, while it runs), wait up to
    ``grace`` seconds for them to go, then :func:`kill_all` what is left, children forked
    meanwhile included. Returns once none is left.

    ``after_term`` runs right after the SIGTERMs (a job closes its stdin there). Cancelling
    stops the wait: what got SIGTERM may live on.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    if tree.cgroup is None:
        # No cgroup holds them: stop them all first (every one seen, so none is orphaned unseen
        # by its parent's death), then SIGTERM, then let them go on to handle it.
        stopped, _ = await _stopped(tree)
        signal_all(stopped, signal.SIGTERM)
    else:
        stopped = set()
    # The leader's group first, in one kill: a shell and its child get SIGTERM together, so the
    # shell dies of its own before it can report the child's death ("Terminated" on the job's
    # stderr, when one by one reached the child first and a loaded machine ran the shell between).
    if tree.leader:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(tree.leader, signal.SIGTERM)
    if tree.cgroup is not None:
        signal_all(await scan(tree_members, tree), signal.SIGTERM)  # what left the group
    signal_all(stopped, signal.SIGCONT)
    if after_term is not None:
        after_term()
    # No event exists for "every process of the tree is gone": poll the table during grace.
    while loop.time() < deadline:
        if not await scan(tree_members, tree):
            break
        await asyncio.sleep(TREE_POLL)
    await kill_all(tree)
