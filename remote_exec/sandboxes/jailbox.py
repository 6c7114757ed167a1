"""A bubblewrap "box": one long-lived jailed init process that every exec joins with ``nsenter``.

The box is the ``docker run`` half of ``jail://``; :func:`exec_argv` is its ``docker exec``.
The odd bits come from behaviour measured on our machines:

- bwrap reports the init's PID (``--json-status-fd``) *before* its mounts are done: an
  ``nsenter`` right after it fails half the time. The init prints ``ready`` once it runs, and
  :meth:`JailBox.wait_ready` waits for that line.
- ``nsenter`` carries the host's environment and full capabilities into the box. Every exec
  therefore goes through ``setpriv`` (empty bounding/inheritable sets: a root process then
  gains nothing at ``execve``; no-new-privs) and ``env -i``.
- Killing ``nsenter`` does not kill what it started. ``setpriv --pdeathsig KILL`` ties the
  exec'd process itself to it, so a killed channel closes its pipes the way a killed
  ``docker exec`` does; grandchildren (the agent server) are not affected, by design.
- The init (bwrap's own PID 1 in the box) ignores SIGTERM: teardown is SIGKILL, which takes
  the whole PID namespace with it.

Who runs in the box (issue #12). uid 0 without capabilities still *owns* root's files and
sockets, and a read-only bind does not stop ``connect()``: a root job once reached a root
``local://`` agent under ``/var/tmp`` and had it write on the host. Measured options:

- bwrap as root with ``--unshare-user`` maps box root to host root (``0 0 1``): no gain.
  Running bwrap itself as an unprivileged uid gives a user namespace owned by that uid, but
  then the box's monitor is owned by the same uid its jobs run as, and a job could forge a
  "box" :func:`~.jailcheck.check_box` would have to believe.
- Chosen, when the host side is root: bwrap *without* a user namespace (so the monitor and
  the init stay root-owned, capability-less, and unforgeable by anyone but root), and every
  exec switches to a dedicated uid/gid :data:`JAIL_UID` (``setpriv --reuid --regid
  --clear-groups``) that no account uses. Jobs and the agent own nothing on the host but the
  work dir, which must be usable by that uid (:func:`prepare_work`).
- As a non-root host user, bwrap needs a user namespace, which can only map to that user:
  jobs run as that user (no capabilities), and what keeps them from the user's own sockets
  is the next point.
- The box sees only the system dirs programs need (:data:`SYSTEM_DIRS`), the agent's paths
  and the asked-for binds; not ``/var``, ``/home``, ``/root``, ``/srv``, ``/mnt``, ``/sys``...
  where daemons and agents keep their sockets. No ``/sys`` at all: the host's would list the
  host's network interfaces, and bwrap 0.8 cannot mount a fresh one. Only the box's own
  delegated cgroup dirs appear under ``/sys/fs/cgroup`` (:mod:`.jailcgroup`), as root.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import select
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..errors import SandboxError
from .jailcgroup import BoxCgroup, joined

__all__ = [
    "JAIL_ENV",
    "JAIL_UID",
    "MARKER",
    "SYSTEM_DIRS",
    "WORKSPACE",
    "Bind",
    "JailBox",
    "JailConfig",
    "bwrap_argv",
    "exec_argv",
    "jail_uid",
    "prepare_work",
]

WORKSPACE = "/workspace"
"""Where the box's writable work dir is mounted, and where execs start."""

JAIL_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/tmp",  # the root is read-only; /tmp is the box's own tmpfs
    "LANG": "C.UTF-8",
}
"""The whole environment of an exec (nothing of the host's leaks in)."""

JAIL_UID = 65533
"""The uid and gid jobs and the agent run as when the host side is root (Debian reserves
65000-65533 and gives them to no account; :func:`jail_uid` refuses it if an account has it)."""

SYSTEM_DIRS = frozenset({"usr", "etc", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "opt"})
"""The top-level host dirs a box sees (read-only). Everything else, where sockets live
(``/var``, ``/home``, ``/root``, ``/srv``, ``/mnt``, ``/run``, ``/tmp``...), stays out unless
it holds the agent or is bound with ``?ro=``/``?rw=``."""

MARKER = "/run/remote-exec-jail"
"""A directory only our launch creates in the box's private ``/run``; :func:`~.jailcheck.check_box` looks for it."""

_INIT = ["sh", "-c", "echo ready; exec sleep infinity"]


@dataclass(frozen=True)
class Bind:
    """An extra bind mount: host ``source`` at ``dest`` in the box."""

    source: str
    dest: str
    writable: bool = False

    @classmethod
    def parse(cls, spec: str, writable: bool) -> Bind:
        """``/host/path`` (same path in the box) or ``/host/path:/box/path``.

        :raises SandboxError: a path is not absolute.
        """
        source, _, dest = spec.partition(":")
        dest = dest or source
        if not (source.startswith("/") and dest.startswith("/")):
            raise SandboxError(f"bind paths must be absolute: {spec!r}")
        return cls(os.path.normpath(source), os.path.normpath(dest), writable)


@dataclass(frozen=True)
class JailConfig:
    """What a box is made of.

    :ivar work: host directory mounted read-write at :data:`WORKSPACE`.
    :ivar binds: extra bind mounts, applied in order after the work dir.
    :ivar net: ``none`` (own network namespace, loopback only) or ``host``.
    """

    work: Path
    binds: tuple[Bind, ...] = ()
    net: Literal["none", "host"] = "none"


def jail_uid() -> int | None:
    """The uid execs switch to: :data:`JAIL_UID` when we are root, None (stay the host user,
    in bwrap's user namespace) otherwise.

    :raises SandboxError: an account has :data:`JAIL_UID` (jobs would act as that account).
    """
    if os.geteuid() != 0:
        return None
    try:
        owner = pwd.getpwuid(JAIL_UID).pw_name
    except KeyError:
        return JAIL_UID
    raise SandboxError(f"uid {JAIL_UID} belongs to the account {owner!r}; jail:// needs it unused")


def prepare_work(work: Path, created: bool) -> None:
    """Make ``work`` usable by the jail's uid: a dir we ``created`` is given to it; a given one
    must at least let it in (``r-x``, else no exec could start there); jobs can write in it
    only if that uid may (e.g. ``chown 65533 DIR``). Blocking.

    :raises SandboxError: not a directory, or one the jail's uid cannot enter.
    """
    uid = jail_uid()
    if uid is None:
        return  # the jobs run as the host user, who chose the dir
    if created:
        os.chown(work, uid, uid)
        return
    st = os.stat(work)
    # The permission class the kernel applies to that uid (its only group is its own gid).
    shift = 6 if st.st_uid == uid else 3 if st.st_gid == uid else 0
    if not stat.S_ISDIR(st.st_mode) or (st.st_mode >> shift) & 0o5 != 0o5:
        raise SandboxError(f"work dir {work} must be a directory the jail's uid {uid} can enter (chown {uid} {work})")


def _under(path: str, tops: frozenset[str]) -> bool:
    return path.lstrip("/").split("/", 1)[0] in tops


def _agent_paths() -> list[str]:
    """Host paths the agent (this interpreter and package) needs that the box would hide."""
    package = os.path.dirname(os.path.dirname(__file__))  # remote_exec/, found without importing it
    paths = {sys.prefix, sys.base_prefix, os.path.dirname(package)}
    paths.add(os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))))
    return sorted(p for p in paths if not _under(p, SYSTEM_DIRS) and os.path.isdir(p))


def _parents(dest: str) -> list[str]:
    """Create ``dest``'s missing parents 0755: bwrap makes them 0700 (root's), which the jail's
    uid could not pass. Existing dirs are left as they are (bwrap does not chmod them)."""
    parts = dest.strip("/").split("/")[:-1]
    paths = ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]
    return [arg for path in paths if not _under(path, SYSTEM_DIRS) for arg in ("--perms", "0755", "--dir", path)]


def bwrap_argv(config: JailConfig, status_fd: int, cgroup: BoxCgroup | None = None) -> list[str]:
    """The ``bwrap`` command line that starts the box's init for ``config``, showing the box's
    delegated ``cgroup`` (if any) where the agent looks for its own (see :mod:`.jailcgroup`)."""
    argv = ["bwrap"]
    # The system dirs, read-only, one by one on bwrap's tmpfs root (not `--ro-bind / /`: that
    # would show every host socket, and leave nowhere to create the /workspace mount point).
    for entry in sorted(SYSTEM_DIRS):
        path = "/" + entry
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    argv += ["--dev", "/dev", "--proc", "/proc", "--perms", "1777", "--tmpfs", "/tmp"]
    argv += ["--perms", "1777", "--tmpfs", "/dev/shm", "--tmpfs", "/run", "--dir", MARKER]
    # No --chdir: the capability-less root init may not enter a work dir owned by JAIL_UID
    # (0700), and every exec starts there anyway (env -C).
    argv += ["--bind", os.fspath(config.work), WORKSPACE, "--chdir", "/"]
    for path in _agent_paths():  # e.g. a venv in /home: the agent runs with this interpreter
        argv += [*_parents(path), "--ro-bind", path, path]
    for bind in config.binds:
        argv += [*_parents(bind.dest), "--bind" if bind.writable else "--ro-bind", bind.source, bind.dest]
    if cgroup is not None:
        argv += cgroup.binds()
    # No --unshare-all: as root it adds a user namespace mapping box root to host root, and
    # execs could then not switch to JAIL_UID. A non-root bwrap needs one (and maps to us).
    argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--hostname", "jail"]
    if os.geteuid() != 0:
        argv.append("--unshare-user")
    if config.net == "host":
        resolv = os.path.realpath("/etc/resolv.conf")
        if not _under(resolv, SYSTEM_DIRS) and os.path.exists(resolv):
            argv += ["--ro-bind", resolv, resolv]  # systemd-resolved's stub lives in /run
    else:
        argv.append("--unshare-net")
    argv += ["--die-with-parent", "--new-session", "--cap-drop", "ALL", "--remount-ro", "/"]
    return [*argv, "--json-status-fd", str(status_fd), "--", *_INIT]


def exec_argv(pid: int, argv: Sequence[str], cgroup_procs: Sequence[str] = ()) -> list[str]:
    """The host command that runs ``argv`` in the box whose init is host PID ``pid``, joining
    the box's cgroup first (writing ``0`` to its ``cgroup_procs``, the join files of
    :mod:`.jailcgroup`) if it has one.

    It starts in :data:`WORKSPACE` with just :data:`JAIL_ENV`, no capabilities, as
    :func:`jail_uid` (when we are root), and dies by SIGKILL when the host-side ``nsenter`` dies.

    :raises SandboxError: see :func:`jail_uid`.
    """
    uid = jail_uid()
    assignments = [f"{k}={v}" for k, v in JAIL_ENV.items()]
    # setpriv applies the uid before --pdeathsig (which a uid change would clear).
    switch = ["--reuid", str(uid), "--regid", str(uid), "--clear-groups"] if uid is not None else []
    drop = ["--pdeathsig", "KILL", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"]
    # Non-root, the box's user namespace maps only us: keep our ids instead of nsenter's setuid(0).
    keep = ["--preserve-credentials"] if os.geteuid() != 0 else []
    # Joined before nsenter enters the box's cgroup namespace: inside it, the exec's cgroup
    # then reads "/" (from outside the namespace's root it would read "/..", and the agent
    # would find no cgroup of its own).
    return joined(
        cgroup_procs,
        [
            *["nsenter", "--all", *keep, "--target", str(pid), "--root", "--"],
            *["setpriv", *switch, *drop, "--"],
            *["env", "-i", "-C", WORKSPACE, *assignments, *argv],
        ],
    )


class JailBox:
    """A running box. :meth:`launch` it, :meth:`wait_ready`, exec with :func:`exec_argv`, :meth:`kill`.

    Blocking methods; from async code run :meth:`wait_ready` and :meth:`kill` in a worker
    thread, but call :meth:`launch` in the thread that owns the box: bwrap's
    ``--die-with-parent`` fires when the *thread* that started it exits.

    :ivar pid: host PID of the box's init (valid once :meth:`wait_ready` returned).
    :ivar cgroup: the box's delegated cgroup (None without one), removed by :meth:`kill`.
    """

    def __init__(self, proc: subprocess.Popen[bytes], status_fd: int, cgroup: BoxCgroup | None = None) -> None:
        self._proc = proc
        self._status_fd = status_fd
        self.pid = 0
        self.cgroup = cgroup

    @classmethod
    def launch(cls, config: JailConfig) -> JailBox:
        """Start bwrap for ``config`` (returns at once; the box is not ready yet).

        :raises SandboxError: bwrap cannot be run.
        """
        cgroup = BoxCgroup.make(jail_uid())
        procs = cgroup.procs() if cgroup is not None else []
        read_fd, write_fd = os.pipe()
        try:
            # bwrap joins the box's cgroup before it runs: its init unshares the cgroup
            # namespace there, so the box's "/" is the box's cgroup.
            proc = subprocess.Popen(
                joined(procs, bwrap_argv(config, write_fd, cgroup)),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(write_fd,),
                start_new_session=True,  # a Ctrl-C meant for the host must not kill the box
            )
        except OSError as exc:
            os.close(read_fd)
            if cgroup is not None:
                cgroup.remove()
            raise SandboxError(f"cannot run bwrap: {exc}") from None
        finally:
            os.close(write_fd)
        return cls(proc, read_fd, cgroup)

    @classmethod
    def start(cls, config: JailConfig, timeout: float = 30.0) -> JailBox:
        """:meth:`launch` and :meth:`wait_ready` in one blocking call.

        :raises SandboxError: the box did not come up.
        """
        box = cls.launch(config)
        box.wait_ready(timeout)
        return box

    @property
    def url(self) -> str:
        """The ``jail://PID`` URL that attaches sandboxes to this box (without owning it)."""
        return f"jail://{self.pid}"

    def _line(self, fd: int, deadline: float) -> bytes:
        buf = b""
        while not buf.endswith(b"\n"):
            if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise TimeoutError
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            buf += chunk
        return buf

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait until the init runs with every mount in place; then :attr:`pid` is set.

        On failure the box is killed.

        :raises SandboxError: bwrap failed (its message included) or timed out.
        """
        assert self._proc.stdout is not None and self._proc.stderr is not None
        deadline = time.monotonic() + timeout
        ready = b""
        try:
            pid_line = self._line(self._status_fd, deadline)  # empty: bwrap gave up before cloning
            with contextlib.suppress(ValueError, KeyError, TypeError):
                self.pid = int(json.loads(pid_line)["child-pid"])
            if self.pid:
                ready = self._line(self._proc.stdout.fileno(), deadline)
        except TimeoutError:
            self.kill()
            raise SandboxError(f"the jail did not start within {timeout} s") from None
        finally:
            self._close_status()
        if ready != b"ready\n":
            self._terminate()
            err = self._proc.stderr.read().decode(errors="replace").strip()
            self.kill()  # the pipes, and the box's cgroup
            raise SandboxError(f"bwrap failed to start the jail: {err or 'no message'}")
        self._close_pipes()  # nothing more comes; the init must never block on a full pipe

    def alive(self) -> bool:
        """True while the box runs (its bwrap monitor exits when the init dies)."""
        return self._proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the init (and so everything in the box); wait for bwrap; remove the box's
        cgroup (waits for its last processes to leave). Idempotent."""
        self._terminate()
        self._close_pipes()
        self._close_status()
        cgroup, self.cgroup = self.cgroup, None
        if cgroup is not None:
            cgroup.remove()

    def _terminate(self) -> None:
        # While the bwrap monitor lives, its child (the init) is not reaped, so `pid` cannot
        # have been reused: only then is the signal safe to send.
        if self.pid and self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        elif self.alive():  # no init PID known: kill bwrap, --die-with-parent takes the rest
            self._proc.kill()
        self._proc.wait()

    def _close_status(self) -> None:
        if self._status_fd >= 0:
            os.close(self._status_fd)
            self._status_fd = -1

    def _close_pipes(self) -> None:
        for pipe in (self._proc.stdout, self._proc.stderr):
            if pipe is not None:
                pipe.close()
