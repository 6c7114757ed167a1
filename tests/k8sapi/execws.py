"""``pods/{name}/exec`` over WebSocket (``v5.channel.k8s.io``, ``v4.channel.k8s.io``), as ``docker exec``.

The protocol is the API server's (``apiserver/pkg/util/proxy/websocket.go`` and
``wsstream/conn.go`` in Kubernetes), checked against those sources:

- the subprotocol is the first one *the client* lists that the server speaks;
- once upgraded, the server sends one empty message (the channel byte alone) on the lowest
  output channel the client asked for (stdout, else stderr, else the error channel), and only
  that one: the "connection is established" mark;
- every binary message is a channel byte then data: 0 stdin, 1 stdout, 2 stderr, 3 error
  (the final ``metav1.Status``), 4 resize; v5 adds ``[255, channel]``, the client half-closing
  that channel (on stdin: EOF for the command);
- at the end the server writes the Status on channel 3 (``{"metadata":{},"status":"Success"}``,
  or ``Failure``/``NonZeroExitCode`` with the code as the ``ExitCode`` cause, message
  ``command terminated with non-zero exit code: error executing command [argv], exit code N``
  as containerd words it), sends the close frame and waits for the client's;
- a client that goes away first has its command killed (containerd's CRI does so);
- a command docker cannot start (not found: the CLI's ``OCI runtime exec failed``) ends in an
  ``InternalError`` Status, as containerd's failure to start an exec does, not in an exit code.

``tty=true`` is refused (400): the agent allocates its own pseudo-terminals.

SPDY (``Upgrade: SPDY/3.1``, what kubectl falls back to when the WebSocket upgrade fails) is
refused with a 400 and counted, so a test can show that a client used WebSocket.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from dataclasses import asdict, dataclass, field

from aiohttp import WSMsgType, web

from .engine import Docker, kill_exec, reap
from .objects import JSON, bad_request
from .podspec import container_name
from .store import PodStore

__all__ = ["PROTOCOLS", "ExecLog", "ExecRecord", "exec_status", "handle_exec"]

log = logging.getLogger("k8sapi.exec")

V5, V4 = "v5.channel.k8s.io", "v4.channel.k8s.io"
PROTOCOLS = (V5, V4)
STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255
CHUNK = 32 * 1024  # one message per read of the command's output, as client-go writes stdin
MAX_MESSAGE = 32 * 2**20  # the Python client sends a whole write_stdin() as one message
CLOSE_WAIT = 60.0  # for the client's close frame after ours (the API server waits up to 15 min)
# How the docker CLI reports a failure of its own (not the command's): held back, then an
# InternalError Status instead of output, as when containerd cannot start the exec.
DOCKER_ERRORS = (b"OCI runtime exec failed", b"Error response from daemon:")
DOCKER_ERROR_CODES = (1, 125, 126, 127)


@dataclass
class ExecRecord:
    """One exec as the server saw it (``GET /_test/execs``)."""

    id: str
    namespace: str
    pod: str
    container: str
    command: list[str]
    protocol: str
    transport: str = "websocket"
    outcome: str = "running"  # "exited", "client went away"
    exit_code: int | None = None
    killed: list[int] = field(default_factory=list)
    started: float = field(default_factory=time.time)


@dataclass
class ExecLog:
    """Every exec, every refused SPDY upgrade, and the live sessions (killed at shutdown)."""

    records: list[ExecRecord] = field(default_factory=list)
    spdy: list[JSON] = field(default_factory=list)
    live: set[asyncio.Task[None]] = field(default_factory=set)

    def snapshot(self) -> JSON:
        return {"execs": [asdict(r) for r in self.records], "spdy_upgrades": len(self.spdy), "spdy": self.spdy}

    async def shutdown(self) -> None:
        for task in list(self.live):
            task.cancel()
        for task in list(self.live):
            with contextlib.suppress(BaseException):
                await task


def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "").lower() in ("true", "1")


def _check(request: web.Request, store: PodStore) -> tuple[str, str, list[str]]:
    """The pod's checks before any upgrade, as the API server makes them: (ns, container, argv)."""
    ns, name = request.match_info["ns"], request.match_info["name"]
    pod = store.get(ns, name)  # 404 NotFound
    names = [c["name"] for c in pod["spec"]["containers"]]
    container = request.query.get("container") or names[0]
    if container not in names:
        raise bad_request(f"container {container} is not valid for pod {name}")
    phase = pod["status"]["phase"]
    if phase in ("Succeeded", "Failed"):
        raise bad_request(f"cannot exec into a container in a completed pod; current phase is {phase}")
    argv = request.query.getall("command") if "command" in request.query else []
    if not argv:
        raise bad_request("you must specify at least 1 command")
    if not any(_flag(request, s) for s in ("stdin", "stdout", "stderr")):
        raise bad_request("you must specify at least 1 of stdin, stdout, stderr")
    if _flag(request, "tty"):
        raise bad_request("tty is not supported by the fast-tier API server (the agent makes its own)")
    state = next(s for s in pod["status"]["containerStatuses"] if s["name"] == container)["state"]
    if "running" not in state:
        why = state.get("waiting", {}).get("reason") or state.get("terminated", {}).get("reason", "")
        raise bad_request(f'container "{container}" in pod "{name}" is not running: {why}')
    return ns, container, argv


async def handle_exec(request: web.Request, store: PodStore, docker: Docker, execs: ExecLog) -> web.StreamResponse:
    """The exec subresource: checks, then the WebSocket session (or a refusal)."""
    upgrade = request.headers.get("Upgrade", "")
    if upgrade.lower().startswith("spdy"):
        offered = request.headers.getall("X-Stream-Protocol-Version", [])
        execs.spdy.append({"path": request.path_qs, "upgrade": upgrade, "protocols": offered})
        log.warning("refused a SPDY upgrade (%d so far): %s", len(execs.spdy), request.path_qs)
        _check(request, store)  # a missing pod is still a 404, as the client's other attempt said
        raise bad_request("SPDY is not supported by the fast-tier API server: use WebSocket (v5.channel.k8s.io)")
    ns, container, argv = _check(request, store)
    if upgrade.lower() != "websocket":
        raise bad_request("Upgrade request required")
    ws = web.WebSocketResponse(
        protocols=PROTOCOLS, compress=False, max_msg_size=MAX_MESSAGE, timeout=CLOSE_WAIT, autoclose=True
    )
    ready = ws.can_prepare(request)
    if not ready.ok or ready.protocol is None:
        asked = request.headers.get("Sec-WebSocket-Protocol", "")
        raise bad_request(f"requested protocol(s) are not supported: [{asked}]; supports {list(PROTOCOLS)}")
    await ws.prepare(request)
    name = request.match_info["name"]
    record = ExecRecord(secrets.token_hex(8), ns, name, container, argv, str(ws.ws_protocol))
    execs.records.append(record)
    log.info("exec %s in %s/%s/%s over %s: %s", record.id, ns, name, container, record.protocol, argv)
    session = _Session(ws, docker, record, container_name(ns, name, container))
    task = asyncio.current_task()
    assert task is not None
    execs.live.add(task)
    try:
        await session.run(_flag(request, "stdin"), _flag(request, "stdout"), _flag(request, "stderr"))
    finally:
        execs.live.discard(task)
        log.info("exec %s: %s, exit code %s", record.id, record.outcome, record.exit_code)
    return ws


class _Session:
    """One exec: the ``docker exec`` process and the WebSocket, pumped both ways."""

    def __init__(self, ws: web.WebSocketResponse, docker: Docker, record: ExecRecord, container: str) -> None:
        self.ws, self.docker, self.record, self.container = ws, docker, record, container
        self.held: dict[int, bytearray] = {}  # output that looks like the docker CLI's own error
        self.proc: asyncio.subprocess.Process | None = None

    async def run(self, stdin: bool, stdout: bool, stderr: bool) -> None:
        marker = self.record.id
        self.proc = proc = await self.docker.exec(self.container, self.record.command, marker, stdin, stdout, stderr)
        tasks: list[asyncio.Task[object]] = []
        outcome = "cancelled"  # the server stops
        try:
            await self.ws.send_bytes(bytes([STDOUT if stdout else STDERR if stderr else ERROR]))
            pumps = [asyncio.create_task(self._pump(s, ch)) for s, ch in ((proc.stdout, STDOUT), (proc.stderr, STDERR))]
            finished = asyncio.create_task(self._finish(pumps))
            client = asyncio.create_task(self._from_client())
            tasks = [*pumps, finished, client]
            await asyncio.wait({finished, client}, return_when=asyncio.FIRST_COMPLETED)
            if not finished.done() or finished.exception() is not None:  # gone, or its socket broke mid-send
                outcome = "client went away"
                return
            await self._send_status(finished.result())
            await self.ws.close()  # waits for the client's close frame; _from_client then ends
            await client
            outcome = "exited"
        finally:
            if proc.returncode is None:  # the client went away, or we are cancelled (shutdown)
                self.record.killed = await asyncio.shield(kill_exec(self.docker, self.container, marker))
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.shield(reap(proc))
            self.record.outcome = outcome  # last: a test waiting for it finds the kill done

    async def _pump(self, stream: asyncio.StreamReader | None, channel: int) -> None:
        """The command's output to the client, a read at a time: each send waits for the socket
        to drain, so a slow client holds the command back instead of filling memory."""
        if stream is None:
            return
        first = True
        while chunk := await stream.read(CHUNK):
            if first and chunk.startswith(DOCKER_ERRORS):
                self.held[channel] = bytearray()
            first = False
            held = self.held.get(channel)
            if held is not None:
                held += chunk[: 65536 - len(held)]
                continue
            await self.ws.send_bytes(bytes([channel]) + chunk)

    async def _finish(self, pumps: list[asyncio.Task[None]]) -> int:
        """The exit code, once the output is all sent."""
        assert self.proc is not None
        await asyncio.gather(*pumps)
        return await self.proc.wait()

    async def _from_client(self) -> None:
        """The client's messages to the command's stdin, until the client closes (or we do)."""
        proc = self.proc
        assert proc is not None
        stdin = proc.stdin
        while True:
            msg = await self.ws.receive()
            if msg.type != WSMsgType.BINARY:
                if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
                    return
                continue  # text: no base64 protocol is offered, so none is expected
            data: bytes = msg.data
            if not data:
                continue
            if data[0] == CLOSE and self.record.protocol == V5:
                if data[1:] == bytes([STDIN]) and stdin is not None:
                    stdin.close()
                    stdin = None
                continue
            if data[0] == STDIN and stdin is not None and len(data) > 1:
                try:
                    stdin.write(data[1:])
                    await stdin.drain()  # back-pressure: the next message is read once this is taken
                except (BrokenPipeError, ConnectionResetError):
                    stdin = None  # the command is gone or closed its stdin: the rest is dropped

    async def _send_status(self, code: int) -> None:
        """The Status on the error channel (after the held-back output, unless it was docker's error)."""
        self.record.exit_code = code
        docker_error = b"".join(self.held.values()).decode(errors="replace").strip()
        if not (docker_error and code in DOCKER_ERROR_CODES):
            docker_error = ""
            for channel, held in self.held.items():
                await self.ws.send_bytes(bytes([channel]) + bytes(held))
        status = exec_status(code, self.record.command, docker_error)
        await self.ws.send_bytes(bytes([ERROR]) + json.dumps(status, separators=(",", ":")).encode())


def exec_status(code: int, argv: list[str], docker_error: str = "") -> JSON:
    """The ``metav1.Status`` the kubelet writes when an exec ends, as Go marshals it (no kind)."""
    if docker_error:  # apierrors.NewInternalError of containerd's "failed to exec in container"
        cause = f"error executing command in container: failed to exec in container: {docker_error}"
        message = f"Internal error occurred: {cause}"
        details = {"causes": [{"message": cause}]}
        return {
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": "InternalError",
            "details": details,
            "code": 500,
        }
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    message = (
        f"command terminated with non-zero exit code: error executing command [{' '.join(argv)}], exit code {code}"
    )
    details = {"causes": [{"reason": "ExitCode", "message": str(code)}]}
    return {"metadata": {}, "status": "Failure", "message": message, "reason": "NonZeroExitCode", "details": details}
