"""Sandboxes: one transport per URL scheme, and ``open_sandbox`` to pick one by URL."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

from ..client.sandbox import AsyncSandbox, SandboxTransport
from ..errors import SandboxError
from .docker import DockerTransport, PodmanTransport
from .docker_image import DockerImageTransport
from .jail import JailTransport
from .k8s import K8sTransport
from .local import LocalTransport
from .ssh import SSHTransport

__all__ = ["SCHEMES", "SandboxOpener", "open_sandbox", "transport_for"]

SCHEMES: dict[str, Callable[[str], SandboxTransport]] = {
    "docker": DockerTransport.from_url,
    "docker+image": DockerImageTransport.from_url,
    "jail": JailTransport.from_url,
    "k8s": K8sTransport.from_url,
    "local": LocalTransport.from_url,
    "podman": PodmanTransport.from_url,
    "ssh": SSHTransport.from_url,
}
"""URL scheme -> factory of the transport for that kind of sandbox."""


def transport_for(url: str) -> SandboxTransport:
    """The transport a sandbox URL names.

    :raises SandboxError: the URL is malformed or its scheme unknown.
    """
    scheme, sep, _ = url.partition("://")
    factory = SCHEMES.get(scheme) if sep else None
    if factory is None:
        known = ", ".join(f"{s}://" for s in SCHEMES)
        raise SandboxError(f"unsupported sandbox URL {url!r} (known: {known})")
    return factory(url)


class SandboxOpener:
    """What ``open_sandbox`` returns: use ``async with`` (closes for you) or ``await`` it."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    def __await__(self) -> Generator[Any, None, AsyncSandbox]:
        return self._sandbox.open().__await__()

    async def __aenter__(self) -> AsyncSandbox:
        return await self._sandbox.open()

    async def __aexit__(self, *exc: object) -> None:
        await self._sandbox.aclose()


def open_sandbox(
    url: str = "local://",
    *,
    response_margin: float | None = None,
    workspace_root: str | None = None,
    open_timeout: float | None = None,
) -> SandboxOpener:
    """Open the sandbox at ``url``: ``async with rx.open_sandbox(url) as sb`` or ``sb = await ...``.

    With ``await``, close it yourself with ``await sb.aclose()``. ``response_margin`` is how
    many seconds a long poll's response may be late before it is asked again (default 5).
    ``open_timeout``: seconds the agent has to answer once the transport is up (default 10).
    ``workspace_root`` (an absolute path in the sandbox) confines the file methods to it:
    see :attr:`AsyncSandbox.workspace_root`.

    :raises SandboxError: bad URL or unknown scheme.
    :raises AgentUnavailableError: the agent cannot be started or reached.
    """
    kwargs: dict[str, float] = {}
    if response_margin is not None:
        kwargs["response_margin"] = response_margin
    if open_timeout is not None:
        kwargs["open_timeout"] = open_timeout
    return SandboxOpener(AsyncSandbox(transport_for(url), workspace_root=workspace_root, **kwargs))
