"""The file contract every sandbox passes: the same bytes back through every transport.

Runs in ``/tmp`` of the sandbox (writable in all of them: private in the jail, a tmpfs in the
hardened image) through the agent channel, so it works where the transport has no copy command.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

import remote_exec as rx

pytestmark = pytest.mark.anyio

ALL_BYTES = bytes(range(256)) * 4
INVALID_UTF8 = b"valid start \xc3\x28 then \xff\xfe\x00 and a lone \xed\xa0\x80 surrogate"


async def test_files_round_trip(sandbox_url: str, tmp_path: Path) -> None:
    base = f"/tmp/rx-files-{secrets.token_hex(4)}"
    big = secrets.token_bytes(6 * 1024 * 1024 + 3)  # more than one chunk: a pipelined write session
    async with rx.open_sandbox(sandbox_url) as sb:
        try:
            await sb.write_file(f"{base}/text.txt", "héllo\nwörld ✓\n", 0o640)
            assert await sb.read_file(f"{base}/text.txt") == "héllo\nwörld ✓\n"
            assert (await sb.run(["cat", f"{base}/text.txt"])).stdout == "héllo\nwörld ✓\n"
            await sb.write_file(f"{base}/all.bin", ALL_BYTES)
            assert await sb.read_file(f"{base}/all.bin", text=False) == ALL_BYTES
            await sb.write_file(f"{base}/bad.txt", INVALID_UTF8)
            assert await sb.read_file(f"{base}/bad.txt", text=False) == INVALID_UTF8
            with pytest.raises(rx.FileEncodingError):
                await sb.read_file(f"{base}/bad.txt")
            await sb.write_file(f"{base}/big.bin", big)
            assert await sb.read_file(f"{base}/big.bin", text=False) == big
            sizes = {e.name: (e.type, e.size, e.mode) for e in await sb.list_dir(base)}
            assert sizes["text.txt"] == ("file", len("héllo\nwörld ✓\n".encode()), 0o640)
            assert sizes["big.bin"][:2] == ("file", len(big))
            local = tmp_path / "big.bin"
            await sb.read_file_to(f"{base}/big.bin", local)
            assert local.read_bytes() == big
            with pytest.raises(rx.RemoteFileNotFoundError):
                await sb.read_file(f"{base}/missing")
            with pytest.raises(rx.RemoteIsADirectoryError):
                await sb.read_file(base)
        finally:
            await sb.remove(base, recursive=True, missing_ok=True)
        assert not await sb.exists(base)


async def test_files_tree_and_workspace_root(sandbox_url: str, tmp_path: Path) -> None:
    src = tmp_path / "project"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "a.py").write_text("A = 1\n")
    (src / "data.bin").write_bytes(ALL_BYTES)
    (src / ".env").write_text("SECRET=1\n")
    base = f"/tmp/rx-tree-{secrets.token_hex(4)}"
    async with rx.open_sandbox(sandbox_url) as sb:
        await sb.mkdir(f"{base}/ws")
        await sb.run(["ln", "-s", "/etc", f"{base}/ws/etc"])
        try:
            async with rx.open_sandbox(sandbox_url, workspace_root=f"{base}/ws") as rooted:
                sent = await rooted.upload(src, "project", progress=False)
                assert sent.files_sent == 2 and sent.ignored == 1
                assert (await rooted.upload(src, "project", progress=False)).files_sent == 0
                got = await rooted.download("project", tmp_path / "back", progress=False)
                assert got.files_sent == 2 and (tmp_path / "back" / "data.bin").read_bytes() == ALL_BYTES
                for escape in ("etc/passwd", "../../../etc/passwd", "/etc/passwd"):
                    with pytest.raises(rx.PathEscapeError):
                        await rooted.read_file(escape)
        finally:
            await sb.remove(base, recursive=True, missing_ok=True)
