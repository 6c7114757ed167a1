"""``aiter_file`` / ``iter_file``: a remote file streamed chunk by chunk, in order, in bounded memory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import remote_exec as rx
from remote_exec.protocol import DEFAULT_CHUNK

pytestmark = pytest.mark.anyio


async def test_chunks_come_in_order_and_none_is_bigger_than_a_chunk(url: str, tmp_path: Path) -> None:
    data = os.urandom(3 * DEFAULT_CHUNK + 12345)
    (tmp_path / "big.bin").write_bytes(data)
    (tmp_path / "empty").write_bytes(b"")
    async with rx.open_sandbox(url) as sb:
        chunks = [c async for c in sb.aiter_file(str(tmp_path / "big.bin"))]
        assert b"".join(chunks) == data
        assert [len(c) for c in chunks] == [DEFAULT_CHUNK] * 3 + [12345]
        assert [c async for c in sb.aiter_file(str(tmp_path / "empty"))] == []


async def test_a_consumer_that_stops_early_leaves_the_sandbox_usable(url: str, tmp_path: Path) -> None:
    (tmp_path / "big.bin").write_bytes(b"x" * (2 * DEFAULT_CHUNK))
    async with rx.open_sandbox(url) as sb:
        async for chunk in sb.aiter_file(str(tmp_path / "big.bin")):
            assert chunk == b"x" * DEFAULT_CHUNK
            break
        assert (await sb.run(["echo", "still here"])).stdout == "still here\n"


async def test_a_file_that_changes_during_the_read_fails_it(url: str, tmp_path: Path) -> None:
    path = tmp_path / "moving.bin"
    path.write_bytes(b"a" * (2 * DEFAULT_CHUNK))
    async with rx.open_sandbox(url) as sb:
        chunks = sb.aiter_file(str(path))
        assert await anext(chunks) == b"a" * DEFAULT_CHUNK  # the next chunk is not asked for yet
        path.write_bytes(b"b" * (3 * DEFAULT_CHUNK))
        with pytest.raises(rx.FileError, match="changed while it was being read"):
            await anext(chunks)


async def test_precise_errors_and_the_workspace_root(url: str, tmp_path: Path) -> None:
    (tmp_path / "inside").write_bytes(b"ok")
    async with rx.open_sandbox(url) as sb:
        with pytest.raises(rx.RemoteFileNotFoundError):
            await anext(sb.aiter_file(str(tmp_path / "missing")))
        with pytest.raises(rx.RemoteIsADirectoryError):
            await anext(sb.aiter_file(str(tmp_path)))
        sb.workspace_root = str(tmp_path)
        assert [c async for c in sb.aiter_file("inside")] == [b"ok"]
        with pytest.raises(rx.PathEscapeError):
            await anext(sb.aiter_file("../outside"))


def test_blocking_iter_file(agent_dir: Path, tmp_path: Path) -> None:
    data = os.urandom(2 * DEFAULT_CHUNK + 7)
    (tmp_path / "big.bin").write_bytes(data)
    with rx.connect(f"local://?dir={agent_dir}") as sb:
        assert b"".join(sb.iter_file(str(tmp_path / "big.bin"))) == data
        first = sb.iter_file(str(tmp_path / "big.bin"))
        assert next(first) == data[:DEFAULT_CHUNK]
        first.close()  # stops the read: the async generator is closed on the loop
        with pytest.raises(rx.RemoteFileNotFoundError):
            next(sb.iter_file(str(tmp_path / "missing")))
    with pytest.raises(RuntimeError, match="closed"):
        next(sb.iter_file(str(tmp_path / "big.bin")))
