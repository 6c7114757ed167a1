"""``SandboxTransport``: the seam every sandbox implements, below the sandbox that uses it."""

from __future__ import annotations

from abc import ABC, abstractmethod

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
        """Make sure an agent runs in the sandbox and return a channel to it."""

    def native_copy(self) -> NativeCopy | None:
        """The transport's own copy command for big files (``None``: the agent channel only)."""
        return None

    async def aclose(self) -> None:
        """Tear down whatever the transport set up (containers, connections...)."""
