"""``remote-exec ps``: the job table, as ``docker ps`` shows containers.

Running jobs by default, newest first; ``-a`` all the agent keeps; ``--filter`` by state, name
or label; ``-n N`` the newest N. One line per job: its name, then the first meaningful line of
its script (``--no-trunc``: its whole command, a newline shown as :data:`NEWLINE`); on a
terminal each line is cut to its width (``--no-trunc``: whole lines).
``--format json`` prints the agent's records for scripts. Every string shown comes from the
agent, so each goes through :func:`terminal_safe` (no escape sequence reaches the terminal).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from typing import Any

from ..client.activity import OutputActivity
from ..client.titles import NEWLINE, one_line, what_it_runs
from ..protocol import JobInfo
from ..termsafe import terminal_safe
from .jobref import job_name
from .top import quiet_text
from .tty import local_size

__all__ = ["NEWLINE", "add_ps_parser", "print_ps", "ps_lines", "select_jobs"]

FILTER_KEYS = ("state", "name", "label")
EXAMPLES = """examples:
  remote-exec ps                          running jobs, newest first
  remote-exec ps -a -n 5                  the newest 5, ended ones too
  remote-exec ps --filter name=train      by --name (or --filter label=..., --filter state=killed)
  remote-exec ps -a --format json         the agent's records, for scripts
"""


def add_ps_parser(sub: Any) -> None:
    """The ``ps`` subcommand's options on ``sub`` (argparse's subparsers)."""
    p = sub.add_parser(
        "ps",
        help="list jobs (running ones, newest first)",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--all", "-a", action="store_true", help="ended jobs too (all the agent keeps)")
    p.add_argument(
        "--filter",
        "-f",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="state=running|completed|killed|timed_out|lost, name=NAME or label=LABEL (repeatable: all must match)",
    )
    p.add_argument("--last", "-n", type=int, metavar="N", help="only the newest N jobs (implies -a)")
    p.add_argument(
        "--no-trunc", action="store_true", help="whole commands on whole lines, even wider than the terminal"
    )
    p.add_argument("--format", choices=("table", "json"), default="table", help="json: one array of job records")


def _filters(pairs: list[str]) -> list[tuple[str, str]]:
    out = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in FILTER_KEYS:
            raise SystemExit(f"remote-exec ps: --filter takes {'=, '.join(FILTER_KEYS)}=, got {pair!r}")
        out.append((key, value))
    return out


def select_jobs(jobs: list[JobInfo], args: argparse.Namespace) -> list[JobInfo]:
    """The jobs ``args`` asks for, newest first (the agent lists them oldest first)."""
    filters = _filters(args.filter)
    # A state filter asks for that state, ended or not, as `docker ps --filter status=exited` does.
    everything = args.all or args.last is not None or any(key == "state" for key, _ in filters)
    chosen = [j for j in reversed(jobs) if everything or j.state == "running"]
    chosen.sort(key=lambda j: -j.started_at)  # stable: the agent's order breaks ties
    for key, value in filters:
        chosen = [j for j in chosen if _field(j, key) == value]
    if args.last is not None:
        if args.last < 0:
            raise SystemExit("remote-exec ps: -n takes a number >= 0")
        chosen = chosen[: args.last]
    return chosen


def _field(j: JobInfo, key: str) -> str:
    return j.state if key == "state" else job_name(j) if key == "name" else j.label or ""


def _started(j: JobInfo) -> str:
    try:
        return dt.datetime.fromtimestamp(j.started_at).strftime("%Y-%m-%d %H:%M:%S")
    except (ValueError, OverflowError, OSError):  # a time no calendar holds (the agent's word)
        return "?"


def ps_lines(jobs: list[JobInfo], whole: bool = False) -> list[str]:
    """The table: a header and one line per job (uncut): its name, then its script's first
    meaningful line (:mod:`remote_exec.client.titles`); ``whole``: its whole command instead."""
    quiet = OutputActivity()
    quiet.note(jobs)
    lines = [f"{'JOB ID':<17} {'PID':>7} {'STATE':<10} {'EXIT':>5} {'STARTED':<19} {'QUIET':>6} {'NAME':<12}  COMMAND"]
    for j in jobs:
        exit_code = "" if j.exit_code is None else str(j.exit_code)
        silent = quiet_text(quiet.get(j.job_id)) if j.state == "running" else ""  # an ended job is not quiet
        shown = terminal_safe(_whole(j) if whole else what_it_runs(j.command, j.label))
        lines.append(
            f"{terminal_safe(j.job_id):<17} {j.pid:>7} {terminal_safe(j.state):<10} {exit_code:>5} {_started(j):<19} "
            f"{silent:>6} {terminal_safe(job_name(j)) or '-':<12}  {shown}"
        )
    return lines


def _whole(j: JobInfo) -> str:
    cmd = j.command if isinstance(j.command, str) else " ".join(j.command)
    label = f"[{j.label}] " if j.label else ""
    return one_line(label + cmd)


def print_ps(jobs: list[JobInfo], args: argparse.Namespace) -> None:
    """Print what ``args`` asks for of ``jobs`` (the agent's listing, oldest first)."""
    chosen = select_jobs(jobs, args)
    if args.format == "json":
        json.dump([j.model_dump(mode="json") for j in chosen], sys.stdout, indent=1)
        print()
        return
    lines = ps_lines(chosen, whole=args.no_trunc)
    if sys.stdout.isatty() and not args.no_trunc:
        width = (local_size() or (80, 24))[0]  # the terminal's own size, not $COLUMNS
        lines = [line if len(line) <= width else line[: width - 1] + "\u2026" for line in lines]
    print("\n".join(lines))
