"""``k8s+image://IMAGE``: a pod made from IMAGE for this sandbox, deleted on close.

The pod is locked down as ``docker+image://``'s container is: ``restartPolicy: Never``, no
privilege escalation, every capability dropped, a read-only root filesystem with an
``emptyDir`` on ``/tmp`` (the injected agent runs from there), no service-account token unless
one is asked for. Its one container, ``main``, runs ``sleep infinity`` (the image needs
``sleep``: busybox or coreutils); jobs run through the exec WebSocket as with ``k8s://``.

The pod is labelled ``app.kubernetes.io/managed-by=remote-exec`` and ``remote-exec/owner``
(the host user), and annotated with its creation time and TTL, so ``remote-exec gc`` finds
those a crashed host left behind (:func:`expired_pods`).

URL query options (besides ``k8s://``'s ``context``, ``kubeconfig``, ``dir``, ``inject``):

- ``namespace=NS`` (default ``default``), ``name=POD`` (default ``rx-`` and a random suffix; an
  existing pod of that name made by remote_exec from the same image is reattached, and kept on
  close; one from another image is refused).
- ``cpu=``, ``memory=``, ``gpu=N`` (``nvidia.com/gpu``): the container's requests and limits.
- ``node_selector=KEY=VALUE`` (repeatable), ``node=NAME`` (that node, past the scheduler),
  ``service_account=NAME``.
- ``keep=1``: leave the pod running on close; ``ttl=SECONDS``: when ``gc`` may remove a kept
  or leaked pod (default 86400).
- ``timeout=SECONDS``: how long the pod may take to run (default 300; image pulls count).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import getpass
import logging
import re
import secrets
from typing import TYPE_CHECKING, Any

import anyio

from ..client.channel import Channel
from ..errors import KubeApiError, SandboxError
from .hostcli import common_options, parse_query
from .k8s import K8sTransport, check_name
from .k8swatch import obj, text

if TYPE_CHECKING:
    from .k8sapi import KubeApi

__all__ = ["MANAGED_BY", "K8sImageTransport", "expired_pods"]

log = logging.getLogger(__name__)

_OPTIONS = {"context", "kubeconfig", "dir", "inject", "namespace", "name", "cpu", "memory", "gpu"}
_OPTIONS |= {"node_selector", "node", "service_account", "keep", "ttl", "timeout"}
MANAGED_BY = "app.kubernetes.io/managed-by"
_CREATED = "remote-exec/created"
_TTL = "remote-exec/ttl"
_NAME_OK = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$")  # a pod name to put in a path
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti)?$")
# A container that cannot start for one of these reasons will not start by waiting.
_FATAL_WAITING = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
_FATAL_WAITING |= {"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}


def _quantity(what: str, value: str | None) -> str | None:
    if value is not None and not _QUANTITY.match(value):
        raise SandboxError(f"bad Kubernetes quantity {what}={value!r} (e.g. 500m, 2, 512Mi, 4Gi)")
    return value


def _owner() -> str:
    try:
        name = getpass.getuser()
    except (KeyError, OSError):
        name = "unknown"
    return re.sub(r"[^A-Za-z0-9_.-]", "-", name)[:63].strip("-_.") or "unknown"


class K8sImageTransport(K8sTransport):
    """Creates a pod from an image on open; deletes it on close (unless kept or reattached)."""

    def __init__(
        self,
        image: str,
        *,
        namespace: str = "default",
        name: str | None = None,
        cpu: str | None = None,
        memory: str | None = None,
        gpu: int = 0,
        node_selector: dict[str, str] | None = None,
        node: str | None = None,
        service_account: str | None = None,
        keep: bool = False,
        ttl: int = 86400,
        timeout: float = 300.0,
        **options: Any,
    ) -> None:
        if not image or image.startswith("-") or any(c.isspace() for c in image):
            raise SandboxError(f"bad image reference {image!r}")
        pod = check_name("pod", name) if name else f"rx-{secrets.token_hex(5)}"
        super().__init__(namespace, pod, "main", **options)
        self.image = image
        self.cpu, self.memory = _quantity("cpu", cpu), _quantity("memory", memory)
        self.gpu, self.node_selector = gpu, node_selector or {}
        self.node = check_name("node", node) if node else None
        self.service_account = check_name("service account", service_account) if service_account else None
        self.keep, self.ttl, self.timeout = keep, ttl, timeout
        self.url = f"k8s+image://{image}"
        self._named = name is not None
        self._created = False
        self._running = False
        self._waiter: asyncio.Future[None] | None = None
        self._last_pending = ""  # why the scheduler has not placed it yet, for the timeout's error

    @classmethod
    def from_url(cls, url: str) -> K8sImageTransport:
        """Parse ``k8s+image://IMAGE?options`` (see the module docstring).

        :raises SandboxError: a malformed URL or a bad option.
        """
        image, _, query = url.partition("://")[2].partition("?")
        opts = parse_query(url, query, _OPTIONS, multi=frozenset({"node_selector"}))
        _, _, state_dir, inject = common_options(url, opts)
        one = {k: v[-1] for k, v in opts.items()}
        selector: dict[str, str] = {}
        for pair in opts.get("node_selector", []):
            key, sep, value = pair.partition("=")
            if not sep or not key:
                raise SandboxError(f"node_selector needs KEY=VALUE, not {pair!r}: {url!r}")
            selector[key] = value
        if one.get("keep", "0") not in ("0", "1", "true", "false"):
            raise SandboxError(f"keep must be 0 or 1: {url!r}")
        try:
            gpu, ttl = int(one.get("gpu", "0")), int(one.get("ttl", "86400"))
            timeout = float(one.get("timeout", "300"))
        except ValueError:
            raise SandboxError(f"gpu and ttl are integers, timeout a number of seconds: {url!r}") from None
        if not (0 <= gpu <= 64 and ttl > 0 and 0 < timeout < 86400):
            raise SandboxError(f"gpu, ttl or timeout out of range: {url!r}")
        transport = cls(
            image,
            namespace=check_name("namespace", one.get("namespace") or "default"),
            name=one.get("name") or None,
            cpu=one.get("cpu") or None,
            memory=one.get("memory") or None,
            gpu=gpu,
            node_selector=selector,
            node=one.get("node") or None,
            service_account=one.get("service_account") or None,
            keep=one.get("keep", "0") in ("1", "true"),
            ttl=ttl,
            timeout=timeout,
            context=one.get("context") or None,
            kubeconfig=one.get("kubeconfig") or None,
            state_dir=state_dir,
            inject=inject,
        )
        transport.url = url
        return transport

    def pod_spec(self) -> dict[str, Any]:
        """The Pod this sandbox creates."""
        resources: dict[str, dict[str, str]] = {}
        for key, value in (("cpu", self.cpu), ("memory", self.memory)):
            if value:
                resources.setdefault("requests", {})[key] = value
                resources.setdefault("limits", {})[key] = value
        if self.gpu:
            resources.setdefault("limits", {})["nvidia.com/gpu"] = str(self.gpu)
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        spec: dict[str, Any] = {
            "restartPolicy": "Never",
            "automountServiceAccountToken": self.service_account is not None,
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "main",
                    "image": self.image,
                    "command": ["sleep", "infinity"],
                    "resources": resources,
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                        "readOnlyRootFilesystem": True,
                    },
                    "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                }
            ],
            "volumes": [{"name": "tmp", "emptyDir": {}}],
        }
        if self.node_selector:
            spec["nodeSelector"] = self.node_selector
        if self.node:
            spec["nodeName"] = self.node
        if self.service_account:
            spec["serviceAccountName"] = self.service_account
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.pod,
                "namespace": self.namespace,
                "labels": {MANAGED_BY: "remote-exec", "remote-exec/owner": _owner()},
                "annotations": {_CREATED: now, _TTL: str(self.ttl), "remote-exec/image": self.image[:200]},
            },
            "spec": spec,
        }

    async def start_pod(self) -> None:
        """Create the pod (or reattach the named one remote_exec made) and wait until it runs.

        :raises SandboxError: it cannot be created, its image cannot be pulled, it cannot be
            scheduled, or it did not run within ``timeout`` (each said in the server's words).
        """
        api = await self._kube()
        self._waiter = asyncio.get_running_loop().create_future()
        self._sub = api.watch(self.namespace).subscribe(self.pod, self.container, self._lost)
        self._sub.on_update = self._judge_start
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        # Marked created before the request: a POST cancelled or timed out on its way may still
        # have made the pod, and the close must delete it (a 404 then is ignored).
        self._created = True
        try:
            pod = await api.request("POST", path, self.pod_spec())
        except KubeApiError as exc:
            if not (self._named and exc.status == 409):
                raise SandboxError(f"cannot create a pod from {self.image}: {exc}") from exc
            self._created = False  # someone else's (or an earlier handle's) pod: never deleted by us
            pod = await self.read_pod()
            if obj(obj(pod, "metadata"), "labels").get(MANAGED_BY) != "remote-exec":
                raise SandboxError(
                    f"pod {self.namespace}/{self.pod} exists and was not made by remote_exec: "
                    f"use k8s://{self.namespace}/{self.pod} to use it as it is"
                ) from None
            made_from = obj(obj(pod, "metadata"), "annotations").get("remote-exec/image")
            if made_from != self.image[:200]:  # (the annotation keeps 200 characters)
                raise SandboxError(
                    f"pod {self.namespace}/{self.pod} exists, made by remote_exec from "
                    f"{text(made_from, 200) or 'an unknown image'}, not {self.image}: name another pod, "
                    f"or use k8s://{self.namespace}/{self.pod} to use it as it is"
                ) from None
        api.watch(self.namespace).update(pod)
        try:
            async with asyncio.timeout(self.timeout):
                await self._waiter
        except TimeoutError:
            raise SandboxError(
                f"pod {self.namespace}/{self.pod} from {self.image} did not run within {self.timeout:.0f} s"
                f"{self._pending_reason()}"
            ) from None
        self._running = True

    def _pending_reason(self) -> str:
        return f": {self._last_pending}" if self._last_pending else ""

    def _judge_start(self, pod: dict[str, Any]) -> None:
        """One state of the pod while we wait for it to run: running, or failed for good."""
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        status = obj(pod, "status")
        conditions = status.get("conditions")
        for cond in conditions if isinstance(conditions, list) else ():
            if isinstance(cond, dict) and cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                self._last_pending = (
                    f"{text(cond.get('reason', 'unschedulable'), 60)}: {text(cond.get('message', ''), 300)}"
                )
        statuses = status.get("containerStatuses")
        for cstatus in statuses if isinstance(statuses, list) else ():
            state = obj(cstatus, "state")
            waiting = obj(state, "waiting")
            if waiting.get("reason") in _FATAL_WAITING:
                message = f"{text(waiting.get('reason'), 60)}: {text(waiting.get('message', ''), 300)}"
                waiter.set_exception(
                    SandboxError(f"pod {self.namespace}/{self.pod} cannot start {self.image}: {message}")
                )
                return
            if "running" in state and status.get("phase") == "Running":
                waiter.set_result(None)
                return

    def _lost(self, reason: str) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(SandboxError(f"{self.url}: {reason}"))
        super()._lost(reason)

    async def open_channel(self) -> Channel:
        """Create the pod if not yet done and wait for it; inject/locate the agent, open the channel.

        A failure or cancellation after the pod was created deletes it again (unless ``keep``),
        shielded from cancellation.
        """
        try:
            if not self._running:
                await self.start_pod()
            return await super().open_channel()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.aclose()
            raise

    async def aclose(self) -> None:
        """Delete the pod if this handle created it (and ``keep`` is off); then as ``k8s://``."""
        try:
            if self._created and not self.keep and self._api is not None:
                self._created = False
                try:
                    await self._api.request(
                        "DELETE", f"/api/v1/namespaces/{self.namespace}/pods/{self.pod}", gracePeriodSeconds="0"
                    )
                except KubeApiError as exc:
                    if exc.status != 404:  # (404: already gone, or never made)
                        log.warning("%s: deleting pod %s/%s: %s", self.url, self.namespace, self.pod, exc)
                except SandboxError as exc:  # unreachable: `remote-exec gc` finds it by its TTL
                    log.warning("%s: pod %s/%s left behind: %s", self.url, self.namespace, self.pod, exc)
        finally:
            await super().aclose()


async def expired_pods(api: KubeApi, namespace: str, *, delete: bool, now: float | None = None) -> list[str]:
    """The pods remote_exec made in ``namespace`` whose TTL has passed; deleted when ``delete``.

    Only pods labelled ``app.kubernetes.io/managed-by=remote-exec`` are looked at; one whose
    annotations are missing or unreadable is left alone (it is not known to be expired).
    """
    now = now if now is not None else datetime.datetime.now(datetime.UTC).timestamp()
    listing = await api.request(
        "GET", f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"{MANAGED_BY}=remote-exec"
    )
    expired = []
    items = listing.get("items") if isinstance(listing, dict) else None
    for pod in items if isinstance(items, list) else ():
        meta = obj(pod, "metadata")
        notes = obj(meta, "annotations")
        try:
            created = datetime.datetime.strptime(str(notes.get(_CREATED)), "%Y-%m-%dT%H:%M:%SZ")
            ttl = int(str(notes.get(_TTL)))
        except ValueError:
            continue
        name = meta.get("name")
        if (
            created.replace(tzinfo=datetime.UTC).timestamp() + ttl < now
            and isinstance(name, str)
            and _NAME_OK.match(name)
        ):
            expired.append(name)
            if delete:
                with contextlib.suppress(KubeApiError):
                    await api.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", gracePeriodSeconds="0")
    return expired
