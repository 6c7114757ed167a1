"""Reading a file in the state dir that a job can reach: as hostile input (issue #21, point 7).

A job runs as the agent's user, so every file the agent keeps for it (``jobs/counter``,
``job.json``, ``stdin_bytes``, a shell's record, ``jobs/ID``) may have been replaced: by a
symlink to ``/dev/zero`` (a read without bound filled the agent's memory until the OOM killer
took it, again at every restart), by a FIFO (an ``open`` that blocked the agent for good), by
something huge. Every such read goes through :func:`read_state_file`: ``O_NOFOLLOW`` (no
symlink), ``O_NONBLOCK`` (a FIFO's open returns at once), a regular file only (``fstat`` on what
was opened, not on the name), and a bounded read. What it refuses is the caller's to skip and to
log with the path and the reason (the ``ValueError``'s text; :func:`planted` tells it apart).

Writing is as exposed: an ``open`` for writing of a FIFO a job put at ``stdin_bytes`` blocked
the agent's event loop for good (every job, every client), and ``O_TRUNC`` through a hard link
empties the link's other name. Every write of such a file opens it through
:func:`open_own_file`.

Standard library only: the keeper reads ``job.json`` through it too.
"""

from __future__ import annotations

import errno
import logging
import os
import stat

__all__ = ["claim_state_dir", "open_own_file", "open_state_dir", "planted", "read_state_file", "same_dir"]

_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _Planted(ValueError):
    """A state file that is not what the agent wrote (its ``str`` says what it is instead).
    Private: the agent's own signal, never sent anywhere (public errors live in ``errors.py``)."""


def planted(exc: BaseException) -> bool:
    """Whether ``exc`` (from :func:`read_state_file` or :func:`open_state_dir`) says the entry
    was replaced by something the agent never makes there (the caller may remove the entry)."""
    return isinstance(exc, _Planted)


def read_state_file(path: str | os.PathLike[str], limit: int, *, dir_fd: int | None = None) -> bytes:
    """The bytes of the regular file ``path`` (relative to ``dir_fd`` if given), at most ``limit``.

    :raises FileNotFoundError: there is none (the caller's usual case, not an attack).
    :raises ValueError: it is a symlink, not a regular file, or longer than ``limit`` (:func:`planted`).
    :raises OSError: it cannot be read.
    """
    try:
        fd = os.open(path, _READ, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _Planted("a symlink") from None
        if exc.errno == errno.ENXIO:  # a Unix socket
            raise _Planted("not a regular file (a socket)") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _Planted(f"not a regular file (mode {stat.filemode(st.st_mode)})")
        if st.st_size > limit:
            raise _Planted(f"{st.st_size} bytes, over the {limit} a real one has")
        data = os.read(fd, limit + 1)  # it may have grown since the fstat
        if len(data) > limit:
            raise _Planted(f"over the {limit} bytes a real one has")
        return data
    finally:
        os.close(fd)


def open_state_dir(path: str | os.PathLike[str], *, dir_fd: int | None = None) -> int:
    """An fd of the directory ``path`` itself, never of what a symlink there points to; the
    caller closes it. Names are then resolved against the fd (``dir_fd=``), so a directory
    swapped for a symlink afterwards redirects nothing.

    :raises ValueError: it is a symlink or not a directory (:func:`planted`). :raises OSError: it cannot be opened.
    """
    try:
        return os.open(path, _DIR, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _Planted("a symlink") from None
        if exc.errno == errno.ENOTDIR:  # what O_NOFOLLOW | O_DIRECTORY says of a symlink, too
            link = os.path.islink(path) if dir_fd is None else stat.S_ISLNK(os.lstat(path, dir_fd=dir_fd).st_mode)
            raise _Planted("a symlink" if link else "not a directory") from None
        raise


def claim_state_dir(path: str | os.PathLike[str]) -> int:
    """An fd of the directory ``path`` itself (made 0700 if missing); a symlink or file a job put
    there is logged (``skipped PATH: WHY``) and replaced by an empty dir, its target untouched.
    The caller closes the fd, and lists and opens through it (see :func:`open_state_dir`).

    :raises OSError: no dir can be had there.
    """
    try:
        return open_state_dir(path)
    except FileNotFoundError:
        os.mkdir(path, 0o700)
    except ValueError as exc:
        logging.getLogger("remote_exec.agent").warning("skipped %s: %s; replaced by an empty dir", path, exc)
        os.unlink(path)
        os.mkdir(path, 0o700)
    return open_state_dir(path)


def same_dir(fd: int, path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` still names the very directory ``fd`` is open on (not swapped since):
    what a caller checks before an operation that can only go by path (a rename elsewhere)."""
    try:
        here, there = os.fstat(fd), os.lstat(path)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


_OWN = os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def open_own_file(path: str | os.PathLike[str], flags: int) -> int:
    """Open (or create, 0600) one of the agent's own files in its private state dir: its own
    (``agent.lock``, ``agent.log``) and those it keeps for jobs (``job.json``, ``stdin_bytes``,
    ``jobs/counter``, a shell's records and logs). The caller closes the fd.

    What a job put there instead (a symlink, a FIFO: the ``open`` blocked the agent or the
    keeper for good, a hard link) is unlinked, logged and made afresh, its target untouched:
    in a private dir only the agent's user can have made it. Made by another user (the dir was
    open once) it is refused, never written through. ``O_TRUNC`` applies only once the file is
    known to be the agent's own; the fd is blocking, as a regular file's is.

    :raises ValueError: another user's plant (:func:`planted`; its text says what it is).
    :raises OSError: it cannot be opened or made.
    """
    truncate = bool(flags & os.O_TRUNC)
    flags &= ~os.O_TRUNC
    for again in (False, True):
        try:
            fd = os.open(path, flags | _OWN, 0o600)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENXIO):
                raise
            why = "a symlink" if exc.errno == errno.ELOOP else "not a regular file (a FIFO or a socket)"
        else:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_nlink == 1:
                try:
                    os.set_blocking(fd, True)
                    if truncate:
                        os.ftruncate(fd, 0)
                except OSError:
                    os.close(fd)
                    raise
                return fd
            os.close(fd)
            why = f"not a private file (mode {stat.filemode(st.st_mode)}, uid {st.st_uid}, {st.st_nlink} links)"
        if again or os.lstat(path).st_uid != os.geteuid():
            raise _Planted(why)
        logging.getLogger("remote_exec.agent").warning("skipped %s: %s; replaced by a new file", path, why)
        os.unlink(path)
    raise AssertionError("unreachable")  # pragma: no cover
