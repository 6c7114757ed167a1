"""``remote-exec logs JOB`` and ``remote-exec prune``: a job's log from its file in the sandbox.

``logs`` writes the job's bytes to stdout raw (they are the job's output, as ``cat`` would show
them); what the CLI says itself (bytes dropped by the disk cap, the job's end) goes to stderr,
made terminal-safe where it quotes the agent. It reads with ``read_output``/``tail_output``, so it
moves no cursor and works beside any number of other readers. ``--follow`` reads again every
:data:`FOLLOW_INTERVAL` seconds until the job has ended and its log is read to the end.
``--tail N`` counts lines, as ``tail -n`` and ``docker logs -n`` do: the end of the log is read
in growing slices until it holds N line ends (or the whole log), so the first line printed is
a whole one.

Exit status: 0 done; 2 a sandbox error (e.g. ``JobNotFoundError``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import anyio

from ..client.logs import Stream
from ..client.sandbox import AsyncSandbox
from ..termsafe import terminal_safe

__all__ = ["FOLLOW_INTERVAL", "add_logs_parsers", "logs", "prune"]

FOLLOW_INTERVAL = 0.25
CHUNK = 1 << 20
FIRST_TAIL = 8192  # bytes first read for ``--tail``; doubled until they hold the lines asked for
MAX_TAIL = 64 << 20  # what the agent gives in one slice
EXAMPLES = """examples:
  remote-exec logs -n 20 train           the last 20 lines of the job named (or labelled) train
  remote-exec logs -f -n 0 JOB_ID        only what it writes from now on, until it ends
  remote-exec logs --stderr JOB_ID       its stderr, whole
"""


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
    pr = sub.add_parser("prune", help="forget ended jobs (their records and logs)")
    pr.add_argument("--older-than", type=float, metavar="SECONDS", help="those that ended over SECONDS ago")
    pr.add_argument("--keep", type=int, metavar="N", help="all but the newest N ended jobs")
    pr.add_argument("job_ids", nargs="*", metavar="JOB_ID", help="forget exactly these ended jobs")


async def logs(sb: AsyncSandbox, args: argparse.Namespace) -> int:
    """Print the log; with ``--follow`` until the job has ended. Cancelling stops printing only."""
    stream: Stream = "stderr" if args.stderr else "stdout"
    out = sys.stdout.buffer
    offset = 0
    if args.tail is not None:
        if args.tail < 0:
            raise SystemExit("remote-exec logs: --tail takes a number of lines >= 0")
        data, offset = await _last_lines(sb, args.job_id, stream, args.tail)
        out.write(data)
    while True:
        got = await sb.read_output(args.job_id, stream, offset=offset, max_bytes=CHUNK)
        if got.dropped:
            print(
                f"remote-exec: {got.dropped} bytes before offset {got.offset} were dropped (disk cap)", file=sys.stderr
            )
        out.write(got.data)
        out.flush()
        offset = got.end
        if got.end < got.size:
            continue
        if not args.follow or got.complete:
            if args.follow:
                print(
                    f"remote-exec: job {terminal_safe(args.job_id)} {got.state}, exit {got.exit_code}", file=sys.stderr
                )
            return 0
        await anyio.sleep(FOLLOW_INTERVAL)


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
