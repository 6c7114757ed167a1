"""Following a job on the blocking API's background loop, for the magics and the widgets.

The notebook face never starts an event loop of its own: it borrows the one thread that the
blocking twin (``rx.connect``) runs, through that sandbox's portal. Events are read there and
handed on (to a queue the cell's thread drains, or to a widget), so the kernel's main thread is
never needed while a job runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from anyio.from_thread import BlockingPortal

from ..blocking import BlockingExecRemoteProcess, BlockingShellSession, Sandbox
from ..client.process import ExecRemoteProcess
from ..client.types import ExecResult, StderrChunk, StdoutChunk
from ..errors import AgentUnresponsiveError, ExecTimeoutError, JobKilledError, RemoteExecError

__all__ = ["JobState", "Loop", "Outcome", "follow", "loop_of"]

T = TypeVar("T")
JobState = Literal["running", "completed", "failed", "killed", "timed out", "error"]
"""What a view shows: ``failed`` is a non-zero exit, ``error`` a broken connection or spawn."""


@dataclass(frozen=True)
class Outcome:
    """How following a job ended.

    :ivar state: never ``running``.
    :ivar result: the result (partial for ``timed out``); ``None`` when it was killed through
        this handle (its output was discarded on purpose) or could not be followed.
    :ivar error: the exception that ended it, if any.
    """

    state: JobState
    result: ExecResult | None = None
    error: BaseException | None = None

    @property
    def exit_code(self) -> int | None:
        return self.result.returncode if self.result is not None else None


def _text(data: str | bytes) -> str:
    return data if isinstance(data, str) else data.decode("utf-8", "replace")


RIDE_OUT_PAUSE = 1.0
"""Seconds :func:`follow` waits (or less, if the link changes) before asking a lost agent again."""


async def follow(proc: ExecRemoteProcess, on_output: Callable[[str, str], None], *, ride_out: bool = False) -> Outcome:
    """Read ``proc`` to its end, calling ``on_output(stream, text)`` for each chunk (on the loop).

    ``ride_out``: an unresponsive agent (frozen, paused, cut off: the handle's ``link`` says
    ``lost``) does not end the following; it goes on asking, from the same cursors, until the
    agent answers again or the sandbox is found gone (:class:`SandboxLostError` ends it). For a
    view that shows the link's state: a person sees "lost" and can act, nothing hangs unseen.

    Cancelling ``follow`` kills the job when ``proc`` owns it (see ``kill_on_cancel``).
    """
    try:
        while True:
            try:
                async for ev in proc:
                    if isinstance(ev, StdoutChunk):
                        on_output("stdout", _text(ev.data))
                    elif isinstance(ev, StderrChunk):
                        on_output("stderr", _text(ev.data))
                break
            except AgentUnresponsiveError:
                if not ride_out:  # (a SandboxLostError is no AgentUnresponsiveError: it ends this)
                    raise
                # A pause, not synchronisation: each new try is itself bounded by the liveness
                # bound; a change of the link (gone, or back) ends the pause early.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.link.changed(), RIDE_OUT_PAUSE)
        result = await proc.wait()
    except ExecTimeoutError as exc:
        return Outcome("timed out", exc.result if isinstance(exc.result, ExecResult) else None, exc)
    except JobKilledError as exc:
        return Outcome("killed", None, exc)
    except RemoteExecError as exc:
        return Outcome("error", None, exc)
    if result.state == "killed":
        return Outcome("killed", result)
    if result.state == "timed_out":
        return Outcome("timed out", result)
    return Outcome("completed" if result.returncode == 0 else "failed", result)


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
