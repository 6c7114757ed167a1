"""Binary payloads beside JSON-RPC messages: one framing for pipes, HTTP bodies and ``call``.

JSON cannot carry bytes, and escaping text or base64-encoding bytes costs more CPU than
anything else the agent does with output. So a message may carry a **payload**: raw bytes
sent ahead of the JSON, announced by a header line that no JSON text can start with::

    \\x00<N>\\n<N raw bytes><JSON message>

A message without a payload is just its JSON. On a newline-delimited pipe each frame ends with
``\\n`` (the payload may hold newlines: its length, not a delimiter, ends it); an HTTP body or a
``call`` request is one frame. Which params or result fields live in the payload is each
method's business (e.g. ``exec_remote_poll`` with ``binary=true``).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from ..errors import FrameError

__all__ = ["Frame", "FrameError", "LineReader", "encode", "payload_header", "payload_length", "read_frame", "split"]

MARK = b"\x00"
_MAX_HEADER = 24


class Frame(NamedTuple):
    """One message as read: its JSON and its payload (``None`` when it has none)."""

    message: bytes
    payload: bytes | memoryview | None = None


class LineReader(Protocol):
    """What :func:`read_frame` needs of a stream (an asyncio ``StreamReader`` is one)."""

    async def readline(self) -> bytes: ...
    async def readexactly(self, n: int) -> bytes: ...


def payload_header(size: int) -> bytes:
    """The line that announces a payload of ``size`` bytes (a writer that sends the parts
    separately, so as not to copy the payload, writes it first)."""
    return b"\x00%d\n" % size


def encode(message: bytes, payload: bytes | bytearray | memoryview | None = None) -> bytes:
    """One frame: ``message`` alone, or with ``payload`` ahead of it."""
    if payload is None:
        return message
    return b"".join((payload_header(len(payload)), payload, message))


def _length(header: bytes | memoryview, limit: int) -> int:
    digits = bytes(header[1:])
    if not digits.isdigit() or len(digits) > _MAX_HEADER:
        raise FrameError(f"malformed payload header {bytes(header[:_MAX_HEADER])!r}")
    n = int(digits)
    if n > limit:
        raise FrameError(f"payload of {n} bytes is over the {limit}-byte limit")
    return n


def payload_length(header: bytes, limit: int) -> int:
    """The payload length a header line (``\\x00<N>``, newline stripped) announces.

    :raises FrameError: malformed, or over ``limit``.
    """
    return _length(header, limit)


def split(frame: bytes, limit: int = 1 << 40) -> Frame:
    """The JSON message of a frame and its payload, which is a view into ``frame`` (no copy).

    :raises FrameError: the frame starts like a payload header but is not one.
    """
    if not frame.startswith(MARK):
        return Frame(frame)
    end = frame.find(b"\n", 0, _MAX_HEADER + 2)
    if end < 0:
        raise FrameError("payload header without its newline")
    n = _length(memoryview(frame)[:end], limit)
    if len(frame) - end - 1 < n:
        raise FrameError(f"payload of {n} bytes announced, {len(frame) - end - 1} present")
    view = memoryview(frame)
    return Frame(bytes(view[end + 1 + n :]), view[end + 1 : end + 1 + n])


async def read_frame(reader: LineReader, limit: int) -> Frame | None:
    """Read one frame from a newline-delimited stream; ``None`` at EOF (an empty line is an
    empty message). The parts come back as read: nothing is joined or copied again.

    :raises FrameError: a malformed header or a payload over ``limit`` bytes; the stream is
        then out of step and must be closed.
    :raises ValueError: a JSON line longer than the reader's limit.
    :raises asyncio.IncompleteReadError: EOF inside a payload.
    """
    line = await reader.readline()
    if not line:
        return None
    if not line.startswith(MARK):
        return Frame(line.rstrip(b"\r\n"))
    n = _length(line.rstrip(b"\n"), limit)
    payload = await reader.readexactly(n)
    message = await reader.readline()
    return Frame(message.rstrip(b"\r\n"), payload)
