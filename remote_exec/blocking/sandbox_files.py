"""The file methods of the blocking :class:`~remote_exec.blocking.Sandbox`: single files, streams and trees.

A base class with its own state (the shared portal and the async sandbox it drives), as
:mod:`remote_exec.client.sandbox_files` holds the async ones, so the sandbox class stays one
screenful per concern. Each method is a one-liner around the portal; long transfers go through
:func:`~remote_exec.blocking.handles.interruptible` so Ctrl-C stops them.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import Any, Literal, TypeVar, overload

from anyio.from_thread import BlockingPortal

from ..client.sandbox import AsyncSandbox
from ..client.transfer import DEFAULT_MAX_BYTES, DEFAULT_MAX_FILES, TransferResult
from ..errors import SandboxClosedError
from ..protocol import FileInfo
from .handles import interruptible

__all__ = ["BlockingSandboxFiles"]

T = TypeVar("T")


class BlockingSandboxFiles:
    """Files in the sandbox, through the blocking portal (see :class:`~remote_exec.AsyncSandbox`)."""

    def __init__(self, portal: BlockingPortal, async_sandbox: AsyncSandbox) -> None:
        self._portal = portal
        self._closed = False
        self.async_sandbox = async_sandbox

    @property
    def url(self) -> str:
        return self.async_sandbox.url

    def _check_open(self) -> None:
        # A pooled face is closed when its pool closes the sandbox under it.
        if self._closed or self.async_sandbox.closed:
            raise SandboxClosedError(
                f"{self.async_sandbox.url}: this sandbox is closed; open a new one with rx.connect()"
            )

    def _call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        self._check_open()
        return self._portal.call(fn, *args)

    # -- files: see the async twins for the details ------------------------------------------

    @property
    def workspace_root(self) -> str | None:
        """The path the file methods stay inside (see :attr:`AsyncSandbox.workspace_root`)."""
        return self.async_sandbox.workspace_root

    @workspace_root.setter
    def workspace_root(self, value: str | None) -> None:
        self.async_sandbox.workspace_root = value

    def write_file(
        self, path: str, data: str | bytes, mode: int | None = None, *, mtime: float | None = None, parents: bool = True
    ) -> FileInfo:
        """Write ``data`` to ``path`` atomically (see :meth:`AsyncSandbox.write_file`)."""
        return self._call(
            functools.partial(self.async_sandbox.write_file, mtime=mtime, parents=parents), path, data, mode
        )

    @overload
    def read_file(self, path: str, text: Literal[True] = True, *, max_size: int | None = ...) -> str: ...

    @overload
    def read_file(self, path: str, text: Literal[False], *, max_size: int | None = ...) -> bytes: ...

    @overload
    def read_file(self, path: str, text: bool, *, max_size: int | None = ...) -> str | bytes: ...

    def read_file(self, path: str, text: bool = True, *, max_size: int | None = -1) -> str | bytes:
        """The content of ``path``, ``str`` or ``bytes`` (see :meth:`AsyncSandbox.read_file`)."""
        return self._call(functools.partial(self.async_sandbox.read_file, path, text, max_size=max_size))

    def read_file_to(self, path: str, local_path: str | os.PathLike[str], *, progress: bool = False) -> FileInfo:
        """Stream ``path`` into a local file; Ctrl-C stops it (see :meth:`AsyncSandbox.read_file_to`)."""
        self._check_open()
        fn = functools.partial(self.async_sandbox.read_file_to, progress=progress)
        return interruptible(self._portal, fn, path, local_path)

    def iter_file(self, path: str) -> Generator[bytes, None, None]:
        """The bytes of ``path``, in order, one chunk at a time; Ctrl-C stops the read (see
        :meth:`AsyncSandbox.aiter_file`).

        :raises RemoteFileNotFoundError: no such file.
        :raises RemoteIsADirectoryError: ``path`` is a directory.
        :raises FileError: the file changed while it was being read.
        """
        self._check_open()
        chunks = self.async_sandbox.aiter_file(path)
        try:
            while True:
                try:
                    yield interruptible(self._portal, chunks.__anext__)
                except StopAsyncIteration:
                    return
        finally:
            if not self._closed:  # else the portal may be gone; the loop finalises the generator
                self._portal.call(chunks.aclose)

    def write_file_from(
        self,
        local_path: str | os.PathLike[str],
        path: str,
        *,
        mode: int | None = None,
        keep_mtime: bool = True,
        parents: bool = True,
        progress: bool = False,
    ) -> FileInfo:
        """Stream a local file to ``path``; Ctrl-C stops it (see :meth:`AsyncSandbox.write_file_from`)."""
        self._check_open()
        fn = functools.partial(
            self.async_sandbox.write_file_from, mode=mode, keep_mtime=keep_mtime, parents=parents, progress=progress
        )
        return interruptible(self._portal, fn, local_path, path)

    def list_dir(self, path: str = ".", *, recursive: bool = False, max_entries: int = 100_000) -> list[FileInfo]:
        """Entries of a directory (see :meth:`AsyncSandbox.list_dir`)."""
        fn = functools.partial(self.async_sandbox.list_dir, recursive=recursive, max_entries=max_entries)
        return self._call(fn, path)

    def stat(self, path: str, *, follow: bool = True) -> FileInfo:
        """Type, size, mode and mtime of ``path`` (see :meth:`AsyncSandbox.stat`)."""
        return self._call(functools.partial(self.async_sandbox.stat, follow=follow), path)

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists."""
        return self._call(self.async_sandbox.exists, path)

    def remove(self, path: str, *, recursive: bool = False, missing_ok: bool = False) -> bool:
        """Remove a file, a symlink, or a directory (see :meth:`AsyncSandbox.remove`)."""
        return self._call(
            functools.partial(self.async_sandbox.remove, recursive=recursive, missing_ok=missing_ok), path
        )

    def mkdir(self, path: str, *, parents: bool = True, exist_ok: bool = True, mode: int | None = None) -> FileInfo:
        """Create a directory (see :meth:`AsyncSandbox.mkdir`)."""
        fn = functools.partial(self.async_sandbox.mkdir, parents=parents, exist_ok=exist_ok, mode=mode)
        return self._call(fn, path)

    def upload(
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
        """Copy a local tree into the sandbox, only changes; Ctrl-C stops it (see :meth:`AsyncSandbox.upload`).

        :raises TransferLimitError: over ``max_files`` or ``max_bytes``.
        """
        self._check_open()
        fn = functools.partial(
            self.async_sandbox.upload, ignore=ignore, default_ignores=default_ignores, gitignore=gitignore,
            max_files=max_files, max_bytes=max_bytes, progress=progress, delete=delete,
            checksum=checksum,
        )  # fmt: skip
        return interruptible(self._portal, fn, local_dir, remote_dir)

    def download(
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
        """Copy a tree out of the sandbox, only changes; Ctrl-C stops it (see :meth:`AsyncSandbox.download`).

        :raises TransferLimitError: over ``max_files`` or ``max_bytes``.
        """
        self._check_open()
        fn = functools.partial(
            self.async_sandbox.download, ignore=ignore, default_ignores=default_ignores, gitignore=gitignore,
            max_files=max_files, max_bytes=max_bytes, progress=progress, delete=delete,
            checksum=checksum,
        )  # fmt: skip
        return interruptible(self._portal, fn, remote_dir, local_dir)
