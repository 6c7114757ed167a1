"""``TerminalView``: a PTY job in a real terminal emulator (xterm.js) in the notebook.

What the job writes goes to the browser raw, as the PTY produced it (colours, cursor moves,
full-screen programs), in ``delta`` messages paced like every view's but in short rounds, so a
keystroke's echo is not held back. Keystrokes come back as ``input`` messages and are written to
the job's stdin in order; the view's width (fit to the cell) comes back as ``resize`` and sets
the PTY's size. Each view replays the kept tail on ``hello``, so a second view of the widget, or
a view of the same job from another kernel (:meth:`TerminalView.attach`), shows the same screen.

Where no widget renders (nbval, a saved notebook, GitHub), the view's text is the *rendered*
screen (:func:`~remote_exec.jupyter.vt.render_screen`): control sequences never show as garbage.
"""

from __future__ import annotations

import asyncio
import os
import stat
import threading
import time
from typing import Any

import traitlets

from ..blocking import BlockingExecRemoteProcess
from ..errors import JobNotRunningError, RemoteExecError
from ._assets import css, esm
from .controls import control_dir, private_dir
from .job_view import JobView
from .transcript import RateLimit
from .vt import RENDER_CHARS, render_screen

__all__ = ["DEFAULT_SIZE", "INPUT_LIMIT", "MAX_COLS", "MAX_ROWS", "TerminalView", "start_cols"]

DEFAULT_SIZE = (80, 24)
"""Columns and rows of a terminal before its view has measured the cell."""

INPUT_LIMIT = 1024 * 1024
"""Characters of keystrokes (a paste) waiting for the job's stdin at most; more is refused."""

MAX_COLS, MAX_ROWS = 500, 200

_measured: dict[str, int | None] = {"cols": None}  # the width a page last measured a terminal at (see start_cols)
MIN_MEASURED = 20  # narrower is a collapsed or hidden view, not the notebook's width
MEASURE_FILE = "terminal-cols"
"""Beside the kernels' control sockets (a private directory): the width last measured by any
kernel of this user's, so a new kernel's first terminal starts at it too."""


def start_cols() -> int:
    """Columns a new terminal starts at: the width a page last measured one of this kernel's
    terminals at (a notebook's cells are one width), else the one any kernel of this user's last
    measured, else 80. A job's first lines (``ls``, a prompt, ``tput cols``) are then laid out for
    the view that shows them; a view measured otherwise resizes the PTY as it renders."""
    cols = _measured["cols"]
    if cols is None:
        cols = _measured["cols"] = _saved_cols() or DEFAULT_SIZE[0]
    return cols


def _saved_cols() -> int | None:
    """The width in :data:`MEASURE_FILE`, or ``None``: it must be a small regular file of this
    user's holding a width in bounds (the directory is private; checked anyway)."""
    try:
        fd = os.open(control_dir() / MEASURE_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                return None
            cols = int(os.read(fd, 8).strip() or b"0")
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return None
    return cols if MIN_MEASURED <= cols <= MAX_COLS else None


def _remember_cols(cols: int) -> None:
    if _measured["cols"] == cols:
        return
    _measured["cols"] = cols
    try:  # best effort: a read-only runtime dir only costs the next kernel its first width
        directory = private_dir(control_dir())
        temporary = directory / f".{MEASURE_FILE}.{os.getpid()}"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, str(cols).encode())
        finally:
            os.close(fd)
        os.replace(temporary, directory / MEASURE_FILE)
    except OSError:
        pass


class TerminalView(JobView):
    """A live terminal on a PTY job (``sb.exec_remote(cmd, tty=True)``): type into it, resize it.

    Takes the parameters of :class:`JobView`, plus:

    :param rows: the terminal's height in rows (its width follows the cell's).
    """

    PANES = {"stdout": "main", "stderr": "main"}  # noqa: RUF012 - a ClassVar of the base
    _esm = esm("terminal_view")
    _css = css("terminal_view")

    cols = traitlets.Int(DEFAULT_SIZE[0]).tag(sync=True)
    rows = traitlets.Int(DEFAULT_SIZE[1]).tag(sync=True)
    lines = traitlets.Int(0).tag(sync=True)
    convert_eol = traitlets.Bool(False).tag(sync=True)
    """A job without a PTY writes bare ``\\n``: the terminal then returns to the line start too."""

    def __init__(self, proc: BlockingExecRemoteProcess, *, rows: int | None = None, **kwargs: Any) -> None:
        info = proc.async_process.info
        size = proc.async_process.options.tty_size or DEFAULT_SIZE
        # Before JobView's __init__: it starts following the job, whose output may come at once.
        self._keys: list[str] = []
        self._keys_size = 0
        self._typist: asyncio.Task[None] | None = None
        self._size_wanted: tuple[int, int] | None = None
        self._sizer: asyncio.Task[None] | None = None
        self._rendered: tuple[int, str] = (-1, "")
        self._output = threading.Event()  # set on new output: what expect() waits on
        super().__init__(
            proc,
            cols=max(2, min(int(size[0]), MAX_COLS)),
            rows=max(2, min(int(rows or size[1]), MAX_ROWS)),
            stdin_open=info.stdin_open if info is not None else True,  # a PTY takes keystrokes
            convert_eol=not proc.tty,
            **kwargs,
        )

    def _rate_limit(self) -> RateLimit:
        # Keystrokes echo within a round: up to 100 short rounds a second (a JobView's 10 would
        # add up to 100 ms to every echo). OUTPUT_RATE still caps the bytes.
        return RateLimit(max_messages=100, min_gap=0.005)

    def _emit(self, stream: str, text: str) -> None:
        super()._emit(stream, text)
        self._output.set()

    # -- from the front end (main thread: handed to the loop) -----------------------------------

    def _action(self, kind: str, content: dict[str, Any]) -> None:
        if kind == "input" and isinstance(content.get("data"), str):
            self._loop.call_soon(self._type, content["data"])
        elif kind == "resize":
            cols, rows = content.get("cols"), content.get("rows")
            if isinstance(cols, int) and isinstance(rows, int) and cols > 0 and rows > 0:
                cols, rows = min(cols, MAX_COLS), min(rows, MAX_ROWS)
                if cols >= MIN_MEASURED:  # a page's measure (not a collapsed or hidden view's)
                    _remember_cols(cols)
                self._loop.call_soon(self._want_size, cols, rows)
        else:
            super()._action(kind, content)

    # -- keystrokes and size (loop thread) ------------------------------------------------------

    def _type(self, data: str) -> None:
        if self._done.is_set() or not self.stdin_open:
            return
        if self._keys_size + len(data) > INPUT_LIMIT:
            self._set(error=f"input dropped: more than {INPUT_LIMIT:,} characters waiting for the job")
            return
        self._keys.append(data)
        self._keys_size += len(data)
        if self._typist is None:
            self._typist = asyncio.get_running_loop().create_task(self._send_keys())

    async def _send_keys(self) -> None:
        # One writer, so keystrokes reach the job in the order they were typed; what was typed
        # while a write was under way goes in the next one.
        proc = self._control_proc.async_process
        try:
            while self._keys:
                data, self._keys, self._keys_size = "".join(self._keys), [], 0
                await proc.write_stdin(data)
        except JobNotRunningError:
            self._keys, self._keys_size = [], 0
            self._set(stdin_open=False)  # it ended, or its stdin was closed
        except RemoteExecError as exc:
            self._keys, self._keys_size = [], 0
            self._set(error=f"input failed: {exc}")
        finally:
            self._typist = None

    def _want_size(self, cols: int, rows: int) -> None:
        self._size_wanted = (cols, rows)
        self._set(cols=cols, rows=rows)
        if self._sizer is None and not self._done.is_set():
            self._sizer = asyncio.get_running_loop().create_task(self._apply_size())

    async def _apply_size(self) -> None:
        # The newest size wins: a window dragged narrower sends many; the PTY needs the last.
        proc = self._control_proc.async_process
        try:
            while self._size_wanted is not None:
                (cols, rows), self._size_wanted = self._size_wanted, None
                await proc.resize(cols, rows)
        except JobNotRunningError:
            pass  # it ended meanwhile
        except RemoteExecError as exc:
            self._set(error=f"resize failed: {exc}")
        finally:
            self._sizer = None

    # -- Python side ----------------------------------------------------------------------------

    def send_keys(self, data: str) -> None:
        """Type ``data`` into the terminal, as keystrokes from a view would (returns at once)."""
        self._loop.call_soon(self._type, data)

    def resize(self, cols: int, rows: int) -> None:
        """Set the terminal's size, as a view whose cell changed width does; returns once the PTY
        has it (the job got SIGWINCH)."""
        self._loop.call(self._resize_now, max(2, min(cols, MAX_COLS)), max(2, min(rows, MAX_ROWS)))

    async def _resize_now(self, cols: int, rows: int) -> None:
        # Cancelling this leaves the resize under way (shielded): the newest size still wins.
        self._want_size(cols, rows)
        if self._sizer is not None:
            await asyncio.shield(self._sizer)

    def expect(self, text: str, timeout: float = 30.0) -> bool:
        """Wait until the rendered screen shows ``text`` (as pexpect's ``expect``, for scripts and
        notebooks that answer a prompt); ``False`` if ``timeout`` passed or the job ended first."""
        deadline = time.monotonic() + timeout
        while True:
            self._output.clear()
            if text in self.screen():
                return True
            if self._done.is_set() or not self._output.wait(max(0.0, deadline - time.monotonic())):
                return text in self.screen()

    def screen(self) -> str:
        """What the terminal shows now, as text: its scrollback's newest lines, then the screen."""
        received = sum(self._transcript.chars.values())
        if self._rendered[0] != received:  # pyte is slow: render once per change
            pieces, _ = self._transcript.tail("main", self.tail_lines, RENDER_CHARS)
            self._rendered = (received, render_screen("".join(t for _, t in pieces), self.cols, self.rows))
        return self._rendered[1]

    def _tail(self, stream: str) -> tuple[str, int]:
        # The stored record (and plain text) show the rendered screen: never control sequences.
        return (self.screen(), 0) if stream == "stdout" else ("", 0)

    def _counters(self) -> dict[str, Any]:
        chars = self._transcript.chars
        return {"stdout_chars": chars["stdout"] + chars["stderr"], "lines": self._transcript.newlines["main"]}
