"""``Link``: the observable state of one sandbox's agent channel, for views to show.

One :class:`Link` per channel, set by the channel and the RPC client as things happen, read
by the views (JobView, Dashboard, ``remote-exec ps/attach/top``):

- ``connecting``: opened, no frame received yet.
- ``connected``: a frame (an answer or a heartbeat's) arrived since the last trouble.
- ``reconnecting``: the transport broke (the relay died, a socket was reset); the next
  request sets up a new one.
- ``lost``: the agent answered nothing within the liveness bound — frozen, paused or cut off
  (:class:`~remote_exec.errors.AgentUnresponsiveError`). It may come back: the first frame
  after a ``SIGCONT`` or an unpause makes the link ``connected`` again.
- ``gone``: the sandbox itself is gone (:class:`~remote_exec.errors.SandboxLostError`: the
  container was killed, the box exited, the host is unreachable).
- ``closed``: the sandbox was closed on this side.

Changes are made and reported on the channel's event loop (the blocking API's background
thread): listeners run there and must not block. Reading :attr:`Link.status` is safe from any
thread (one immutable object, swapped whole).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = ["Link", "LinkListener", "LinkState", "LinkStatus"]

LinkState = Literal["connecting", "connected", "reconnecting", "lost", "gone", "closed"]
"""See the module docstring."""


@dataclass(frozen=True)
class LinkStatus:
    """One state of a :class:`Link`.

    :ivar state: what the channel knows of the agent.
    :ivar since: when the link entered it (seconds since the epoch).
    :ivar reason: why, in words (empty for ``connected``).
    """

    state: LinkState
    since: float
    reason: str = ""

    @property
    def healthy(self) -> bool:
        """True while the agent is known to answer (``connected``)."""
        return self.state == "connected"


LinkListener = Callable[[LinkStatus], None]
"""Called with the new status on each change (on the channel's loop; must not block)."""


class Link:
    """The state of one agent channel, with change events (see the module docstring)."""

    def __init__(self) -> None:
        self._status = LinkStatus("connecting", time.time())
        self._listeners: list[LinkListener] = []
        self._changed = asyncio.Event()

    @property
    def status(self) -> LinkStatus:
        """The current status (safe to read from any thread)."""
        return self._status

    @property
    def state(self) -> LinkState:
        return self._status.state

    def set(self, state: LinkState, reason: str = "") -> None:
        """Enter ``state`` (no event when it is the current one). ``closed`` is final."""
        if state == self._status.state or self._status.state == "closed":
            return
        self._status = LinkStatus(state, time.time(), reason)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        for listener in list(self._listeners):
            listener(self._status)

    def subscribe(self, listener: LinkListener) -> Callable[[], None]:
        """Call ``listener`` on every change from now on; returns the function that stops it."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    async def changed(self) -> LinkStatus:
        """Wait for the next change and return the new status.

        Cancelling it changes nothing.
        """
        await self._changed.wait()
        return self._status

    def __repr__(self) -> str:
        return f"<Link {self._status.state}>"
