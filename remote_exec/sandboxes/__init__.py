"""Sandboxes: one transport per URL scheme, and ``open_sandbox`` to pick one by URL."""

from __future__ import annotations

import os
from collections.abc import Callable, Generator
from typing import Any
from urllib.parse import quote, urlencode

from ..client.channel import Liveness
from ..client.sandbox import AsyncSandbox
from ..client.transport import SandboxTransport
from ..errors import SandboxError
from .docker import DockerTransport, PodmanTransport
from .docker_image import DockerImageTransport
from .jail import JailTransport
from .k8s import K8sTransport
from .k8s_image import K8sImageTransport
from .local import LocalTransport
from .ssh import SSHTransport

__all__ = ["SCHEMES", "SandboxOpener", "open_sandbox", "sandbox_url", "transport_for"]

SCHEMES: dict[str, Callable[[str], SandboxTransport]] = {
    "docker": DockerTransport.from_url,
    "docker+image": DockerImageTransport.from_url,
    "jail": JailTransport.from_url,
    "k8s": K8sTransport.from_url,
    "k8s+image": K8sImageTransport.from_url,
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
    if "#" in url:  # urlsplit would drop the rest silently: "dir=/srv/a#b" would open /srv/a
        raise SandboxError(f"a sandbox URL has no #fragment (write # in a value as %23): {url!r}")
    return factory(url)


OptionValue = str | os.PathLike[str] | int | float


def sandbox_url(scheme: str, target: str = "", /, **options: OptionValue | list[OptionValue] | None) -> str:
    """A sandbox URL built from parts, each quoted: what a value holds stays in that value.

    ``rx.sandbox_url("local", dir=f"/srv/agents/{key}")`` is ``local://?dir=/srv/agents/...``
    with any ``&``, ``#``, ``?``, ``%``, ``+`` or space of ``key`` percent-quoted, so a key
    cannot add an option or cut the URL short (pasting it into an f-string URL can). ``target``
    is the part before the query (``"my-container"``, ``"user@host:2222"``,
    ``"ns/pod"``), quoted the same way except for ``/ @ : [ ]``. A list gives a repeatable
    option (``volume=[...]``, ``ro=[...]``) once per item; ``None`` leaves an option out.

    Quoting keeps values apart; it does not make a value safe as a path: a key ``..`` still
    climbs out of ``/srv/agents``. Check a key before it becomes a path (see the README).
    """
    pairs = [
        (name, os.fspath(v) if isinstance(v, os.PathLike) else str(v))
        for name, value in options.items()
        if value is not None
        for v in (value if isinstance(value, list) else [value])
    ]
    query = urlencode(pairs, quote_via=quote, safe="/")
    return f"{scheme}://{quote(target, safe='/@:[]')}" + (f"?{query}" if query else "")


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
    liveness: float | Liveness | None = None,
) -> SandboxOpener:
    """Open the sandbox at ``url``: ``async with rx.open_sandbox(url) as sb`` or ``sb = await ...``.

    With ``await``, close it yourself with ``await sb.aclose()``. ``response_margin`` is how
    many seconds a long poll's response may be late before it is asked again (default 5).
    ``open_timeout``: seconds the agent has to answer once the transport is up (default 10).
    ``workspace_root`` (an absolute path in the sandbox) confines the file methods to it:
    see :attr:`AsyncSandbox.workspace_root`. ``liveness``: seconds within which a silent
    agent (frozen, paused, cut off) fails every waiting call with ``AgentUnresponsiveError``
    (default 8; a :class:`~remote_exec.client.channel.Liveness` sets the heartbeat's interval
    and timeout apart; ``0`` turns the heartbeat off, leaving the call deadlines).

    :raises SandboxError: bad URL or unknown scheme.
    :raises AgentUnavailableError: the agent cannot be started or reached.
    """
    settings: dict[str, Any] = {}
    if response_margin is not None:
        settings["response_margin"] = response_margin
    if open_timeout is not None:
        settings["open_timeout"] = open_timeout
    if liveness is not None:
        settings["liveness"] = (
            liveness if isinstance(liveness, Liveness) else Liveness.within(liveness) if liveness else None
        )
    return SandboxOpener(AsyncSandbox(transport_for(url), workspace_root=workspace_root, **settings))
