"""The local side of a file copy: temporary files beside their target, whole reads and writes by offset.

Blocking calls, run in threads by :class:`~remote_exec.client.files.FileClient`. A download lands in
a temporary file beside its target (``dir_fd``: named in that directory, never by path) and is
renamed into place only once complete, with its mode and mtime set.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

__all__ = ["drop_local", "finish_local", "local_temp", "pread_all", "pwrite_all"]


def pread_all(fd: int, n: int, offset: int) -> bytes:
    parts = []
    while n > 0:
        data = os.pread(fd, n, offset)
        if not data:
            break
        parts.append(data)
        n, offset = n - len(data), offset + len(data)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


def local_temp(dest: Path, dir_fd: int | None = None) -> tuple[int, str]:
    """A new temporary file beside ``dest`` (with ``dir_fd``: ``dest`` is a name in that directory)."""
    if dir_fd is None:
        if dest.is_dir():
            raise IsADirectoryError(f"{dest} is a directory")
        temp = os.fspath(dest.with_name(f".{dest.name[:200]}.{secrets.token_hex(4)}.rxpart"))
    else:
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISDIR(os.stat(dest, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                raise IsADirectoryError(f"{dest} is a directory")
        temp = f".{dest.name[:200]}.{secrets.token_hex(4)}.rxpart"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(temp, flags, 0o600, dir_fd=dir_fd), temp


def finish_local(
    fd: int, temp: str, dest: Path, size: int, mode: int, mtime_ns: int, dir_fd: int | None = None
) -> None:
    try:
        os.ftruncate(fd, size)
        os.fchmod(fd, mode)
        os.utime(fd, ns=(mtime_ns, mtime_ns))
    except BaseException:
        drop_local(fd, temp, dir_fd)
        raise
    os.close(fd)
    try:
        os.replace(temp, dest, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
        raise


def drop_local(fd: int, temp: str, dir_fd: int | None = None) -> None:
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(temp, dir_fd=dir_fd)
