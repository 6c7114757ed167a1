"""Big files through the transport's own copy command (``docker cp``) instead of the agent channel.

Uploads: :func:`write_staged` opens a *staged* write session (the agent makes a private
directory beside the target), has the :class:`NativeCopy` put the bytes there, and commits: the
agent checks the staged file (a regular file of the announced size, its own) and renames it
into place, as atomic as a chunked write. Downloads: :func:`read_native` stats the file through
the agent (which resolves it inside the workspace root and refuses escapes), has the copy
command fetch that path, and checks the file did not change meanwhile.

Either way a failure of the native copy (a read-only root, a tmpfs the engine cannot see, an
older agent, a missing CLI) costs one attempt: the file then goes through the channel, so the
native copy only ever makes a transfer faster. Cancellation stops the copy and aborts the session.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import anyio

from ..errors import FileError, RemoteExecError
from ..protocol import (
    STAGED_NAME,
    FileInfo,
    FileWriteCommitParams,
    FileWriteOpenParams,
    FileWriteOpenResult,
    Method,
)

if TYPE_CHECKING:
    from .rpc import RpcClient

__all__ = ["FileSide", "NativeCopy", "Progress", "read_native", "write_staged"]

_log = logging.getLogger("remote_exec.files")

Progress = Callable[[int], None]
"""Called with the byte count of each chunk as it completes."""


class FileSide(Protocol):
    """What a native copy uses of a :class:`~remote_exec.client.files.FileClient`, named here
    because that module imports this one (so this one may not import it)."""

    rpc: RpcClient
    root: str | None

    async def stat(self, path: str, *, follow: bool = True) -> FileInfo: ...

    async def abort(self, session_id: str) -> None: ...


class NativeCopy(Protocol):
    """A transport's own way to copy files in and out of the sandbox, faster than the agent
    channel for big files.

    :ivar min_size: files smaller than this go through the channel (a native copy has a fixed
        cost, such as starting a process).
    """

    min_size: int

    async def put(
        self, fd: int, size: int, stage_dir: str, name: str, owner: tuple[int, int], progress: Progress | None
    ) -> None:
        """Copy ``size`` bytes of the open local file ``fd`` (from offset 0) to ``stage_dir/name``
        in the sandbox, owned by ``owner`` (uid, gid) where the copy can say so.

        On cancellation the copy is stopped before this returns.
        """
        ...

    async def get(self, path: str, fd: int, size: int, progress: Progress | None) -> None:
        """Copy the sandbox's regular file ``path`` (``size`` bytes) into the open local file
        ``fd`` from offset 0.

        On cancellation the copy is stopped before this returns.
        """
        ...


class _Counted:
    """Progress that remembers how much it reported, to take it back on a fallback."""

    def __init__(self, progress: Progress | None) -> None:
        self.progress = progress
        self.sent = 0

    def __call__(self, n: int) -> None:
        self.sent += n
        if self.progress is not None:
            self.progress(n)

    def take_back(self) -> None:
        if self.progress is not None and self.sent:
            self.progress(-self.sent)
        self.sent = 0


async def write_staged(
    files: FileSide,
    native: NativeCopy,
    fd: int,
    path: str,
    size: int,
    mode: int | None,
    mtime_ns: int | None,
    parents: bool,
    progress: Progress | None,
) -> FileInfo | None:
    """Write the local file ``fd`` to ``path`` through ``native`` in a staged session.

    Returns the new file's info, or None when the native copy could not do it (the session is
    aborted and the progress taken back): the caller then sends the bytes through the channel.
    """
    sid = secrets.token_urlsafe(12)
    counted = _Counted(progress)
    params = FileWriteOpenParams(session_id=sid, path=path, root=files.root, mode=mode, parents=parents, staged=True)
    try:
        with anyio.CancelScope(shield=True):  # see FileClient._write: an open is seen through
            opened = await files.rpc.call(Method.FILE_WRITE_OPEN, params, FileWriteOpenResult)
        if opened.stage_dir is None or opened.uid is None or opened.gid is None:
            raise FileError(f"the agent opened no staging directory for {path}", path=path)
        await native.put(fd, size, opened.stage_dir, STAGED_NAME, (opened.uid, opened.gid), counted)
        commit = FileWriteCommitParams(session_id=sid, size=size, mtime_ns=mtime_ns)
        return await files.rpc.call(Method.FILE_WRITE_COMMIT, commit, FileInfo)
    except (RemoteExecError, OSError) as exc:
        # Not (yet) a failure of the write: the channel can still do it. Genuine errors (no such
        # directory, permission denied) come back from the channel write, in their own words.
        _log.debug("native copy of %s into the sandbox failed, using the channel: %s", path, exc)
    except BaseException:
        await files.abort(sid)
        raise
    await files.abort(sid)
    counted.take_back()
    return None


async def read_native(
    files: FileSide, native: NativeCopy, path: str, fd: int, progress: Progress | None
) -> FileInfo | None:
    """Read ``path`` into the local file ``fd`` through ``native``, if it is a regular file of at
    least ``native.min_size`` bytes.

    Returns its info, or None when the native copy did not do it (the progress taken back):
    the caller then reads through the channel, which also gives any error its precise words.

    :raises FileError: the file changed while it was being copied.
    """
    try:
        before = await files.stat(path)
    except RemoteExecError:
        return None  # not found, a directory...: the channel read says so precisely
    if before.type != "file" or before.size < native.min_size:
        return None
    counted = _Counted(progress)
    try:
        await native.get(before.path, fd, before.size, counted)
        after = await files.stat(path)
    except (RemoteExecError, OSError) as exc:
        _log.debug("native copy of %s out of the sandbox failed, using the channel: %s", path, exc)
        counted.take_back()
        return None  # what was written is overwritten by the channel read, then cut to its size
    if (after.path, after.size, after.mtime_ns) != (before.path, before.size, before.mtime_ns):
        raise FileError(f"{path} changed while it was being read", path=path)
    return before
