"""``SandboxCore``: what one sandbox and all the handles it makes share, below them all.

An :class:`~remote_exec.AsyncSandbox` holds one and hands it to what it makes: the job and
shell handles, port forwards, file clients. The core owns the agent channel's RPC client, the
sandbox's lifecycle (new, open, closed) and the registries of what closing the sandbox must
stop (its undetached jobs, its port forwards). The handles depend on this core, never on the
sandbox, as httpcore's connections share the pool's state rather than the httpx client: no
handle imports the sandbox module, and none reaches into another object's private state.
"""

from __future__ import annotations

from typing import Literal, Protocol

import anyio

from ..errors import AgentUnavailableError, SandboxError, TransportError
from ..protocol import PROTOCOL_VERSION, Empty, Method, ServerInfo
from .channel import DEFAULT_LIVENESS, Liveness, StdioChannel
from .files import FileClient
from .link import Link
from .process import RESPONSE_MARGIN, ExecRemoteProcess, kill_quietly
from .rpc import RpcClient
from .transport import SandboxTransport

__all__ = ["OPEN_TIMEOUT", "Closable", "SandboxCore"]

OPEN_TIMEOUT = 10.0
"""Seconds :meth:`AsyncSandbox.open` gives the agent to answer ``server_info`` (connecting
included) once the transport is set up; a silent agent fails the open after that."""


class Closable(Protocol):
    """Something closing the sandbox closes first (a port forward)."""

    async def aclose(self) -> None: ...


class SandboxCore:
    """One sandbox's transport, agent channel, lifecycle and the handles it must close.

    :ivar transport: how the agent is reached.
    :ivar response_margin: seconds an answer may lag a long-poll's wait before it is re-asked.
    :ivar open_timeout: seconds the agent has to answer ``server_info`` on :meth:`open`.
    :ivar liveness: how fast a silent agent is noticed (``None``: by the call deadlines alone);
        see :class:`~remote_exec.client.channel.Liveness`.
    :ivar link: the agent channel's state (:class:`~remote_exec.client.link.Link`), the same
        object for the sandbox's whole life: the channel opened later reports into it.
    """

    def __init__(
        self,
        transport: SandboxTransport,
        *,
        response_margin: float = RESPONSE_MARGIN,
        open_timeout: float = OPEN_TIMEOUT,
        liveness: Liveness | None = DEFAULT_LIVENESS,
    ) -> None:
        self.transport = transport
        self.response_margin = response_margin
        self.open_timeout = open_timeout
        self.liveness = liveness
        self.link = Link()
        self._rpc: RpcClient | None = None
        self._info: ServerInfo | None = None
        self._procs: list[ExecRemoteProcess] = []
        self._closables: set[Closable] = set()
        self._state: Literal["new", "open", "closed"] = "new"

    @property
    def url(self) -> str:
        return self.transport.url

    @property
    def state(self) -> Literal["new", "open", "closed"]:
        return self._state

    @property
    def info(self) -> ServerInfo:
        """The agent's ``server_info`` as seen when the sandbox opened."""
        if self._info is None:
            raise RuntimeError("the sandbox is not open yet")
        return self._info

    @property
    def rpc(self) -> RpcClient:
        """The agent channel's RPC client.

        :raises RuntimeError: the sandbox is not open (not yet, or no more).
        """
        self.check_open()
        assert self._rpc is not None
        return self._rpc

    def check_open(self) -> None:
        """:raises RuntimeError: the sandbox is not open (not yet, or no more)."""
        if self._state != "open" or self._rpc is None:
            raise RuntimeError(f"the sandbox is {self._state}: use it inside `async with rx.open_sandbox(...)`")

    def files(self, root: str | None, *, window: int = 4) -> FileClient:
        """A file client for paths inside ``root``, with the transport's native copy if it has one."""
        return FileClient(self.rpc, root, window=window, native=self.transport.native_copy())

    async def open(self) -> None:
        """Open the channel and check the agent's protocol (see :meth:`AsyncSandbox.open`).

        :raises AgentUnavailableError: the agent cannot be started or reached, or did not answer
            within ``open_timeout``.
        :raises SandboxError: the agent speaks another protocol version.
        """
        if self._state != "new":
            raise RuntimeError(f"this sandbox is {self._state}; open a new one with rx.open_sandbox()")
        try:
            channel = await self.transport.open_channel()
        except BaseException:
            self._state = "closed"
            self.link.set("closed")
            with anyio.CancelScope(shield=True):
                await self.transport.aclose()  # whatever it set up before failing (a connection, a box)
            raise
        if isinstance(channel, StdioChannel):  # the socket channel is one too
            channel.liveness = self.liveness
        channel.link = self.link  # before any request: the first answer makes it "connected"
        self._rpc = RpcClient(channel, name=self.url, diagnose=self.transport.diagnose)
        self._state = "open"
        try:
            self._info = await self.rpc.call(
                Method.SERVER_INFO, Empty(), ServerInfo, timeout=self.open_timeout, deadline=self.open_timeout
            )
        except AgentUnavailableError:
            await self.aclose()
            raise
        except TransportError as exc:  # the deadline passed (any other failure is a subclass)
            await self.aclose()
            raise AgentUnavailableError(
                f"{self.url}: the agent did not answer server_info within open_timeout={self.open_timeout:g} s ({exc})"
            ) from exc
        except BaseException:
            await self.aclose()
            raise
        if self._info.protocol_version != PROTOCOL_VERSION:
            await self.aclose()
            raise SandboxError(
                f"agent in {self.url} speaks protocol {self._info.protocol_version}, this client {PROTOCOL_VERSION}"
            )

    def track(self, proc: ExecRemoteProcess) -> ExecRemoteProcess:
        """Kill ``proc`` when the sandbox closes, unless it ended or was detached first."""
        self._procs = [p for p in self._procs if not p.done]
        self._procs.append(proc)
        return proc

    def close_with(self, closable: Closable) -> None:
        """Close ``closable`` when the sandbox closes (unless :meth:`forget` came first)."""
        self._closables.add(closable)

    def forget(self, closable: Closable) -> None:
        self._closables.discard(closable)

    async def aclose(self) -> None:
        """Close what registered, kill the tracked jobs that still run; close the channel and transport.

        Idempotent. Shielded from cancellation so nothing leaks.
        """
        if self._state == "closed":
            return
        self._state = "closed"
        with anyio.CancelScope(shield=True):
            for closable in list(self._closables):
                await closable.aclose()
            live = [p for p in self._procs if not p.done]
            if live and self._rpc is not None:
                async with anyio.create_task_group() as tg:  # kill_quietly never raises
                    for proc in live:
                        tg.start_soon(kill_quietly, proc)
            if self._rpc is not None:
                await self._rpc.aclose()  # from here on nothing reconnects (a kill still running)
            await self.transport.aclose()
            self.link.set("closed")
