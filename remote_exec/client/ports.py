"""``PortForward``: a listener on the host's loopback tunnelled to a TCP port inside the sandbox.

Like ``kubectl port-forward``: every connection accepted on ``127.0.0.1:<local_port>`` makes the
agent open a connection to ``127.0.0.1:<remote_port>`` inside the sandbox (``port_connect``),
and two pumps carry the bytes over the sandbox's one agent channel, so a server in a sandbox
without any network (a ``jail://``, a ``docker+image://`` with ``network=none``) is reachable
from the host, its notebook and its browser.

- host → sandbox: what the local client sends is read in chunks of up to 1 MiB and sent with
  ``port_send`` at a byte offset (a retry never writes twice); the next chunk gathers while one
  is in flight. The agent takes data only while its socket's write buffer has room, so a
  target that does not read stops the client (TCP back-pressure, end to end).
- sandbox → host: ``port_recv`` long-polls by receive cursor, the next call already on its way
  while the last answer is written out; a local reader that does not read stops the polls, and
  the agent then stops reading from the target once its bounded buffer is half full.
- Ends: an EOF on either side is passed on as a half-close (``shutdown(SHUT_WR)``), so "closing
  either side closes the other" while the other direction may still finish; a reset, a refused
  connect or a broken channel aborts the local connection (the client sees a reset, never a
  hang) and closes the agent's side.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from types import TracebackType
from typing import Literal

import anyio

from ..errors import PortClosedError, ProtocolError, RemoteExecError, SandboxError, TransportError
from ..protocol import (
    DEFAULT_MAX_BYTES,
    Empty,
    Method,
    PortConnectParams,
    PortConnInfo,
    PortIdParams,
    PortListResult,
    PortRecvParams,
    PortRecvResult,
    PortSendParams,
    PortSendResult,
)
from .core import SandboxCore
from .rpc import RpcClient

__all__ = ["PortForward"]

log = logging.getLogger("remote_exec.ports")

LOCAL_HOST = "127.0.0.1"
CHUNK = 1024 * 1024  # bytes read from a local client per port_send at most
MAX_RECV = 4 * 1024 * 1024  # the largest port_recv a fast download grows to
RECV_WAIT = 25.0  # long-poll of one port_recv (the agent caps it at 30 s)
SEND_WAIT = 10.0  # how long the agent may wait for room in its write buffer per port_send
CONNECT_TIMEOUT = 10.0
CLOSE_TIMEOUT = 5.0  # for the port_close of each connection when a tunnel ends


class PortForward:
    """A TCP listener on ``127.0.0.1`` whose connections are tunnelled into the sandbox.

    Made by :meth:`AsyncSandbox.forward_port`; ``async with`` starts and closes it::

        async with sb.forward_port(8000) as fwd:   # a server in the sandbox on 127.0.0.1:8000
            print(fwd.url)                           # http://127.0.0.1:<local_port>
            IFrame(fwd.url, width=800, height=600)   # str(fwd) is the URL too

    The listener binds ``127.0.0.1`` only (never another interface: the sandbox is not exposed
    to the network). Any number of connections may be open at once, each a separate TCP
    connection inside the sandbox. A connection the agent cannot make (nothing listens, or a
    target that is not loopback) is closed at once with a reset; the reason is in
    :attr:`last_error` and logged on the ``remote_exec.ports`` logger.

    Closing (leaving ``async with``, :meth:`aclose`, or closing the sandbox) stops the listener
    and closes every tunnelled connection at both ends. It is shielded from cancellation, so
    cancelling the task inside ``async with`` still leaves nothing open (within a few seconds
    even if the agent does not answer).

    :ivar remote_port: the port inside the sandbox.
    :ivar remote_host: the address inside the sandbox (loopback unless the agent allows more).
    :ivar last_error: the last reason a tunnelled connection failed, or ``None``.
    :ivar accepted: connections accepted so far.
    """

    def __init__(
        self, core: SandboxCore, remote_port: int, local_port: int = 0, *, remote_host: str = LOCAL_HOST
    ) -> None:
        if not 1 <= remote_port <= 65535:
            raise ValueError(f"remote_port must be in 1..65535, not {remote_port}")
        if not 0 <= local_port <= 65535:
            raise ValueError(f"local_port must be in 0..65535 (0: any free port), not {local_port}")
        self._core = core
        self.remote_port = remote_port
        self.remote_host = remote_host
        self._requested_port = local_port
        self._local_port: int | None = None
        self._server: asyncio.Server | None = None
        self._tunnels: set[asyncio.Task[None]] = set()
        self._conn_ids: set[str] = set()
        self._state: Literal["new", "open", "closed"] = "new"
        self.last_error: BaseException | None = None
        self.accepted = 0

    # -- addresses ------------------------------------------------------------------------

    @property
    def local_port(self) -> int:
        """The port the listener is bound to on ``127.0.0.1``.

        :raises RuntimeError: the forward has not been started.
        """
        if self._local_port is None:
            raise RuntimeError("the port forward is not started: use `async with sb.forward_port(...)`")
        return self._local_port

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<local_port>`` (also ``str(forward)``)."""
        return f"http://{LOCAL_HOST}:{self.local_port}"

    @property
    def address(self) -> tuple[str, int]:
        """``("127.0.0.1", local_port)``: where to connect a plain TCP client."""
        return LOCAL_HOST, self.local_port

    @property
    def active(self) -> int:
        """Connections being tunnelled now."""
        return len(self._tunnels)

    @property
    def closed(self) -> bool:
        """True once :meth:`aclose` was called."""
        return self._state == "closed"

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        local = self._local_port if self._local_port is not None else "?"
        return (
            f"<PortForward {LOCAL_HOST}:{local} -> {self.remote_host}:{self.remote_port} in "
            f"{self._core.url} {self._state}, {self.active} active>"
        )

    # -- lifetime -------------------------------------------------------------------------

    async def start(self) -> PortForward:
        """Bind the listener and start accepting; return ``self``. Called by ``async with``.

        :raises SandboxError: the sandbox's agent is too old to forward ports.
        :raises OSError: the local port cannot be bound (e.g. in use).
        :raises RuntimeError: the forward was already started, or the sandbox is not open.
        """
        if self._state != "new":
            raise RuntimeError(f"this port forward is {self._state}; make a new one with sb.forward_port()")
        self._core.check_open()
        if "ports" not in self._core.info.capabilities:
            raise SandboxError(
                f"the agent in {self._core.url} (version {self._core.info.version}) cannot forward ports; "
                "update remote-exec in the sandbox"
            )
        self._server = await asyncio.start_server(self._accepted, LOCAL_HOST, self._requested_port, limit=CHUNK)
        self._local_port = int(self._server.sockets[0].getsockname()[1])
        self._state = "open"
        self._core.close_with(self)
        return self

    async def __aenter__(self) -> PortForward:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop listening and close every tunnelled connection, here and in the sandbox.

        Idempotent; shielded from cancellation.
        """
        if self._state == "closed":
            return
        self._state = "closed"
        with anyio.CancelScope(shield=True):
            if self._server is not None:
                self._server.close()
            tunnels = list(self._tunnels)
            for task in tunnels:
                task.cancel()
            if tunnels:
                await asyncio.wait(tunnels)  # each closes its two ends (bounded by CLOSE_TIMEOUT)
            if self._server is not None:
                with anyio.move_on_after(CLOSE_TIMEOUT):
                    await self._server.wait_closed()
            self._core.forget(self)

    async def connections(self) -> list[PortConnInfo]:
        """The agent's view of this forward's open connections (bytes each way, buffered...)."""
        ids = set(self._conn_ids)
        result = await self._core.rpc.call(Method.PORT_LIST, Empty(), PortListResult)
        return [c for c in result.conns if c.conn_id in ids]

    # -- tunnels --------------------------------------------------------------------------

    def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._state != "open":
            writer.transport.abort()
            return
        self.accepted += 1
        writer.transport.set_write_buffer_limits(high=CHUNK)
        task = asyncio.get_running_loop().create_task(self._tunnel(reader, writer))
        self._tunnels.add(task)
        task.add_done_callback(self._tunnels.discard)

    def _failed(self, exc: BaseException, level: int = logging.INFO) -> None:
        self.last_error = exc
        log.log(level, "%s: a tunnelled connection failed: %s", self, exc)

    async def _tunnel(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Carry one local connection both ways until both directions end, or one side fails."""
        conn_id: str | None = None
        clean = False
        rpc: RpcClient | None = None
        params: PortConnectParams | None = None  # set while a port_connect may be under way unanswered
        try:
            rpc = self._core.rpc
            params = PortConnectParams(
                port=self.remote_port,
                host=self.remote_host,
                timeout=CONNECT_TIMEOUT,
                idempotency_key=secrets.token_hex(8),
            )
            margin = self._core.response_margin
            info = await rpc.call(Method.PORT_CONNECT, params, PortConnInfo, timeout=CONNECT_TIMEOUT + margin)
            params = None
            conn_id = info.conn_id
            self._conn_ids.add(conn_id)
            clean = await self._pump(rpc, conn_id, reader, writer)
        except (RemoteExecError, OSError, RuntimeError) as exc:
            # RuntimeError: the sandbox was closed under the forward
            if not isinstance(exc, TransportError):
                params = None  # the agent answered: it made no connection
            self._failed(exc, logging.WARNING if conn_id is None else logging.INFO)
        finally:
            with anyio.CancelScope(shield=True):
                if clean:
                    writer.close()
                else:
                    writer.transport.abort()  # the client sees a reset: something went wrong
                if params is not None and rpc is not None:
                    # Cancelled (or cut off) while the agent was connecting: the connection it
                    # makes would have nobody to close it. Asking again with the same key
                    # returns that connection (waiting for the connect to end), to close below.
                    with anyio.move_on_after(CLOSE_TIMEOUT), contextlib.suppress(RemoteExecError, RuntimeError):
                        late = await rpc.call(Method.PORT_CONNECT, params, PortConnInfo, timeout=CLOSE_TIMEOUT)
                        conn_id = late.conn_id
                if conn_id is not None and rpc is not None:
                    with anyio.move_on_after(CLOSE_TIMEOUT), contextlib.suppress(RemoteExecError):
                        await rpc.call(Method.PORT_CLOSE, PortIdParams(conn_id=conn_id), PortConnInfo)
                    self._conn_ids.discard(conn_id)

    async def _pump(
        self, rpc: RpcClient, conn_id: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Both directions at once; True when both ended cleanly (EOF each way)."""
        loop = asyncio.get_running_loop()
        up = loop.create_task(self._upstream(rpc, conn_id, reader))
        down = loop.create_task(self._downstream(rpc, conn_id, writer))
        try:
            pending: set[asyncio.Task[bool]] = {up, down}
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if not task.result():  # raises what the pump raised
                        return False
            return True
        finally:
            with anyio.CancelScope(shield=True):
                for task in (up, down):
                    task.cancel()
                await asyncio.wait({up, down})

    async def _upstream(self, rpc: RpcClient, conn_id: str, reader: asyncio.StreamReader) -> bool:
        """Local client → target; ends after passing the client's EOF on."""
        margin = self._core.response_margin
        offset = 0  # bytes the agent has taken
        while True:
            data = await reader.read(CHUNK)
            eof = not data
            start, end = offset, offset + len(data)
            view = memoryview(data)
            while True:  # until the agent has taken all of it (it takes nothing while the target is full)
                params = PortSendParams(conn_id=conn_id, offset=offset, eof=eof, wait=SEND_WAIT)
                piece = view[offset - start :]
                res = await rpc.call(
                    Method.PORT_SEND,
                    params,
                    PortSendResult,
                    payload=piece if piece else None,
                    timeout=SEND_WAIT + margin,
                )
                if not offset <= res.offset <= end:
                    raise ProtocolError(f"port_send answered offset {res.offset}, expected {offset}..{end}")
                offset = res.offset
                if offset == end and (res.eof or not eof):
                    break
            if eof:
                return True

    async def _downstream(self, rpc: RpcClient, conn_id: str, writer: asyncio.StreamWriter) -> bool:
        """Target → local client; ends after passing the target's EOF on (False: it was a reset)."""
        margin = self._core.response_margin
        loop = asyncio.get_running_loop()
        offset = 0  # bytes received (and acknowledged by the next port_recv)
        max_bytes = DEFAULT_MAX_BYTES

        def recv(at: int) -> asyncio.Task[tuple[PortRecvResult, memoryview | None]]:
            params = PortRecvParams(conn_id=conn_id, offset=at, wait=RECV_WAIT, max_bytes=max_bytes)
            return loop.create_task(
                rpc.call_with_payload(Method.PORT_RECV, params, PortRecvResult, timeout=RECV_WAIT + margin)
            )

        task = recv(0)
        try:
            while True:
                res, payload = await task
                got = len(payload) if payload is not None else 0
                if res.offset - offset != got:
                    raise ProtocolError(f"port_recv moved the cursor {offset} -> {res.offset} with {got} bytes")
                offset = res.offset
                if res.eof:
                    if payload:
                        writer.write(payload)
                    if res.error is not None:
                        self._failed(PortClosedError(res.error, conn_id=conn_id))
                        return False
                    if writer.can_write_eof():
                        writer.write_eof()
                    await writer.drain()
                    return True
                if got * 10 >= max_bytes * 9:  # a fast sender: fewer, bigger answers
                    max_bytes = min(max_bytes * 2, MAX_RECV)
                task = recv(offset)  # the agent reads on while this piece is written out
                if payload:
                    writer.write(payload)
                    await writer.drain()  # a slow local reader holds the next call back
        finally:
            if not task.done():
                task.cancel()
                with anyio.CancelScope(shield=True), contextlib.suppress(BaseException):
                    await task
