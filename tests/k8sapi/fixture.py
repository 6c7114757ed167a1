"""Start the fast-tier API server from a test and talk to it (no pytest here: tests wire their fixtures).

:meth:`FastApiServer.start` runs ``python -m tests.k8sapi`` as a child, waits (bounded) for
its ``ready`` line on a pipe, and returns with the URL and kubeconfig. The child stops when
:meth:`FastApiServer.stop` sends SIGTERM, and also when this process dies (it watches its
stdin, whose other end only we hold), so no server outlives the test run. Its log is
``DIR/server.log``: every request, pod change and exec, for a failing test's message.

The helpers speak plain HTTPS (``http.client``), blocking: they are for a test's set-up and
checks, not for the code under test, which brings its own client.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import select
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

__all__ = ["ApiRequestError", "FastApiServer"]

ROOT = Path(__file__).resolve().parent.parent.parent
START_TIMEOUT = 60.0
Pod = dict[str, Any]


class ApiRequestError(Exception):
    """The server answered an error ``Status``."""

    def __init__(self, status: int, body: Any) -> None:
        message = body.get("message", body) if isinstance(body, dict) else body
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.body = status, body


def _read_line(pipe: IO[bytes], deadline: float) -> bytes:
    """One line from ``pipe``, waiting on the pipe itself (select) until ``deadline``; b"" at EOF
    or when the time is out."""
    fd, line = pipe.fileno(), b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return b""
        chunk = os.read(fd, 1)  # a byte at a time: nothing after the line is taken from the pipe
        if not chunk:
            return b""
        line += chunk
    return line


class FastApiServer:
    """A running fast-tier API server.

    :ivar url: ``https://127.0.0.1:PORT``.
    :ivar kubeconfig: its kubeconfig (contexts ``token``, current, and ``cert``).
    :ivar directory: its directory (certificates, token, ``server.log``).
    """

    def __init__(self, directory: Path, proc: subprocess.Popen[bytes], url: str) -> None:
        self.directory, self.url, self._proc = directory, url, proc
        self.kubeconfig = directory / "kubeconfig"
        self.token = (directory / "token").read_text()
        self.ca = directory / "ca.crt"
        self.client_cert, self.client_key = directory / "client.crt", directory / "client.key"
        self.port = int(url.rsplit(":", 1)[1])
        self._ssl = ssl.create_default_context(cafile=str(self.ca))

    @classmethod
    def start(cls, directory: Path, docker_host: str, timeout: float = START_TIMEOUT) -> FastApiServer:
        """Start a server on the engine at ``docker_host``; its files go to ``directory``.

        :raises RuntimeError: it did not print its ready line within ``timeout`` (with its log).
        """
        directory.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "tests.k8sapi", "--dir", str(directory), "--docker-host", docker_host]
        with open(directory / "server.log", "ab") as log:
            proc = subprocess.Popen(
                [*argv, "--stop-on-stdin-eof"],
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env={**os.environ, "DOCKER_HOST": docker_host},
                start_new_session=True,  # no terminal signals from the test run; it stops when told
            )
        assert proc.stdout is not None
        line = _read_line(proc.stdout, time.monotonic() + timeout).decode(errors="replace")
        if not line.startswith("ready https://"):
            try:  # it may be on its way out (EOF came first): its exit code says more than a timeout
                code: int | None = proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                code = None
            why = f"exited with code {code}" if code is not None else f"was not ready within {timeout:.0f} s"
            proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()
            tail = (directory / "server.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the fast-tier API server {why} ({line!r}); its log:\n{tail}")
        return cls(directory, proc, line.split()[1])

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM, and wait for its clean exit (it removes its pods' containers); SIGKILL late."""
        proc = self._proc
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()

    @property
    def returncode(self) -> int | None:
        return self._proc.poll()

    @property
    def pid(self) -> int:
        """The server process's pid."""
        return self._proc.pid

    def __enter__(self) -> FastApiServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _connection(self, timeout: float) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection("127.0.0.1", self.port, context=self._ssl, timeout=timeout)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}

    def request(self, method: str, path: str, body: Any = None, timeout: float = 60.0) -> Any:
        """One API call; the decoded JSON answer.

        :raises ApiRequestError: an error status (its ``Status`` body in ``.body``).
        """
        conn = self._connection(timeout)
        try:
            data = json.dumps(body).encode() if body is not None else None
            headers = {**self._headers(), **({"Content-Type": "application/json"} if data else {})}
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = raw.decode(errors="replace")
        if resp.status >= 400:
            raise ApiRequestError(resp.status, answer)
        return answer

    def get_pod(self, namespace: str, name: str) -> Pod | None:
        """The pod, or None if there is none."""
        try:
            pod: Pod = self.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        except ApiRequestError as exc:
            if exc.status == 404:
                return None
            raise
        return pod

    def delete_pod(self, namespace: str, name: str) -> Pod:
        pod: Pod = self.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")
        return pod

    def execs(self) -> dict[str, Any]:
        """The server's record: ``execs`` (each with its ``protocol``), ``spdy_upgrades``."""
        found: dict[str, Any] = self.request("GET", "/_test/execs")
        return found

    def wait_for_pod(
        self, namespace: str, name: str, until: Callable[[Pod | None], bool], timeout: float = 60.0
    ) -> Pod | None:
        """Watch the pod until ``until(pod)`` (``pod`` None once it is deleted) holds; that state.

        :raises TimeoutError: not within ``timeout`` (with the last state seen).
        """
        deadline = time.monotonic() + timeout
        last: Pod | None = None
        path = f"/api/v1/namespaces/{namespace}/pods?watch=1&fieldSelector=metadata.name%3D{name}"
        path += f"&timeoutSeconds={max(1, math.ceil(timeout))}"
        conn = self._connection(timeout + 5)
        try:
            conn.request("GET", path, headers=self._headers())
            resp = conn.getresponse()
            if resp.status != 200:
                raise ApiRequestError(resp.status, resp.read().decode(errors="replace"))
            if self.get_pod(namespace, name) is None and until(None):  # the watch starts with ADDED if it exists
                return None
            while time.monotonic() < deadline:
                line = resp.readline()
                if not line:
                    break
                event = json.loads(line)
                last = None if event["type"] == "DELETED" else event["object"]
                if until(last):
                    return last
        finally:
            conn.close()
        state = json.dumps(last["status"]) if last else "none"
        raise TimeoutError(f"pod {namespace}/{name}: not as awaited within {timeout:.0f} s; last status: {state}")

    def create_pod(
        self,
        namespace: str,
        name: str,
        image: str,
        command: list[str],
        *,
        memory: str | None = None,
        labels: dict[str, str] | None = None,
        wait: bool = True,
        timeout: float = 60.0,
    ) -> Pod:
        """Create a one-container pod (container ``main``, ``restartPolicy: Never``); with
        ``wait``, return it once it runs (watched, not polled).

        :raises ApiRequestError: the server refused it.
        :raises RuntimeError: it ended or could not start instead of running.
        """
        container: Pod = {"name": "main", "image": image, "command": command}
        if memory:
            container["resources"] = {"limits": {"memory": memory}}
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
            "spec": {"restartPolicy": "Never", "containers": [container]},
        }
        pod: Pod = self.request("POST", f"/api/v1/namespaces/{namespace}/pods", body)
        if not wait:
            return pod

        def started(p: Pod | None) -> bool:
            return p is None or p["status"]["phase"] != "Pending" or _waiting_reason(p) != "ContainerCreating"

        found = self.wait_for_pod(namespace, name, started, timeout)
        if found is None or found["status"]["phase"] != "Running":
            raise RuntimeError(f"pod {namespace}/{name} did not run: {json.dumps(found and found['status'])}")
        return found


def _waiting_reason(pod: Pod) -> str:
    for status in pod["status"].get("containerStatuses", []):
        reason = status.get("state", {}).get("waiting", {}).get("reason")
        if reason:
            return str(reason)
    return ""
