"""Watch rules: regular expressions run by the agent over a job's output lines.

The output is the job's, so hostile; the patterns are the client's, so maybe catastrophic
(``(a|aa)+$``). Everything is bounded: a line is evaluated on its first :data:`LINE_CAP`
bytes; each search runs under the ``regex`` module's time limit (:data:`SEARCH_TIMEOUT`), and a
rule that overruns it is disabled for the job (``JobInfo.rules_disabled``); a scan reads at
most :data:`READ_CAP` bytes per stream and spends at most :data:`SCAN_BUDGET` seconds; a job
that writes faster than that falls behind by at most :data:`MAX_LAG` bytes, past which the
rules skip ahead (``JobInfo.watch_skipped`` counts the bytes never seen).

As the job ends, :meth:`RuleScanner.finish` reads the rest of its output before the end is
reported (a last line without its newline included), so a hit on the last line is in the final
result; that scan is bounded too (:data:`FINAL_BUDGET`).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ...protocol import WatchHit, WatchRule
from .job import Job

if TYPE_CHECKING:
    import regex

__all__ = [
    "FINAL_BUDGET",
    "LINE_CAP",
    "MAX_LAG",
    "READ_CAP",
    "SCAN_BUDGET",
    "SEARCH_TIMEOUT",
    "RuleScanner",
    "compile_rules",
]

log = logging.getLogger("remote_exec.agent")

LINE_CAP = 4096
"""Bytes of a line the rules see (the rest of a longer line is not evaluated)."""

SEARCH_TIMEOUT = 0.05
"""Seconds one search of one line may take before its rule is disabled."""

READ_CAP = 1 << 20
"""Bytes of each stream one scan reads."""

SCAN_BUDGET = 0.05
"""Seconds of matching one scan of one job may spend (the rest waits for the next scan)."""

FINAL_BUDGET = 0.5
"""Seconds of matching the last scan of an ended job may spend; what it could not read in that
time is counted in ``watch_skipped`` (the end is not held up longer: the event loop serves
every other job meanwhile)."""

MAX_LAG = 8 << 20
"""Bytes the rules may fall behind a stream before they skip ahead to its newest output."""

_STREAMS = {1: "stdout", 2: "stderr"}


def compile_rules(rules: list[WatchRule]) -> list[regex.Pattern[str]]:
    """The rules' patterns, compiled (``re`` syntax).

    :raises ValueError: a pattern does not compile (its error says why).
    """
    # Imported here: ``regex`` costs ~40 ms of every agent's start, and most agents never get a rule.
    import regex

    out = []
    for i, rule in enumerate(rules):
        try:
            out.append(regex.compile(rule.pattern, regex.VERSION0))
        except (regex.error, OverflowError, RecursionError) as exc:
            raise ValueError(f"rule {i} ({rule.pattern!r}): {exc}") from None
    return out


class RuleScanner:
    """Runs one job's rules over what its streams gained since the last :meth:`scan`."""

    def __init__(self, job: Job, rules: list[WatchRule], from_end: bool = False) -> None:
        self._job = job
        self._rules = rules
        self._compiled = compile_rules(rules)
        self._off = set(job.rules_disabled)  # disabled or spent (``once``): not run again
        start = {fd: job.streams[fd].end if from_end else 0 for fd in _STREAMS}
        self._cursor = dict(start)  # where the next read starts
        self._line = {fd: bytearray() for fd in _STREAMS}  # the line in progress (capped)
        self._line_at = dict(start)  # its byte offset in the stream
        self._over = {fd: False for fd in _STREAMS}  # past LINE_CAP: wait for its end
        self._ended = False  # a kill rule fired: nothing more to act on

    def scan(self) -> None:
        """Read each stream's new bytes (bounded), run the rules over each complete line."""
        deadline = time.monotonic() + SCAN_BUDGET
        for fd, name in _STREAMS.items():
            if self._ended or not self._live(name):
                continue
            self._scan_stream(fd, name, deadline)

    def finish(self) -> None:
        """The job ended: run the rules over the rest of its output, up to its end, within
        :data:`FINAL_BUDGET`; a last line without a line end counts as a line. The job is no
        longer running, so a hit is recorded and its action (kill, interrupt) does nothing."""
        deadline = time.monotonic() + FINAL_BUDGET
        for fd, name in _STREAMS.items():
            if self._ended or not self._live(name):
                continue
            end = self._job.streams[fd].end
            while self._cursor[fd] < end and time.monotonic() < deadline:
                before = self._cursor[fd]
                self._scan_stream(fd, name, deadline)
                if self._cursor[fd] == before:
                    break  # nothing readable (a dropped head is counted by the read)
            if self._cursor[fd] < end:
                self._job.watch_skipped += end - self._cursor[fd]
            elif self._line[fd]:  # the output's last line, with no line end
                self._check(self._line[fd], self._line_at[fd], name)
            self._line[fd].clear()

    def _live(self, name: str) -> bool:
        """Whether a rule still running looks at stream ``name``."""
        return any(r.stream in ("both", name) for i, r in enumerate(self._rules) if i not in self._off)

    def _scan_stream(self, fd: int, name: str, deadline: float) -> None:
        stream = self._job.streams[fd]
        end = stream.end
        if end - self._cursor[fd] > MAX_LAG:  # falling behind a flood: skip to its newest output
            skip_to = end - READ_CAP
            self._job.watch_skipped += skip_to - self._cursor[fd]
            self._cursor[fd], self._over[fd] = skip_to, True  # mid-line: wait for the next one
            self._line[fd].clear()
        if end <= self._cursor[fd]:
            return
        try:
            got = stream.read(self._cursor[fd], READ_CAP, "base64", raw=True)
        except ValueError:
            return
        data = got.data
        assert isinstance(data, bytes)
        if got.start > self._cursor[fd]:  # the disk cap dropped bytes before we read them
            self._job.watch_skipped += got.start - self._cursor[fd]
            self._line[fd].clear()
            self._over[fd] = True
        line, pos = self._line[fd], 0
        while pos < len(data):
            nl = _line_end(data, pos)
            piece = data[pos : len(data) if nl < 0 else nl]
            if not self._over[fd]:
                room = LINE_CAP - len(line)
                line += piece[:room]
                self._over[fd] = len(piece) > room
            if nl < 0:
                pos = len(data)
                break
            self._check(line, self._line_at[fd], name)
            line.clear()
            self._over[fd] = False
            pos = nl + 1
            self._line_at[fd] = got.start + pos
            if self._ended or time.monotonic() > deadline:
                break  # the rest waits for the next scan
        self._cursor[fd] = got.start + pos

    def _check(self, line: bytearray, offset: int, name: str) -> None:
        text = line.decode("utf-8", "replace")
        for i, (rule, pattern) in enumerate(zip(self._rules, self._compiled, strict=True)):
            if i in self._off or rule.stream not in ("both", name):
                continue
            try:
                found = pattern.search(text, timeout=SEARCH_TIMEOUT)
            except TimeoutError:
                self._off.add(i)
                self._job.rules_disabled.append(i)
                log.warning(
                    "job %s: watch rule %d disabled: a search took over %g s", self._job.job_id, i, SEARCH_TIMEOUT
                )
                continue
            if found is None:
                continue
            if rule.once:
                self._off.add(i)
            self._hit(i, rule, name, offset, text)

    def _hit(self, i: int, rule: WatchRule, name: str, offset: int, text: str) -> None:
        job = self._job
        hit = WatchHit(
            rule=i,
            pattern=rule.pattern,
            action=rule.action,
            stream="stdout" if name == "stdout" else "stderr",
            offset=offset,
            line=text[:256],
            at=time.time(),
        )
        job.record_hit(hit)
        if not job.running:
            return  # its last scan (finish): the hit is recorded, there is nothing left to act on
        why = f"watch rule {i} matched {rule.pattern[:64]!r} on {name} at byte {offset}"
        if rule.action == "kill":
            job.stop(f"killed: {why}")
            self._ended = True
        elif rule.action == "interrupt":
            job.interrupt(f"interrupted: {why}")


def _line_end(data: bytes, pos: int) -> int:
    """Index of the next ``\\n`` or ``\\r`` (a progress bar's line end) at or after ``pos``; -1: none."""
    nl, cr = data.find(b"\n", pos), data.find(b"\r", pos)
    return nl if cr < 0 else cr if nl < 0 else min(nl, cr)
