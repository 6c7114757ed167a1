"""A front end without a browser: records what widgets send and talks back as a view would.

For tests and the widget benchmark, and for checking a notebook's widgets in CI::

    with HeadlessFrontEnd() as fe:
        view = JobView(proc)
        fe.send(view, {"type": "hello"})      # what the browser's view does on render
        ...
        fe.custom(view)                        # the {kind, seq, data} messages it got

It swaps ``comm.create_comm`` (the hook the ``comm`` package provides for this) while active,
so every widget created meanwhile talks to it instead of a kernel.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import comm
from comm.base_comm import BaseComm

__all__ = ["CommMessage", "HeadlessFrontEnd"]


@dataclass(frozen=True)
class CommMessage:
    """One message a widget sent.

    :ivar at: ``time.monotonic()`` when it was sent.
    :ivar size: bytes of the whole Jupyter message as JSON (header, metadata, content).
    """

    at: float
    comm_id: str
    msg_type: str
    data: dict[str, Any]
    size: int


def _envelope_size(msg_type: str, content: dict[str, Any]) -> int:
    # What ipykernel puts on the wire around a comm message (the HMAC signature and zmq framing
    # aside): a header (twice: as its own and, for comm_msg, the parent's), metadata, content.
    header = {
        "msg_id": uuid.uuid4().hex + "_0_0",
        "msg_type": msg_type,
        "username": "username",
        "session": uuid.uuid4().hex,
        "date": "2026-01-01T00:00:00.000000Z",
        "version": "5.3",
    }
    parts: tuple[dict[str, Any], ...] = (header, {**header, "msg_type": "execute_request"}, {}, content)
    return sum(len(json.dumps(p, separators=(",", ":"), ensure_ascii=False).encode()) for p in parts)


class _RecordingComm(BaseComm):
    def __init__(self, frontend: HeadlessFrontEnd, **kwargs: Any) -> None:
        self._frontend = frontend
        super().__init__(**kwargs)

    def publish_msg(
        self,
        msg_type: str,
        data: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        buffers: list[bytes] | None = None,
        **keys: Any,
    ) -> None:
        content = {"comm_id": self.comm_id, "data": data or {}, **keys}
        size = _envelope_size(msg_type, content) + sum(len(b) for b in buffers or [])
        self._frontend._record(CommMessage(time.monotonic(), self.comm_id, msg_type, data or {}, size))


class HeadlessFrontEnd:
    """Collects widgets' comm messages (thread-safe) while used as a context manager."""

    def __init__(self) -> None:
        self.messages: list[CommMessage] = []
        self._lock = threading.Lock()
        self._saved: Any = None

    def __enter__(self) -> HeadlessFrontEnd:
        self._saved = comm.create_comm
        comm.create_comm = self._create
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        comm.create_comm = self._saved

    def _create(self, **kwargs: Any) -> BaseComm:
        return _RecordingComm(self, **kwargs)

    def _record(self, msg: CommMessage) -> None:
        with self._lock:
            self.messages.append(msg)

    def sent(self, widget: Any, since: float = 0.0) -> list[CommMessage]:
        """Messages ``widget`` sent (after ``since``, a ``time.monotonic()`` value)."""
        # A closed widget has no comm any more, but still knows its model id (the comm's id).
        comm_id = widget.comm.comm_id if widget.comm is not None else widget._model_id
        with self._lock:
            return [m for m in self.messages if m.comm_id == comm_id and m.at >= since]

    def custom(self, widget: Any, since: float = 0.0) -> list[dict[str, Any]]:
        """The contents of ``widget``'s custom messages (``{kind, seq, data}``), in order."""
        return [m.data["content"] for m in self.sent(widget, since) if m.data.get("method") == "custom"]

    def updates(self, widget: Any, since: float = 0.0) -> list[dict[str, Any]]:
        """The trait states ``widget`` synced, one dict per update message, in order."""
        return [m.data["state"] for m in self.sent(widget, since) if m.data.get("method") == "update"]

    def widget(self, output: Any) -> Any:
        """The widget a displayed output (``capture_output().outputs`` item, or a model id) shows."""
        from ipywidgets.widgets.widget import _instances  # the registry ipywidgets resolves ids in

        data = getattr(output, "data", None)
        model_id = data["application/vnd.jupyter.widget-view+json"]["model_id"] if data else output
        return _instances[model_id]

    def send(self, widget: Any, content: dict[str, Any]) -> None:
        """Deliver a custom message to ``widget`` as its front-end view would (``model.send``)."""
        widget.comm.handle_msg({"content": {"data": {"method": "custom", "content": content}}, "buffers": []})
