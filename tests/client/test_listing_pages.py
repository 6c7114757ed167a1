"""Listings cross page boundaries (1000 entries, about 1 MiB) anywhere in a tree, losing nothing."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

import remote_exec as rx

pytestmark = pytest.mark.anyio


def _expected(top: Path, prefix: str = "") -> list[str]:
    """The walk's order: a directory's entries by name, then each subdirectory's contents."""
    names = sorted(os.listdir(top))
    out = [prefix + n for n in names]
    for n in names:
        if (top / n).is_dir() and not (top / n).is_symlink():
            out += _expected(top / n, f"{prefix}{n}/")
    return out


async def test_a_recursive_listing_over_many_pages_is_complete_and_ordered(agent_dir: Path, tmp_path: Path) -> None:
    top = tmp_path / "tree"
    for d in ("a", "b/deep/deeper", "c"):
        (top / d).mkdir(parents=True)
    for d, n in (("", 5), ("a", 1300), ("b", 20), ("b/deep", 900), ("b/deep/deeper", 1100), ("c", 3)):
        for i in range(n):
            (top / d / f"f{i:04}").write_bytes(b"")
    (top / "b" / "link").symlink_to("/etc")
    async with rx.open_sandbox(f"local://?dir={agent_dir}") as sb:
        listed = await sb.list_dir(os.fspath(top), recursive=True)
        flat = await sb.list_dir(os.fspath(top / "a"))
        with pytest.raises(rx.FileError, match="more than 2500"):
            await sb.list_dir(os.fspath(top), recursive=True, max_entries=2500)
    assert [e.name for e in listed] == _expected(top)
    assert len(listed) == 3328 + 6  # the files, a b c deep deeper and the link
    assert [e.name for e in flat] == sorted(os.listdir(top / "a"))


async def test_names_that_are_not_utf8_are_left_out_and_counted_never_a_hang(agent_dir: Path, tmp_path: Path) -> None:
    top = tmp_path / "odd"
    (top / "ok").mkdir(parents=True)
    for raw in (b"bad\xff", b"ok/also\xfe", b"dir\xc3"):
        os.close(os.open(os.fsencode(top) + b"/" + raw, os.O_CREAT | os.O_WRONLY, 0o600))
    os.mkdir(os.fsencode(top) + b"/sub\xff")
    os.close(os.open(os.fsencode(top) + b"/sub\xff/hidden", os.O_CREAT | os.O_WRONLY, 0o600))
    os.symlink(b"/target\xff", os.fsencode(top) + b"/link")
    async with rx.open_sandbox(f"local://?dir={agent_dir}") as sb:
        with anyio.fail_after(10):  # the agent used to die encoding the name and never answer
            listed = await sb.list_dir(os.fspath(top), recursive=True)
            whole = await sb._files().listing(os.fspath(top), recursive=True)
    assert [e.name for e in listed] == ["link", "ok"]
    assert listed[0].target == "/target\\xff"  # shown escaped, never followed
    assert whole.unnamed == 4  # bad\xff, dir\xc3, sub\xff (and nothing below it), ok/also\xfe
