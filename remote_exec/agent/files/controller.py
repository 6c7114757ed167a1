"""Files and directories: typed operations behind the ``file_*`` JSON-RPC methods.

Blocking file I/O runs in worker threads (``asyncio.to_thread``), so a slow disk never stalls
the event loop that answers job polls. Paths are resolved by :func:`.paths.resolve` (inside the
request's workspace root, if any). Writes are atomic: the bytes go to a temporary file in the
target's directory (``.<name>.<id>.rxtmp``, mode ``0600`` until the commit), which gets its
mode, owner and mtime and is then renamed over the target; a reader sees the old file or the
new one, never a part. Write sessions idle for ``session_ttl`` are aborted (temporary file
removed), and so is every session when the agent stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import os
import secrets
import shutil
import stat
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from ...errors import (
    FileError,
    FileTooLargeError,
    InvalidParamsError,
    RemotePermissionError,
    ServerBusyError,
    WriteSessionNotFoundError,
)
from ...protocol import (
    MAX_CHUNK,
    Empty,
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
    FileSessionParams,
    FileStatParams,
    FileWriteChunkParams,
    FileWriteChunkResult,
    FileWriteCommitParams,
    FileWriteOpenParams,
    FileWriteOpenResult,
    FileWriteParams,
)
from ..rpc import WithPayload
from .fileops import Write, begin_write, finish_write, open_regular, pwrite_all, stat_at, umask
from .journal import WriteJournal
from .listing import walk_page
from .paths import os_error, resolve

__all__ = ["FileController", "FileLimits"]

_LIST = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class FileLimits:
    """Bounds on write sessions.

    :ivar session_ttl: seconds a write session may go without a request before it is aborted.
    :ivar max_sessions: open write sessions at once; more opens get ``ServerBusyError``.
    :ivar remember_commits: committed sessions whose result is kept, so a retried commit (its
        response lost) gets the same answer.
    """

    session_ttl: float = 600.0
    max_sessions: int = 256
    remember_commits: int = 256


class FileController:
    """Owns the write sessions of one agent and serves every ``file_*`` method."""

    def __init__(self, limits: FileLimits | None = None, journal: Path | None = None) -> None:
        self.limits = limits or FileLimits()
        self.journal = WriteJournal(journal)
        self._entries: dict[str, str | None] = {}  # session id -> its journal entry
        self.umask = umask()
        self._writes: dict[str, Write] = {}
        self._paths: dict[str, str] = {}  # session id -> the path the client named (for messages)
        self._committed: OrderedDict[str, FileInfo] = OrderedDict()
        self._reaper: asyncio.Task[None] | None = None
        self._opening = 0  # write_open calls between the limit check and registering

    @property
    def open_sessions(self) -> int:
        return len(self._writes)

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

    # -- write sessions ---------------------------------------------------------------------

    def _session(self, session_id: str) -> Write:
        w = self._writes.get(session_id)
        if w is None:
            why = "it was committed" if session_id in self._committed else "never opened, aborted or expired idle"
            raise WriteSessionNotFoundError(f"no write session {session_id} ({why})", data={"session_id": session_id})
        w.last_used = time.monotonic()
        return w

    async def write_open(self, p: FileWriteOpenParams) -> FileWriteOpenResult:
        known = self._writes.get(p.session_id)
        if known is not None:  # a retried open
            return self._opened(p.session_id, known)
        if p.session_id in self._committed:
            raise WriteSessionNotFoundError(f"write session {p.session_id} was committed already")
        if len(self._writes) + self._opening >= self.limits.max_sessions:
            raise ServerBusyError(
                f"{len(self._writes) + self._opening} write sessions are open, the limit of this agent",
                data={"limit": self.limits.max_sessions},
            )
        token = p.session_id[:16] + secrets.token_hex(3)

        def begin() -> tuple[Write, str | None]:
            w = begin_write(p.path, p.root, p.mode, p.parents, self.umask, token, p.staged)
            return w, self.journal.add(w)

        self._opening += 1  # the slot is taken before the await: concurrent opens cannot overshoot
        try:
            w, entry = await asyncio.to_thread(begin)
        finally:
            self._opening -= 1
        if p.session_id in self._writes:  # a concurrent retry won the race: keep its file
            await asyncio.to_thread(self._discard, w, entry)
            w = self._writes[p.session_id]
        else:
            w.idle.set()
            self._writes[p.session_id] = w
            self._entries[p.session_id] = entry
            self._paths[p.session_id] = p.path
            self._start_reaper()
        return self._opened(p.session_id, w)

    @staticmethod
    def _opened(session_id: str, w: Write) -> FileWriteOpenResult:
        if not w.staged:
            return FileWriteOpenResult(session_id=session_id, path=w.target.path)
        return FileWriteOpenResult(
            session_id=session_id, path=w.target.path, stage_dir=w.stage_dir, uid=os.geteuid(), gid=os.getegid()
        )

    async def write_chunk(self, p: FileWriteChunkParams, payload: memoryview | None) -> FileWriteChunkResult:
        w = self._session(p.session_id)
        data = payload if payload is not None else memoryview(b"")
        if w.staged:
            raise InvalidParamsError(f"write session {p.session_id} is staged: its file is put in place, not sent")
        if len(data) > MAX_CHUNK:
            raise InvalidParamsError(f"a chunk holds at most {MAX_CHUNK} bytes, not {len(data)}")
        if data:
            w.busy += 1
            w.idle.clear()
            try:
                await asyncio.to_thread(pwrite_all, w.fd, data, p.offset)
            except OSError as exc:
                raise os_error(exc, self._paths.get(p.session_id, "?")) from None
            finally:
                w.busy -= 1
                if not w.busy:
                    w.idle.set()
            w.chunks[p.offset] = max(w.chunks.get(p.offset, 0), len(data))
        return FileWriteChunkResult(received=w.received)

    async def write_commit(self, p: FileWriteCommitParams) -> FileInfo:
        done = self._committed.get(p.session_id)
        if done is not None:  # a retried commit whose first answer was lost
            return done
        w = self._session(p.session_id)
        await w.idle.wait()  # a chunk still being written (a retry racing its original) finishes first
        if self._writes.get(p.session_id) is not w:
            return await self.write_commit(p)  # another commit (or an abort) got there first
        path = self._paths[p.session_id]
        gap = None if w.staged else w.missing(p.size)  # a staged file's size is checked by finish_write
        if gap is not None:  # recoverable: the client may still send what is missing
            raise FileError(
                f"write of {path}: byte {gap} of {p.size} never arrived ({w.received} received)",
                path=path,
                data={"received": w.received, "missing_from": gap},
            )
        del self._writes[p.session_id]
        del self._paths[p.session_id]
        entry = self._entries.pop(p.session_id, None)

        def finish() -> FileInfo:
            try:
                return finish_write(w, path, p.size, p.mtime_ns, p.fsync)
            finally:
                self.journal.remove(entry)  # renamed over the target, or removed

        info = await asyncio.to_thread(finish)
        self._committed[p.session_id] = info
        while len(self._committed) > self.limits.remember_commits:
            self._committed.popitem(last=False)
        return info

    async def write_abort(self, p: FileSessionParams) -> Empty:
        w = self._writes.pop(p.session_id, None)
        self._paths.pop(p.session_id, None)
        entry = self._entries.pop(p.session_id, None)
        if w is not None:
            await w.idle.wait()
            await asyncio.to_thread(self._discard, w, entry)
        return Empty()

    def _discard(self, w: Write, entry: str | None) -> None:
        w.discard()
        self.journal.remove(entry)

    def recover(self) -> int:
        """Remove the temporary files an earlier agent's writes left (blocking; before serving)."""
        return self.journal.recover()

    def _start_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.get_running_loop().create_task(self._reap())

    async def _reap(self) -> None:
        ttl = self.limits.session_ttl
        while self._writes:
            # A timer, not synchronisation: nothing signals "a client went away".
            await asyncio.sleep(min(max(ttl / 4, 0.05), 30.0))
            now = time.monotonic()
            for sid, w in list(self._writes.items()):
                if not w.busy and now - w.last_used > ttl:
                    await self.write_abort(FileSessionParams(session_id=sid))

    async def aclose(self) -> None:
        """Abort every write session (the agent is stopping): no temporary file is left behind."""
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        # No worker thread here: the pool may be stuck (a hung mount), and shutdown must not be.
        for sid, w in list(self._writes.items()):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await w.idle.wait()  # a chunk being written
            del self._writes[sid]
            self._paths.pop(sid, None)
            entry = self._entries.pop(sid, None)
            if w.busy:  # its thread still writes to w.fd: closing it could redirect that write
                with contextlib.suppress(OSError):
                    os.unlink(w.temp, dir_fd=w.target.dir_fd)
            else:
                w.discard()
            self.journal.remove(entry)
