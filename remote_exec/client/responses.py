"""What the host accepts as an answer from the agent: each checked before it is believed.

Sizes come first (parsing JSON costs 10-20 times its size in objects), then the JSON-RPC
envelope, the id, and an error's ids. Used by :class:`~remote_exec.client.rpc.RpcClient` for
answers and by the follower for pushes.
"""

from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import ProtocolError, RemoteExecError, error_from_wire
from ..protocol import MAX_CHUNK, METHODS, PAGE_BYTES, Method, WireModel, frames
from ..protocol.names import is_job_id, shown
from ..termsafe import terminal_safe

__all__ = ["MAX_MESSAGE", "MAX_PAGE_MESSAGE", "decode", "message_limit", "one_line", "payload_limit"]

T = TypeVar("T", bound=WireModel)

MAX_MESSAGE = 1024 * 1024
"""Largest response JSON of a call (payload apart): every non-listing result is far smaller."""

MAX_PAGE_MESSAGE = 4 * PAGE_BYTES
"""Largest response JSON of a listing page (the agent aims at :data:`PAGE_BYTES`)."""

_MESSAGE_LIMITS: dict[str, int] = {Method.EXEC_REMOTE_LIST: MAX_PAGE_MESSAGE, Method.FILE_LIST: MAX_PAGE_MESSAGE}


def message_limit(method: str) -> int:
    """The largest response JSON ``method`` may answer with."""
    return _MESSAGE_LIMITS.get(method, MAX_MESSAGE)


class _ErrorObject(BaseModel):
    model_config = ConfigDict(extra="ignore")
    code: int
    message: str
    data: Any = None


class _Envelope(BaseModel, Generic[T]):
    model_config = ConfigDict(extra="forbid")
    jsonrpc: Literal["2.0"]
    id: int | str | None
    result: T | None = None
    error: _ErrorObject | None = None


def decode(
    name: str, frame: frames.Frame, request_id: int, result: type[T], limits: tuple[int, int]
) -> tuple[T, memoryview | None]:
    """The result (and payload) of ``frame``, the answer to ``request_id``, checked: sizes within
    ``limits`` (message, payload) before any parsing, the envelope, the id, the agent's error
    (raised as its class)."""
    # Sizes first: parsing JSON costs 10-20 times its size in objects, so a lying agent's
    # 150 MiB listing must be refused before pydantic sees it.
    if len(frame.message) > limits[0]:
        raise ProtocolError(f"{name}: a {len(frame.message)}-byte response, over the {limits[0]}-byte bound")
    if frame.payload is not None and len(frame.payload) > limits[1]:
        raise ProtocolError(f"{name}: a {len(frame.payload)}-byte payload, over the {limits[1]}-byte bound")
    try:
        env = _Envelope[result].model_validate_json(frame.message)  # type: ignore[valid-type]
    except ValidationError as exc:
        raise ProtocolError(f"malformed response from the agent: {one_line(exc)}") from None
    if env.id != request_id:
        raise ProtocolError(f"response id {env.id!r} does not match request id {request_id}")
    if env.error is not None:
        raise _ids_checked(error_from_wire(env.error.code, env.error.message, env.error.data))
    if env.result is None:
        raise ProtocolError("response has neither result nor error")
    return env.result, None if frame.payload is None else memoryview(frame.payload)


def _ids_checked(exc: RemoteExecError) -> RemoteExecError:
    """``exc`` if the job or session id it carries (the agent's word, as every id) is of the safe
    form; else the refusal of that id, so no caller is handed it as ``exc.job_id``."""
    for attr in ("job_id", "session_id"):
        value = getattr(exc, attr, None)
        if value is not None and not is_job_id(value):
            return ProtocolError(f"the agent gave an error naming a {attr} of an unsafe form, refused: {shown(value)}")
    return exc


def one_line(exc: ValidationError) -> str:
    """The first errors of a refused response on one line, each value shown cut short: the
    agent may send a 10 KB id or a terminal's control codes, and the message is printed."""
    parts = []
    for err in exc.errors(include_url=False)[:3]:
        where = ".".join(map(str, err["loc"]))
        what = err["msg"] if err["type"] == "value_error" else f"{err['msg']}, got {shown(err.get('input'))}"
        parts.append(terminal_safe(f"{where}: {what}"))
    return "; ".join(parts)


def payload_limit(method: str, asked: int | None) -> int:
    spec = METHODS.get(method)
    if spec is None or not spec.gives_payload:
        return 0
    return MAX_CHUNK if asked is None else asked
