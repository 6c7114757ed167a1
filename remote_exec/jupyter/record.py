"""A job view's stored record: what a saved notebook shows where no kernel or widget model is.

A view's output bundle holds, beside the widget, a ``text/plain`` and a ``text/html`` record
(state, exit code, duration, command, the tail of each stream), kept fresh in a draft output
beside it while the job runs and written into the view's own output at its end
(:class:`RecordedDisplay`). GitHub, nbviewer and ``jupyter nbconvert`` show the HTML; it is plain
inline-styled HTML (no script, no class a stylesheet must supply) because those renderers strip
the rest. ANSI colours are kept: SGR sequences become ``<span style=...>``, others are dropped.
"""

from __future__ import annotations

import contextlib
import html
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from ..client.ends import end_words
from .display import format_duration
from .saving import DRAFT_MIME, RECORD_DRAFT, RECORD_META
from .trust import attach_hint

__all__ = [
    "HOLD_MAX",
    "RECORD_LINES",
    "RECORD_LINE_CHARS",
    "JobRecord",
    "RecordedDisplay",
    "ansi_to_html",
    "as_reply_to",
    "current_parent",
    "jobs_html",
    "tail_lines",
]

HOLD_MAX = 30.0
"""Seconds a view's hold on its record's rewrites lasts without a release (see RecordedDisplay.hold)."""

RECORD_LINES = 40
"""Lines of each stream a record keeps (the newest)."""

RECORD_LINE_CHARS = 400
"""Characters a record keeps of one line (a record is small whatever the job printed)."""

_COLOURS = ["#000000", "#cd3131", "#0d7d2c", "#b58900", "#2472c8", "#bc3fbc", "#11a8cd", "#7f7f7f"]
_BRIGHT = ["#666666", "#f14c4c", "#23d18b", "#d7ba00", "#3b8eea", "#d670d6", "#29b8db", "#e5e5e5"]
_SGR = re.compile(r"\x1b\[([0-9;]*)m")
_OTHER = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_STATE_COLOURS = {"running": "#2472c8", "completed": "#0d7d2c", "failed": "#cd3131", "disconnected": "#7f7f7f"}


def _colour(code: int, codes: list[int], i: int) -> tuple[str | None, int]:
    """The CSS colour of an SGR colour code at ``codes[i]`` (38/48 take more), and the next index."""
    if 30 <= code <= 37 or 40 <= code <= 47:
        return _COLOURS[code % 10], i + 1
    if 90 <= code <= 97 or 100 <= code <= 107:
        return _BRIGHT[code % 10], i + 1
    if codes[i + 1 : i + 2] == [5] and i + 2 < len(codes):  # 38;5;N: 256 colours (the first 16 here)
        n = codes[i + 2]
        return (_COLOURS[n] if n < 8 else _BRIGHT[n - 8] if n < 16 else None), i + 3
    if codes[i + 1 : i + 2] == [2] and i + 4 < len(codes):  # 38;2;R;G;B
        r, g, b = (max(0, min(255, c)) for c in codes[i + 2 : i + 5])
        return f"#{r:02x}{g:02x}{b:02x}", i + 5
    return None, i + 1


def ansi_to_html(text: str) -> str:
    """``text`` escaped for HTML, its SGR colours, bold and underline as inline-styled spans."""
    out: list[str] = []
    fg: str | None = None
    bg: str | None = None
    bold = underline = False
    pos = 0
    for m in _SGR.finditer(text):
        out.append(_span(html.escape(_OTHER.sub("", text[pos : m.start()])), fg, bg, bold, underline))
        pos = m.end()
        codes = [int(c) if c else 0 for c in m.group(1).split(";")]
        i = 0
        while i < len(codes):
            code = codes[i]
            if code == 0:
                fg = bg = None
                bold = underline = False
            elif code == 1:
                bold = True
            elif code == 22:
                bold = False
            elif code == 4:
                underline = True
            elif code == 24:
                underline = False
            elif code == 39:
                fg = None
            elif code == 49:
                bg = None
            elif 30 <= code <= 38 or 90 <= code <= 97:
                fg, i = _colour(code, codes, i)
                continue
            elif 40 <= code <= 48 or 100 <= code <= 107:
                bg, i = _colour(code, codes, i)
                continue
            i += 1
    out.append(_span(html.escape(_OTHER.sub("", text[pos:])), fg, bg, bold, underline))
    return "".join(out)


def _span(text: str, fg: str | None, bg: str | None, bold: bool, underline: bool) -> str:
    style = ";".join(
        s
        for s in (
            f"color:{fg}" if fg else "",
            f"background:{bg}" if bg else "",
            "font-weight:bold" if bold else "",
            "text-decoration:underline" if underline else "",
        )
        if s
    )
    return f'<span style="{style}">{text}</span>' if style and text else text


def tail_lines(text: str, lines: int = RECORD_LINES) -> tuple[str, int]:
    """The newest ``lines`` lines of ``text`` as a terminal shows them (a ``\\r`` rewrites its
    line), each cut to :data:`RECORD_LINE_CHARS`; and how many earlier lines were left out."""
    rows = text.split("\n")
    if rows and rows[-1] == "":
        rows.pop()
    hidden = max(0, len(rows) - lines)
    kept = [row.rstrip("\r").rsplit("\r", 1)[-1][:RECORD_LINE_CHARS] for row in rows[hidden:]]
    return "\n".join(kept), hidden


@dataclass(frozen=True)
class JobRecord:
    """A snapshot of a job as its view knows it."""

    job_id: str
    command: str
    sandbox: str
    state: str
    exit_code: int | None
    duration: float
    stdout: tuple[str, int]
    """The newest output and how many earlier lines are not in it."""
    stderr: tuple[str, int]
    as_of: float | None = None
    """When a running job was last seen running (seconds since the epoch): what the record can
    vouch for once its kernel is gone."""

    def _running_note(self) -> str:
        """``running as of 2026-11-27 16:02:05`` (a running job's record: true as of then)."""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.as_of)) if self.as_of else None
        return f"running as of {when}" if when else "recorded while running"

    def _head(self) -> str:
        how = end_words(self.state, self.exit_code)
        code = f", {how}" if how else ""
        first = self.command.strip().splitlines()[0] if self.command.strip() else ""
        more = " …" if "\n" in self.command.strip() else ""
        return f"[{self.state}] {first}{more}  (job {self.job_id}, {format_duration(self.duration)}{code})"

    def plain(self) -> str:
        lines = [self._head()]
        for stream, (text, before) in (("stdout", self.stdout), ("stderr", self.stderr)):
            tail, hidden = tail_lines(_OTHER.sub("", text))
            hidden += before
            if tail:
                more = f", {hidden} earlier lines hidden" if hidden else ""
                lines += [f"--- {stream}{more} ---", tail]
        hint = attach_hint(self.job_id, self.sandbox)
        if self.state == "running":
            lines.append(f"({self._running_note()}; in a live kernel: {hint})" if hint else f"({self._running_note()})")
        return "\n".join(lines)

    def html(self) -> str:
        colour = _STATE_COLOURS.get(self.state, "#b58900")
        mono = "font-family:monospace;font-size:12px"
        how = end_words(self.state, self.exit_code)
        code = f" · {how}" if how else ""
        parts = [
            # Renderers typeset $...$ in HTML as maths (JupyterLab's MathJax): commands are not.
            f'<div data-remote-exec-record="{html.escape(self.job_id)}" class="tex2jax_ignore mathjax_ignore" '
            'style="border:1px solid #ccc;border-radius:4px;padding:6px;max-width:100%">',
            f'<div><span style="background:{colour};color:#fff;border-radius:3px;padding:0 6px">'
            f"{html.escape(self.state)}</span> ",
            f'<code style="{mono}">{html.escape(self.command.strip()[:2000])}</code></div>',
            f'<div style="color:#666;font-size:12px">job {html.escape(self.job_id)}'
            f"{' · ' + html.escape(self.sandbox) if self.sandbox else ''} · "
            f"{format_duration(self.duration)}{code}</div>",
        ]
        for stream, (text, before) in (("stdout", self.stdout), ("stderr", self.stderr)):
            tail, hidden = tail_lines(text)
            hidden += before
            if not tail:
                continue
            more = f" ({hidden:,} earlier lines hidden)" if hidden else ""
            parts.append(f'<div style="font-size:12px;margin-top:4px"><b>{stream}</b>{more}</div>')
            parts.append(
                f'<pre style="{mono};margin:0;padding:4px;background:#f7f7f7;white-space:pre-wrap;'
                f'max-height:30em;overflow:auto">{ansi_to_html(tail)}</pre>'
            )
        hint = attach_hint(self.job_id, self.sandbox)
        if self.state == "running":
            follow = f" To follow it live from a running kernel: <code>{html.escape(hint)}</code>" if hint else ""
            note = self._running_note()
            parts.append(
                f'<div style="color:#666;font-size:12px;margin-top:4px">{note[0].upper() + note[1:]}.{follow}</div>'
            )
        parts.append("</div>")
        return "".join(parts)


def jobs_html(rows: Sequence[Mapping[str, Any]], sandboxes: Sequence[str], note: str) -> str:
    """A dashboard's record: its rows (as :func:`~remote_exec.jupyter.dashboard_view.job_row` and
    ``session_row`` make them) as an inline-styled table, with ``note`` (when, what is hidden)."""
    now = time.time()
    cell = "padding:1px 6px;text-align:left;border-bottom:1px solid #eee"
    head = "".join(f'<th style="{cell}">{h}</th>' for h in ("job", "state", "exit", "elapsed", "command", "last line"))
    body = []
    for r in rows:
        ident = r.get("job_id") or f"shell {r.get('session', '')} ({r.get('count', 0)} commands)"
        if len(sandboxes) > 1:
            ident = f"{ident} · {sandboxes[int(r.get('sandbox', 0))]}"
        state = str(r.get("state", ""))
        colour = _STATE_COLOURS.get(state, "#b58900")
        code = "" if r.get("exit_code") is None else str(r["exit_code"])
        elapsed = format_duration((r.get("ended_at") or now) - float(r.get("started_at", now)))
        values = [html.escape(str(ident)), f'<span style="color:{colour}">{html.escape(state)}</span>', code, elapsed]
        values += [html.escape(str(r.get("command", ""))[:200]), html.escape(str(r.get("tail", ""))[:200])]
        body.append("<tr>" + "".join(f'<td style="{cell}">{v}</td>' for v in values) + "</tr>")
    table = (
        f'<table style="border-collapse:collapse;font-size:12px"><tr>{head}</tr>{"".join(body)}</table>'
        if body
        else "<div>no jobs</div>"
    )
    return (
        '<div data-remote-exec-record="jobs" class="tex2jax_ignore mathjax_ignore" '
        'style="border:1px solid #ccc;border-radius:4px;padding:6px;max-width:100%">'
        f'<div style="color:#666;font-size:12px">Jobs in {html.escape(", ".join(sandboxes))}: '
        f"{html.escape(note)}</div>{table}</div>"
    )


def _display_pub() -> Any:
    from IPython.core.getipython import get_ipython

    return getattr(get_ipython(), "display_pub", None)


def current_parent() -> dict[str, Any] | None:
    """The header of the request being executed (ipykernel), else ``None``."""
    header = getattr(_display_pub(), "parent_header", None)
    return dict(header) if isinstance(header, dict) and header else None


@contextlib.contextmanager
def as_reply_to(parent: dict[str, Any] | None) -> Iterator[None]:
    """Publish from this thread as a reply to ``parent`` (from :func:`current_parent`).

    JupyterLab routes an ``update_display_data`` only to the output area of the request it
    replies to; from another thread ipykernel would use the newest request's header, so once
    another cell ran, the record of the view's own cell would stop changing.
    """
    pub = _display_pub()
    if parent is None or not hasattr(pub, "set_thread_parent"):  # ipykernel < 6.29: best effort
        yield
        return
    token = pub.set_thread_parent(parent)
    try:
        yield
    finally:
        pub.reset_thread_parent(token)


Bundle = tuple[dict[str, Any], dict[str, Any]]


class RecordedDisplay:
    """One displayed view (a job's, a shell's, a dashboard's) and its record, kept fresh beside it.

    :meth:`show` displays ``bundle()`` (the widget beside its record, and the metadata that marks
    the record for the saver) under a display id, and after it a *draft*: an output that shows
    nothing and carries the newest record in its metadata. :meth:`update` rewrites the draft, as
    a reply to the request that showed the view (see :func:`as_reply_to`), from any thread; the
    view's own output is left alone until :meth:`update` is ``final``. JupyterLab's widget
    renderer makes a new view for every rewrite of a widget's output, which lost a click, a
    field's focus, a terminal's and a pane's scroll; a draft's rewrite touches no view. The
    server's saver (saving.py) moves a draft's record into its view's output, so a notebook saved
    at any moment (a kernel killed a second later) holds a record as fresh as the last draft.
    Shown again (a reloaded page), the newest output is the one rewritten.
    """

    def __init__(self, bundle: Callable[[], Any]) -> None:
        self._repr = bundle  # a _repr_mimebundle_: data, or (data, metadata)
        self.display_id: str | None = None
        self._parent: dict[str, Any] | None = None
        self._held_until = 0.0  # (monotonic) see hold()
        self._pending = False
        # show() runs on the kernel's thread, update() on the loop's, hold() on either: one at a
        # time, so a final update cannot go out before the output it rewrites (the front end
        # drops it, and "running" would stay), nor a release miss a final pending meanwhile.
        self._lock = threading.RLock()

    def hold(self, on: bool) -> None:
        """A person presses or types in a view of this output (its front end says so): the final
        rewrite of the view's own output waits until the hold ends (a rewrite makes a new view,
        and Chromium drops a click whose mousedown node left the page). A hold whose release
        never comes (a closed page) lapses after :data:`HOLD_MAX` seconds."""
        with self._lock:
            self._held_until = time.monotonic() + HOLD_MAX if on else 0.0
            if not on and self._pending:
                self.update(final=True)

    def _bundle(self) -> Bundle:
        bundle = self._repr()
        data, meta = bundle if isinstance(bundle, tuple) else (bundle, {})
        meta = dict(meta or {})
        if isinstance(meta.get(RECORD_META), dict) and self.display_id is not None:
            # the saver pairs the view's output with its draft by this id
            meta[RECORD_META] = {**meta[RECORD_META], "display": self.display_id}
        return data, meta

    def _draft(self, with_record: bool) -> Bundle:
        draft: dict[str, Any] = {"for": self.display_id}
        if with_record:
            data, meta = self._bundle()
            record = {k: data[k] for k in ("text/html", "text/plain") if isinstance(data.get(k), str)}
            draft.update(data=record, mark=meta.get(RECORD_META))
        # text/plain for front ends without the JupyterLab extension: an empty line at most
        return {"text/plain": "", DRAFT_MIME: {}}, {RECORD_DRAFT: draft}

    @property
    def shown(self) -> bool:
        """Whether :meth:`show` ran (the record has an output to rewrite)."""
        return self.display_id is not None

    def show(self, display_id: str) -> None:
        """Display the bundle in the output of the request running now, and its draft after it."""
        from IPython.display import display

        with self._lock:
            self._parent = current_parent()  # before the id: an update from the loop thread uses both
            self.display_id = display_id
            data, meta = self._bundle()
            cast(Any, display)(data, metadata=meta, raw=True, display_id=display_id)
            draft, draft_meta = self._draft(with_record=False)
            cast(Any, display)(draft, metadata=draft_meta, raw=True, display_id=f"{display_id}-draft")

    def update(self, *, final: bool = False) -> None:
        """Write the newest record into the draft; ``final`` (the job ended): into the view's own
        output, once, and empty the draft. A final held by a press or typing goes into the draft
        at once (what a save keeps) and into the view's output at the release. Nothing if never
        shown; a kernel on its way out keeps the outputs as they were."""
        with self._lock:
            self._update(final)

    def _update(self, final: bool) -> None:
        if self.display_id is None:
            return
        from IPython.display import update_display

        if final and time.monotonic() < self._held_until:
            self._pending = True  # into the view's output when the hold ends
            final = False
        with contextlib.suppress(Exception), as_reply_to(self._parent):
            if final:
                self._pending = False
                data, meta = self._bundle()
                cast(Any, update_display)(data, metadata=meta, raw=True, display_id=self.display_id)
            draft, draft_meta = self._draft(with_record=not final)
            cast(Any, update_display)(draft, metadata=draft_meta, raw=True, display_id=f"{self.display_id}-draft")
