"""Write sessions: a file sent in chunks, by offset, then committed (or aborted, or expired).

A session's bytes go to a temporary file next to the target (see :mod:`.fileops`), recorded in
the write journal so a killed agent's leftovers are removed at the next start. Sessions idle for
``session_ttl`` are aborted (temporary file removed), and so is every session when the agent
stops. A retried open or commit (its answer lost) gets the same answer as the first.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from ...errors import FileError, InvalidParamsError, ServerBusyError, WriteSessionNotFoundError
from ...protocol import (
    MAX_CHUNK,
    Empty,
    FileInfo,
    FileSessionParams,
    FileWriteChunkParams,
    FileWriteChunkResult,
    FileWriteCommitParams,
    FileWriteOpenParams,
    FileWriteOpenResult,
)
from .fileops import Write, begin_write, finish_write, pwrite_all
from .journal import WriteJournal
from .paths import os_error

__all__ = ["FileLimits", "WriteSessions"]


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


class WriteSessions:
    """The open write sessions of one agent, behind ``file_write_open/chunk/commit/abort``."""

    def __init__(
        self, limits: FileLimits, journal: WriteJournal, umask: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limits = limits
        self._clock = clock  # monotonic seconds that ``session_ttl`` is counted in (tests pass a fake one)
        self.journal = journal
        self.umask = umask
        self._entries: dict[str, str | None] = {}  # session id -> its journal entry
        self._writes: dict[str, Write] = {}
        self._paths: dict[str, str] = {}  # session id -> the path the client named (for messages)
        self._committed: OrderedDict[str, FileInfo] = OrderedDict()
        self._reaper: asyncio.Task[None] | None = None
        self._opening = 0  # write_open calls between the limit check and registering

    @property
    def open_sessions(self) -> int:
        return len(self._writes)

    def _session(self, session_id: str) -> Write:
        w = self._writes.get(session_id)
        if w is None:
            why = "it was committed" if session_id in self._committed else "never opened, aborted or expired idle"
            raise WriteSessionNotFoundError(f"no write session {session_id} ({why})", data={"session_id": session_id})
        w.last_used = self._clock()
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
            w.last_used = self._clock()
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

    def _start_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.get_running_loop().create_task(self._reap())

    async def _reap(self) -> None:
        while self._writes:
            # A timer, not synchronisation: nothing signals "a client went away".
            await asyncio.sleep(min(max(self.limits.session_ttl / 4, 0.05), 30.0))
            await self.expire_idle()

    async def expire_idle(self) -> int:
        """Abort every session without a request for ``session_ttl`` seconds by the clock; return how many.

        A background task does this every quarter TTL; a test advances its fake clock and calls
        this instead of waiting out the TTL. Cancelling it may leave a due session open (the
        next call aborts it) or its temporary file being removed in a worker thread.
        """
        ttl, now, aborted = self.limits.session_ttl, self._clock(), 0
        for sid, w in list(self._writes.items()):
            if not w.busy and now - w.last_used > ttl:
                await self.write_abort(FileSessionParams(session_id=sid))
                aborted += 1
        return aborted

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
