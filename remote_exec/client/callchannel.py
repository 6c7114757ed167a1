"""``CallChannel``: one ``remote-exec-agent call`` process per request, for transports that
cannot hold a stream open. It cannot carry pushes, so handles on it poll (see
:mod:`~remote_exec.client.channel` for the persistent channels)."""

from __future__ import annotations

import asyncio
import contextlib

from ..errors import ProtocolError
from ..protocol import frames
from .channel import MAX_RESPONSE, Channel, ChannelBroken, OnPush, PipeReader, SpawnFn

__all__ = ["CallChannel", "read_bounded"]


class CallChannel(Channel):
    """One ``remote-exec-agent call`` process per request (for transports without streams)."""

    def __init__(self, spawn: SpawnFn) -> None:
        super().__init__()
        self._spawn = spawn

    async def request(
        self, body: bytes, request_id: int, timeout: float, on_push: OnPush | None = None
    ) -> frames.Frame:
        try:
            frame = await self._request(body, timeout)
        except ChannelBroken as exc:
            if self.link.state in ("connecting", "connected"):
                self.link.set("reconnecting", str(exc))
            raise
        self.link.set("connected")
        return frame

    async def aclose(self) -> None:
        self.link.set("closed")

    async def _request(self, body: bytes, timeout: float) -> frames.Frame:
        proc = await self._spawn()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            async with asyncio.timeout(timeout):
                proc.stdin.write(body)
                await proc.stdin.drain()
                proc.stdin.close()
                out = await read_bounded(proc.stdout, 2 * MAX_RESPONSE)
                code = await proc.wait()
        finally:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        if not out.strip():
            raise ChannelBroken(f"agent call exited {code} without a response")
        try:
            return frames.split(out.strip())
        except frames.FrameError as exc:
            raise ProtocolError(f"malformed response frame from the agent: {exc}") from None


async def read_bounded(reader: PipeReader, limit: int, what: str = "the agent call") -> bytes:
    """All of ``reader`` up to EOF, refusing more than ``limit`` bytes (a sandbox could send forever).

    :raises ProtocolError: more than ``limit`` bytes (``what`` names the sender).
    """
    out = bytearray()
    while chunk := await reader.read(1 << 20):
        out += chunk
        if len(out) > limit:
            raise ProtocolError(f"{what} answered more than {limit} bytes")
    return bytes(out)
