"""Reading the process table from /proc: who is still alive in a process group."""

from __future__ import annotations

import os

__all__ = ["group_alive", "group_members"]


def group_members(pgid: int) -> list[int]:
    """PIDs of live (non-zombie) processes whose process group is ``pgid``."""
    members: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return members
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # exited while we looked
        # Fields after the command name (which may itself contain ')' or spaces).
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and fields[0] != b"Z" and int(fields[2]) == pgid:
            members.append(int(name))
    return members


def group_alive(pgid: int) -> bool:
    """True while any non-zombie process is left in group ``pgid``."""
    if os.path.isdir("/proc/self"):
        return bool(group_members(pgid))
    try:  # no /proc: signal 0 cannot tell zombies from the living, but errs on the safe side
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
