"""The connection registry: typed operations behind the ``port_*`` JSON-RPC methods.

The agent connects only to loopback addresses inside the sandbox unless it was started with
``--port-any-host``: forwarding exists to reach a server running *in* the sandbox, and must not
turn the agent into a proxy into whatever network the sandbox can see. Connections die with
the agent, and one nobody has used for ``idle_ttl`` seconds is closed (its host went away).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import os
import socket
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from ...errors import AgentLostError, InvalidParamsError, PortConnectError, PortNotFoundError, ServerBusyError
from ...protocol import (
    Empty,
    PortConnectParams,
    PortConnInfo,
    PortIdParams,
    PortListResult,
    PortRecvParams,
    PortRecvResult,
    PortSendParams,
    PortSendResult,
)
from ..rpc import WithPayload
from .connection import PortConnection

__all__ = ["PortController", "PortLimits"]

MAX_KEYS = 1024  # idempotency keys remembered


@dataclass(frozen=True)
class PortLimits:
    """Bounds on tunnelled connections.

    :ivar buffer_limit: bytes held per connection for the host; reading from the target pauses
        while half of it is unacknowledged.
    :ivar write_buffer: bytes queued per connection towards the target before sends wait.
    :ivar max_send: largest payload one ``port_send`` may carry.
    :ivar max_open: connections at once; more get ``ServerBusyError``.
    :ivar idle_ttl: seconds a connection may go without any call before it is closed; 0: never.
    :ivar max_closed: closed connections remembered, so a late call gets a precise answer.
    :ivar any_host: connect to any address, not only loopback ones.
    """

    buffer_limit: int = 4 * 1024 * 1024
    write_buffer: int = 1024 * 1024
    max_send: int = 16 * 1024 * 1024
    max_open: int = 128
    idle_ttl: float = 300.0
    max_closed: int = 64
    any_host: bool = False


class PortController:
    """Owns every connection of one agent; ids are ``<instance>-p<n>``, never reused."""

    def __init__(
        self, instance_id: str, limits: PortLimits | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.instance_id = instance_id
        self._clock = clock  # monotonic seconds that ``idle_ttl`` is counted in (tests pass a fake one)
        self.limits = limits or PortLimits()
        self._conns: OrderedDict[str, PortConnection] = OrderedDict()
        self._by_key: OrderedDict[str, str] = OrderedDict()
        self._connecting: dict[str, asyncio.Future[PortConnInfo]] = {}
        self._counter = 0
        self._opening = 0  # connects between the limit check and registering
        self._reaper: asyncio.Task[None] | None = None

    @property
    def open_count(self) -> int:
        return sum(1 for c in self._conns.values() if not c.finished)

    def _get(self, conn_id: str) -> PortConnection:
        conn = self._conns.get(conn_id)
        if conn is not None:
            conn.touch()
            return conn
        instance, sep, _ = conn_id.rpartition("-p")
        if sep and instance != self.instance_id:
            raise AgentLostError(
                f"connection {conn_id} belonged to agent instance {instance}, which is gone; connections die "
                f"with their agent, and this one ({self.instance_id}) started after it",
                data={"conn_id": conn_id},
            )
        raise PortNotFoundError(f"no connection {conn_id} (never made, or closed long ago)", conn_id=conn_id)

    def _closed(self, _: PortConnection) -> None:
        closed = [cid for cid, c in self._conns.items() if c.finished]
        for cid in closed[: max(0, len(closed) - self.limits.max_closed)]:
            del self._conns[cid]

    async def _addresses(self, p: PortConnectParams) -> list[str]:
        """The IP addresses ``p.host`` names, all of them allowed, or a precise error."""
        where = {"host": p.host, "port": p.port}
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(p.host, p.port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise PortConnectError(f"cannot resolve {p.host!r} inside the sandbox: {exc}", data=where) from None
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        if not self.limits.any_host:
            outside = [a for a in addresses if not ipaddress.ip_address(a.split("%")[0]).is_loopback]
            if outside or not addresses:
                raise PortConnectError(
                    f"{p.host} ({', '.join(outside or addresses)}) is not a loopback address: this agent only "
                    "forwards to 127.0.0.1/::1 inside the sandbox (start it with --port-any-host to allow others)",
                    data={**where, "reason": "not_allowed"},
                )
        return addresses

    async def connect(self, p: PortConnectParams) -> PortConnInfo:
        key = p.idempotency_key
        if key is not None and key in self._connecting:
            return await asyncio.shield(self._connecting[key])  # a retry while the first still connects
        if key is not None and key in self._by_key:
            return self._conns[self._by_key[key]].info()
        if self.open_count + self._opening >= self.limits.max_open:
            raise ServerBusyError(
                f"{self.open_count + self._opening} connections are open, the limit of this agent",
                data={"limit": self.limits.max_open},
            )
        pending: asyncio.Future[PortConnInfo] = asyncio.get_running_loop().create_future()
        if key is not None:
            self._connecting[key] = pending  # registered before any await: no duplicate connections
        self._opening += 1  # the slot is taken before the await: concurrent connects cannot overshoot
        try:
            info = await self._connect(p)
        except BaseException as exc:
            pending.set_exception(exc if isinstance(exc, Exception) else asyncio.CancelledError())
            pending.exception()  # retrieved: waiters re-raise it, nobody else needs to
            raise
        finally:
            self._opening -= 1
            if key is not None:
                self._connecting.pop(key, None)
        if key is not None:
            self._by_key[key] = info.conn_id
            while len(self._by_key) > MAX_KEYS:
                self._by_key.popitem(last=False)
        pending.set_result(info)
        return info

    async def _connect(self, p: PortConnectParams) -> PortConnInfo:
        where = {"host": p.host, "port": p.port}
        addresses = await self._addresses(p)
        self._counter += 1
        lim = self.limits
        conn = PortConnection(
            f"{self.instance_id}-p{self._counter}",
            p.host,
            p.port,
            lim.buffer_limit,
            lim.write_buffer,
            self._closed,
            clock=self._clock,
        )
        try:
            async with asyncio.timeout(p.timeout):
                await conn.connect(addresses)
        except TimeoutError:
            raise PortConnectError(
                f"connecting to {p.host}:{p.port} inside the sandbox timed out after {p.timeout:g} s",
                data={**where, "reason": "timeout"},
            ) from None
        except OSError as exc:
            code = exc.errno
            text = f"{os.strerror(code)} ({errno.errorcode.get(code, code)})" if code else str(exc)
            raise PortConnectError(
                f"cannot connect to {p.host}:{p.port} inside the sandbox: {text}",
                data={**where, "errno": code, "errno_name": errno.errorcode.get(code) if code else None},
            ) from None
        self._conns[conn.conn_id] = conn
        if self._reaper is None and self.limits.idle_ttl > 0:
            self._reaper = asyncio.get_running_loop().create_task(self._reap())
        return conn.info()

    async def send(self, p: PortSendParams, payload: memoryview | None = None) -> PortSendResult:
        if payload is not None and len(payload) > self.limits.max_send:
            raise InvalidParamsError(
                f"a send of {len(payload)} bytes is over the {self.limits.max_send}-byte limit",
                data={"conn_id": p.conn_id},
            )
        conn = self._get(p.conn_id)
        conn.busy += 1
        try:
            return await conn.send(p, payload)
        finally:
            conn.busy -= 1
            conn.touch()

    async def recv(self, p: PortRecvParams) -> PortRecvResult | WithPayload:
        conn = self._get(p.conn_id)
        conn.busy += 1
        try:
            return await conn.recv(p)
        finally:
            conn.busy -= 1
            conn.touch()

    async def close(self, p: PortIdParams) -> PortConnInfo:
        conn = self._get(p.conn_id)
        conn.close("closed on request")
        return conn.info()

    async def list(self, _: Empty) -> PortListResult:
        return PortListResult(conns=[c.info() for c in self._conns.values()])

    def expire_idle(self) -> None:
        """Close every connection unused for ``idle_ttl`` seconds (no call on it in progress)."""
        ttl = self.limits.idle_ttl
        now = self._clock()
        for conn in list(self._conns.values()):
            if not conn.finished and conn.busy == 0 and now - conn.last_used >= ttl:
                conn.close(f"unused for {ttl:g} s")

    async def _reap(self) -> None:
        ttl = self.limits.idle_ttl
        while True:
            # A timer, not synchronisation: nothing signals "time passed with nothing happening".
            await asyncio.sleep(min(ttl / 4, 15.0))
            self.expire_idle()

    async def aclose(self) -> None:
        """Close every connection (the agent is shutting down; connections die with it)."""
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for conn in list(self._conns.values()):
            conn.close("the agent is shutting down")
