"""What a streaming widget keeps in Python: the output, its tails, and the pace of updates.

Pure bookkeeping with no widget or thread in it, so the rules (what a replay holds, how many
lines are hidden, when the next update may go out) are tested on their own.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Mapping

__all__ = ["DEFAULT_TAIL_LINES", "FULL_LIMIT", "RateLimit", "Transcript", "strip_ansi"]

DEFAULT_TAIL_LINES = 5000
"""Lines per pane a view keeps (older ones are counted as "N lines hidden")."""

FULL_LIMIT = 32 * 1024 * 1024
"""Characters a transcript keeps for Copy/Download; older output is dropped (and counted)."""

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def strip_ansi(text: str) -> str:
    """``text`` without ANSI escape sequences (colours, cursor moves, window titles)."""
    return _ANSI.sub("", text)


class Transcript:
    """Ordered output segments ``(stream, text)`` grouped into panes, plus what is not sent yet.

    :param panes: maps each stream name to the pane that shows it (a job view has one pane per
        stream; a shell view shows every stream in one pane).
    :param limit: characters kept in all; the oldest segments go first (see :attr:`dropped`).
    """

    def __init__(self, panes: Mapping[str, str], limit: int = FULL_LIMIT) -> None:
        self.panes = dict(panes)
        self.limit = limit
        self._segments: deque[tuple[str, str]] = deque()
        self._size = 0
        self._pending: list[list[str]] = []
        self.chars: dict[str, int] = dict.fromkeys(self.panes, 0)
        """Characters received per stream (also those dropped since)."""
        self.newlines: dict[str, int] = dict.fromkeys(set(self.panes.values()), 0)
        """Line ends received per pane."""
        self.dropped: dict[str, int] = dict.fromkeys(self.panes, 0)
        """Characters per stream no longer kept (beyond ``limit``)."""
        self._cut_in_line: dict[str, bool] = dict.fromkeys(set(self.panes.values()), False)
        """Per pane: the newest text dropped did not end a line (the first kept one lacks its start)."""

    def append(self, stream: str, text: str) -> None:
        """Add ``text`` to ``stream`` (both kept and pending for the next delta)."""
        if not text:
            return
        pane = self.panes[stream]  # KeyError for an unknown stream: a bug in the caller
        self.chars[stream] += len(text)
        self.newlines[pane] += text.count("\n")
        if self._segments and self._segments[-1][0] == stream:
            self._segments[-1] = (stream, self._segments[-1][1] + text)
        else:
            self._segments.append((stream, text))
        if self._pending and self._pending[-1][0] == stream:
            self._pending[-1][1] += text
        else:
            self._pending.append([stream, text])
        self._size += len(text)
        while self._size > self.limit and len(self._segments) > 1:
            old_stream, old = self._segments.popleft()
            self._size -= len(old)
            self.dropped[old_stream] += len(old)
            self._cut_in_line[self.panes[old_stream]] = not old.endswith("\n")

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    def take_pending(self) -> list[list[str]]:
        """The ``[stream, text]`` pieces added since the last call (in order, neighbours merged)."""
        pending, self._pending = self._pending, []
        return pending

    def text(self, stream: str | None = None) -> str:
        """Everything kept of ``stream`` (or of all streams, interleaved as it arrived)."""
        segments = list(self._segments)  # one C-level copy: safe while the loop thread appends
        return "".join(t for s, t in segments if stream is None or s == stream)

    def tail(self, pane: str, max_lines: int, max_chars: int | None = None) -> tuple[list[list[str]], int]:
        """The last ``max_lines`` lines of ``pane`` as ``[stream, text]`` pieces, and how many
        earlier lines there are (the "N lines hidden" a view shows above them).

        ``max_chars`` also bounds the size: whole lines are left out from the top until the
        pieces hold at most that many characters (or just the unfinished last line, if it alone
        is longer: then its end)."""
        pieces: list[list[str]] = []
        seen = 0  # line ends inside the collected pieces
        size = 0  # characters in the collected pieces
        for stream, text in reversed(list(self._segments)):
            if self.panes[stream] != pane:
                continue
            n = text.count("\n")
            last = False
            # A view holds max_lines lines, the last one being the (maybe empty) unfinished one:
            # so it shows what follows the max_lines-th line end from the end.
            if seen + n >= max_lines:
                cut = len(text)
                for _ in range(max_lines - seen):
                    cut = text.rfind("\n", 0, cut)
                text, last = text[cut + 1 :], True
            if max_chars is not None and size + len(text) > max_chars:
                room = max_chars - size  # keep the lines that fit whole: from a line end on
                cut = text.find("\n", len(text) - room - 1) if room > 0 else -1
                fits = 0 <= cut < len(text) - 1
                # else nothing fits whole: the end of one over-long line, or nothing more
                text = text[cut + 1 :] if fits else ("" if pieces else text[-max_chars:])
                last = True
            if text:
                pieces.append([stream, text])
            if last:
                break
            seen += n
            size += len(text)
        pieces.reverse()
        shown = sum(t.count("\n") for _, t in pieces)
        return pieces, max(self.newlines[pane] - shown, 0)

    def lines_before(self, pane: str, before: int, count: int, max_chars: int) -> tuple[list[list[str]], int]:
        """Lines ``before - count`` to ``before - 1`` of ``pane`` (numbered from the job's first
        line, as the "N lines hidden" a view shows) as ``[stream, text]`` pieces, each line with
        its end, and the number of the first line given: later than asked when older lines are
        no longer kept, or when ``max_chars`` leaves out the oldest of them (whole lines only).
        What a view's "earlier lines" shows above the lines it holds."""
        segments = [(s, t) for s, t in list(self._segments) if self.panes[s] == pane]
        index = self.newlines[pane] - sum(t.count("\n") for _, t in segments)  # the first kept text's line
        # The first kept text may have lost its line's start to the limit: that line is not given.
        start = max(before - count, index + self._cut_in_line[pane])
        lines: deque[list[list[str]]] = deque()  # lines start..before-1, in order: each its pieces
        for stream, text in segments:
            if index >= before:
                break
            parts = text.split("\n")
            for i, part in enumerate(parts):
                ends = i < len(parts) - 1
                bit = part + "\n" if ends else part
                if bit and start <= index < before:
                    if index - start == len(lines):  # (the line's first piece)
                        lines.append([])
                    lines[-1].append([stream, bit])
                if ends:
                    index += 1
                    if index >= before:
                        break
        size = sum(len(t) for one in lines for _, t in one)
        while lines and size > max_chars:  # the oldest go first: the lines nearest the view stay
            size -= sum(len(t) for _, t in lines.popleft())
        return [piece for one in lines for piece in one], before - len(lines)


class RateLimit:
    """At most ``max_messages`` in any ``per`` seconds, and rounds at least ``min_gap`` apart.

    A round is a group of messages sent together (an output delta and a state update); the
    sliding window counts each message, so the promise holds for what the front end receives.
    ``slack`` widens the window a little, so the time between deciding and actually sending a
    round (a thread switch, a busy loop) cannot push an eleventh message into someone's second.
    """

    def __init__(self, max_messages: int = 10, per: float = 1.0, min_gap: float = 0.1, slack: float = 0.05) -> None:
        self.max_messages = max_messages
        self.per = per + slack
        self.min_gap = min_gap
        self._sent: deque[float] = deque()
        self._last_round = float("-inf")

    def delay(self, messages: int, now: float | None = None) -> float:
        """Seconds to wait before a round of ``messages`` may go out."""
        now = time.monotonic() if now is None else now
        while self._sent and self._sent[0] <= now - self.per:
            self._sent.popleft()
        wait = self._last_round + self.min_gap - now
        excess = len(self._sent) + messages - self.max_messages
        if excess > 0:
            wait = max(wait, self._sent[min(excess, len(self._sent)) - 1] + self.per - now)
        return max(wait, 0.0)

    def record(self, messages: int, now: float | None = None) -> None:
        """Note a round of ``messages`` that went out."""
        now = time.monotonic() if now is None else now
        self._last_round = now
        self._sent.extend([now] * messages)
