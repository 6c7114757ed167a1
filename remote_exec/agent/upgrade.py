"""Upgrade in place: an ``ensure`` of another version takes over a running agent's jobs.

``ensure`` (and ``stdio``) of this agent, finding an agent of another version or protocol
serving the state dir, asks it to ``server_handover``: it answers, stops accepting, and exits
with :data:`~remote_exec.agent.keeper.HANDOVER_EXIT` without touching its jobs; the keeper
keeps them (and their stdin) and waits. ``ensure`` then asks the keeper to ``start`` its own
agent, which re-adopts every job from the state dir. An agent too old to know
``server_handover`` (protocol < 4, which also had no keeper) answers "method not found": it is
left running with its jobs, and ``ensure`` fails saying so.
"""

from __future__ import annotations

import json
import os
import select
import socket
import time
from pathlib import Path
from typing import Any

from ..errors import AgentUnavailableError, RemoteExecError
from ..protocol import PROTOCOL_VERSION, Method
from ..protocol.agentdir import STREAM_SOCKET
from .relay import SERVER_INFO_REQUEST, frame_request
from .statedir import ensure_server

__all__ = ["take_over"]

HANDOVER_TIMEOUT = 30.0


def _call(sock: Path, method: str, timeout: float) -> dict[str, Any]:
    """One JSON-RPC call over the agent's HTTP socket (a handover; an agent older than the
    frame stream). ``http.client`` is imported here: the relay's start does without it.

    :raises OSError: the agent cannot be reached or answered no HTTP.
    :raises ValueError: its answer is not JSON.
    """
    import http.client

    class UnixHTTP(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(timeout)
            self.sock.connect(os.fspath(sock))

    conn = UnixHTTP("localhost", timeout=timeout)
    try:
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": {}})
        conn.request("POST", "/rpc", body, {"Content-Type": "application/json"})
        answer = json.loads(conn.getresponse().read(1 << 20))
    except http.client.HTTPException as exc:
        raise ConnectionError(f"not an HTTP answer: {exc!r}") from exc
    finally:
        conn.close()
    return answer if isinstance(answer, dict) else {}


def take_over(state_dir: Path, serve_args: list[str], version: str) -> bytes | None:
    """Hand the state dir's jobs over to an agent of ``version`` if another version serves it.
    Blocking. Returns the ``server_info`` answer line of the agent found serving when it is of
    ``version`` (``ensure`` prints it instead of asking again); None after a handover, or when
    there was no answer to keep.

    :raises AgentUnavailableError: the running agent cannot hand over (too old, no keeper) or
        did not leave in time.
    """
    sock = state_dir / "agent.sock"
    try:
        info, line = _server_info(state_dir, sock)
    except (OSError, ValueError, RemoteExecError):
        return None  # it went away meanwhile: the next connect starts ours
    if not info.get("version"):
        return None  # an error answered (a busy agent), not a version: nothing to decide on
    if info.get("version") == version and info.get("protocol_version") == PROTOCOL_VERSION:
        return line
    theirs = f"version {info.get('version')} (protocol {info.get('protocol_version')})"
    try:
        answer = _call(sock, Method.SERVER_HANDOVER, 10.0)
    except (OSError, ValueError) as exc:
        raise AgentUnavailableError(
            f"the agent of {theirs} in {state_dir} did not answer server_handover: {exc}"
        ) from None
    if "error" in answer:
        why = (answer.get("error") or {}).get("message", "")
        raise AgentUnavailableError(
            f"an agent of {theirs} serves {state_dir} and cannot hand its jobs over to version {version} ({why}); "
            "it was left running with its jobs: stop it (SIGTERM to its pid ends its jobs) or wait for its idle exit"
        )
    _wait_gone(int(info.get("pid") or 0), HANDOVER_TIMEOUT)
    ensure_server(state_dir, serve_args)
    return None


def _server_info(state_dir: Path, sock: Path) -> tuple[dict[str, Any], bytes | None]:
    """The running agent's ``server_info`` and its answer line: over its frame stream (asked at
    every ``ensure`` and channel start, so by the standard library's socket, and without making
    the agent load aiohttp for its HTTP socket); over HTTP from an agent older than the frame
    stream (no line: its answer is not the frame stream's)."""
    line = None
    try:
        line = frame_request(state_dir / STREAM_SOCKET, SERVER_INFO_REQUEST)
        answer = json.loads(line)
    except FileNotFoundError:
        answer = _call(sock, Method.SERVER_INFO, 10.0)
    result = answer.get("result") if isinstance(answer, dict) else None
    return (result, line) if isinstance(result, dict) else ({}, None)


def _wait_gone(pid: int, timeout: float) -> None:
    """Until ``pid`` has exited (its pidfd turns readable)."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return  # gone already
    try:
        deadline = time.monotonic() + timeout
        if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            raise AgentUnavailableError(f"the agent (pid {pid}) did not exit within {timeout:.0f} s of its handover")
    finally:
        os.close(fd)
