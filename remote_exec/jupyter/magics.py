"""The IPython magics: ``%%exec_remote``, ``%exec_remote_config``, ``%remote_jobs``, ``%remote_shell``
and ``%exec_remote_attach`` (the copy magics are in :mod:`~remote_exec.jupyter.file_magics`).

They parse and delegate: options are read with ``magic_arguments`` (bad input raises
``UsageError``), names are resolved in ``shell.user_ns`` (never ``eval``), the work is done by
:mod:`~remote_exec.jupyter.runner` and the widgets, and what to show is decided by
:mod:`~remote_exec.jupyter.display`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses

from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import magics_class, no_var_expand

from ..blocking import Sandbox
from ..client.policyopts import POLICY_OPTIONS, policy_from_args
from ..errors import JobNotFoundError, RemoteExecError, SandboxError
from .attach import attach_job
from .background import BackgroundJob
from .dashboard import Dashboard
from .dashboard_view import STATE_FILTERS
from .display import RemoteCommandError, show, widgets_enabled
from .kernel_state import KernelState, notebook_tags
from .magic_base import (
    StateMagics,
    _argument,
    _cell_magic,
    _line_magic,
    _magic_arguments,
    _options,
    _parse,
    _plain_help,
    _variable,
)
from .rerun import SHELL_LABEL, rerun_named, running_terminals
from .runner import CellJob, failure
from .shell_view import ShellView
from .terminal_view import DEFAULT_SIZE, MAX_ROWS, TerminalView, start_cols

__all__ = ["SHELL_COMMAND", "RemoteExecMagics"]

SHELL_COMMAND = [
    "sh",
    "-c",
    # The sandbox user's login shell (its $SHELL, else its passwd entry), else bash, else sh.
    's=${SHELL:-$(getent passwd "$(id -u)" 2>/dev/null | cut -d: -f7)}; '
    '[ -x "$s" ] || s=$(command -v bash || echo /bin/sh); exec "$s" -i',
]
"""What ``%remote_shell`` runs in its terminal."""

_WHERE = _options(
    (("--sandbox",), {"metavar": "URL", "help": "the sandbox to run in (default: %%exec_remote_config's)"}),
    (("--timeout",), {"metavar": "S", "type": float, "help": "kill the job after S seconds"}),
    (("--cwd",), {"metavar": "DIR", "help": "working directory in the sandbox"}),
    (("--env",), {"metavar": "K=V", "nargs": "+", "action": "extend", "help": "environment variables to add"}),
    (
        ("--widget",),
        {
            "action": argparse.BooleanOptionalAction,
            "default": None,
            "help": "show a live job view (default: yes where widgets render; --no-widget: capped text)",
        },
    ),
)


_POLICY = _options(*POLICY_OPTIONS)


def _env(pairs: list[str] | None) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--env takes K=V pairs, got {pair!r}")
        env[key] = value
    return env


def _timeout(value: float | None) -> float | None:
    if value is not None and value <= 0:
        raise UsageError(f"--timeout must be positive, got {value:g}")
    return value


@magics_class
class RemoteExecMagics(StateMagics):
    """The magics of ``%load_ext remote_exec``; one instance (and one :class:`KernelState`) per shell."""

    def __init__(self, shell: InteractiveShell) -> None:
        super().__init__(shell, KernelState())

    # -- %%exec_remote -------------------------------------------------------------------------

    @_magic_arguments()
    @_WHERE
    @_POLICY
    @_argument("--bg", action="store_true", help="run in the background: return at once, show a live job view")
    @_argument("--name", metavar="VAR", help="store the ExecResult (--bg: the BackgroundJob) in VAR")
    @_argument(
        "--replace",
        action="store_true",
        help="--bg --name: kill the running job of that name first (without it, a re-run attaches to it)",
    )
    @_argument("--shell", metavar="ID|new|last", help="run in a shell session (cwd and env persist)")
    @_argument(
        "--tty",
        action="store_true",
        help="run in a pseudo-terminal shown in a terminal you can type into (returns at once, as --bg; "
        "plain text: the rendered screen at the end)",
    )
    @_argument("--stdin", action="store_true", help="with --bg: keep the job's stdin open; its view gets an input line")
    @_argument("--merged", action="store_true", help="one pane for stdout and stderr, in the order read")
    @_argument("--raise-error", action=argparse.BooleanOptionalAction, default=True, help="raise on failure")
    @_argument("--out", metavar="VAR", help="store the stdout text in VAR")
    @_argument("--err", metavar="VAR", help="store the stderr text in VAR")
    @_cell_magic
    def exec_remote(self, line: str, cell: str) -> None:
        """Run the cell as a bash script in a sandbox, streaming its output live.

        The notebook's interrupt sends SIGINT to the job, then kills it. A failure (non-zero
        exit, timeout) raises ``RemoteCommandError`` unless ``--no-raise-error``. A ``--bg --name``
        cell re-run while its job runs (this kernel's, or an earlier kernel's of the same
        notebook) shows that job's live view instead of starting another; ``--replace`` kills it
        and starts the cell.
        """
        args = _parse(self.exec_remote, line)
        if not cell.strip():
            raise UsageError("%%exec_remote needs a script in the cell body")
        name, out, err = (_variable(args.name, "--name"), _variable(args.out, "--out"), _variable(args.err, "--err"))
        d = self.state.defaults
        plain = not widgets_enabled()
        # A live view by default, foreground cells too: it shows a flood capped (the newest
        # lines, "N lines hidden", Download for the rest) where streamed text would trip
        # Jupyter's IOPub rate limit and lose the end of the output.
        widget = (args.widget if args.widget is not None else d.widget if d.widget is not None else True) and not plain
        if args.tty and args.shell is not None:
            raise UsageError("--tty runs the cell in a terminal of its own: it cannot run in a --shell session")
        # A terminal to type into needs a free kernel: the front end's keystrokes reach the view
        # only between cells, so a --tty cell with a widget returns at once, as --bg does.
        background = args.bg or (args.tty and widget)
        if args.stdin and not args.bg:
            # A running cell holds the kernel: what is typed into its view would wait for the end.
            raise UsageError("--stdin needs --bg: the kernel must be free to pass typed lines on")
        if args.merged and args.tty:
            raise UsageError("--merged: a --tty terminal shows one stream already (stderr is the terminal too)")
        if args.stdin and args.shell is not None:
            raise UsageError("--stdin: a --shell session's commands take no stdin from the view")
        if background and (out or err):
            raise UsageError("--out/--err need the output, which a --bg cell does not wait for: use --name and .wait()")
        env = {**d.env, **_env(args.env)}
        cwd = args.cwd if args.cwd is not None else d.cwd
        timeout = _timeout(args.timeout) if args.timeout is not None else d.timeout
        reused = args.shell not in (None, "new") and (args.shell != "last" or self.state.last_shell(args.sandbox))
        if reused and (args.cwd is not None or args.env):
            raise UsageError("--cwd/--env apply when a shell is opened (--shell new); an open one keeps its own")
        try:
            policy = policy_from_args(args)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if policy is not None and args.shell is not None:
            raise UsageError("policy options apply to a job of its own, not to a run in a shell session (--shell)")
        if background and name is not None:
            url = self.state.shell_url(args.sandbox) if args.shell is not None else args.sandbox or d.sandbox
            running = self._free_name(name, args.replace, self._sandbox(url), widget)
            if running is not None:
                self._store(name, running)
                return
        job = dataclasses.replace(
            self._job(cell, args.sandbox, args.shell, cwd, env, timeout),
            tty=args.tty,
            stdin=args.stdin,
            merged=args.merged,
        )
        # Every cell's job (foreground, --bg, --shell) names its notebook and kernel: --mine and
        # the dashboard find it after a restart; a --bg --name also for %exec_remote_attach NAME.
        named = {"name": name} if background and name else {}
        job = dataclasses.replace(job, tags={**notebook_tags(), **named} or None)
        if policy is not None:
            job = dataclasses.replace(job, policy=policy)
        try:
            if background:
                bg = job.run_background(widget=widget, plain=plain, name=name)
                self.state.background.append(bg.process)
                if name is not None:
                    self.state.named[name] = bg
                self._store(name, bg)
                return
            outcome = job.run_foreground(widget=widget, plain=plain)
        except RemoteExecError as exc:
            raise RemoteCommandError(f"{type(exc).__name__}: {exc}") from exc
        result = outcome.result
        self._store(name, result)
        if result is not None:
            self._store(out, result.stdout)
            self._store(err, result.stderr)
        error = failure(outcome, timeout)
        if error is not None and args.raise_error:
            raise error

    def _free_name(self, name: str, replace: bool, sb: Sandbox, show: bool) -> BackgroundJob | None:
        """:func:`~remote_exec.jupyter.rerun.rerun_named`: the running job a re-run cell attaches
        to, or ``None`` (the cell starts its job).

        :raises RemoteCommandError: the agent failed, or answered with an unsafe listing.
        """
        try:
            return rerun_named(self.state, sb, name, replace=replace, show=show)
        except RemoteExecError as exc:
            raise RemoteCommandError(f"{type(exc).__name__}: {exc}") from exc

    def _job(
        self, cell: str, url: str | None, shell: str | None, cwd: str | None, env: dict[str, str], timeout: float | None
    ) -> CellJob:
        grace = self.state.defaults.interrupt_grace
        if shell is None:
            sb = self._sandbox(url or self.state.defaults.sandbox)
            return CellJob(cell, sb, timeout=timeout, cwd=cwd, env=env or None, interrupt_grace=grace)
        try:
            sb, session = self.state.shell(shell, url, cwd, env or None)
        except SandboxError as exc:
            raise UsageError(str(exc)) from None
        except RemoteExecError as exc:
            raise RemoteCommandError(f"{type(exc).__name__}: {exc}") from exc
        return CellJob(cell, sb, session=session, timeout=timeout, interrupt_grace=grace)

    # -- %exec_remote_config -------------------------------------------------------------------

    @_magic_arguments()
    @_WHERE
    @_argument("--interrupt-grace", metavar="S", type=float, help="seconds from an interrupt's SIGINT to the kill")
    @_argument("--no-timeout", action="store_true", help="clear the default timeout")
    @_argument("--reset", action="store_true", help="back to the built-in defaults")
    @_line_magic
    def exec_remote_config(self, line: str) -> None:
        """Set this kernel's defaults for ``%%exec_remote``; with no options, show them."""
        args = _parse(self.exec_remote_config, line)
        if args.reset:
            self.state.defaults = type(self.state.defaults)()
        d = self.state.defaults
        if args.sandbox is not None:
            self._sandbox(args.sandbox)  # fail now, not in the next cell
            d.sandbox = args.sandbox
        if args.timeout is not None:
            d.timeout = _timeout(args.timeout)
        if args.no_timeout:
            d.timeout = None
        if args.cwd is not None:
            d.cwd = args.cwd or None
        if args.env is not None:
            d.env = {**d.env, **_env(args.env)}
        if args.widget is not None:
            d.widget = args.widget
        if args.interrupt_grace is not None:
            if args.interrupt_grace < 0:
                raise UsageError("--interrupt-grace must not be negative")
            d.interrupt_grace = args.interrupt_grace
        if not line.strip():
            print(d.describe())

    # -- %remote_jobs / %remote_shell ------------------------------------------------------------

    @_magic_arguments()
    @_argument("--sandbox", metavar="URL", action="append", help="a sandbox to show (repeat for a fleet)")
    @_argument("--fleet", action="store_true", help="every sandbox this kernel has used")
    @_argument("--mine", dest="mine", action="store_true", default=True, help="this kernel's/notebook's jobs (default)")
    @_argument("--all", dest="mine", action="store_false", help="every client's jobs")
    @_argument("--state", choices=STATE_FILTERS, default="all", help="only jobs in this state")
    @_argument("--filter", metavar="TEXT", default="", help="only jobs whose label or command contains TEXT")
    @_line_magic
    def remote_jobs(self, line: str) -> Dashboard | None:
        """Show the jobs of the sandbox (or several: a fleet view), live: this kernel's and
        notebook's by default, every client's with ``--all``."""
        args = _parse(self.remote_jobs, line)
        urls = list(args.sandbox or [])
        sandboxes = [self._sandbox(u) for u in dict.fromkeys(urls or [self.state.defaults.sandbox])]
        if args.fleet:
            sandboxes += [sb for sb in self.state.sandboxes if sb not in sandboxes]
        dash = Dashboard(
            sandboxes, mine_only=args.mine, known=self.state.background, state=args.state, text=args.filter
        )
        if not widgets_enabled():  # it has refreshed once: a snapshot
            try:
                if dash.errors:
                    raise RemoteCommandError("\n".join(f"{u}: {m}" for u, m in dash.errors.items()))
                print(repr(dash))
            finally:
                dash.close()
            return None
        return dash

    @_magic_arguments()
    @_argument(
        "job", metavar="JOB|NAME", help="a job id, or the --name of a --bg cell (the newest; this notebook's first)"
    )
    @_argument("--sandbox", metavar="URL", help="the sandbox (default: %%exec_remote_config's)")
    @_argument("--name", metavar="VAR", help="store the BackgroundJob in VAR (default: NAME, if a --name was given)")
    @no_var_expand  # its line may be a pasted hint: a notebook's URL, which {…} would run as code
    @_line_magic
    def exec_remote_attach(self, line: str) -> None:
        """A live view of a running or finished job, e.g. after a kernel restart: its whole kept
        output, true command and elapsed time, Interrupt and Kill. The line is taken as typed:
        no ``{var}`` or ``$var`` expansion."""
        args = _parse(self.exec_remote_attach, line)
        attach_job(self.state, self.shell, args.job, args.sandbox, args.name)

    @_magic_arguments()
    @_argument("--sandbox", metavar="URL", help="where to open the shell (default: %%exec_remote_config's)")
    @_argument(
        "--shell",
        metavar="ID|new|last",
        help="instead of a terminal: the input-line widget on a shell session (%%exec_remote --shell runs there too)",
    )
    @_argument("--rows", metavar="N", type=int, default=DEFAULT_SIZE[1], help="the terminal's height (rows)")
    @no_var_expand  # its line may be a pasted hint: a notebook's URL, which {…} would run as code
    @_line_magic
    def remote_shell(self, line: str) -> None:
        """An interactive shell in a terminal: the sandbox user's shell in a PTY, in a terminal
        widget (colours, full-screen programs, resize). ``--shell`` shows a shell session instead.

        Re-run (in this kernel, or after a restart in the same notebook) while the notebook's
        terminal runs, it shows that terminal again rather than starting another; ``exit`` in
        it ends it, and the next run starts a new one."""
        args = _parse(self.remote_shell, line)
        if args.shell is None:
            self._terminal(args.sandbox, args.rows)
            return
        try:
            sb, session = self.state.shell(args.shell, args.sandbox)
            session.refresh()  # cells run since it opened may have moved its cwd
        except SandboxError as exc:
            raise UsageError(str(exc)) from None
        except RemoteExecError as exc:
            raise RemoteCommandError(f"{type(exc).__name__}: {exc}") from exc
        if not widgets_enabled():
            print(f"shell {session.session_id} in {sb.url}, cwd {session.info.cwd}")
            return
        show(ShellView(session))

    def _terminal(self, url: str | None, rows: int) -> None:
        if not 2 <= rows <= MAX_ROWS:
            raise UsageError(f"--rows must be between 2 and {MAX_ROWS}, got {rows}")
        sb = self._sandbox(url or self.state.defaults.sandbox)
        if not widgets_enabled():
            # Nothing could type into it: start nothing, rather than a shell waiting forever.
            print(
                "%remote_shell opens an interactive terminal where widgets render; "
                "here, run commands with %%exec_remote"
            )
            return
        try:
            # The notebook's terminal if one runs: a re-run must not leave a shell with no view.
            for info in reversed(running_terminals(sb, [p.job_id or "" for p in self.state.background])):
                with contextlib.suppress(JobNotFoundError):  # it ended and was forgotten meanwhile
                    watcher, control = sb.attach(info.job_id), sb.attach(info.job_id)
                    show(TerminalView(watcher, command=SHELL_LABEL, sandbox=sb.url, rows=rows, control=control))
                    return
            proc = sb.exec_remote(
                SHELL_COMMAND, tty=True, tty_size=(start_cols(), rows), label=SHELL_LABEL, tags=notebook_tags()
            )
        except RemoteExecError as exc:
            raise RemoteCommandError(f"{type(exc).__name__}: {exc}") from exc
        self.state.background.append(proc)  # %remote_jobs lists it; it outlives the kernel, as --bg jobs do
        assert proc.job_id is not None
        show(TerminalView(sb.attach(proc.job_id), command=SHELL_LABEL, sandbox=sb.url, rows=rows, control=proc))


_plain_help(RemoteExecMagics)
