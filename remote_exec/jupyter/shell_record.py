"""A shell view's stored record: what a saved notebook shows of a shell session, with no kernel.

As a job view's (:mod:`~remote_exec.jupyter.record`): plain inline-styled HTML beside the widget,
kept fresh after each command in a draft beside the view, that the saver moves into the view's
output in place of the widget. It holds the newest
lines of the transcript (commands typed, their output, the shell's notes), the session's id,
sandbox, cwd and state, and for an open session "open as of <time>" and the magic that shows it
again from a running kernel.
"""

from __future__ import annotations

import html
import time
from collections.abc import Sequence
from dataclasses import dataclass

from .record import RECORD_LINE_CHARS, RECORD_LINES, ansi_to_html
from .trust import shell_hint

__all__ = ["ShellRecord"]

_KIND_STYLES = {
    "command": "font-weight:600",
    "stderr": "color:#cd3131",
    "info": "color:#777;font-style:italic",
}


@dataclass(frozen=True)
class ShellRecord:
    """A snapshot of a shell session as its view knows it."""

    session_id: str
    sandbox: str
    cwd: str
    state: str
    """``open`` or ``closed``."""
    pieces: Sequence[Sequence[str]]
    """The newest transcript, as ``(kind, text)``: ``command``, ``stdout``, ``stderr``, ``info``, ``stdin``."""
    hidden: int
    """Earlier transcript lines not in ``pieces``."""
    as_of: float

    def _lines(self) -> tuple[list[tuple[str, str]], int]:
        """The transcript's newest :data:`RECORD_LINES` lines, each cut to :data:`RECORD_LINE_CHARS`,
        and how many earlier lines are left out."""
        lines = [
            (kind, row.rsplit("\r", 1)[-1][:RECORD_LINE_CHARS])
            for kind, text in self.pieces
            for row in text.splitlines()
        ]
        return lines[-RECORD_LINES:], self.hidden + max(0, len(lines) - RECORD_LINES)

    def _note(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.as_of))
        return f"open as of {when}" if self.state == "open" else f"closed (recorded {when})"

    def plain(self) -> str:
        head = f"[shell {self.session_id} {self.state}] {self.cwd}$  ({self.sandbox}; {self._note()})"
        lines, hidden = self._lines()
        more = [f"({hidden:,} earlier lines hidden)"] if hidden else []
        return "\n".join([head, *more, *(text for _, text in lines)])

    def html(self) -> str:
        mono = "font-family:monospace;font-size:12px"
        colour = "#2472c8" if self.state == "open" else "#7f7f7f"
        lines, hidden = self._lines()
        rows = []
        for kind, text in lines:
            style = _KIND_STYLES.get(kind, "")
            rows.append(f'<span style="{style}">{ansi_to_html(text)}</span>' if style else ansi_to_html(text))
        hint = shell_hint(self.session_id, self.sandbox) if self.state == "open" else None
        again = f"To show it again from a running kernel: <code>{html.escape(hint)}</code>" if hint else ""
        more = f'<div style="color:#666;font-size:12px">({hidden:,} earlier lines hidden)</div>' if hidden else ""
        body = "\n".join(rows)
        return (
            f'<div data-remote-exec-record="shell-{html.escape(self.session_id)}" class="tex2jax_ignore '
            'mathjax_ignore" style="border:1px solid #ccc;border-radius:4px;padding:6px;max-width:100%">'
            f'<div><span style="background:{colour};color:#fff;border-radius:3px;padding:0 6px">'
            f"shell {html.escape(self.state)}</span> "
            f'<code style="{mono}">{html.escape(self.cwd)}$</code></div>'
            f'<div style="color:#666;font-size:12px">session {html.escape(self.session_id)} · '
            f"{html.escape(self.sandbox)} · {html.escape(self._note())}</div>{more}"
            f'<pre style="{mono};margin:0;padding:4px;background:#f7f7f7;white-space:pre-wrap;'
            f'max-height:30em;overflow:auto">{body}</pre>'
            f'<div style="color:#666;font-size:12px;margin-top:4px">{again}</div></div>'
        )
