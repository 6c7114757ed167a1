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
import asyncio
import logging
import os
import sys
from pathlib import Path

from ..protocol import default_agent_dir
from .relay import error_line, refuse_stdio, relay_call, relay_stdio
from .statedir import ensure_server
from .stream import STREAM_SOCKET

__all__ = ["main"]

_SERVER_INFO = b'{"jsonrpc":"2.0","id":0,"method":"server_info","params":{}}'


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
        s.add_argument("--buffer-limit", type=int, default=8 * 1024 * 1024, help="bytes kept per stream per job")
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
        if name == "serve":
            s.add_argument("--ready-fd", type=int, default=None, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``remote-exec-agent`` and ``python -m remote_exec.agent``."""
    args = _parser().parse_args(argv)
    state_dir: Path = args.dir or default_agent_dir()
    serve_args = ["--idle-timeout", str(args.idle_timeout), "--buffer-limit", str(args.buffer_limit)]
    serve_args += ["--shell-ttl", str(args.shell_ttl)] + (["--port-any-host"] if args.port_any_host else [])
    if args.memory_budget is not None:
        serve_args += ["--memory-budget", str(args.memory_budget)]
    if args.cmd == "serve":
        from .budget import default_budget
        from .jobs.controller import JobLimits
        from .ports.controller import PortLimits
        from .server import ServerConfig, serve
        from .shell.controller import ShellLimits

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
        config = ServerConfig(
            state_dir,
            args.idle_timeout,
            JobLimits(buffer_limit=args.buffer_limit),
            ShellLimits(ttl=args.shell_ttl),
            PortLimits(any_host=args.port_any_host),
            memory_budget=args.memory_budget or default_budget(),
        )
        asyncio.run(serve(config, args.ready_fd))
        return 0
    from ..errors import AgentUnavailableError

    body = sys.stdin.buffer.read() if args.cmd == "call" else b""
    try:
        ensure_server(state_dir, serve_args)
    except AgentUnavailableError as exc:
        print(f"remote-exec-agent: {exc}", file=sys.stderr)
        # The host reads stdout, not stderr: answer its request(s) with the reason, so that its
        # error names the cause (a foreign state dir...) rather than a closed channel.
        if args.cmd == "stdio":
            return refuse_stdio(exc)
        sys.stdout.buffer.write(error_line(body if args.cmd == "call" else _SERVER_INFO, exc) + b"\n")
        return 3
    sock = state_dir / "agent.sock"
    if args.cmd == "call":
        return asyncio.run(relay_call(sock, body))
    if args.cmd == "ensure":
        return asyncio.run(relay_call(sock, _SERVER_INFO))
    return relay_stdio(state_dir / STREAM_SOCKET)


if __name__ == "__main__":  # pragma: no cover
    os._exit(main())
