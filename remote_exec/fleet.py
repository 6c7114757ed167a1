"""``Fleet``: one command on many sandboxes at once, results collected, streams merged.

The building block for "many sandboxes" work (a sweep over containers, a check on every host of
a cluster, a dashboard over several sandboxes). One sandbox failing never cancels the others:
its entry holds the exception instead of a result.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Unpack

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .client.sandbox import AsyncSandbox
from .client.types import ExecRemoteEvent, ExecRemoteOptions, ExecResult, OptionOverrides
from .errors import RemoteExecError
from .sandboxes import open_sandbox

__all__ = ["Fleet", "FleetEvent", "gather"]


@dataclass(frozen=True, slots=True)
class FleetEvent:
    """An event of one sandbox's job in a merged fleet stream.

    :ivar index: the sandbox's position in the fleet.
    :ivar sandbox: the sandbox's URL.
    :ivar event: the event, or the error that ended that sandbox's stream (then it is the last
        item for that sandbox).
    """

    index: int
    sandbox: str
    event: ExecRemoteEvent | RemoteExecError


class Fleet:
    """Several sandboxes driven together: ``async with rx.Fleet(urls) as fleet``.

    :param sandboxes: sandbox URLs (opened and closed by the fleet) or open ``AsyncSandbox``
        objects (left open).
    :param limit: the most sandboxes working at once.
    """

    def __init__(self, sandboxes: Sequence[str | AsyncSandbox], *, limit: int = 64) -> None:
        if not sandboxes:
            raise ValueError("a fleet needs at least one sandbox")
        self._given = list(sandboxes)
        self._limiter = anyio.CapacityLimiter(limit)
        self._owned: list[AsyncSandbox] = []
        self.sandboxes: list[AsyncSandbox] = []

    async def __aenter__(self) -> Fleet:
        """Open every sandbox given by URL, concurrently; on any failure close what opened."""
        slots: list[AsyncSandbox | None] = [s if isinstance(s, AsyncSandbox) else None for s in self._given]

        async def open_one(i: int, url: str) -> None:
            async with self._limiter:
                sb = await open_sandbox(url)
            self._owned.append(sb)
            slots[i] = sb

        try:
            async with anyio.create_task_group() as tg:
                for i, s in enumerate(self._given):
                    if isinstance(s, str):
                        tg.start_soon(open_one, i, s)
        except BaseException:
            await self.aclose()
            raise
        self.sandboxes = [s for s in slots if s is not None]
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the sandboxes the fleet opened, concurrently (shielded from cancellation): a
        hundred closes take as long as the slowest, not their sum (each may wait a grace for
        its channel's relay, or delete a pod).

        :raises ExceptionGroup: closing some sandboxes failed (the others were still closed).
        """
        errors: list[Exception] = []

        async def close(sb: AsyncSandbox) -> None:
            try:
                await sb.aclose()
            except Exception as exc:
                errors.append(exc)

        with anyio.CancelScope(shield=True):
            owned, self._owned = self._owned, []
            async with anyio.create_task_group() as tg:
                for sb in owned:
                    tg.start_soon(close, sb)
        if errors:
            raise ExceptionGroup(f"closing {len(errors)} sandbox(es) of the fleet failed", errors)

    async def run(
        self, command: list[str] | str, options: ExecRemoteOptions | None = None, **overrides: Unpack[OptionOverrides]
    ) -> list[ExecResult | RemoteExecError]:
        """Run ``command`` to the end on every sandbox; results (or errors) in fleet order.

        Cancelling ``run()`` kills the jobs still running.
        """
        results: list[ExecResult | RemoteExecError | None] = [None] * len(self.sandboxes)

        async def one(i: int, sb: AsyncSandbox) -> None:
            async with self._limiter:
                try:
                    results[i] = await sb.run(command, options, **overrides)
                except RemoteExecError as exc:
                    results[i] = exc

        async with anyio.create_task_group() as tg:
            for i, sb in enumerate(self.sandboxes):
                tg.start_soon(one, i, sb)
        return [r for r in results if r is not None]

    @contextlib.asynccontextmanager
    async def stream(
        self, command: list[str] | str, options: ExecRemoteOptions | None = None, **overrides: Unpack[OptionOverrides]
    ) -> AsyncIterator[MemoryObjectReceiveStream[FleetEvent]]:
        """Start ``command`` everywhere; iterate the merged, tagged events inside the block::

            async with fleet.stream(["pytest"]) as events:
                async for item in events:
                    print(item.index, item.event)

        Each sandbox's events stay in order; the sandboxes interleave. Leaving the block early
        (or cancelling it) kills the jobs still running. (A context manager rather than an async
        generator: a task group must not be suspended across a bare ``yield``.)
        """
        send, receive = anyio.create_memory_object_stream[FleetEvent](max_buffer_size=1024)

        async def pump(i: int, sb: AsyncSandbox, out: MemoryObjectSendStream[FleetEvent]) -> None:
            async with out, self._limiter:
                try:
                    async for ev in sb.exec_remote(command, options, **overrides):
                        await out.send(FleetEvent(i, sb.url, ev))
                except RemoteExecError as exc:
                    await out.send(FleetEvent(i, sb.url, exc))

        async with anyio.create_task_group() as tg, receive:
            async with send:
                for i, sb in enumerate(self.sandboxes):
                    tg.start_soon(pump, i, sb, send.clone())
            try:
                yield receive
            finally:
                tg.cancel_scope.cancel()  # an early exit kills the rest (cancellation kills jobs)


async def gather(
    sandboxes: Sequence[str | AsyncSandbox],
    command: list[str] | str,
    options: ExecRemoteOptions | None = None,
    **overrides: Unpack[OptionOverrides],
) -> list[ExecResult | RemoteExecError]:
    """Run ``command`` on every sandbox concurrently; results (or errors) in the given order."""
    async with Fleet(sandboxes) as fleet:
        return await fleet.run(command, options, **overrides)
