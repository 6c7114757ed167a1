"""File operations through the real agent (socket and stdio channels): content, errors,
atomicity, permissions, mtimes, and the workspace root's refusal of escapes."""

from __future__ import annotations

import os
import secrets
import threading
from pathlib import Path

import pytest

import remote_exec as rx
from remote_exec.client.files import FileClient
from remote_exec.protocol import (
    FileInfo,
    FileSessionParams,
    FileWriteChunkParams,
    FileWriteChunkResult,
    FileWriteCommitParams,
    FileWriteOpenParams,
    FileWriteOpenResult,
    Method,
)

pytestmark = pytest.mark.anyio

ALL_BYTES = bytes(range(256)) * 64


def temps(d: Path) -> list[str]:
    return [p.name for p in d.iterdir() if p.name.endswith(".rxtmp")]


async def test_text_and_binary_round_trips(url: str, tmp_path: Path) -> None:
    async with rx.open_sandbox(url) as sb:
        info = await sb.write_file(str(tmp_path / "t.txt"), "héllo wörld ✓\n")
        assert (info.type, info.size, info.name) == ("file", len("héllo wörld ✓\n".encode()), "t.txt")
        assert await sb.read_file(str(tmp_path / "t.txt")) == "héllo wörld ✓\n"
        await sb.write_file(str(tmp_path / "b.bin"), ALL_BYTES)
        assert await sb.read_file(str(tmp_path / "b.bin"), text=False) == ALL_BYTES
        assert (tmp_path / "b.bin").read_bytes() == ALL_BYTES
        await sb.write_file(str(tmp_path / "empty"), b"")
        assert await sb.read_file(str(tmp_path / "empty"), text=False) == b""
        big = secrets.token_bytes(9 * 1024 * 1024 + 17)  # over two default chunks: a write session
        await sb.write_file(str(tmp_path / "big"), big)
        assert (tmp_path / "big").read_bytes() == big
        assert await sb.read_file(str(tmp_path / "big"), text=False) == big
        # small chunks, many in flight: order on the wire does not matter
        files = FileClient(sb._core.rpc, chunk_size=64 * 1024, window=8)
        await files.write_bytes(str(tmp_path / "small-chunks"), big[: 3 * 1024 * 1024 + 5])
        assert await files.read_bytes(str(tmp_path / "small-chunks")) == big[: 3 * 1024 * 1024 + 5]
        assert temps(tmp_path) == []


async def test_relative_paths_without_root_follow_the_agent_cwd(url: str, tmp_path: Path) -> None:
    async with rx.open_sandbox(url) as sb:
        # The agent's own (a local:// job's default is its client's instead: docs/concepts.md).
        cwd = os.readlink(f"/proc/{sb.info.pid}/cwd")
        assert (await sb.stat(".")).path == os.path.realpath(cwd)  # noqa: ASYNC240


async def test_precise_errors(url: str, tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "f").write_text("x")
    (tmp_path / "bad.txt").write_bytes(b"ok \xff\xfe not utf-8")
    (tmp_path / "big.txt").write_text("y" * 5000)
    async with rx.open_sandbox(url) as sb:
        with pytest.raises(rx.RemoteFileNotFoundError) as nf:
            await sb.read_file(str(tmp_path / "missing"))
        assert isinstance(nf.value, FileNotFoundError) and isinstance(nf.value, rx.FileError)
        assert nf.value.errno == 2 and nf.value.path == str(tmp_path / "missing")
        with pytest.raises(rx.RemoteFileNotFoundError):
            await sb.write_file(str(tmp_path / "no" / "such" / "dir"), "x", parents=False)
        with pytest.raises(rx.RemoteIsADirectoryError):
            await sb.read_file(str(tmp_path / "d"))
        with pytest.raises(IsADirectoryError):
            await sb.write_file(str(tmp_path / "d"), "x")
        with pytest.raises(rx.RemoteNotADirectoryError):
            await sb.list_dir(str(tmp_path / "f"))
        with pytest.raises(rx.RemoteNotADirectoryError):
            await sb.read_file(str(tmp_path / "f" / "under"))
        with pytest.raises(rx.RemotePermissionError) as denied:  # EACCES even for root
            await sb.write_file("/sys/rx-test-file", "x")
        assert isinstance(denied.value, PermissionError) and denied.value.data["errno"] == "EACCES"
        with pytest.raises(rx.FileTooLargeError) as large:
            await sb.read_file(str(tmp_path / "big.txt"), max_size=4096)
        assert large.value.data["size"] == 5000 and large.value.data["limit"] == 4096
        assert "read_file_to" in str(large.value)
        assert await sb.read_file(str(tmp_path / "big.txt"), text=False) == b"y" * 5000  # bytes: no cap
        with pytest.raises(rx.FileEncodingError) as enc:
            await sb.read_file(str(tmp_path / "bad.txt"))
        assert enc.value.data["offset"] == 3 and "text=False" in str(enc.value)
        assert await sb.read_file(str(tmp_path / "bad.txt"), text=False) == b"ok \xff\xfe not utf-8"
        with pytest.raises(rx.RemoteFileExistsError):
            await sb.mkdir(str(tmp_path / "d"), exist_ok=False)
        with pytest.raises(rx.RemoteFileExistsError):
            await sb.mkdir(str(tmp_path / "f"))
        (tmp_path / "d" / "inner").write_text("z")
        with pytest.raises(rx.FileError, match="recursive=True"):
            await sb.remove(str(tmp_path / "d"))
        with pytest.raises(rx.RemoteFileNotFoundError):
            await sb.remove(str(tmp_path / "missing"))
        assert await sb.remove(str(tmp_path / "missing"), missing_ok=True) is False


async def test_list_mkdir_remove_exists(url: str, tmp_path: Path) -> None:
    async with rx.open_sandbox(url) as sb:
        base = str(tmp_path / "tree")
        made = await sb.mkdir(f"{base}/a/b/c")
        assert made.type == "dir" and made.path == f"{base}/a/b/c"
        await sb.write_file(f"{base}/a/x.txt", "x")
        await sb.write_file(f"{base}/a/b/y.bin", b"\0" * 10)
        os.symlink("x.txt", f"{base}/a/link")
        top = await sb.list_dir(base)
        assert [(e.name, e.type) for e in top] == [("a", "dir")]
        names = [(e.name, e.type) for e in await sb.list_dir(base, recursive=True)]
        assert names == [("a", "dir"), ("a/b", "dir"), ("a/link", "symlink"), ("a/x.txt", "file"),
                         ("a/b/c", "dir"), ("a/b/y.bin", "file")]  # fmt: skip
        link = next(e for e in await sb.list_dir(f"{base}/a") if e.name == "link")
        assert link.target == "x.txt" and link.path == f"{base}/a/link"
        assert (await sb.stat(f"{base}/a/link")).type == "file"  # followed
        assert (await sb.stat(f"{base}/a/link", follow=False)).type == "symlink"
        with pytest.raises(rx.FileError, match="max_entries"):
            await sb.list_dir(base, recursive=True, max_entries=3)
        assert await sb.exists(f"{base}/a/x.txt") and not await sb.exists(f"{base}/nope")
        assert await sb.remove(f"{base}/a/link")  # the link, not its target
        assert (tmp_path / "tree" / "a" / "x.txt").exists()
        assert await sb.remove(base, recursive=True)
        assert not (tmp_path / "tree").exists()


async def test_permissions_and_mtime_kept(url: str, tmp_path: Path) -> None:
    async with rx.open_sandbox(url) as sb:
        p = str(tmp_path / "script.sh")
        assert (await sb.write_file(p, "#!/bin/sh\n", 0o750)).mode == 0o750
        assert (await sb.write_file(p, "#!/bin/sh\necho 2\n")).mode == 0o750  # a rewrite keeps the mode
        assert os.stat(p).st_mode & 0o7777 == 0o750
        fresh = await sb.write_file(str(tmp_path / "fresh"), "x")
        umask = os.umask(0)
        os.umask(umask)
        assert fresh.mode == 0o666 & ~umask
        info = await sb.write_file(str(tmp_path / "old"), "x", mtime=1_600_000_000.5)
        assert info.mtime_ns == 1_600_000_000_500_000_000 and info.mtime == 1_600_000_000.5
        local = tmp_path / "local.bin"
        local.write_bytes(ALL_BYTES)
        local.chmod(0o741)
        os.utime(local, ns=(1_500_000_000_123_456_789, 1_500_000_000_123_456_789))
        sent = await sb.write_file_from(local, str(tmp_path / "sent.bin"))
        assert (sent.mode, sent.mtime_ns, sent.size) == (0o741, 1_500_000_000_123_456_789, len(ALL_BYTES))
        back = tmp_path / "back.bin"
        got = await sb.read_file_to(str(tmp_path / "sent.bin"), back)
        st = back.stat()
        assert (st.st_mode & 0o7777, st.st_mtime_ns, back.read_bytes()) == (0o741, got.mtime_ns, ALL_BYTES)
        assert [p for p in os.listdir(tmp_path) if p.endswith(".rxpart")] == []


async def test_failed_write_leaves_old_content_and_no_temporary(url: str, tmp_path: Path) -> None:
    target = tmp_path / "keep.txt"
    target.write_text("old content")
    async with rx.open_sandbox(url) as sb:
        files = FileClient(sb._core.rpc, chunk_size=64 * 1024)
        sent = 0

        async def failing(offset: int, n: int) -> bytes:
            nonlocal sent
            sent += 1
            if sent > 3:
                raise OSError("the local disk failed")
            return b"n" * n

        with pytest.raises(OSError, match="local disk failed"):
            await files._write(str(target), 1024 * 1024, failing, None, None, False, None)
        assert target.read_text() == "old content" and temps(tmp_path) == []

        # a commit with a hole is refused (and may be completed), an abort leaves nothing
        rpc = sb._core.rpc
        sid = secrets.token_urlsafe(12)
        opened = await rpc.call(
            Method.FILE_WRITE_OPEN, FileWriteOpenParams(session_id=sid, path=str(target)), FileWriteOpenResult
        )
        assert opened.path == str(target) and len(temps(tmp_path)) == 1
        for offset in (0, 8, 0):  # a retried chunk is written once, in place
            got = await rpc.call(
                Method.FILE_WRITE_CHUNK,
                FileWriteChunkParams(session_id=sid, offset=offset),
                FileWriteChunkResult,
                payload=b"abcd",
            )
        assert got.received == 8
        with pytest.raises(rx.FileError, match="byte 4 of 12 never arrived"):
            await rpc.call(Method.FILE_WRITE_COMMIT, FileWriteCommitParams(session_id=sid, size=12), FileInfo)
        assert target.read_text() == "old content"
        await rpc.call(Method.FILE_WRITE_ABORT, FileSessionParams(session_id=sid), rx.protocol.Empty)
        await rpc.call(Method.FILE_WRITE_ABORT, FileSessionParams(session_id=sid), rx.protocol.Empty)  # idempotent
        assert target.read_text() == "old content" and temps(tmp_path) == []
        with pytest.raises(rx.WriteSessionNotFoundError):
            await rpc.call(
                Method.FILE_WRITE_CHUNK, FileWriteChunkParams(session_id=sid, offset=0), FileWriteChunkResult,
                payload=b"x",
            )  # fmt: skip

        # a retried commit (its answer lost) gets the same answer; a retried open the same session
        sid = secrets.token_urlsafe(12)
        for _ in range(2):
            await rpc.call(
                Method.FILE_WRITE_OPEN, FileWriteOpenParams(session_id=sid, path=str(target)), FileWriteOpenResult
            )
        assert len(temps(tmp_path)) == 1
        await rpc.call(
            Method.FILE_WRITE_CHUNK, FileWriteChunkParams(session_id=sid, offset=0), FileWriteChunkResult,
            payload=b"new",
        )  # fmt: skip
        first = await rpc.call(Method.FILE_WRITE_COMMIT, FileWriteCommitParams(session_id=sid, size=3), FileInfo)
        again = await rpc.call(Method.FILE_WRITE_COMMIT, FileWriteCommitParams(session_id=sid, size=3), FileInfo)
        assert first == again and target.read_text() == "new" and temps(tmp_path) == []


async def test_readers_never_see_a_partial_file(url: str, tmp_path: Path) -> None:
    target = tmp_path / "swap.bin"
    size = 2 * 1024 * 1024 + 3
    target.write_bytes(b"a" * size)
    seen: set[tuple[int, int]] = set()
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            data = target.read_bytes()
            seen.add((len(data), len(set(data))))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        async with rx.open_sandbox(url) as sb:
            files = FileClient(sb._core.rpc, chunk_size=128 * 1024)  # many chunks: a slow, visible write
            for i in range(6):
                await files.write_bytes(str(target), (b"b" if i % 2 == 0 else b"a") * size)
    finally:
        stop.set()
        thread.join()
    assert seen == {(size, 1)}  # always a whole file of one byte value: old or new, never a mix


async def test_workspace_root_refuses_escapes(url: str, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "sub" / "in.txt").write_text("inside")
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    os.symlink("/etc", ws / "etc")  # absolute, out
    os.symlink("../outside.txt", ws / "up")  # relative, out
    os.symlink(str(outside), ws / "evil")  # a final component pointing out
    os.symlink("sub", ws / "ok")  # relative, in
    os.symlink(str(ws / "sub" / "in.txt"), ws / "abs-in")  # absolute, in
    os.symlink("sub/../../outside.txt", ws / "sneaky")
    async with rx.open_sandbox(url, workspace_root=str(ws)) as sb:
        assert await sb.read_file("sub/in.txt") == "inside"
        assert await sb.read_file(str(ws / "sub" / "in.txt")) == "inside"
        assert await sb.read_file("ok/in.txt") == "inside"
        assert await sb.read_file("abs-in") == "inside"
        assert await sb.read_file("sub/../sub/./in.txt") == "inside"
        assert (await sb.stat(".")).path == str(ws)
        for bad in ["../outside.txt", "../../../../etc/passwd", "sub/../../outside.txt", "/etc/passwd",
                    "etc/passwd", "up", "evil", "sneaky", str(ws) + "/../outside.txt"]:  # fmt: skip
            with pytest.raises(rx.PathEscapeError) as esc:
                await sb.read_file(bad)
            assert esc.value.path == bad and "workspace root" in str(esc.value)
        for bad in ["evil", "up", "../x", "etc/x", "/tmp/x"]:
            with pytest.raises(rx.PathEscapeError):
                await sb.write_file(bad, "pwned")
        with pytest.raises(rx.PathEscapeError):
            await sb.list_dir("etc")
        with pytest.raises(rx.PathEscapeError):
            await sb.mkdir("etc/rx-test")
        with pytest.raises(rx.PathEscapeError):
            await sb.remove("../outside.txt")
        with pytest.raises(rx.PathEscapeError):
            await sb.write_file_from(outside, "../copy")
        with pytest.raises(rx.RemotePermissionError, match="workspace root"):
            await sb.remove(".", recursive=True)
        assert outside.read_text() == "secret" and not (tmp_path / "x").exists()
        assert await sb.remove("evil")  # the link itself is inside: removing it is fine
        assert outside.read_text() == "secret"
        await sb.write_file("new/dir/f.txt", "made")
        assert (ws / "new" / "dir" / "f.txt").read_text() == "made"
        listing = await sb.list_dir(".", recursive=True)
        assert {e.name for e in listing if e.type == "symlink"} == {"etc", "up", "ok", "abs-in", "sneaky"}
    async with rx.open_sandbox(url, workspace_root=str(ws / "missing")) as sb:
        with pytest.raises(rx.RemoteFileNotFoundError):
            await sb.read_file("x")


async def test_abandoned_write_sessions_expire(fresh_agent_dir: Path, tmp_path: Path) -> None:
    """An abandoned session's temporary file is removed once its TTL has passed, not before."""
    from remote_exec.agent.files.controller import FileController
    from remote_exec.agent.files.sessions import FileLimits

    now = [1000.0]  # a fake monotonic clock: the TTL passes when the test says so
    ctl = FileController(FileLimits(session_ttl=60), clock=lambda: now[0]).sessions
    sid, used = secrets.token_urlsafe(12), secrets.token_urlsafe(12)
    await ctl.write_open(FileWriteOpenParams(session_id=sid, path=str(tmp_path / "f")))
    await ctl.write_open(FileWriteOpenParams(session_id=used, path=str(tmp_path / "u")))
    assert len(temps(tmp_path)) == 2 and ctl.open_sessions == 2
    now[0] += 59.9
    assert await ctl.expire_idle() == 0
    await ctl.write_chunk(FileWriteChunkParams(session_id=used, offset=0), memoryview(b"x"))  # a request: used again
    now[0] += 0.2
    assert await ctl.expire_idle() == 1
    assert len(temps(tmp_path)) == 1 and ctl.open_sessions == 1
    with pytest.raises(rx.WriteSessionNotFoundError, match="expired"):
        await ctl.write_chunk(FileWriteChunkParams(session_id=sid, offset=0), memoryview(b"x"))
    now[0] += 60
    assert await ctl.expire_idle() == 1 and temps(tmp_path) == [] and ctl.open_sessions == 0
    await ctl.write_open(FileWriteOpenParams(session_id=secrets.token_urlsafe(12), path=str(tmp_path / "g")))
    await ctl.aclose()  # the agent stopping aborts what is open
    assert temps(tmp_path) == []


async def test_file_hash_digests_and_refusals(url: str, tmp_path: Path) -> None:
    import hashlib

    from remote_exec.protocol import FileHashParams, FileHashResult

    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    (ws / "a.bin").write_bytes(ALL_BYTES)
    (ws / "empty").write_bytes(b"")
    os.symlink("a.bin", ws / "link")  # inside: followed
    os.mkfifo(ws / "fifo")  # not a regular file: None, and no hang on open
    (tmp_path / "out.txt").write_text("outside")
    async with rx.open_sandbox(url, workspace_root=str(ws)) as sb:
        rpc = sb._core.rpc

        async def hashes(*paths: str, root: str | None = str(ws)) -> list[str | None]:
            res = await rpc.call(Method.FILE_HASH, FileHashParams(paths=list(paths), root=root), FileHashResult)
            return res.hashes

        digest = hashlib.sha256(ALL_BYTES).hexdigest()
        assert await hashes("a.bin", "empty", "link", "d", "fifo", "missing", "d/missing/x") == [
            digest, hashlib.sha256(b"").hexdigest(), digest, None, None, None, None
        ]  # fmt: skip
        with pytest.raises(rx.PathEscapeError):
            await hashes("a.bin", "../out.txt")
        with pytest.raises(rx.InvalidParamsError):
            await rpc.call(Method.FILE_HASH, FileHashParams.model_construct(paths=[], root=None), FileHashResult)
        with pytest.raises(rx.InvalidParamsError):
            too_many = FileHashParams.model_construct(paths=["x"] * 1025, root=None)  # unchecked: the agent checks
            await rpc.call(Method.FILE_HASH, too_many, FileHashResult)
        with pytest.raises(rx.InvalidParamsError):
            relative = FileHashParams.model_construct(paths=["x"], root="relative")
            await rpc.call(Method.FILE_HASH, relative, FileHashResult)
        many = await FileClient(rpc, str(ws)).hashes(["a.bin"] * 2500, [len(ALL_BYTES)] * 2500)  # 3 batches
        assert many == [digest] * 2500
