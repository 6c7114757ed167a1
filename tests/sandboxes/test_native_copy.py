"""Big files through the engine's own copy (``docker cp`` / ``podman cp``), against real engines.

A file of at least ``ArchiveCopy.min_size`` bytes goes in as a staged write (the engine puts
it in the agent's private staging directory, the agent checks it and renames it into place)
and comes out as a tar stream of ``cp CONTAINER:PATH -``. These tests show that the engine's
copy really carries the bytes (every ``cp`` is recorded), that the result is the same file the
channel would write (bytes, mode, mtime, owner, nothing left beside it), that every way the
engine's copy can fail falls back to the channel with the same result, and that a cancelled
copy leaves no process and no staging directory behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import secrets
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import remote_exec as rx
from remote_exec.errors import FileError
from remote_exec.sandboxes.docker import ContainerTransport, DockerTransport, PodmanTransport
from remote_exec.sandboxes.native_copy import ArchiveCopy, _receive_tar

from .backend_docker import docker_or_skip, image_or_skip
from .conftest import unavailable
from .podmanenv import PodmanUnavailable, shared_podman

pytestmark = pytest.mark.anyio

BIG = 17 * 1024 * 1024 + 5  # over ArchiveCopy's default min_size (16 MiB)
MTIME_NS = 1_600_000_000_123_456_789


class Recorded:
    """Wraps a transport's ArchiveCopy, recording each copy's argv and whether it succeeded."""

    def __init__(self, transport: ContainerTransport) -> None:
        self.inner = ContainerTransport.native_copy(transport)
        self.min_size = self.inner.min_size
        self.calls: list[tuple[str, list[str], bool]] = []

    async def put(
        self, fd: int, size: int, stage_dir: str, name: str, owner: tuple[int, int], progress: object
    ) -> None:
        argv = self.inner.put_argv(stage_dir)
        try:
            await self.inner.put(fd, size, stage_dir, name, owner, progress)  # type: ignore[arg-type]
        except BaseException:
            self.calls.append(("put", argv, False))
            raise
        self.calls.append(("put", argv, True))

    async def get(self, path: str, fd: int, size: int, progress: object) -> None:
        argv = self.inner.get_argv(path)
        try:
            await self.inner.get(path, fd, size, progress)  # type: ignore[arg-type]
        except BaseException:
            self.calls.append(("get", argv, False))
            raise
        self.calls.append(("get", argv, True))


def recording(cls: type[ContainerTransport]) -> type[ContainerTransport]:
    class RecordingTransport(cls):  # type: ignore[valid-type,misc]
        def __init__(self, container: str, **kw: object) -> None:
            super().__init__(container, **kw)
            self.copy = Recorded(self)

        def native_copy(self) -> Recorded:
            return self.copy

    return RecordingTransport


class Engine:
    """One engine (docker or podman): start containers, run commands in them."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.names: list[str] = []
        if kind == "docker":
            self.dockerd = docker_or_skip()
            self.image = image_or_skip(self.dockerd, "nopy")
        else:
            try:
                self.podman = shared_podman()
            except PodmanUnavailable as exc:
                unavailable(f"podman: {exc}")

    def start(self, *args: str) -> str:
        name = f"rx-native-{secrets.token_hex(4)}"
        if self.kind == "docker":
            self.dockerd.run(name, self.image, *args)
        else:
            self.podman.run(name, *args)
        self.names.append(name)
        return name

    def sh(self, name: str, script: str) -> str:
        argv = ["exec", name, "sh", "-c", script]
        done = self.dockerd.docker(*argv) if self.kind == "docker" else self.podman.podman(*argv)
        return done.stdout.decode()

    def transport(self, name: str, **kw: Any) -> ContainerTransport:
        return recording(DockerTransport if self.kind == "docker" else PodmanTransport)(name, **kw)

    def cleanup(self) -> None:
        for name in self.names:
            if self.kind == "docker":
                self.dockerd.docker("rm", "-f", name, check=False)
            else:
                self.podman.podman("rm", "-f", "-t", "0", name, check=False)


@pytest.fixture(params=["docker", "podman"])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    e = Engine(request.param)
    yield e
    e.cleanup()


def random_file(path: Path, size: int, mode: int = 0o751) -> bytes:
    data = secrets.token_bytes(size)
    path.write_bytes(data)
    path.chmod(mode)
    os.utime(path, ns=(MTIME_NS, MTIME_NS))
    return data


def sparse_file(path: Path, size: int) -> None:
    path.touch()
    os.truncate(path, size)


async def test_big_files_go_through_the_engines_copy(engine: Engine, tmp_path: Path) -> None:
    name = engine.start()
    data = random_file(tmp_path / "big.bin", BIG)
    (tmp_path / "small.bin").write_bytes(b"small")
    transport = engine.transport(name)
    async with rx.AsyncSandbox(transport) as sb:
        await sb.mkdir("/work/in")
        info = await sb.write_file_from(tmp_path / "big.bin", "/work/in/big.bin")
        assert (info.size, info.mode, info.mtime_ns) == (BIG, 0o751, MTIME_NS)
        await sb.write_file_from(tmp_path / "small.bin", "/work/in/small.bin")  # below min_size: the channel
        # The same file the channel would write: ours (root's), and nothing left beside it.
        assert engine.sh(name, "stat -c '%u:%g %a %s' /work/in/big.bin") == f"0:0 751 {BIG}\n"
        assert sorted(e.name for e in await sb.list_dir("/work/in")) == ["big.bin", "small.bin"]
        back = await sb.read_file_to("/work/in/big.bin", tmp_path / "back.bin")
        assert back.size == BIG
        assert (tmp_path / "back.bin").read_bytes() == data
        st = (tmp_path / "back.bin").stat()
        assert (st.st_mode & 0o777, st.st_mtime_ns) == (0o751, MTIME_NS)
        await sb.read_file_to("/work/in/small.bin", tmp_path / "small-back.bin")
    calls = transport.copy.calls  # type: ignore[attr-defined]
    assert [(kind, ok) for kind, _, ok in calls] == [("put", True), ("get", True)], calls
    assert calls[0][1][-1].startswith(f"{name}:/work/in/.big.bin.") and calls[0][1][-1].endswith(".rxstage")
    assert calls[1][1][-2:] == [f"{name}:/work/in/big.bin", "-"]


async def test_a_replaced_file_keeps_its_mode_and_a_symlinked_path_resolves(engine: Engine, tmp_path: Path) -> None:
    name = engine.start()
    data = random_file(tmp_path / "big.bin", BIG, mode=0o600)
    engine.sh(name, "mkdir -p /work/real && echo old > /work/real/f && chmod 640 /work/real/f && ln -s real /work/link")
    transport = engine.transport(name)
    async with rx.AsyncSandbox(transport) as sb:
        info = await sb.write_file_from(tmp_path / "big.bin", "/work/link/f", mode=None)
        assert info.path == "/work/real/f" and info.size == BIG
        assert engine.sh(name, "stat -c '%a %s' /work/real/f; ls -A /work/real") == f"600 {BIG}\nf\n"
        await sb.read_file_to("/work/link/f", tmp_path / "back.bin")
        assert (tmp_path / "back.bin").read_bytes() == data
    assert [(kind, ok) for kind, _, ok in transport.copy.calls] == [("put", True), ("get", True)]  # type: ignore[attr-defined]


async def test_where_the_engine_cannot_copy_the_channel_does(engine: Engine, tmp_path: Path) -> None:
    # A read-only root with a tmpfs /tmp: dockerd refuses to write into the root, and a tmpfs is
    # invisible to its archive API (it sees the layer underneath): both fall back to the channel.
    # Podman copies inside the container's own mounts, so both work there.
    name = engine.start("--read-only", "--tmpfs", "/tmp:exec")
    data = random_file(tmp_path / "big.bin", BIG)
    transport = engine.transport(name)
    async with rx.AsyncSandbox(transport) as sb:
        info = await sb.write_file_from(tmp_path / "big.bin", "/tmp/big.bin")
        assert (info.size, info.mode, info.mtime_ns) == (BIG, 0o751, MTIME_NS)
        assert [e.name for e in await sb.list_dir("/tmp") if "big" in e.name] == ["big.bin"]
        await sb.read_file_to("/tmp/big.bin", tmp_path / "back.bin")
        assert (tmp_path / "back.bin").read_bytes() == data
    calls = transport.copy.calls  # type: ignore[attr-defined]
    copied = engine.kind == "podman"
    assert [(kind, ok) for kind, _, ok in calls] == [("put", copied), ("get", copied)], calls


async def test_a_missing_engine_cli_falls_back_to_the_channel(engine: Engine, tmp_path: Path) -> None:
    # A missing engine CLI is the same story from the host's side: the copy fails, the channel works.
    name = engine.start()
    data = random_file(tmp_path / "big.bin", BIG)
    transport = engine.transport(name)
    transport.copy.inner.put_argv = lambda d: ["/nonexistent/docker", "cp", "-", f"{name}:{d}"]  # type: ignore[attr-defined]
    transport.copy.inner.get_argv = lambda p: ["/nonexistent/docker", "cp", f"{name}:{p}", "-"]  # type: ignore[attr-defined]
    async with rx.AsyncSandbox(transport) as sb:
        await sb.write_file_from(tmp_path / "big.bin", "/work/big.bin", parents=True)
        await sb.read_file_to("/work/big.bin", tmp_path / "back.bin")
        assert (tmp_path / "back.bin").read_bytes() == data
        assert [e.name for e in await sb.list_dir("/work")] == ["big.bin"]
    assert [(kind, ok) for kind, _, ok in transport.copy.calls] == [("put", False), ("get", False)]  # type: ignore[attr-defined]


async def test_a_cancelled_copy_leaves_no_process_and_no_staging(engine: Engine, tmp_path: Path) -> None:
    name = engine.start()
    src = tmp_path / "huge.bin"
    sparse_file(src, 256 * 1024 * 1024)  # cheap to make, 256 MiB to copy
    transport = engine.transport(name)
    async with rx.AsyncSandbox(transport) as sb:
        await sb.mkdir("/work")
        started = asyncio.Event()
        files = sb._files()
        task = asyncio.ensure_future(files.write_from(src, "/work/huge.bin", progress=lambda n: started.set()))
        await started.wait()  # the engine's copy is under way
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        ps = subprocess.run(["pgrep", "-f", f"cp - {name}:"], capture_output=True, text=True)  # noqa: ASYNC221
        assert ps.stdout == "", "the engine's cp outlived the cancelled write"
        assert await sb.list_dir("/work") == []
    assert [(kind, ok) for kind, _, ok in transport.copy.calls] == [("put", False)]  # type: ignore[attr-defined]


def test_archive_copy_command_lines() -> None:
    docker = DockerTransport("box", host="unix:///tmp/d.sock")
    copy = docker.native_copy()
    assert isinstance(copy, ArchiveCopy)
    assert copy.put_argv("/w/.f.x.rxstage") == ["docker", "-H", "unix:///tmp/d.sock", "cp", "-", "box:/w/.f.x.rxstage"]
    assert copy.get_argv("/w/f") == ["docker", "-H", "unix:///tmp/d.sock", "cp", "box:/w/f", "-"]
    podman = PodmanTransport("box").native_copy()
    assert podman.get_argv("/w/f")[:2] == ["podman", "cp"]


def one_member_tar(name: str, data: bytes, fmt: int, kind: bytes = tarfile.REGTYPE) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        info = tarfile.TarInfo(name)
        info.type, info.size = kind, len(data) if kind == tarfile.REGTYPE else 0
        tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    return buf.getvalue()


def receive(stream: bytes, size: int, tmp_path: Path) -> bytes:
    """``_receive_tar`` fed ``stream`` through a real pipe: the file it writes."""
    read_end, write_end = os.pipe()

    def feed() -> None:
        with os.fdopen(write_end, "wb") as w, contextlib.suppress(BrokenPipeError):
            w.write(stream)

    feeder = threading.Thread(target=feed)
    feeder.start()
    out = tmp_path / "out.bin"
    fd = os.open(out, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    try:
        _receive_tar(read_end, fd, size, "/remote/f", None)
    finally:
        os.close(fd)
        feeder.join()
    return out.read_bytes()


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_download_stream_headers_are_parsed(fmt: int, tmp_path: Path) -> None:
    data = secrets.token_bytes(3 * 1024 * 1024 + 7)
    name = "n" * (90 if fmt == tarfile.USTAR_FORMAT else 300) + "é" * (fmt == tarfile.PAX_FORMAT)
    assert receive(one_member_tar(name, data, fmt), len(data), tmp_path) == data


@pytest.mark.parametrize(
    ("stream", "why"),
    [
        (b"", "not a tar stream"),
        (b"garbage" * 100, "not a tar stream"),
        (bytes(1024), "not a tar stream"),
        (one_member_tar("d", b"", tarfile.PAX_FORMAT, tarfile.DIRTYPE), "not a regular file"),
        (one_member_tar("f", b"short", tarfile.PAX_FORMAT), "held 5 bytes, not 10"),
        (one_member_tar("f", b"0123456789", tarfile.PAX_FORMAT)[: 512 + 4], "ended after 4 of 10 bytes"),
    ],
)
def test_download_stream_that_is_not_one_file_is_refused(stream: bytes, why: str, tmp_path: Path) -> None:
    with pytest.raises(FileError, match=why):
        receive(stream, 10, tmp_path)


async def test_a_stuck_engine_is_killed_at_the_deadline(tmp_path: Path) -> None:
    # "cp" stand-ins that never read or never write: each copy is killed after its deadline
    # (grace + size / min_rate), with nothing left running.
    src = tmp_path / "big.bin"
    sparse_file(src, 8 * 1024 * 1024)  # more than the pipe holds: the sender blocks
    marker = f"rx-stuck-{secrets.token_hex(4)}"
    stuck = ArchiveCopy(
        lambda d: [sys.executable, "-c", "import time; time.sleep(60)", marker],  # one process, marked
        lambda p: [sys.executable, "-c", "import time; time.sleep(60)", marker],
        grace=0.5,
        min_rate=1e12,
    )
    fd = os.open(src, os.O_RDWR)
    try:
        with pytest.raises(TimeoutError, match="killed"):
            await stuck.put(fd, 8 * 1024 * 1024, "/nowhere", "data", (0, 0), None)
        with pytest.raises(TimeoutError, match="killed"):
            await stuck.get("/nowhere/data", fd, 8 * 1024 * 1024, None)
    finally:
        os.close(fd)
    ps = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)  # noqa: ASYNC221
    assert ps.stdout == ""
