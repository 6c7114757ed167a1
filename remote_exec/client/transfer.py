"""Trees: upload and download of project directories, with ignores, caps and incremental re-sends.

- **Ignores** (gitignore syntax, via ``pathspec``): :data:`DEFAULT_IGNORES` (VCS data,
  dependency and build caches, secrets), every ``.gitignore`` in the tree (nested ones apply
  below their directory, as in git), and the caller's ``ignore`` patterns. The caller's patterns
  win (``"!.env"`` sends a ``.env``), then the defaults, then the ``.gitignore`` files. An
  ignored directory is not descended into.
- **Caps**: more than ``max_files`` files or ``max_bytes`` bytes in the selected tree is refused
  *before anything moves*, with a :class:`~remote_exec.errors.TransferLimitError` naming the
  biggest files and the directories with the most files.
- **Incremental**: a file whose size, permission bits and mtime match the other side's is not
  sent again; a sent file gets its source's mtime, so the next comparison is exact.
- **Progress**: a ``tqdm`` bar (``tqdm.auto``: the widget variant in Jupyter) over the bytes to move.

Symlinks and special files are not transferred: they are listed in ``TransferResult.skipped``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import posixpath
import stat
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import RemoteFileNotFoundError, TransferLimitError
from ..protocol import FileInfo
from .files import FileClient, _pipelined
from .localtree import LocalTree, check_listing

if TYPE_CHECKING:
    from pathspec import GitIgnoreSpec

__all__ = [
    "DEFAULT_IGNORES",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_FILES",
    "IgnoreRules",
    "ProgressBar",
    "TransferResult",
    "download_tree",
    "upload_tree",
]

DEFAULT_IGNORES: tuple[str, ...] = (
    ".git",
    ".hg",
    ".svn",
    "node_modules/",
    "__pycache__/",
    ".venv/",
    ".env*",
    "!.env.example",
    "*.pem",
    "*.key",
)
"""Patterns every transfer ignores unless ``default_ignores=False`` (or an ``ignore`` pattern
re-includes one, e.g. ``"!.env"``)."""

DEFAULT_MAX_FILES = 10_000
DEFAULT_MAX_BYTES = 1 << 30
LISTING_LIMIT = 250_000
"""Entries of the other side's tree compared at most (beyond, files are sent again: slower, not wrong)."""
SMALL_FILES_AT_ONCE = 8
"""Files of at most one chunk sent at once (each is one request); bigger files go one at a time,
each with its chunks pipelined, so memory stays bounded."""


@dataclass
class TransferResult:
    """What an upload or download did.

    :ivar files_sent: files copied (new or changed).
    :ivar bytes_sent: their bytes.
    :ivar files_unchanged: files already there with the same size, mode and mtime (not sent).
    :ivar dirs_created: directories made on the receiving side.
    :ivar ignored: entries left out by the ignore rules (an ignored directory counts once).
    :ivar ignored_paths: those entries, relative to the tree's top (a directory ends in ``/``).
    :ivar deleted: with ``delete=True``, what was removed on the receiving side because the
        sending side has it no more (a removed directory is one entry, ending in ``/``).
    :ivar skipped: symlinks and special files, which are not transferred.
    :ivar seconds: wall time.
    """

    files_sent: int = 0
    bytes_sent: int = 0
    files_unchanged: int = 0
    dirs_created: int = 0
    ignored: int = 0
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0
    ignored_paths: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    def describe(self, verb: str = "sent") -> str:
        """One line for people: ``sent 3 files (1.2 MiB) in 0.4 s; 7 unchanged, 12 ignored``."""
        extra = [f"{self.files_unchanged} unchanged", f"{self.ignored} ignored"]
        if self.deleted:
            extra.append(f"{len(self.deleted)} deleted")
        if self.skipped:
            extra.append(f"{len(self.skipped)} symlinks/special files skipped")
        files = "1 file" if self.files_sent == 1 else f"{self.files_sent} files"
        return f"{verb} {files} ({_human(self.bytes_sent)}) in {self.seconds:.1f} s; " + ", ".join(extra)

    @property
    def mb_per_s(self) -> float:
        """Throughput of the bytes sent, in decimal MB per second."""
        return self.bytes_sent / self.seconds / 1e6 if self.seconds > 0 else 0.0


class IgnoreRules:
    """Which relative paths a transfer leaves out (see the module docstring for the precedence)."""

    def __init__(self, ignore: Sequence[str] = (), *, default_ignores: bool = True) -> None:
        from pathspec import GitIgnoreSpec

        self._spec = GitIgnoreSpec
        self._user = GitIgnoreSpec.from_lines(list(ignore)) if ignore else None
        self._defaults = GitIgnoreSpec.from_lines(list(DEFAULT_IGNORES)) if default_ignores else None
        self._git: dict[str, GitIgnoreSpec] = {}  # directory (relative, "" for the top) -> its .gitignore

    def add_gitignore(self, directory: str, text: str) -> None:
        """Honour a ``.gitignore`` found in ``directory`` (relative to the top, ``""`` for the top)."""
        self._git[directory] = self._spec.from_lines(text.splitlines())

    def ignored(self, rel: str, is_dir: bool) -> bool:
        """Whether ``rel`` (a ``/``-separated path relative to the top) is left out."""
        key = rel + "/" if is_dir else rel
        if self._user is not None:
            verdict = self._user.check_file(key).include
            if verdict is not None:
                return verdict
        if self._defaults is not None and self._defaults.check_file(key).include:
            return True
        if self._git:
            parts = rel.split("/")
            for depth in range(len(parts) - 1, -1, -1):  # the deepest .gitignore speaks first
                spec = self._git.get("/".join(parts[:depth]))
                if spec is not None:
                    sub = "/".join(parts[depth:]) + ("/" if is_dir else "")
                    verdict = spec.check_file(sub).include
                    if verdict is not None:
                        return verdict
        return False


@dataclass(frozen=True)
class _Entry:
    rel: str
    size: int
    mode: int
    mtime_ns: int


@dataclass
class _Tree:
    files: list[_Entry] = field(default_factory=list)
    dirs: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def same_mtime(a_ns: int, b_ns: int) -> bool:
    """Equal modification times, allowing for a file system that keeps only µs or whole seconds."""
    if a_ns == b_ns:
        return True
    return any((a_ns % u == 0 or b_ns % u == 0) and a_ns // u == b_ns // u for u in (1_000, 1_000_000_000))


def _same(src: _Entry, dst: _Entry | None) -> bool:
    return dst is not None and (src.size, src.mode) == (dst.size, dst.mode) and same_mtime(src.mtime_ns, dst.mtime_ns)


def _sha256(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None


async def _same_content(
    files: FileClient,
    remote_dir: str,
    local_hash: Callable[[str], str | None],
    pairs: Sequence[tuple[_Entry, _Entry | None]],
) -> set[str]:
    """With ``checksum=True``: the files whose size and mode match and whose SHA-256 is the same
    on both sides (hashed there by the agent, here in a thread by ``local_hash(rel)``), whatever
    their mtimes say."""
    candidates = [src for src, dst in pairs if dst is not None and (src.size, src.mode) == (dst.size, dst.mode)]
    if not candidates:
        return set()
    there = await files.hashes([posixpath.join(remote_dir, f.rel) for f in candidates], [f.size for f in candidates])
    here = await asyncio.to_thread(lambda: [local_hash(f.rel) for f in candidates])
    return {f.rel for f, a, b in zip(candidates, here, there, strict=True) if a is not None and a == b}


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def check_caps(what: str, files: Sequence[_Entry], max_files: int | None, max_bytes: int | None) -> None:
    """Refuse a tree over its caps, naming the biggest files and the fullest directories.

    :raises TransferLimitError: too many files or bytes.
    """
    total = sum(f.size for f in files)
    over_files = max_files is not None and len(files) > max_files
    over_bytes = max_bytes is not None and total > max_bytes
    if not (over_files or over_bytes):
        return
    largest = sorted(files, key=lambda f: f.size, reverse=True)[:5]
    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    for f in files:
        top = f.rel.split("/", 1)[0] + "/" if "/" in f.rel else "(top level)"
        counts[top] += 1
        sizes[top] += f.size
    caps = []
    if over_files:
        caps.append(f"{len(files)} files, over max_files={max_files}")
    if over_bytes:
        caps.append(f"{_human(total)}, over max_bytes={max_bytes} ({_human(max_bytes or 0)})")
    biggest = ", ".join(f"{f.rel} ({_human(f.size)})" for f in largest)
    fullest = ", ".join(f"{d} ({n} files, {_human(sizes[d])})" for d, n in counts.most_common(5))
    raise TransferLimitError(
        f"{what} would move {'; '.join(caps)}. Biggest files: {biggest}. Most files: {fullest}. "
        "Leave them out with ignore=[...] (gitignore patterns), or raise max_files=/max_bytes= (None: no cap).",
        data={
            "files": len(files),
            "bytes": total,
            "max_files": max_files,
            "max_bytes": max_bytes,
            "largest": [[f.rel, f.size] for f in largest],
        },
    )


def _scan_local(top: Path, rules: IgnoreRules, gitignore: bool) -> _Tree:
    """The files and directories under ``top`` that the rules keep (blocking)."""
    tree = _Tree()
    pending = [""]
    while pending:
        rel_dir = pending.pop()
        here = top / rel_dir if rel_dir else top
        if gitignore:
            with contextlib.suppress(FileNotFoundError, NotADirectoryError, IsADirectoryError):
                rules.add_gitignore(rel_dir, (here / ".gitignore").read_text(errors="replace"))
        with os.scandir(here) as it:
            entries = sorted(it, key=lambda e: e.name)
        subdirs = []
        for e in entries:
            rel = f"{rel_dir}/{e.name}" if rel_dir else e.name
            st = e.stat(follow_symlinks=False)
            is_dir = stat.S_ISDIR(st.st_mode)
            if rules.ignored(rel, is_dir):
                tree.ignored.append(f"{rel}/" if is_dir else rel)
            elif is_dir:
                tree.dirs.append(rel)
                subdirs.append(rel)
            elif stat.S_ISREG(st.st_mode):
                tree.files.append(_Entry(rel, st.st_size, stat.S_IMODE(st.st_mode), st.st_mtime_ns))
            else:
                tree.skipped.append(rel)
        pending.extend(reversed(subdirs))
    return tree


def _remote_tree(entries: Iterable[FileInfo], rules: IgnoreRules) -> _Tree:
    """The part of a recursive remote listing that the rules keep."""
    tree = _Tree()
    dropped: set[str] = set()
    for e in entries:
        parent = posixpath.dirname(e.name)
        if parent in dropped:  # inside an ignored directory
            if e.type == "dir":
                dropped.add(e.name)
            continue
        if rules.ignored(e.name, e.type == "dir"):
            tree.ignored.append(f"{e.name}/" if e.type == "dir" else e.name)
            if e.type == "dir":
                dropped.add(e.name)
        elif e.type == "dir":
            tree.dirs.append(e.name)
        elif e.type == "file":
            tree.files.append(_Entry(e.name, e.size, e.mode, e.mtime_ns))
        else:
            tree.skipped.append(e.name)
    return tree


def _stale(source: _Tree, dest: _Tree) -> list[str]:
    """What a mirror removes from ``dest``: what the rules keep there and ``source`` has not (a
    directory once, ending in ``/``, before anything below it). Ignored entries are never
    touched: a ``node_modules`` built in the sandbox stays."""
    files, dirs, others = {f.rel for f in source.files}, set(source.dirs), set(source.skipped)
    gone: list[str] = []
    gone_dirs: set[str] = set()

    def under_gone(rel: str) -> bool:
        parent = posixpath.dirname(rel)
        while parent:
            if parent in gone_dirs:
                return True
            parent = posixpath.dirname(parent)
        return False

    for d in sorted(dest.dirs):  # parents sort before their children
        if d not in dirs and not under_gone(d):  # gone, or now a file: it makes way
            gone_dirs.add(d)
            gone.append(f"{d}/")
    stale = [f.rel for f in dest.files if f.rel not in files] + [o for o in dest.skipped if o not in others]
    gone.extend(rel for rel in sorted(stale) if not under_gone(rel))
    return gone


class ProgressBar:
    """A tqdm bar over bytes (``tqdm.auto``: a widget in Jupyter), or nothing."""

    def __init__(self, total: int, desc: str, enabled: bool) -> None:
        self._bar = None
        if enabled and total > 0:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, leave=True)

    def update(self, n: int) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


async def _each(items: Sequence[_Entry], fn: Callable[[_Entry], Awaitable[None]], at_once: int) -> None:
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
    tree = await asyncio.to_thread(_scan_local, top, rules, gitignore)
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
            stale = _stale(tree, _remote_tree(listing.entries, rules))
    except RemoteFileNotFoundError:
        remote = {}
        await files.mkdir(remote_dir, parents=True)
    for rel in stale:  # first: a directory that is now a file (or the reverse) makes way
        await files.remove(posixpath.join(remote_dir, rel.rstrip("/")), recursive=True, missing_ok=True)
        remote.pop(rel.rstrip("/"), None)
    there = {k: _Entry(k, v.size, v.mode, v.mtime_ns) for k, v in remote.items() if v.type == "file"}
    new_dirs = [d for d in tree.dirs if remote.get(d) is None or remote[d].type != "dir"]
    if checksum:
        same = await _same_content(
            files, remote_dir, lambda rel: _sha256(top / rel), [(f, there.get(f.rel)) for f in tree.files]
        )
        todo = [f for f in tree.files if f.rel not in same]
    else:
        todo = [f for f in tree.files if not _same(f, there.get(f.rel))]
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
    bar = ProgressBar(sum(f.size for f in todo), f"upload {top.name or top}", progress)

    async def send(f: _Entry) -> None:
        await files.write_from(top / f.rel, posixpath.join(remote_dir, f.rel), parents=True, progress=bar.update)
        result.files_sent += 1
        result.bytes_sent += f.size

    try:
        await _each_sized(todo, files.chunk_size, send)
    finally:
        bar.close()
    result.seconds = time.monotonic() - t0
    return result


async def _each_sized(todo: Sequence[_Entry], chunk_size: int, send: Callable[[_Entry], Awaitable[None]]) -> None:
    small = [f for f in todo if f.size <= chunk_size]
    big = [f for f in todo if f.size > chunk_size]
    await asyncio.gather(_each(small, send, SMALL_FILES_AT_ONCE), _each(big, send, 1))


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
        texts = await asyncio.gather(
            *(files.read_bytes(posixpath.join(remote_dir, g), max_size=1 << 20) for g in found)
        )
        for name, text in zip(found, texts, strict=True):
            rules.add_gitignore(posixpath.dirname(name), text.decode(errors="replace"))
    tree = _remote_tree(listing.entries, rules)
    check_caps(f"download of {remote_dir}", tree.files, max_files, max_bytes)
    # Every local path below the target goes through this descriptor, never by name (see localtree).
    local = LocalTree(top)
    made_top = await asyncio.to_thread(local.open, create=True)
    try:

        def local_state() -> dict[str, _Entry]:
            out = {}
            for f in tree.files:
                st = local.lstat(f.rel)
                if st is not None and stat.S_ISREG(st.st_mode):
                    out[f.rel] = _Entry(f.rel, st.st_size, stat.S_IMODE(st.st_mode), st.st_mtime_ns)
            return out

        def delete_stale() -> list[str]:
            gone = _stale(tree, _scan_local(top, rules, False))  # the remote's rules, not the local .gitignore
            for rel in gone:  # the scan's names, removed through the target's descriptor: never outside it
                local.remove(rel.rstrip("/"))
            return gone

        stale = await asyncio.to_thread(delete_stale) if delete else []
        dirs_created = made_top + await asyncio.to_thread(local.make_dirs, tree.dirs)
        here = await asyncio.to_thread(local_state)
        # set-id bits are dropped on the way down (read_to does the same): compare without them
        sent_as = {f.rel: _Entry(f.rel, f.size, f.mode & 0o777, f.mtime_ns) for f in tree.files}
        if checksum:
            pairs = [(sent_as[f.rel], here.get(f.rel)) for f in tree.files]
            same = await _same_content(files, remote_dir, local.sha256, pairs)
            todo = [f for f in tree.files if f.rel not in same]
        else:
            todo = [f for f in tree.files if not _same(sent_as[f.rel], here.get(f.rel))]
        result = TransferResult(
            files_unchanged=len(tree.files) - len(todo),
            dirs_created=dirs_created,
            ignored=len(tree.ignored),
            ignored_paths=tree.ignored,
            skipped=tree.skipped,
            deleted=stale,
        )
        bar = ProgressBar(
            sum(f.size for f in todo), f"download {posixpath.basename(remote_dir.rstrip('/')) or remote_dir}", progress
        )

        async def fetch(f: _Entry) -> None:
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
