"""A session's idle TTL: a session with no run for ``ttl`` seconds is closed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["IdleTimer"]


class IdleTimer:
    """Armed while the session is idle (``idle()``: open, no run); ``expire()`` once it has been
    so for ``ttl`` seconds by ``clock`` (monotonic; a test's fake one). ``ttl`` 0: never."""

    def __init__(
        self, ttl: float, clock: Callable[[], float], idle: Callable[[], bool], expire: Callable[[], None]
    ) -> None:
        self.ttl = ttl
        self._clock = clock
        self._idle = idle
        self._expire = expire
        self.idle_since = clock()
        self._timer: asyncio.TimerHandle | None = None

    def touch(self) -> None:
        """The session was used: count the TTL from now (armed only if it is idle)."""
        self.idle_since = self._clock()
        self.cancel()
        if self.ttl > 0 and self._idle():
            self._timer = asyncio.get_running_loop().call_later(self.ttl, self._fire)

    def check(self) -> bool:
        """Expire the session if it sat idle for ``ttl`` by the clock; return whether it did.

        The timer calls this; a test with a fake clock calls it after advancing the clock.
        """
        if self.ttl <= 0 or not self._idle() or self._clock() - self.idle_since < self.ttl:
            return False
        self._expire()
        return True

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        if not self.check() and self.ttl > 0 and self._idle():
            # Not due by the clock yet (a timer may fire a hair early): check again when it is.
            left = max(self.idle_since + self.ttl - self._clock(), 0.001)
            self._timer = asyncio.get_running_loop().call_later(left, self._fire)
