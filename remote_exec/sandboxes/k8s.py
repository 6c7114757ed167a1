"""``k8s://NAMESPACE/POD[/CONTAINER]``: a running Kubernetes pod, via ``kubectl exec -i``.

Every :meth:`K8sTransport.spawn` is ``kubectl exec -i -n NAMESPACE POD [-c CONTAINER] --
argv...``; kubectl brings the user's kubeconfig, context and credentials. As with Docker, the
agent is found in the container or the bundled agent is injected into ``/tmp``
(checksum-verified), and killing the host-side ``kubectl exec`` leaves jobs running in the pod.

URL query options:

- ``kubectl=/path``: the kubectl to run (default: ``kubectl`` on PATH).
- ``context=NAME``, ``kubeconfig=/path``: passed to kubectl as ``--context`` / ``--kubeconfig``.
- ``dir=/path``: the agent's state directory in the pod.
- ``inject=auto|always|never``: when to inject the bundled agent (default ``auto``).

HOW THIS IS TESTED: no Kubernetes cluster can run on the machines this project is developed
and tested on (no apiserver or kubelet packages, no downloads). The test suite runs this
transport, unchanged, against a ``kubectl`` stand-in (``tests/sandboxes/kubectl``, passed
with ``?kubectl=``) that turns ``kubectl exec -i -n NS POD -c C -- argv`` into ``docker exec
-i k8s_NS_POD_C argv`` against the test Docker engine. That checks the argv this transport
builds and the whole agent path through a real exec pipe; it does not check a real
apiserver's exec streaming (SPDY/WebSocket), its timeouts, or RBAC.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Sequence

from ..client.channel import Channel, PipeProcess
from ..errors import SandboxError
from .base import ExecTransport
from .hostcli import InjectMode, common_options, map_cli_errors, parse_query
from .hostproc import spawn_checked, spawn_host

__all__ = ["K8sTransport"]

_OPTIONS = {"kubectl", "context", "kubeconfig", "dir", "inject"}
# DNS-1123 labels/subdomains: what Kubernetes accepts as namespace, pod and container names.
_NAME = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$")


class K8sTransport(ExecTransport):
    """A container of a running pod, reached with ``kubectl exec -i``.

    :param namespace: the pod's namespace.
    :param pod: the pod's name.
    :param container: the container in the pod; None: kubectl's default (the first one).
    """

    def __init__(
        self,
        namespace: str,
        pod: str,
        container: str | None = None,
        *,
        kubectl: str | None = None,
        context: str | None = None,
        kubeconfig: str | None = None,
        state_dir: str | None = None,
        inject: InjectMode = "auto",
    ) -> None:
        for what, name in (("namespace", namespace), ("pod", pod), ("container", container or "c")):
            if not _NAME.match(name):
                raise SandboxError(f"bad Kubernetes {what} name {name!r}")
        self.namespace, self.pod, self.container = namespace, pod, container
        self.kubectl = kubectl or "kubectl"
        self.context, self.kubeconfig = context, kubeconfig
        self.agent_state_dir = state_dir
        self.inject = inject
        self.url = f"k8s://{namespace}/{pod}" + (f"/{container}" if container else "")

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
        transport = cls(
            parts[0],
            parts[1],
            parts[2] if len(parts) == 3 else None,
            kubectl=one.get("kubectl"),
            context=one.get("context"),
            kubeconfig=one.get("kubeconfig"),
            state_dir=state_dir,
            inject=inject,
        )
        transport.url = url
        return transport

    def exec_argv(self, argv: Sequence[str]) -> list[str]:
        """The host command line that runs ``argv`` in the pod's container."""
        cmd = [self.kubectl]
        cmd += ["--kubeconfig", self.kubeconfig] if self.kubeconfig else []
        cmd += ["--context", self.context] if self.context else []
        cmd += ["exec", "-i", "-n", self.namespace, self.pod]
        cmd += ["-c", self.container] if self.container else []
        return [*cmd, "--", *argv]

    async def spawn(self, argv: Sequence[str]) -> PipeProcess:
        """``kubectl exec -i ... -- argv`` with stdin/stdout pipes (stderr discarded).

        :raises SandboxError: kubectl is not installed.
        """
        with map_cli_errors(self.kubectl):
            return await spawn_host(self.exec_argv(argv))

    async def check_reachable(self) -> None:
        """Run ``true`` in the pod, so a missing pod or a refused exec fails with kubectl's words.

        :raises SandboxError: kubectl failed (no such pod or container, no access, no cluster).
        """
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
        """Check the pod answers, locate or inject the agent, open the persistent channel.

        :raises SandboxError: kubectl cannot exec into the pod.
        :raises AgentUnavailableError: no agent could be found, injected or started.
        """
        if self.agent_argv is None:
            await self.check_reachable()
        return await super().open_channel()
