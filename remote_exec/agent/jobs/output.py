"""What a job's readers see: its two cursor-addressed output streams, and the follow and the
poll that serve them.

:class:`JobOutput` holds the streams (the job's two log files: the job writes them itself,
so no reader can slow it), the change a waiting reader is woken by, the watch rules' record,
the follow (pushes as output arrives, one read shared by the followers at the same cursors) and
the poll (long waits); both give the terminal state only with the last byte. :class:`~.job.Job`
adds the lifecycle of what writes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from ...protocol import (
    MAX_HITS_KEPT,
    MAX_WAIT,
    FollowParams,
    FollowResult,
    JobState,
    PollParams,
    PollResult,
    StartParams,
    WatchHit,
)
from ..buffer import Slice
from ..filespan import FileSpan
from ..rpc import WithPayload, dump_json
from .logfile import LogFile

__all__ = ["MAX_GAP_FOLLOWERS", "PUSH_GAP", "UNWATCHED_TICK", "JobOutput", "PushFn", "hold_back"]

UNWATCHED_TICK = 0.1  # a waiting poll looks at a job's files this often when no inotify watch can tell it
# A follower of a busy job pushes at most every PUSH_GAP seconds per follower of the job, unless
# its push is full: each push costs the agent ~0.05-0.1 ms whatever its size, and a job writing
# 1 GB/s had ~100 KiB new after each push (the pushes' fixed costs were half the agent's CPU).
# Times the followers: with twenty of them every push is paid twenty times, so each waits longer
# and carries more (the pushes' fixed costs stay near one follower's; each connection's bytes
# are still the kernel's to move). A push after a quiet spell goes at once; in a stream a viewer
# sees its bytes at most PUSH_GAP x followers (up to MAX_GAP_FOLLOWERS) late.
PUSH_GAP = 0.001
MAX_GAP_FOLLOWERS = 16  # the gap stops growing there: a push is at most 16 ms late, however many follow


def hold_back(since_push: float, followers: int, size: int, max_bytes: int, finished: bool) -> float:
    """How long a follower waits before a push of ``size`` bytes, ``since_push`` seconds after its
    last (0: push now): only a push that is neither full nor the job's last, within
    :data:`PUSH_GAP` times the job's followers of the last one, waits out the rest of that gap."""
    if finished or size >= max_bytes:
        return 0.0
    return max(0.0, PUSH_GAP * min(max(1, followers), MAX_GAP_FOLLOWERS) - since_push)


PushFn = Callable[[bytes, tuple[FileSpan, ...]], Awaitable[None]]
"""Sends one push (its JSON, and its payload straight from the logs) on the follower's
connection; returns once written."""


class _Shared(NamedTuple):
    """One push as encoded for every follower at the same cursors (the job's newest chunk)."""

    key: tuple[int, int, int]  # stdout cursor, stderr cursor, max_bytes
    body: bytes  # the push's JSON after its head
    spans: tuple[FileSpan, ...]  # its payload, in the logs: stdout's bytes, then stderr's
    ends: tuple[int, int]  # the cursors after it
    finished: bool
    hits: int


class JobOutput:
    """A job's output streams, its state as readers see it, and the poll that serves them."""

    def __init__(self, job_id: str, params: StartParams, streams: dict[int, LogFile]) -> None:
        self.job_id = job_id
        self.params = params
        self.encoding = params.encoding
        self.exit_code: int | None = None
        self.streams = streams  # fd 1 and fd 2: stdout's and stderr's log
        self._logs = {log.path: log for log in streams.values()}  # a push's spans name their log by path
        self._state: JobState = "running"
        self._done = asyncio.Event()
        self._changed = asyncio.Event()
        self._followers = 0  # follow calls under way (see follow)
        self._shared: _Shared | None = None
        # What the job's policy did (see policy.py, which fills these in): kept on the job so
        # every reader (list, poll, the next agent) sees the same record.
        self.reason: str | None = None
        self.hits: list[WatchHit] = []
        self.hits_total = 0
        self.rules_disabled: list[int] = []
        self.watch_skipped = 0

    def record_hit(self, hit: WatchHit) -> None:
        """A watch rule matched: count it, keep the first ones, and wake the pollers (a hit
        answers a long poll, as output does)."""
        self.hits_total += 1
        if len(self.hits) < MAX_HITS_KEPT:
            self.hits.append(hit)
        self._shared = None  # a shared push carries the old count
        self._notify()

    @property
    def files(self) -> list[LogFile]:
        """Its two log files."""
        return list(self.streams.values())

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # -- operations -------------------------------------------------------------------------

    async def poll(self, p: PollParams) -> PollResult | WithPayload:
        """Return output after the given cursors, waiting up to ``p.wait`` for some to appear.

        A ``binary`` poll answers with the bytes as payload. (The host follows instead, where
        its channel can carry pushes: :meth:`follow`; polls serve the stateless channel.)
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(p.wait, MAX_WAIT)
        seen = self.hits_total if p.hits is None else p.hits
        while True:
            out, err, ends, finished = self._read_both(p.stdout_offset, p.stderr_offset, p.max_bytes, p.binary)
            remaining = deadline - loop.time()
            if self._news(out, err, seen) or finished or remaining <= 0:
                return self._answer(out, err, finished, p.binary)
            await self._wait_for_change(ends, remaining)

    async def follow(self, p: FollowParams, push: PushFn, head: bytes) -> FollowResult:
        """Push the output after ``p``'s cursors as it arrives, each push ``head`` (the
        notification's start, naming the call and the job) and a binary poll's answer; end as
        :class:`FollowResult` says. Followers at the same cursors share one read and one
        encoding (:class:`_Shared`): twenty views of a job cost the agent one read per chunk.

        Cancelled (the connection closed): nothing to undo, the cursors are the client's.
        """
        loop = asyncio.get_running_loop()
        cursors = (p.stdout_offset, p.stderr_offset)
        seen = self.hits_total if p.hits is None else p.hits
        pushes = sent = 0
        pushed_at = -math.inf  # when the last push went out (loop time)
        wait = min(p.wait, MAX_WAIT)
        deadline = loop.time() + wait
        self._followers += 1
        try:
            while True:
                shared = self._shared
                if shared is not None and shared.key != (*cursors, p.max_bytes):
                    shared = None
                if shared is None:
                    # A look at the ends before any read: a follower that was handed the newest
                    # chunk (above) finds nothing new without reading the logs again.
                    ends = (self.streams[1].end, self.streams[2].end)
                    quiet = ends == cursors and not self._done.is_set() and self.hits_total <= seen
                    if not quiet:
                        # Held back before any read: a follower of a busy job waits out its gap
                        # (its news, by the ends alone, is neither a full push nor the last).
                        news = ends[0] - cursors[0] + ends[1] - cursors[1]
                        last = self._done.is_set() or self.hits_total > seen
                        hold = hold_back(loop.time() - pushed_at, self._followers, news, p.max_bytes, last)
                        if hold > 0:
                            await asyncio.sleep(hold)
                            continue
                        out, err, spans, ends, finished = self._spans_both(cursors, p.max_bytes)
                        quiet = not (out.end > out.start or err.end > err.start or out.dropped or err.dropped)
                        quiet = quiet and not finished and self.hits_total <= seen
                    if quiet:
                        remaining = deadline - loop.time()
                        if remaining <= 0:
                            return FollowResult(pushes=pushes, ended=False)
                        await self._wait_for_change(ends, remaining)
                        continue
                    shared = self._share((*cursors, p.max_bytes), out, err, spans, finished)
                if not self._pin(shared.spans):  # punched out since it was made: look again
                    self._shared = None
                    continue
                try:
                    await push(head + shared.body, shared.spans)
                finally:
                    self._unpin(shared.spans)
                pushes += 1
                pushed_at = loop.time()
                sent += sum(span.size for span in shared.spans)
                cursors, seen = shared.ends, max(seen, shared.hits)
                if shared.finished or sent >= p.budget:
                    return FollowResult(pushes=pushes, ended=shared.finished)
                deadline = loop.time() + wait
        finally:
            self._followers -= 1
            if self._followers <= 1:
                self._shared = None  # one follower reads for itself: no copy held for nobody

    def _share(
        self, key: tuple[int, int, int], out: Slice, err: Slice, spans: tuple[FileSpan, ...], finished: bool
    ) -> _Shared:
        """One push's encoding, kept for the other followers at the same cursors while there are any."""
        sizes = (out.end - out.start, err.end - err.start)
        body = dump_json(self._result(out, err, finished, sizes))[1:]  # after the head's fields: '"state":...}'
        shared = _Shared(key, body + b"}", spans, (out.end, err.end), finished, self.hits_total)
        if self._followers > 1:
            self._shared = shared
        return shared

    def _spans_both(
        self, cursors: tuple[int, int], max_bytes: int
    ) -> tuple[Slice, Slice, tuple[FileSpan, ...], tuple[int, int], bool]:
        """Both streams after the cursors as spans of their logs (nothing read but where a
        character may be cut); the ends before (a held-back character is no news: see
        :meth:`_read_both`); whether they hold the job's last bytes."""
        ends = (self.streams[1].end, self.streams[2].end)
        out, out_span = self.streams[1].span(cursors[0], max_bytes, self.encoding)
        err, err_span = self.streams[2].span(cursors[1], max_bytes, self.encoding)
        finished = self._done.is_set() and out.end == ends[0] and err.end == ends[1]
        spans = tuple(span for span in (out_span, err_span) if span.size)
        return out, err, spans, ends, finished

    def _pin(self, spans: tuple[FileSpan, ...]) -> bool:
        """Pin each span's range in its log until it is sent; False (none pinned) if one was punched out."""
        for i, span in enumerate(spans):
            if not self._logs[span.path].pin(span.offset):
                self._unpin(spans[:i])
                return False
        return True

    def _unpin(self, spans: tuple[FileSpan, ...]) -> None:
        for span in spans:
            self._logs[span.path].unpin(span.offset)

    def _read_both(
        self, stdout_offset: int, stderr_offset: int, max_bytes: int, raw: bool
    ) -> tuple[Slice, Slice, tuple[int, int], bool]:
        """Both streams after the cursors; the ends as they were before the reads; whether
        these slices hold the job's last bytes (it ended, and nothing is left after them)."""
        # The ends as they were before the reads: a read may hold back the end (an incomplete
        # UTF-8 character of a running job), so "the stream is longer than what the read gave"
        # is no news; only growth past these is (else a waiting loop would spin without ever
        # yielding, and freeze the agent, until the job wrote again).
        ends = (self.streams[1].end, self.streams[2].end)
        out = self.streams[1].read(stdout_offset, max_bytes, self.encoding, raw=raw)
        err = self.streams[2].read(stderr_offset, max_bytes, self.encoding, raw=raw)
        finished = self._done.is_set() and out.end == self.streams[1].end and err.end == self.streams[2].end
        return out, err, ends, finished

    def _news(self, out: Slice, err: Slice, seen: int) -> bool:
        return bool(out.data or err.data or out.dropped or err.dropped or self.hits_total > seen)

    async def _wait_for_change(self, ends: tuple[int, int], remaining: float) -> None:
        """Wait until the job writes, ends or has a watch-rule hit, or ``remaining`` seconds pass."""
        changed = self._changed
        woken = self._wait_begin()
        try:
            # Armed only now: bytes that landed between the read and the arming woke nobody (an
            # inotify watch reports writes after it exists, not before). Look again.
            if self.streams[1].end > ends[0] or self.streams[2].end > ends[1]:
                return
            if not woken:  # nothing will tell us of new output: look again now and then
                remaining = min(remaining, UNWATCHED_TICK)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):  # no task per wait, unlike wait_for
                    await changed.wait()
        finally:
            self._wait_end()

    def _wait_begin(self) -> bool:
        """A poller is about to wait for output (a job writing to files watches them now).

        :returns: whether new output will wake it (False: the poll looks every
            :data:`UNWATCHED_TICK` seconds instead).
        """
        return True  # the agent appends the output itself, and notifies as it does

    def _wait_end(self) -> None:
        """The poller stopped waiting."""

    def _answer(self, out: Slice, err: Slice, finished: bool, binary: bool) -> PollResult | WithPayload:
        result = self._result(out, err, finished, (len(out.data), len(err.data)) if binary else None)
        if not binary:
            return result
        assert isinstance(out.data, bytes) and isinstance(err.data, bytes)
        return WithPayload(result, out.data + err.data if err.data else out.data)

    def _result(self, out: Slice, err: Slice, finished: bool, sizes: tuple[int, int] | None) -> PollResult:
        """The answer for these slices; ``sizes``: its payload's (a binary answer's), else text."""
        return PollResult(
            state=self._state if finished else "running",
            exit_code=self.exit_code if finished else None,
            stdout="" if sizes is not None else str(out.data),
            stderr="" if sizes is not None else str(err.data),
            stdout_offset=out.end,
            stderr_offset=err.end,
            stdout_dropped=out.dropped,
            stderr_dropped=err.dropped,
            stdout_truncated=out.truncated,
            stderr_truncated=err.truncated,
            payload_sizes=sizes,
            reason=self.reason if finished else None,
            hits=self.hits_total,
        )
