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
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..errors import SandboxError

__all__ = ["JAIL_ENV", "WORKSPACE", "Bind", "JailBox", "JailConfig", "bwrap_argv", "check_box", "exec_argv"]

WORKSPACE = "/workspace"
"""Where the box's writable work dir is mounted, and where execs start."""

JAIL_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/tmp",  # the root is read-only; /tmp is the box's own tmpfs
    "LANG": "C.UTF-8",
}
"""The whole environment of an exec (nothing of the host's leaks in)."""

# Top-level host entries the box does not inherit: it gets its own /proc, /dev and /tmp, an
# empty /run (host daemons' Unix sockets live there, and a read-only mount does not stop
# connect()), and its work dir at /workspace.
_REPLACED = frozenset({"proc", "dev", "tmp", "run", WORKSPACE.lstrip("/")})
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


def _under(path: str, tops: frozenset[str]) -> bool:
    return path.lstrip("/").split("/", 1)[0] in tops


def _agent_paths() -> list[str]:
    """Host paths the agent (this interpreter and package) needs that the box would hide."""
    import remote_exec

    paths = {sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(remote_exec.__file__))}
    paths.add(os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))))
    return sorted(p for p in paths if _under(p, _REPLACED) and os.path.isdir(p))


def bwrap_argv(config: JailConfig, status_fd: int) -> list[str]:
    """The ``bwrap`` command line that starts the box's init for ``config``."""
    argv = ["bwrap"]
    # The host's root, read-only, entry by entry on bwrap's tmpfs root (not `--ro-bind / /`:
    # on a read-only root there would be nowhere to create the /workspace mount point).
    for entry in sorted(os.listdir("/")):
        path = "/" + entry
        if entry in _REPLACED:
            continue
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        else:
            argv += ["--ro-bind", path, path]
    argv += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--tmpfs", "/run"]
    argv += ["--bind", os.fspath(config.work), WORKSPACE, "--chdir", WORKSPACE]
    for path in _agent_paths():  # e.g. a venv under /tmp: the agent runs with this interpreter
        argv += ["--ro-bind", path, path]
    for bind in config.binds:
        argv += ["--bind" if bind.writable else "--ro-bind", bind.source, bind.dest]
    argv += ["--unshare-all", "--hostname", "jail"]
    if config.net == "host":
        argv.append("--share-net")
        resolv = os.path.realpath("/etc/resolv.conf")
        if _under(resolv, frozenset({"run", "tmp"})) and os.path.exists(resolv):
            argv += ["--ro-bind", resolv, resolv]  # systemd-resolved's stub lives in /run
    argv += ["--die-with-parent", "--new-session", "--cap-drop", "ALL", "--remount-ro", "/"]
    return [*argv, "--json-status-fd", str(status_fd), "--", *_INIT]


def exec_argv(pid: int, argv: Sequence[str]) -> list[str]:
    """The host command that runs ``argv`` in the box whose init is host PID ``pid``.

    It starts in :data:`WORKSPACE` with just :data:`JAIL_ENV`, no capabilities, and dies by
    SIGKILL when the host-side ``nsenter`` dies.
    """
    assignments = [f"{k}={v}" for k, v in JAIL_ENV.items()]
    drop = ["--pdeathsig", "KILL", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"]
    return [
        *["nsenter", "--all", "--target", str(pid), "--root", "--"],
        *["setpriv", *drop, "--"],
        *["env", "-i", "-C", WORKSPACE, *assignments, *argv],
    ]


def check_box(pid: int) -> None:
    """Check that host PID ``pid`` is the init of a bubblewrap box, before we nsenter it.

    A stale PID may have been reused by any process, and nsenter'ing as root into the host's
    own namespaces would run commands unjailed.

    :raises SandboxError: it is not (or no longer) a box.
    """
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        status = Path(f"/proc/{pid}/status").read_text()
        same_mnt = os.readlink(f"/proc/{pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt")
        same_pid = os.readlink(f"/proc/{pid}/ns/pid") == os.readlink("/proc/self/ns/pid")
    except OSError as exc:
        raise SandboxError(f"no jail box with init PID {pid}: {exc}") from None
    nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
    if comm != "bwrap" or same_mnt or same_pid or nspid[-1:] != ["1"]:
        raise SandboxError(f"PID {pid} is not the init of a bubblewrap box")


class JailBox:
    """A running box. :meth:`launch` it, :meth:`wait_ready`, exec with :func:`exec_argv`, :meth:`kill`.

    Blocking methods; from async code run :meth:`wait_ready` and :meth:`kill` in a worker
    thread, but call :meth:`launch` in the thread that owns the box: bwrap's
    ``--die-with-parent`` fires when the *thread* that started it exits.

    :ivar pid: host PID of the box's init (valid once :meth:`wait_ready` returned).
    """

    def __init__(self, proc: subprocess.Popen[bytes], status_fd: int) -> None:
        self._proc = proc
        self._status_fd = status_fd
        self.pid = 0

    @classmethod
    def launch(cls, config: JailConfig) -> JailBox:
        """Start bwrap for ``config`` (returns at once; the box is not ready yet).

        :raises SandboxError: bwrap cannot be run.
        """
        read_fd, write_fd = os.pipe()
        try:
            proc = subprocess.Popen(
                bwrap_argv(config, write_fd),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(write_fd,),
                start_new_session=True,  # a Ctrl-C meant for the host must not kill the box
            )
        except OSError as exc:
            os.close(read_fd)
            raise SandboxError(f"cannot run bwrap: {exc}") from None
        finally:
            os.close(write_fd)
        return cls(proc, read_fd)

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
            self._close_pipes()
            raise SandboxError(f"bwrap failed to start the jail: {err or 'no message'}")
        self._close_pipes()  # nothing more comes; the init must never block on a full pipe

    def alive(self) -> bool:
        """True while the box runs (its bwrap monitor exits when the init dies)."""
        return self._proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the init (and so everything in the box); wait for bwrap. Idempotent."""
        self._terminate()
        self._close_pipes()
        self._close_status()

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
