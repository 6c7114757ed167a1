"""Reading requests into memory charged to the budget: frames on the stream socket, HTTP bodies.

A request is only worth something once it is whole, but it occupies memory while it arrives:
16 connections each announcing an 86 MiB payload and sending most of it held 1436 MiB. So the
bytes of a request are reserved from the :class:`~remote_exec.agent.budget.MemoryBudget` as they
come (a payload's whole announced length up front), and a request that does not fit is refused
with :class:`~remote_exec.errors.ServerBusyError`: its connection is closed, since the stream is
out of step. The reservation is held until the request's handler has finished with it.
"""

from __future__ import annotations

import asyncio

from ..errors import ServerBusyError
from ..protocol import frames
from .budget import MemoryBudget

__all__ = ["LINE_PIECE", "LineTooLong", "read_body", "read_frame"]

LINE_PIECE = 64 * 1024
"""The stream reader's own limit: it holds at most about twice this uncharged per connection
(asyncio pauses the socket beyond that); longer lines are read and charged piece by piece."""
_PAYLOAD_PIECE = 1 << 20


class LineTooLong(ValueError):
    """A JSON line over the request limit; it was read and dropped up to its newline."""


def _charge(budget: MemoryBudget | None, n: int, held: int, what: str) -> None:
    if budget is not None and not budget.try_reserve(n):
        raise ServerBusyError(
            f"{what} does not fit the agent's memory budget ({held + n} bytes needed, {budget.free} of "
            f"{budget.limit} free): connection closed",
        )


async def _read_line(reader: asyncio.StreamReader, budget: MemoryBudget | None, limit: int, held: int) -> bytes:
    """One line (with its newline; without it at EOF), charging each piece as it comes."""
    parts: list[bytes] = []
    size = 0
    over = False
    try:
        while True:
            try:
                piece = await reader.readuntil(b"\n")
            except asyncio.LimitOverrunError as exc:
                piece = await reader.readexactly(max(exc.consumed, 1))
            except asyncio.IncompleteReadError as exc:
                piece = exc.partial  # EOF
            if over or size + len(piece) > limit:
                over = True  # keep reading to the newline, holding nothing
            else:
                _charge(budget, len(piece), held + size, "a request line")
                parts.append(piece)
                size += len(piece)
            if not piece or piece.endswith(b"\n"):
                break
    except BaseException:
        if budget is not None:
            budget.release(size)
        raise
    if over:
        if budget is not None:
            budget.release(size)
        raise LineTooLong(f"request line over {limit} bytes")
    return parts[0] if len(parts) == 1 else b"".join(parts)


async def read_frame(
    reader: asyncio.StreamReader, budget: MemoryBudget | None, limit: int
) -> tuple[frames.Frame, int] | None:
    """Read one frame (see :func:`remote_exec.protocol.frames.read_frame`), charging its bytes;
    return it with the bytes charged (to release once it is handled), or ``None`` at EOF.

    Cancelling it releases what was charged.

    :raises ServerBusyError: the frame does not fit the memory budget; nothing stays charged.
    :raises LineTooLong: a JSON line over ``limit`` (the next line can be read).
    :raises frames.FrameError: a malformed payload header or one over ``limit``.
    :raises asyncio.IncompleteReadError: EOF inside a payload.
    """
    line = await _read_line(reader, budget, limit, 0)
    held = len(line)
    try:
        if not line:
            return None
        if not line.startswith(frames.MARK):
            return frames.Frame(line.rstrip(b"\r\n")), held
        n = frames.payload_length(line.rstrip(b"\n"), limit)
        _charge(budget, n, held, f"a payload of {n} bytes")
        held += n
        # Filled piece by piece: a readexactly(n) would hold the bytes twice while it copies.
        payload = bytearray(n)
        pos = 0
        while pos < n:
            piece = await reader.readexactly(min(_PAYLOAD_PIECE, n - pos))
            payload[pos : pos + len(piece)] = piece
            pos += len(piece)
        message = await _read_line(reader, budget, limit, held)
        held += len(message)
        return frames.Frame(message.rstrip(b"\r\n"), memoryview(payload)), held
    except BaseException:
        if budget is not None:
            budget.release(held)
        raise


async def read_body(content: object, length: int | None, budget: MemoryBudget | None, limit: int) -> tuple[bytes, int]:
    """An HTTP request body (aiohttp's ``request.content``), charged as it comes; returns it with
    the bytes charged. A declared ``length`` is reserved up front.

    :raises ServerBusyError: it does not fit the memory budget (nothing stays charged).
    :raises LineTooLong: it is over ``limit`` bytes.
    """
    from aiohttp import StreamReader

    assert isinstance(content, StreamReader)
    if length is not None and length > limit:
        raise LineTooLong(f"request body of {length} bytes is over the {limit}-byte limit")
    held = 0
    parts: list[bytes] = []
    try:
        if length is not None:
            _charge(budget, length, 0, f"a request body of {length} bytes")
            held = length
        size = 0
        async for piece in content.iter_chunked(_PAYLOAD_PIECE):
            size += len(piece)
            if size > limit:
                raise LineTooLong(f"request body over the {limit}-byte limit")
            if size > held:
                _charge(budget, size - held, held, "a request body")
                held = size
            parts.append(piece)
        return b"".join(parts), held
    except BaseException:
        if budget is not None:
            budget.release(held)
        raise
