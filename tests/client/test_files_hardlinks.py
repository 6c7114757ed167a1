"""Hard links inside a workspace root (or a download's target) to files outside it, through the
real agent: every write replaces the name (a temporary file renamed over it) and a remove unlinks
the name, so the other inode is never modified; a read sees the shared content (documented in
docs/security.md, "Hard links in a workspace root")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import remote_exec as rx

pytestmark = pytest.mark.anyio

SECRET = b"outside the root\n"
MTIME_NS = 1_600_000_000_000_000_000


def outside_file(tmp_path: Path) -> Path:
    out = tmp_path / "outside"
    out.mkdir(exist_ok=True)
    f = out / "secret"
    f.write_bytes(SECRET)
    f.chmod(0o640)
    os.utime(f, ns=(MTIME_NS, MTIME_NS))
    return f


def link_into(target: Path, name: str, into: Path) -> None:
    (into / name).unlink(missing_ok=True)
    os.link(target, into / name)


def untouched(f: Path) -> bool:
    st = f.stat()
    return f.read_bytes() == SECRET and (st.st_mode & 0o777, st.st_mtime_ns, st.st_nlink) == (0o640, MTIME_NS, 1)


async def test_writes_and_removes_through_a_hard_link_never_touch_the_other_file(url: str, tmp_path: Path) -> None:
    secret = outside_file(tmp_path)
    root = tmp_path / "root"
    root.mkdir()
    async with rx.open_sandbox(url, workspace_root=str(root)) as sb:
        link_into(secret, "h", root)
        assert await sb.read_file("h", text=False) == SECRET  # the documented part: reads share the inode

        await sb.write_file("h", "replaced\n")
        assert untouched(secret) and (root / "h").read_text() == "replaced\n"

        link_into(secret, "h", root)
        big = os.urandom(9 * 1024 * 1024)  # over two chunks: a write session, still a rename at the end
        await sb.write_file("h", big)
        assert untouched(secret) and (root / "h").read_bytes() == big

        link_into(secret, "h", root)
        assert await sb.remove("h")
        assert untouched(secret) and not (root / "h").exists()

        link_into(secret, "h", root)
        src = tmp_path / "src"
        src.mkdir()
        (src / "h").write_text("uploaded\n")
        await sb.upload(src, ".", progress=False)
        assert untouched(secret) and (root / "h").read_text() == "uploaded\n"


async def test_a_download_replaces_a_local_hard_link_instead_of_writing_through_it(url: str, tmp_path: Path) -> None:
    secret = outside_file(tmp_path)
    remote = tmp_path / "remote"
    remote.mkdir()
    (remote / "h").write_text("from the sandbox\n")
    target = tmp_path / "target"
    target.mkdir()
    link_into(secret, "h", target)
    async with rx.open_sandbox(url) as sb:
        result = await sb.download(str(remote), target, progress=False, checksum=True)
    assert result.files_sent == 1
    assert untouched(secret) and (target / "h").read_text() == "from the sandbox\n"
