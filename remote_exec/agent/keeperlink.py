"""Talking to the keeper (see :mod:`remote_exec.agent.keeper`): the agent's async link, and one
blocking call for ``ensure``.

Without a keeper (an agent run by hand with ``serve``) the link is absent and jobs simply do not
outlive the agent: every operation degrades to "nothing held, no exit recorded".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from .keeper import KEEPER_SOCKET

__all__ = ["KeeperLink", "keeper_call"]

MAX_ANSWER = 16 << 20  # the ``exits`` table at its bound is ~5 MiB of JSON


def keeper_call(state_dir: Path, req: dict[str, Any], timeout: float) -> dict[str, Any] | None:
    """One request to the keeper of ``state_dir``, blocking; None if no keeper answers.

    :raises OSError: the keeper went away mid-answer.
    """
    path = state_dir / KEEPER_SOCKET
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect(os.fspath(path))
        except OSError:
            return None
        s.sendall(json.dumps(req).encode() + b"\n")
        data = b""
        deadline = time.monotonic() + timeout
        while b"\n" not in data:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = s.recv(65536)
            if not chunk:
                return None
            data += chunk
        answer = json.loads(data.split(b"\n", 1)[0])
        return answer if isinstance(answer, dict) else None


class KeeperLink:
    """The agent's one connection to its keeper; requests are serialised (the keeper answers in order)."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / KEEPER_SOCKET
        self._sock: socket.socket | None = None
        self._lock = asyncio.Lock()
        self.hello: dict[str, Any] = {}

    @property
    def present(self) -> bool:
        return self._sock is not None

    async def connect(self) -> bool:
        """Connect if a keeper serves the state dir; True if one does."""
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(s, os.fspath(self.path))
        except OSError:
            s.close()
            return False
        self._sock = s
        answer, _ = await self.request({"op": "hello"})
        self.hello = answer
        return bool(answer)

    async def request(self, req: dict[str, Any], fd: int | None = None) -> tuple[dict[str, Any], list[int]]:
        """Send one request (with ``fd`` attached); return the answer and any fds it carried.

        A lost keeper answers ``{}``: the caller goes on without it. Cancelling mid-request
        drops the link (its framing would be out of step).
        """
        if self._sock is None:
            return {}, []
        async with self._lock:
            try:
                return await self._exchange(self._sock, req, fd)
            except (OSError, ValueError):
                self.close()
                return {}, []
            except asyncio.CancelledError:
                self.close()
                raise

    async def _exchange(
        self, s: socket.socket, req: dict[str, Any], fd: int | None
    ) -> tuple[dict[str, Any], list[int]]:
        line = json.dumps(req).encode() + b"\n"
        loop = asyncio.get_running_loop()
        if fd is not None:
            await _wait(loop, s, write=True)
            socket.send_fds(s, [line], [fd])  # a short message on an idle socket: fits in one send
        else:
            await loop.sock_sendall(s, line)
        data, fds = b"", []
        while b"\n" not in data:
            await _wait(loop, s, write=False)
            try:
                chunk, got, _, _ = socket.recv_fds(s, 1 << 20, 4, socket.MSG_CMSG_CLOEXEC)
            except BlockingIOError:
                continue
            for fd in got:
                os.set_inheritable(fd, False)
            fds += got
            if not chunk:
                raise ConnectionResetError("the keeper closed the link")
            data += chunk
            if len(data) > MAX_ANSWER:
                raise ValueError("the keeper's answer is too long")
        answer = json.loads(data.split(b"\n", 1)[0])
        return (answer if isinstance(answer, dict) else {}), fds

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None


async def _wait(loop: asyncio.AbstractEventLoop, s: socket.socket, *, write: bool) -> None:
    fut = loop.create_future()
    fileno = s.fileno()
    add, remove = (loop.add_writer, loop.remove_writer) if write else (loop.add_reader, loop.remove_reader)

    def ready() -> None:
        if not fut.done():
            fut.set_result(None)

    add(fileno, ready)
    try:
        await fut
    finally:
        remove(fileno)
