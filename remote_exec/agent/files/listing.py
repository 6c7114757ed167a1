"""``file_list`` in pages: a walk that starts after a named entry and stops at a page's size.

The order is the one :func:`walk` always gave: a directory's entries sorted by name, then each
subdirectory's contents in turn, depth first. That order lets the last entry's relative name
(``"a/b/c"``) say exactly where the walk was: in the block of ``a/b``, after ``c``, with every
subdirectory of ``a/b`` still to descend, then those of ``a`` after ``b``, then those of the top
after ``a``. So a page keeps no state in the agent between requests: the next one reopens that
branch (relative to its parent, ``O_NOFOLLOW``) and goes on. Entries that appear or vanish
between pages are seen or not, as in any listing of a changing tree.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator

from ...protocol import PAGE_BYTES, FileInfo
from .fileops import info

__all__ = ["walk_page"]

_LIST = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_ENTRY_OVERHEAD = 120  # JSON keys, type, size, mode, mtime of one FileInfo


class _Full(Exception):
    """The page is full."""


class _Page:
    def __init__(self, path: str, limit: int) -> None:
        self.base = path.rstrip("/")
        self.limit = limit
        self.out: list[FileInfo] = []
        self.size = 0
        self.unnamed = 0  # entries left out: their names are not UTF-8, so JSON cannot name them

    def scan(self, dfd: int, prefix: str, after: str | None = None) -> list[str]:
        """Add the entries of directory ``dfd`` named after ``after``; return all its subdirectories."""
        with os.scandir(dfd) as it:
            entries = sorted(it, key=lambda e: e.name)
        subdirs = []
        for e in entries:
            if not _utf8(e.name):
                self.unnamed += after is None or e.name > after  # counted once, on the page it falls in
                continue  # nor descended into: nothing below it can be named either
            try:
                is_dir = e.is_dir(follow_symlinks=False)
            except OSError:
                continue
            if after is not None and e.name <= after:
                if is_dir:
                    subdirs.append(e.name)
                continue
            try:
                st = e.stat(follow_symlinks=False)
                target = os.readlink(e.name, dir_fd=dfd) if stat.S_ISLNK(st.st_mode) else None
                if target is not None and not _utf8(target):  # shown, not followed: escape the bytes
                    target = target.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            except FileNotFoundError:
                continue  # removed while we listed
            if len(self.out) >= self.limit or self.size >= PAGE_BYTES:
                raise _Full
            name = prefix + e.name
            item = info(f"{self.base}/{name}", name, st, target)
            self.out.append(item)
            self.size += _ENTRY_OVERHEAD + 2 * len(item.path) + len(target or "")
            if stat.S_ISDIR(st.st_mode):
                subdirs.append(e.name)
        return subdirs


def _utf8(name: str) -> bool:
    """False for a name holding bytes that are not UTF-8 (decoded by Python as surrogates)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _subdirs_after(dfd: int, after: str) -> list[str]:
    with os.scandir(dfd) as it:
        return sorted(e.name for e in it if e.name > after and _utf8(e.name) and e.is_dir(follow_symlinks=False))


def walk_page(fd: int, path: str, recursive: bool, limit: int, after: str | None) -> tuple[list[FileInfo], bool, int]:
    """One page of the entries below the directory open as ``fd`` (see the module docstring);
    then whether more follow, and how many entries were left out because their names are not
    UTF-8. Only the directories on the current branch are held open."""
    page = _Page(path, limit)
    stack: list[tuple[int, str, Iterator[str]]] = []
    try:
        parts = after.split("/") if after else []
        if not recursive or len(parts) <= 1:
            first = page.scan(fd, "", parts[0] if parts else None)
            if not recursive:
                return page.out, False, page.unnamed
            stack.append((fd, "", iter(first)))
        else:
            # Reopen the branch of the last entry: above it, the subdirectories still to descend.
            dfd, prefix = fd, ""
            for name in parts[:-1]:
                stack.append((dfd, prefix, iter(_subdirs_after(dfd, name))))
                try:
                    sub = os.open(name, _LIST, dir_fd=dfd)
                except OSError:
                    break  # that branch is gone: go on with what followed it
                dfd, prefix = sub, f"{prefix}{name}/"
            else:
                stack.append((dfd, prefix, iter(())))  # on the stack first: closed if the scan fills the page
                stack[-1] = (dfd, prefix, iter(page.scan(dfd, prefix, parts[-1])))
        while stack:
            dfd, prefix, names = stack[-1]
            subdir = next(names, None)
            if subdir is None:
                stack.pop()
                if dfd != fd:
                    os.close(dfd)
                continue
            try:
                sub = os.open(subdir, _LIST, dir_fd=dfd)
            except OSError:
                continue  # unreadable or gone: listed, not descended into
            try:
                subs = page.scan(sub, f"{prefix}{subdir}/")
            except OSError:
                os.close(sub)
                continue
            except BaseException:
                os.close(sub)
                raise
            stack.append((sub, f"{prefix}{subdir}/", iter(subs)))
    except _Full:
        return page.out, True, page.unnamed
    finally:
        for dfd, _, _ in stack:
            if dfd != fd:
                os.close(dfd)
    return page.out, False, page.unnamed
