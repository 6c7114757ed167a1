"""A cgroup per job, wherever one can be made: the membership of a job's tree that no process
can leave by ``setsid``, ``setpgid``, clearing its environment or being orphaned.

The agent makes ``remote-exec-<state id>/<job id>`` below its *own* cgroup in every hierarchy it
can write: the v2 one (``/sys/fs/cgroup``, or ``/sys/fs/cgroup/unified`` on a hybrid host) and
the v1 ``pids``, ``memory``, ``cpuacct`` and ``freezer`` ones (v2 and ``memory`` left out where
v1's ``pids``, ``freezer`` and ``cpuacct`` serve: below). Below its own, so whatever limit
the agent is under (a container's, a test's) binds its jobs too. Root on a host, a container with
a writable or delegated cgroup: made; a jail without ``/sys``, an unprivileged user: none, and
:mod:`.proctree`'s attribution serves alone.

A job's leader is in its cgroups before its ``exec`` (born there from a thread that moved itself
in, or joining between ``fork`` and ``exec`` by writing ``0``, "me": see :func:`~.spawn.joined`),
so every process it ever starts is born inside. On v1 it writes the
``tasks`` file, not ``cgroup.procs``: moving a whole thread group takes the kernel's global
``cgroup_threadgroup_rwsem`` for writing, which waits for an RCU grace period whenever no other
migration ran just before (measured here: 14-25 ms for a job started after a pause of a tenth of a
second, against 1 ms back to back), while a thread moving itself skips that lock; the leader is one
thread, so it is the same move. v2 has no such file, so on a hybrid host (v1 controllers and a
controller-less v2 tree) the jobs' cgroups are the v1 ones alone where ``pids``, ``freezer`` and
``cpuacct`` can be made (and without v1 ``memory``: memory is the members' RSS, and a job's own
memory cgroup outlived its ``rmdir`` while its log's pages stayed charged to it, a dying cgroup per
job in the kernel: 1,605 memory cgroups in ``/proc/cgroups`` for 35 dirs on a test machine after a
day's runs; and 80 us of each start and end): the kill is then the freezer's (freeze, SIGKILL,
thaw: a few reads more than v2's ``cgroup.kill``, and up to ``FREEZE_WAIT`` when a member will not
stop), CPU is ``cpuacct``'s. On a v2-only host the leader joins ``cgroup.procs`` and pays that
wait. Killing goes through the cgroup: ``cgroup.kill`` on v2; on v1 the freezer (freeze, SIGKILL
every member, thaw: nothing forks in between), else SIGKILL to each member. Every call here is a
few small reads or writes of cgroupfs, done inline: the kill path makes no thread and no process.
The one wait, for the freezer to report FROZEN, sleeps between its reads (``kill`` in a thread,
``kill_async`` on the loop): the tasks it waits for must get a CPU to stop, and a loop of reads on
a loaded machine took it from them.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import os
import re
import signal
import time
from collections.abc import Callable, Generator
from typing import cast

from ...protocol.cgroupfs import V2, join_file, mounts, own_paths

__all__ = ["CgroupHome", "JobCgroup", "join", "joining", "move_self"]

_V1_SERVE = frozenset({"pids", "freezer", "cpuacct"})  # where these serve, v2 and memory are left out
_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}")
_READ = 1 << 16
# How long a freeze may stay FREEZING (every member not yet stopped) before the kill gives up on
# it and sends plain SIGKILLs; the reads back off from 0.5 ms to 20 ms.
FREEZE_WAIT = 2.0


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        chunks = []
        while chunk := os.read(fd, _READ):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _procs(d: str) -> set[int]:
    """The processes in cgroup dir ``d`` (its ``cgroup.procs``; none if it cannot be read)."""
    with contextlib.suppress(OSError, ValueError):
        return {int(p) for p in _read(os.path.join(d, "cgroup.procs")).split()}
    return set()


def _write(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def move_self(path: str) -> None:
    """Move this thread (v1's ``tasks``) or this process (``cgroup.procs``) into the cgroup of
    ``path``, its :func:`~remote_exec.protocol.cgroupfs.join_file`."""
    _write(path, b"0")


class CgroupHome:
    """Where this agent makes its jobs' cgroups: one parent dir per hierarchy it can write."""

    def __init__(
        self, parents: dict[str, str], way_back: dict[str, str] | None = None, retired: dict[str, str] | None = None
    ) -> None:
        self.parents = parents
        self.retired = retired or {}  # hierarchies left out: an earlier agent's jobs may still be in them
        # The join file of the agent's own cgroup in each hierarchy of ``parents``, when all are
        # v1's: a thread that moved itself into a job's cgroups to spawn its leader returns
        # through them (:func:`.spawn.inside`).
        self.way_back = way_back

    @classmethod
    def discover(cls, state_id: str) -> CgroupHome | None:
        """Make (or find) ``remote-exec-<state_id>`` below our own cgroup in every hierarchy
        that lets us; None if none does (no cgroupfs, read-only, not ours)."""
        if not _SAFE.fullmatch(state_id):
            return None
        own = own_paths()
        bases = {n: os.path.join(m, own[n].lstrip("/")) for n, m in mounts().items() if n in own}
        parents: dict[str, str] = {}
        retired: dict[str, str] = {}
        for name in sorted(bases, key=lambda n: n not in _V1_SERVE):  # those three first: they decide
            _sweep_parents(bases[name])
            parent = os.path.join(bases[name], f"remote-exec-{state_id}")
            if name in _V1_SERVE or not parents.keys() >= _V1_SERVE:
                with contextlib.suppress(FileExistsError, OSError):  # (not writable: no delegation, read-only)
                    os.mkdir(parent, 0o755)
                if os.access(os.path.join(parent, "cgroup.procs"), os.W_OK):
                    parents[name] = parent
            elif os.path.isdir(parent):  # left out (the module): an earlier agent's, made before
                retired[name] = parent  # its jobs' cgroups are found still (find), the empty ones go
                _remove_empty_jobs(parent, lambda _: True)  # a job's with members stays (EBUSY)
                with contextlib.suppress(OSError):
                    os.rmdir(parent)
        return cls(parents, _way_back({n: bases[n] for n in parents}), retired) if parents else None

    def make(self, job_id: str) -> JobCgroup | None:
        """The new job's cgroups (None if its id is no safe dir name, or none could be made)."""
        if not _SAFE.fullmatch(job_id):
            return None
        dirs: dict[str, str] = {}
        fresh = True
        for name, parent in self.parents.items():
            path = os.path.join(parent, job_id)
            made = _make_in(parent, path)
            if made is not None:
                dirs[name] = path
                fresh = fresh and made
        return JobCgroup(dirs, fresh) if dirs else None

    def find(self, job_id: str) -> JobCgroup | None:
        """A job's cgroups as an earlier agent made them (re-adoption), if any is there."""
        if not _SAFE.fullmatch(job_id):
            return None
        dirs = {n: os.path.join(p, job_id) for n, p in {**self.retired, **self.parents}.items()}
        dirs = {n: d for n, d in dirs.items() if os.path.isdir(d)}
        return JobCgroup(dirs, fresh=False) if dirs else None

    def sweep(self, running: Callable[[str], bool]) -> int:
        """Remove the empty cgroups of jobs not running (a dead agent's); return how many."""
        return sum(
            _remove_empty_jobs(parent, lambda entry: not running(entry.name)) for parent in self.parents.values()
        )

    def close(self) -> None:
        """The agent stops: remove the parents if no job's cgroup is left in them."""
        for parent in self.parents.values():
            with contextlib.suppress(OSError):
                os.rmdir(parent)


# An agent's parent dir: ``remote-exec-`` and a state id (alphanumeric, server._state_id). Only
# these are swept: a jail:// box's delegated cgroup (``remote-exec-box-<hex>``, made beside them
# by the host side) is empty from its mkdir until bwrap joins it, and a local agent's sweep in
# that moment removed it ("bwrap: Can't find source path .../remote-exec-box-...").
_PARENT = re.compile(r"remote-exec-[A-Za-z0-9]{1,32}")
# A job's cgroup with no member whose mtime is this many seconds old is no live start's: a start
# makes it and its leader joins it within milliseconds, and a cgroup with members cannot be
# removed. (A cgroupfs dir's mtime is set at its first lookup after the mkdir; members joining
# and leaving do not move it: a lower bound of its age, by the wall clock.) Any agent removes
# such leftovers of others (an agent killed with jobs, whose state dir is gone, left its jobs'
# cgroups and parent for good: 167 parents on one test machine).
STALE_CGROUP = 60.0


def _way_back(bases: dict[str, str]) -> dict[str, str] | None:
    """Each of ``bases``' ``tasks``, by hierarchy, if this thread can move itself there (it is
    there already: the move is the proof), so that it can come back after spawning a job in its
    cgroups; None on v2 (a process's threads share their v2 cgroup) or where a base is not ours
    to write."""
    if V2 in bases:
        return None
    files = {name: join_file(base, name) for name, base in bases.items()}
    try:
        for path in files.values():
            move_self(path)
    except OSError:
        return None
    return files


def _make_in(parent: str, path: str) -> bool | None:
    """Make the job cgroup ``path`` in ``parent``: True if made here, False if it was there
    already, None if it could not be made.

    Another agent's start removes a parent while it is empty (:func:`_sweep_parents`): made again
    then, and the job's tried again, a few times (a sweep may come between the two mkdirs).
    """
    for _ in range(3):
        try:
            os.mkdir(path, 0o755)
            return True
        except FileExistsError:
            return False  # an id is never reused: a leftover of a dead agent, still the job's
        except FileNotFoundError:
            with contextlib.suppress(OSError):
                os.mkdir(parent, 0o755)
        except OSError:
            return None
    return None


def _sweep_parents(base: str) -> None:
    """Remove the agent parent dirs (:data:`_PARENT`) below ``base`` left by agents that died
    (SIGKILL, OOM, their state dir deleted): their jobs' cgroups once empty and older than
    :data:`STALE_CGROUP`, then the parent if it is empty. A live agent's parent is busy while
    it has a job, and made again for its next one."""
    stale = time.time() - STALE_CGROUP
    with contextlib.suppress(OSError), os.scandir(base) as it:
        for entry in it:
            if _PARENT.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False):
                _remove_empty_jobs(entry.path, lambda job: job.stat(follow_symlinks=False).st_mtime < stale)
                with contextlib.suppress(OSError):
                    os.rmdir(entry.path)  # EBUSY with a job's cgroup in it: left alone


def _remove_empty_jobs(parent: str, which: Callable[[os.DirEntry[str]], bool]) -> int:
    """Remove the job cgroups in ``parent`` that ``which`` names and that are empty; how many."""
    gone = 0
    with contextlib.suppress(OSError), os.scandir(parent) as it:
        for entry in it:
            with contextlib.suppress(OSError):
                if entry.is_dir(follow_symlinks=False) and which(entry):
                    os.rmdir(entry.path)  # EBUSY while it has members: left for later
                    gone += 1
    return gone


class JobCgroup:
    """One job's cgroups, by hierarchy (``unified`` for v2, else the v1 controller)."""

    def __init__(self, dirs: dict[str, str], fresh: bool = False) -> None:
        self.dirs = dirs
        # Every dir made by this start (none was there, set up by a job: see :meth:`can_enter`).
        self.fresh = fresh

    def can_enter(self) -> bool:
        """Whether the agent's thread may step in to spawn the leader (:func:`.spawn.inside`):
        made by this start and not frozen. A job (the agent's user) could have made the next
        job's cgroup ahead, frozen, or frozen the parent (a child is born FREEZING): a thread
        inside would stop with the job. (A job that freezes it in the microseconds between this
        read and the move still can; it could as well ``kill -STOP`` the agent: robustness, not
        a boundary.)"""
        if not self.fresh:
            return False
        freezer = self.dirs.get("freezer")
        with contextlib.suppress(OSError):
            return freezer is None or _read(os.path.join(freezer, "freezer.state")).strip() == b"THAWED"
        return False

    def join_files(self) -> list[str]:
        """The file of each hierarchy the leader writes ``0`` to, to join it: ``tasks`` on v1,
        ``cgroup.procs`` on v2 (see the module; for :func:`~.spawn.trampoline`)."""
        return [join_file(d, name) for name, d in self.dirs.items()]

    def join_fds(self) -> list[int]:
        """Write ends of each :meth:`join_files` file for the leader to join with (see
        :func:`join`); opened here, before the fork, with the agent's rights. The caller closes them."""
        fds: list[int] = []
        for path in self.join_files():
            with contextlib.suppress(OSError):
                fds.append(os.open(path, os.O_WRONLY | os.O_CLOEXEC))
        return fds

    def members(self) -> set[int]:
        """Every process in the job's cgroups now (zombies are not: they left at their exit),
        never the agent (whose thread is in them while it spawns the leader)."""
        pids: set[int] = set()
        for d in self.dirs.values():
            pids |= _procs(d)
        pids.discard(os.getpid())
        return pids

    def cpu_seconds(self) -> float | None:
        """CPU time of every process that was ever in the job, reaped orphans included."""
        with contextlib.suppress(OSError, ValueError, KeyError):
            if "cpuacct" in self.dirs:
                return int(_read(os.path.join(self.dirs["cpuacct"], "cpuacct.usage"))) / 1e9
            if V2 in self.dirs:
                stat = dict(
                    line.split() for line in _read(os.path.join(self.dirs[V2], "cpu.stat")).decode().splitlines()
                )
                return int(stat["usage_usec"]) / 1e6
        return None

    def kill(self) -> bool:
        """One pass of SIGKILL to every member, through the cgroup where it can; True if a
        pass that no fork escapes was made (``cgroup.kill``, or the freezer). Blocking for up
        to ``FREEZE_WAIT`` on a v1 freezer: call it in a thread, or :meth:`kill_async`."""
        steps = self._kill_steps()
        try:
            while True:
                time.sleep(next(steps))
        except StopIteration as done:
            return bool(done.value)

    async def kill_async(self) -> bool:
        """:meth:`kill` for the event loop: the freezer's wait sleeps on the loop. Cancelled
        during that wait: the cgroup is thawed, and no member was signalled."""
        steps = self._kill_steps()
        try:
            while True:  # noqa: ASYNC110  # freezer.state has no change event to wait on
                await asyncio.sleep(next(steps))
        except StopIteration as done:
            return bool(done.value)
        finally:
            steps.close()  # cancelled: the generator's finally thaws

    def _kill_steps(self) -> Generator[float, None, bool]:
        """The kill, yielding how long to sleep wherever it waits; returns what :meth:`kill` does."""
        if V2 in self.dirs:
            with contextlib.suppress(OSError):
                _write(os.path.join(self.dirs[V2], "cgroup.kill"), b"1")
                return True
        freezer = self.dirs.get("freezer")
        # Never with the agent inside: freezing would stop its thread for good (see members()).
        if freezer and os.getpid() not in _procs(freezer) and (yield from self._frozen_kill(freezer)):
            return True
        for pid in self.members():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        return False

    def _frozen_kill(self, d: str) -> Generator[float, None, bool]:
        state = os.path.join(d, "freezer.state")
        try:
            _write(state, b"FROZEN")
            deadline, pause = time.monotonic() + FREEZE_WAIT, 0.0005
            while _read(state).strip() != b"FROZEN":  # FREEZING until every member stopped
                if time.monotonic() > deadline:
                    return False
                yield pause
                pause = min(pause * 2, 0.02)
            for pid in self.members():  # frozen: none forks meanwhile; they die at the thaw
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            return True
        except OSError:
            return False
        finally:
            with contextlib.suppress(OSError):
                _write(state, b"THAWED")

    def remove(self) -> bool:
        """Remove the job's cgroups once empty; True if none is left."""
        left = False
        for d in self.dirs.values():
            try:
                os.rmdir(d)
            except FileNotFoundError:
                pass
            except OSError as exc:
                left = left or exc.errno == errno.EBUSY or os.path.isdir(d)
        return not left


def join(fds: list[int]) -> None:
    """In the child, before ``exec``: move this process into the job's cgroups. Failures are
    ignored (the job runs, found by :mod:`.proctree`'s attribution instead)."""
    for fd in fds:
        with contextlib.suppress(OSError):
            os.write(fd, b"0")


def joining(cgroup: JobCgroup | None, popen_kwargs: dict[str, object]) -> list[int]:
    """Have the leader of a spawn with ``popen_kwargs`` (``subprocess.Popen``'s) join ``cgroup``
    before ``exec``, ahead of any ``preexec_fn`` already there; returns the fds to close after
    the spawn (none without a cgroup). (:func:`~.spawn.joined` takes a faster way, the thread's
    own move or the trampoline, where it can.)"""
    fds = cgroup.join_fds() if cgroup is not None else []
    if fds:
        then = cast("Callable[[], None] | None", popen_kwargs.get("preexec_fn"))
        popen_kwargs["preexec_fn"] = functools.partial(_in_child, fds, then)
    return fds


def _in_child(fds: list[int], then: Callable[[], None] | None) -> None:
    join(fds)
    if then is not None:
        then()
