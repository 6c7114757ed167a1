"""Wire models of the ``file_*`` methods: files and directories in the sandbox, through the agent.

Bytes never travel in JSON: ``file_read`` answers with the data as the response's payload, and
``file_write`` / ``file_write_chunk`` take it as the request's payload (see
:mod:`remote_exec.protocol.frames`).

Every path may be absolute or relative (to ``root`` when one is given, else to the agent's
working directory). With ``root`` (the sandbox's workspace root) the agent resolves the path
component by component inside it and refuses ``..`` or a symlink that would leave it
(``PathEscapeError``).

Writes are atomic: the data goes to a temporary file beside the target, which is renamed over
it once complete. A large file is written through a **write session**: ``file_write_open``
(the client names the session, so a retried open is harmless), any number of
``file_write_chunk`` (each carries its byte offset, so a retried or reordered chunk is written
once, in place), then ``file_write_commit`` (checks every byte arrived, sets mode and mtime,
renames) or ``file_write_abort``. A session idle for too long is aborted by the agent.

A **staged** session (``staged=True``) takes its bytes out of band: the agent makes an empty
directory beside the target (mode ``0700``) and names it in ``stage_dir``; the client puts the
file there as :data:`STAGED_NAME` with the transport's own copy command (``docker cp``, whose
engine-side archive API is faster than any pipe through ``docker exec``), then commits. The
commit checks the staged file (a regular file of the announced size, the agent's own) before it
renames it over the target, so the result is as atomic as a chunked write.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from .base import MAX_PAGE_ITEMS, Offset, WireModel

__all__ = [
    "DEFAULT_CHUNK",
    "MAX_CHUNK",
    "MAX_HASH_PATHS",
    "MAX_LIST_ENTRIES",
    "STAGED_NAME",
    "FileHashParams",
    "FileHashResult",
    "FileInfo",
    "FileListParams",
    "FileListResult",
    "FileMkdirParams",
    "FileReadParams",
    "FileReadResult",
    "FileRemoveParams",
    "FileRemoveResult",
    "FileSessionParams",
    "FileStatParams",
    "FileType",
    "FileWriteChunkParams",
    "FileWriteChunkResult",
    "FileWriteCommitParams",
    "FileWriteOpenParams",
    "FileWriteOpenResult",
    "FileWriteParams",
]

FileType = Literal["file", "dir", "symlink", "other"]
PathStr = Annotated[str, Field(min_length=1, max_length=4096)]
Mode = Annotated[int, Field(ge=0, le=0o7777)]
SessionId = Annotated[str, Field(min_length=8, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]

DEFAULT_CHUNK = 4 * 1024 * 1024
"""Bytes per ``file_read`` / ``file_write_chunk`` the host uses by default."""

MAX_CHUNK = 16 * 1024 * 1024
"""Largest payload of one ``file_read`` or ``file_write*`` request."""

MAX_LIST_ENTRIES = 500_000
"""Most entries the host gathers for one listing (page after page)."""

_Name = Annotated[str, Field(max_length=1 << 16)]
"""A path or name in an answer: a recursive listing's may be deeper than ``PATH_MAX``."""


def _no_nul(v: str | None) -> str | None:
    if v is not None and "\x00" in v:
        raise ValueError("paths must not contain NUL characters")
    return v


class _PathParams(WireModel):
    """A path, and the workspace root it must stay inside (``None``: no root)."""

    path: PathStr
    root: PathStr | None = None

    @field_validator("path", "root")
    @classmethod
    def _check_path(cls, v: str | None) -> str | None:
        return _no_nul(v)

    @field_validator("root")
    @classmethod
    def _absolute_root(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError("root must be an absolute path")
        return v


class FileInfo(WireModel):
    """A file or directory as the agent sees it (``lstat``: a symlink is reported as one).

    ``path`` is where it is in the sandbox, symlinks resolved; ``name`` its last component, or,
    in a recursive listing, its path relative to the listed directory. ``mode`` holds the
    permission bits (``0o644``); ``mtime_ns`` the modification time in nanoseconds since the
    epoch; ``target`` a symlink's target.
    """

    path: _Name
    name: _Name
    type: FileType
    size: Offset
    mode: Mode
    mtime_ns: int
    target: Annotated[str, Field(max_length=4096)] | None = None

    @property
    def mtime(self) -> float:
        """The modification time in seconds since the epoch."""
        return self.mtime_ns / 1e9


class FileStatParams(_PathParams):
    """Params of ``file_stat``; ``follow=False`` reports a final symlink itself."""

    follow: bool = True


class FileReadParams(_PathParams):
    """Params of ``file_read``: up to ``length`` bytes from ``offset``.

    ``max_size`` refuses a file bigger than that (``FileTooLargeError``) before reading any of it.
    """

    offset: Offset = 0
    length: Annotated[int, Field(ge=0, le=MAX_CHUNK)] = DEFAULT_CHUNK
    max_size: Offset | None = None


class FileReadResult(WireModel):
    """Result of ``file_read``; the bytes are the payload (``length`` of them).

    ``size``, ``mtime_ns`` and ``mode`` describe the file when the bytes were read, so a reader
    of several chunks can tell that the file changed under it. ``eof``: nothing follows.
    """

    size: Offset
    mtime_ns: int
    mode: Mode
    offset: Offset
    length: Offset
    eof: bool


class _WriteTarget(_PathParams):
    """Where a write goes, and the attributes the file gets.

    ``mode``: permission bits (``None``: an existing file's, else ``0o666`` less the agent's
    umask). ``parents``: create missing directories on the way.
    """

    mode: Mode | None = None
    parents: bool = False


class FileWriteParams(_WriteTarget):
    """Params of ``file_write``: the whole content (the payload) in one request, written atomically.

    ``mtime_ns`` sets the modification time (``None``: now).
    """

    mtime_ns: int | None = None


STAGED_NAME = "data"
"""The file's name inside a staged session's ``stage_dir``."""


class FileWriteOpenParams(_WriteTarget):
    """Params of ``file_write_open``: start a write session named ``session_id`` (chosen by the
    client: opening a session that exists returns it again). ``staged``: the bytes will be put
    in a staging directory out of band, not sent as chunks."""

    session_id: SessionId
    staged: bool = False


class FileWriteOpenResult(WireModel):
    """The session and the path it will write (symlinks resolved).

    For a staged session, ``stage_dir`` is the absolute path of its staging directory and
    ``uid``/``gid`` the agent's: the staged file must be owned by them (unless the agent is root).
    """

    session_id: str
    path: str
    stage_dir: str | None = None
    uid: int | None = None
    gid: int | None = None


class FileWriteChunkParams(WireModel):
    """Params of ``file_write_chunk``: the payload's bytes go at ``offset`` of the new file.

    Writing the same chunk twice writes the same bytes in the same place: retries are harmless,
    and chunks may arrive in any order.
    """

    session_id: SessionId
    offset: Offset


class FileWriteChunkResult(WireModel):
    """The distinct bytes the session has received so far."""

    received: Offset


class FileWriteCommitParams(WireModel):
    """Params of ``file_write_commit``: ``size`` is the file's length, every byte of which must
    have arrived; ``mtime_ns`` sets its modification time; ``fsync`` flushes it to disk before
    the rename. A retried commit of a committed session returns the same result."""

    session_id: SessionId
    size: Offset
    mtime_ns: int | None = None
    fsync: bool = False


class FileSessionParams(WireModel):
    """Params naming one write session (``file_write_abort``)."""

    session_id: SessionId


class FileListParams(_PathParams):
    """Params of ``file_list``: one page of a directory's entries, or with ``recursive`` of every
    entry below it (symlinks are listed, never followed). The page starts after the entry whose
    ``name`` is ``after`` (``None``: from the start) and holds at most ``limit`` entries (fewer
    when their JSON passes :data:`~remote_exec.protocol.base.PAGE_BYTES`)."""

    recursive: bool = False
    after: _Name | None = None
    limit: Annotated[int, Field(ge=1, le=MAX_PAGE_ITEMS)] = MAX_PAGE_ITEMS


class FileListResult(WireModel):
    """The listed directory (symlinks resolved) and one page of its entries, sorted by name
    within each directory; a recursive listing gives a directory's entries before its
    subdirectories' contents.

    ``next``: more entries follow; ask again with ``after=next`` (the last entry's ``name``).
    ``unnamed``: entries of this page left out because their names are not UTF-8 (JSON cannot
    name them; nothing below such a directory is listed either).
    """

    path: _Name
    entries: Annotated[list[FileInfo], Field(max_length=MAX_PAGE_ITEMS)]
    next: _Name | None = None
    unnamed: Annotated[int, Field(ge=0, le=1 << 40)] = 0


class FileRemoveParams(_PathParams):
    """Params of ``file_remove``: a file, a symlink (never what it points to), an empty directory,
    or with ``recursive`` a whole tree. ``missing_ok``: nothing there is not an error."""

    recursive: bool = False
    missing_ok: bool = False


class FileRemoveResult(WireModel):
    """Whether something was removed."""

    removed: bool


MAX_HASH_PATHS = 1024
"""Most paths one ``file_hash`` may name."""


class FileHashParams(WireModel):
    """Params of ``file_hash``: the SHA-256 of each of ``paths`` (resolved like any path, inside
    ``root`` if given). Used to tell whether a file changed when mtimes cannot be trusted."""

    paths: Annotated[list[PathStr], Field(min_length=1, max_length=MAX_HASH_PATHS)]
    root: PathStr | None = None

    @field_validator("paths")
    @classmethod
    def _check_paths(cls, v: list[str]) -> list[str]:
        for p in v:
            _no_nul(p)
        return v

    @field_validator("root")
    @classmethod
    def _check_root(cls, v: str | None) -> str | None:
        return _PathParams._absolute_root(_no_nul(v))


class FileHashResult(WireModel):
    """The hex SHA-256 of each path, in order; ``None`` where the path is not a regular file the
    agent may read (missing, a directory, a symlink, no permission)."""

    hashes: list[Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None]


class FileMkdirParams(_PathParams):
    """Params of ``file_mkdir``; ``parents`` creates missing ancestors, ``exist_ok`` accepts an
    existing directory; ``mode`` defaults to ``0o777`` less the agent's umask."""

    parents: bool = True
    exist_ok: bool = True
    mode: Mode | None = None
