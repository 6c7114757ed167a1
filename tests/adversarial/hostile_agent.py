"""A hostile fake agent: speaks our frame protocol on a ``local://`` state dir and lies.

It plays the attacker for the host-side defences (it is not a mock of the agent: the host
under test is real, only the sandbox side is replaced by something that misbehaves). Each test
gives it handlers: ``method name -> fn(params, payload)`` returning ``result`` or
``(result, payload)`` or :class:`Pushes` (push frames, then the result), raising
:class:`Silence` to never answer, or :class:`WireError` to answer with a JSON-RPC error. A
``exec_remote_follow`` with no handler of its own is served by the ``exec_remote_poll`` handler:
its answer is pushed (the host checks a push as it checks a poll's answer), then the call ends.
Unhandled methods answer like an honest agent would where that is trivial (``server_info``,
empty listings) and with "method not found" otherwise.

Usage::

    async with HostileAgent(tmp_path, {"file_list": lambda p, _: {...}}) as agent:
        async with rx.open_sandbox(agent.url) as sb:
            ...
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from remote_exec import __version__
from remote_exec.protocol import PROTOCOL_VERSION, STREAM_SOCKET, frames

__all__ = ["Encoded", "Handler", "HostileAgent", "Pushes", "Silence", "WireError"]

Handler = Callable[[dict[str, Any], bytes | None], Any]


class Encoded(bytes):
    """A result already encoded as JSON, answered as it is: a huge answer is encoded once, before
    the agent serves, not on the call (seconds of CPU on a loaded machine, past the call's deadline)."""


class Pushes:
    """A follow handler's answer: each ``(params, payload)`` sent as an ``exec_remote_push``
    (``call`` and ``job_id`` filled in unless given), then ``result`` (``None``: no answer)."""

    def __init__(self, pushes: list[tuple[dict[str, Any], bytes | None]], result: dict[str, Any] | None) -> None:
        self.pushes, self.result = pushes, result


class Silence(Exception):
    """Raised by a handler: the fake agent never answers this request."""


class WireError(Exception):
    """Raised by a handler: answer with this JSON-RPC error ``code`` and ``message``."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


class HostileAgent:
    """A fake agent serving ``<root>/state``: ``agent.sock`` (accepts, never speaks) and the
    frame stream ``agent.stream``. ``calls`` records every request's method, in order."""

    def __init__(self, root: Path, handlers: dict[str, Handler] | None = None) -> None:
        self.state_dir = root / "state"
        self.handlers: dict[str, Handler] = dict(handlers or {})
        self.calls: list[str] = []
        self.instance_id = uuid.uuid4().hex[:12]
        self._servers: list[asyncio.AbstractServer] = []
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"local://?dir={self.state_dir}"

    def server_info(self) -> dict[str, Any]:
        return {
            "version": __version__,
            "protocol_version": PROTOCOL_VERSION,
            "pid": os.getpid(),
            "started_at": time.time(),
            "instance_id": self.instance_id,
            "capabilities": [],
        }

    async def __aenter__(self) -> HostileAgent:
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        old = os.umask(0o177)  # sockets 0600, as the real agent makes them
        try:
            self._servers.append(await asyncio.start_unix_server(self._idle, os.fspath(self.state_dir / "agent.sock")))
            self._servers.append(
                await asyncio.start_unix_server(self._serve, os.fspath(self.state_dir / STREAM_SOCKET), limit=1 << 30)
            )
        finally:
            os.umask(old)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 2)

    async def _idle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        lock = asyncio.Lock()
        try:
            while True:
                frame = await frames.read_frame(reader, 1 << 30)
                if frame is None:
                    break
                task = asyncio.get_running_loop().create_task(self._answer(frame, writer, lock))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _answer(self, frame: frames.Frame, writer: asyncio.StreamWriter, lock: asyncio.Lock) -> None:
        request = json.loads(frame.message)
        method, rid = request.get("method"), request.get("id")
        self.calls.append(method)
        payload = bytes(frame.payload) if frame.payload is not None else None
        response: dict[str, Any] = {"jsonrpc": "2.0", "id": rid}
        out: bytes | None = None
        params = request.get("params") or {}
        try:
            handler = self.handlers.get(method)
            if handler is None and method == "exec_remote_follow" and "exec_remote_poll" in self.handlers:
                handler = _follow_by_poll(self.handlers["exec_remote_poll"])
            if handler is not None:
                result = handler(params, payload)
                if asyncio.iscoroutine(result):
                    result = await result
                if isinstance(result, Pushes):
                    for push, data in result.pushes:
                        note = {"call": rid, "job_id": params.get("job_id"), **push}
                        message = {"jsonrpc": "2.0", "method": "exec_remote_push", "params": note}
                        async with lock:
                            writer.write(frames.encode(json.dumps(message).encode(), data) + b"\n")
                            with contextlib.suppress(ConnectionError):
                                await writer.drain()
                    if result.result is None:
                        return
                    result = result.result
            elif method == "server_info":
                result = self.server_info()
            elif method in ("exec_remote_list",):
                result = {"jobs": []}
            else:
                raise WireError(-32601, f"method not found: {method}")
            if isinstance(result, tuple):
                result, out = result
            response["result"] = result
        except Silence:
            return
        except WireError as exc:
            response["error"] = {"code": exc.code, "message": exc.message, **({"data": exc.data} if exc.data else {})}
        if isinstance(response.get("result"), Encoded):
            head = json.dumps({"jsonrpc": "2.0", "id": rid}).encode()[:-1]
            body = frames.encode(head + b',"result":' + response["result"] + b"}", out)
        else:
            body = frames.encode(json.dumps(response).encode(), out)
        async with lock:
            writer.write(body + b"\n")
            with contextlib.suppress(ConnectionError):
                await writer.drain()


def _follow_by_poll(poll: Handler) -> Handler:
    """A follow served by a poll handler: its answer pushed, then the call's end."""

    async def follow(params: dict[str, Any], payload: bytes | None) -> Any:
        fields = ("job_id", "stdout_offset", "stderr_offset", "hits")
        asked: dict[str, Any] = {k: params[k] for k in fields if k in params}
        answer = poll({**asked, "wait": params.get("wait", 0), "binary": True}, payload)
        if asyncio.iscoroutine(answer):
            answer = await answer
        answer, data = answer if isinstance(answer, tuple) else (answer, None)
        return Pushes([(answer, data)], {"pushes": 1, "ended": answer.get("state", "running") != "running"})

    return follow
