"""``remote-exec shell``: an interactive shell in the sandbox, as ``docker exec -it``,
``kubectl exec -it`` and ``ssh`` give one.

By default it is a PTY job running the sandbox user's login shell (:data:`SHELL_COMMAND`), with
the same terminal handling as ``run -t`` (:func:`.tty.follow_tty`: raw mode, its size and
resizes, ``Ctrl-]`` leaves it running); ``top``, ``clear``, ``python3``'s prompt work. Local
``$TERM`` is passed on, as ssh does.

``--lines`` (or ``--session ID``, ``--keep``, or a stdin that is no terminal) is the line
mode: a prompt on a shell *session*, to step into the shell a notebook uses. Each line read is
one run in the session: its stdout and stderr are printed as they arrive and a non-zero exit
code is shown after it. Lines come from a terminal (readline editing, history in
``~/.remote_exec_shell_history``) or from a pipe. Ctrl-C stops the running command and keeps
the shell; Ctrl-D (end of input) leaves. ``exit N`` closes the shell and leaves with N.

At a terminal, the lines typed while a command runs are its stdin, as in a local shell
(``read name`` is answered, ``python3 -c "input()"`` too); Ctrl-D then ends that stdin, not the
prompt, and what the command leaves unread is dropped with it (never run as the next command).
From a pipe, every line is a command and a command's stdin is empty.

Without ``--session`` a new session is opened and its id printed on stderr; it is closed on the
way out unless ``--keep``. A session named with ``--session`` is left open for its owner.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Any, TextIO

from ..blocking import BlockingExecRemoteProcess, BlockingShellSession, connect
from ..client.sandbox import AsyncSandbox
from ..client.types import Completed, ExecRemoteOptions, StderrChunk, StdoutChunk
from ..errors import ExecTimeoutError, ShellBusyError
from ..termsafe import terminal_safe
from .tty import follow_tty, local_size
from .typein import typed_lines_to

__all__ = ["SHELL_COMMAND", "add_shell_parser", "shell_pty", "shell_repl"]

HISTORY = os.path.expanduser("~/.remote_exec_shell_history")
SHELL_COMMAND = [  # the same as the notebook's %remote_shell (which the CLI may not import)
    "sh",
    "-c",
    # The sandbox user's login shell (its $SHELL, else its passwd entry), else bash, else sh.
    's=${SHELL:-$(getent passwd "$(id -u)" 2>/dev/null | cut -d: -f7)}; '
    '[ -x "$s" ] || s=$(command -v bash || echo /bin/sh); exec "$s" -i',
]
SHELL_LABEL = "remote-exec shell"
EXAMPLES = """examples:
  remote-exec shell                     an interactive shell in a terminal (Ctrl-] leaves it running)
  remote-exec shell --lines             line mode: one command per line in a shell session
  remote-exec shell --session SID       line mode, in the session a notebook uses
"""


def add_shell_parser(sub: Any) -> None:
    """The ``shell`` subcommand's options on ``sub`` (argparse's subparsers)."""
    p = sub.add_parser(
        "shell",
        help="an interactive shell in the sandbox, in this terminal",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--lines", action="store_true", help="line mode: a prompt on a shell session, no terminal")
    p.add_argument("--session", help="(line mode) join this session (default: open a new one and print its id)")
    p.add_argument("--keep", action="store_true", help="(line mode) leave the new session open on exit")


async def shell_pty(sb: AsyncSandbox, args: argparse.Namespace) -> int:
    """The login shell as a PTY job in this terminal, until it exits (its status) or ``Ctrl-]``
    (0, the shell left running). Cancelling it kills the shell, as ``run -t``'s job."""
    term = os.environ.get("TERM")
    opts = ExecRemoteOptions(
        tty=True,
        tty_size=local_size(),
        encoding="base64",
        label=SHELL_LABEL,
        env={"TERM": term} if term else None,
    )
    return await follow_tty(sb.exec_remote(SHELL_COMMAND, opts))


def shell_repl(url: str, session_id: str | None = None, *, keep: bool = False) -> int:
    """Run the prompt until end of input or until the shell exits; return the exit status.

    The status is the last command's exit code (the shell's own with ``exit N``).

    :raises ShellNotFoundError: ``session_id`` names no session.
    :raises ShellClosedError: ``session_id`` names a session that has ended.
    """
    tty = sys.stdin.isatty()
    if tty:
        _load_history()
    with connect(url) as sb:
        sh = sb.reattach_shell(session_id) if session_id else sb.shell()
        if session_id is None:
            sid = terminal_safe(sh.session_id)  # the agent's word, as are cwd and closed_reason
            print(f"remote-exec: shell session {sid} (join it with --session {sid})", file=sys.stderr)
        status = 0
        try:
            while (line := _read_line(sh, tty)) is not None:
                if line.strip():
                    status = _run_line(sh, line, tty)
                    if sh.refresh().state == "closed":
                        print(f"remote-exec: {terminal_safe(sh.info.closed_reason)}", file=sys.stderr)
                        return sh.info.exit_code if sh.info.exit_code is not None else status
        finally:
            if tty:
                _save_history()
            if session_id is None and not keep and not sh.closed:
                sh.close()
        return status


def _read_line(sh: BlockingShellSession, tty: bool) -> str | None:
    if not tty:
        line = sys.stdin.readline()
        return line.rstrip("\n") if line else None
    while True:
        try:
            return input(f"[{terminal_safe(sh.session_id)}] {terminal_safe(sh.refresh().cwd or '?')}$ ")
        except EOFError:
            print(file=sys.stderr)
            return None
        except KeyboardInterrupt:
            print(file=sys.stderr)  # Ctrl-C at the prompt: a fresh prompt, as in bash


def _run_line(sh: BlockingShellSession, line: str, tty: bool) -> int:
    proc: BlockingExecRemoteProcess | None = None
    code = 1
    try:
        proc = sh.start(line, stdin_open=tty)  # from a pipe, the next lines are commands, not its stdin
        with typed_lines_to(proc, sys.stdin.fileno()) if tty else contextlib.nullcontext():
            for ev in proc:
                if isinstance(ev, StdoutChunk):
                    _write(sys.stdout, ev.data)
                elif isinstance(ev, StderrChunk):
                    _write(sys.stderr, ev.data)
                elif isinstance(ev, Completed):
                    code = ev.exit_code
    except KeyboardInterrupt:
        # Ctrl-C may land between two polls, where no cancellation reaches the run: stop it here
        # (SIGINT first, as the shell's own Ctrl-C; a no-op if the iteration already did).
        if proc is not None:
            proc.kill()
        print("^C", file=sys.stderr)
        return 130
    except ShellBusyError as exc:  # someone else (the notebook) is running a command in it
        print(f"remote-exec: {terminal_safe(exc)}", file=sys.stderr)
        return 1
    except ExecTimeoutError as exc:
        print(f"remote-exec: {terminal_safe(exc)}", file=sys.stderr)
        return 124
    if code != 0:
        print(f"[exit {code}]", file=sys.stderr)
    return code


def _write(stream: TextIO, data: str | bytes) -> None:
    stream.write(data if isinstance(data, str) else data.decode(errors="replace"))
    stream.flush()


def _load_history() -> None:
    import readline  # only for a terminal: it would write escape codes into piped output

    with contextlib.suppress(OSError):  # no history yet
        readline.read_history_file(HISTORY)
    readline.set_history_length(1000)


def _save_history() -> None:
    import readline

    with contextlib.suppress(OSError):  # a read-only home must not break leaving the prompt
        readline.write_history_file(HISTORY)
