"""``remote-exec-agent``: the stateless command line of the in-sandbox agent.

``serve``   run the server in the foreground (normally started for you by the others)
``call``    one JSON-RPC request on stdin -> its response on stdout
``stdio``   a persistent channel: newline-delimited requests on stdin, responses on stdout,
            many in flight at once, answered as they complete (match them by id)
``ensure``  start the server unless it runs; print its ``server_info`` result as JSON

``call``, ``stdio`` and ``ensure`` start the server (detached, under a file lock) when needed.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from pathlib import Path

from .._version import __version__
from ..errors import AgentUnavailableError
from ..protocol.agentdir import STREAM_SOCKET, default_agent_dir
from .relay import SERVER_INFO_REQUEST, error_line, refuse_stdio, relay_stdio, stream_call
from .statedir import describe, ensure_server
from .upgrade import take_over

__all__ = ["main"]


_LIMITS = [  # the agent's bounds on what it holds open at once (more get ServerBusyError)
    ("--max-running", 4096, "jobs (shell runs included) running at once"),
    ("--max-shells", 256, "shell sessions open at once"),
    ("--max-write-sessions", 256, "file write sessions open at once"),
    ("--max-conns", 128, "forwarded TCP connections open at once"),
]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="remote-exec-agent", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, text in [
        ("serve", "run the agent server in the foreground"),
        ("call", "send one JSON-RPC request read from stdin; print the response"),
        ("stdio", "relay newline-delimited JSON-RPC between stdin/stdout and the server"),
        ("ensure", "start the server if needed and print its server_info"),
    ]:
        s = sub.add_parser(name, help=text, description=text)
        s.add_argument("--dir", type=Path, default=None, help="state directory (default: per-user)")
        s.add_argument("--idle-timeout", type=float, default=900.0, help="seconds idle before exiting (0: never)")
        s.add_argument(
            "--buffer-limit",
            type=int,
            default=8 * 1024 * 1024,
            help="bytes a job's stdin queue holds at most",
        )
        s.add_argument(
            "--memory-budget",
            type=int,
            default=None,
            help="bytes the agent holds for requests, stdin and output at most "
            "(default: a quarter of the cgroup memory limit, at most 256 MiB)",
        )
        s.add_argument("--shell-ttl", type=float, default=3600.0, help="seconds a shell session may idle (0: forever)")
        s.add_argument(
            "--port-any-host",
            action="store_true",
            help="let port forwarding connect to any address, not only loopback ones inside the sandbox",
        )
        for flag, default, text in _LIMITS:
            s.add_argument(flag, type=int, default=default, help=text)
        s.add_argument(
            "--disk-cap", type=int, default=1 << 30, help="bytes of each job output stream kept on disk (head dropped)"
        )
        s.add_argument(
            "--log-budget",
            type=int,
            default=None,
            help="bytes of all jobs' logs kept on disk (heads dropped, ended jobs' first; default: a "
            "quarter of the state dir's file system, on a tmpfs at most a quarter of the memory limit)",
        )
        s.add_argument(
            "--retain-seconds", type=float, default=7 * 24 * 3600.0, help="forget an ended job this long after its end"
        )
        s.add_argument("--max-retained", type=int, default=1000, help="ended jobs kept at most (oldest forgotten)")
        s.add_argument("--report-version", default=None, help=argparse.SUPPRESS)  # tests: fake another version
        s.add_argument(
            "--no-cgroups",
            action="store_true",
            help="no cgroup per job, even where one can be made (the keeper's attribution alone)",
        )
        if name == "serve":
            s.add_argument("--ready-fd", type=int, default=None, help=argparse.SUPPRESS)
    return p


def _ensured_info(state_dir: Path, serve_args: list[str]) -> int:
    """Print the ``server_info`` of the agent that serves ``state_dir`` now. The one just
    ensured may be gone before it is asked (a host of another version took the state dir over
    meanwhile: soak): ensure again, a few times, rather than fail."""
    for _ in range(2):
        if stream_call(state_dir / STREAM_SOCKET, SERVER_INFO_REQUEST, quiet=True) == 0:
            return 0
        with contextlib.suppress(AgentUnavailableError):
            ensure_server(state_dir, serve_args)
    return stream_call(state_dir / STREAM_SOCKET, SERVER_INFO_REQUEST)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``remote-exec-agent`` and ``python -m remote_exec.agent``."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["keeper"]:
        from .keeper import run_cli

        return run_cli(argv[1:])
    args = _parser().parse_args(argv)
    state_dir: Path = args.dir or default_agent_dir()
    serve_args = ["--idle-timeout", str(args.idle_timeout), "--buffer-limit", str(args.buffer_limit)]
    serve_args += ["--disk-cap", str(args.disk_cap)]
    serve_args += ["--retain-seconds", str(args.retain_seconds), "--max-retained", str(args.max_retained)]
    if args.report_version:
        serve_args += ["--report-version", args.report_version]
    if args.no_cgroups:
        serve_args += ["--no-cgroups"]
    serve_args += ["--shell-ttl", str(args.shell_ttl)] + (["--port-any-host"] if args.port_any_host else [])
    if args.memory_budget is not None:
        serve_args += ["--memory-budget", str(args.memory_budget)]
    if args.log_budget is not None:
        serve_args += ["--log-budget", str(args.log_budget)]
    for flag, _, _ in _LIMITS:
        serve_args += [flag, str(getattr(args, flag[2:].replace("-", "_")))]
    if args.cmd == "serve":
        return _serve(args, state_dir)
    body = sys.stdin.buffer.read() if args.cmd == "call" else b""
    serving = None  # the server_info answer of the agent found running, if asked already
    try:
        started = ensure_server(state_dir, serve_args)
        if not started and args.cmd in ("ensure", "stdio"):
            serving = take_over(state_dir, serve_args, args.report_version or __version__)
    except AgentUnavailableError as exc:
        print(f"remote-exec-agent: {exc}", file=sys.stderr)
        # The host reads stdout, not stderr: answer its request(s) with the reason, so that its
        # error names the cause (a foreign state dir...) rather than a closed channel.
        if args.cmd == "stdio":
            return refuse_stdio(exc)
        sys.stdout.buffer.write(error_line(body if args.cmd == "call" else SERVER_INFO_REQUEST, exc) + b"\n")
        return 3
    if args.cmd == "stdio":
        return relay_stdio(state_dir / STREAM_SOCKET)
    if args.cmd == "ensure":
        if serving is not None:  # asked once already: the agent of this version serving now
            sys.stdout.buffer.write(serving + b"\n")
            return 0
        return _ensured_info(state_dir, serve_args)
    import asyncio  # not at the top: ``stdio`` and ``ensure`` do without it

    from .httprelay import relay_call  # aiohttp: kept off the stdio relay's path (see relay.py)

    return asyncio.run(relay_call(state_dir / "agent.sock", body))


def _serve(args: argparse.Namespace, state_dir: Path) -> int:
    import asyncio

    from .budget import default_budget
    from .files.sessions import FileLimits
    from .jobs.controller import JobLimits
    from .keeper import HANDOVER_EXIT
    from .loopguard import guard_from_env
    from .ports.controller import PortLimits
    from .server import ServerConfig, serve
    from .shell.controller import ShellLimits

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    guard_from_env()  # the test suite's check that nothing blocks the loop (a no-op otherwise)
    config = ServerConfig(
        state_dir,
        args.idle_timeout,
        JobLimits(
            buffer_limit=args.buffer_limit,
            max_running=args.max_running,
            retain_seconds=args.retain_seconds,
            max_retained=args.max_retained,
        ),
        ShellLimits(ttl=args.shell_ttl, max_open=args.max_shells),
        PortLimits(any_host=args.port_any_host, max_open=args.max_conns),
        FileLimits(max_sessions=args.max_write_sessions),
        memory_budget=args.memory_budget or default_budget(),
        disk_cap=args.disk_cap,
        log_budget=args.log_budget,
        report_version=args.report_version or __version__,
        cgroups=not args.no_cgroups,
    )
    code = 0
    loop = asyncio.new_event_loop()
    try:
        if loop.run_until_complete(serve(config, args.ready_fd)):
            code = HANDOVER_EXIT  # tells the keeper: jobs stay, the next agent comes with a ``start``
    except (OSError, AgentUnavailableError) as exc:  # the state dir: full, read-only, not ours
        why = describe(exc) if isinstance(exc, OSError) else str(exc)
        print(f"remote-exec-agent: cannot serve in {state_dir}: {why}", file=sys.stderr)
        code = 3
    # Not asyncio.run(): it would wait for the default executor's threads, and one stuck in a
    # file operation that never returns (a hung mount) would keep a stopped agent alive. Jobs
    # and shells are killed and write sessions removed by now; a stuck thread has nothing to do.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    os._exit(main())
