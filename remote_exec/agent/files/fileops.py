"""The file operations' building blocks, run in worker threads: stat records, atomic write
sessions (a temporary file beside the target, renamed over it; or, staged, a private directory
the client fills out of band) and race-safe directory walks."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shutil
import stat
import threading
import time
from dataclasses import dataclass, field

from ...errors import FileError, RemoteIsADirectoryError
from ...protocol import STAGED_NAME, FileInfo, FileType
from .paths import Resolved, os_error, resolve

__all__ = [
    "Write",
    "begin_write",
    "finish_write",
    "info",
    "not_regular",
    "open_regular",
    "pwrite_all",
    "stat_at",
    "umask",
]

_O_PATH = getattr(os, "O_PATH", os.O_RDONLY)
# O_NONBLOCK: opening a FIFO with no writer (or a lease-held file) returns at once instead of
# holding a worker thread forever; O_NOCTTY: a terminal never becomes the agent's.
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_KINDS = {
    stat.S_IFIFO: "FIFO",
    stat.S_IFSOCK: "socket",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
    stat.S_IFLNK: "symlink",
}


def umask() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # no /proc: read it the only other way, and put it back
    os.umask(mask)
    return mask


def file_type(mode: int) -> FileType:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def info(path: str, name: str, st: os.stat_result, target: str | None = None) -> FileInfo:
    return FileInfo(
        path=path,
        name=name,
        type=file_type(st.st_mode),
        size=st.st_size,
        mode=stat.S_IMODE(st.st_mode),
        mtime_ns=st.st_mtime_ns,
        target=target,
    )


def stat_at(r: Resolved, follow: bool = False) -> FileInfo:
    st = os.stat(r.name, dir_fd=r.dir_fd, follow_symlinks=follow)
    target = os.readlink(r.name, dir_fd=r.dir_fd) if stat.S_ISLNK(st.st_mode) else None
    return info(r.path, os.path.basename(r.path) or "/", st, target)


def not_regular(path: str, mode: int) -> FileError:
    """The error for a path that names something other than a regular file (or directory)."""
    kind = _KINDS.get(stat.S_IFMT(mode), "special file")
    return FileError(f"not a regular file: {path} is a {kind}", path=path, data={"file_type": kind})


def open_regular(r: Resolved, path: str) -> tuple[int, os.stat_result]:
    """Open the regular file ``r`` names for reading, without ever blocking on what it is.

    The name is first opened ``O_PATH`` (which opens nothing: no FIFO wait, no device side
    effect such as a tape rewind or a watchdog arming) and refused unless it is a regular file;
    only then is it opened for reading, and refused again unless it is still the same file.
    Returns the fd and its stat.

    :raises FileError: missing, a directory (``RemoteIsADirectoryError``), a FIFO, socket or
        device (``data["file_type"]``), or swapped while being opened.
    """
    try:
        probe = os.open(r.name, _O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=r.dir_fd)
        try:
            first = os.fstat(probe)
        finally:
            os.close(probe)
        if stat.S_ISDIR(first.st_mode):
            raise RemoteIsADirectoryError(f"Is a directory: {path}", path=path, data={"errno": "EISDIR"})
        if not stat.S_ISREG(first.st_mode):
            raise not_regular(path, first.st_mode)
        fd = os.open(r.name, _READ, dir_fd=r.dir_fd)
    except OSError as exc:
        raise os_error(exc, path) from None
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (first.st_dev, first.st_ino) or not stat.S_ISREG(st.st_mode):
            raise FileError(f"{path} was replaced while it was being opened", path=path)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def pwrite_all(fd: int, data: memoryview | bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


@dataclass
class Write:
    """An open atomic write: the temporary file beside the target, and what the target gets.

    Staged (``staged``), ``temp`` is a directory (``fd`` -1) that will hold :data:`STAGED_NAME`.
    """

    target: Resolved
    temp: str
    fd: int
    mode: int
    owner: tuple[int, int] | None  # the replaced file's uid/gid, to keep when we may
    staged: bool = False
    chunks: dict[int, int] = field(default_factory=dict)  # offset -> length, as received
    busy: int = 0  # chunk writes in flight (a commit waits for them)
    last_used: float = field(default_factory=time.monotonic)
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def received(self) -> int:
        end = total = 0
        for offset, length in sorted(self.chunks.items()):
            total += max(0, offset + length - max(offset, end))
            end = max(end, offset + length)
        return total

    def missing(self, size: int) -> int | None:
        """The first byte below ``size`` no chunk covered, or None when all arrived."""
        end = 0
        for offset, length in sorted(self.chunks.items()):
            if offset > end:
                return end
            end = max(end, offset + length)
        return None if end >= size else end

    @property
    def stage_dir(self) -> str | None:
        """The staging directory's absolute path (staged sessions only)."""
        return os.path.join(os.path.dirname(self.target.path), self.temp) if self.staged else None

    def discard(self) -> None:
        """Close and remove the temporary file or staging directory (the target is untouched)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.target.dir_fd >= 0:
            with contextlib.suppress(OSError):
                if self.staged:
                    # Renamed first: the engine's side of a cancelled native copy (dockerd, after
                    # its `docker cp` was killed) may still create its file by path; under the
                    # old name that fails now, instead of landing between rmtree's listing and
                    # its rmdir and leaving the directory behind (soak run 3 of stop 34).
                    gone = self.temp.removesuffix(".rxstage") + "-gone.rxstage"
                    os.rename(self.temp, gone, src_dir_fd=self.target.dir_fd, dst_dir_fd=self.target.dir_fd)
                    # fd-based and symlink-safe: whatever landed in it goes, nothing else
                    shutil.rmtree(gone, dir_fd=self.target.dir_fd)
                else:
                    os.unlink(self.temp, dir_fd=self.target.dir_fd)
        self.target.close()


def begin_write(
    path: str, root: str | None, mode: int | None, parents: bool, umask: int, token: str, staged: bool = False
) -> Write:
    """Resolve the target and create its temporary file, or staging directory (blocking)."""
    target = resolve(path, root, make_parents=parents)
    try:
        if target.name == ".":
            raise RemoteIsADirectoryError(f"Is a directory: {path}", path=path, data={"errno": "EISDIR"})
        owner = None
        try:
            st = os.stat(target.name, dir_fd=target.dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            final_mode = 0o666 & ~umask if mode is None else mode
        else:
            if stat.S_ISDIR(st.st_mode):
                raise RemoteIsADirectoryError(f"Is a directory: {path}", path=path, data={"errno": "EISDIR"})
            if not stat.S_ISREG(st.st_mode) and not stat.S_ISLNK(st.st_mode):
                # A FIFO, socket or device is something the sandbox set up on purpose (or a
                # trap); a write replaces regular files (or a symlink itself), never those.
                raise not_regular(path, st.st_mode)
            final_mode = stat.S_IMODE(st.st_mode) if mode is None else mode
            if (st.st_uid, st.st_gid) != (os.geteuid(), os.getegid()):
                owner = (st.st_uid, st.st_gid)
        if staged:
            temp, fd = f".{target.name[:200]}.{token}.rxstage", -1
            os.mkdir(temp, 0o700, dir_fd=target.dir_fd)
        else:
            temp = f".{target.name[:200]}.{token}.rxtmp"
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(temp, flags, 0o600, dir_fd=target.dir_fd)
    except OSError as exc:
        target.close()
        raise os_error(exc, path) from None
    except BaseException:
        target.close()
        raise
    return Write(target, temp, fd, final_mode, owner, staged)


def _open_staged(w: Write, path: str) -> int:
    """Open the staged file (no symlink followed on the way) and check it is one we may commit:
    a regular file, ours unless we are root (we must be able to chmod it). Returns the stage
    directory's fd; ``w.fd`` is the file's."""
    sfd = os.open(w.temp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=w.target.dir_fd)
    try:
        w.fd = os.open(STAGED_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=sfd)
        st = os.fstat(w.fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileError(f"write of {path}: the staged file is not a regular file", path=path)
        euid = os.geteuid()
        if euid != 0 and st.st_uid != euid:
            raise FileError(f"write of {path}: the staged file belongs to uid {st.st_uid}, not {euid}", path=path)
        if euid == 0 and w.owner is None and (st.st_uid, st.st_gid) != (0, os.getegid()):
            w.owner = (0, os.getegid())  # what a file we wrote ourselves would get
    except BaseException:
        os.close(sfd)
        raise
    return sfd


_BIG_REPLACED = 8 * 1024 * 1024


def _hold_big_file(target: Resolved) -> int:
    """An ``O_PATH`` fd on the file about to be replaced, if it is a big regular file, else -1.

    Whoever drops a file's last reference pays for freeing it (its page cache and blocks:
    ~0.1-0.2 s for 256 MiB here). Held across the rename, that cost moves from the write's
    answer to :func:`_release_later`'s thread.
    """
    try:
        fd = os.open(target.name, _O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=target.dir_fd)
    except OSError:
        return -1  # no such file (or nothing we may hold): nothing to free
    try:
        st = os.fstat(fd)
    except OSError:
        st = None
    if st is None or not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_size < _BIG_REPLACED:
        os.close(fd)
        return -1
    return fd


def _release_later(fd: int) -> None:
    """Close ``fd`` in a thread of its own (freeing the replaced file), not in the caller's."""
    if fd >= 0:
        threading.Thread(target=os.close, args=(fd,), name="rx-free-replaced", daemon=True).start()


def finish_write(w: Write, path: str, size: int, mtime_ns: int | None, fsync: bool) -> FileInfo:
    """Give the temporary file its size, mode, owner and mtime, rename it over the target (blocking)."""
    sfd = -1
    try:
        if w.staged:
            sfd = _open_staged(w, path)
        st = os.fstat(w.fd)
        if st.st_size != size:
            raise FileError(
                f"write of {path}: {st.st_size} bytes written, {size} announced", path=path, data={"size": st.st_size}
            )
        if w.owner is not None:
            with contextlib.suppress(OSError):  # only root may give a file away; others keep theirs
                os.fchown(w.fd, *w.owner)
        os.fchmod(w.fd, w.mode)  # after chown, which clears set-id bits
        if mtime_ns is not None:
            os.utime(w.fd, ns=(time.time_ns(), mtime_ns))
        if fsync:
            os.fsync(w.fd)
        os.close(w.fd)
        w.fd = -1
        replaced = _hold_big_file(w.target)
        try:
            if w.staged:
                os.rename(STAGED_NAME, w.target.name, src_dir_fd=sfd, dst_dir_fd=w.target.dir_fd)
            else:
                os.rename(w.temp, w.target.name, src_dir_fd=w.target.dir_fd, dst_dir_fd=w.target.dir_fd)
        finally:
            _release_later(replaced)
        return stat_at(w.target)
    except OSError as exc:
        if exc.errno == errno.ENOENT and w.staged and w.fd < 0:
            raise FileError(f"write of {path}: nothing was staged", path=path, data={"errno": "ENOENT"}) from None
        raise os_error(exc, path) from None
    finally:
        if sfd >= 0:
            os.close(sfd)
        w.discard()  # after the rename there is no temporary file left (a staging directory is removed)
