"""``SandboxTransport``: the seam every sandbox implements, below the sandbox that uses it."""

from __future__ import annotations

from abc import ABC, abstractmethod

from ..errors import RemoteExecError
from .channel import Channel
from .native import NativeCopy

__all__ = ["SandboxTransport"]


class SandboxTransport(ABC):
    """The seam every sandbox implements: how to reach its agent.

    :ivar url: the sandbox URL this transport was made from.
    """

    url: str

    @abstractmethod
    async def open_channel(self) -> Channel:
        """Make sure an agent runs in the sandbox and return a channel to it.

        When it is cancelled or fails, the sandbox calls :meth:`aclose` (shielded) to tear down
        what it had set up, so an implementation keeps enough state for that.
        """

    def default_cwd(self) -> str | None:
        """Where a job or shell session starts when the caller gives no ``cwd``: ``None`` (the
        default) leaves it to the agent (its own working directory: a container's working dir,
        the remote user's home). Asked at each start, on the event loop: it must not block."""
        return None

    def native_copy(self) -> NativeCopy | None:
        """The transport's own copy command for big files (``None``: the agent channel only)."""
        return None

    async def diagnose(self) -> RemoteExecError | None:
        """After a transport failure: what became of the sandbox, as the error to raise instead
        (``SandboxLostError`` when it is gone), or ``None`` when there is nothing to add.

        Bounded by the caller (:data:`~remote_exec.client.rpc.DIAGNOSE_TIMEOUT`). It only looks
        (an ``inspect``, a probe connection): cancelling it changes nothing in the sandbox."""
        return None

    async def aclose(self) -> None:
        """Tear down whatever the transport set up (containers, connections...).

        The sandbox calls it shielded from cancellation; an implementation bounds its own waits.
        """
