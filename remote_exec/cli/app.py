"""``remote-exec``: run, list, follow and kill jobs in a sandbox from a terminal.

``remote-exec run [--sandbox URL] -- CMD...``  stream stdout/stderr live, exit with the job's code;
                                                Ctrl-C kills the remote job
``remote-exec run -t -- CMD...``                the job in a terminal: this one, raw (see tty.py)
``remote-exec ps``                              list running and retained jobs (QUIET: how long a
                                                running job has written nothing)
``remote-exec attach [-t] JOB_ID``              replay a job's retained output and follow it (-t: and
                                                type into a tty job's terminal); rides out a frozen
                                                agent (see health.py)
``remote-exec kill JOB_ID``                     kill a job's whole process group
``remote-exec shell [--session ID]``            a prompt on a shell session (see shell.py)
``remote-exec cp SRC DST``                      copy files or trees; ``sandbox:PATH`` is the sandbox's
                                                side (see cp.py)
``remote-exec logs JOB_ID [-f] [-n BYTES]``      a job's log from disk, raw (see logs.py)
``remote-exec prune [--older-than S] [--keep N] [JOB_ID...]``  forget ended jobs and their logs
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import os
import signal
import sys
import time
from typing import TextIO

import anyio

from ..client.activity import OutputActivity
from ..client.policyopts import POLICY_OPTIONS, policy_from_args
from ..client.process import ExecRemoteProcess
from ..client.sandbox import AsyncSandbox
from ..client.types import Completed, ExecRemoteOptions, StderrChunk, StdoutChunk
from ..errors import AgentUnresponsiveError, ExecTimeoutError, RemoteExecError
from ..protocol import JobInfo
from ..sandboxes import open_sandbox
from ..termsafe import terminal_safe
from .cp import add_cp_parser, copy
from .health import QUIET_AFTER, report_health
from .logs import add_logs_parsers, logs, prune
from .shell import shell_repl
from .top import add_top_parser, quiet_text, top
from .tty import follow_tty, local_size

__all__ = ["main"]

COMMAND_WIDTH = 80  # columns of `ps`'s label and command


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="remote-exec", description="Run long-running commands in sandboxes.")
    p.add_argument(
        "--sandbox",
        "-s",
        default=os.environ.get("REMOTE_EXEC_SANDBOX", "local://"),
        help="sandbox URL (default: $REMOTE_EXEC_SANDBOX or local://)",
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run a command, streaming its output")
    run.add_argument("--cwd", help="working directory in the sandbox")
    run.add_argument("--env", "-e", action="append", default=[], metavar="K=V", help="set a variable (repeatable)")
    run.add_argument("--timeout", type=float, help="kill the job after this many seconds")
    run.add_argument("--kill-grace", type=float, default=5.0, help="seconds from SIGTERM to SIGKILL")
    run.add_argument("--label", help="a name for `ps`")
    run.add_argument("--detach", "-d", action="store_true", help="print the job id and leave it running")
    run.add_argument(
        "--tty", "-t", action="store_true", help="run in a terminal: this one, raw, its size; Ctrl-] leaves"
    )
    quiet_help = f"say on stderr when the job wrote nothing for this many seconds (default {QUIET_AFTER:g}; 0: never)"
    run.add_argument("--quiet-after", type=float, default=QUIET_AFTER, help=quiet_help)
    policy = run.add_argument_group("policy", "what the agent does to the job by itself, client or no client")
    for flags, kwargs in POLICY_OPTIONS:
        policy.add_argument(*flags, **kwargs)
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    sub.add_parser("ps", help="list jobs")
    att = sub.add_parser("attach", help="follow a job's output")
    att.add_argument("--tty", "-t", action="store_true", help="be a tty job's terminal too (keys, size); Ctrl-] leaves")
    att.add_argument("job_id")
    att.add_argument("--quiet-after", type=float, default=QUIET_AFTER, help=quiet_help)
    kill = sub.add_parser("kill", help="kill a job")
    kill.add_argument("job_id")
    kill.add_argument("--grace", type=float, help="seconds from SIGTERM to SIGKILL")
    shell = sub.add_parser("shell", help="a prompt on a shell session (new, or --session ID)")
    shell.add_argument("--session", help="join this session (default: open a new one and print its id)")
    shell.add_argument("--keep", action="store_true", help="leave the new session open on exit")
    add_cp_parser(sub)
    add_top_parser(sub)
    add_logs_parsers(sub)
    return p


def _write(stream: TextIO, data: str | bytes) -> None:
    if isinstance(data, bytes):
        stream.buffer.write(data)
    else:
        stream.write(data)
    stream.flush()


async def _follow(proc: ExecRemoteProcess, url: str, quiet_after: float, *, ride_out: bool = False) -> int:
    """Print events as they come, and the link's changes and long silences on stderr
    (:mod:`.health`); return the exit status for this CLI.

    ``ride_out``: a frozen agent (``AgentUnresponsiveError``) does not end the following: it is
    told on stderr and asked again, from the same cursors, until it answers or is found gone.
    """
    last = time.monotonic()
    # A side task, not a task group: the follower's own errors (RemoteExecError, BrokenPipeError)
    # must reach main() as themselves, not wrapped in an ExceptionGroup; the reporter only prints.
    reporter = asyncio.get_running_loop().create_task(report_health(url, proc.link, lambda: last, quiet_after))
    try:
        while True:
            try:
                async for ev in proc:
                    last = time.monotonic()
                    if isinstance(ev, StdoutChunk):
                        _write(sys.stdout, ev.data)
                    elif isinstance(ev, StderrChunk):
                        _write(sys.stderr, ev.data)
                    elif isinstance(ev, Completed):
                        if ev.reason:
                            print(f"remote-exec: {terminal_safe(ev.reason)}", file=sys.stderr)
                        code = ev.exit_code
                        return 128 - code if code < 0 else code  # killed by signal N -> 128+N, like a shell
                return 1
            except AgentUnresponsiveError:
                if not ride_out:
                    raise
                with anyio.move_on_after(1.0):  # a pause between tries; a link change ends it
                    await proc.link.changed()
    except ExecTimeoutError as exc:
        print(f"remote-exec: {terminal_safe(exc)}", file=sys.stderr)
        return 124  # what coreutils' timeout(1) returns
    finally:
        reporter.cancel()
        with contextlib.suppress(asyncio.CancelledError, OSError):
            await reporter


def _env(pairs: list[str]) -> dict[str, str] | None:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"remote-exec: --env needs K=V, got {pair!r}")
        env[key] = value
    return env or None


async def _main(args: argparse.Namespace) -> int:
    if args.cmd == "run" and not [a for a in args.command if a != "--"][:1]:  # before connecting anywhere
        raise SystemExit("remote-exec run: no command (use: remote-exec run -- CMD ARGS...)")
    async with open_sandbox(args.sandbox) as sb:
        return await _dispatch(sb, args)


async def _dispatch(sb: AsyncSandbox, args: argparse.Namespace) -> int:
    if args.cmd == "run":
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            raise SystemExit("remote-exec run: no command (use: remote-exec run -- CMD ARGS...)")
        try:
            policy = policy_from_args(args)
        except ValueError as exc:
            raise SystemExit(f"remote-exec run: {exc}") from None
        opts = ExecRemoteOptions(
            cwd=args.cwd,
            env=_env(args.env),
            timeout=args.timeout,
            kill_grace=args.kill_grace,
            label=args.label,
            policy=policy,
        )
        if args.tty:  # bytes, not text: the local terminal decodes them (a split UTF-8 character too)
            opts = opts.merged({"tty": True, "tty_size": local_size(), "encoding": "base64"})
        proc = sb.exec_remote(command, opts)
        if args.tty and not args.detach:
            return await follow_tty(proc)
        if args.detach:
            await proc.started()
            print(terminal_safe(proc.detach()))  # the id is the agent's word
            return 0
        try:
            return await _follow(proc, sb.url, args.quiet_after)
        except BrokenPipeError:  # nobody reads its output any more (`| head`): stop it, as SIGPIPE would
            await proc.kill()
            raise
    if args.cmd == "ps":
        _ps(await sb.jobs())
        return 0
    if args.cmd == "cp":
        return await copy(sb, args)
    if args.cmd == "top":
        return await top(sb, args)
    if args.cmd == "logs":
        return await logs(sb, args)
    if args.cmd == "prune":
        return await prune(sb, args)
    if args.cmd == "attach" and args.tty:
        proc = await sb.attach(args.job_id)
        if not proc.tty:
            job = terminal_safe(args.job_id)
            raise SystemExit(f"remote-exec attach: job {job} has no terminal (attach without -t)")
        return await follow_tty(proc)
    if args.cmd == "attach":
        return await _follow(await sb.attach(args.job_id), sb.url, args.quiet_after, ride_out=True)
    proc = await sb.attach(args.job_id)
    await proc.kill(args.grace)
    return 0


def _ps(jobs: list[JobInfo]) -> None:
    """The job table, one line per job: every string in it comes from the agent, so each is made
    terminal-safe (controls shown as escapes, a newline in a command cannot start a row)."""
    quiet = OutputActivity()
    quiet.note(jobs)
    head = f"{'JOB ID':<17} {'PID':>7} {'STATE':<10} {'EXIT':>5} {'STARTED':<19} {'OUT':>9} {'ERR':>9}"
    print(f"{head} {'QUIET':>6}  COMMAND")
    for j in jobs:
        try:
            started = dt.datetime.fromtimestamp(j.started_at).strftime("%Y-%m-%d %H:%M:%S")
        except (ValueError, OverflowError, OSError):  # a time no calendar holds (the agent's word)
            started = "?"
        cmd = j.command if isinstance(j.command, str) else " ".join(j.command)
        exit_code = "" if j.exit_code is None else str(j.exit_code)
        label = f"[{j.label}] " if j.label else ""
        silent = quiet_text(quiet.get(j.job_id)) if j.state == "running" else ""  # an ended job is not quiet
        print(
            f"{terminal_safe(j.job_id):<17} {j.pid:>7} {terminal_safe(j.state):<10} {exit_code:>5} {started:<19} "
            f"{j.stdout_bytes:>9} {j.stderr_bytes:>9} {silent:>6}  {terminal_safe(label + cmd)[:COMMAND_WIDTH]}"
        )


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``remote-exec``."""
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "shell":  # blocking API: the prompt reads the terminal in this thread
            status = shell_repl(args.sandbox, args.session, keep=args.keep)
        else:
            status = asyncio.run(_main(args))
        sys.stdout.flush()  # here, not at exit, so that a closed pipe is caught below
        return status
    except BrokenPipeError:
        # The reader went away (`remote-exec ps | head -1`): stop quietly, as `cat` does. Point
        # stdout at /dev/null so that the interpreter's last flush cannot raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except KeyboardInterrupt:
        # asyncio.run cancelled the main task: a job `run` started was killed on the way out
        # (cancellation kills it); one followed by `attach` is left running.
        print("remote-exec: interrupted", file=sys.stderr)
        return 130
    except RemoteExecError as exc:
        print(f"remote-exec: {type(exc).__name__}: {terminal_safe(exc)}", file=sys.stderr)  # may quote the agent
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
