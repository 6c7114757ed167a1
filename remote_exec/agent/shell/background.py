"""A session's background tasks (an interrupt, a signal, its own close): kept referenced until
they end, and a failure logged rather than lost."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

__all__ = ["Background"]

log = logging.getLogger("remote_exec.agent")


class Background:
    """Tasks started on behalf of ``owner`` (named in the log)."""

    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._tasks: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    async def wait(self) -> None:
        """Wait for the tasks running now to end; cancelling it leaves them running (``gather``
        would cancel them with it)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks))

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("shell %s: %s failed", self._owner, task.get_coro(), exc_info=task.exception())
