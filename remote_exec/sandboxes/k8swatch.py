"""``PodWatch``: one watch of a namespace's pods, telling each ``k8s://`` sandbox when its pod is gone.

An exec stream may hang rather than end when its pod goes (kubernetes#67457), and a channel
would only notice after its heartbeat's bound. The watch notices at once: a pod deleted (or
being deleted), evicted, failed, or whose container was OOM-killed, terminated or restarted is
a *verdict*, the reason in the API server's words. Each subscriber's ``on_lost`` is called
with it (the transport then closes its exec sockets, so every waiter fails now, and its
``diagnose`` names the reason). A restart is no verdict for a subscriber whose agent state
outlives it (``resumes``): it is told ``on_restart`` instead, and resumes.

One watch per namespace however many pods are followed in it (not a read before each
operation). Events for pods nobody follows are dropped as they are parsed. The watch resumes
from the last ``resourceVersion`` it saw after its stream ends, and from scratch after a
``410 Gone``; a broken connection is retried with a growing pause (at most 5 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = [
    "PodWatch",
    "Subscription",
    "obj",
    "pod_verdict",
    "restart_reason",
    "running_restarts",
    "state_survives",
    "text",
]

log = logging.getLogger(__name__)

WATCH_SECONDS = 240  # the server ends a watch after this; it is started again from its cursor
_MAX_PAUSE = 5.0


class _Api(Protocol):
    """What a watch needs of :class:`~remote_exec.sandboxes.k8sapi.KubeApi`."""

    async def stream(self, path: str, **query: str) -> Any: ...


def obj(value: Any, key: str) -> dict[str, Any]:
    """``value[key]`` when both are JSON objects, else ``{}``: the server's JSON is untrusted."""
    got = value.get(key) if isinstance(value, dict) else None
    return got if isinstance(got, dict) else {}


def text(value: Any, limit: int = 200) -> str:
    """A server's string for a message: bounded, with no control characters (no terminal escapes)."""
    return "".join(c if c.isprintable() else "?" for c in str(value)[:limit])


def _container_status(pod: dict[str, Any], container: str | None) -> dict[str, Any] | None:
    statuses = obj(pod, "status").get("containerStatuses")
    for status in statuses if isinstance(statuses, list) else ():
        if isinstance(status, dict) and (container is None or status.get("name") == container):
            return status
    return None


def running_restarts(pod: Any, container: str | None) -> int | None:
    """The container's restart count while it runs (its state ``running``), else None."""
    cstatus = _container_status(pod, container) if isinstance(pod, dict) else None
    if cstatus is None or "running" not in obj(cstatus, "state"):
        return None
    count = cstatus.get("restartCount")
    return count if isinstance(count, int) else 0


def state_survives(pod: Any, container: str | None, state_dir: str | None) -> bool:
    """Whether a restart of ``container`` keeps the agent's state in ``state_dir``: the pod
    restarts it however it ends (``restartPolicy: Always``; under ``OnFailure`` one that exits 0
    is not started again, and a wait for it would end at a deadline, not with the reason), and
    ``state_dir`` lies on one of its writable volume mounts (the container's own files are new)."""
    spec = obj(pod, "spec")
    if spec.get("restartPolicy", "Always") != "Always" or not state_dir:
        return False
    state = posixpath.normpath(state_dir)
    containers = spec.get("containers")
    for c in containers if isinstance(containers, list) else ():
        if not isinstance(c, dict) or c.get("name") != container:
            continue
        mounts = c.get("volumeMounts")
        for m in mounts if isinstance(mounts, list) else ():
            path = m.get("mountPath") if isinstance(m, dict) else None
            if not isinstance(path, str) or not path.startswith("/") or m.get("readOnly"):
                continue
            path = posixpath.normpath(path)
            if state == path or state.startswith(path.rstrip("/") + "/"):
                return True
    return False


def restart_reason(pod: Any, container: str | None) -> str:
    """How the container's last run ended (its ``lastState``), for a message."""
    cstatus = _container_status(pod, container) if isinstance(pod, dict) else None
    return (_terminated(cstatus.get("lastState")) if cstatus else "") or "no reason given"


def _terminated(state: Any) -> str:
    term = obj(state, "terminated")
    if not term:
        return ""
    return f"{text(term.get('reason') or 'terminated', 80)}, exit code {text(term.get('exitCode', '?'), 12)}"


def pod_verdict(pod: Any, container: str | None, restarts: int | None, resumes: bool = False) -> str | None:
    """Why ``pod`` (a Pod's JSON, untrusted) can no longer run our agent, or None while it can.

    ``restarts``: the container's restart count when it was first seen (a higher one now is a
    restart: its processes died with it). ``resumes``: the agent's state outlives a restart of
    the container (see ``K8sTransport``), so a restart, and a terminated container the kubelet
    will start again, are no verdict: only the pod's own end is.
    """
    meta = obj(pod, "metadata")
    name = f"pod {text(meta.get('namespace', '?'), 63)}/{text(meta.get('name', '?'), 253)}"
    if meta.get("deletionTimestamp"):
        return f"{name} is being deleted"
    status = obj(pod, "status")
    phase = status.get("phase")
    cstatus = _container_status(pod, container) if isinstance(pod, dict) else None
    if phase in ("Failed", "Succeeded"):
        why = [text(s) for s in (status.get("reason"), status.get("message")) if s]
        why += (
            [f"container {text(cstatus.get('name', '?'), 63)}: {_terminated(cstatus.get('state'))}"]
            if cstatus and _terminated(cstatus.get("state"))
            else []
        )
        return f"{name} has {'failed' if phase == 'Failed' else 'ended'}" + (f" ({'; '.join(why)})" if why else "")
    if cstatus is None:
        return None
    cname = f"container {text(cstatus.get('name', '?'), 63)} of {name}"
    if resumes:
        return None
    count = cstatus.get("restartCount")
    if restarts is not None and isinstance(count, int) and count > restarts:
        last = _terminated(cstatus.get("lastState"))
        return f"{cname} restarted ({last or 'no reason given'}); its processes died with it"
    last = _terminated(cstatus.get("state"))
    if last:
        return f"{cname} terminated ({last})"
    return None


@dataclass(eq=False)
class Subscription:
    """One pod followed by one transport: ``verdict`` once it is gone."""

    pod: str
    container: str | None
    on_lost: Callable[[str], None]
    restarts: int | None = None
    verdict: str | None = None
    on_update: Callable[[dict[str, Any]], None] | None = field(default=None)
    """Called with each state of the pod the watch sees (one waiting for it to run)."""
    resumes: bool = False
    """The agent's state outlives a restart of the container: a restart is ``on_restart``, not a verdict."""
    on_restart: Callable[[str], None] | None = field(default=None)
    """Called (with how the last run ended) each time the container is seen restarted, if ``resumes``."""
    uid: str | None = None
    """The pod's ``metadata.uid`` when first seen: another one is another pod of the same name."""


class PodWatch:
    """The pods of one namespace, watched by one long GET (started by the first subscriber)."""

    def __init__(self, api: _Api, namespace: str) -> None:
        self._api = api
        self.namespace = namespace
        self._subs: dict[str, set[Subscription]] = {}
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()  # set while a watch stream is open (tests wait for it)

    def subscribe(self, pod: str, container: str | None, on_lost: Callable[[str], None]) -> Subscription:
        """Follow ``pod``; ``on_lost(reason)`` is called once, on the loop, when it is gone."""
        sub = Subscription(pod, container, on_lost)
        self._subs.setdefault(pod, set()).add(sub)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"k8s watch {self.namespace}")
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.pod)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subs[sub.pod]

    def update(self, pod: dict[str, Any], deleted: bool = False) -> None:
        """Take one pod's state (from the watch, or a read): judge it for each subscriber."""
        meta = obj(pod, "metadata")
        name, uid = meta.get("name"), meta.get("uid")
        uid = uid if isinstance(uid, str) and 0 < len(uid) <= 128 else None
        for sub in list(self._subs.get(name, ())) if isinstance(name, str) else ():
            if uid is not None and sub.uid is not None and uid != sub.uid and not deleted:
                # Deleted and made again while the watch was down (a relist shows only the new
                # one): its restart count says nothing of ours, and our agent died with the old.
                self._judged(
                    sub,
                    name,
                    f"pod {self.namespace}/{text(name, 253)} was replaced by another of its "
                    "name (deleted and made again): the agent, its jobs and its files were the old pod's",
                )
                continue
            sub.uid = sub.uid or uid
            cstatus = _container_status(pod, sub.container)
            count = cstatus.get("restartCount") if cstatus is not None else None
            if isinstance(count, int) and (sub.restarts is None or (sub.resumes and count > sub.restarts)):
                restarted = sub.restarts is not None
                sub.restarts = count
                if restarted and sub.on_restart is not None and not deleted:
                    try:
                        sub.on_restart(restart_reason(pod, sub.container))
                    except Exception:  # as for on_lost: the watch goes on for the others
                        log.exception("k8s watch: on_restart of %s", name)
            verdict = (
                f"pod {self.namespace}/{text(name, 253)} was deleted"
                if deleted
                else pod_verdict(pod, sub.container, sub.restarts, sub.resumes)
            )
            if verdict is None:
                if sub.on_update is not None:
                    sub.on_update(pod)
            else:
                self._judged(sub, name, verdict)

    @staticmethod
    def _judged(sub: Subscription, name: object, verdict: str) -> None:
        """``verdict`` on ``sub``'s pod: its first one is told (``on_lost``), once."""
        if sub.verdict is not None:
            return
        sub.verdict = verdict
        try:
            sub.on_lost(verdict)
        except Exception:  # one subscriber's failure must not stop the watch for the others
            log.exception("k8s watch: on_lost of %s", name)

    async def _run(self) -> None:
        version = ""
        pause = 0.25
        while self._subs:
            try:
                version = await self._watch_once(version)
                pause = 0.25
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the API server unreachable, a broken stream: try again
                log.debug("k8s watch of %s: %r", self.namespace, exc)
                self.connected.clear()
                await asyncio.sleep(pause)
                pause = min(pause * 2, _MAX_PAUSE)
        self.connected.clear()

    async def _watch_once(self, version: str) -> str:
        """One watch stream, from ``version`` ("": the current state first, as ADDED events);
        the version to resume from when it ends ("" after a 410 Gone)."""
        query = {"watch": "1", "allowWatchBookmarks": "true", "timeoutSeconds": str(WATCH_SECONDS)}
        if version:
            query["resourceVersion"] = version
        resp = await self._api.stream(f"/api/v1/namespaces/{self.namespace}/pods", **query)
        try:
            self.connected.set()
            while self._subs:
                line = await resp.content.readline()
                if not line:
                    return version
                event = json.loads(line)
                kind, pod = event.get("type") if isinstance(event, dict) else None, obj(event, "object")
                if kind == "ERROR":
                    if pod.get("code") == 410:
                        return ""
                    raise RuntimeError(f"watch error: {text(pod.get('message'))}")
                rv = obj(pod, "metadata").get("resourceVersion")
                if isinstance(rv, str) and len(rv) < 64:
                    version = rv
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self.update(pod, deleted=kind == "DELETED")
            return version
        finally:
            self.connected.clear()
            # A stream cut short: its connection is not reused, and is aborted rather than shut
            # down (a TLS close waits for the server's close_notify: a loop that ends meanwhile
            # would leave the socket open).
            connection = resp.connection
            if connection is not None and connection.transport is not None:
                connection.transport.abort()
            resp.close()

    async def aclose(self) -> None:
        """Stop watching (cancelling waits for the task's end)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
