"""Reading requests into memory charged to the budget: frames on the stream socket, HTTP bodies.

A request is only worth something once it is whole, but it occupies memory while it arrives:
16 connections each announcing an 86 MiB payload and sending most of it held 1436 MiB. So the
bytes of a request are reserved from the :class:`~remote_exec.agent.budget.MemoryBudget` as they
come (a payload's whole announced length up front). When a request does not fit, it waits if
requests already read and being handled would free enough once answered (an honest client's
burst); otherwise, or after :data:`INTAKE_WAIT`, it is refused with
:class:`~remote_exec.errors.ServerBusyError` and its connection closed, since the stream is out
of step. The reservation is held until the request's handler has finished with it.
"""

from __future__ import annotations

import asyncio
import contextlib

from ..errors import LineTooLong, ServerBusyError
from ..protocol import frames
from .budget import MemoryBudget

__all__ = ["INTAKE_WAIT", "LINE_PIECE", "Intake", "LineTooLong", "read_body", "read_frame"]

INTAKE_WAIT = 30.0
"""Seconds a request waits for requests being handled to free room before it is refused."""

LINE_PIECE = 64 * 1024
"""The stream reader's own limit: it holds at most about twice this uncharged per connection
(asyncio pauses the socket beyond that); longer lines are read and charged piece by piece."""
_PAYLOAD_PIECE = 1 << 20


class Intake:
    """The budget's intake side: requests read (charged) and those now being handled."""

    def __init__(self, budget: MemoryBudget | None) -> None:
        self.budget = budget
        self.handling = 0  # bytes of requests read whole, released once answered

    async def charge(self, n: int, held: int, what: str) -> None:
        """Reserve ``n`` more bytes of a request that holds ``held`` already.

        Cancelling it reserves nothing.

        :raises ServerBusyError: it does not fit, and answering the requests in hand would not
            make it fit (or did not within :data:`INTAKE_WAIT`).
        """
        budget = self.budget
        if budget is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + INTAKE_WAIT
        while not budget.try_reserve(n, intake=True):
            if n - budget.free(intake=True) > self.handling or loop.time() >= deadline:
                raise ServerBusyError(
                    f"{what} does not fit the agent's memory budget ({held + n} bytes needed, "
                    f"{budget.free(intake=True)} of {budget.limit} free): connection closed"
                )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(deadline - loop.time()):
                    await budget.freed()

    def release(self, n: int) -> None:
        if self.budget is not None:
            self.budget.release(n, intake=True)

    def handled(self, n: int) -> None:
        """A request read whole (``n`` bytes) is handed to its handler."""
        self.handling += n

    def answered(self, n: int) -> None:
        """That request was answered: its bytes go back."""
        self.handling -= n
        self.release(n)


async def _read_line(reader: asyncio.StreamReader, intake: Intake, limit: int, held: int) -> bytes:
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
                await intake.charge(len(piece), held + size, "a request line")
                parts.append(piece)
                size += len(piece)
            if not piece or piece.endswith(b"\n"):
                break
    except BaseException:
        intake.release(size)
        raise
    if over:
        intake.release(size)
        raise LineTooLong(f"request line over {limit} bytes")
    return parts[0] if len(parts) == 1 else b"".join(parts)


async def read_frame(reader: asyncio.StreamReader, intake: Intake, limit: int) -> tuple[frames.Frame, int] | None:
    """Read one frame (see :func:`remote_exec.protocol.frames.read_frame`), charging its bytes;
    return it with the bytes charged (to release once it is handled), or ``None`` at EOF.

    Cancelling it releases what was charged.

    :raises ServerBusyError: the frame does not fit the memory budget; nothing stays charged.
    :raises LineTooLong: a JSON line over ``limit`` (the next line can be read).
    :raises frames.FrameError: a malformed payload header or one over ``limit``.
    :raises asyncio.IncompleteReadError: EOF inside a payload.
    """
    line = await _read_line(reader, intake, limit, 0)
    held = len(line)
    try:
        if not line:
            return None
        if not line.startswith(frames.MARK):
            return frames.Frame(line.rstrip(b"\r\n")), held
        n = frames.payload_length(line.rstrip(b"\n"), limit)
        await intake.charge(n, held, f"a payload of {n} bytes")
        held += n
        # Filled piece by piece: a readexactly(n) would hold the bytes twice while it copies.
        payload = bytearray(n)
        pos = 0
        while pos < n:
            piece = await reader.readexactly(min(_PAYLOAD_PIECE, n - pos))
            payload[pos : pos + len(piece)] = piece
            pos += len(piece)
        message = await _read_line(reader, intake, limit, held)
        held += len(message)
        return frames.Frame(message.rstrip(b"\r\n"), memoryview(payload)), held
    except BaseException:
        intake.release(held)
        raise


async def read_body(content: object, length: int | None, intake: Intake, limit: int) -> tuple[bytes, int]:
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
            await intake.charge(length, 0, f"a request body of {length} bytes")
            held = length
        size = 0
        async for piece in content.iter_chunked(_PAYLOAD_PIECE):
            size += len(piece)
            if size > limit:
                raise LineTooLong(f"request body over the {limit}-byte limit")
            if size > held:
                await intake.charge(size - held, held, "a request body")
                held = size
            parts.append(piece)
        return b"".join(parts), held
    except BaseException:
        intake.release(held)
        raise
