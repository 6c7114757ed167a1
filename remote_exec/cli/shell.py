"""``remote-exec shell``: a prompt on a shell session, to step into the shell a notebook uses.

Each line read is one run in the session: its stdout and stderr are printed as they arrive and
a non-zero exit code is shown after it. Lines come from a terminal (readline editing, history
in ``~/.remote_exec_shell_history``) or from a pipe. Ctrl-C stops the running command and keeps
the shell; Ctrl-D (end of input) leaves. ``exit N`` closes the shell and leaves with N.

At a terminal, the lines typed while a command runs are its stdin, as in a local shell
(``read name`` is answered, ``python3 -c "input()"`` too); Ctrl-D then ends that stdin, not the
prompt, and what the command leaves unread is dropped with it (never run as the next command).
From a pipe, every line is a command and a command's stdin is empty.

Without ``--session`` a new session is opened and its id printed on stderr; it is closed on the
way out unless ``--keep``. A session named with ``--session`` is left open for its owner.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import TextIO

from ..blocking import BlockingExecRemoteProcess, BlockingShellSession, connect
from ..client.types import Completed, StderrChunk, StdoutChunk
from ..errors import ExecTimeoutError, ShellBusyError
from ..termsafe import terminal_safe
from .typein import typed_lines_to

__all__ = ["shell_repl"]

HISTORY = os.path.expanduser("~/.remote_exec_shell_history")


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
