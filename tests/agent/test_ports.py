"""The agent's port controller against real TCP servers: cursors, back-pressure, ends, limits.

These drive :class:`PortController` in-process (its own event loop, real sockets), so limits
can be made small; the whole tunnel, through a real agent and channel, is tests/client/test_ports.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

import remote_exec as rx
from remote_exec.agent.ports.controller import PortController, PortLimits
from remote_exec.agent.rpc import WithPayload
from remote_exec.protocol import (
    Empty,
    PortConnectParams,
    PortIdParams,
    PortRecvParams,
    PortRecvResult,
    PortSendParams,
)

pytestmark = pytest.mark.anyio

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[int]:
    """A TCP server on 127.0.0.1 running ``handler`` per connection; yields its port.

    On exit every handler is cancelled and its socket closed (none outlives the test).
    """
    tasks: set[asyncio.Task[None]] = set()
    writers: list[asyncio.StreamWriter] = []

    async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        await handler(reader, writer)

    def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tasks.add(asyncio.get_running_loop().create_task(run(reader, writer)))

    server = await asyncio.start_server(accepted, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        for writer in writers:
            writer.transport.abort()
        await asyncio.sleep(0)  # let the aborts finish


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def ctl() -> AsyncIterator[PortController]:
    c = PortController("inst", PortLimits(buffer_limit=256 * 1024, write_buffer=64 * 1024))
    yield c
    await c.aclose()


async def recv(ctl: PortController, conn_id: str, offset: int, wait: float = 5.0) -> tuple[PortRecvResult, bytes]:
    out = await ctl.recv(PortRecvParams(conn_id=conn_id, offset=offset, wait=wait, max_bytes=1 << 20))
    if isinstance(out, WithPayload):
        assert isinstance(out.result, PortRecvResult)
        return out.result, bytes(out.payload)
    assert isinstance(out, PortRecvResult)
    return out, b""


async def recv_all(ctl: PortController, conn_id: str, offset: int = 0) -> tuple[bytes, PortRecvResult]:
    parts = []
    while True:
        res, data = await recv(ctl, conn_id, offset)
        parts.append(data)
        offset = res.offset
        if res.eof:
            return b"".join(parts), res


async def test_send_and_recv_are_idempotent_by_offset(ctl: PortController) -> None:
    got: list[bytes] = []

    async def echo_upper(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read()  # to EOF: the host's half-close
        got.append(data)
        writer.write(data.upper())
        writer.close()

    async with serving(echo_upper) as port:
        info = await ctl.connect(PortConnectParams(port=port))
        cid = info.conn_id
        assert (info.state, info.sent, info.received, cid) == ("open", 0, 0, "inst-p1")
        assert (await ctl.send(PortSendParams(conn_id=cid, offset=0), memoryview(b"hello"))).offset == 5
        assert (await ctl.send(PortSendParams(conn_id=cid, offset=0), memoryview(b"hello"))).offset == 5  # a retry
        res = await ctl.send(PortSendParams(conn_id=cid, offset=3, eof=True), memoryview(b"lo world"))  # overlaps
        assert (res.offset, res.eof) == (11, True)
        assert (await ctl.send(PortSendParams(conn_id=cid, offset=3, eof=True), memoryview(b"lo world"))).offset == 11
        with pytest.raises(rx.InvalidParamsError, match="past the 11 bytes"):
            await ctl.send(PortSendParams(conn_id=cid, offset=12), memoryview(b"x"))
        with pytest.raises(rx.InvalidParamsError, match="after EOF"):
            await ctl.send(PortSendParams(conn_id=cid, offset=11), memoryview(b"x"))
        data, end = await recv_all(ctl, cid)
        assert data == b"HELLO WORLD" and end.error is None and got == [b"hello world"]
        again, replay = await recv(ctl, cid, 6)  # a retried receive gets the same bytes
        assert (replay, again.offset, again.eof) == (b"WORLD", 11, True)
        with pytest.raises(rx.InvalidParamsError, match="past the 11 bytes"):
            await recv(ctl, cid, 12)
        closed = await ctl.close(PortIdParams(conn_id=cid))
        assert (closed.state, closed.sent, closed.received, closed.closed_reason) == (
            "closed",
            11,
            11,
            "both directions ended",
        )
        assert (await ctl.close(PortIdParams(conn_id=cid))).state == "closed"  # idempotent


async def test_reading_pauses_while_the_host_does_not_acknowledge(ctl: PortController) -> None:
    total = 8 * 1024 * 1024  # 32x the connection's buffer
    payload = os.urandom(total)
    sent = asyncio.Event()

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(payload)
        await writer.drain()
        sent.set()
        writer.close()

    async with serving(flood) as port:
        cid = (await ctl.connect(PortConnectParams(port=port))).conn_id
        # Nobody receives: the agent must stop reading, not buffer 8 MiB.
        async with asyncio.timeout(30):
            while not (info := (await ctl.list(Empty())).conns[0]).reading_paused:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert info.reading_paused and info.buffered <= 256 * 1024 + 256 * 1024  # the limit, plus one read
        assert not sent.is_set()  # the sender is held back by TCP
        data, end = await recv_all(ctl, cid)
        assert data == payload and end.error is None  # and nothing was dropped
        assert sent.is_set()


async def test_a_send_takes_nothing_while_the_target_does_not_read(ctl: PortController) -> None:
    release = asyncio.Event()

    async def stuck(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await release.wait()
        await reader.read()
        writer.close()

    async with serving(stuck) as port:
        cid = (await ctl.connect(PortConnectParams(port=port))).conn_id
        chunk = memoryview(os.urandom(1024 * 1024))
        offset = 0
        for _ in range(64):  # far more than the socket buffers and the write buffer hold
            res = await ctl.send(PortSendParams(conn_id=cid, offset=offset, wait=0.2), chunk)
            if res.offset == offset:
                break
            offset = res.offset
        else:
            raise AssertionError("the agent took 64 MiB for a target that reads nothing")
        assert offset < 32 * 1024 * 1024
        release.set()
        res = await ctl.send(PortSendParams(conn_id=cid, offset=offset, wait=5.0), chunk)
        assert res.offset == offset + len(chunk)  # taken as soon as the target reads


async def test_half_close_each_way(ctl: PortController) -> None:
    async def ask_then_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"first ")
        writer.write_eof()  # the target ends its direction first and keeps reading
        question = await reader.read()
        writer.transport.close()
        assert question == b"late question"

    async with serving(ask_then_answer) as port:
        cid = (await ctl.connect(PortConnectParams(port=port))).conn_id
        data, end = await recv_all(ctl, cid)
        assert (data, end.eof, end.error) == (b"first ", True, None)
        res = await ctl.send(PortSendParams(conn_id=cid, offset=0, eof=True), memoryview(b"late question"))
        assert (res.offset, res.eof) == (13, True)


async def test_a_reset_is_reported_as_an_error(ctl: PortController) -> None:
    async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"partial")
        await writer.drain()
        await asyncio.sleep(0.1)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # close with linger 0: an RST, not a FIN

    async with serving(reset) as port:
        cid = (await ctl.connect(PortConnectParams(port=port))).conn_id
        data, end = await recv_all(ctl, cid)
        assert data == b"partial" and end.error is not None and "reset" in end.error
        with pytest.raises(rx.PortClosedError, match="reset") as info:
            await ctl.send(PortSendParams(conn_id=cid, offset=0), memoryview(b"more"))
        assert info.value.conn_id == cid


async def test_connect_errors_are_precise(ctl: PortController) -> None:
    port = free_port()
    with pytest.raises(rx.PortConnectError, match=r"Connection refused \(ECONNREFUSED\)") as refused:
        await ctl.connect(PortConnectParams(port=port))
    assert refused.value.data == {"host": "127.0.0.1", "port": port, "errno": 111, "errno_name": "ECONNREFUSED"}
    for host in ("10.1.2.3", "192.0.2.1", "::ffff:10.0.0.1"):
        with pytest.raises(rx.PortConnectError, match="not a loopback address") as refused:
            await ctl.connect(PortConnectParams(port=80, host=host))
        assert refused.value.data["reason"] == "not_allowed"
    with pytest.raises(rx.PortConnectError, match="cannot resolve"):
        await ctl.connect(PortConnectParams(port=80, host="no-such-host.invalid"))
    assert (await ctl.list(Empty())).conns == []


async def test_loopback_names_and_idempotent_connect(ctl: PortController) -> None:
    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        writer.close()

    async with serving(hold) as port:
        a = await ctl.connect(PortConnectParams(port=port, host="localhost", idempotency_key="k"))
        b = await ctl.connect(PortConnectParams(port=port, host="localhost", idempotency_key="k"))
        assert a.conn_id == b.conn_id and len((await ctl.list(Empty())).conns) == 1
        with pytest.raises(rx.PortConnectError, match="Connection refused"):  # allowed (all of 127/8), not served
            await ctl.connect(PortConnectParams(port=port, host="127.0.0.2"))


async def test_limits_idle_expiry_and_unknown_ids() -> None:
    now = [1000.0]  # a fake monotonic clock: the TTL passes when the test says so
    ctl = PortController("inst", PortLimits(max_open=2, idle_ttl=0.2), clock=lambda: now[0])

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        writer.close()

    try:
        async with serving(hold) as port:
            first = (await ctl.connect(PortConnectParams(port=port))).conn_id
            await ctl.connect(PortConnectParams(port=port))
            with pytest.raises(rx.ServerBusyError):
                await ctl.connect(PortConnectParams(port=port))
            now[0] += 0.1
            ctl.expire_idle()
            assert [c.state for c in (await ctl.list(Empty())).conns] == ["open", "open"]
            now[0] += 0.15
            ctl.expire_idle()
            info = (await ctl.list(Empty())).conns[0]
            assert (info.state, info.closed_reason) == ("closed", "unused for 0.2 s")
            res, _ = await recv(ctl, first, 0)
            assert res.eof and res.error == "unused for 0.2 s"
            with pytest.raises(rx.PortClosedError, match="unused"):
                await ctl.send(PortSendParams(conn_id=first, offset=0), memoryview(b"x"))
            await ctl.connect(PortConnectParams(port=port))  # closed ones no longer count
            with pytest.raises(rx.PortNotFoundError) as missing:
                await ctl.close(PortIdParams(conn_id="inst-p99"))
            assert missing.value.conn_id == "inst-p99"
            with pytest.raises(rx.AgentLostError, match="belonged to agent instance gone"):
                await ctl.close(PortIdParams(conn_id="gone-p1"))
    finally:
        await ctl.aclose()
