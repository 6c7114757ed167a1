"""Local trees written from what a sandbox says: its names checked, the writes confined.

The sandbox is not trusted, and it can always replace its agent: a listing may hold
``../../.bashrc``, ``/etc/cron.d/x`` or ``a/../../x``, and a stat may name a file ``..``. Every
name that comes from the sandbox and becomes part of a local path passes :func:`check_name` (a
whole listing :func:`check_listing`) *before anything is created*, so a refused listing leaves
nothing behind.

The local side is then reached only through directory file descriptors: :class:`LocalTree`
opens the target once, and every path below it one component at a time relative to its parent
(``openat``) with ``O_NOFOLLOW``, so a symlink inside the target (planted there, or swapped in by
a racing process) is refused, never followed; files are created, renamed and removed with the
``*at`` calls on those descriptors. The target itself is the caller's choice and is opened like
any path the user gives (a symlink to a directory there is fine).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import posixpath
import shutil
import stat
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

from ..errors import ProtocolError
from ..protocol import FileInfo

__all__ = ["MAX_COMPONENT", "MAX_NAME", "LocalTree", "check_listing", "check_name", "name_problem"]

MAX_COMPONENT = 255
"""Bytes in one component of a sandbox-given name at most (``NAME_MAX``)."""
MAX_NAME = 4096
"""Bytes in a whole sandbox-given relative name at most (``PATH_MAX``)."""

_O_PATH = getattr(os, "O_PATH", os.O_RDONLY)
_DIR = _O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def name_problem(name: str) -> str | None:
    """Why ``name`` (a ``/``-separated path relative to a local directory, from the sandbox)
    could lead anywhere but below that directory, or ``None`` when it is safe."""
    if not name:
        return "it is empty"
    if "\x00" in name:
        return "it holds a NUL byte"
    if name.startswith("/"):
        return "it is absolute"
    try:
        size = len(os.fsencode(name))
    except UnicodeError:
        return "it is no valid file name (not encodable)"
    if size > MAX_NAME:
        return f"it is {size} bytes long (at most {MAX_NAME})"
    for part in name.split("/"):
        if part == "..":
            return "it has a '..' component"
        if part in ("", "."):
            return "it has an empty or '.' component"
        if len(os.fsencode(part)) > MAX_COMPONENT:
            return f"a component is over {MAX_COMPONENT} bytes long"
    return None


def _shown(name: str) -> str:
    return repr(name) if len(name) <= 100 else repr(name[:100]) + f"... ({len(name)} characters)"


def _refuse(what: str, name: str, problem: str) -> ProtocolError:
    return ProtocolError(
        f"{what}: the sandbox sent the name {_shown(name)}, refused: {problem}; nothing was written",
        data={"name": name[:4096], "reason": problem},
    )


def check_name(name: str, what: str) -> str:
    """``name`` if it is a safe relative name (see :func:`name_problem`).

    :raises ProtocolError: it is not; ``what`` says where it came from.
    """
    problem = name_problem(name)
    if problem is not None:
        raise _refuse(what, name, problem)
    return name


def check_listing(entries: Iterable[FileInfo], listed: str) -> None:
    """Check a recursive listing of ``listed`` before anything is done with it: every name safe
    and listed once, every entry below a directory listed before it (as the agent lists them),
    and every ``path`` the listed directory's own path plus the name.

    :raises ProtocolError: the first entry that breaks a rule.
    """
    what = f"listing of {listed}"
    kinds: dict[str, str] = {}
    base: str | None = None
    for e in entries:
        check_name(e.name, what)
        if e.name in kinds:
            raise _refuse(what, e.name, f"it is listed twice (as a {kinds[e.name]} and as a {e.type})")
        parent = posixpath.dirname(e.name)
        if parent and kinds.get(parent) != "dir":
            raise _refuse(what, e.name, f"its parent {parent!r} was not listed before it as a directory")
        if not e.path.endswith("/" + e.name):
            raise _refuse(what, e.name, f"its path {_shown(e.path)} does not end with its name")
        prefix = e.path[: -len(e.name) - 1]
        if base is None:
            base = prefix
        elif prefix != base:
            raise _refuse(what, e.name, f"its path {_shown(e.path)} is not under the listed directory {base or '/'}")
        kinds[e.name] = e.type


class LocalTree:
    """A local directory open as a file descriptor; every path below it is reached component by
    component with ``O_NOFOLLOW``. Names given to its methods must have passed :func:`check_name`.
    Blocking (run it in a thread); a context manager that closes the descriptor."""

    def __init__(self, top: str | os.PathLike[str]) -> None:
        self.top = Path(top)
        self.fd = -1

    def open(self, *, create: bool) -> bool:
        """Open the target (``create``: made first, with its parents, if missing); True if it was made."""
        made = False
        if create and not self.top.is_dir():
            self.top.mkdir(parents=True, exist_ok=True)
            made = True
        # Not O_NOFOLLOW: the target is the user's own choice of path; confinement starts below it.
        self.fd = os.open(self.top, _O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        return made

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> LocalTree:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _in_the_way(self, fd: int, name: str, rel: str) -> OSError:
        """The error for ``name`` (in ``fd``) that is not a directory where one is needed."""
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError as exc:
            return exc
        where = os.fspath(self.top / rel)
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(name, dir_fd=fd)
            return NotADirectoryError(
                errno.ENOTDIR,
                f"{where} is a symlink (to {target}) where the download needs a directory: a download never "
                "follows symlinks; remove it, or download with delete=True, which replaces it",
            )
        return NotADirectoryError(errno.ENOTDIR, f"{where} is not a directory, and the download needs one there")

    def open_dir(self, rel: str) -> int:
        """A new ``O_PATH`` descriptor of the directory ``rel`` (``""``: the target); the caller closes it.

        :raises NotADirectoryError: a component is a symlink or not a directory (named precisely).
        :raises FileNotFoundError: a component is missing.
        """
        fd = os.dup(self.fd)
        done: list[str] = []
        try:
            for comp in rel.split("/") if rel else ():
                done.append(comp)
                try:
                    nfd = os.open(comp, _DIR, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ENOTDIR, errno.ELOOP):
                        raise self._in_the_way(fd, comp, "/".join(done)) from None
                    raise
                os.close(fd)
                fd = nfd
        except BaseException:
            os.close(fd)
            raise
        return fd

    def lstat(self, rel: str) -> os.stat_result | None:
        """``rel``'s own status (a symlink's, not its target's); None when it or a parent is missing."""
        parent, name = posixpath.split(rel)
        try:
            fd = self.open_dir(parent)
        except FileNotFoundError:
            return None
        try:
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        finally:
            os.close(fd)

    def make_dirs(self, rels: Iterable[str]) -> int:
        """Create the directories ``rels`` (parents listed before children); the number made.

        All are checked first, so a symlink or file in the way of any of them is refused before
        one is made.

        :raises NotADirectoryError: something that is not a directory is in the way.
        """
        todo = list(rels)
        for rel in todo:
            st = self.lstat(rel)
            if st is not None and not stat.S_ISDIR(st.st_mode):
                parent, name = posixpath.split(rel)
                fd = self.open_dir(parent)
                try:
                    raise self._in_the_way(fd, name, rel)
                finally:
                    os.close(fd)
        made = 0
        for rel in todo:
            parent, name = posixpath.split(rel)
            fd = self.open_dir(parent)
            try:
                os.mkdir(name, 0o777, dir_fd=fd)
                made += 1
            except FileExistsError:
                os.close(self.open_dir(rel))  # a directory, not a symlink swapped in meanwhile
            finally:
                os.close(fd)
        return made

    def remove(self, rel: str) -> None:
        """Remove the file, symlink or (with everything in it) directory ``rel``, if it is there."""
        parent, name = posixpath.split(rel)
        try:
            fd = self.open_dir(parent)
        except FileNotFoundError:
            return
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(name, dir_fd=fd)  # fd-based: never follows a symlink below it
            else:
                os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)

    def sha256(self, rel: str) -> str | None:
        """The SHA-256 (hex) of the regular file ``rel``; None if it is no readable regular file."""
        parent, name = posixpath.split(rel)
        try:
            dfd = self.open_dir(parent)
        except OSError:
            return None
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except OSError:
            return None
        finally:
            os.close(dfd)
        with open(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            with contextlib.suppress(OSError):
                return hashlib.file_digest(f, "sha256").hexdigest()
        return None
