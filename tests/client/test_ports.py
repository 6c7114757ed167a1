"""Port forwarding end to end: host listener → agent channel → a real server in the sandbox.

Over every channel kind of ``local://``; the no-network sandboxes (``jail://``,
``docker+image://``) are in tests/sandboxes/test_ports.py, the browser in tests/jupyter.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import socket
import struct
import sys
import urllib.request
from pathlib import Path

import anyio
import pytest

import remote_exec as rx
from remote_exec.client.channel import StdioChannel
from remote_exec.protocol import Empty, Method, PortListResult

from ..conftest import relay_pid
from ..portserver import SandboxServer, fetch_sha256, pattern

pytestmark = pytest.mark.anyio


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def read_to_eof(reader: asyncio.StreamReader) -> bytes:
    """Everything until EOF; a reset counts as the end too (the caller checks what it got)."""
    with contextlib.suppress(ConnectionResetError):
        return await reader.read()
    return b""


async def refused(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except ConnectionRefusedError:
        return True
    writer.close()
    return False


async def test_downloads_50_mb_byte_exact(url: str, tmp_path: Path) -> None:
    blob = os.urandom(50 * 1024 * 1024)
    (tmp_path / "big.bin").write_bytes(blob)
    (tmp_path / "index.html").write_text("<h1>hello from the sandbox</h1>")
    argv = [sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory", str(tmp_path)]
    async with rx.open_sandbox(url) as sb:
        server = await SandboxServer.start(sb, argv)
        async with sb.forward_port(server.port) as fwd:
            assert str(fwd) == fwd.url == f"http://127.0.0.1:{fwd.local_port}" and fwd.local_port != server.port
            assert await fetch_sha256(f"{fwd}/big.bin") == (len(blob), hashlib.sha256(blob).hexdigest())
            page = b"<h1>hello from the sandbox</h1>"
            assert await fetch_sha256(fwd.url) == (len(page), hashlib.sha256(page).hexdigest())
            assert fwd.accepted == 2 and fwd.last_error is None
        await server.stop()


async def test_concurrent_connections_each_byte_exact(url: str) -> None:
    async with rx.open_sandbox(url) as sb:
        server = await SandboxServer.python(sb, "echo")
        async with sb.forward_port(server.port) as fwd:

            async def echo(size: int) -> bytes:
                reader, writer = await asyncio.open_connection(*fwd.address)
                data = os.urandom(size)

                async def send() -> None:
                    for i in range(0, size, 100_000):  # in pieces, while the echo streams back
                        writer.write(data[i : i + 100_000])
                        await writer.drain()
                    writer.write_eof()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(send)
                    back = await reader.read()
                writer.close()
                assert back == data
                return back

            sizes = [1 + 997 * i for i in range(1, 9)] + [1024 * 1024 + i for i in range(8)]
            with anyio.fail_after(60):
                await asyncio.gather(*(echo(n) for n in sizes))
            for n in sizes:
                await server.wait_for(f"eof after {n} bytes")
            assert fwd.accepted == len(sizes) and fwd.last_error is None
            with anyio.fail_after(5):
                # every tunnel closed, at both ends (nothing to wait on: the agent is asked again)
                while (await fwd.connections()) or fwd.active:  # noqa: ASYNC110
                    await anyio.sleep(0.02)
        await server.stop()


async def test_a_slow_reader_holds_the_sender_back_and_loses_nothing(url: str) -> None:
    size = 48 * 1024 * 1024
    async with rx.open_sandbox(url) as sb:
        server = await SandboxServer.python(sb, "flood", str(size))
        async with sb.forward_port(server.port) as fwd:
            reader, writer = await asyncio.open_connection(*fwd.address)
            head = await reader.readexactly(1000)  # the tunnel is up; now stop reading
            with anyio.fail_after(10):  # the agent stops reading from the server (asked, not signalled)
                while not (conns := await fwd.connections()) or not conns[0].reading_paused:  # noqa: ASYNC110
                    await anyio.sleep(0.05)
            with anyio.fail_after(30):  # and stays stopped: paused twice running, having received nothing between
                (conn,) = await fwd.connections()
                while True:
                    (again,) = await fwd.connections()
                    if conn.reading_paused and again.reading_paused and again.received == conn.received:
                        break
                    conn = again
            # It holds at most its buffer (4 MiB) for the host, which holds one answer in flight
            # and its write buffer; the rest is in socket buffers, the server is blocked.
            assert conn.reading_paused and conn.buffered <= 4 * 1024 * 1024 + 256 * 1024, conn
            assert conn.received < 24 * 1024 * 1024, conn  # far from the 48 MiB the server wants to send
            rest = await reader.read()
            writer.close()
            assert head + rest == pattern(size)
            await server.wait_for("flooded")
        await server.stop()


async def test_a_killed_channel_loses_no_byte_either_way(agent_dir: Path) -> None:
    # Every port call is a cursor call: the client retries whatever the dead relay swallowed.
    async with rx.open_sandbox(f"local://?dir={agent_dir}&channel=stdio") as sb:
        channel = sb._core.rpc.channel
        assert isinstance(channel, StdioChannel)
        echo = await SandboxServer.python(sb, "echo")
        async with sb.forward_port(echo.port) as fwd:
            reader, writer = await asyncio.open_connection(*fwd.address)
            data = os.urandom(8 * 1024 * 1024)
            relays = []

            async def send() -> None:
                for i in range(0, len(data), 256 * 1024):
                    writer.write(data[i : i + 256 * 1024])
                    await writer.drain()
                    if i == 3 * 1024 * 1024:  # mid-stream, with calls in flight both ways
                        relay = channel.process
                        assert relay is not None
                        relays.append(relay_pid(relay))
                        relay.kill()  # kill -9 of the host-side channel process
                writer.write_eof()

            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(send)
                    back = await reader.read()
            writer.close()
            assert back == data and fwd.last_error is None
            assert channel.process is not None and relay_pid(channel.process) not in relays
        await echo.stop()


async def test_closing_either_side_closes_the_other(url: str) -> None:
    async with rx.open_sandbox(url) as sb:
        bye = await SandboxServer.python(sb, "bye")
        echo = await SandboxServer.python(sb, "echo")
        async with sb.forward_port(bye.port) as to_bye, sb.forward_port(echo.port) as to_echo:
            with anyio.fail_after(10):
                # the server closes: the client reads what it sent, then EOF
                reader, writer = await asyncio.open_connection(*to_bye.address)
                assert await reader.read() == b"bye\n"
                writer.close()

                # the client half-closes: the server reads EOF, and its answer still arrives
                reader, writer = await asyncio.open_connection(*to_echo.address)
                writer.write(b"hi")
                writer.write_eof()
                assert await reader.read() == b"hi"
                await echo.wait_for("eof after 2 bytes")
                writer.close()

                # the client closes outright (a reset): the server's connection ends too
                reader, writer = await asyncio.open_connection(*to_echo.address)
                writer.write(b"abc")
                assert await reader.readexactly(3) == b"abc"
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
                await echo.wait_for(r"(eof|reset) after 3 bytes")
        await bye.stop()
        await echo.stop()


async def test_refused_and_forbidden_targets_close_the_client_at_once(url: str) -> None:
    async with rx.open_sandbox(url) as sb:
        nobody = free_port()
        async with sb.forward_port(nobody) as fwd:
            with anyio.fail_after(10):
                reader, writer = await asyncio.open_connection(*fwd.address)
                assert await read_to_eof(reader) == b""  # a reset, not a hang
                writer.close()
            assert isinstance(fwd.last_error, rx.PortConnectError)
            assert "Connection refused" in str(fwd.last_error) and fwd.last_error.data["port"] == nobody
        async with sb.forward_port(80, remote_host="192.0.2.1") as fwd:
            with anyio.fail_after(10):
                reader, writer = await asyncio.open_connection(*fwd.address)
                assert await read_to_eof(reader) == b""
                writer.close()
            assert isinstance(fwd.last_error, rx.PortConnectError)
            assert fwd.last_error.data["reason"] == "not_allowed"


async def test_closing_the_forward_closes_every_connection(url: str) -> None:
    async with rx.open_sandbox(url) as sb:
        echo = await SandboxServer.python(sb, "echo")
        fwd = await sb.forward_port(echo.port).start()
        readers = []
        for _ in range(3):
            reader, writer = await asyncio.open_connection(*fwd.address)
            writer.write(b"x")
            assert await reader.readexactly(1) == b"x"
            readers.append((reader, writer))
        ids = {c.conn_id for c in await fwd.connections()}
        assert len(ids) == 3 and fwd.active == 3
        with anyio.fail_after(10):
            await fwd.aclose()
            for reader, writer in readers:
                assert await read_to_eof(reader) == b""
                writer.close()
            await echo.wait_for(r"(?s)(?:(?:eof|reset) after 1 bytes.*){3}")  # the server saw all three end
        assert fwd.closed and fwd.active == 0 and await refused(fwd.local_port)
        listed = await sb._core.rpc.call(Method.PORT_LIST, Empty(), PortListResult)
        assert {c.conn_id: c.state for c in listed.conns if c.conn_id in ids} == dict.fromkeys(ids, "closed")
        await fwd.aclose()  # idempotent
        await echo.stop()


SLOW_ACCEPT = r"""
import socket, sys
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(0)  # one queued connection at most: further connects hang in SYN_SENT
filler = socket.create_connection(server.getsockname())
print("port", server.getsockname()[1], flush=True)
sys.stdin.readline()  # "go": accept from now on
server.accept()  # the filler
conn, _ = server.accept()
print("accepted", flush=True)
while conn.recv(65536):
    pass
print("forwarded connection closed", flush=True)
"""


def syn_sent_to(port: int) -> bool:
    """Whether a TCP connect to 127.0.0.1:port is hanging in SYN_SENT (from /proc/net/tcp)."""
    rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return any(r.split()[2] == f"0100007F:{port:04X}" and r.split()[3] == "02" for r in rows)


async def test_a_connect_in_flight_when_the_forward_closes_is_closed_too(url: str) -> None:
    # The agent is still connecting (the target's accept queue is full) when the forward closes:
    # the connection it makes afterwards must be closed at once, not left to the idle limit.
    async with rx.open_sandbox(url) as sb:
        job = sb.exec_remote([sys.executable, "-u", "-c", SLOW_ACCEPT], stdin_open=True)
        server = await SandboxServer.start(job)
        fwd = await sb.forward_port(server.port).start()
        reader, writer = await asyncio.open_connection(*fwd.address)
        with anyio.fail_after(10):
            while not syn_sent_to(server.port):  # noqa: ASYNC110 (kernel state: no event tells us)
                await anyio.sleep(0.01)
        closing = asyncio.ensure_future(fwd.aclose())
        with anyio.fail_after(10):
            assert await read_to_eof(reader) == b""  # the tunnel was cancelled mid-connect
        writer.close()
        await server.proc.write_stdin("go\n")
        await server.wait_for("accepted", timeout=15)  # the SYN is retried within ~1 s
        with anyio.fail_after(15):
            await closing
        await server.wait_for("forwarded connection closed", timeout=5)
        listed = await sb._core.rpc.call(Method.PORT_LIST, Empty(), PortListResult)
        assert [c.conn_id for c in listed.conns if c.state != "closed"] == []


async def test_cancellation_and_sandbox_close_end_forwards(url: str) -> None:
    async with rx.open_sandbox(url) as sb:
        echo = await SandboxServer.python(sb, "echo")
        ports: list[int] = []
        listening = anyio.Event()

        async def serve_forever() -> None:
            async with sb.forward_port(echo.port) as fwd:
                ports.append(fwd.local_port)
                listening.set()
                await anyio.sleep_forever()

        async with anyio.create_task_group() as tg:
            tg.start_soon(serve_forever)
            with anyio.fail_after(10):
                await listening.wait()
            assert not await refused(ports[0])
            tg.cancel_scope.cancel()
        assert await refused(ports[0])
        kept = await sb.forward_port(echo.port).start()
        reader, writer = await asyncio.open_connection(*kept.address)
        await echo.stop()
    assert kept.closed and await refused(kept.local_port)  # closing the sandbox closed it
    assert await read_to_eof(reader) == b""
    writer.close()


async def test_bad_arguments_and_busy_local_port(url: str) -> None:
    async with rx.open_sandbox(url) as sb:
        with pytest.raises(ValueError, match="remote_port"):
            sb.forward_port(0)
        with pytest.raises(ValueError, match="local_port"):
            sb.forward_port(80, 70000)
        fwd = sb.forward_port(80)
        with pytest.raises(RuntimeError, match="not started"):
            _ = fwd.url
        async with fwd:
            with pytest.raises(OSError, match="in use"):
                await sb.forward_port(80, fwd.local_port).start()
            with pytest.raises(RuntimeError, match="open"):
                await fwd.start()


def test_blocking_twin(url: str, tmp_path: Path) -> None:
    (tmp_path / "hello.txt").write_text("hello through the tunnel\n")
    argv = [sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory", str(tmp_path)]
    with rx.connect(url) as sb:
        server = sb.exec_remote(argv)
        output = ""
        for ev in server:
            output += str(getattr(ev, "data", ""))
            if found := re.search(r"port (\d+)", output):
                break
        assert found is not None, output
        port = int(found.group(1))
        with sb.forward_port(port) as fwd:
            assert str(fwd) == fwd.url and fwd.remote_port == port
            with urllib.request.urlopen(f"{fwd.url}/hello.txt", timeout=10) as resp:
                assert resp.read() == b"hello through the tunnel\n"
            kept = sb.forward_port(port)
        assert fwd.closed and not kept.closed
        with urllib.request.urlopen(f"{kept.url}/hello.txt", timeout=10) as resp:
            assert resp.read() == b"hello through the tunnel\n"
        kept.close()
        assert kept.closed
        with pytest.raises(OSError):
            urllib.request.urlopen(kept.url, timeout=5)
        server.kill()
