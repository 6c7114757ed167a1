"""``k8s://NAMESPACE/POD[/CONTAINER]``: a running Kubernetes pod, reached through the API server.

Every :meth:`K8sTransport.spawn` opens one WebSocket to the pod's ``exec`` subresource
(``v5.channel.k8s.io``, or ``v4`` with uploads sized instead of ended: see
:mod:`~remote_exec.sandboxes.k8sws`): no thread and no process per exec. The kubeconfig, its
contexts and credentials (tokens, client certificates, exec plugins of the user's own
kubeconfig) are read by kubernetes_asyncio (:mod:`~remote_exec.sandboxes.k8sapi`). As with
Docker, the agent is found in the container or the bundled agent is injected into ``/tmp``
(checksum-verified), and closing the exec socket leaves jobs running in the pod.

One watch per namespace (:mod:`~remote_exec.sandboxes.k8swatch`) follows the pod: deleted,
evicted, failed, its container OOM-killed, terminated or restarted, every waiter fails at once
with :class:`~remote_exec.errors.SandboxLostError` naming the reason, not after a heartbeat.

**A restart that keeps the agent's state.** When the pod restarts its container whatever way
it ends (``restartPolicy: Always``, the default) and the agent's state dir (``dir=``) lies on one of the
container's volumes (an ``emptyDir`` lives as long as the pod), a restart loses the container's
processes but not the jobs' records and logs. Then it is no verdict: the exec sockets are closed,
the channel waits (within its call's deadline) until the container runs again, finds or injects
the agent anew (the container's own files are new) and reconnects; every stream resumes from its
cursor, a job that ran through the restart is reported ``lost`` with the reason, and nothing
written before it is lost.

URL query options:

- ``context=NAME``, ``kubeconfig=/path``: which cluster and credentials (default: the current
  context of ``$KUBECONFIG`` or ``~/.kube/config``; inside a pod, its service account).
- ``via=api|kubectl``: ``kubectl`` runs ``kubectl exec -i`` per channel instead (a fallback
  for setups only kubectl reaches; a process per channel, ~50 MB each).
- ``kubectl=/path``: the kubectl to run (implies ``via=kubectl``; default: ``kubectl`` on PATH).
- ``dir=/path``: the agent's state directory in the pod.
- ``inject=auto|always|never``: when to inject the bundled agent (default ``auto``).

A saved notebook record naming ``k8s://`` is never reconnected from the record alone: a
kubeconfig's exec plugin and ``kubectl=`` are host programs (see docs/security.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from ..client.channel import MAX_RESPONSE, Channel, PipeProcess
from ..errors import KubeApiError, RemoteExecError, SandboxError, SandboxLostError
from .base import ExecTransport
from .hostcli import InjectMode, common_options, map_cli_errors, parse_query
from .hostproc import spawn_checked, spawn_host
from .k8swatch import Subscription, obj, pod_verdict, running_restarts, state_survives, text

if TYPE_CHECKING:  # aiohttp and kubernetes_asyncio are imported when a k8s:// sandbox opens, not before
    from .k8sapi import KubeApi
    from .k8sws import WsExecProcess

__all__ = ["K8sTransport"]

_OPTIONS = {"kubectl", "context", "kubeconfig", "dir", "inject", "via"}
# DNS-1123 labels/subdomains: what Kubernetes accepts as namespace, pod and container names.
_NAME = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$")
Via = Literal["api", "kubectl"]


def check_name(what: str, name: str) -> str:
    """``name`` if Kubernetes accepts it as a ``what`` (namespace, pod, container) name.

    :raises SandboxError: it does not.
    """
    if not _NAME.match(name):
        raise SandboxError(f"bad Kubernetes {what} name {name!r}")
    return name


class K8sTransport(ExecTransport):
    """A container of a running pod, reached through the API server (or ``kubectl exec -i``).

    :param namespace: the pod's namespace.
    :param pod: the pod's name.
    :param container: the container in the pod; None: the pod's default container (its
        ``kubectl.kubernetes.io/default-container`` annotation, else its first).
    """

    def __init__(
        self,
        namespace: str,
        pod: str,
        container: str | None = None,
        *,
        via: Via = "api",
        kubectl: str | None = None,
        context: str | None = None,
        kubeconfig: str | None = None,
        state_dir: str | None = None,
        inject: InjectMode = "auto",
    ) -> None:
        self.namespace, self.pod = check_name("namespace", namespace), check_name("pod", pod)
        self.container = check_name("container", container) if container else None
        self.via: Via = via
        self.kubectl = kubectl or "kubectl"
        self.context, self.kubeconfig = context, kubeconfig
        self.agent_state_dir = state_dir
        self.inject = inject
        self.url = f"k8s://{namespace}/{pod}" + (f"/{container}" if container else "")
        self._api: KubeApi | None = None
        self._sub: Subscription | None = None
        self._procs: set[WsExecProcess] = set()
        self._kube_lock = asyncio.Lock()
        self._closed = False
        self._relocate = False  # the container restarted: find the agent again before the next channel
        self._restarts_seen = 0  # restarts the watch told of (one during a locate means locate again)
        self._restart_lock = asyncio.Lock()
        self._pod_seen = asyncio.Event()  # set by each state of the pod the watch sees
        # Uploads say their size rather than rely on stdin's EOF: v4 has no CLOSE, and not every
        # server that negotiates v5 passes it on (kwok v0.8.0 never closes the command's stdin).
        self.stdin_eof = via == "kubectl"

    @classmethod
    def from_url(cls, url: str) -> K8sTransport:
        """Parse ``k8s://NAMESPACE/POD[/CONTAINER]?options`` (see the module docstring).

        :raises SandboxError: a malformed URL or an unknown option.
        """
        path, _, query = url.partition("://")[2].partition("?")
        parts = path.strip("/").split("/")
        if len(parts) not in (2, 3) or not all(parts):
            raise SandboxError(f"k8s:// needs k8s://NAMESPACE/POD[/CONTAINER]: {url!r}")
        opts = parse_query(url, query, _OPTIONS)
        _, _, state_dir, inject = common_options(url, opts)
        one = {k: v[-1] or None for k, v in opts.items()}
        via = one.get("via") or ("kubectl" if one.get("kubectl") else "api")  # naming a kubectl means using it
        if via not in ("api", "kubectl"):
            raise SandboxError(f"k8s:// via= is api or kubectl, not {via!r}: {url!r}")
        transport = cls(
            parts[0],
            parts[1],
            parts[2] if len(parts) == 3 else None,
            via="kubectl" if via == "kubectl" else "api",
            kubectl=one.get("kubectl"),
            context=one.get("context"),
            kubeconfig=one.get("kubeconfig"),
            state_dir=state_dir,
            inject=inject,
        )
        transport.url = url
        return transport

    # -- via the API server ----------------------------------------------------------------

    async def _kube(self) -> KubeApi:
        """The shared API, acquired once (under a lock: two first callers acquire it once);
        never again after :meth:`aclose` (a diagnose racing the close must not hold it)."""
        async with self._kube_lock:
            if self._closed:
                raise SandboxError(f"{self.url}: the sandbox is closed")
            if self._api is None:
                from .k8sapi import KubeApi

                self._api = await KubeApi.acquire(self.kubeconfig, self.context)
            return self._api

    def _lost(self, reason: str) -> None:
        """The watch's verdict: close every exec socket, so each waiter fails now (its
        ``diagnose`` names the reason) instead of on a heartbeat's bound."""
        self._pod_seen.set()  # a wait for a restarted container to run ends now, with the reason
        self._close_execs()

    def _close_execs(self) -> None:
        for proc in list(self._procs):
            with contextlib.suppress(ProcessLookupError):
                proc.kill()

    async def read_pod(self) -> dict[str, Any]:
        """The pod's JSON (and the watch told of it).

        :raises SandboxLostError: there is no such pod (any more).
        :raises KubeApiError: the server refused the read.
        """
        api = await self._kube()
        try:
            pod = await api.request("GET", f"/api/v1/namespaces/{self.namespace}/pods/{self.pod}")
        except KubeApiError as exc:
            if exc.status == 404:
                raise SandboxLostError(f"{self.url}: pod {self.namespace}/{self.pod} not found") from None
            raise
        if not isinstance(pod, dict):
            raise SandboxError(f"{self.url}: the API server answered a read of the pod with no object")
        if self._sub is not None:
            api.watch(self.namespace).update(pod)
        return pod

    async def check_reachable(self) -> None:
        """Read the pod: it must exist and run; its default container is found, and the watch
        of its namespace starts following it.

        :raises SandboxError: no such pod or container, not running, or the API refused us.
        """
        if self.via == "kubectl":
            return await self._check_kubectl()
        api = await self._kube()
        try:
            pod = await self.read_pod()
        except SandboxLostError as exc:
            raise SandboxError(str(exc)) from None
        containers = obj(pod, "spec").get("containers")
        names = [c.get("name") for c in containers if isinstance(c, dict)] if isinstance(containers, list) else []
        names = [n for n in names if isinstance(n, str) and _NAME.match(n)]
        if self.container is None:
            default = obj(obj(pod, "metadata"), "annotations").get("kubectl.kubernetes.io/default-container")
            self.container = default if default in names else (names[0] if names else None)
        elif self.container not in names:
            raise SandboxError(f"{self.url}: pod {self.pod} has no container {self.container} (it has {names[:20]})")
        verdict = pod_verdict(pod, self.container, None)
        if verdict is not None:
            raise SandboxError(f"{self.url}: {verdict}")
        phase = obj(pod, "status").get("phase")
        if phase != "Running":
            raise SandboxError(f"{self.url}: pod {self.namespace}/{self.pod} is {text(phase, 40)}, not Running")
        if self._sub is None:  # followed once its container is known: a sidecar's restarts are not ours
            watch = api.watch(self.namespace)
            self._sub = watch.subscribe(self.pod, self.container, self._lost)
            self._sub.resumes = state_survives(pod, self.container, self.agent_state_dir)
            self._sub.on_restart = self._restarted
            self._sub.on_update = lambda _: self._pod_seen.set()
            watch.update(pod)  # the restart count it starts from

    def _restarted(self, how: str) -> None:
        """The watch saw the container restart (its state kept, see the module's docstring):
        close the exec sockets, so the channel reconnects to an agent found anew."""
        self._relocate = True
        self._restarts_seen += 1
        self._pod_seen.set()
        self._close_execs()

    async def spawn(self, argv: Sequence[str]) -> PipeProcess:
        """Run ``argv`` in the pod's container: one exec WebSocket (or ``kubectl exec -i``).

        :raises SandboxLostError: the pod is known gone (the watch said why).
        :raises SandboxError: the API server refused the exec or did not answer.
        """
        if self.via == "kubectl":
            with map_cli_errors(self.kubectl):
                return await spawn_host(self.exec_argv(argv))
        if self._sub is not None and self._sub.verdict is not None:
            raise SandboxLostError(f"{self.url}: {self._sub.verdict}")
        api = await self._kube()
        try:
            try:
                proc = await api.exec(self.namespace, self.pod, self.container, argv, MAX_RESPONSE)
            except KubeApiError as exc:
                if exc.status != 401 or not await api.reauthenticate():  # (a token that expired: once more)
                    raise
                proc = await api.exec(self.namespace, self.pod, self.container, argv, MAX_RESPONSE)
        except KubeApiError as exc:
            if exc.status == 404:  # the pod went before the watch said so: gone, not a setup failure
                verdict = self._sub.verdict if self._sub is not None else None
                raise SandboxLostError(
                    f"{self.url}: {verdict or f'pod {self.namespace}/{self.pod} not found'}"
                ) from exc
            raise
        self._procs.add(proc)
        proc.on_end = self._procs.discard
        if self._sub is not None and self._sub.verdict is not None:  # gone while it connected
            proc.kill()
            raise SandboxLostError(f"{self.url}: {self._sub.verdict}")
        return proc

    async def diagnose(self) -> RemoteExecError | None:
        """What the watch (or, while it is down, a read of the pod) says of the pod."""
        if self.via == "kubectl":
            return None
        if self._sub is not None and self._sub.verdict is not None:
            return SandboxLostError(f"{self.url}: {self._sub.verdict}")
        try:
            pod = await self.read_pod()
        except SandboxLostError as exc:
            return exc
        except SandboxError:
            return None  # the API server is unreachable: that says nothing of the pod
        sub = self._sub
        verdict = pod_verdict(pod, self.container, sub.restarts if sub else None, sub.resumes if sub else False)
        return SandboxLostError(f"{self.url}: {verdict}") if verdict else None

    async def aclose(self) -> None:
        """Close the exec sockets still open, stop following the pod, release the API (that
        last even when a wait on the way is cancelled or fails: the shared session is counted)."""
        self._closed = True
        try:
            for proc in list(self._procs):
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(proc.wait(), 5.0)
        finally:
            if self._api is not None:
                if self._sub is not None:
                    self._api.watch(self.namespace).unsubscribe(self._sub)
                    self._sub = None
                api, self._api = self._api, None
                await api.release()

    # -- via kubectl -----------------------------------------------------------------------

    def exec_argv(self, argv: Sequence[str]) -> list[str]:
        """The host command line that runs ``argv`` in the pod's container (``via=kubectl``)."""
        cmd = [self.kubectl]
        cmd += ["--kubeconfig", self.kubeconfig] if self.kubeconfig else []
        cmd += ["--context", self.context] if self.context else []
        cmd += ["exec", "-i", "-n", self.namespace, self.pod]
        cmd += ["-c", self.container] if self.container else []
        return [*cmd, "--", *argv]

    async def _check_kubectl(self) -> None:
        with map_cli_errors(self.kubectl):
            proc = await spawn_checked(self.exec_argv(["true"]))
        try:
            async with asyncio.timeout(120):
                _, err = await proc.communicate()
        except TimeoutError:
            raise SandboxError(f"{self.url}: `kubectl exec` did not answer within 120 s") from None
        finally:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        if proc.returncode != 0:
            msg = err.decode(errors="replace").strip()[-800:]
            raise SandboxError(f"{self.url}: kubectl exec failed (exit {proc.returncode}): {msg or '(no message)'}")

    async def open_channel(self) -> Channel:
        """Check the pod runs, locate or inject the agent, open the persistent channel.

        :raises SandboxError: no such pod or container, or the exec is refused.
        :raises AgentUnavailableError: no agent could be found, injected or started.
        """
        if self.agent_argv is None:
            await self.check_reachable()
        return await super().open_channel()

    async def spawn_agent(self) -> PipeProcess:
        """The channel's agent process. After a restart of the container that kept the agent's
        state, it waits until the container runs again and finds (or injects) the agent anew;
        an exec refused because the container is not running (the watch has not said why yet)
        is such a restart too. Cancelling it (the call's deadline) leaves that to the next try.

        :raises SandboxLostError: the pod is gone meanwhile.
        :raises SandboxError: the exec is refused while the container runs.
        """
        while True:
            if self._relocate:
                await self._when_running_again()
            try:
                return await super().spawn_agent()
            except SandboxLostError:
                raise
            except SandboxError:
                if self._sub is None or not self._sub.resumes or await self._container_runs():
                    raise
                self._relocate = True

    async def _container_runs(self) -> bool:
        return running_restarts(await self.read_pod(), self.container) is not None

    async def _when_running_again(self) -> None:
        """Wait for the restarted container to run (each state the watch sees, or a read every
        5 s while the watch is down), then locate the agent in it again."""
        async with self._restart_lock:
            while self._relocate:
                if self._sub is not None and self._sub.verdict is not None:
                    raise SandboxLostError(f"{self.url}: {self._sub.verdict}")
                self._pod_seen.clear()  # before the read: a state seen during it wakes the wait
                if await self._container_runs():
                    seen = self._restarts_seen
                    try:
                        argv = await self.locate_agent()
                    except RemoteExecError:
                        if seen == self._restarts_seen:
                            raise
                        continue  # restarted again meanwhile (its execs killed): wait, locate again
                    self.agent_argv = argv
                    if seen == self._restarts_seen:
                        self._relocate = False
                    continue
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(5.0):
                        await self._pod_seen.wait()
