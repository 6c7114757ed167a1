"""How the notebook face shows things: widget or plain text, the cell's output, short errors.

Plain text is used when ``REMOTE_EXEC_NONINTERACTIVE=1`` is set or no widget front end is
detected (no kernel: a terminal IPython, a script; or a kernel that no widget-rendering front end
started: nbclient, nbval, papermill, ``jupyter console``); ``=0`` forces widgets. In plain-text
mode a foreground cell prints its stdout, then its stderr, then its exit code: an order that
does not depend on timing, which is what nbval compares. Text output is capped per stream
(:class:`CellWriter`): a flood shows its head, "N lines hidden" and its newest lines.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO, cast

from ..errors import JobInterrupted, RemoteCommandError
from ..protocol import JobInfo

__all__ = [
    "NONINTERACTIVE_ENV",
    "CappedText",
    "CellWriter",
    "JobInterrupted",
    "RemoteCommandError",
    "format_duration",
    "hidden_note",
    "jobs_table",
    "show",
    "widgets_enabled",
]

NONINTERACTIVE_ENV = "REMOTE_EXEC_NONINTERACTIVE"

WIDGET_FRONT_END_ENV = ("JPY_SESSION_NAME", "VSCODE_PID", "VSCODE_CWD", "COLAB_RELEASE_TAG")
"""Variables that front ends which render widgets set in their kernels' environment: Jupyter
Server (JupyterLab, Notebook 7, Voila...) sets ``JPY_SESSION_NAME``; VS Code and Colab theirs.
Headless runners (nbclient, nbval, papermill) and ``jupyter console`` set none of them."""


def _front_end_renders_widgets() -> bool:
    if any(os.environ.get(var) for var in WIDGET_FRONT_END_ENV):
        return True
    # A front end that loaded the widget state over the control comm surely renders widgets.
    widget_module = sys.modules.get("ipywidgets.widgets.widget")
    return getattr(getattr(widget_module, "Widget", None), "_control_comm", None) is not None


def widgets_enabled() -> bool:
    """True when a widget front end is listening: a kernel started by one, and no plain-text switch.

    ``REMOTE_EXEC_NONINTERACTIVE=1`` forces plain text; ``=0`` forces widgets (for a front end
    that renders them but is not detected, or a headless test). Without the switch, widgets
    need a kernel and a sign of a widget front end (:data:`WIDGET_FRONT_END_ENV`, or ipywidgets'
    control comm opened by the front end); otherwise output is plain text, which is what
    nbclient, nbval and ``jupyter console`` can show.
    """
    switch = os.environ.get(NONINTERACTIVE_ENV, "").strip().lower()
    if switch in ("1", "true", "yes", "on"):
        return False
    if switch in ("0", "false", "no", "off"):
        return True
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython comes with the jupyter extra
        return False
    shell = get_ipython()
    # Only a kernel (ipykernel's ZMQInteractiveShell has one) talks to a front end that may
    # render widgets; a terminal IPython or a plain InteractiveShell cannot.
    if shell is None or getattr(shell, "kernel", None) is None:
        return False
    return _front_end_renders_widgets()


def show(obj: object) -> None:
    """``IPython.display.display(obj)`` (typed: IPython's own signature is not)."""
    from IPython.display import display

    cast(Any, display)(obj)


TEXT_HEAD_LINES = 500
"""Lines of each stream a text-mode cell shows from the start (live, for stdout)."""

TEXT_TAIL_LINES = 500
"""The newest lines of each stream a text-mode cell shows at the end, after "N lines hidden"."""

TEXT_MAX_CHARS = 128 * 1024
"""Characters each of the head and the tail may hold (very long lines count here)."""


class CappedText:
    """One stream's text capped as a view caps it: the head, "N lines hidden", the newest lines.

    The first ``head_lines`` lines go to ``write`` as they come (``None``: held with the rest);
    after them only the newest ``tail_lines`` are kept, in memory bounded by ``max_chars``, and
    the lines between are counted. :meth:`finish` writes what was held.
    """

    def __init__(
        self,
        write: Callable[[str], None] | None,
        head_lines: int = TEXT_HEAD_LINES,
        tail_lines: int = TEXT_TAIL_LINES,
        max_chars: int = TEXT_MAX_CHARS,
    ) -> None:
        self._write = write
        self._head_lines = head_lines
        self._head_chars = max_chars
        self._tail_lines = tail_lines
        self._max_chars = max_chars
        self._held_head: list[str] = []
        self._tail = ""
        self.hidden = 0
        """Lines left out between the head and the tail."""

    def feed(self, text: str) -> None:
        if self._head_lines > 0 and self._head_chars > 0:
            piece = text[: self._head_chars]
            cut = -1
            for _ in range(self._head_lines):
                nxt = piece.find("\n", cut + 1)
                if nxt < 0:
                    break
                cut = nxt
                self._head_lines -= 1
            head = piece if self._head_lines > 0 else piece[: cut + 1]
            self._head_chars -= len(head)
            if head:
                if self._write is None:
                    self._held_head.append(head)
                else:
                    self._write(head)
            text = text[len(head) :]
        if text:
            self._tail += text
            if len(self._tail) > 2 * self._max_chars or self._tail.count("\n") > 2 * self._tail_lines:
                self._trim()  # amortised: at most every max_chars characters or tail_lines lines

    def _trim(self) -> None:
        tail = self._tail
        cut = len(tail) - 1 if tail.endswith("\n") else len(tail)  # an unfinished last line is a line
        for _ in range(self._tail_lines):
            cut = tail.rfind("\n", 0, cut)
            if cut < 0:
                break
        start = cut + 1 if cut >= 0 else 0
        if len(tail) - start > self._max_chars:  # still too big: whole lines from the end only
            nl = tail.find("\n", len(tail) - self._max_chars - 1)
            start = nl + 1 if 0 <= nl < len(tail) - 1 else len(tail) - self._max_chars
        self.hidden += tail.count("\n", 0, start)
        self._tail = tail[start:]

    def finish(self, write: Callable[[str], None], note: Callable[[int], str]) -> None:
        """Write the held head, ``note(hidden)`` when lines were left out, then the tail."""
        self._trim()
        head = "".join(self._held_head)
        if head:
            write(head)
        if self.hidden:
            if (head or self._write) and not (head or "\n").endswith("\n"):
                write("\n")
            write(note(self.hidden))
        if self._tail:
            write(self._tail)
        self._held_head.clear()
        self._tail = ""


def hidden_note(hidden: int, option: str = "--out") -> str:
    """The line a text-mode cell shows where it left lines out (``option`` keeps them all)."""
    return f"[remote_exec] ... {hidden:,} lines hidden ({option} VAR keeps the whole output) ...\n"


class CellWriter:
    """Writes a job's output into the running cell, from the cell's own thread only.

    Interactive: each chunk as it comes, stderr to stderr. Plain text: stdout as it comes,
    stderr held back to the end (so the two never interleave by timing), then the exit code.
    Both capped per stream (:class:`CappedText`): the first :data:`TEXT_HEAD_LINES` lines, then
    at the end "N lines hidden" and the newest :data:`TEXT_TAIL_LINES` lines. Jupyter drops a
    cell's output silently past 1 MB/s ("IOPub data rate exceeded"); this never comes near it.
    ``merged``: stderr goes to stdout as it is read (``2>&1``, one capped stream).
    """

    def __init__(
        self, plain: bool, stdout: TextIO | None = None, stderr: TextIO | None = None, *, merged: bool = False
    ) -> None:
        self.plain = plain
        self.merged = merged
        self._out = stdout or sys.stdout
        self._err = stderr or sys.stderr
        self._streams = {
            "stdout": CappedText(self._write_out),
            "stderr": CappedText(None if plain else self._write_err),
        }

    def _write_out(self, text: str) -> None:
        self._out.write(text)
        self._out.flush()

    def _write_err(self, text: str) -> None:
        self._err.write(text)
        self._err.flush()

    def write(self, stream: str, text: str) -> None:
        self._streams["stdout" if stream == "stdout" or self.merged else "stderr"].feed(text)

    @property
    def hidden(self) -> dict[str, int]:
        """Lines left out so far, per stream."""
        return {name: capped.hidden for name, capped in self._streams.items()}

    def note(self, text: str) -> None:
        """A line of ours (not the job's), e.g. "interrupted: SIGINT sent"; to stderr."""
        self._err.write(text if text.endswith("\n") else text + "\n")
        self._err.flush()

    def finish(self, exit_line: str | None) -> None:
        """Write what was held (the tails, plain mode's stderr) and, if given, ``exit_line``."""
        self._streams["stdout"].finish(self._write_out, hidden_note)
        self._streams["stderr"].finish(self._write_err, lambda n: hidden_note(n, "--err"))
        if exit_line:
            if self.plain:
                self._write_out(exit_line + "\n")
            else:
                self.note(exit_line)


def format_duration(seconds: float) -> str:
    """``0.4 s``, ``12 s``, ``3 min 04 s``, ``2 h 05 min``."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


def _command_text(command: list[str] | str, width: int = 48) -> str:
    text = command if isinstance(command, str) else " ".join(command)
    text = " ".join(text.split())  # one line: scripts and newlines would break the table
    return text if len(text) <= width else text[: width - 1] + "…"


def jobs_table(rows: Sequence[tuple[str, JobInfo]], now: float | None = None) -> str:
    """A plain-text table of ``(sandbox, job)`` rows, the dashboard for non-widget front ends."""
    now = time.time() if now is None else now
    header = ("sandbox", "job", "state", "exit", "elapsed", "out", "command")
    lines = [header]
    for url, job in rows:
        elapsed = (job.ended_at or now) - job.started_at
        code = "" if job.exit_code is None else str(job.exit_code)
        out = f"{job.stdout_bytes + job.stderr_bytes} B"
        lines.append((url, job.job_id, job.state, code, format_duration(elapsed), out, _command_text(job.command)))
    if len(lines) == 1:
        return "no jobs"
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in lines)
