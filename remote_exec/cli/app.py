"""``remote-exec``: run, list, follow and kill jobs in a sandbox from a terminal.

``remote-exec run [--sandbox URL] -- CMD...``  stream stdout/stderr live, exit with the job's code;
                                                Ctrl-C sends SIGINT, then kills (see interrupt.py)
``remote-exec run -t -- CMD...``                the job in a terminal: this one, raw (see tty.py)
``remote-exec ps [-a] [--filter K=V]``         list jobs, as ``docker ps`` (see ps.py)
``remote-exec attach [-t] JOB``                 replay a job's retained output and follow it (-t: and
                                                type into a tty job's terminal); rides out a frozen
                                                agent (see health.py); Ctrl-C detaches
``remote-exec kill JOB`` / ``wait JOB``         kill a job's whole process group / wait for its end
``remote-exec shell [--lines]``                 an interactive shell in a terminal (see shell.py)
``remote-exec cp SRC DST``                      copy files or trees; ``sandbox:PATH`` is the sandbox's
                                                side (see cp.py)
``remote-exec logs JOB [-f] [-n LINES]``       a job's log from disk, raw (see logs.py)
``remote-exec prune [--older-than S] [--keep N] [JOB_ID...]``  forget ended jobs and their logs
``remote-exec gc [-n NAMESPACE] [--dry-run]``  delete expired pods k8s+image:// left (see gc.py)

JOB is a job id, a ``--name`` or a label (see jobref.py). Every failure is one line on stderr
and a non-zero status; ``--debug`` adds the whole chain.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import signal
import sys
import time
import traceback
from typing import TextIO

import anyio

from ..client.policyopts import POLICY_OPTIONS, policy_from_args
from ..client.process import ExecRemoteProcess
from ..client.sandbox import AsyncSandbox
from ..client.types import Completed, ExecRemoteOptions, StderrChunk, StdoutChunk
from ..errors import AgentUnresponsiveError, ExecTimeoutError, TransportError
from ..protocol import JobInfo
from ..sandboxes import open_sandbox
from ..termsafe import terminal_safe
from .cp import add_cp_parser, copy
from .gc import add_gc_parser, gc
from .health import QUIET_AFTER, report_health
from .interrupt import ctrl_c_interrupts
from .jobref import resolve_job
from .logs import add_logs_parsers, logs, prune
from .ps import add_ps_parser, print_ps
from .shell import add_shell_parser, shell_pty, shell_repl
from .top import add_top_parser, top
from .tty import follow_tty, local_size

__all__ = ["main"]

JOB_HELP = "a job id, a --name or a label (`remote-exec ps -a` lists them)"
RUN_EXAMPLES = """examples:
  remote-exec run -- python train.py              stream; Ctrl-C: SIGINT, then kill; twice: kill now
  remote-exec run -d --label train -- python train.py   print the job id and leave it running
  remote-exec run -t -- htop                       in this terminal (Ctrl-] leaves it running)
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="remote-exec", description="Run long-running commands in sandboxes.")
    p.add_argument("--debug", action="store_true", help="failures: whole chain (or REMOTE_EXEC_DEBUG=1)")
    p.add_argument(
        "--sandbox",
        "-s",
        default=os.environ.get("REMOTE_EXEC_SANDBOX", "local://"),
        help="sandbox URL (default: $REMOTE_EXEC_SANDBOX or local://)",
    )
    p.add_argument(
        "--liveness",
        metavar="S",
        type=float,
        default=None,
        help="seconds within which a silent agent (frozen, cut off) is noticed (default 8; 0: no heartbeat)",
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser(
        "run",
        help="run a command, streaming its output",
        epilog=RUN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--cwd", help="working directory in the sandbox")
    run.add_argument("--env", "-e", action="append", default=[], metavar="K=V", help="set a variable (repeatable)")
    run.add_argument("--timeout", type=float, help="kill the job after this many seconds")
    run.add_argument(
        "--kill-grace", type=float, default=5.0, help="seconds from SIGTERM (or Ctrl-C's SIGINT) to the kill"
    )
    run.add_argument("--label", help="a label shown by `ps` (attach, kill, logs and wait take it too)")
    run.add_argument("--name", help="a name for the job (tags['name'], as the notebook's --bg --name)")
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
    add_ps_parser(sub)
    raw = argparse.RawDescriptionHelpFormatter
    att = sub.add_parser(
        "attach",
        help="follow a job's output (Ctrl-C detaches; the job goes on)",
        epilog="examples:\n  remote-exec attach train          by --name, label or id\n"
        "  remote-exec attach -t JOB_ID     a tty job: be its terminal too (Ctrl-] leaves)\n",
        formatter_class=raw,
    )
    att.add_argument("--tty", "-t", action="store_true", help="be a tty job's terminal too (keys, size); Ctrl-] leaves")
    att.add_argument("job_id", metavar="JOB", help=JOB_HELP)
    att.add_argument("--quiet-after", type=float, default=QUIET_AFTER, help=quiet_help)
    kill = sub.add_parser(
        "kill",
        help="kill a job (says whether it had already ended)",
        epilog="examples:\n  remote-exec kill train           killed JOB (SIGTERM)\n"
        "  remote-exec kill --grace 0 JOB_ID   SIGKILL right after the SIGTERM\n",
        formatter_class=raw,
    )
    kill.add_argument("job_id", metavar="JOB", help=JOB_HELP)
    kill.add_argument("--grace", type=float, help="seconds from SIGTERM to SIGKILL")
    wait = sub.add_parser(
        "wait",
        help="wait for a job's end; exit with its status",
        epilog="example:\n  remote-exec wait train && echo trained\n",
        formatter_class=raw,
    )
    wait.add_argument("job_id", metavar="JOB", help=JOB_HELP)
    add_shell_parser(sub)
    add_cp_parser(sub)
    add_top_parser(sub)
    add_gc_parser(sub)
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
    if args.cmd == "gc":  # no sandbox: the cluster's API
        return await gc(args)
    if args.liveness is not None and not (args.liveness == 0 or 0.5 <= args.liveness < math.inf):
        raise SystemExit(f"remote-exec: --liveness takes 0 (off) or seconds >= 0.5, not {args.liveness:g}")
    async with open_sandbox(args.sandbox, liveness=args.liveness) as sb:
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
            tags={"name": args.name} if args.name else None,
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
            with ctrl_c_interrupts(proc, args.kill_grace) as ctrl_c:
                status = await _follow(proc, sb.url, args.quiet_after)
            return 130 if ctrl_c.presses and proc.done and status == 1 else status  # killed: no end to read
        except BrokenPipeError:  # nobody reads its output any more (`| head`): stop it, as SIGPIPE would
            await proc.kill()
            raise
    if args.cmd == "ps":
        print_ps(await sb.jobs(), args)
        return 0
    if args.cmd == "shell":
        return await shell_pty(sb, args)
    if args.cmd == "cp":
        return await copy(sb, args)
    if args.cmd == "top":
        return await top(sb, args)
    if args.cmd == "prune":
        return await prune(sb, args)
    info = await resolve_job(sb, args.job_id)
    args.job_id = info.job_id  # for what is said on the way out (main's Ctrl-C)
    if args.cmd == "logs":
        return await logs(sb, args)
    if args.cmd == "kill":
        return await _kill(sb, info, args.grace)
    if args.cmd == "wait":
        async for ev in await sb.attach(info.job_id):  # the events are dropped: only the end counts
            if isinstance(ev, Completed):
                return 128 - ev.exit_code if ev.exit_code < 0 else ev.exit_code
        return 1
    if args.cmd == "attach" and args.tty:
        proc = await sb.attach(args.job_id)
        if not proc.tty:
            job = terminal_safe(args.job_id)
            raise SystemExit(f"remote-exec attach: job {job} has no terminal (attach without -t)")
        return await follow_tty(proc)
    return await _follow(await sb.attach(args.job_id), sb.url, args.quiet_after, ride_out=True)


async def _kill(sb: AsyncSandbox, info: JobInfo, grace: float | None) -> int:
    """Kill the job and say so; an ended job's leftovers (``sleep 300 &``) are ended too."""
    job = terminal_safe(info.job_id)
    await (await sb.attach(info.job_id)).kill(grace)
    if info.state == "running":
        print(f"killed {job} (SIGTERM)")
    else:
        print(f"{job} had already ended (exit {info.exit_code})")
    return 0


def _one_line(exc: BaseException) -> str:
    """The error as one line: the innermost of a group (a task group wraps what failed in it)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    hint = (
        " (check that the sandbox is up and reachable; --debug shows the chain)"
        if isinstance(exc, TransportError)
        else ""
    )
    return f"remote-exec: {type(exc).__name__}: {terminal_safe(exc)}{hint}"  # may quote the agent


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``remote-exec``."""
    args = _parser().parse_args(argv)
    try:
        # The line mode when asked, or when stdin is no terminal (a pipe of commands, as `docker
        # exec -i` without -t); blocking API: the prompt reads the terminal in this thread.
        if args.cmd == "shell" and (args.lines or args.session or args.keep or not sys.stdin.isatty()):
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
        # (cancellation kills it); one followed by `attach` (not tracked) is left running.
        if args.cmd in ("attach", "logs", "wait"):
            job = terminal_safe(args.job_id)
            print(f"\nremote-exec: detached; job {job} goes on (remote-exec attach {job})", file=sys.stderr)
        else:
            print("\nremote-exec: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # every failure: one line (the chain with --debug)
        if args.debug or os.environ.get("REMOTE_EXEC_DEBUG", "") not in ("", "0"):
            traceback.print_exc()
        print(_one_line(exc), file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
