"""``remote-exec logs JOB`` and ``remote-exec prune``: a job's log from its file in the sandbox.

``logs`` writes the job's bytes to stdout raw (they are the job's output, as ``cat`` would show
them); what the CLI says itself (bytes dropped by the disk cap, the job's end) goes to stderr,
made terminal-safe where it quotes the agent. It reads with ``read_output``/``tail_output``, so it
moves no cursor and works beside any number of other readers. ``--follow`` then attaches from
where the read ended: the agent pushes what the job writes next, until it has ended.
``--tail N`` counts lines, as ``tail -n`` and ``docker logs -n`` do: the end of the log is read
in growing slices until it holds N line ends (or the whole log), so the first line printed is
a whole one. ``--since`` starts at the bytes written at or after a time (``10m``, ``1h30m``, a
Unix time or an ISO 8601 one), to the second: the agent notes when a job's logs grew each time
it looks (every second while the job runs).

Exit status: 0 done; 2 a sandbox error (e.g. ``JobNotFoundError``).
"""

from __future__ import annotations

import argparse
import datetime
import math
import re
import sys
import time
from typing import Any

from ..client.logs import OutputSlice, Stream
from ..client.sandbox import AsyncSandbox
from ..client.types import Completed, ExecRemoteOptions, StderrChunk, StdoutChunk, StreamTruncated
from ..termsafe import terminal_safe

__all__ = ["add_logs_parsers", "logs", "prune", "since_time"]

CHUNK = 1 << 20
FIRST_TAIL = 8192  # bytes first read for ``--tail``; doubled until they hold the lines asked for
MAX_TAIL = 64 << 20  # what the agent gives in one slice
EXAMPLES = """examples:
  remote-exec logs -n 20 train           the last 20 lines of the job named (or labelled) train
  remote-exec logs -f -n 0 JOB_ID        only what it writes from now on, until it ends
  remote-exec logs --stderr JOB_ID       its stderr, whole
  remote-exec logs --since 10m train     what it wrote in the last ten minutes (1h30m, 90s,
                                         a Unix time or 2026-11-28T14:00:00 work too)
"""
_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)(h|ms|m|s))+")
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def add_logs_parsers(sub: Any) -> None:
    """Add the ``logs`` and ``prune`` subcommands to the CLI's subparsers."""
    p = sub.add_parser(
        "logs",
        help="print a job's output log (any job the agent keeps, running or ended)",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("job_id", metavar="JOB", help="a job id, a --name or a label")
    p.add_argument("--stderr", action="store_true", help="the job's stderr instead of its stdout")
    p.add_argument("--tail", "-n", type=int, metavar="LINES", help="only the last LINES lines")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing until the job ends")
    p.add_argument(
        "--since",
        metavar="WHEN",
        help="only what it wrote at or after WHEN: a duration ago (10m, 1h30m, 90s), a Unix time or an ISO 8601 time",
    )
    pr = sub.add_parser("prune", help="forget ended jobs (their records and logs)")
    pr.add_argument("--older-than", type=float, metavar="SECONDS", help="those that ended over SECONDS ago")
    pr.add_argument("--keep", type=int, metavar="N", help="all but the newest N ended jobs")
    pr.add_argument("job_ids", nargs="*", metavar="JOB_ID", help="forget exactly these ended jobs")


async def logs(sb: AsyncSandbox, args: argparse.Namespace) -> int:
    """Print the log; with ``--follow`` until the job has ended. Cancelling stops printing only."""
    stream: Stream = "stderr" if args.stderr else "stdout"
    out = sys.stdout.buffer
    if args.tail is not None and args.tail < 0:
        raise SystemExit("remote-exec logs: --tail takes a number of lines >= 0")
    if args.tail is not None and args.since is not None:
        raise SystemExit("remote-exec logs: --tail and --since exclude each other")
    since = None if args.since is None else since_time(args.since, time.time())
    if args.tail is not None:
        data, offset = await _last_lines(sb, args.job_id, stream, args.tail)
        out.write(data)
        got = None
    else:
        got = await sb.read_output(args.job_id, stream, max_bytes=CHUNK, since=since)
        _print(got)
        while got.end < got.size:  # the rest of what is written now
            before = got.end
            got = await sb.read_output(args.job_id, stream, offset=got.end, max_bytes=CHUNK)
            _print(got)
            if got.end == before:  # no progress (a truncation, or an agent that lies): stop here
                break
        offset = got.end
    out.flush()
    if not args.follow or (got is not None and got.complete):
        if args.follow and got is not None:
            print(f"remote-exec: job {terminal_safe(args.job_id)} {got.state}, exit {got.exit_code}", file=sys.stderr)
        return 0
    return await _follow_from(sb, args.job_id, stream, offset)


def _print(got: OutputSlice) -> None:
    if got.dropped:
        print(f"remote-exec: {got.dropped} bytes before offset {got.offset} were dropped (disk cap)", file=sys.stderr)
    sys.stdout.buffer.write(got.data)


async def _follow_from(sb: AsyncSandbox, job_id: str, stream: Stream, offset: int) -> int:
    """Attach from ``offset`` of ``stream`` (the other stream from its end now: not printed) and
    print what the agent pushes until the job's end."""
    other = (await sb.tail_output(job_id, 1, "stdout" if stream == "stderr" else "stderr")).size
    offsets = (offset, other) if stream == "stdout" else (other, offset)
    proc = await sb.attach(job_id, ExecRemoteOptions(encoding="base64"), offsets=offsets)
    wanted = StdoutChunk if stream == "stdout" else StderrChunk
    async for ev in proc:
        if isinstance(ev, wanted):
            assert isinstance(ev.data, bytes)  # encoding="base64": bytes
            sys.stdout.buffer.write(ev.data)
            sys.stdout.buffer.flush()
        elif isinstance(ev, StreamTruncated) and ev.stream == stream and ev.lost:
            print(f"remote-exec: the job truncated its {stream}: {ev.lost} bytes were never read", file=sys.stderr)
        elif isinstance(ev, Completed):
            end = await sb.tail_output(job_id, 1, stream)  # its state, as the reads say it
            reason = f" ({terminal_safe(ev.reason)})" if ev.reason else ""
            print(f"remote-exec: job {terminal_safe(job_id)} {end.state}, exit {ev.exit_code}{reason}", file=sys.stderr)
    return 0


def since_time(text: str, now: float) -> float:
    """``--since``'s wall time: ``now`` less a duration (``10m``, ``1h30m``, ``1.5s``), a Unix
    time, or an ISO 8601 time (local time unless it names its zone).

    :raises SystemExit: none of these (a one-line usage error).
    """
    text = text.strip()
    when: float | None = None
    if _DURATION.fullmatch(text):
        ago = sum(float(n) * _UNITS[unit] for n, unit in re.findall(r"(\d+(?:\.\d+)?)(h|ms|m|s)", text))
        when = now - ago
    elif re.fullmatch(r"\d+(?:\.\d+)?", text):
        when = float(text)
    else:
        try:
            when = datetime.datetime.fromisoformat(text).timestamp()
        except (ValueError, OverflowError, OSError):
            when = None
    if when is None or not math.isfinite(when):
        raise SystemExit(
            f"remote-exec logs: --since takes a duration (10m, 1h30m), a Unix time or an ISO 8601 time, not {text!r}"
        )
    return max(0.0, when)


async def _last_lines(sb: AsyncSandbox, job_id: str, stream: Stream, n: int) -> tuple[bytes, int]:
    """The last ``n`` lines of the log (a last line without its newline counts) and where they end."""
    size = FIRST_TAIL
    while True:
        got = await sb.tail_output(job_id, size, stream)
        # The whole log is in hand when the slice starts at its start (or at what the disk cap kept).
        whole = got.offset == 0 or got.dropped > 0 or len(got.data) < size or size >= MAX_TAIL
        body = got.data[:-1] if got.data.endswith(b"\n") else got.data  # the last line's end opens none
        if n == 0:
            return b"", got.end
        if body.count(b"\n") >= n:  # a line end before the first of the n lines: cut after it
            start = len(body)
            for _ in range(n):
                start = body.rfind(b"\n", 0, start)
            return got.data[start + 1 :], got.end
        if whole:
            return got.data, got.end
        size *= 4


async def prune(sb: AsyncSandbox, args: argparse.Namespace) -> int:
    """Forget the named jobs, or those the options select; print each id forgotten."""
    if args.job_ids:
        for job_id in args.job_ids:
            await sb.forget(job_id)
            print(terminal_safe(job_id))
        return 0
    if args.older_than is None and args.keep is None:
        raise SystemExit("remote-exec prune: name jobs, or give --older-than and/or --keep")
    result = await sb.prune(older_than=args.older_than, keep=args.keep)
    for job_id in result.job_ids:
        print(terminal_safe(job_id))
    if result.forgotten > len(result.job_ids):
        print(f"... and {result.forgotten - len(result.job_ids)} more", file=sys.stderr)
    return 0
