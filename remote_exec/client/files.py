"""File operations over the agent channel: whole files in memory, and streams to and from disk.

Bytes travel as frame payloads, never in JSON. A file bigger than one chunk moves as several
chunk requests **in flight at once** (``window`` of them), so the channel's latency does not
bound throughput; memory stays bounded by ``window * chunk_size`` on each side, whatever the
file's size. Every request is safe to repeat (reads are by offset, chunks carry their offset,
sessions are named by the client, commits are remembered), so :class:`RpcClient` may retry
any of them.

A transport may offer a :class:`~remote_exec.client.native.NativeCopy` (``docker cp``): big
files then go through it instead (see :mod:`remote_exec.client.native`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import stat
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import anyio

from ..errors import FileEncodingError, FileError, FileTooLargeError, ProtocolError
from ..protocol import (
    DEFAULT_CHUNK,
    MAX_HASH_PATHS,
    MAX_LIST_ENTRIES,
    MAX_PAGE_ITEMS,
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
    Method,
)
from .fanout import fan_out
from .localfile import drop_local, finish_local, local_temp, pread_all, pwrite_all
from .native import NativeCopy, Progress, read_native, write_staged
from .rpc import RpcClient

__all__ = ["TEXT_LIMIT", "FileClient", "Listing"]


class Listing(NamedTuple):
    """A whole listing: the directory (symlinks resolved), its entries, whether there were
    more than were asked for, and how many were left out because their names are not UTF-8."""

    path: str
    entries: list[FileInfo]
    truncated: bool
    unnamed: int = 0


TEXT_LIMIT = 64 * 1024 * 1024
"""Largest file ``read_file(text=True)`` reads by default (``FileTooLargeError`` beyond)."""

_HASH_BATCH = 256 * 1024 * 1024


async def _pipelined(offsets: Iterable[int], work: Callable[[int], Awaitable[None]], window: int) -> None:
    """Run ``work(offset)`` for every offset, ``window`` at a time; the first failure cancels the
    rest and is raised once they have ended."""
    it = iter(offsets)

    async def worker() -> None:
        for offset in it:  # one shared iterator: each offset is taken by exactly one worker
            await work(offset)

    async with fan_out() as tg:  # none of the workers outlives the call
        for _ in range(max(1, window)):
            tg.start_soon(worker)


class FileClient:
    """The ``file_*`` methods of one agent, for paths inside ``root`` (``None``: anywhere).

    :param chunk_size: bytes per read or write request.
    :param window: chunk requests of one file in flight at once.
    :param native: the transport's own copy command, for files of at least its ``min_size``.
    """

    def __init__(
        self,
        rpc: RpcClient,
        root: str | None = None,
        *,
        chunk_size: int = DEFAULT_CHUNK,
        window: int = 4,
        native: NativeCopy | None = None,
    ) -> None:
        self.rpc = rpc
        self.root = root
        self.chunk_size = chunk_size
        self.window = window
        self.native = native

    # -- metadata ---------------------------------------------------------------------------

    async def stat(self, path: str, *, follow: bool = True) -> FileInfo:
        return await self.rpc.call(Method.FILE_STAT, FileStatParams(path=path, root=self.root, follow=follow), FileInfo)

    async def listing(self, path: str, *, recursive: bool = False, max_entries: int = 100_000) -> Listing:
        """Every entry (at most ``max_entries``), gathered page by page; each page must follow
        the last, so a lying agent can neither loop nor send more than was asked.

        :raises ProtocolError: a page that is not where the listing was.
        """
        if not 1 <= max_entries <= MAX_LIST_ENTRIES:
            raise ValueError(f"max_entries must be between 1 and {MAX_LIST_ENTRIES}")
        entries: list[FileInfo] = []
        after: str | None = None
        unnamed = 0
        while True:
            limit = min(MAX_PAGE_ITEMS, max_entries + 1 - len(entries))  # one more tells "truncated"
            params = FileListParams(path=path, root=self.root, recursive=recursive, after=after, limit=limit)
            page = await self.rpc.call(Method.FILE_LIST, params, FileListResult)
            ends_right = page.next is None or (page.entries and page.next == page.entries[-1].name)
            if len(page.entries) > limit or not ends_right:
                raise ProtocolError(f"file_list of {path}: a page of {len(page.entries)} entries, cursor {page.next!r}")
            entries += page.entries
            unnamed += page.unnamed
            if len(entries) > max_entries:
                return Listing(page.path, entries[:max_entries], True, unnamed)
            if page.next is None:
                return Listing(page.path, entries, False, unnamed)
            after = page.next

    async def list_dir(self, path: str, *, recursive: bool = False, max_entries: int = 100_000) -> list[FileInfo]:
        res = await self.listing(path, recursive=recursive, max_entries=max_entries)
        if res.truncated:
            raise FileError(
                f"{path} holds more than {max_entries} entries: raise max_entries to list them all",
                path=path,
                data={"max_entries": max_entries},
            )
        return res.entries

    async def remove(self, path: str, *, recursive: bool = False, missing_ok: bool = False) -> bool:
        params = FileRemoveParams(path=path, root=self.root, recursive=recursive, missing_ok=missing_ok)
        return (await self.rpc.call(Method.FILE_REMOVE, params, FileRemoveResult)).removed

    async def mkdir(
        self, path: str, *, parents: bool = True, exist_ok: bool = True, mode: int | None = None
    ) -> FileInfo:
        params = FileMkdirParams(path=path, root=self.root, parents=parents, exist_ok=exist_ok, mode=mode)
        return await self.rpc.call(Method.FILE_MKDIR, params, FileInfo)

    async def hashes(self, paths: Sequence[str], sizes: Sequence[int]) -> list[str | None]:
        """The SHA-256 (hex) of each path (``None``: not a readable regular file), asked in
        batches of at most 1024 paths or 256 MiB (``sizes``: the expected sizes), so that no
        single request hashes for long."""
        out: list[str | None] = []
        start = 0
        while start < len(paths):
            end, budget = start, 0
            while (
                end < len(paths)
                and end - start < MAX_HASH_PATHS
                and (end == start or budget + sizes[end] <= _HASH_BATCH)
            ):
                budget += sizes[end]
                end += 1
            params = FileHashParams(paths=list(paths[start:end]), root=self.root)
            timeout = 30.0 + budget / 50e6  # a slow disk hashes 50 MB/s
            out.extend((await self.rpc.call(Method.FILE_HASH, params, FileHashResult, timeout=timeout)).hashes)
            start = end
        return out

    # -- reads ------------------------------------------------------------------------------

    async def _read(
        self,
        path: str,
        sink: Callable[[int, memoryview], Awaitable[None]],
        max_size: int | None = None,
        progress: Progress | None = None,
        first_sink: Callable[[FileReadResult], Awaitable[None]] | None = None,
    ) -> FileReadResult:
        """Read the whole file, handing each chunk to ``sink(offset, bytes)`` (in any order)."""
        first, data = await self._chunk(path, 0, max_size)
        if first_sink is not None:
            await first_sink(first)
        await sink(0, data)
        if progress is not None:
            progress(len(data))
        if first.eof:
            return first

        async def one(offset: int) -> None:
            data = await self._next_chunk(path, first, offset, max_size)
            await sink(offset, data)
            if progress is not None:
                progress(len(data))

        await _pipelined(range(first.length, first.size, self.chunk_size), one, self.window)
        return first

    async def _chunk(self, path: str, offset: int, max_size: int | None) -> tuple[FileReadResult, memoryview]:
        params = FileReadParams(path=path, root=self.root, offset=offset, length=self.chunk_size, max_size=max_size)
        res, payload = await self.rpc.call_with_payload(
            Method.FILE_READ, params, FileReadResult, max_payload=params.length
        )
        data = payload if payload is not None else memoryview(b"")
        if len(data) != res.length:
            raise FileError(f"read of {path}: {len(data)} bytes came, {res.length} announced", path=path)
        return res, data

    async def _next_chunk(self, path: str, first: FileReadResult, offset: int, max_size: int | None) -> memoryview:
        """The chunk at ``offset`` of the file whose first chunk was ``first``, which must not have changed."""
        res, data = await self._chunk(path, offset, max_size)
        if (res.size, res.mtime_ns) != (first.size, first.mtime_ns) or res.length != min(
            self.chunk_size, first.size - offset
        ):
            raise FileError(f"{path} changed while it was being read", path=path)
        return data

    async def iter_bytes(self, path: str) -> AsyncIterator[bytes]:
        """The file's bytes in order, one chunk request at a time: memory holds one chunk."""
        first, data = await self._chunk(path, 0, None)
        if data:  # an empty file yields nothing
            yield bytes(data)
        if not first.eof:
            for offset in range(first.length, first.size, self.chunk_size):
                yield bytes(await self._next_chunk(path, first, offset, None))

    async def read_bytes(self, path: str, *, max_size: int | None = None, progress: Progress | None = None) -> bytes:
        buf = bytearray()

        async def size_it(first: FileReadResult) -> None:
            buf.extend(bytes(first.size))

        async def sink(offset: int, data: memoryview) -> None:
            buf[offset : offset + len(data)] = data

        first = await self._read(path, sink, max_size, progress, size_it)
        del buf[first.size :]
        return bytes(buf)

    async def read_text(self, path: str, *, max_size: int | None = TEXT_LIMIT) -> str:
        try:
            data = await self.read_bytes(path, max_size=max_size)
        except FileTooLargeError as exc:
            raise FileTooLargeError(
                f"{exc.message} for a text read: read it as bytes (text=False), raise max_size, "
                "or stream it to a local file with read_file_to()",
                data=exc.data,
            ) from None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FileEncodingError(
                f"{path} is not valid UTF-8 (byte {exc.start}: {exc.reason}): read it with text=False for the bytes",
                path=path,
                data={"offset": exc.start},
            ) from None

    async def read_to(
        self,
        path: str,
        local: str | os.PathLike[str],
        *,
        progress: Progress | None = None,
        size_hint: int | None = None,
        dir_fd: int | None = None,
    ) -> FileInfo:
        """Stream ``path`` into the local file ``local``, atomically (a temporary file beside it,
        renamed once complete), with the remote file's mode (set-id bits dropped) and mtime.

        ``size_hint``: the size the caller expects (from a listing); below the native copy's
        ``min_size`` the file goes straight through the channel, without the stat that decides.
        ``dir_fd``: ``local`` is a bare name in the directory open as ``dir_fd``, and nothing is
        followed there (a symlink of that name is replaced, not written through)."""
        dest = Path(local)
        fd, temp = await asyncio.to_thread(local_temp, dest, dir_fd)
        try:

            async def sink(offset: int, data: memoryview) -> None:
                await asyncio.to_thread(pwrite_all, fd, data, offset)

            first: FileInfo | FileReadResult | None = None
            if self.native is not None and (size_hint is None or size_hint >= self.native.min_size):
                first = await read_native(self, self.native, path, fd, progress)
            if first is None:
                first = await self._read(path, sink, None, progress)
            await asyncio.to_thread(
                finish_local, fd, temp, dest, first.size, first.mode & 0o777, first.mtime_ns, dir_fd
            )
            fd = -1
        finally:
            if fd >= 0:
                with anyio.CancelScope(shield=True):
                    await asyncio.to_thread(drop_local, fd, temp, dir_fd)
        return first if isinstance(first, FileInfo) else await self.stat(path)

    # -- writes -----------------------------------------------------------------------------

    async def _write(
        self,
        path: str,
        size: int,
        chunk: Callable[[int, int], Awaitable[bytes | memoryview]],
        mode: int | None,
        mtime_ns: int | None,
        parents: bool,
        progress: Progress | None,
    ) -> FileInfo:
        """Write ``size`` bytes, ``chunk(offset, n)`` giving each piece: one request when it fits
        one chunk, else a write session with chunks in flight."""
        if size <= self.chunk_size:
            data = await chunk(0, size)
            params = FileWriteParams(path=path, root=self.root, mode=mode, parents=parents, mtime_ns=mtime_ns)
            info = await self.rpc.call(Method.FILE_WRITE, params, FileInfo, payload=data)
            if progress is not None:
                progress(size)
            return info
        sid = secrets.token_urlsafe(12)
        open_params = FileWriteOpenParams(session_id=sid, path=path, root=self.root, mode=mode, parents=parents)
        # Shielded: an open cancelled in flight would still create the session (and its temporary
        # file) in the agent after we stopped waiting, with no one left to abort it.
        with anyio.CancelScope(shield=True):
            await self.rpc.call(Method.FILE_WRITE_OPEN, open_params, FileWriteOpenResult)
        try:

            async def one(offset: int) -> None:
                n = min(self.chunk_size, size - offset)
                data = await chunk(offset, n)
                if len(data) != n:
                    raise FileError(f"the local data for {path} changed size while it was being sent", path=path)
                params = FileWriteChunkParams(session_id=sid, offset=offset)
                await self.rpc.call(Method.FILE_WRITE_CHUNK, params, FileWriteChunkResult, payload=data)
                if progress is not None:
                    progress(n)

            await _pipelined(range(0, size, self.chunk_size), one, self.window)
            commit = FileWriteCommitParams(session_id=sid, size=size, mtime_ns=mtime_ns)
            return await self.rpc.call(Method.FILE_WRITE_COMMIT, commit, FileInfo)
        except BaseException:
            await self.abort(sid)
            raise

    async def write_bytes(
        self,
        path: str,
        data: bytes | bytearray | memoryview,
        *,
        mode: int | None = None,
        mtime_ns: int | None = None,
        parents: bool = False,
        progress: Progress | None = None,
    ) -> FileInfo:
        view = memoryview(data).cast("B")

        async def chunk(offset: int, n: int) -> memoryview:
            return view[offset : offset + n]

        return await self._write(path, len(view), chunk, mode, mtime_ns, parents, progress)

    async def write_from(
        self,
        local: str | os.PathLike[str],
        path: str,
        *,
        mode: int | None = None,
        keep_mtime: bool = True,
        parents: bool = False,
        progress: Progress | None = None,
    ) -> FileInfo:
        """Stream the local file ``local`` to ``path``; it gets the local file's permission bits
        unless ``mode`` says otherwise, and its mtime with ``keep_mtime``."""
        fd = await asyncio.to_thread(os.open, os.fspath(local), os.O_RDONLY | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(f"{local} is a directory: use upload() for a tree")

            async def chunk(offset: int, n: int) -> bytes:
                return await asyncio.to_thread(pread_all, fd, n, offset)

            final_mode = stat.S_IMODE(st.st_mode) if mode is None else mode
            mtime_ns = st.st_mtime_ns if keep_mtime else None
            if self.native is not None and st.st_size >= self.native.min_size:
                staged = await write_staged(
                    self, self.native, fd, path, st.st_size, final_mode, mtime_ns, parents, progress
                )
                if staged is not None:
                    return staged
            return await self._write(path, st.st_size, chunk, final_mode, mtime_ns, parents, progress)
        finally:
            os.close(fd)

    async def abort(self, session_id: str) -> None:
        """Abort a write session, even while being cancelled; an unreachable agent drops it itself."""
        with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
            await self.rpc.call(Method.FILE_WRITE_ABORT, FileSessionParams(session_id=session_id), Empty, timeout=10)
