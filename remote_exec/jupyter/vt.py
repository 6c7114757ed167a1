"""A terminal's output as a person saw it: the screen and scrollback a VT emulator draws from it.

A PTY job's bytes hold control sequences (cursor moves, OSC window titles, the alternate screen,
bracketed paste, redraws of a progress bar). Shown raw in a plain-text fallback, nbval's output
or a saved notebook they are garbage; :func:`render_screen` replays them through ``pyte`` (a
well-kept VT100/xterm emulator in pure Python) and returns the text lines it drew instead.

pyte is slow next to the terminal itself (a few MB/s), so it only ever sees a bounded tail
(:data:`RENDER_CHARS`), on demand, never the live stream.
"""

from __future__ import annotations

import copy
import sys
from typing import Any, TextIO

import pyte

__all__ = ["RENDER_CHARS", "ScreenWriter", "render_screen"]

RENDER_CHARS = 256 * 1024
"""Characters of the newest output replayed to render a screen (from a line start)."""


_ALTERNATE = {47, 1047, 1049}  # DEC private modes of the alternate screen (1049 saves the cursor too)


class _Screen(pyte.HistoryScreen):
    """pyte's screen with the alternate screen that ``vim``, ``less`` and ``top`` draw on: pyte
    ignores it, so what they drew would stay on screen after they exit; a terminal restores the
    main screen as it was."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._main: tuple[dict[int, Any], Any] | None = None
        super().__init__(*args, **kwargs)

    def set_mode(self, *modes: int, **kwargs: Any) -> None:
        if kwargs.get("private") and _ALTERNATE & set(modes) and self._main is None:
            self._main = ({y: copy.copy(line) for y, line in self.buffer.items()}, copy.copy(self.cursor))
            self.erase_in_display(2)
        super().set_mode(*modes, **kwargs)

    def reset_mode(self, *modes: int, **kwargs: Any) -> None:
        if kwargs.get("private") and _ALTERNATE & set(modes) and self._main is not None:
            (buffer, cursor), self._main = self._main, None
            self.buffer.clear()
            self.buffer.update(buffer)
            self.cursor = cursor
            self.dirty.update(range(self.lines))
        super().reset_mode(*modes, **kwargs)


def render_screen(text: str, cols: int = 80, rows: int = 24, *, history: int = 200, max_lines: int = 40) -> str:
    """The last ``max_lines`` lines of what a ``cols`` by ``rows`` terminal shows after ``text``.

    Scrollback (lines scrolled off the top, at most ``history``) comes first, then the screen;
    trailing blanks and empty lines at the bottom are left out. Only the newest
    :data:`RENDER_CHARS` characters are replayed, from a line start, so the cost is bounded.
    """
    if len(text) > RENDER_CHARS:
        cut = text.find("\n", len(text) - RENDER_CHARS)
        text = text[cut + 1 :] if cut >= 0 else text[-RENDER_CHARS:]
    screen = _Screen(max(cols, 2), max(rows, 2), history=history, ratio=0.5)
    # The PTY translates "\n" to "\r\n" (onlcr) and so does a real terminal's output: pyte's LNM
    # mode does the same for text that never went through a PTY.
    screen.set_mode(pyte.modes.LNM)
    pyte.Stream(screen).feed(text)
    above = ["".join(ch.data for ch in line.values()) for line in screen.history.top]
    lines = [*(line.rstrip() for line in above), *(line.rstrip() for line in screen.display)]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines[-max_lines:])


class ScreenWriter:
    """A PTY cell's output in plain text (nbval, ``--no-widget``): the rendered screen at the end.

    A terminal's raw bytes printed as they come would put control sequences into the notebook;
    so the newest output is kept (bounded) and :meth:`finish` writes what a terminal showed.
    The interface is :class:`~remote_exec.jupyter.display.CellWriter`'s.
    """

    def __init__(self, cols: int = 80, rows: int = 24, stdout: TextIO | None = None, stderr: TextIO | None = None):
        self._size = (cols, rows)
        self._out = stdout or sys.stdout
        self._err = stderr or sys.stderr
        self._text = ""

    def write(self, stream: str, text: str) -> None:
        self._text += text
        if len(self._text) > 2 * RENDER_CHARS:  # amortised: render_screen reads the newest only
            self._text = self._text[-RENDER_CHARS:]

    def note(self, text: str) -> None:
        """A line of ours (not the job's), e.g. "interrupted: SIGINT sent"; to stderr."""
        self._err.write(text if text.endswith("\n") else text + "\n")
        self._err.flush()

    def finish(self, exit_line: str | None) -> None:
        """Write the rendered screen and, if given, ``exit_line``."""
        screen = render_screen(self._text, *self._size)
        self._out.write(screen + "\n" if screen else "")
        if exit_line:
            self._out.write(exit_line + "\n")
        self._out.flush()
