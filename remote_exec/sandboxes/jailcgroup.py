"""A delegated cgroup per ``jail://`` box, so the agent inside makes a cgroup per job there too.

Without one the agent in a box finds no cgroupfs (the box has no ``/sys``) and attributes a job's
processes by session, marker and parent; an env-cleared ``setsid`` child orphaned before the
agent's first look escaped ``kill()`` and the timeout. When the host side is root (the box then
runs its execs as :data:`~.jailbox.JAIL_UID`) and a hierarchy is writable:

- :meth:`BoxCgroup.make` creates ``remote-exec-box-<id>`` below the host side's own cgroup in
  the v2 hierarchy and the v1 ``pids``, ``memory``, ``cpuacct`` and ``freezer`` ones, and hands
  it to the jail's uid (the dir, ``cgroup.procs``, and on v2 ``cgroup.subtree_control`` and
  ``cgroup.threads``: the delegation set of the kernel's cgroup-v2 docs). The box's limits
  files stay root's: a job cannot lift a limit the host set on the box.
- bwrap and every exec's ``nsenter`` join those cgroups *before* they run (:func:`joined`, a
  shell prefix). bwrap's ``--unshare-cgroup-try`` then roots the box's cgroup namespace at the
  box's cgroup (``/proc/self/cgroup`` reads ``/`` inside), and an exec entering that namespace
  from inside it reads ``/`` too. bwrap 0.8 has no ``--cgroup`` option, hence the prefix.
- The box sees each dir at the place the agent looks (``/sys/fs/cgroup/<hierarchy>``, v2 at
  ``/sys/fs/cgroup/unified``) and nothing else of ``/sys``. The agent's ordinary cgroup code
  then makes ``remote-exec-<state>/<job>`` below; no agent-side special case.
- :meth:`BoxCgroup.remove` SIGKILLs what is left in the tree (the box's end already killed its
  PID namespace; ``nsenter`` parents may linger a moment) and removes the dirs, deepest first.

A job (the jail's uid) can make sub-cgroups and move its own processes between them, as the
agent does; it cannot move root's processes (v1 needs a matching uid) nor write the box's limit
files. Non-root, or no writable hierarchy: no box cgroup, and the attribution serves alone.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from collections.abc import Sequence

from ..protocol.cgroupfs import MOUNT, V2, join_file, mounts, own_paths

__all__ = ["PREFIX", "BoxCgroup", "joined", "procs_of"]

PREFIX = "remote-exec-box-"
_V2_DELEGATE = ("cgroup.procs", "cgroup.subtree_control", "cgroup.threads")
REMOVE_WAIT = 10.0  # seconds for the box's last processes (nsenter parents) to exit


class BoxCgroup:
    """One box's delegated cgroup dirs, by hierarchy (``unified`` for v2, else the controller).

    :ivar dirs: host path of the box's dir in each hierarchy.
    """

    def __init__(self, dirs: dict[str, str]) -> None:
        self.dirs = dirs

    @classmethod
    def make(cls, uid: int | None) -> BoxCgroup | None:
        """Create and delegate the box's dirs to ``uid``; None when not root (``uid`` None) or
        no hierarchy is writable. Blocking (a few cgroupfs calls)."""
        if uid is None or os.geteuid() != 0:
            return None
        name = PREFIX + secrets.token_hex(6)
        own = own_paths()
        dirs: dict[str, str] = {}
        for hier, mount in mounts().items():
            if hier not in own:
                continue
            path = os.path.join(mount, own[hier].lstrip("/"), name)
            try:
                os.mkdir(path, 0o755)
                os.chown(path, uid, uid)
                for f in _V2_DELEGATE if hier == V2 else ("cgroup.procs", "tasks"):
                    with contextlib.suppress(FileNotFoundError):
                        os.chown(os.path.join(path, f), uid, uid)
            except OSError:
                with contextlib.suppress(OSError):
                    os.rmdir(path)
                continue  # read-only or foreign hierarchy: the others may still do
            dirs[hier] = path
        return cls(dirs) if dirs else None

    def binds(self) -> list[str]:
        """bwrap arguments showing each dir where the agent looks for its own cgroup."""
        argv: list[str] = []
        for path in ("/sys", "/sys/fs", MOUNT):
            argv += ["--perms", "0755", "--dir", path]  # bwrap would make them 0700, root's
        for hier, path in sorted(self.dirs.items()):
            argv += ["--bind", path, os.path.join(MOUNT, hier)]
        return argv

    def procs(self) -> list[str]:
        """The files a process writes ``0`` to, to join the box (:func:`join_file`)."""
        return [join_file(d, hier) for hier, d in self.dirs.items()]

    def _tree(self) -> list[str]:
        """Every dir of the box's trees, deepest first."""
        found: list[str] = []
        for top in self.dirs.values():
            for root, _subdirs, _files in os.walk(top, topdown=False):
                found.append(root)
        return found

    def remove(self, wait: float = REMOVE_WAIT) -> bool:
        """SIGKILL what is left in the box's cgroups and remove them; True if all went.
        Blocking, at most ``wait`` seconds (exiting processes leave their cgroup a moment late)."""
        deadline = time.monotonic() + wait
        while True:
            for d in self._tree():
                with contextlib.suppress(OSError, ValueError), open(os.path.join(d, "cgroup.procs")) as f:
                    for pid in f.read().split():
                        with contextlib.suppress(OSError):
                            os.kill(int(pid), signal.SIGKILL)
                with contextlib.suppress(OSError):
                    os.rmdir(d)
            if not any(os.path.isdir(d) for d in self.dirs.values()) or time.monotonic() > deadline:
                break
            time.sleep(0.02)  # the killed are exiting; cgroupfs gives no event for "empty" on v1
        return not any(os.path.isdir(d) for d in self.dirs.values())


def procs_of(pid: int) -> list[str]:
    """The files that join the box whose init is host PID ``pid`` (:func:`join_file`; none if it
    has no box cgroup): the dirs named :data:`PREFIX`... in its ``/proc/PID/cgroup``. Blocking."""
    roots = mounts()
    files: list[str] = []
    for hier, path in own_paths(pid).items():
        parts = path.strip("/").split("/")
        # The first such dir is ours: a job may make look-alikes only below it.
        top = next((i for i, p in enumerate(parts) if p.startswith(PREFIX)), None)
        if top is not None and hier in roots:
            files.append(join_file(os.path.join(roots[hier], *parts[: top + 1]), hier))
    return files


# "0", the writer itself: a pid, even its own, takes the kernel's global lock on v1's ``tasks`` too.
_JOIN = 'while [ "$1" != -- ]; do echo 0 2>/dev/null >"$1"; shift; done; shift; exec "$@"'


def joined(procs: Sequence[str], argv: Sequence[str]) -> list[str]:
    """``argv`` run by a shell that first joins the cgroups by writing to each of ``procs``
    (:meth:`BoxCgroup.procs`; a failed join is ignored: the job is then found by attribution)."""
    if not procs:
        return list(argv)
    return ["sh", "-c", _JOIN, "sh", *procs, "--", *argv]
