"""``KubeApi``: one Kubernetes cluster as a kubeconfig context names it, reached directly.

kubernetes_asyncio reads the configuration (kubeconfig files and contexts, ``$KUBECONFIG``,
in-cluster service accounts; tokens, client certificates, and exec/auth-provider plugins named
by the user's own kubeconfig); the requests are ours, on one aiohttp session: a few plain JSON
calls (pods get/create/delete/list/watch) and the exec WebSocket
(:mod:`~remote_exec.sandboxes.k8sws`). No thread and no process per exec.

Every ``k8s://`` transport of one event loop naming the same kubeconfig and context shares
one :class:`KubeApi` (:meth:`KubeApi.acquire`; the last :meth:`KubeApi.release` closes it): one
configuration load (an exec plugin runs once, not once per pod), one connection pool, one
pod watch per namespace (:mod:`~remote_exec.sandboxes.k8swatch`). Five hundred sandboxes are
five hundred sockets, not five hundred ``kubectl`` processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import ssl
import weakref
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp

from ..errors import KubeApiError, SandboxError
from .k8swatch import WATCH_SECONDS, PodWatch, text
from .k8sws import CHANNEL_PROTOCOLS, CLOSING, WsExecProcess

__all__ = ["KubeApi"]

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 30.0
"""Seconds for one API request or exec handshake before it is an error (kubernetes#67457: an
exec that never answers is bounded here; once open, the channel's own heartbeat watches it)."""
MAX_BODY = 8 * 1024 * 1024
"""The most one JSON answer may hold (a pod is a few KiB; a list of a namespace's pods more)."""


_shared: dict[tuple[int, str | None, str | None], KubeApi | asyncio.Future[KubeApi]] = {}


class _LoadCancelled(Exception):
    """The caller loading a shared configuration was cancelled: a waiter loads it itself."""


class KubeApi:
    """A cluster's API server: configuration, session, watches. Use :meth:`acquire`.

    :ivar host: the API server's URL (``https://...``).
    :ivar label: what error messages call it (the context's name, or the host).
    """

    def __init__(self, key: tuple[int, str | None, str | None], config: Any) -> None:
        # (Made on the loop that uses it: its session is bound to that loop.)
        self._key = key
        self._config = config
        self.host: str = config.host.rstrip("/")
        self.label = key[2] or self.host
        # The name the server's certificate is checked against when it is not the URL's host
        # (the kubeconfig's ``tls-server-name``: an IP, a tunnel or a proxy in front of it).
        self._server_name: str | None = getattr(config, "tls_server_name", None) or None
        self._connector = _Connector(limit=0, ssl=_ssl_context(config))  # no pool cap: one socket per pod
        self._session = aiohttp.ClientSession(
            connector=self._connector,
            trust_env=True,
            read_bufsize=2**21,  # a watch event holds a whole pod (etcd's objects are at most 1.5 MiB)
        )
        self._users = 0
        self._watches: dict[str, PodWatch] = {}
        self._loop = asyncio.get_running_loop()
        self._reauth_lock = asyncio.Lock()
        self._reauthed_at = -math.inf

    @classmethod
    async def acquire(cls, kubeconfig: str | None, context: str | None) -> KubeApi:
        """The loop's shared API of ``kubeconfig`` (None: ``$KUBECONFIG``, ``~/.kube/config``,
        or the pod's service account) and ``context`` (None: the current one).

        The first caller loads the configuration; callers meanwhile wait for that one load (a
        hundred sandboxes opened at once load it once, and make one session).

        :raises SandboxError: no usable configuration (missing file, unknown context).
        """
        key = (id(asyncio.get_running_loop()), kubeconfig, context)
        while True:
            shared = _shared.get(key)
            if shared is None:
                loading: asyncio.Future[KubeApi] = asyncio.get_running_loop().create_future()
                _shared[key] = loading
                try:
                    api = cls(key, await _load_config(kubeconfig, context))
                except BaseException as exc:
                    del _shared[key]
                    loading.set_exception(exc if isinstance(exc, Exception) else _LoadCancelled())
                    loading.exception()  # (seen: the waiters get it)
                    raise
                loading.set_result(api)
                _shared[key] = api
            elif isinstance(shared, asyncio.Future):
                try:
                    api = await asyncio.shield(shared)
                except _LoadCancelled:
                    continue  # that caller gave up: load it ourselves
            elif shared._loop is not asyncio.get_running_loop():  # a dead loop's, whose id was reused
                del _shared[key]
                continue
            else:
                api = shared
            if _shared.get(key) is api:  # not released to nothing while we waited
                api._users += 1
                return api

    async def release(self) -> None:
        """One user fewer; the last closes the session and stops the watches."""
        self._users -= 1
        if self._users > 0:
            return
        _shared.pop(self._key, None)
        try:
            for watch in self._watches.values():
                await watch.aclose()
        finally:  # closed even when a watch's end is cancelled: nobody else can reach the session
            self._watches.clear()
            closing = [t for t in CLOSING if t.get_loop() is self._loop]
            if closing:  # exec sockets still saying goodbye: an upgraded connection is not the pool's
                await asyncio.shield(asyncio.wait(closing, timeout=5.0))
            await asyncio.shield(self._session.close())
            # A connection closed on its own before (a response cut short, a refused upgrade)
            # may still be waiting for the server's TLS close_notify, which kube-apiserver never
            # sends: its socket would outlive the loop. Nothing more is said on any of them.
            if self._connector.abort_all():
                await asyncio.sleep(0)  # their sockets close in the loop's next turn

    def watch(self, namespace: str) -> PodWatch:
        """The namespace's pod watch (started on first use, shared by every pod in it)."""
        watch = self._watches.get(namespace)
        if watch is None:
            watch = self._watches[namespace] = PodWatch(self, namespace)
        return watch

    async def headers(self) -> dict[str, str]:
        """The request headers that authenticate us (a bearer token, basic auth), if any."""
        config = self._config
        token = await config.get_api_key_with_prefix("BearerToken", alias="authorization")
        if token:
            return {"Authorization": token}
        if config.username and config.password:
            return {"Authorization": config.get_basic_auth_token()}
        return {}

    async def reauthenticate(self) -> bool:
        """After a 401: load the configuration again (an exec plugin's or OIDC token expired:
        EKS tokens last 15 minutes), once for every user of this API, at most every 10 s.
        True if the credentials may have changed (the caller asks once more)."""
        async with self._reauth_lock:
            now = self._loop.time()
            if now - self._reauthed_at < 10.0:
                return now - self._reauthed_at < 1.0  # another caller just did it: try with theirs
            self._reauthed_at = now
            try:
                fresh = await _load_config(self._key[1], self._key[2])
            except SandboxError as exc:
                log.warning("%s: reloading the kubeconfig after a 401: %s", self.label, exc)
                return False
            self._config.api_key = fresh.api_key
            self._config.username, self._config.password = fresh.username, fresh.password
            return True

    def url(self, path: str, query: Sequence[tuple[str, str]] = ()) -> str:
        """The API server's URL of ``path`` with ``query``."""
        return self.host + path + (f"?{urlencode(list(query))}" if query else "")

    async def request(self, method: str, path: str, body: Mapping[str, Any] | None = None, **query: str) -> Any:
        """One JSON request; its decoded answer (asked once more after a 401 and a reload of
        the credentials).

        :raises KubeApiError: the server answered an error (its ``Status`` message kept).
        :raises SandboxError: the server could not be reached in :data:`CONNECT_TIMEOUT`.
        """
        try:
            return await self._request(method, path, body, query)
        except KubeApiError as exc:
            if exc.status != 401 or not await self.reauthenticate():
                raise
        return await self._request(method, path, body, query)

    async def _request(self, method: str, path: str, body: Mapping[str, Any] | None, query: Mapping[str, str]) -> Any:
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                async with self._session.request(
                    method,
                    self.url(path, list(query.items())),
                    json=body,
                    headers=await self.headers(),
                    proxy=self._config.proxy,
                    server_hostname=self._server_name,
                ) as resp:
                    raw = await _read_body(resp.content, MAX_BODY + 1)
                    status = resp.status
        except TimeoutError:
            raise SandboxError(f"{self.label}: {method} {path}: no answer within {CONNECT_TIMEOUT:.0f} s") from None
        except aiohttp.ClientError as exc:
            raise SandboxError(f"{self.label}: {method} {path}: {exc}") from exc
        if len(raw) > MAX_BODY:
            raise SandboxError(f"{self.label}: {method} {path}: an answer over {MAX_BODY} bytes")
        if status >= 400:
            raise status_error(f"{method} {path}", status, raw, self.label)
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):
            raise SandboxError(f"{self.label}: {method} {path}: an answer that is not JSON") from None

    async def stream(self, path: str, **query: str) -> aiohttp.ClientResponse:
        """A long GET (a watch): the open response, read by the caller (who closes it).

        :raises KubeApiError: as :meth:`request` (a 401 too, after one reload of the credentials).
        """
        try:
            return await self._stream(path, query)
        except KubeApiError as exc:
            if exc.status != 401 or not await self.reauthenticate():
                raise
        return await self._stream(path, query)

    async def _stream(self, path: str, query: Mapping[str, str]) -> aiohttp.ClientResponse:
        resp = await self._session.get(
            self.url(path, list(query.items())),
            headers=await self.headers(),
            proxy=self._config.proxy,
            server_hostname=self._server_name,
            # The server ends a watch after WATCH_SECONDS; a read silent far past that is a
            # half-open connection (a NAT dropped it, the server failed over): start again.
            timeout=aiohttp.ClientTimeout(sock_connect=CONNECT_TIMEOUT, sock_read=WATCH_SECONDS + 60),
        )
        if resp.status >= 400:
            try:
                raw = await _read_body(resp.content, 64 * 1024)
            finally:
                resp.close()  # (cancelled while reading it too)
            raise status_error(f"watch {path}", resp.status, raw, self.label)
        return resp

    async def exec(
        self, namespace: str, pod: str, container: str | None, argv: Sequence[str], limit: int
    ) -> WsExecProcess:
        """Run ``argv`` in the pod's container over one WebSocket (stdin and stdout; stderr kept
        only for messages), offering ``v5.channel.k8s.io`` then ``v4``.

        :raises KubeApiError: the server refused the exec (no such pod or container, no right).
        :raises SandboxError: no answer within :data:`CONNECT_TIMEOUT`.
        """
        query = [("command", arg) for arg in argv]
        query += [("container", container)] if container else []
        query += [("stdin", "true"), ("stdout", "true"), ("stderr", "true"), ("tty", "false")]
        path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(pod)}/exec"
        url = self.url(path, query)
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                ws = await self._session.ws_connect(
                    "wss" + url[5:] if url.startswith("https") else "ws" + url[4:],
                    protocols=CHANNEL_PROTOCOLS,
                    headers=await self.headers(),
                    proxy=self._config.proxy,
                    server_hostname=self._server_name,
                    max_msg_size=limit + 1024,
                    autoping=True,
                    timeout=aiohttp.ClientWSTimeout(ws_close=2.0),
                )
        except TimeoutError:
            raise SandboxError(
                f"{self.label}: exec in {namespace}/{pod}: no answer within {CONNECT_TIMEOUT:.0f} s"
            ) from None
        except aiohttp.WSServerHandshakeError as exc:
            raise KubeApiError(
                f"{self.label}: exec in {namespace}/{pod} refused: HTTP {exc.status} {exc.message}", exc.status
            ) from exc
        except aiohttp.ClientError as exc:
            raise SandboxError(f"{self.label}: exec in {namespace}/{pod}: {exc}") from exc
        if ws.protocol not in CHANNEL_PROTOCOLS:
            await ws.close()
            raise SandboxError(
                f"{self.label}: the API server offered no channel protocol we speak "
                f"({ws.protocol or 'none'}; we speak {', '.join(CHANNEL_PROTOCOLS)}): try ?via=kubectl"
            )
        return WsExecProcess(ws, limit)


class _Connector(aiohttp.TCPConnector):
    """aiohttp's connector, remembering the transports it made (weakly) so that the last
    release can abort any still open: see :meth:`KubeApi.release`."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._made: weakref.WeakSet[asyncio.Transport] = weakref.WeakSet()

    async def _wrap_create_connection(self, *args: Any, **kwargs: Any) -> Any:
        made = await super()._wrap_create_connection(*args, **kwargs)
        self._made.add(made[0])
        return made

    def abort_all(self) -> int:
        """Abort every transport it made that is still alive (one closed already is left
        alone: aborting twice is a no-op); how many it had."""
        made = list(self._made)
        for transport in made:
            with contextlib.suppress(AttributeError, RuntimeError):  # (an SSL transport fully closed)
                transport.abort()
        return len(made)


async def _read_body(content: aiohttp.StreamReader, limit: int) -> bytes:
    """The body up to its end or ``limit`` bytes, whichever comes first (``read(n)`` alone
    returns what has arrived so far)."""
    out = bytearray()
    while len(out) < limit and (chunk := await content.read(limit - len(out))):
        out += chunk
    return bytes(out)


def status_error(what: str, status: int, raw: bytes, label: str) -> KubeApiError:
    """An error answer's ``Status`` (untrusted JSON) as an :class:`KubeApiError` with its message."""
    message, reason = "", ""
    try:
        body = json.loads(raw[: 64 * 1024])
        if isinstance(body, dict):
            message, reason = text(body.get("message", ""), 500), text(body.get("reason", ""), 100)
    except (ValueError, RecursionError):
        message = text(raw[:200].decode(errors="replace"))
    return KubeApiError(f"{label}: {what}: HTTP {status} {reason}: {message or '(no message)'}", status, reason)


def _ssl_context(config: Any) -> ssl.SSLContext | bool:
    """The TLS settings a kubeconfig gives (its CA, client certificate, insecure-skip-verify)."""
    if not config.host.startswith("https"):
        return False
    context = ssl.create_default_context(cafile=config.ssl_ca_cert)
    if config.cert_file:
        context.load_cert_chain(config.cert_file, keyfile=config.key_file)
    if not config.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


async def _load_config(kubeconfig: str | None, context: str | None) -> Any:
    """kubernetes_asyncio's configuration of ``kubeconfig`` and ``context``: the kubeconfig file,
    else (no file at all, inside a pod) the pod's service account.

    Loaded on a loop of its own in a worker thread: the loader reads files, writes the
    certificates a kubeconfig embeds to temporary files, and imports a second of modules, none
    of which may stall the caller's loop. An exec plugin runs there too (as a subprocess).
    """
    return await asyncio.to_thread(asyncio.run, _load_in_thread(kubeconfig, context))


async def _load_in_thread(kubeconfig: str | None, context: str | None) -> Any:
    try:
        from kubernetes_asyncio import config as kube_config
        from kubernetes_asyncio.client import Configuration
    except ImportError:
        raise SandboxError("k8s:// needs kubernetes_asyncio: pip install 'remote-exec-sandbox[k8s]'") from None

    config = Configuration()
    # (On its own loop in a worker thread: blocking here stalls nobody; see loopguard.DELIBERATE.)
    paths = kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")  # noqa: ASYNC240
    try:
        if kubeconfig is None and not any(os.path.exists(p) for p in paths.split(os.pathsep)):  # noqa: ASYNC240
            if "KUBERNETES_SERVICE_HOST" in os.environ:
                kube_config.load_incluster_config(client_configuration=config)  # type: ignore[no-untyped-call]
                return config
            raise SandboxError(f"no kubeconfig at {paths} (set KUBECONFIG, or ?kubeconfig=)")
        await kube_config.load_kube_config(
            config_file=paths, context=context, client_configuration=config, persist_config=False
        )
    except kube_config.ConfigException as exc:
        raise SandboxError(f"kubeconfig {paths}: {exc}") from exc
    except SandboxError:
        raise
    except Exception as exc:  # a malformed file, a plugin that failed, an OIDC refresh refused...
        raise SandboxError(f"kubeconfig {paths}{f' context {context}' if context else ''}: {exc!r}") from exc
    return config
