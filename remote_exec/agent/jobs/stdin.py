"""A job's stdin queue: bytes on their way into the pipe, bounded and charged to the budget.

asyncio's pipe transport queues whatever it is given; a job that never reads its stdin once let
1280 MiB pile up in the agent. Here a write takes only what fits (the queue's own limit and the
memory budget), and the writer is told how much was taken so it sends the rest later: the
back-pressure a pipe gives, carried over the protocol (``WriteStdinResult.stdin_bytes``).
"""

from __future__ import annotations

import asyncio
import contextlib
import re

from ...errors import JobNotRunningError, ServerBusyError
from ...protocol.names import WRITER_PATTERN
from ..budget import MemoryBudget

__all__ = ["MAX_WRITERS", "STDIN_WAIT", "WRITER_FORM", "StdinPipeProtocol", "StdinQueue", "remember"]

STDIN_WAIT = 5.0  # a write with no room waits this long for some before answering "0 taken"
MAX_WRITERS = 64  # typists of one terminal whose cursors are kept (the least recent is forgotten)
WRITER_FORM = re.compile(WRITER_PATTERN)  # (read back from the job dir: the wire's form)


def remember(recent: dict[str, int], key: str, value: int) -> None:
    """Set ``recent[key]``, newest last, forgetting the least recent beyond :data:`MAX_WRITERS`."""
    recent.pop(key, None)
    recent[key] = value
    while len(recent) > MAX_WRITERS:
        del recent[next(iter(recent))]


class StdinQueue:
    """The stdin side of one job: cursor, open/closed, and the bytes queued towards the pipe.

    :param limit: bytes queued at most (the job's ``buffer_limit``).
    """

    def __init__(self, job_id: str, limit: int) -> None:
        self.job_id = job_id
        self.limit = limit
        self.budget: MemoryBudget | None = None
        self.pipe: asyncio.WriteTransport | None = None
        self.open = False
        self.written = 0  # bytes taken: the cursor a writer continues from
        self.writers: dict[str, int] = {}  # a terminal's typists: bytes taken from each (see write)
        self._held = 0  # bytes charged to the budget for the queue (an upper bound of it)
        self._room = asyncio.Event()

    def attach(self, pipe: asyncio.WriteTransport | None, open_: bool) -> None:
        """The job started: ``pipe`` is its stdin (None for /dev/null)."""
        self.pipe = pipe
        self.open = open_
        if pipe is not None:
            # Paused as soon as anything is queued, resumed once it all went out: resume_writing
            # (-> :meth:`room`) is the "queue drained" signal for the budget and waiting writers.
            pipe.set_write_buffer_limits(high=0)

    def reserve_input(self, n: int) -> None:
        """Reserve the start's ``input`` before the job spawns: it is queued whole.

        :raises ServerBusyError: it does not fit the memory budget.
        """
        if self.budget is not None and n:
            if not self.budget.try_reserve(n):
                raise ServerBusyError(
                    f"input of {n} bytes does not fit the agent's memory budget ({self.budget.free()} of "
                    f"{self.budget.limit} bytes free); start with stdin_open and write it instead",
                    data={"job_id": self.job_id},
                )
            self._held += n

    def _queued(self) -> int:
        pipe = self.pipe
        return pipe.get_write_buffer_size() if pipe is not None and not pipe.is_closing() else 0

    def release(self, keep: int = 0) -> None:
        """Release the charge down to ``keep`` bytes."""
        if self._held > keep:
            if self.budget is not None:
                self.budget.release(self._held - keep)
            self._held = keep

    def room(self) -> None:
        """The queue drained or the pipe closed: uncharge what left, wake waiting writers."""
        self.release(self._queued())
        self._room.set()
        self._room = asyncio.Event()

    def cursor(self, writer: str | None = None) -> int:
        """Where a write continues from: the job's stdin cursor, or ``writer``'s own."""
        return self.written if writer is None else self.writers.get(writer, 0)

    def write(
        self, data: bytes, offset: int | None, eof: bool, reserved: bool = False, writer: str | None = None
    ) -> int:
        """Queue ``data`` from stdin byte ``offset`` (None: append); bytes already taken are
        skipped, so a repeated write is not duplicated. Takes what fits; ``eof`` applies only if
        all was taken. Returns the new bytes taken (``reserved``: all, charged already).

        With ``writer`` (a terminal's typist), ``offset`` counts that writer's bytes: its own
        repeated write is skipped the same way, and what it sends is appended after whatever the
        other typists sent meanwhile.
        """
        if not self.open:
            raise JobNotRunningError(f"stdin of job {self.job_id} is not open", job_id=self.job_id)
        if writer is not None and offset is not None:
            have = self.writers.get(writer, 0)
            if offset > have:
                raise JobNotRunningError(
                    f"stdin offset {offset} of writer {writer} is past the {have} bytes it wrote (or it was "
                    f"forgotten: a terminal keeps its last {MAX_WRITERS} typists)",
                    job_id=self.job_id,
                )
            data = data[have - offset :]
            taken = self.write(data, None, eof, reserved)
            remember(self.writers, writer, have + taken)
            return taken
        if offset is not None:
            if offset > self.written:
                raise JobNotRunningError(
                    f"stdin offset {offset} is past the {self.written} bytes written", job_id=self.job_id
                )
            data = data[self.written - offset :]
        pipe = self.pipe
        alive = pipe is not None and not pipe.is_closing()
        take = len(data)  # a closed pipe discards bytes, as writing to it would
        if alive and not reserved:
            self.release(self._queued())
            take = min(take, max(0, self.limit - self._held))
            if self.budget is not None:
                take = self.budget.reserve_up_to(take)
            self._held += take
        if pipe is not None and alive:
            if take:
                pipe.write(data[:take] if take < len(data) else data)
            self.release(self._queued())  # what the pipe took at once is not held
            if eof and take == len(data):
                pipe.close()
        self.written += take
        if eof and take == len(data):
            self.open = False
        return take

    async def wait_room(self) -> None:
        """Wait up to :data:`STDIN_WAIT` for room: the queue draining, or the budget freeing
        when that is what ran short. Cancelling it changes nothing."""
        budget = self.budget
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STDIN_WAIT):
                if budget is not None and self._held < self.limit and budget.free() == 0:
                    await budget.freed()
                else:
                    await self._room.wait()


class StdinPipeProtocol(asyncio.BaseProtocol):
    """For a job's stdin pipe (ours at spawn, or the fd the keeper held for a re-adopted job)."""

    def __init__(self, queue: StdinQueue) -> None:
        self._queue = queue

    def connection_lost(self, exc: Exception | None) -> None:
        self._queue.room()

    def resume_writing(self) -> None:
        self._queue.room()
