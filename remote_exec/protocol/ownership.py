"""Is this state dir, and the agent behind its sockets, really ours? One check for host and relay.

Whoever answers on the agent's socket receives our commands and runs them; whoever can
connect to it runs commands as us. The default state dir ``/tmp/remote-exec-<uid>`` is a
predictable name in a world-writable place, so another local user can create it first, put
their own agent in it with 0666 sockets and wait. Before anything is sent, both the host's
socket channel and the in-sandbox relay therefore check, in this order:

1. the directory is a real directory (not a symlink, which could lead anywhere), owned by our
   effective uid; group/other permission bits on a directory that is ours are removed (it is
   our own, merely made by hand or by an old umask; every entry in it is checked below, so
   nothing another user may have planted while it was open is trusted);
2. the socket file is a socket owned by our effective uid;
3. once connected, the peer's uid (``SO_PEERCRED``, fixed by whoever called ``listen()``) is
   our effective uid, which also closes the race between the checks and the ``connect()``
   (a parent directory someone else can write lets them swap paths in between).

None of this relies on a permission being denied: root as the victim can open and connect to
anything, so only owners and credentials are compared.
"""

from __future__ import annotations

import os
import socket
import stat
import struct
from pathlib import Path

from ..errors import UntrustedAgentError

__all__ = ["check_peer", "check_socket", "check_state_dir", "describe_uid"]

_ADVICE = (
    "use a state dir of your own: set XDG_RUNTIME_DIR (or REMOTE_EXEC_AGENT_DIR) "
    "to a directory only you can write, or pass ?dir= / --dir"
)


def describe_uid(uid: int) -> str:
    """``uid 65534 (nobody)``, or ``uid 65534`` when it has no name here."""
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def check_state_dir(path: Path) -> None:
    """Check that ``path`` is a private directory of ours; make an own but open one private.

    :raises FileNotFoundError: there is no ``path`` (nothing there to trust or distrust).
    :raises UntrustedAgentError: it is a symlink, not a directory, or another user's.
    """
    me = os.geteuid()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:  # a symlink (ENOTDIR with O_NOFOLLOW), a file, or unreadable: say which
        try:
            st = os.lstat(path)
        except OSError:
            raise UntrustedAgentError(f"cannot open state dir {path}: {exc}") from None
        if stat.S_ISLNK(st.st_mode):
            raise UntrustedAgentError(
                f"state dir {path} is a symlink (to {os.readlink(path)!r}, made by {describe_uid(st.st_uid)}), "
                f"which could lead to another user's agent; nothing was sent. Remove it, or {_ADVICE}"
            ) from None
        if st.st_uid != me:
            raise _foreign(path, st.st_uid) from None
        raise UntrustedAgentError(f"state dir {path} is not a usable directory: {exc}") from None
    try:
        st = os.fstat(fd)  # the inode we hold: a swap of the path after this changes nothing here
        if st.st_uid != me:
            raise _foreign(path, st.st_uid)
        if st.st_mode & 0o077:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def _foreign(path: Path, uid: int) -> UntrustedAgentError:
    return UntrustedAgentError(
        f"state dir {path} belongs to {describe_uid(uid)}, not to you ({describe_uid(os.geteuid())}): "
        f"another user may have created it to receive your commands or run theirs as you; "
        f"nothing was sent to it. Have it removed (it is not yours), or {_ADVICE}",
        data={"path": os.fspath(path), "uid": uid},
    )


def check_socket(path: Path) -> bool:
    """True if ``path`` is a socket of ours; False if there is none (or only a stale non-socket
    of ours, which the server replaces).

    :raises UntrustedAgentError: the entry belongs to another user.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if st.st_uid != os.geteuid():
        raise UntrustedAgentError(
            f"{path} belongs to {describe_uid(st.st_uid)}, not to you ({describe_uid(os.geteuid())}): "
            f"another user planted it in your state dir; nothing was sent to it. "
            f"Check who could write {path.parent}, then remove {path}",
            data={"path": os.fspath(path), "uid": st.st_uid},
        )
    return stat.S_ISSOCK(st.st_mode)


def check_peer(sock: socket.socket, path: Path) -> None:
    """Check that the process listening on ``sock``'s other end runs as our effective uid.

    :raises UntrustedAgentError: it runs as another user (it holds a listening socket that
        was made to look like ours).
    """
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", creds)
    if uid != os.geteuid():
        raise UntrustedAgentError(
            f"the agent socket {path} is served by pid {pid} running as {describe_uid(uid)}, "
            f"not as you ({describe_uid(os.geteuid())}); nothing was sent to it. Stop that process, "
            f"remove {path}, or {_ADVICE}",
            data={"path": os.fspath(path), "uid": uid, "pid": pid},
        )
