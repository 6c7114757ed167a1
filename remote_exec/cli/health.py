"""Health on the command line: the channel's state and a job's long silences, told on stderr.

``remote-exec attach`` (and ``run``) follow a job; beside its output this prints a line when the
sandbox's :class:`~remote_exec.client.link.Link` changes ("agent not answering", "connected
again", "sandbox gone") and when the job has written nothing for ``--quiet-after`` seconds
("no output for 5 min; the job is running"), so a frozen sandbox and a quiet job never look
alike, and neither looks like a hang.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import TextIO

import anyio

from ..client.link import Link, LinkStatus
from ..termsafe import terminal_safe

__all__ = ["LINK_WORDS", "QUIET_AFTER", "format_quiet", "link_line", "report_health"]

CHANGES_KEPT = 16  # link changes queued between two prints (a flapping link: its latest)
QUIET_AFTER = 300.0
"""Default seconds without output before ``attach``/``run`` say the job is quiet (0: never)."""

LINK_WORDS = {
    "connecting": "connecting",
    "connected": "connected",
    "reconnecting": "reconnecting",
    "lost": "agent not answering (frozen, paused or cut off); still trying",
    "gone": "sandbox gone",
    "closed": "closed",
}


def link_line(url: str, status: LinkStatus) -> str:
    """``remote-exec: local://...: agent not answering ...: <reason>`` (the reason is the agent's
    or the transport's words: made terminal-safe)."""
    words = LINK_WORDS.get(status.state, status.state)
    reason = f": {terminal_safe(status.reason)}" if status.reason and status.state != "connected" else ""
    return f"remote-exec: {terminal_safe(url)}: {words}{reason}"


def format_quiet(seconds: float) -> str:
    """``no output for 5 min 03 s``."""
    s = int(seconds)
    if s < 60:
        return f"no output for {s} s"
    if s < 3600:
        return f"no output for {s // 60} min {s % 60:02d} s"
    return f"no output for {s // 3600} h {s % 3600 // 60:02d} min"


async def report_health(
    url: str,
    link: Link,
    last_output: Callable[[], float],
    quiet_after: float = QUIET_AFTER,
    out: TextIO | None = None,
) -> None:
    """Print link changes, and each ``quiet_after`` seconds of silence, until cancelled.

    ``last_output()``: when the job last wrote (``time.monotonic()``). Cancelling it (the
    follower does, when the job ends) stops the reports; nothing else.
    """
    stream = out or sys.stderr
    # Every change is told, in order: a listener queues them as they happen. (Waiting for "the
    # next change" between prints would miss one made while a silence line was being printed:
    # the agent's freeze went untold for good.) Bounded: a flapping link tells its latest ones.
    changes: deque[LinkStatus] = deque(maxlen=CHANGES_KEPT)
    arrived = asyncio.Event()

    def queue(status: LinkStatus) -> None:
        changes.append(status)
        arrived.set()

    unsubscribe = link.subscribe(queue)
    try:
        told_quiet = 0  # silences of quiet_after already told, since the last output
        told_at = last_output()
        while True:
            while changes:
                print(link_line(url, changes.popleft()), file=stream, flush=True)
            arrived.clear()
            wait = float("inf")
            if quiet_after > 0:
                wait = max(told_at + quiet_after * (told_quiet + 1) - time.monotonic(), 0.0)
            with anyio.move_on_after(wait):  # a timer for the silence; a link change ends it early
                await arrived.wait()
                continue
            if last_output() != told_at:  # output came meanwhile: count the silence from it
                told_at, told_quiet = last_output(), 0
                continue
            told_quiet += 1
            quiet = time.monotonic() - told_at
            state = "the job is running" if link.state == "connected" else LINK_WORDS[link.state]
            print(f"remote-exec: {format_quiet(quiet)}; {state}", file=stream, flush=True)
    finally:
        unsubscribe()
