"""``ShellView``: a terminal-like view of a shell session — an input line, and its output.

Commands typed in the view run in the session (its cwd and variables persist, as in a
terminal); stdout and stderr are told apart, the prompt shows the cwd, ↑/↓ walk the history,
Interrupt sends Ctrl-C, and another session can be picked up by id (``reattach``). A running
command's stdin is open: a line typed meanwhile is its input (Ctrl+D closes it).

Shown with :meth:`ShellView.show`, its output carries a record beside the widget
(:mod:`~remote_exec.jupyter.shell_record`: the newest transcript lines, the session's id and
state), kept fresh after each command in a draft output beside the view (the view itself is not
re-rendered; :class:`~remote_exec.jupyter.record.RecordedDisplay`): what a saved notebook shows
once the server's saver moved it in, and what the JupyterLab extension's Reconnect reads.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import traitlets

from ..blocking import BlockingShellSession, Sandbox
from ..client.process import ExecRemoteProcess
from ..errors import RemoteExecError
from ..protocol.names import check_job_id
from ._assets import css, esm
from .base import StreamWidget
from .display import widgets_enabled
from .follow import follow, loop_of
from .kernel_state import notebook_tags
from .record import RECORD_LINE_CHARS, RECORD_LINES, RecordedDisplay
from .saving import RECORD_META
from .shell_record import ShellRecord
from .transcript import DEFAULT_TAIL_LINES

__all__ = ["ShellView"]

HISTORY = 500  # commands remembered per view


class ShellView(StreamWidget):
    """A shell session in a widget: ``ShellView(sb)`` opens one, ``ShellView(session)`` shows one.

    :param target: a blocking sandbox (a new session is opened there, or ``session_id`` is
        reattached) or a session (``sb.shell()``).
    :param session_id: with a sandbox: reattach to this session instead of opening one.
    """

    PANES = {"command": "main", "stdout": "main", "stderr": "main", "info": "main", "stdin": "main"}  # noqa: RUF012
    _esm = esm("shell_view")
    _css = css("shell_view")

    session_id = traitlets.Unicode("").tag(sync=True)
    sandbox = traitlets.Unicode("").tag(sync=True)
    cwd = traitlets.Unicode("").tag(sync=True)
    state = traitlets.Unicode("open").tag(sync=True)
    busy = traitlets.Bool(False).tag(sync=True)
    history = traitlets.List(traitlets.Unicode()).tag(sync=True)
    error = traitlets.Unicode("").tag(sync=True)

    def __init__(
        self,
        target: Sandbox | BlockingShellSession,
        *,
        session_id: str | None = None,
        tail_lines: int = DEFAULT_TAIL_LINES,
    ) -> None:
        if isinstance(target, Sandbox):
            session = target.reattach_shell(session_id) if session_id else target.shell()
        else:
            session = target
        info = session.info
        super().__init__(
            loop_of(session),
            tail_lines=tail_lines,
            session_id=check_job_id(info.session_id, source="the shell session"),  # shown, pasted: data
            sandbox=session.url,
            cwd=info.cwd or "",
            state=info.state,
        )
        self.session = session
        """The session the view runs commands in (changes on reattach)."""
        self._cwd = info.cwd or ""
        self._running = False
        self._proc: ExecRemoteProcess | None = None  # the running command (its stdin is open)
        self._stdin_lock = asyncio.Lock()  # one write at a time: the handle's stdin cursor
        self._idle_event = threading.Event()
        self._idle_event.set()
        self._recorded = RecordedDisplay(self._repr_mimebundle_)  # the output that shows it, its record rewritten
        self._serve_controls()

    # -- work (loop thread) ----------------------------------------------------------------------

    async def _run(self, command: str) -> None:
        if self._running:
            self._emit("info", "busy: wait for the running command, or Interrupt it\n")
            return
        self._running = True
        self._idle_event.clear()
        self._set(busy=True, history=[*self.history, command][-HISTORY:], error="")
        self._emit("command", f"{self._cwd}$ {command}\n")
        try:
            # stdin open: what is typed while it runs is its input (read, input(), y/n prompts)
            # tagged as the notebook's jobs are: a later kernel's `--shell last` finds this session
            self._proc = self.session.async_session.start(command, stdin_open=True, tags=notebook_tags() or None)
            outcome = await follow(self._proc, self._emit)
            if outcome.state == "error":
                self._emit("info", f"{outcome.error}\n")
            elif outcome.state != "completed":
                code = "" if outcome.exit_code is None else f" (exit {outcome.exit_code})"
                self._emit("info", f"[{outcome.state}{code}]\n")
            await self._refresh_info()
        finally:
            self._running = False
            self._proc = None
            self._set(busy=False)
            self._recorded.update()  # what a saved notebook shows: the transcript up to now
            self._idle_event.set()

    async def _refresh_info(self) -> None:
        try:
            info = await self.session.async_session.refresh()
        except RemoteExecError as exc:
            self._set(state="closed", error=str(exc))
            return
        self._cwd = info.cwd or self._cwd
        self._set(cwd=self._cwd, state=info.state)
        if info.state == "closed":
            self._emit("info", f"[shell closed: {info.closed_reason or 'exited'}]\n")

    async def _stdin(self, data: str | None) -> None:
        """A line typed while a command runs goes to its stdin (``None``: close it, Ctrl+D)."""
        proc = self._proc
        if proc is None:
            return
        async with self._stdin_lock:
            try:
                if data is None:
                    await proc.close_stdin()
                    self._emit("info", "[stdin closed]\n")
                else:
                    self._emit("stdin", data)  # the terminal's echo of what was typed
                    await proc.write_stdin(data)
            except RemoteExecError as exc:
                self._emit("info", f"stdin: {exc}\n")

    async def _interrupt(self) -> None:
        try:
            await self.session.async_session.interrupt()
        except RemoteExecError as exc:
            self._set(error=str(exc))

    async def _reattach(self, session_id: str) -> None:
        if self._running:
            self._emit("info", "busy: cannot switch sessions while a command runs\n")
            return
        try:
            session = await self.session.async_session.reattach_shell(session_id)
            check_job_id(session.session_id, source="the shell session")  # shown, pasted: data
        except RemoteExecError as exc:
            self._emit("info", f"reattach failed: {exc}\n")
            return
        self.session = BlockingShellSession(self._loop.portal, session)
        self._cwd = session.info.cwd or ""
        self._set(session_id=session.session_id, cwd=self._cwd, state=session.info.state, error="")
        self._emit("info", f"[reattached to {session.session_id}]\n")
        self._recorded.update()

    def _action(self, kind: str, content: dict[str, Any]) -> None:
        command, session_id = content.get("command"), content.get("session_id")
        if kind == "run" and isinstance(command, str) and command.strip():
            self._loop.spawn(self._run, command)
        elif kind == "stdin" and isinstance(content.get("data"), str):
            self._loop.spawn(self._stdin, content["data"])
        elif kind == "close_stdin":
            self._loop.spawn(self._stdin, None)
        elif kind == "interrupt":
            self._loop.spawn(self._interrupt)
        elif kind == "reattach" and isinstance(session_id, str) and session_id.strip():
            self._loop.spawn(self._reattach, session_id.strip())

    # -- Python side -----------------------------------------------------------------------------

    def run(self, command: str) -> None:
        """Run ``command`` as if typed in the view, and wait for it to end."""
        self._loop.call(self._run, command)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no command runs in the view (``False`` if ``timeout`` passed first)."""
        return self._idle_event.wait(timeout)

    def send_stdin(self, data: str | None) -> None:
        """Type ``data`` into the running command's stdin (``None``: close it), as the view does."""
        self._loop.call(self._stdin, data)

    def interrupt(self) -> None:
        """Ctrl-C: SIGINT to the running command; the shell lives on."""
        self._loop.call(self._interrupt)

    def reattach(self, session_id: str) -> None:
        """Show (and run commands in) another session of the same sandbox."""
        self._loop.call(self._reattach, session_id)

    # -- the stored record -----------------------------------------------------------------------

    def record(self) -> ShellRecord:
        """The session as this view knows it now (what its stored fallback shows)."""
        pieces, hidden = self._transcript.tail("main", RECORD_LINES, RECORD_LINES * RECORD_LINE_CHARS)
        due = self._due  # a change not yet sent to the front end is already true
        return ShellRecord(
            session_id=self.session_id,
            sandbox=self.sandbox,
            cwd=due.get("cwd", self.cwd),
            state=due.get("state", self.state),
            pieces=pieces,
            hidden=hidden,
            as_of=time.time(),
        )

    def show(self) -> None:
        """Display the view in the cell's output, its record's draft rewritten after each command."""
        self._recorded.show(self._uid)

    @property
    def _ipython_display_(self) -> Callable[[], None] | None:
        """With widgets, :meth:`show` (a record that follows the shell); else none, so the text
        stays the cell's value (what nbval compares)."""
        return self.show if widgets_enabled() else None

    def _hold_record(self, on: bool) -> None:
        self._recorded.hold(on)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        if not widgets_enabled():
            return super()._repr_mimebundle_(**kwargs)  # plain text only: what nbval compares
        record = self.record()
        bundle = super()._repr_mimebundle_(**kwargs)
        data, meta = bundle if isinstance(bundle, tuple) else (bundle, {})
        data = {**data, "text/plain": record.plain(), "text/html": record.html()}
        # saved in place of the widget (saving.py), with what a Reconnect needs
        mark = {"kind": "shell", "session_id": self.session_id, "sandbox": self.sandbox, "state": record.state}
        return data, {**(meta or {}), RECORD_META: mark}

    def _plain_text(self) -> str:
        pieces, hidden = self._transcript.tail("main", 20)
        head = f"[shell {self.session_id} {self.state}] {self.cwd}$"
        body = "".join(t for _, t in pieces).rstrip("\n")
        return head + (f"\n({hidden} earlier lines hidden)" if hidden else "") + (f"\n{body}" if body else "")
