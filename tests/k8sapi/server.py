"""The fast tier's HTTP face: the part of the core/v1 API that kubectl and the Python clients use.

Served (HTTPS on loopback, a bearer token or a client certificate from the CA): discovery
(``/version``, ``/api``, ``/api/v1``, ``/apis``), namespaces (implicit: any name exists), pods
(create, get, list and watch with selectors, delete), ``pods/exec`` (:mod:`.execws`),
``pods/log``, and ``GET /_test/execs`` (each exec's negotiated protocol, and the SPDY upgrades
refused) for tests to assert on. Anything else is a ``Status`` 404, so a client asking for
more fails loudly. Every request is logged to stderr (the fixture keeps it as ``server.log``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import secrets
import signal
import ssl
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from .certs import Credentials, make_credentials, write_kubeconfig
from .engine import Docker, reap
from .execws import ExecLog, handle_exec
from .objects import JSON, ApiError, bad_request, pod_table, status_failure
from .podspec import LABEL_INSTANCE, container_name
from .selection import parse_selectors
from .store import PodStore

__all__ = ["make_app", "serve"]

log = logging.getLogger("k8sapi")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
VERSION = {"major": "1", "minor": "37", "gitVersion": "v1.37.0-rx-fast", "gitTreeState": "clean"}
VERSION |= {
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "python",
    "compiler": "aiohttp",
    "platform": "linux/amd64",
}
RESOURCES = [
    {"name": "namespaces", "singularName": "namespace", "namespaced": False, "kind": "Namespace", "shortNames": ["ns"]},
    {
        "name": "pods",
        "singularName": "pod",
        "namespaced": True,
        "kind": "Pod",
        "shortNames": ["po"],
        "categories": ["all"],
    },
    {"name": "pods/exec", "singularName": "", "namespaced": True, "kind": "PodExecOptions"},
    {"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod"},
]
VERBS = {
    "namespaces": ["get", "list"],
    "pods": ["create", "delete", "get", "list", "watch"],
    "pods/exec": ["create", "get"],
    "pods/log": ["get"],
}
WATCH_DEFAULT_SECONDS = 1800  # the API server's --min-request-timeout
CLIENT_CHECK_SECONDS = 5.0  # how often a quiet watch looks whether its client is still there


def _json(body: JSON, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(body).encode(), status=status, content_type="application/json")


class Api:
    """The routes, over one :class:`PodStore`."""

    def __init__(self, store: PodStore, docker: Docker, creds: Credentials) -> None:
        self.store, self.docker, self.token = store, docker, creds.token
        self.execs = ExecLog()
        self.live: set[asyncio.Task[object]] = set()  # watches and log follows, cancelled at shutdown

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Authenticate (401 ``Status`` otherwise); any :class:`ApiError` becomes its ``Status``."""
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        header = request.headers.get("Authorization", "")
        token_ok = header.startswith("Bearer ") and hmac.compare_digest(
            header[7:].strip().encode(), self.token.encode()
        )
        if not (peer or token_ok):
            return _json(status_failure(401, "Unauthorized", "Unauthorized"), 401)
        try:
            return await handler(request)
        except ApiError as exc:
            return _json(exc.status, exc.code)
        except web.HTTPNotFound:
            return _json(status_failure(404, "NotFound", "the server could not find the requested resource", {}), 404)
        except web.HTTPMethodNotAllowed:
            return _json(status_failure(405, "MethodNotAllowed", "the server does not allow this method"), 405)

    async def version(self, request: web.Request) -> web.Response:
        return _json(VERSION)

    async def api(self, request: web.Request) -> web.Response:
        host = request.host
        return _json({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": host}
        ]})  # fmt: skip

    async def apis(self, request: web.Request) -> web.Response:
        return _json({"kind": "APIGroupList", "apiVersion": "v1", "groups": []})

    async def api_v1(self, request: web.Request) -> web.Response:
        resources = [{**r, "verbs": VERBS[str(r["name"])]} for r in RESOURCES]
        return _json({"kind": "APIResourceList", "groupVersion": "v1", "resources": resources})

    def _namespace(self, name: str) -> JSON:
        meta = {"name": name, "uid": f"ns-{name}", "resourceVersion": "1", "creationTimestamp": "2026-01-01T00:00:00Z"}
        return {"kind": "Namespace", "apiVersion": "v1", "metadata": meta, "status": {"phase": "Active"}}

    async def namespaces(self, request: web.Request) -> web.Response:
        items = [self._namespace(ns) for ns in self.store.namespaces()]
        return _json(
            {"kind": "NamespaceList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": items}
        )

    async def namespace(self, request: web.Request) -> web.Response:
        return _json(self._namespace(request.match_info["ns"]))

    async def pods(self, request: web.Request) -> web.StreamResponse:
        """List (a ``PodList``, or the ``Table`` kubectl asks for) or, with ``watch``, watch."""
        ns = request.match_info.get("ns")
        q = request.query
        select = parse_selectors(q.get("labelSelector", ""), q.get("fieldSelector", ""))
        if q.get("watch", "").lower() in ("1", "true"):
            return await self._watch(request, ns, select)
        items = self.store.pods(ns, select)
        rv = str(self.store.resource_version)
        if "as=Table" in request.headers.get("Accept", ""):
            return _json(pod_table(items, rv, q.get("includeObject", "PartialObjectMetadata")))
        return _json({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": rv}, "items": items})

    async def _watch(self, request: web.Request, ns: str | None, select: Callable[[JSON], bool]) -> web.StreamResponse:
        """Events after ``resourceVersion`` (none or "0": the current pods as ADDED first), one
        JSON object a line, until ``timeoutSeconds``; a version too old is an ERROR 410 event."""
        since = request.query.get("resourceVersion", "")
        if since not in ("", "0") and not since.isdigit():
            raise bad_request(f"invalid resourceVersion {since!r}")
        timeout = float(request.query.get("timeoutSeconds") or WATCH_DEFAULT_SECONDS)
        deadline = asyncio.get_running_loop().time() + timeout
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)

        async def send(kind: str, obj: JSON) -> None:
            await resp.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

        task = asyncio.current_task()
        assert task is not None
        self.live.add(task)
        try:
            cursor = int(since or 0)
            if since in ("", "0"):
                cursor = self.store.resource_version
                for pod in self.store.pods(ns, select):
                    await send("ADDED", pod)
            while True:
                changed = self.store.changed()
                try:
                    events = self.store.events_after(cursor)
                except ApiError as exc:
                    await send("ERROR", exc.status)
                    break
                for event in events:
                    cursor = event.rv
                    if ns in (None, event.pod["metadata"]["namespace"]) and select(event.pod):
                        await send(event.type, event.pod)
                if not await self._wait_change(request, changed, deadline):
                    break
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.live.discard(task)
        with contextlib.suppress(ConnectionResetError):
            await resp.write_eof()
        return resp

    @staticmethod
    async def _wait_change(request: web.Request, changed: asyncio.Event, deadline: float) -> bool:
        """Wait for the store's next change: True, or False at the deadline or once the client
        has gone (looked at every few seconds: aiohttp does not cancel a handler whose client
        left, and a watch nobody reads would otherwise live out its timeoutSeconds)."""
        loop = asyncio.get_running_loop()
        while (left := deadline - loop.time()) > 0:
            try:
                await asyncio.wait_for(changed.wait(), min(left, CLIENT_CHECK_SECONDS))
                return True
            except TimeoutError:
                if request.transport is None or request.transport.is_closing():
                    return False
        return False

    async def create(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            raise bad_request("the body is not JSON") from None
        return _json(await self.store.create(request.match_info["ns"], body), 201)

    async def get(self, request: web.Request) -> web.Response:
        return _json(self.store.get(request.match_info["ns"], request.match_info["name"]))

    async def delete(self, request: web.Request) -> web.Response:
        return _json(await self.store.delete(request.match_info["ns"], request.match_info["name"]))

    async def exec(self, request: web.Request) -> web.StreamResponse:
        return await handle_exec(request, self.store, self.docker, self.execs)

    async def logs(self, request: web.Request) -> web.StreamResponse:
        """``docker logs`` of the container (stdout and stderr as one stream, as the kubelet's)."""
        ns, name = request.match_info["ns"], request.match_info["name"]
        pod = self.store.get(ns, name)
        names = [c["name"] for c in pod["spec"]["containers"]]
        container = request.query.get("container") or names[0]
        if container not in names:
            raise bad_request(f"container {container} is not valid for pod {name}")
        args = ["logs"] + (
            ["--tail", request.query["tailLines"]] if request.query.get("tailLines", "").isdigit() else []
        )
        args += ["-f"] if request.query.get("follow", "").lower() in ("1", "true") else []
        proc = await asyncio.create_subprocess_exec(
            "docker", *args, container_name(ns, name, container),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            env=self.docker.env,
        )  # fmt: skip
        assert proc.stdout is not None
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await resp.prepare(request)
        task = asyncio.current_task()
        assert task is not None
        self.live.add(task)
        try:
            while chunk := await proc.stdout.read(65536):
                await resp.write(chunk)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.live.discard(task)
            if proc.returncode is None:
                proc.kill()
            await reap(proc)
        with contextlib.suppress(ConnectionResetError):
            await resp.write_eof()
        return resp

    async def test_execs(self, request: web.Request) -> web.Response:
        return _json(self.execs.snapshot())

    async def shutdown(self) -> None:
        await self.execs.shutdown()
        for task in list(self.live):
            task.cancel()


def make_app(api: Api) -> web.Application:
    app = web.Application(middlewares=[api.middleware], client_max_size=8 * 2**20)
    pods, pod = "/api/v1/namespaces/{ns}/pods", "/api/v1/namespaces/{ns}/pods/{name}"
    app.router.add_get("/version", api.version)
    app.router.add_get("/api", api.api)
    app.router.add_get("/apis", api.apis)
    app.router.add_get("/api/v1", api.api_v1)
    app.router.add_get("/api/v1/namespaces", api.namespaces)
    app.router.add_get("/api/v1/namespaces/{ns}", api.namespace)
    app.router.add_get("/api/v1/pods", api.pods)
    app.router.add_get(pods, api.pods)
    app.router.add_post(pods, api.create)
    app.router.add_get(pod, api.get)
    app.router.add_delete(pod, api.delete)
    app.router.add_get(pod + "/exec", api.exec)
    app.router.add_post(pod + "/exec", api.exec)
    app.router.add_get(pod + "/log", api.logs)
    app.router.add_get("/_test/execs", api.test_execs)
    return app


def _ssl_context(creds: Credentials) -> ssl.SSLContext:
    """The server's certificate; client certificates asked for but optional (tokens need none)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(creds.ca))
    ctx.load_cert_chain(str(creds.server_cert), str(creds.server_key))
    ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


async def _stdin_eof() -> None:
    """Returns when our stdin reaches EOF: the parent that holds its other end has gone."""
    reader = asyncio.StreamReader()
    await asyncio.get_running_loop().connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while await reader.read(4096):
        pass


def _announce(directory: Path, url: str, creds: Credentials) -> None:
    """The kubeconfig and pid file, written once the URL is known (before the ready line)."""
    write_kubeconfig(directory / "kubeconfig", url, creds)
    (directory / "server.pid").write_text(f"{os.getpid()}\n")


async def serve(directory: Path, docker_host: str, stop_on_stdin_eof: bool = False) -> int:
    """Run until SIGTERM/SIGINT (or stdin's EOF, or the engine's end); 0 on a clean stop."""
    creds = await asyncio.to_thread(make_credentials, directory)
    docker = Docker(docker_host)
    probe = await docker.run("version", "--format", "{{.Server.Version}}")
    if probe.returncode != 0:  # no ready line: the fixture fails at once with this in the log
        log.error("the engine at DOCKER_HOST=%s does not answer: %s", docker_host, probe.error())
        return 2
    instance = secrets.token_hex(6)
    events = await docker.events(time.time(), f"{LABEL_INSTANCE}={instance}")
    store = PodStore(docker, instance)
    api = Api(store, docker, creds)
    runner = web.AppRunner(
        make_app(api),
        handle_signals=False,
        shutdown_timeout=2.0,
        access_log_format='%a "%r" %s %b %Tfs "%{User-Agent}i" upgrade=%{Upgrade}i',
    )
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=_ssl_context(creds))
    await site.start()
    port = runner.addresses[0][1]
    url = f"https://127.0.0.1:{port}"
    await asyncio.to_thread(_announce, directory, url, creds)

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    waits = [asyncio.create_task(stop.wait()), asyncio.create_task(store.follow(events))]
    waits += [asyncio.create_task(_stdin_eof())] if stop_on_stdin_eof else []
    print(f"ready {url}", flush=True)
    log.info("serving %s for DOCKER_HOST=%s (instance %s)", url, docker_host, instance)
    done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    engine_gone = waits[1] in done
    log.info("stopping (%s)", "docker events ended" if engine_gone else "asked to")
    await api.shutdown()
    await runner.cleanup()
    await store.shutdown()
    for task in waits:
        task.cancel()
    await asyncio.gather(*waits, return_exceptions=True)
    if events.returncode is None:
        events.kill()
    await reap(events)
    return 1 if engine_gone else 0
