"""The fast tier's pods: created as Docker containers, kept current by ``docker events``, watchable.

A pod exists from its create request until it is deleted through the API or any of its
containers is removed behind the server's back (``docker rm -f``: a pod deleted by someone
else, or a node that lost it), which is a DELETED event. Its status is never polled: each
``docker events`` line about one of its containers (start, die, oom, destroy …) makes the store
``docker inspect`` it again, and a changed status is a MODIFIED event with a new
``resourceVersion``, within the engine's event latency (milliseconds).

Watches read a bounded history of events (resourceVersions are one counter for the store, as
etcd's revision is for a cluster); a watch from a version the history no longer holds gets a
410 Gone, as from a real server, and the client lists again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections import deque
from dataclasses import dataclass, field

from .engine import Docker
from .objects import JSON, ApiError, container_status, not_found, now_rfc3339, phase_of, status_failure
from .podspec import LABEL_INSTANCE, LABEL_NS, LABEL_POD, PodPlan, container_name, parse_pod
from .selection import Selector

__all__ = ["NODE", "PodStore", "WatchEvent"]

log = logging.getLogger("k8sapi.store")

NODE = "rx-fast-node"
HISTORY = 4096


@dataclass(frozen=True)
class WatchEvent:
    """One change: its resourceVersion, ADDED/MODIFIED/DELETED, the pod as it then was."""

    rv: int
    type: str
    pod: JSON


@dataclass(eq=False)
class _Pod:
    namespace: str
    name: str
    spec: JSON
    obj: JSON
    waiting: dict[str, tuple[str, str]] = field(default_factory=dict)  # why a container is not made yet
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    starting: asyncio.Task[None] | None = None
    gone: bool = False

    @property
    def containers(self) -> list[str]:
        return [container_name(self.namespace, self.name, c["name"]) for c in self.spec["containers"]]


class PodStore:
    """Pods by (namespace, name), their watch history, and the Docker containers behind them."""

    def __init__(self, docker: Docker, instance: str) -> None:
        self.docker, self.instance = docker, instance
        self._rv = 1000
        self._pods: dict[tuple[str, str], _Pod] = {}
        self._history: deque[WatchEvent] = deque(maxlen=HISTORY)
        self._changed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def resource_version(self) -> int:
        return self._rv

    def changed(self) -> asyncio.Event:
        """Set at the next change (take it before reading :meth:`events_after`, then wait on it)."""
        return self._changed

    def events_after(self, rv: int) -> list[WatchEvent]:
        """The changes after ``rv`` (raises a 410 Gone when the history no longer reaches back)."""
        h = self._history
        if len(h) == h.maxlen and rv < h[0].rv - 1:
            raise ApiError(status_failure(410, "Expired", f"too old resource version: {rv} ({h[0].rv - 1})"))
        return [e for e in h if e.rv > rv]

    def _publish(self, pod: _Pod, kind: str, obj: JSON) -> None:
        self._rv += 1
        pod.obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self._rv)}}
        self._history.append(WatchEvent(self._rv, kind, pod.obj))
        log.info("%s pod %s/%s rv=%d phase=%s", kind, pod.namespace, pod.name, self._rv, obj["status"]["phase"])
        self._changed.set()
        self._changed = asyncio.Event()

    def get(self, namespace: str, name: str) -> JSON:
        pod = self._pods.get((namespace, name))
        if pod is None:
            raise not_found("pods", name)
        return pod.obj

    def pods(self, namespace: str | None, select: Selector) -> list[JSON]:
        found = [p.obj for (ns, _), p in sorted(self._pods.items()) if namespace in (None, ns)]
        return [obj for obj in found if select(obj)]

    def namespaces(self) -> list[str]:
        return sorted({"default", *(ns for ns, _ in self._pods)})

    def _status(self, pod: _Pod, inspects: dict[str, JSON]) -> JSON:
        statuses = [
            container_status(c, inspects.get(name), pod.waiting.get(c["name"]))
            for c, name in zip(pod.spec["containers"], pod.containers, strict=True)
        ]
        ready = "True" if all(s["ready"] for s in statuses) else "False"
        conditions = [{"type": "PodScheduled", "status": "True"}, {"type": "Initialized", "status": "True"}]
        conditions += [{"type": "ContainersReady", "status": ready}, {"type": "Ready", "status": ready}]
        return {
            "phase": phase_of(statuses),
            "conditions": conditions,
            "hostIP": "127.0.0.1",
            "startTime": pod.obj["metadata"]["creationTimestamp"],
            "containerStatuses": statuses,
            "qosClass": "BestEffort",
        }

    async def create(self, namespace: str, body: object) -> JSON:
        """Take the pod (409 if the name is taken), answer at once; its containers start behind."""
        uid = str(uuid.uuid4())
        plan = parse_pod(namespace, body, self.instance, uid)
        if (namespace, plan.name) in self._pods:
            details = {"name": plan.name, "kind": "pods"}
            raise ApiError(status_failure(409, "AlreadyExists", f'pods "{plan.name}" already exists', details))
        meta: JSON = {"name": plan.name, "namespace": namespace, "uid": uid, "creationTimestamp": now_rfc3339()}
        meta |= {"labels": plan.labels} if plan.labels else {}
        meta |= {"annotations": plan.annotations} if plan.annotations else {}
        spec = {**plan.spec, "nodeName": NODE}
        pod = _Pod(namespace, plan.name, spec, {"kind": "Pod", "apiVersion": "v1", "metadata": meta, "spec": spec})
        pod.obj["status"] = self._status(pod, {})
        self._pods[(namespace, plan.name)] = pod
        self._publish(pod, "ADDED", pod.obj)
        pod.starting = asyncio.get_running_loop().create_task(self._start(pod, plan))
        return pod.obj

    async def _start(self, pod: _Pod, plan: PodPlan) -> None:
        try:
            await self._run_containers(pod, plan)
        except Exception:  # logged here: nobody awaits this task's result
            log.exception("start of pod %s/%s", pod.namespace, pod.name)

    async def _run_containers(self, pod: _Pod, plan: PodPlan) -> None:
        """``docker run`` each container (a failure is its waiting reason), then the first status."""
        for (cname, args), docker_name in zip(plan.runs, pod.containers, strict=True):
            if pod.gone:
                return
            done = await self.docker.run("run", *args)
            if done.returncode != 0:
                error = done.error()
                log.info("docker run %s: %s", docker_name, error)
                spec = next(c for c in pod.spec["containers"] if c["name"] == cname)
                if "No such image" in error or "pull access denied" in error:
                    pod.waiting[cname] = _not_pulled(spec)
                else:
                    pod.waiting[cname] = ("CreateContainerError", error)
        if pod.gone:  # deleted while it started: what was made goes too
            await self.docker.remove(pod.containers)
            return
        await self.refresh(pod)

    async def refresh(self, pod: _Pod) -> None:
        """Inspect the pod's containers again; publish MODIFIED if its status changed."""
        async with pod.lock:
            if pod.gone:
                return
            inspects = await self.docker.inspect(pod.containers)
            made = [s["name"] for s in pod.obj["status"]["containerStatuses"] if "containerID" in s]
            if any(container_name(pod.namespace, pod.name, c) not in inspects for c in made):
                return  # removed since its event: "destroy" follows, and the pod goes (not back to Pending)
            status = self._status(pod, inspects)
            if not pod.gone and status != pod.obj["status"]:
                self._publish(pod, "MODIFIED", {**pod.obj, "status": status})

    async def delete(self, namespace: str, name: str) -> JSON:
        """Remove the pod's containers and the pod; answer the pod as it last was."""
        pod = self._pods.pop((namespace, name), None)
        if pod is None:
            raise not_found("pods", name)
        pod.gone = True
        if pod.starting is not None:
            with contextlib.suppress(Exception):  # it removes what it made once it sees `gone`
                await asyncio.shield(pod.starting)
        await self.docker.remove(pod.containers)
        self._publish(pod, "DELETED", pod.obj)
        return pod.obj

    def _vanish(self, pod: _Pod, why: str) -> None:
        """One of the pod's containers was removed behind our back: the pod is gone (DELETED)."""
        if self._pods.get((pod.namespace, pod.name)) is not pod:
            return
        del self._pods[(pod.namespace, pod.name)]
        pod.gone = True
        log.info("pod %s/%s vanished: %s", pod.namespace, pod.name, why)
        self._publish(pod, "DELETED", pod.obj)
        task = asyncio.get_running_loop().create_task(self.docker.remove(pod.containers))  # its other containers
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def follow(self, events: asyncio.subprocess.Process) -> None:
        """Apply ``docker events`` lines until the stream ends (the engine went away)."""
        assert events.stdout is not None
        while line := await events.stdout.readline():
            try:
                event = json.loads(line)
                attrs = event["Actor"]["Attributes"]
                key, action = (attrs[LABEL_NS], attrs[LABEL_POD]), str(event["Action"])
            except (ValueError, KeyError, TypeError):
                continue
            pod = self._pods.get(key)
            if pod is None or pod.gone or action.startswith("exec_"):
                continue
            if action == "destroy":
                self._vanish(pod, f"container {attrs.get('name')} removed")
            elif action in ("start", "die", "oom", "pause", "unpause", "restart"):
                try:
                    await self.refresh(pod)
                except Exception:  # one pod's trouble must not stop every pod's updates
                    log.exception("refresh of pod %s/%s", pod.namespace, pod.name)

    async def shutdown(self) -> None:
        """Remove every container of this server (its pods do not outlive it)."""
        for task in [p.starting for p in self._pods.values() if p.starting is not None]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        done = await self.docker.run("ps", "-aq", "--filter", f"label={LABEL_INSTANCE}={self.instance}")
        await self.docker.remove(done.stdout.decode().split())
        for task in list(self._tasks):
            with contextlib.suppress(Exception):
                await task


def _not_pulled(spec: JSON) -> tuple[str, str]:
    """The waiting reason of a container whose image the engine does not have (nothing is pulled)."""
    image = spec["image"]
    if spec.get("imagePullPolicy") == "Never":
        return "ErrImageNeverPull", f'Container image "{image}" is not present with pull policy of Never'
    return "ErrImagePull", f'failed to pull image "{image}": not present, and the fast tier pulls nothing'
