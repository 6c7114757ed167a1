"""``StreamWidget``: the base of the widgets that show streamed text (a job, a shell).

Threading, by construction: after ``__init__`` every trait change and every message of a
widget is made on the blocking API's loop thread. Messages from the front end arrive on the
kernel's main thread and are only handed over (``Loop.call_soon`` / ``Loop.spawn``), so no two
threads ever touch a widget's sync state at once.

Traffic: output goes out as ``{kind, seq, data}`` custom messages holding only new text
(``delta``), in rounds paced by :class:`~remote_exec.jupyter.transcript.RateLimit` (at most
10 messages a second, state updates included). Nothing is sent until a view says ``hello``
(or the widget is ``live``); a ``hello`` is answered with a ``replay`` of the kept tail,
because messages sent before a view existed are lost to it (``for``: the view that asked, when
it carries a ``viewer`` id; the output not yet sent goes first as a delta, so the views already
showing it may skip the replay).

Bytes are bounded too: Jupyter Server drops a kernel's output for a while once it sends more
than 1 MB/s (``iopub_data_rate_limit``, "IOPub data rate exceeded"), comm messages included.
So a widget sends at most :data:`OUTPUT_RATE` characters of output in any second: a round whose
new text would go over sends a ``replay`` of the newest lines instead (at most
:data:`FLOOD_CHARS`, the lines skipped counted as hidden). A flood shows its end and how much
was skipped; Copy/Download still get everything kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections import deque
from typing import Any, ClassVar

import anywidget
import traitlets

from .controls import ack_control, enable_controls
from .display import widgets_enabled
from .follow import Loop
from .transcript import DEFAULT_TAIL_LINES, RateLimit, Transcript, strip_ansi

__all__ = [
    "COUNTER_PERIOD",
    "EARLIER_CHARS",
    "EARLIER_LINES",
    "FLOOD_CHARS",
    "OUTPUT_RATE",
    "REPLAY_CHARS",
    "InOrder",
    "StreamWidget",
]

COUNTER_PERIOD = 1.0
"""Seconds between updates of live counters (byte counts) while output flows."""

OUTPUT_RATE = 600_000
"""Characters of output a widget sends in any one second, deltas and replays (Jupyter Server's
limit is 1 MB/s averaged over 3 s; the rest is left for other output)."""

FLOOD_CHARS = 16 * 1024
"""The size of the newest-lines replay that replaces a delta over :data:`OUTPUT_RATE` (10 rounds
a second at most: under 200 KB/s even when the rate is used up)."""

REPLAY_CHARS = 512 * 1024
"""The largest replay a view's ``hello`` gets (once per view: within the server's 3 s window)."""

EARLIER_LINES = 2000
EARLIER_CHARS = 512 * 1024
"""Lines (and characters) one press of a pane's "earlier lines" brings above what it shows."""


class InOrder:
    """Messages of each view back in the order it sent them (keystrokes, stdin lines).

    ipykernel (7.x) may handle a comm message that arrives while another shell message holds the
    kernel before one that came earlier, so typed keys could reach the job swapped. A view
    numbers what must keep its order (``{"view": id, "n": 0, 1, ...}``); a message ahead of its
    turn waits (at most :attr:`MAX_WAITING` per view: past that the gap is given up on).
    Messages without a number pass at once.
    """

    MAX_WAITING = 1000

    def __init__(self) -> None:
        self._next: dict[str, int] = {}
        self._lock = threading.Lock()  # the comm's messages come on the main thread, the socket's on the loop
        self._waiting: dict[str, dict[int, dict[str, Any]]] = {}

    def take(self, msg: dict[str, Any]) -> list[dict[str, Any]]:
        """The messages that may be handled now, in order, ``msg`` among them or kept for later."""
        with self._lock:
            return self._take(msg)

    def _take(self, msg: dict[str, Any]) -> list[dict[str, Any]]:
        view, n = msg.get("view"), msg.get("n")
        if not isinstance(view, str) or not isinstance(n, int) or isinstance(n, bool):
            return [msg]
        expected = self._next.setdefault(view, 0)
        if n < expected:
            return []  # seen already
        waiting = self._waiting.setdefault(view, {})
        waiting[n] = msg
        if n != expected and len(waiting) <= self.MAX_WAITING:
            return []
        ready = []
        if expected not in waiting:  # over the bound: skip the gap
            expected = min(waiting)
        while expected in waiting:
            ready.append(waiting.pop(expected))
            expected += 1
        self._next[view] = expected
        return ready


class StreamWidget(anywidget.AnyWidget):
    """A widget fed with ``(stream, text)`` output on the loop thread; see the module docstring.

    Subclasses set :attr:`PANES` (stream → pane), implement :meth:`_action` for their buttons
    and :meth:`_plain_text` for front ends without widgets.
    """

    PANES: ClassVar[dict[str, str]] = {}

    _uid = traitlets.Unicode("").tag(sync=True)  # the front end keys its per-model store by it
    tail_lines = traitlets.Int(DEFAULT_TAIL_LINES).tag(sync=True)
    controls = traitlets.Dict().tag(sync=True)
    """``{socket, token, widget}``: where the front end sends controls past a busy kernel (controls.py)."""

    def __init__(
        self,
        loop: Loop,
        *,
        live: bool = False,
        tail_lines: int = DEFAULT_TAIL_LINES,
        panes: dict[str, str] | None = None,
        **traits: Any,
    ) -> None:
        super().__init__(_uid=uuid.uuid4().hex, tail_lines=tail_lines, **traits)
        self._loop = loop
        self.panes = dict(panes if panes is not None else self.PANES)
        """Stream -> the pane that shows it (:attr:`PANES` unless this widget was given others)."""
        self._transcript = Transcript(self.panes)
        self._rate = self._rate_limit()
        self._output_sent: deque[tuple[float, int]] = deque()  # (when, characters) of output sent
        self._live = live
        self._seq = 0
        self._replay_wanted = False
        self._replay_for: str | None = None  # the view whose hello asked for the next replay
        self._due: dict[str, Any] = {}
        self._last_counters = float("-inf")
        self._pacer: asyncio.Task[None] | None = None
        self._drained = asyncio.Event()  # set while nothing is left to send
        self._drained.set()
        self._wake = asyncio.Event()  # set when something new is due
        self._in_order = InOrder()
        self.on_msg(self._on_front_end_msg)

    def _serve_controls(self) -> None:
        """Have this widget's controls served on the kernel's control socket (see controls.py).

        Called by each subclass at the end of its ``__init__``: the trait it sets goes out with a
        round, which reads the subclass's counters.
        """
        if widgets_enabled():
            self._loop.spawn(self._enable_controls)

    async def _enable_controls(self) -> None:
        """Serve this widget's controls on the kernel's control socket (loop thread)."""
        value = await enable_controls(self, self.model_id)
        if value is not None:
            self._set(controls=value)

    def _rate_limit(self) -> RateLimit:
        """How often update rounds may go out (a terminal's echo needs shorter rounds)."""
        return RateLimit()

    # -- fed on the loop thread ---------------------------------------------------------------

    def _emit(self, stream: str, text: str) -> None:
        """New output (loop thread)."""
        self._transcript.append(stream, text)
        if not self._live:
            self._transcript.take_pending()  # no view to send it to: a hello's replay will show it
        self._kick()

    def _set(self, **traits: Any) -> None:
        """Trait changes for the next round (loop thread)."""
        self._due.update(traits)
        self._kick()

    def _counters(self) -> dict[str, Any]:
        """Live counter traits and their current values; sent at most every COUNTER_PERIOD."""
        return {}

    def _kick(self) -> None:
        self._drained.clear()
        self._wake.set()
        if self._pacer is None:
            self._pacer = asyncio.get_running_loop().create_task(self._pace())

    async def _pace(self) -> None:
        # Runs while something is due and ends when nothing is: an idle widget has no task.
        try:
            while True:
                count = self._round(dry=True)
                if count:
                    delay = self._rate.delay(count)
                    if delay <= 0:
                        self._round(dry=False)
                        continue
                else:  # only counters changed: they go out once their period has passed,
                    due_in = self._counters_due_in()  # or with the next output, if sooner
                    if due_in is None:
                        break
                    self._wake.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), max(due_in, 0.01))
                    continue
                await asyncio.sleep(delay)  # then plan again: more may be due by now
        finally:
            self._pacer = None
            self._drained.set()

    def _counters_due_in(self) -> float | None:
        """Seconds until changed counters may go out (``None``: they are all up to date)."""
        if all(getattr(self, k) == v for k, v in self._counters().items()):
            return None
        return max(self._last_counters + COUNTER_PERIOD - time.monotonic(), 0.0)

    def _round(self, *, dry: bool) -> int:
        """Send what is due in one round (or, ``dry``, count the messages it would take)."""
        now = time.monotonic()
        counters = {k: v for k, v in self._counters().items() if getattr(self, k) != v}
        traits = dict(self._due)
        if counters and (traits or now - self._last_counters >= COUNTER_PERIOD):
            traits.update(counters)
        output = self._replay_wanted or (self._live and self._transcript.has_pending)
        first = self._replay_wanted and self._replay_for is not None and self._transcript.has_pending
        count = int(output) + int(first) + int(bool(traits))
        if dry:
            return count
        if self._replay_wanted:
            self._replay_wanted = False
            viewer, self._replay_for = self._replay_for, None
            pending = self._transcript.take_pending()  # the replay holds it
            if pending and viewer is not None and sum(len(t) for _, t in pending) <= self._output_budget(now):
                # The views already showing take it as a delta and may skip a replay meant for
                # another (a terminal would have to reset its screen for it).
                self._send_msg("delta", pending)
            elif pending:
                viewer = None  # a flood: every view takes the replay
            self._send_msg("replay", {**self._replay_data(REPLAY_CHARS), "for": viewer})
        elif self._transcript.has_pending:
            pending = self._transcript.take_pending()
            if not self._live:
                pass  # no view exists yet: its hello will fetch a replay
            elif sum(len(text) for _, text in pending) > self._output_budget(now):
                self._send_msg("replay", self._replay_data(FLOOD_CHARS))  # a flood: its newest lines
            else:
                self._send_msg("delta", pending)
        if traits:
            self._due.clear()
            if counters:
                self._last_counters = now
            with self.hold_sync():
                for name, value in traits.items():
                    setattr(self, name, value)
        self._rate.record(count, now)
        return count

    def _output_budget(self, now: float) -> int:
        """Characters of output that may still go out in the second ending ``now``."""
        while self._output_sent and self._output_sent[0][0] <= now - 1.0:
            self._output_sent.popleft()
        return OUTPUT_RATE - sum(n for _, n in self._output_sent)

    def _send_msg(self, kind: str, data: Any) -> None:
        self._seq += 1
        if kind in ("delta", "replay"):
            pieces = data if kind == "delta" else [p for pane in data["panes"].values() for p in pane["pieces"]]
            self._output_sent.append((time.monotonic(), sum(len(text) for _, text in pieces)))
        self.send({"kind": kind, "seq": self._seq, "data": data})

    def _replay_data(self, max_chars: int) -> dict[str, Any]:
        panes: dict[str, Any] = {}
        names = dict.fromkeys(self.panes.values())
        for pane in names:
            pieces, hidden = self._transcript.tail(pane, self.tail_lines, max_chars // len(names))
            panes[pane] = {"pieces": pieces, "hidden": hidden}
        return {"panes": panes, "now": time.time()}

    def _idle(self) -> bool:
        """Nothing left to send (loop thread)."""
        return not (self._due or self._replay_wanted or (self._live and self._transcript.has_pending))

    async def _drain(self, timeout: float = 5.0) -> None:
        """Wait until the pacer has sent everything due (loop thread)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._drained.wait(), timeout)

    # -- from the front end (kernel main thread) -----------------------------------------------

    def _on_front_end_msg(self, _widget: object, content: object, _buffers: object) -> None:
        if not isinstance(content, dict):
            return
        ack_control(self._loop.call_soon, self.send, content)
        for msg in self._in_order.take(content):
            self._handle_front_end_msg(msg)

    def control(self, content: dict[str, Any]) -> None:
        """A message that came by the control socket (loop thread): handled as the comm's."""
        self._on_front_end_msg(self, content, None)

    def _hold_record(self, on: bool) -> None:
        """Hold back the final rewrite of this widget's output (a widget with one overrides this)."""

    def _handle_front_end_msg(self, content: dict[str, Any]) -> None:
        kind = content.get("type")
        if kind == "hello":
            viewer = content.get("viewer")
            self._loop.call_soon(self._hello, viewer if isinstance(viewer, str) else None)
        elif kind == "hold":  # a press or typing in a view: a final rewrite of its output waits
            self._hold_record(content.get("on") is True)
        elif kind == "fetch":
            stream = content.get("stream")
            self._loop.call_soon(self._fetch, stream if isinstance(stream, str) else None, content.get("purpose"))
        elif kind == "earlier":
            pane, before = content.get("pane"), content.get("before")
            if pane in self.panes.values() and type(before) is int and 0 < before < 2**53:
                self._loop.call_soon(self._earlier, pane, before)
        elif isinstance(kind, str):
            self._action(kind, content)

    def _hello(self, viewer: str | None = None) -> None:
        # Two hellos before one round: the replay is for both (``None``: for every view).
        self._replay_for = viewer if not self._replay_wanted else None
        self._live = True
        self._replay_wanted = True
        self._kick()

    def _fetch(self, stream: str | None, purpose: object) -> None:
        """Answer Copy/Download with the whole kept text: a user's one-off request, not paced."""
        if stream is not None and stream not in self.panes:
            return
        dropped = sum(n for s, n in self._transcript.dropped.items() if stream is None or s == stream)
        text = strip_ansi(self._transcript.text(stream))
        data = {"stream": stream, "purpose": purpose if purpose in ("copy", "download") else "copy"}
        self.send({"kind": "full", "seq": self._seq, "data": {**data, "text": text, "dropped": dropped}})

    def _earlier(self, pane: str, before: int) -> None:
        """Answer a pane's "earlier lines" with the kept lines just above line ``before`` (the
        first one the view holds): a user's one-off request, like Copy, not paced."""
        pieces, first = self._transcript.lines_before(pane, before, EARLIER_LINES, EARLIER_CHARS)
        data = {"pane": pane, "before": before, "first": first, "pieces": pieces}
        self.send({"kind": "earlier", "seq": self._seq, "data": data})

    def _action(self, kind: str, content: dict[str, Any]) -> None:
        """A button of the view was pressed (main thread: hand the work to the loop)."""

    # -- plain text ------------------------------------------------------------------------------

    def text(self, stream: str | None = None) -> str:
        """The output kept so far: one stream, or all of it interleaved as it arrived."""
        return self._transcript.text(stream)

    def _plain_text(self) -> str:
        return f"<{type(self).__name__}>"

    def __repr__(self) -> str:
        return self._plain_text()

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        if not widgets_enabled():
            return {"text/plain": self._plain_text()}
        return super()._repr_mimebundle_(**kwargs)
