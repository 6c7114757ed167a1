"""The file methods of :class:`~remote_exec.AsyncSandbox`: single files, streams and trees.

A base class with its own state (the sandbox's :class:`~remote_exec.client.core.SandboxCore` and
:attr:`workspace_root`), as httpx's clients share a ``BaseClient``, so the sandbox class stays
one screenful per concern. The work is done by :class:`~remote_exec.client.files.FileClient`
(single files and streams, over the agent channel or the transport's native copy) and
:mod:`~remote_exec.client.transfer` (trees), both built on the core.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator, Sequence
from typing import Literal, overload

from ..protocol import FileInfo
from .core import SandboxCore
from .files import TEXT_LIMIT, FileClient
from .transfer import DEFAULT_MAX_BYTES, DEFAULT_MAX_FILES, TransferResult, download_tree, progress_bar, upload_tree

__all__ = ["SandboxFiles"]


class SandboxFiles:
    """Files in the sandbox, inside :attr:`workspace_root` when one is set."""

    def __init__(self, core: SandboxCore, workspace_root: str | None) -> None:
        self._core = core
        self.workspace_root = workspace_root
        """Absolute path in the sandbox that the file methods stay inside (``None``: anywhere).

        Relative paths are resolved against it; ``..`` above it, an absolute path elsewhere, or
        a symlink leading out of it raise :class:`PathEscapeError`. (Jobs are not confined by it.)"""

    def _files(self) -> FileClient:
        return self._core.files(self.workspace_root)

    async def write_file(
        self, path: str, data: str | bytes, mode: int | None = None, *, mtime: float | None = None, parents: bool = True
    ) -> FileInfo:
        """Write ``data`` (a ``str`` is encoded as UTF-8) to ``path``, atomically.

        The bytes go to a temporary file beside ``path``, renamed over it once complete: a
        reader sees the old content or the new, never a part, and a failed write leaves the old
        file as it was. ``mode`` sets the permission bits (default: the replaced file's, or
        ``0o666`` less the umask for a new one); ``mtime`` the modification time (seconds);
        ``parents`` creates missing directories. Large data is sent in pipelined chunks.

        Cancelling it aborts the write session (shielded) and leaves the old file in place; a
        small write already sent as one request may still complete in the agent, whole.

        :raises RemoteIsADirectoryError: ``path`` is a directory.
        :raises RemotePermissionError: the agent may not write there.
        :raises PathEscapeError: ``path`` leads out of :attr:`workspace_root`.
        """
        raw = data.encode() if isinstance(data, str) else data
        mtime_ns = None if mtime is None else int(mtime * 1e9)
        return await self._files().write_bytes(path, raw, mode=mode, mtime_ns=mtime_ns, parents=parents)

    @overload
    async def read_file(self, path: str, text: Literal[True] = True, *, max_size: int | None = TEXT_LIMIT) -> str: ...

    @overload
    async def read_file(self, path: str, text: Literal[False], *, max_size: int | None = None) -> bytes: ...

    @overload
    async def read_file(self, path: str, text: bool, *, max_size: int | None = ...) -> str | bytes: ...

    async def read_file(self, path: str, text: bool = True, *, max_size: int | None = -1) -> str | bytes:
        """The content of ``path``: a ``str`` (UTF-8) with ``text=True``, else ``bytes``.

        A text read refuses a file over ``max_size`` bytes (64 MiB by default; ``None``: no
        limit); a bytes read has no limit unless given one. For big files, stream to disk with
        :meth:`read_file_to`.

        Cancelling it stops the read; nothing changes in the sandbox.

        :raises RemoteFileNotFoundError: no such file.
        :raises RemoteIsADirectoryError: ``path`` is a directory.
        :raises RemotePermissionError: the agent may not read it.
        :raises FileTooLargeError: the file is over ``max_size``.
        :raises FileEncodingError: ``text=True`` and the file is not valid UTF-8.
        :raises PathEscapeError: ``path`` leads out of :attr:`workspace_root`.
        """
        files = self._files()
        if text:
            return await files.read_text(path, max_size=TEXT_LIMIT if max_size == -1 else max_size)
        return await files.read_bytes(path, max_size=None if max_size == -1 else max_size)

    async def read_file_to(self, path: str, local_path: str | os.PathLike[str], *, progress: bool = False) -> FileInfo:
        """Stream ``path`` into the local file ``local_path`` in bounded memory, whatever its size.

        The local file is replaced atomically and gets the remote file's mode (set-id bits
        dropped) and mtime. ``progress`` shows a tqdm bar. Returns the remote file's info.

        Cancelling it stops the read and removes the partial temporary file (shielded): the
        local file keeps its old content, or stays absent. Nothing changes in the sandbox.

        :raises RemoteFileNotFoundError: no such file.
        :raises RemoteIsADirectoryError: ``path`` is a directory (use :meth:`download`).
        """
        size = (await self.stat(path)).size if progress else None
        bar = await progress_bar(size or 0, f"download {path}", progress)
        try:
            return await self._files().read_to(path, local_path, progress=bar.update, size_hint=size)
        finally:
            bar.close()

    async def aiter_file(self, path: str) -> AsyncGenerator[bytes, None]:
        """The bytes of ``path``, in order, one chunk at a time, whatever its size.

        ``async for chunk in sb.aiter_file(path): out.write(chunk)``: memory holds one chunk
        (1 MiB) at a time. Each chunk is asked for once the last was taken, so a slow consumer
        slows the read and nothing piles up. Leaving the loop early stops reading; cancelling
        the loop cancels the read in flight (nothing changes in the sandbox).

        :raises RemoteFileNotFoundError: no such file.
        :raises RemoteIsADirectoryError: ``path`` is a directory.
        :raises RemotePermissionError: the agent may not read it.
        :raises FileError: the file changed (size or mtime) while it was being read.
        :raises PathEscapeError: ``path`` leads out of :attr:`workspace_root`.
        """
        async for chunk in self._files().iter_bytes(path):
            yield chunk

    async def write_file_from(
        self,
        local_path: str | os.PathLike[str],
        path: str,
        *,
        mode: int | None = None,
        keep_mtime: bool = True,
        parents: bool = True,
        progress: bool = False,
    ) -> FileInfo:
        """Stream the local file ``local_path`` to ``path`` in bounded memory, atomically.

        The remote file gets the local one's permission bits (unless ``mode``) and, with
        ``keep_mtime``, its mtime. ``progress`` shows a tqdm bar.

        Cancelling it aborts its write session (shielded; the agent drops the temporary file,
        also the native copy's staged one) and leaves the old remote file in place; a file that
        fits one request may still be written whole by the agent. The local file is only read.

        :raises RemoteIsADirectoryError: ``path`` is a directory.
        :raises PathEscapeError: ``path`` leads out of :attr:`workspace_root`.
        """
        size = (await asyncio.to_thread(os.stat, local_path)).st_size if progress else 0  # (not on the loop)
        bar = await progress_bar(size, f"upload {os.fspath(local_path)}", progress)
        try:
            return await self._files().write_from(
                local_path, path, mode=mode, keep_mtime=keep_mtime, parents=parents, progress=bar.update
            )
        finally:
            bar.close()

    async def list_dir(self, path: str = ".", *, recursive: bool = False, max_entries: int = 100_000) -> list[FileInfo]:
        """The entries of the directory ``path``, sorted by name (symlinks are listed, not followed).

        With ``recursive`` every entry below it, each directory's entries before its
        subdirectories' contents; ``name`` is then the path relative to ``path``.
        Cancelling it abandons the listing; nothing changes in the sandbox.

        :raises RemoteFileNotFoundError: no such directory.
        :raises RemoteNotADirectoryError: ``path`` is a file.
        :raises FileError: more than ``max_entries`` entries.
        """
        return await self._files().list_dir(path, recursive=recursive, max_entries=max_entries)

    async def stat(self, path: str, *, follow: bool = True) -> FileInfo:
        """Type, size, mode and mtime of ``path`` (``follow=False``: of a final symlink itself).

        Cancelling it abandons the answer; nothing changes in the sandbox.

        :raises RemoteFileNotFoundError: no such file or directory.
        """
        return await self._files().stat(path, follow=follow)

    async def exists(self, path: str) -> bool:
        """Whether ``path`` exists (a dangling symlink does not).

        Cancelling it abandons the answer; nothing changes in the sandbox.
        """
        try:
            await self._files().stat(path)
        except FileNotFoundError:
            return False
        return True

    async def remove(self, path: str, *, recursive: bool = False, missing_ok: bool = False) -> bool:
        """Remove a file, a symlink (not its target), an empty directory or, with ``recursive``,
        a tree. Returns False when nothing was there (``missing_ok``).

        Cancelling it abandons the answer, not the removal: once the agent has the request it
        completes it, so ``path`` may be gone afterwards.

        :raises RemoteFileNotFoundError: nothing there and not ``missing_ok``.
        :raises FileError: a non-empty directory without ``recursive``.
        :raises RemotePermissionError: not allowed, or ``path`` is the workspace root itself.
        """
        return await self._files().remove(path, recursive=recursive, missing_ok=missing_ok)

    async def mkdir(
        self, path: str, *, parents: bool = True, exist_ok: bool = True, mode: int | None = None
    ) -> FileInfo:
        """Create the directory ``path`` (with ``parents``, its missing ancestors too).

        Cancelling it abandons the answer; the directory may still be created by the agent.

        :raises RemoteFileExistsError: it exists and not ``exist_ok``, or a file is in the way.
        """
        return await self._files().mkdir(path, parents=parents, exist_ok=exist_ok, mode=mode)

    async def upload(
        self,
        local_dir: str | os.PathLike[str],
        remote_dir: str,
        *,
        ignore: Sequence[str] = (),
        default_ignores: bool = True,
        gitignore: bool = True,
        max_files: int | None = DEFAULT_MAX_FILES,
        max_bytes: int | None = DEFAULT_MAX_BYTES,
        progress: bool = True,
        delete: bool = False,
        checksum: bool = False,
    ) -> TransferResult:
        """Copy a local project tree into ``remote_dir``; only new or changed files are sent.

        Left out: :data:`~remote_exec.client.transfer.ignore.DEFAULT_IGNORES` (``.git``,
        ``node_modules``, ``__pycache__``, ``.venv``, ``.env*`` but ``.env.example``, ``*.pem``,
        ``*.key``; ``default_ignores=False`` sends them), whatever ``.gitignore`` files in the
        tree ignore (``gitignore=False``: nothing), and ``ignore`` (gitignore patterns, which
        win: ``"!.env"`` sends ``.env``). A file is "unchanged" when its size, mode and mtime
        match the remote copy's. ``progress`` shows a tqdm bar (a widget in Jupyter).

        ``checksum=True`` compares contents instead of mtimes: a file of the same size and mode
        is unchanged when its SHA-256 (computed by the agent there, locally here) is the same
        (for trees whose mtimes moved, e.g. after a ``git checkout``; costs reading both copies).

        ``delete=True`` mirrors: what ``remote_dir`` holds that the local tree has no more is
        removed first (listed in :attr:`TransferResult.deleted`). What the rules ignore is never
        deleted, so a ``node_modules`` or ``.venv`` built in the sandbox stays.

        Cancelling it (or a file failing) ends every per-file transfer before it returns: they
        run in one task group. Files already renamed into place stay, each whole; the writes in
        flight abort their sessions and leave the old files; with ``delete=True`` what was
        already removed stays removed. Run it again to finish: unchanged files are skipped.

        :raises TransferLimitError: more than ``max_files`` files or ``max_bytes`` bytes
            (``None``: no cap) would be selected; the message names the biggest offenders.
        :raises PathEscapeError: ``remote_dir`` leads out of :attr:`workspace_root`.
        """
        return await upload_tree(
            self._files(), local_dir, remote_dir, ignore=ignore, default_ignores=default_ignores,
            gitignore=gitignore, max_files=max_files, max_bytes=max_bytes, progress=progress, delete=delete,
            checksum=checksum,
        )  # fmt: skip

    async def download(
        self,
        remote_dir: str,
        local_dir: str | os.PathLike[str],
        *,
        ignore: Sequence[str] = (),
        default_ignores: bool = True,
        gitignore: bool = True,
        max_files: int | None = DEFAULT_MAX_FILES,
        max_bytes: int | None = DEFAULT_MAX_BYTES,
        progress: bool = True,
        delete: bool = False,
        checksum: bool = False,
    ) -> TransferResult:
        """Copy the remote tree ``remote_dir`` into ``local_dir``; only new or changed files are
        fetched. The same ignores (``.gitignore`` files read from the sandbox), caps,
        ``checksum`` and ``delete`` (here: local files the remote tree has no more are removed)
        as :meth:`upload`.

        Nothing is written outside ``local_dir``: every name the sandbox lists is checked first
        (relative, no ``..``), and a symlink inside ``local_dir`` is never followed.

        Cancelling it ends every per-file transfer before it returns (one task group). Local
        files already renamed into place stay, each whole; those in flight remove their
        temporary files and leave the old ones; with ``delete=True`` what was already removed
        stays removed. Nothing changes in the sandbox. Run it again to finish.

        :raises RemoteFileNotFoundError: ``remote_dir`` does not exist.
        :raises TransferLimitError: over ``max_files`` or ``max_bytes``.
        :raises ProtocolError: the listing holds a name that could lead out of ``local_dir``
            (nothing is written).
        :raises NotADirectoryError: a symlink or file inside ``local_dir`` is where a directory
            comes (``delete=True`` replaces it).
        """
        return await download_tree(
            self._files(), remote_dir, local_dir, ignore=ignore, default_ignores=default_ignores,
            gitignore=gitignore, max_files=max_files, max_bytes=max_bytes, progress=progress, delete=delete,
            checksum=checksum,
        )  # fmt: skip
