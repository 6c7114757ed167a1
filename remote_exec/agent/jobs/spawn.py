"""Starting a job's process: fork+exec in a session of its own, and the error a failed start raises.

A job's leader must join its cgroups before it can start anything (:mod:`.cgroup`). Done with a
``preexec_fn``, Python forks the whole agent (page tables of ~100 MB) and runs Python in the
child: 5 ms a start, measured, against 0.2 ms for the ``vfork`` path ``subprocess`` takes when
there is no ``preexec_fn``.

Where every job cgroup is v1's (a hybrid or v1-only host), no other process is needed: a new process is
born in the cgroups of the thread that forked it, and on v1 a thread moves alone, by writing ``0``
to ``tasks``. So the agent's thread moves itself into the job's cgroups, spawns the leader with
``vfork`` and moves back (:func:`inside`): six small writes, against the ``/bin/sh`` a trampoline
execs first (a start took 0.83 ms this way and 1.45 ms through it, measured with ``echo``). The
thread is in the job's cgroups only within that synchronous call: no other task of the loop runs,
and the job cannot be killed (through the freezer, which would stop the agent with it) before it
exists. Its way back is the agent's own cgroups, proven writable when the home was made
(:attr:`.cgroup.CgroupHome.way_back`).

Elsewhere (v2: a process's threads share one cgroup; a v1 host where the agent's own cgroups
cannot be written to come back; a job cgroup that was there before the start or is frozen, which
a job could have set up: :meth:`.cgroup.JobCgroup.can_enter`) the leader is started through :func:`trampoline`:
``/bin/sh`` (``vfork`` + ``exec``) writes ``0`` ("me") to each hierarchy's join file (v1's ``tasks``,
v2's ``cgroup.procs``: :meth:`.cgroup.JobCgroup.join_files`) and then ``exec``s
the job's own argv, the same process: nothing of the job runs outside its cgroups. Where it
cannot (no ``/bin/sh`` in the sandbox, a job run as another user, who cannot write the agent's
cgroups, or a ``preexec_fn`` needed anyway: a terminal's, a ``nice``), the ``preexec_fn`` stays.
The trampoline's ``exec`` cannot fail the spawn as ``Popen`` does for a missing command, so
:func:`check_command` looks the command up first and raises as ``Popen`` would.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import shlex
import stat
import subprocess
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

from ...errors import NoSpaceError, SpawnError
from ...protocol.cgroupfs import V2, join_file
from .cgroup import CgroupHome, JobCgroup, joining, move_self

__all__ = ["SH", "check_command", "inside", "joined", "popen_session", "sh_runs", "spawn_error", "trampoline"]

log = logging.getLogger("remote_exec.agent")

SH = "/bin/sh"


def popen_session(
    argv: list[str], stdin: int, out: int, err: int, cwd: str | None, env: dict[str, str], **kwargs: Any
) -> subprocess.Popen[bytes]:
    """fork+exec in a session of its own (SIGINT and kills reach its group only), fds closed;
    synchronous like asyncio's own ``subprocess_exec`` (it waits for the exec). Jobs and shells."""
    return subprocess.Popen(
        argv,
        stdin=stdin,
        stdout=out,
        stderr=err,
        cwd=cwd,
        env=env,
        start_new_session=True,
        close_fds=True,
        **kwargs,
    )


@functools.cache
def sh_runs() -> bool:
    """Whether this sandbox has a ``/bin/sh`` to run the trampoline (a distroless image has none)."""
    return os.access(SH, os.X_OK)


def joined(
    cgroup: JobCgroup | None,
    home: CgroupHome | None,
    argv: list[str],
    kwargs: dict[str, object],
    env: dict[str, str],
    cwd: str | None,
) -> tuple[list[str], list[int], AbstractContextManager[None]]:
    """What has a leader spawned with ``argv`` and ``kwargs`` (``Popen``'s) join ``cgroup``
    (made in ``home``) before ``exec``: the spawning thread :func:`inside` it where it can (v1
    only, its dirs made by this start and not frozen, the home's way back known), else the :func:`trampoline`,
    else a ``preexec_fn`` (:func:`.cgroup.joining`). The argv to spawn, the fds to close after
    the spawn, and what to spawn within.

    :raises OSError: the trampoline's command cannot be executed (:func:`check_command`).
    """
    plain = not {"preexec_fn", "user", "group"} & kwargs.keys()
    if (
        cgroup is not None
        and plain
        and home is not None
        and home.way_back
        and V2 not in cgroup.dirs
        and cgroup.can_enter()
    ):
        return argv, [], inside(cgroup, home)
    if cgroup is not None and plain and sh_runs():
        check_command(argv[0], cwd, env)
        return trampoline(argv, cgroup.join_files()), [], contextlib.nullcontext()
    return argv, joining(cgroup, kwargs), contextlib.nullcontext()


@contextlib.contextmanager
def inside(cgroup: JobCgroup, home: CgroupHome) -> Iterator[None]:
    """This thread in ``cgroup``'s v1 hierarchies while the body spawns (the child is born there),
    then back through the ``home``'s way back (each hierarchy's ``tasks`` of the agent's own
    cgroups), even if the spawn failed. A failed join is skipped, as the trampoline skips it: the
    job runs, found by attribution instead.

    A way back that fails (the agent's cgroup moved or removed since it started) is tried
    through the jobs' parent dir instead (the agent's own, below its cgroup), and later spawns
    stop moving the thread. Should that fail too, the agent is never frozen or signalled by the
    job's kill (:meth:`.cgroup.JobCgroup.members` leaves it out), but what this thread spawns
    later is born in that job's cgroup, and the job's kill ends it (logged as an error).
    """
    way_back = home.way_back
    assert way_back, "a spawn from inside needs the way back (see joined)"
    try:
        for path in cgroup.join_files():
            with contextlib.suppress(OSError):
                move_self(path)
        yield
    finally:
        for name, path in way_back.items():
            try:
                move_self(path)
            except OSError as exc:
                home.way_back = None  # the trampoline from now on
                try:
                    move_self(join_file(home.parents[name], name))
                    log.warning("the agent's %s cgroup cannot be rejoined (%s): jobs start through sh now", name, exc)
                except OSError as again:
                    # Whatever this thread spawns from now on (a shell session, a trampoline
                    # before it joins its own) is born in that job's cgroup, and its kill ends it.
                    log.error("the agent's thread may be left in a job's %s cgroup: %s; %s", name, exc, again)


def trampoline(argv: list[str], procs: list[str]) -> list[str]:
    """``argv`` run by ``/bin/sh`` after it joined the cgroups by writing ``0`` to each of ``procs``
    (a failed join is skipped silently: the job runs, found by attribution instead)."""
    joins = "".join(f"{{ echo 0 >{shlex.quote(path)}; }} 2>/dev/null; " for path in procs)
    return [SH, "-c", joins + 'exec "$@"', "sh", *argv]


def check_command(argv0: str, cwd: str | None, env: dict[str, str]) -> None:
    """Raise what ``Popen`` would for a command that cannot be executed (the trampoline's
    ``exec`` would fail in the child instead, as exit 127).

    :raises FileNotFoundError: no such command (on ``PATH``, or at the path given).
    :raises PermissionError: found, but not an executable file.
    """
    if "/" in argv0:
        candidates = [os.path.join(cwd or os.getcwd(), argv0)]
    else:
        candidates = [os.path.join(d or ".", argv0) for d in os.get_exec_path(env)]
    denied = False
    for path in candidates:
        try:
            st = os.stat(path)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and os.access(path, os.X_OK):
            return
        denied = True
    code = errno.EACCES if denied else errno.ENOENT
    raise (PermissionError if denied else FileNotFoundError)(code, os.strerror(code), argv0)


def spawn_error(exc: OSError | ValueError, job_id: str, what: str) -> Exception:
    """The error for a start that failed with ``exc``: a full disk is :class:`NoSpaceError`."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        name = errno.errorcode[exc.errno]
        return NoSpaceError(
            f"cannot start {what}: the sandbox's disk is full ({name})", data={"errno": name, "job_id": job_id}
        )
    return SpawnError(f"cannot start {what}: {exc}", job_id=job_id)
