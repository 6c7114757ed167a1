"""The agent's HTTP socket, served by aiohttp loaded only when a client first sends a request.

aiohttp's import (with its TLS contexts) was a third of an agent's start-up CPU, and most agents
are only ever reached through the frame stream. Connecting alone is not using it: the liveness
probes (``ensure``, the local sandbox) connect to ``agent.sock`` and close. So this module's own
small protocol accepts each connection and holds its first bytes; the first request loads
aiohttp (:mod:`.httpserve`), and the connection is handed to aiohttp's request handler, its
bytes replayed. Later connections go to aiohttp directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from socket import socket
from typing import TYPE_CHECKING, Any

from .intake import Intake

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["LazyHttp"]

log = logging.getLogger("remote_exec.agent")

IDLE_TIMEOUT = 60.0  # seconds a connection may stay open without sending a byte (then aborted)


class LazyHttp:
    """``POST /rpc`` on ``listener`` (see the module docstring). ``handle_body`` answers a
    request's body; ``intake`` bounds what requests hold (see :mod:`.httpserve`)."""

    def __init__(
        self,
        listener: socket,
        handle_body: Callable[[bytes], Awaitable[bytes | None]],
        intake: Intake,
        max_request: int,
        shutdown_timeout: float,
    ) -> None:
        self._listener = listener
        self._serve_args = (handle_body, intake, max_request, shutdown_timeout)
        self._server: asyncio.AbstractServer | None = None
        self._runner: web.AppRunner | None = None
        self._loading: asyncio.Task[None] | None = None
        self._waiting: set[_FirstBytes] = set()  # sent a request; waiting for aiohttp's load
        self.held: set[_FirstBytes] = set()  # every connection aiohttp has not taken yet
        self._closing = False

    async def start(self) -> None:
        """Accept connections (their requests wait for aiohttp's load)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(self._protocol, sock=self._listener)

    def _protocol(self) -> asyncio.Protocol:
        if self._runner is not None and self._runner.server is not None:
            return self._runner.server()
        return _FirstBytes(self)

    def request_arrived(self, conn: _FirstBytes) -> None:
        """A connection sent its first bytes: load aiohttp (once), then hand it over."""
        if self._closing:  # a request arriving while the agent shuts down: not served
            conn.abort()
            return
        self._waiting.add(conn)
        if self._loading is None:
            self._loading = asyncio.get_running_loop().create_task(self._load())
        elif self._loading.done():
            self._settle()

    async def _load(self) -> None:
        from .httpserve import http_runner

        try:
            self._runner = await http_runner(*self._serve_args)
        except Exception:
            log.exception("cannot serve the HTTP socket")
            raise
        finally:
            self._settle()

    def _settle(self) -> None:
        """The waiting connections to aiohttp once it is loaded (aborted if its load failed)."""
        server = self._runner.server if self._runner is not None else None
        for conn in self._waiting:
            if server is None:
                conn.abort()
            else:
                conn.hand_to(server())
        self._waiting.clear()

    async def aclose(self) -> None:
        """Stop accepting; requests in flight get the shutdown timeout, then are abandoned;
        connections aiohttp has not taken are aborted (a server's ``wait_closed`` waits for
        every connection it accepted)."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        if self._loading is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await self._loading
        for conn in list(self.held):
            conn.abort()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._server is not None:
            await self._server.wait_closed()


class _FirstBytes(asyncio.Protocol):
    """A connection until aiohttp takes it: its first bytes kept (one read, reading paused)."""

    def __init__(self, owner: LazyHttp) -> None:
        self._owner = owner
        self._transport: asyncio.Transport | None = None
        self._held = b""
        self._idle: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._owner.held.add(self)
        self._idle = asyncio.get_running_loop().call_later(IDLE_TIMEOUT, self.abort)

    def data_received(self, data: bytes) -> None:
        assert self._transport is not None
        self._transport.pause_reading()  # the rest is read by aiohttp
        self._held = data
        if self._idle is not None:
            self._idle.cancel()
        self._owner.request_arrived(self)

    def eof_received(self) -> bool:
        return False  # closed before a byte: a liveness probe (connect, close)

    def connection_lost(self, exc: Exception | None) -> None:
        self._owner.held.discard(self)
        if self._idle is not None:
            self._idle.cancel()

    def hand_to(self, handler: Any) -> None:
        """Give the connection to ``handler`` (an aiohttp request handler), its bytes replayed
        after reading resumes (the handler's own flow control may pause it again)."""
        self._owner.held.discard(self)
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        transport.set_protocol(handler)
        handler.connection_made(transport)
        transport.resume_reading()
        handler.data_received(self._held)

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()
