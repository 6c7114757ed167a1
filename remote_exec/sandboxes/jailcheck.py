"""Is a PID the init of a jail box *we* started? Checked before every ``nsenter`` into it.

A box outlives the process that launched it (``jail://?pid=`` attaches to a running one), so a
PID we hold may have died and been reused; see :func:`check_box` for what is checked and why.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import SandboxError
from .jailbox import MARKER

__all__ = ["check_box"]


def _status(pid: int | str) -> dict[str, str]:
    text = Path(f"/proc/{pid}/status").read_text()
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def _ns(pid: int | str, kind: str) -> str:
    return os.readlink(f"/proc/{pid}/ns/{kind}")


def check_box(pid: int) -> None:
    """Check that host PID ``pid`` is the init of a box *we* started, before we nsenter it.

    A stale PID may have been reused by any process; nsenter'ing as root into the host's own
    namespaces would run commands unjailed, and into another user's would run them in a
    filesystem that user controls. What only our launch has, and what another user cannot
    fake: the init and its bwrap monitor are owned by our uid (anything else in a process an
    attacker owns -- argv, comm, namespaces, files -- they can copy); the box's private
    ``/run`` holds :data:`MARKER` (set by our bwrap, which a bwrap started by hand lacks);
    the init is PID 1 of its own mount and PID namespaces, in our user namespace when we are
    root (so execs can switch to :data:`~.jailbox.JAIL_UID`), else in one mapping only us.

    :raises SandboxError: it is not (or no longer) one of our boxes; the message says why.
    """
    me = str(os.geteuid())
    try:
        init = _status(pid)
        monitor_pid = init.get("PPid", "0")
        monitor = _status(monitor_pid)
        monitor_comm = Path(f"/proc/{monitor_pid}/comm").read_text().strip()
        own = {kind: _ns(pid, kind) != _ns("self", kind) for kind in ("mnt", "pid", "user")}
        uid_map = Path(f"/proc/{pid}/uid_map").read_text().split()
        marked = os.path.isdir(f"/proc/{pid}/root{MARKER}")
    except OSError as exc:
        raise SandboxError(f"no jail box with init PID {pid}: {exc}") from None
    uids = {init["Uid"].split()[0], *init["Uid"].split()[1:3], *monitor["Uid"].split()[:3]}
    if init.get("Name") != "bwrap" or init.get("NSpid", "").split()[-1:] != ["1"] or monitor_comm != "bwrap":
        raise SandboxError(f"PID {pid} is not the init of a bubblewrap box")
    if uids != {me}:
        raise SandboxError(f"PID {pid} is a bubblewrap box of another user (uids {sorted(uids)}, we are {me})")
    if not (own["mnt"] and own["pid"]):
        raise SandboxError(f"PID {pid} is not the init of a bubblewrap box (it shares our mount or PID namespace)")
    if own["user"] != (me != "0") or (own["user"] and uid_map[1:] != [me, "1"]):
        raise SandboxError(f"PID {pid} is a bubblewrap box with a user namespace we do not make (uid map {uid_map})")
    if not marked:
        raise SandboxError(f"PID {pid} is a bubblewrap box remote_exec did not start (no {MARKER})")
