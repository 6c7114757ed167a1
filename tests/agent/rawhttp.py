"""A bare HTTP client over a Unix socket: sends exactly the bytes a test gives it."""

from __future__ import annotations

import http.client
import json
import socket
from pathlib import Path
from typing import Any


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float = 30.0) -> None:
        super().__init__("agent", timeout=timeout)
        self._path = str(path)

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def post(sock: Path, body: bytes) -> tuple[int, bytes]:
    conn = UnixHTTPConnection(sock)
    try:
        conn.request("POST", "/rpc", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def rpc(sock: Path, method: str, params: Any = None, id_: Any = 1) -> Any:
    msg: dict[str, Any] = {"jsonrpc": "2.0", "id": id_, "method": method}
    if params is not None:
        msg["params"] = params
    status, body = post(sock, json.dumps(msg).encode())
    assert status == 200, (status, body)
    return json.loads(body)


def poll_to_end(sock: Path, job_id: str) -> dict[str, Any]:
    """Long-poll a job until its terminal state; return the last result with all output joined."""
    out, err, off = "", "", (0, 0)
    while True:
        params = {"job_id": job_id, "stdout_offset": off[0], "stderr_offset": off[1], "wait": 10}
        res: dict[str, Any] = rpc(sock, "exec_remote_poll", params)["result"]
        out, err, off = out + res["stdout"], err + res["stderr"], (res["stdout_offset"], res["stderr_offset"])
        if res["state"] != "running":
            return {**res, "stdout": out, "stderr": err}
