"""``remote-exec top``: the sandbox's CPU, memory and disk, and each running job's tree.

Every string shown comes from the agent, so each goes through :func:`terminal_safe`. Stats are
read only while ``top`` runs: the agent samples nothing when nobody asks.

Health: the first line is the channel's state (:class:`~remote_exec.client.link.Link`); a frozen
agent is a line saying so, then ``top`` goes on asking (it does not exit). ``QUIET`` is how long
a job's output has not grown, as seen across refreshes (``>`` when it was already quiet at
``top``'s first look, so the true silence is longer).

On a terminal (stdin and stdout) it redraws one screen in place, each line cut to the width,
and ``q`` quits (the terminal is in cbreak mode meanwhile: keys are read one by one, not
echoed; restored on every way out). Otherwise it prints one plain table after another.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import termios
import tty
from collections.abc import Iterator
from typing import Any

import anyio

from ..client.activity import OutputActivity, Quiet
from ..client.sandbox import AsyncSandbox
from ..client.titles import what_it_runs
from ..errors import AgentUnresponsiveError, JobNotFoundError
from ..protocol import JobInfo, JobStats, SandboxStats
from ..termsafe import terminal_safe
from .health import LINK_WORDS, link_line
from .tty import local_size

__all__ = ["add_top_parser", "human", "quiet_text", "render", "top"]

COMMAND_WIDTH = 60
HOME_CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear the screen: the next screen replaces this one


def add_top_parser(sub: Any) -> None:
    """The ``top`` subcommand's options on ``sub`` (argparse's subparsers)."""
    p = sub.add_parser(
        "top",
        help="CPU, memory and disk of the sandbox and its running jobs (q quits)",
        epilog="examples:\n  remote-exec top                  redraws every 2 s on a terminal; q quits\n"
        "  remote-exec top -n 1 | cat       one plain table, for a script\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--interval", "-d", type=float, default=2.0, help="seconds between refreshes")
    p.add_argument("--count", "-n", type=int, default=0, help="refreshes before exiting (0: until Ctrl-C)")


def human(n: float) -> str:
    """Bytes as ``812K``, ``1.5G``..."""
    for unit in ("", "K", "M", "G", "T"):
        if abs(n) < 1024 or unit == "T":
            return f"{n:.0f}{unit}" if unit in ("", "K") else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}T"


async def _job_rows(sb: AsyncSandbox, jobs: list[JobInfo]) -> list[tuple[JobInfo, JobStats]]:
    rows: dict[str, tuple[JobInfo, JobStats]] = {}

    async def one(job: JobInfo) -> None:
        with contextlib.suppress(JobNotFoundError):  # released between the listing and the reading
            rows[job.job_id] = (job, await sb.job_stats(job.job_id))

    async with anyio.create_task_group() as tg:
        for job in jobs:
            tg.start_soon(one, job)
    return [rows[j.job_id] for j in jobs if j.job_id in rows]


def quiet_text(quiet: Quiet | None) -> str:
    """``42s``, ``3m05``, ``1h02``; ``>`` first when the silence is at least that long."""
    if quiet is None:
        return ""
    s = int(quiet.seconds())
    shown = f"{s}s" if s < 60 else f"{s // 60}m{s % 60:02d}" if s < 3600 else f"{s // 3600}h{s % 3600 // 60:02d}"
    return shown if quiet.exact else f">{shown}"


def render(
    s: SandboxStats, rows: list[tuple[JobInfo, JobStats]], quiet: OutputActivity | None = None, link: str = ""
) -> str:
    """One screen: the sandbox's line (ending with the channel's state ``link``), then a line per
    running job (busiest first)."""
    limit = f"/{human(s.memory_limit)}" if s.memory_limit else ""
    cut = "+" if s.disk_truncated else ""
    lines = [
        f"sandbox ({terminal_safe(s.source)}): cpu {s.cpu_percent:5.1f}% of {s.cpu_count} cores  "
        f"mem {human(s.memory_used)}{limit}  workspace {human(s.workspace_bytes)}{cut}  "
        f"agent state {human(s.state_dir_bytes)}  free {human(s.disk_free)}  jobs {s.jobs_running}"
        + (f"  link {link}" if link else ""),
        f"{'JOB ID':<14} {'PID':>7} {'CPU%':>6} {'RSS':>7} {'THR':>4} {'PROCS':>5} {'READ':>7} {'WRITE':>7} "
        f"{'QUIET':>6} {'NAME':<12}  COMMAND",
    ]
    for job, st in sorted(rows, key=lambda r: -r[1].cpu_percent):
        shown = terminal_safe(what_it_runs(job.command, job.label))[:COMMAND_WIDTH]
        lines.append(
            f"{terminal_safe(job.job_id):<14} {job.pid:>7} {st.cpu_percent:>6.1f} {human(st.rss):>7} "
            f"{st.threads:>4} {st.processes:>5} {human(st.read_bytes):>7} {human(st.write_bytes):>7} "
            f"{quiet_text(quiet.get(job.job_id)) if quiet else '':>6} "
            f"{terminal_safe((job.tags or {}).get('name', '')) or '-':<12}  {shown}"
        )
    return "\n".join(lines)


@contextlib.contextmanager
def _keys(quit: asyncio.Event) -> Iterator[None]:
    """For the block, stdin's terminal in cbreak mode and ``q`` (or its end) sets ``quit``."""
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    loop = asyncio.get_running_loop()

    def on_key() -> None:
        try:
            data = os.read(fd, 64)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data or b"q" in data.lower():
            loop.remove_reader(fd)
            quit.set()

    try:
        tty.setcbreak(fd, termios.TCSANOW)
        loop.add_reader(fd, on_key)
        yield
    finally:
        loop.remove_reader(fd)
        termios.tcsetattr(fd, termios.TCSAFLUSH, saved)


async def top(sb: AsyncSandbox, args: argparse.Namespace) -> int:
    """Print a screen every ``--interval`` seconds, ``--count`` times (0: until interrupted or,
    on a terminal, ``q``). Cancelling it restores the terminal."""
    quit = asyncio.Event()
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        return await _screens(sb, args, quit, redraw=False)
    with _keys(quit):
        return await _screens(sb, args, quit, redraw=True)


async def _screens(sb: AsyncSandbox, args: argparse.Namespace, quit: asyncio.Event, *, redraw: bool) -> int:
    n = 0
    quiet = OutputActivity()
    while True:
        try:
            running = [j for j in await sb.jobs() if j.state == "running"]
            stats = await sb.stats()
            rows = await _job_rows(sb, running)
            quiet.note(running)
            screen = render(stats, rows, quiet, LINK_WORDS[sb.link.state])
        except AgentUnresponsiveError:
            screen = link_line(sb.url, sb.link.status)  # frozen: say so, and ask again next round
        if redraw:
            width = (local_size() or (80, 24))[0]  # the terminal's own size, not $COLUMNS
            cut = [line if len(line) <= width else line[: width - 1] + "\u2026" for line in screen.splitlines()]
            print(HOME_CLEAR + "\n".join(cut), flush=True)
        else:
            print(("\n" if n else "") + screen, flush=True)
        n += 1
        if args.count and n >= args.count:
            return 0
        with anyio.move_on_after(args.interval):  # the refresh period, cut short by `q`
            await quit.wait()
        if quit.is_set():
            return 0
