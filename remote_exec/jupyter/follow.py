"""Following a job on the blocking API's background loop, for the magics and the widgets.

The notebook face never starts an event loop of its own: it borrows the one thread that the
blocking twin (``rx.connect``) runs, through that sandbox's portal. Events are read there and
handed on (to a queue the cell's thread drains, or to a widget), so the kernel's main thread is
never needed while a job runs.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from anyio.from_thread import BlockingPortal

from ..blocking import BlockingExecRemoteProcess, BlockingShellSession, Sandbox
from ..client.feed import JobState, Outcome, follow

__all__ = ["JobState", "Loop", "Outcome", "follow", "loop_of"]

T = TypeVar("T")


class Loop:
    """The background event loop behind one blocking portal, usable from any thread.

    :meth:`spawn` and :meth:`call_soon` work on the loop thread too, where the portal's own
    methods would deadlock (a widget created there, e.g. by a dashboard's Open button).
    """

    def __init__(self, portal: BlockingPortal) -> None:
        self.portal = portal
        self.loop: asyncio.AbstractEventLoop = portal.call(asyncio.get_running_loop)
        self.thread_id: int = portal.call(threading.get_ident)
        self._tasks: set[asyncio.Task[Any]] = set()  # strong refs: the loop keeps only weak ones

    def on_loop(self) -> bool:
        return threading.get_ident() == self.thread_id

    def spawn(self, fn: Callable[..., Awaitable[T]], *args: Any) -> Future[T] | asyncio.Task[T]:
        """Run ``fn(*args)`` as a task on the loop, from any thread; returns at once."""
        if self.on_loop():
            task: asyncio.Task[T] = self.loop.create_task(_as_coro(fn, *args))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return task
        return self.portal.start_task_soon(fn, *args)

    def call_soon(self, fn: Callable[..., object], *args: Any) -> None:
        """Run the plain function ``fn(*args)`` on the loop thread soon (now, if already there)."""
        if self.on_loop():
            fn(*args)
        else:
            self.loop.call_soon_threadsafe(fn, *args)

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``fn(*args)`` on the loop and wait for it (not from the loop thread)."""
        return self.portal.call(fn, *args)


async def _as_coro(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    return await fn(*args)


_loops: dict[int, Loop] = {}
_loops_lock = threading.Lock()


def loop_of(obj: Sandbox | BlockingExecRemoteProcess | BlockingShellSession) -> Loop:
    """The background loop a blocking object runs on (one per process, shared by all of them)."""
    # An async object must be driven on the loop it was created on: the blocking object's portal's.
    portal: BlockingPortal = obj.portal
    with _loops_lock:
        loop = _loops.get(id(portal))
        if loop is None or loop.portal is not portal:
            loop = _loops[id(portal)] = Loop(portal)
        return loop
