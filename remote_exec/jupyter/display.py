"""How the notebook face shows things: widget or plain text, the cell's output, short errors.

Plain text is used when ``REMOTE_EXEC_NONINTERACTIVE=1`` is set or no widget front end is
detected (no kernel: a terminal IPython, a script; or a kernel that no widget-rendering front end
started: nbclient, nbval, papermill, ``jupyter console``); ``=0`` forces widgets. In plain-text
mode a foreground cell prints its stdout, then its stderr, then its exit code: an order that
does not depend on timing, which is what nbval compares.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO, cast

from ..errors import JobInterrupted, RemoteCommandError
from ..protocol import JobInfo

__all__ = [
    "NONINTERACTIVE_ENV",
    "CellWriter",
    "JobInterrupted",
    "RemoteCommandError",
    "format_duration",
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


class CellWriter:
    """Writes a job's output into the running cell, from the cell's own thread only.

    Interactive: each chunk as it comes, stderr to stderr. Plain text: stdout as it comes,
    stderr held back to the end (so the two never interleave by timing), then the exit code.
    """

    def __init__(self, plain: bool, stdout: TextIO | None = None, stderr: TextIO | None = None) -> None:
        self.plain = plain
        self._out = stdout or sys.stdout
        self._err = stderr or sys.stderr
        self._held: list[str] = []

    def write(self, stream: str, text: str) -> None:
        if stream == "stdout":
            self._out.write(text)
            self._out.flush()
        elif self.plain:
            self._held.append(text)
        else:
            self._err.write(text)
            self._err.flush()

    def note(self, text: str) -> None:
        """A line of ours (not the job's), e.g. "interrupted: SIGINT sent"; to stderr."""
        self._err.write(text if text.endswith("\n") else text + "\n")
        self._err.flush()

    def finish(self, exit_line: str | None) -> None:
        """Flush held stderr and, in plain-text mode, print ``exit_line``."""
        if self._held:
            self._err.write("".join(self._held))
            self._held.clear()
            self._err.flush()
        if self.plain and exit_line:
            self._out.write(exit_line + "\n")
            self._out.flush()


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
