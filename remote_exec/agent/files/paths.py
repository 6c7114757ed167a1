"""Path resolution inside an optional workspace root, one component at a time, race-safely.

:func:`resolve` walks a path from the root's directory file descriptor: every directory on the
way is opened with ``O_NOFOLLOW`` relative to the one before (``openat``), ``..`` pops back,
and a symlink is read (``readlinkat``) and its target spliced into the walk, so the kernel
never follows a link we did not check. With a root, ``..`` above it or a symlink that leads
out of it raises :class:`~remote_exec.errors.PathEscapeError`. The result is the directory
(held open) that contains the target and the target's name in it; operations then use
``*at`` calls on that pair, with ``O_NOFOLLOW`` on the final name, so a name swapped for a
symlink after the walk is refused rather than followed.

The limit, as for ``openat2(RESOLVE_BENEATH)``: a directory the walk holds open that another
process *moves* out of the workspace while an operation runs takes the operation with it.
That needs write access to the workspace from inside the sandbox, and a precise race.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import stat
from collections import deque
from dataclasses import dataclass
from types import TracebackType

from ...errors import (
    FileError,
    NoSpaceError,
    PathEscapeError,
    RemoteFileExistsError,
    RemoteFileNotFoundError,
    RemoteIsADirectoryError,
    RemoteNotADirectoryError,
    RemotePermissionError,
)

__all__ = ["MAX_SYMLINKS", "Resolved", "os_error", "resolve"]

MAX_SYMLINKS = 40
"""Symlinks followed in one resolution before giving up with ``ELOOP`` (the kernel's limit)."""

_O_PATH = getattr(os, "O_PATH", os.O_RDONLY)
_DIR = _O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
_ERRORS: dict[int, type[FileError]] = {
    errno.ENOENT: RemoteFileNotFoundError,
    errno.EEXIST: RemoteFileExistsError,
    errno.EISDIR: RemoteIsADirectoryError,
    errno.ENOTDIR: RemoteNotADirectoryError,
    errno.EACCES: RemotePermissionError,
    errno.EPERM: RemotePermissionError,
    errno.ENOSPC: NoSpaceError,
    errno.EDQUOT: NoSpaceError,
}


def os_error(exc: OSError, path: str) -> FileError:
    """The wire error for an ``OSError`` about ``path``: its class by errno, the errno's name in
    ``data["errno"]``. One of ours (a ``RemoteIsADirectoryError`` is an ``OSError`` too) is
    returned as it is, so an ``except OSError`` around a check does not wrap its words again."""
    if isinstance(exc, FileError):
        return exc
    code = exc.errno or 0
    cls = _ERRORS.get(code, FileError)
    text = exc.strerror or str(exc)
    return cls(f"{text}: {path}", path=path, data={"errno": errno.errorcode.get(code, str(code))})


@dataclass
class Resolved:
    """Where a path leads: ``name`` inside the directory open as ``dir_fd`` (an ``O_PATH`` fd).

    ``name`` is ``"."`` when the path names a directory through ``.``/``..``/the root itself;
    ``path`` is the absolute path with every symlink resolved; ``is_root``: it is the root
    itself (``/`` without one).
    A context manager: leaving it closes ``dir_fd``.
    """

    dir_fd: int
    name: str
    path: str
    is_root: bool = False

    def close(self) -> None:
        if self.dir_fd >= 0:
            os.close(self.dir_fd)
            self.dir_fd = -1

    def __enter__(self) -> Resolved:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p not in ("", ".")]


def _within(path: str, prefixes: tuple[str, ...]) -> str | None:
    """``path`` relative to the first of ``prefixes`` it lies in (``""`` for the prefix itself)."""
    for prefix in prefixes:
        if prefix == "/":
            return path
        if path == prefix or path.startswith(prefix + "/"):
            return path[len(prefix) :]
    return None


def resolve(path: str, root: str | None, *, follow: bool = True, make_parents: bool = False) -> Resolved:
    """Resolve ``path`` (relative: to ``root``, else to the working directory) inside ``root``.

    ``follow``: a final symlink is followed too (else it is the result). ``make_parents``:
    missing directories on the way are created (``0o777`` less the umask). The final component
    need not exist.

    :raises PathEscapeError: ``root`` is set and the path, or a symlink on it, leads outside.
    :raises FileError: (or a subclass) a component is missing, not a directory, not searchable...
    """
    try:
        return _resolve(path, root, follow, make_parents)
    except OSError as exc:
        raise os_error(exc, path) from None


def _resolve(path: str, root: str | None, follow: bool, make_parents: bool) -> Resolved:
    if root is not None:
        try:
            base = os.open(root, _DIR)
        except OSError as exc:
            raise os_error(exc, root) from None
        base_path = os.path.realpath(root)
        prefixes = tuple(dict.fromkeys((root.rstrip("/") or "/", base_path)))
        if path.startswith("/"):
            inner = _within(path, prefixes)
            if inner is None:
                os.close(base)
                raise PathEscapeError(f"{path} is outside the workspace root {root}", path=path)
            rel = inner
        else:
            rel = path
    else:
        base, base_path, prefixes = os.open("/", _DIR), "/", ("/",)
        rel = path if path.startswith("/") else posixpath.join(os.getcwd(), path)
    fds = [base]
    names: list[str] = []
    parts = deque(_parts(rel))
    hops = 0

    def here(name: str = "") -> str:
        return posixpath.join(base_path, *names, name) if name else posixpath.join(base_path, *names)

    def done(name: str) -> Resolved:
        fd = fds.pop()
        return Resolved(fd, name, here(name) if name != "." else here(), is_root=name == "." and not names)

    try:
        while parts:
            comp = parts.popleft()
            if comp == "..":
                if names:
                    os.close(fds.pop())
                    names.pop()
                elif root is not None:
                    raise PathEscapeError(f"{path}: '..' leads out of the workspace root {root}", path=path)
                continue
            cur = fds[-1]
            last = not parts
            try:
                st = os.stat(comp, dir_fd=cur, follow_symlinks=False)
            except FileNotFoundError:
                if last:
                    return done(comp)
                if not make_parents:
                    raise
                with contextlib.suppress(FileExistsError):  # made by someone else meanwhile: look again
                    os.mkdir(comp, 0o777, dir_fd=cur)
                st = os.stat(comp, dir_fd=cur, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode) and (follow or not last):
                hops += 1
                if hops > MAX_SYMLINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
                target = os.readlink(comp, dir_fd=cur)
                if target.startswith("/"):
                    inner = _within(target, prefixes)
                    if inner is None:
                        raise PathEscapeError(
                            f"{path}: {here(comp)} is a symlink to {target}, outside the workspace root {root}",
                            path=path,
                        )
                    while names:  # an absolute target restarts from the root
                        os.close(fds.pop())
                        names.pop()
                    target = inner
                parts.extendleft(reversed(_parts(target)))
                continue
            if last:
                return done(comp)
            if not stat.S_ISDIR(st.st_mode):
                raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
            # O_NOFOLLOW: if the name became a symlink since the stat, this fails (ELOOP or
            # ENOTDIR) instead of following it.
            fds.append(os.open(comp, _DIR | os.O_NOFOLLOW, dir_fd=cur))
            names.append(comp)
        return done(".")
    finally:
        for fd in fds:
            os.close(fd)
