"""``upload_tree`` and ``download_tree``: a tree's copy, from scan to the last file, under its caps."""

from __future__ import annotations

import asyncio
import os
import posixpath
import stat
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from ...errors import RemoteFileNotFoundError, TransferLimitError
from ..fanout import fan_out
from ..files import FileClient, _pipelined
from ..localtree import LocalTree, check_listing
from .ignore import IgnoreRules
from .progress import progress_bar
from .result import TransferResult
from .trees import Entry, check_caps, remote_tree, same_content, same_entry, scan_local, sha256_of, stale_entries

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_FILES",
    "LISTING_LIMIT",
    "SMALL_FILES_AT_ONCE",
    "download_tree",
    "upload_tree",
]

DEFAULT_MAX_FILES = 10_000
DEFAULT_MAX_BYTES = 1 << 30
LISTING_LIMIT = 250_000
"""Entries of the other side's tree compared at most (beyond, files are sent again: slower, not wrong)."""
SMALL_FILES_AT_ONCE = 8
"""Files of at most one chunk sent at once (each is one request); bigger files go one at a time,
each with its chunks pipelined, so memory stays bounded."""


async def _each(items: Sequence[Entry], fn: Callable[[Entry], Awaitable[None]], at_once: int) -> None:
    if items:
        await _pipelined(range(len(items)), lambda i: fn(items[i]), at_once)


async def upload_tree(
    files: FileClient,
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
    """Copy the local tree ``local_dir`` into ``remote_dir`` (created if missing); only what
    differs from the remote side is sent. See :meth:`AsyncSandbox.upload`.

    :raises TransferLimitError: the selected tree is over ``max_files`` or ``max_bytes``.
    :raises NotADirectoryError: ``local_dir`` is not a directory.
    :raises RemoteNotADirectoryError: ``remote_dir`` is a file.
    """
    t0 = time.monotonic()
    top = Path(local_dir)
    if not await asyncio.to_thread(top.is_dir):
        raise NotADirectoryError(f"{top} is not a directory")
    rules = IgnoreRules(ignore, default_ignores=default_ignores)
    tree = await asyncio.to_thread(scan_local, top, rules, gitignore)
    check_caps(f"upload of {top}", tree.files, max_files, max_bytes)
    stale: list[str] = []
    try:
        listing = await files.listing(remote_dir, recursive=True, max_entries=LISTING_LIMIT)
        check_listing(listing.entries, remote_dir)
        remote = {e.name: e for e in listing.entries}
        if delete:
            if listing.truncated:
                raise TransferLimitError(
                    f"upload of {top} with delete=True: {remote_dir} holds more than {LISTING_LIMIT} entries, "
                    "too many to tell what to delete",
                    data={"max_entries": LISTING_LIMIT},
                )
            stale = stale_entries(tree, remote_tree(listing.entries, rules))
    except RemoteFileNotFoundError:
        remote = {}
        await files.mkdir(remote_dir, parents=True)
    for rel in stale:  # first: a directory that is now a file (or the reverse) makes way
        await files.remove(posixpath.join(remote_dir, rel.rstrip("/")), recursive=True, missing_ok=True)
        remote.pop(rel.rstrip("/"), None)
    there = {k: Entry(k, v.size, v.mode, v.mtime_ns) for k, v in remote.items() if v.type == "file"}
    new_dirs = [d for d in tree.dirs if remote.get(d) is None or remote[d].type != "dir"]
    if checksum:
        same = await same_content(
            files, remote_dir, lambda rel: sha256_of(top / rel), [(f, there.get(f.rel)) for f in tree.files]
        )
        todo = [f for f in tree.files if f.rel not in same]
    else:
        todo = [f for f in tree.files if not same_entry(f, there.get(f.rel))]
    result = TransferResult(
        files_unchanged=len(tree.files) - len(todo),
        dirs_created=len(new_dirs),
        ignored=len(tree.ignored),
        ignored_paths=tree.ignored,
        skipped=tree.skipped,
        deleted=stale,
    )

    async def make_dir(i: int) -> None:
        await files.mkdir(posixpath.join(remote_dir, new_dirs[i]), parents=True)

    if new_dirs:
        await _pipelined(range(len(new_dirs)), make_dir, SMALL_FILES_AT_ONCE)
    bar = await progress_bar(sum(f.size for f in todo), f"upload {top.name or top}", progress)

    async def send(f: Entry) -> None:
        await files.write_from(top / f.rel, posixpath.join(remote_dir, f.rel), parents=True, progress=bar.update)
        result.files_sent += 1
        result.bytes_sent += f.size

    try:
        await _each_sized(todo, files.chunk_size, send)
    finally:
        bar.close()
    result.seconds = time.monotonic() - t0
    return result


async def _each_sized(todo: Sequence[Entry], chunk_size: int, send: Callable[[Entry], Awaitable[None]]) -> None:
    small = [f for f in todo if f.size <= chunk_size]
    big = [f for f in todo if f.size > chunk_size]
    async with fan_out() as tg:  # a failing small file stops the big one before the call raises
        tg.start_soon(_each, small, send, SMALL_FILES_AT_ONCE)
        tg.start_soon(_each, big, send, 1)


async def download_tree(
    files: FileClient,
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
    """Copy the remote tree ``remote_dir`` into ``local_dir`` (created if missing); only what
    differs from the local side is fetched. See :meth:`AsyncSandbox.download`.

    :raises TransferLimitError: the selected tree is over ``max_files`` or ``max_bytes``.
    :raises RemoteFileNotFoundError: ``remote_dir`` does not exist.
    :raises RemoteNotADirectoryError: ``remote_dir`` is a file.
    :raises ProtocolError: the listing holds an unsafe name (see :mod:`.localtree`); nothing is written.
    :raises NotADirectoryError: a symlink or file in ``local_dir`` is where a directory comes.
    """
    t0 = time.monotonic()
    top = Path(local_dir)
    listing = await files.listing(remote_dir, recursive=True, max_entries=LISTING_LIMIT)
    if listing.truncated:
        raise TransferLimitError(
            f"download of {remote_dir}: it holds more than {LISTING_LIMIT} entries (ignored ones included); "
            "download a subdirectory",
            data={"max_entries": LISTING_LIMIT},
        )
    check_listing(listing.entries, remote_dir)  # every name, before anything is read or written
    rules = IgnoreRules(ignore, default_ignores=default_ignores)
    if gitignore:
        found = [e.name for e in listing.entries if e.type == "file" and posixpath.basename(e.name) == ".gitignore"]
        texts: dict[str, bytes] = {}

        async def read_gitignore(name: str) -> None:
            texts[name] = await files.read_bytes(posixpath.join(remote_dir, name), max_size=1 << 20)

        async with fan_out() as tg:
            for name in found:
                tg.start_soon(read_gitignore, name)
        for name in found:  # in the listing's order, as before
            rules.add_gitignore(posixpath.dirname(name), texts[name].decode(errors="replace"))
    tree = remote_tree(listing.entries, rules)
    check_caps(f"download of {remote_dir}", tree.files, max_files, max_bytes)
    # Every local path below the target goes through this descriptor, never by name (see localtree).
    local = LocalTree(top)
    made_top = await asyncio.to_thread(local.open, create=True)
    try:

        def local_state() -> dict[str, Entry]:
            out = {}
            for f in tree.files:
                st = local.lstat(f.rel)
                if st is not None and stat.S_ISREG(st.st_mode):
                    out[f.rel] = Entry(f.rel, st.st_size, stat.S_IMODE(st.st_mode), st.st_mtime_ns)
            return out

        def delete_stale() -> list[str]:
            gone = stale_entries(tree, scan_local(top, rules, False))  # the remote's rules, not the local .gitignore
            for rel in gone:  # the scan's names, removed through the target's descriptor: never outside it
                local.remove(rel.rstrip("/"))
            return gone

        stale = await asyncio.to_thread(delete_stale) if delete else []
        dirs_created = made_top + await asyncio.to_thread(local.make_dirs, tree.dirs)
        here = await asyncio.to_thread(local_state)
        # set-id bits are dropped on the way down (read_to does the same): compare without them
        sent_as = {f.rel: Entry(f.rel, f.size, f.mode & 0o777, f.mtime_ns) for f in tree.files}
        if checksum:
            pairs = [(sent_as[f.rel], here.get(f.rel)) for f in tree.files]
            same = await same_content(files, remote_dir, local.sha256, pairs)
            todo = [f for f in tree.files if f.rel not in same]
        else:
            todo = [f for f in tree.files if not same_entry(sent_as[f.rel], here.get(f.rel))]
        result = TransferResult(
            files_unchanged=len(tree.files) - len(todo),
            dirs_created=dirs_created,
            ignored=len(tree.ignored),
            ignored_paths=tree.ignored,
            skipped=tree.skipped,
            deleted=stale,
        )
        bar = await progress_bar(
            sum(f.size for f in todo), f"download {posixpath.basename(remote_dir.rstrip('/')) or remote_dir}", progress
        )

        async def fetch(f: Entry) -> None:
            parent, name = posixpath.split(f.rel)
            dir_fd = await asyncio.to_thread(local.open_dir, parent)
            try:
                remote = posixpath.join(remote_dir, f.rel)
                await files.read_to(remote, name, progress=bar.update, size_hint=f.size, dir_fd=dir_fd)
            finally:
                os.close(dir_fd)
            result.files_sent += 1
            result.bytes_sent += f.size

        try:
            await _each_sized(todo, files.chunk_size, fetch)
        finally:
            bar.close()
        result.seconds = time.monotonic() - t0
        return result
    finally:
        local.close()
