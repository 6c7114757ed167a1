"""The socket channel's reader: frames byte-exact however the bytes are cut, bounds kept."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from remote_exec.client.framesocket import HIGH_WATER, FrameSocket
from remote_exec.protocol import frames

pytestmark = pytest.mark.anyio

Serve = Callable[[asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def connected(tmp_path: Path, serve: Serve, limit: int = 1 << 20) -> AsyncIterator[FrameSocket]:
    async def handle(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve(writer)
        writer.close()

    path = os.fspath(tmp_path / "s")
    server = await asyncio.start_unix_server(handle, path)
    try:
        _, sock = await asyncio.get_running_loop().create_unix_connection(lambda: FrameSocket(limit), path)
        yield sock
        sock.close()
    finally:
        server.close()


async def test_frames_come_back_byte_exact_however_the_stream_is_cut(tmp_path: Path) -> None:
    payloads = [os.urandom(n) for n in (0, 1, 4095, 3 * HIGH_WATER + 7, 100)]
    stream = b"".join(frames.encode(b'{"n":%d}' % i, p) + b"\n" for i, p in enumerate(payloads)) + b'{"last":1}\n'

    async def serve(writer: asyncio.StreamWriter) -> None:
        for cut in range(0, len(stream), 65521):  # pieces that split headers, payloads and lines
            writer.write(stream[cut : cut + 65521])
            await writer.drain()

    async with connected(tmp_path, serve) as sock:
        for i, payload in enumerate(payloads):
            frame = await frames.read_frame(sock, 1 << 30)
            assert frame is not None and frame.message == b'{"n":%d}' % i
            assert frame.payload is not None and bytes(frame.payload) == payload
        last = await frames.read_frame(sock, 1 << 30)
        assert last == frames.Frame(b'{"last":1}')
        assert await frames.read_frame(sock, 1 << 30) is None  # EOF


async def test_a_line_over_the_limit_is_refused(tmp_path: Path) -> None:
    async def serve(writer: asyncio.StreamWriter) -> None:
        writer.write(b"x" * 5000)  # no newline: a line that never ends
        await writer.drain()

    async with connected(tmp_path, serve, limit=4096) as sock:
        with pytest.raises(ValueError, match="over 4096 bytes"):
            await sock.readline()


async def test_eof_inside_a_payload_is_an_incomplete_read(tmp_path: Path) -> None:
    async def serve(writer: asyncio.StreamWriter) -> None:
        writer.write(frames.payload_header(1000) + b"y" * 600)
        await writer.drain()

    async with connected(tmp_path, serve) as sock:
        with pytest.raises(asyncio.IncompleteReadError) as caught:
            await frames.read_frame(sock, 1 << 20)
        assert caught.value.partial == b"y" * 600 and caught.value.expected == 1000


async def test_every_writer_waiting_for_room_is_released(tmp_path: Path) -> None:
    """The heartbeat and a request may both wait for room: neither may be forgotten."""
    reading = asyncio.Event()
    got = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal got
        await reading.wait()  # the client's writes pile up first
        while chunk := await reader.read(1 << 20):
            got += len(chunk)
        writer.close()

    path = os.fspath(tmp_path / "s")
    server = await asyncio.start_unix_server(handle, path)
    try:
        _, sock = await asyncio.get_running_loop().create_unix_connection(lambda: FrameSocket(1 << 20), path)
        sock.write(b"x" * (32 << 20))  # past the kernel's and the transport's buffers: writing pauses
        drains = [asyncio.ensure_future(sock.drain()) for _ in range(2)]
        await asyncio.sleep(0)  # both are waiting (one step of the loop, not a wait for time)
        assert not any(d.done() for d in drains)
        reading.set()
        async with asyncio.timeout(60):
            await asyncio.gather(*drains)
        sock.write_eof()
        async with asyncio.timeout(60):
            assert await sock.read() == b""  # the server read it all and closed its half
        sock.close()
        assert got == 32 << 20
    finally:
        server.close()


async def test_read_without_a_size_reads_to_eof(tmp_path: Path) -> None:
    """As ``StreamReader.read()``: a probe's whole answer, however it arrives (it once gave the
    first piece only, and a podman probe's answer was cut)."""
    body = os.urandom(3 * HIGH_WATER + 11)

    async def serve(writer: asyncio.StreamWriter) -> None:
        for cut in range(0, len(body), 100_003):
            writer.write(body[cut : cut + 100_003])
            await writer.drain()

    async with connected(tmp_path, serve) as sock:
        assert await sock.read() == body
        assert await sock.read() == b""


async def test_a_host_process_stdout_is_a_socket_read_to_its_end() -> None:
    """The channels' host processes (``docker exec``...): their stdout is a socket read by this
    reader; every byte arrives, then EOF, and the exit status."""
    from remote_exec.sandboxes.hostproc import spawn_host

    script = "[ -S /proc/self/fd/1 ] && echo socket; head -c 5000000 /dev/zero | tr '\\0' x; cat; exit 3"
    proc = await spawn_host(["sh", "-c", script])
    assert proc.stdin is not None
    proc.stdin.write(b"through stdin\n")
    proc.stdin.close()
    assert await proc.stdout.read() == b"socket\n" + b"x" * 5_000_000 + b"through stdin\n"
    assert await proc.wait() == 3


async def test_what_a_sandbox_prints_for_a_probe_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A probe, an upload's check or a read-back (``exec_capture``) reads in pieces up to a bound:
    a sandbox that prints forever is refused, not held in the host's memory."""
    from collections.abc import Sequence

    from remote_exec.client.channel import Channel, PipeProcess
    from remote_exec.errors import ProtocolError
    from remote_exec.sandboxes import base
    from remote_exec.sandboxes.hostproc import spawn_host

    class OnThisHost(base.ExecTransport):  # the processes are this host's: the bound is what is tested
        url = "host://"

        async def spawn(self, argv: Sequence[str]) -> PipeProcess:
            return await spawn_host(argv)

        async def open_channel(self) -> Channel:
            raise NotImplementedError

    monkeypatch.setattr(base, "MAX_CAPTURE", 1 << 20)
    host = OnThisHost()
    assert await host.exec_capture(["sh", "-c", "head -c 1048576 /dev/zero; exit 4"]) == (4, bytes(1 << 20))
    with pytest.raises(ProtocolError, match="yes in host:// answered more than 1048576 bytes"):
        await host.exec_capture(["yes"])


async def test_payloads_stay_whole_while_later_ones_reuse_the_buffer(tmp_path: Path) -> None:
    """Payloads are read into a reused buffer: each one handed out must be a copy of its own,
    unchanged by the payloads read after it, on this connection or on another one."""
    sizes = [3 * HIGH_WATER, 5, HIGH_WATER + 3, 2 * HIGH_WATER, 0, 7 * HIGH_WATER // 2]
    sent = {tag: [os.urandom(n) for n in sizes] for tag in (b"a", b"b")}

    def serve_for(tag: bytes) -> Serve:
        async def serve(writer: asyncio.StreamWriter) -> None:
            for payload in sent[tag]:
                writer.write(frames.encode(tag, payload) + b"\n")
                await writer.drain()

        return serve

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with connected(tmp_path / "a", serve_for(b"a")) as a, connected(tmp_path / "b", serve_for(b"b")) as b:
        got: dict[bytes, list[bytes]] = {b"a": [], b"b": []}

        async def read_all(sock: FrameSocket, tag: bytes) -> None:
            for _ in sizes:
                frame = await frames.read_frame(sock, 1 << 30)
                assert frame is not None and frame.message == tag and frame.payload is not None
                assert type(frame.payload) is bytes
                got[tag].append(frame.payload)

        await asyncio.gather(read_all(a, b"a"), read_all(b, b"b"))
    assert got == sent
