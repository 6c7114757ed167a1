"""Files and directories: typed operations behind the ``file_*`` JSON-RPC methods.

Blocking file I/O runs in worker threads (``asyncio.to_thread``), so a slow disk never stalls
the event loop that answers job polls. Paths are resolved by :func:`.paths.resolve` (inside the
request's workspace root, if any). Writes are atomic: the bytes go to a temporary file in the
target's directory (``.<name>.<id>.rxtmp``, mode ``0600`` until the commit), which gets its
mode, owner and mtime and is then renamed over the target; a reader sees the old file or the
new one, never a part. Write sessions (a file sent in chunks) are :mod:`.sessions`.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import secrets
import shutil
import stat
import time
from collections.abc import Callable
from pathlib import Path

from ...errors import (
    FileError,
    FileTooLargeError,
    RemotePermissionError,
)
from ...protocol import (
    FileHashParams,
    FileHashResult,
    FileInfo,
    FileListParams,
    FileListResult,
    FileMkdirParams,
    FileReadParams,
    FileReadResult,
    FileRemoveParams,
    FileRemoveResult,
    FileStatParams,
    FileWriteParams,
)
from ..rpc import WithPayload
from .fileops import begin_write, finish_write, open_regular, pwrite_all, stat_at, umask
from .journal import WriteJournal
from .listing import walk_page
from .paths import os_error, resolve
from .sessions import FileLimits, WriteSessions

__all__ = ["FileController"]

_LIST = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class FileController:
    """Serves every ``file_*`` method; the write sessions are its :attr:`sessions`."""

    def __init__(
        self,
        limits: FileLimits | None = None,
        journal: Path | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits or FileLimits()
        self.journal = WriteJournal(journal)
        self.umask = umask()
        # ``clock``: monotonic seconds that ``session_ttl`` is counted in (tests pass a fake one).
        self.sessions = WriteSessions(self.limits, self.journal, self.umask, clock=clock)

    # -- reads ------------------------------------------------------------------------------

    async def stat(self, p: FileStatParams) -> FileInfo:
        def run() -> FileInfo:
            with resolve(p.path, p.root, follow=p.follow) as r:
                try:
                    return stat_at(r)
                except OSError as exc:
                    raise os_error(exc, p.path) from None

        return await asyncio.to_thread(run)

    async def read(self, p: FileReadParams) -> WithPayload:
        def run() -> WithPayload:
            with resolve(p.path, p.root) as r:
                fd, st = open_regular(r, p.path)  # never blocks: a FIFO or device is refused
            try:
                if p.max_size is not None and st.st_size > p.max_size:
                    raise FileTooLargeError(
                        f"{p.path} is {st.st_size} bytes, over the {p.max_size}-byte limit of this read",
                        path=p.path,
                        data={"size": st.st_size, "limit": p.max_size},
                    )
                parts = []
                offset, want = p.offset, min(p.length, max(0, st.st_size - p.offset))
                while want > 0:
                    data = os.pread(fd, want, offset)
                    if not data:
                        break  # truncated meanwhile: the result says what we have
                    parts.append(data)
                    offset, want = offset + len(data), want - len(data)
                payload = parts[0] if len(parts) == 1 else b"".join(parts)
                result = FileReadResult(
                    size=st.st_size,
                    mtime_ns=st.st_mtime_ns,
                    mode=stat.S_IMODE(st.st_mode),
                    offset=p.offset,
                    length=len(payload),
                    eof=p.offset + len(payload) >= st.st_size,
                )
                return WithPayload(result, payload)
            except OSError as exc:
                raise os_error(exc, p.path) from None
            finally:
                os.close(fd)

        return await asyncio.to_thread(run)

    async def hash(self, p: FileHashParams) -> FileHashResult:
        def one(path: str) -> str | None:
            with resolve(path, p.root) as r:  # a path leading out of the root raises: no silent None
                try:
                    fd, _ = open_regular(r, path)
                except FileError:
                    return None  # missing, unreadable, or not a regular file: no hash
            try:
                with open(fd, "rb", closefd=False) as f:
                    return hashlib.file_digest(f, "sha256").hexdigest()
            except OSError:
                return None
            finally:
                os.close(fd)

        def run() -> FileHashResult:
            hashes = []
            for path in p.paths:
                try:
                    hashes.append(one(path))
                except (FileNotFoundError, NotADirectoryError, PermissionError):
                    hashes.append(None)  # a missing or unreadable parent directory
            return FileHashResult(hashes=hashes)

        return await asyncio.to_thread(run)

    async def list(self, p: FileListParams) -> FileListResult:
        def run() -> FileListResult:
            with resolve(p.path, p.root) as r:
                try:
                    fd = os.open(r.name, _LIST, dir_fd=r.dir_fd)
                except OSError as exc:
                    raise os_error(exc, p.path) from None
                try:
                    entries, more, unnamed = walk_page(fd, r.path, p.recursive, p.limit, p.after)
                except OSError as exc:
                    raise os_error(exc, p.path) from None
                finally:
                    os.close(fd)
                return FileListResult(
                    path=r.path, entries=entries, next=entries[-1].name if more else None, unnamed=unnamed
                )

        return await asyncio.to_thread(run)

    # -- changes ----------------------------------------------------------------------------

    async def remove(self, p: FileRemoveParams) -> FileRemoveResult:
        def run() -> FileRemoveResult:
            with resolve(p.path, p.root, follow=False) as r:
                if r.name == ".":
                    what = "the workspace root" if r.is_root and p.root else r.path
                    raise RemotePermissionError(
                        f"refusing to remove {what} (through {p.path!r}): name the entry itself",
                        path=p.path,
                        data={"errno": "EPERM"},
                    )
                try:
                    st = os.stat(r.name, dir_fd=r.dir_fd, follow_symlinks=False)
                    if not stat.S_ISDIR(st.st_mode):
                        os.unlink(r.name, dir_fd=r.dir_fd)
                    elif p.recursive:
                        shutil.rmtree(r.name, dir_fd=r.dir_fd)
                    else:
                        os.rmdir(r.name, dir_fd=r.dir_fd)
                except FileNotFoundError as exc:
                    if p.missing_ok:
                        return FileRemoveResult(removed=False)
                    raise os_error(exc, p.path) from None
                except OSError as exc:
                    err = os_error(exc, p.path)
                    if exc.errno == errno.ENOTEMPTY:
                        err = FileError(f"{err.message} (use recursive=True)", data=err.data)
                    raise err from None
                return FileRemoveResult(removed=True)

        return await asyncio.to_thread(run)

    async def mkdir(self, p: FileMkdirParams) -> FileInfo:
        def run() -> FileInfo:
            with resolve(p.path, p.root, make_parents=p.parents) as r:
                try:
                    if r.name != ".":
                        try:
                            os.mkdir(r.name, 0o777 if p.mode is None else p.mode, dir_fd=r.dir_fd)
                        except FileExistsError:
                            st = os.stat(r.name, dir_fd=r.dir_fd)
                            if not p.exist_ok or not stat.S_ISDIR(st.st_mode):
                                raise
                        else:
                            if p.mode is not None:  # mkdir applies the umask; the caller asked for this
                                fd = os.open(r.name, _LIST, dir_fd=r.dir_fd)
                                try:
                                    os.fchmod(fd, p.mode)
                                finally:
                                    os.close(fd)
                    elif not p.exist_ok:
                        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST))
                    return stat_at(r, follow=True)
                except OSError as exc:
                    raise os_error(exc, p.path) from None

        return await asyncio.to_thread(run)

    async def write(self, p: FileWriteParams, payload: memoryview | None) -> FileInfo:
        data = payload if payload is not None else memoryview(b"")

        def run() -> FileInfo:
            w = begin_write(p.path, p.root, p.mode, p.parents, self.umask, secrets.token_hex(6))
            entry = self.journal.add(w)
            try:
                try:
                    pwrite_all(w.fd, data, 0)
                except OSError as exc:  # ENOSPC: NoSpaceError, and the temporary file goes
                    w.discard()
                    raise os_error(exc, p.path) from None
                except BaseException:
                    w.discard()
                    raise
                return finish_write(w, p.path, len(data), p.mtime_ns, False)
            finally:
                self.journal.remove(entry)  # renamed or removed by now

        return await asyncio.to_thread(run)

    def recover(self) -> int:
        """Remove the temporary files an earlier agent's writes left (blocking; before serving)."""
        return self.journal.recover()

    async def aclose(self) -> None:
        """Abort every write session (the agent is stopping): no temporary file is left behind."""
        await self.sessions.aclose()
