"""Trees on either side: local scans, remote listings, what differs, what is stale, and the caps."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import posixpath
import stat
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import TransferLimitError
from ...protocol import FileInfo
from ..files import FileClient
from .ignore import IgnoreRules
from .result import human_size

__all__ = [
    "Entry",
    "Tree",
    "check_caps",
    "remote_tree",
    "same_content",
    "same_entry",
    "same_mtime",
    "scan_local",
    "sha256_of",
    "stale_entries",
]


@dataclass(frozen=True)
class Entry:
    rel: str
    size: int
    mode: int
    mtime_ns: int


@dataclass
class Tree:
    files: list[Entry] = field(default_factory=list)
    dirs: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def same_mtime(a_ns: int, b_ns: int) -> bool:
    """Equal modification times, allowing for a file system that keeps only µs or whole seconds."""
    if a_ns == b_ns:
        return True
    return any((a_ns % u == 0 or b_ns % u == 0) and a_ns // u == b_ns // u for u in (1_000, 1_000_000_000))


def same_entry(src: Entry, dst: Entry | None) -> bool:
    return dst is not None and (src.size, src.mode) == (dst.size, dst.mode) and same_mtime(src.mtime_ns, dst.mtime_ns)


def sha256_of(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None


async def same_content(
    files: FileClient,
    remote_dir: str,
    local_hash: Callable[[str], str | None],
    pairs: Sequence[tuple[Entry, Entry | None]],
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


def check_caps(what: str, files: Sequence[Entry], max_files: int | None, max_bytes: int | None) -> None:
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
        caps.append(f"{human_size(total)}, over max_bytes={max_bytes} ({human_size(max_bytes or 0)})")
    biggest = ", ".join(f"{f.rel} ({human_size(f.size)})" for f in largest)
    fullest = ", ".join(f"{d} ({n} files, {human_size(sizes[d])})" for d, n in counts.most_common(5))
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


def scan_local(top: Path, rules: IgnoreRules, gitignore: bool) -> Tree:
    """The files and directories under ``top`` that the rules keep (blocking)."""
    tree = Tree()
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
                tree.files.append(Entry(rel, st.st_size, stat.S_IMODE(st.st_mode), st.st_mtime_ns))
            else:
                tree.skipped.append(rel)
        pending.extend(reversed(subdirs))
    return tree


def remote_tree(entries: Iterable[FileInfo], rules: IgnoreRules) -> Tree:
    """The part of a recursive remote listing that the rules keep."""
    tree = Tree()
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
            tree.files.append(Entry(e.name, e.size, e.mode, e.mtime_ns))
        else:
            tree.skipped.append(e.name)
    return tree


def stale_entries(source: Tree, dest: Tree) -> list[str]:
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
