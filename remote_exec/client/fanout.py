"""``fan_out()``: a task group whose failure is the first child's own exception.

Every call that runs several things at once (a tree's files, a file's chunks, a sandbox's
kills) runs them in one of these, so none of them outlives the call: when one fails the others
are cancelled and awaited before the call raises. Plain ``asyncio.gather`` would leave them
running after the call has raised.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio
from anyio.abc import TaskGroup

__all__ = ["fan_out"]


@contextlib.asynccontextmanager
async def fan_out() -> AsyncIterator[TaskGroup]:
    """``async with fan_out() as tg: tg.start_soon(...)``; raises the first child's exception.

    anyio wraps what the children raised in an ``ExceptionGroup``; callers of ours expect the
    error itself (``RemoteIsADirectoryError``, not a group), so the first one is re-raised, with
    the group as its context. Cancellation from outside cancels every child and waits for them.
    """
    try:
        async with anyio.create_task_group() as tg:
            yield tg
    except BaseExceptionGroup as group:
        raise _first(group) from None


def _first(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc
