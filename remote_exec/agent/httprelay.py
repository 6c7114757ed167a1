"""The agent CLI's one-shot ``call``: one JSON-RPC request POSTed to the server's HTTP socket.

Apart from :mod:`.relay` because it needs aiohttp, whose import (with its TLS contexts) the
``stdio`` relay, run for every channel a host opens, does without.
"""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path
from typing import Any

import aiohttp

from ..errors import AgentUnavailableError, RemoteExecError
from ..protocol.ownership import check_peer, check_socket
from .relay import error_line

__all__ = ["relay_call"]

_URL = "http://agent/rpc"


class _CheckedConnector(aiohttp.UnixConnector):
    """A Unix connector that checks who listens before aiohttp writes a byte of the request."""

    async def _create_connection(self, req: Any, traces: Any, timeout: Any) -> Any:
        path = Path(self.path)
        check_socket(path)  # another user's file: refused before connecting at all
        proto = await super()._create_connection(req, traces, timeout)
        transport = proto.transport
        assert transport is not None  # just connected
        try:
            check_peer(transport.get_extra_info("socket"), path)
        except BaseException:
            transport.abort()
            raise
        return proto


def _session(sock: Path) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=_CheckedConnector(path=os.fspath(sock), limit=0),
        timeout=aiohttp.ClientTimeout(total=None),
        headers={"Content-Type": "application/json"},
    )


async def relay_call(sock: Path, body: bytes) -> int:
    """POST one request; print the response. Exit status 3 if the server cannot be reached."""
    async with _session(sock) as session:
        try:
            async with session.post(_URL, data=body if len(body) < 1 << 20 else io.BytesIO(body)) as resp:
                answer = await resp.read()
        except aiohttp.ClientError as exc:
            sys.stdout.buffer.write(error_line(body, AgentUnavailableError(f"agent server unreachable: {exc}")) + b"\n")
            return 3
        except RemoteExecError as exc:  # refused: not our agent
            sys.stdout.buffer.write(error_line(body, exc) + b"\n")
            return 3
    if answer:
        sys.stdout.buffer.write(answer + b"\n")
    sys.stdout.flush()
    return 0
