"""Wire models of the ``port_*`` methods: TCP connections made inside the sandbox for the host.

A connection is two byte streams addressed by cursors, like a job's stdin and stdout, so every
call is safe to repeat. ``port_send`` names the offset its payload starts at: bytes the agent
already took are skipped, so a retried send is never written twice. ``port_recv`` names the
offset the caller holds, which acknowledges every byte before it (the agent may then forget
them) and gets what follows: a retried receive gets the same bytes again. The bytes travel as
frame payloads (:mod:`remote_exec.protocol.frames`), never in the JSON.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from .base import DEFAULT_MAX_BYTES, MAX_WAIT, Offset, WireModel

__all__ = [
    "ConnId",
    "PortConnInfo",
    "PortConnectParams",
    "PortIdParams",
    "PortListResult",
    "PortRecvParams",
    "PortRecvResult",
    "PortSendParams",
    "PortSendResult",
    "PortState",
]

ConnId = Annotated[str, Field(min_length=1, max_length=128)]
PortState = Literal["open", "closed"]


class PortConnectParams(WireModel):
    """Params of ``port_connect``: open a TCP connection from inside the sandbox.

    ``host`` must be a loopback address (``127.0.0.1``, ``::1``, or a name resolving only to
    loopback) unless the agent was started with ``--port-any-host``. ``timeout`` bounds the
    connect. ``idempotency_key`` makes a retried call return the connection the first made.
    """

    port: Annotated[int, Field(ge=1, le=65535)]
    host: Annotated[str, Field(min_length=1, max_length=253)] = "127.0.0.1"
    timeout: Annotated[float, Field(gt=0, le=MAX_WAIT)] = 10.0
    idempotency_key: Annotated[str, Field(max_length=128)] | None = None


class PortConnInfo(WireModel):
    """A connection, as ``port_connect``, ``port_list`` and ``port_close`` report it.

    ``sent`` counts the bytes written towards the target (where the next ``port_send``
    starts); ``received`` the bytes read from it; ``acked`` the receive cursor the host last
    named; ``buffered`` the bytes the agent holds for the host (bounded: reading from the
    target pauses while too many are unacknowledged, see ``reading_paused``). ``send_eof``: the
    host ended its direction; ``recv_eof``: the target ended its direction (or the connection
    ended). ``state`` is ``closed`` once the socket is gone; ``closed_reason`` says why.
    """

    conn_id: str
    host: str
    port: int
    state: PortState
    sent: Offset
    received: Offset
    acked: Offset
    buffered: Offset
    reading_paused: bool
    send_eof: bool
    recv_eof: bool
    created_at: float
    last_used_at: float
    closed_reason: str | None = None


class PortSendParams(WireModel):
    """Params of ``port_send``: the request's payload goes to the target from ``offset`` on.

    Bytes before the agent's ``sent`` count are skipped (a retry writes nothing twice); an
    ``offset`` past it is an error. ``eof`` half-closes the connection towards the target after
    the payload (``shutdown(SHUT_WR)``: the target reads EOF and may still answer). When the
    connection's write buffer is full the agent waits up to ``wait`` seconds for the target to
    read, then answers with what it accepted: ask again from the returned offset.
    """

    conn_id: ConnId
    offset: Offset
    eof: bool = False
    wait: Annotated[float, Field(ge=0)] = 10.0


class PortSendResult(WireModel):
    """Bytes the agent has taken so far (the offset where the next send starts); EOF included."""

    offset: Offset
    eof: bool


class PortRecvParams(WireModel):
    """Params of ``port_recv``: the receive cursor the caller holds, and a long-poll wait.

    Naming ``offset`` acknowledges every byte before it. The answer comes as soon as there is
    data or an end, else after ``wait`` seconds (capped at 30) with nothing.
    """

    conn_id: ConnId
    offset: Offset = 0
    wait: Annotated[float, Field(ge=0)] = 0.0
    max_bytes: Annotated[int, Field(ge=1, le=64 * 1024 * 1024)] = DEFAULT_MAX_BYTES


class PortRecvResult(WireModel):
    """Result of ``port_recv``: the bytes from the caller's offset on are the response's payload.

    ``offset`` is the cursor after them (the payload holds ``offset - params.offset`` bytes).
    ``eof``: the target ended its direction and this answer holds its last byte; ``error``
    (with ``eof``) says the connection ended abnormally (reset, closed by ``port_close``, idle
    expiry) rather than with a clean EOF.
    """

    offset: Offset
    eof: bool = False
    error: str | None = None


class PortIdParams(WireModel):
    """Params naming one connection."""

    conn_id: ConnId


class PortListResult(WireModel):
    """Open and recently closed connections, oldest first."""

    conns: list[PortConnInfo]
