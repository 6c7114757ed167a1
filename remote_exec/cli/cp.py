"""``remote-exec cp SRC DST``: copy files and directories between this machine and a sandbox.

The sandbox side is written ``sandbox:PATH`` (the sandbox of ``--sandbox``), as with
``docker cp``/``kubectl cp``; ``-`` as the local side is stdin or stdout. As with ``cp``, a
destination that is an existing directory receives the source under its own name. Directories
go through :meth:`AsyncSandbox.upload`/:meth:`~AsyncSandbox.download` (default ignores,
``.gitignore``, caps, only changed files sent); files stream in bounded memory.

Exit status: 0 done; 1 a local problem (no such local file...) or bad usage; 2 a sandbox error
(the exception's class and message on stderr, e.g. ``RemoteFileNotFoundError``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import posixpath
import sys
from pathlib import Path
from typing import Any

from ..client.localtree import check_name
from ..client.sandbox import AsyncSandbox
from ..client.transfer import DEFAULT_MAX_BYTES, DEFAULT_MAX_FILES
from ..errors import RemoteExecError
from ..termsafe import terminal_safe

__all__ = ["PREFIX", "add_cp_parser", "copy"]

PREFIX = "sandbox:"


def add_cp_parser(sub: Any) -> None:
    """Add the ``cp`` subcommand to the CLI's subparsers."""
    cp = sub.add_parser(
        "cp",
        help="copy files or directories to or from the sandbox (sandbox:PATH is its side)",
        description="Copy SRC to DST; exactly one of them is sandbox:PATH. '-' is stdin/stdout.",
    )
    cp.add_argument("src", metavar="SRC")
    cp.add_argument("dst", metavar="DST")
    cp.add_argument("--root", metavar="DIR", help="workspace root in the sandbox: paths must stay inside it")
    cp.add_argument(
        "--ignore", action="append", default=[], metavar="PATTERN", help="gitignore pattern to leave out (repeatable)"
    )
    cp.add_argument("--no-default-ignores", action="store_true", help="also copy .git, node_modules, .env, *.pem...")
    cp.add_argument("--no-gitignore", action="store_true", help="do not honour .gitignore files")
    cp.add_argument("--max-files", type=int, default=DEFAULT_MAX_FILES, help="refuse bigger trees (0: no cap)")
    cp.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES, help="refuse bigger trees (0: no cap)")
    cp.add_argument("--no-progress", action="store_true", help="no progress bar")
    cp.add_argument("--checksum", action="store_true", help="trees: compare contents (SHA-256), not size and mtime")
    cp.add_argument(
        "--delete", action="store_true", help="trees: remove what DST has and SRC has not (ignored paths stay)"
    )


def _local(path: Path) -> tuple[str | None, str]:
    """``("dir" | "file" | None, the name it has)`` of a local path."""
    kind = "dir" if path.is_dir() else "file" if path.exists() else None
    return kind, path.resolve().name


async def _remote_dir(sb: AsyncSandbox, path: str) -> bool:
    try:
        return (await sb.stat(path)).type == "dir"
    except FileNotFoundError:
        return False


async def copy(sb: AsyncSandbox, args: argparse.Namespace) -> int:
    """Run ``cp`` with the parsed ``args``; returns the exit status (sandbox errors propagate)."""
    up, down = args.dst.startswith(PREFIX), args.src.startswith(PREFIX)
    if up == down:
        print("remote-exec cp: exactly one of SRC and DST must be sandbox:PATH", file=sys.stderr)
        return 1
    if args.root is not None:
        sb.workspace_root = args.root
    tree: dict[str, Any] = {
        "ignore": args.ignore,
        "default_ignores": not args.no_default_ignores,
        "gitignore": not args.no_gitignore,
        "max_files": args.max_files or None,
        "max_bytes": args.max_bytes or None,
        "progress": not args.no_progress,
        "delete": args.delete,
        "checksum": args.checksum,
    }
    try:
        if up:
            return await _upload(sb, args.src, args.dst[len(PREFIX) :] or ".", tree)
        return await _download(sb, args.src[len(PREFIX) :] or ".", args.dst, tree)
    except RemoteExecError:
        raise
    except OSError as exc:  # a local problem (its message may still name a file from the sandbox)
        print(f"remote-exec cp: {terminal_safe(exc)}", file=sys.stderr)
        return 1


async def _upload(sb: AsyncSandbox, src: str, remote: str, tree: dict[str, Any]) -> int:
    if src == "-":
        data = await asyncio.to_thread(sys.stdin.buffer.read)
        await sb.write_file(remote, data)
        return 0
    local = Path(src)
    kind, name = await asyncio.to_thread(_local, local)
    if kind is None:
        raise FileNotFoundError(f"no such local file or directory: {src}")
    into = remote.endswith("/") or await _remote_dir(sb, remote)
    target = posixpath.join(remote, name) if into else remote
    if kind == "dir":
        print((await sb.upload(local, target, **tree)).describe("uploaded"), file=sys.stderr)
    else:
        await sb.write_file_from(local, target, progress=tree["progress"])
    return 0


async def _download(sb: AsyncSandbox, remote: str, dst: str, tree: dict[str, Any]) -> int:
    info = await sb.stat(remote)
    if dst == "-":
        if info.type == "dir":
            print(
                f"remote-exec cp: {terminal_safe(remote)} is a directory: give a local directory, not -",
                file=sys.stderr,
            )
            return 1
        out = sys.stdout.buffer
        async for chunk in sb.aiter_file(remote):
            out.write(chunk)
        out.flush()
        return 0
    local = Path(dst)
    into = (await asyncio.to_thread(_local, local))[0] == "dir"
    # The name comes from the sandbox (a stat's path): a hostile one could say "..".
    name = check_name(posixpath.basename(info.path) or "root", f"cp of {remote}") if into else ""
    target = local / name if into else local
    if info.type == "dir":
        print((await sb.download(remote, target, **tree)).describe("downloaded"), file=sys.stderr)
    else:
        await sb.read_file_to(remote, os.fspath(target), progress=tree["progress"])
    return 0
