"""``JobFeed``: one reader of a job's output on this host, shared by everything that shows it.

A job shown in several places (its cell's view, the dashboard's Open, ``%exec_remote_attach``,
a ``--bg`` handle's follower) used to be read once per place: each with its own handle, cursors
and tail, so the agent served every chunk N times and each place derived the job's state on
its own. A feed is the one owner of all that for one job on one connection: it reads the job
through one handle, keeps the newest output (bounded, in the order it came), and hands each
chunk and the end to every subscriber. A subscriber that comes late is given the kept output
first, then what follows. The end is told once, in one vocabulary (:data:`JobState`).

Feeds are found by job id on their connection (:meth:`JobFeed.of`), held weakly: a feed lives
as long as something subscribed to it or holding it does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import AgentUnresponsiveError, ExecTimeoutError, JobKilledError, RemoteExecError
from .ends import JobState, job_state
from .process import ExecRemoteProcess
from .types import ExecResult, StderrChunk, StdoutChunk

__all__ = ["KEEP_CHARS", "RIDE_OUT_PAUSE", "JobFeed", "JobState", "Outcome", "follow"]

KEEP_CHARS = 512 * 1024
"""Characters of the newest output a feed keeps for subscribers that come late: about what a
view replays on its first ``hello`` (``REPLAY_CHARS``); a feed lives as long as its job runs,
so this is paid once per running job that something shows."""

RIDE_OUT_PAUSE = 1.0
"""Seconds :func:`follow` waits (or less, if the link changes) before asking a lost agent again."""

OutputCallback = Callable[[str, str], None]
log = logging.getLogger("remote_exec")


@dataclass(frozen=True)
class Outcome:
    """How following a job ended.

    :ivar state: never ``running``.
    :ivar result: the result (partial for ``timed out``); ``None`` when it was killed through
        the handle read (its output was discarded on purpose) or could not be followed.
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


async def follow(proc: ExecRemoteProcess, on_output: OutputCallback, *, ride_out: bool = False) -> Outcome:
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
    return Outcome(job_state(result.state, result.returncode), result)


_FEEDS: weakref.WeakKeyDictionary[object, weakref.WeakValueDictionary[str, JobFeed]] = weakref.WeakKeyDictionary()
"""Connection -> job id -> its feed (both weak: a closed connection's and a forgotten job's go)."""
_READING: set[asyncio.Task[Outcome]] = set()  # (the loop keeps only weak references to tasks)


class JobFeed:
    """The one reader of one job on one connection (see the module doc).

    Created by :meth:`of`; the reader starts with the first :meth:`subscribe` or :meth:`ended`
    and runs to the job's end (riding out a lost agent), on the loop it was started from.
    Cancelling a caller's :meth:`ended` or :meth:`follow` does not stop the reader.
    """

    def __init__(self, source: ExecRemoteProcess, keep_chars: int = KEEP_CHARS) -> None:
        self.source = source
        """The handle read (its ``link``, ``info`` and ``options`` describe the job)."""
        self.keep_chars = keep_chars
        self._kept: deque[tuple[str, str]] = deque()
        self._kept_chars = 0
        self.dropped_chars = 0
        """Characters no longer kept (the oldest): a late subscriber does not get them."""
        self._subscribers: dict[int, OutputCallback] = {}
        self._next = 0
        self._reader: asyncio.Task[Outcome] | None = None
        self.outcome: Outcome | None = None
        """How the job ended, once it has."""

    @classmethod
    def of(cls, proc: ExecRemoteProcess) -> JobFeed:
        """The feed of ``proc``'s job on ``proc``'s connection: the one that exists (whatever
        handle it reads), else a new one reading ``proc``."""
        job_id = proc.job_id
        if job_id is None:
            return cls(proc)  # a shell run not yet started: no id to share it by
        feeds = _FEEDS.setdefault(proc.connection, weakref.WeakValueDictionary())
        feed = feeds.get(job_id)
        # A feed whose reading failed ("error": the sandbox was found gone, the channel broke)
        # says nothing of the job itself: a later view reads afresh, through its own handle.
        if feed is None or (feed.outcome is not None and feed.outcome.state == "error"):
            feed = feeds[job_id] = cls(proc)
        return feed

    @property
    def job_id(self) -> str:
        return self.source.job_id or ""

    @property
    def state(self) -> JobState:
        return "running" if self.outcome is None else self.outcome.state

    def subscribe(self, on_output: OutputCallback) -> Callable[[], None]:
        """Call ``on_output(stream, text)`` with the kept output now, then with each new chunk
        (on the loop); returns the function that unsubscribes. Starts the reader if needed."""
        for stream, text in self._kept:
            on_output(stream, text)
        key = self._next
        self._next += 1
        self._subscribers[key] = on_output
        self._start()
        return lambda: self._subscribers.pop(key, None) and None

    async def ended(self) -> Outcome:
        """Wait for the job's end; return how it ended."""
        if self.outcome is not None:
            return self.outcome
        return await asyncio.shield(self._start())

    async def follow(self, on_output: OutputCallback) -> Outcome:
        """:meth:`subscribe` until the end; return how it ended."""
        unsubscribe = self.subscribe(on_output)
        try:
            return await self.ended()
        finally:
            unsubscribe()

    def _start(self) -> asyncio.Task[Outcome]:
        if self._reader is None:
            self._reader = asyncio.get_running_loop().create_task(self._read())
            _READING.add(self._reader)  # a feed reads to the job's end, held or not
            self._reader.add_done_callback(_READING.discard)
        return self._reader

    async def _read(self) -> Outcome:
        outcome = await follow(self.source, self._dispatch, ride_out=True)
        self.outcome = outcome
        return outcome

    def _dispatch(self, stream: str, text: str) -> None:
        self._kept.append((stream, text))
        self._kept_chars += len(text)
        while self._kept_chars > self.keep_chars:
            old_stream, old = self._kept.popleft()
            cut = min(len(old), self._kept_chars - self.keep_chars)
            if cut < len(old):  # one piece larger than the rest: its newest part is kept
                self._kept.appendleft((old_stream, old[cut:]))
            self._kept_chars -= cut
            self.dropped_chars += cut
        for key, callback in list(self._subscribers.items()):
            try:
                callback(stream, text)
            except Exception:  # one broken view must not starve the others, nor end the reading
                log.exception("a subscriber of job %s failed; it gets no more output", self.job_id)
                self._subscribers.pop(key, None)
