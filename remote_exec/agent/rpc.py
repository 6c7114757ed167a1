"""JSON-RPC 2.0 dispatch: parse, validate params, call the typed handler, encode, map errors.

Every request gets an answer (notifications excepted, as the spec says), whatever its bytes:
malformed input becomes a precise JSON-RPC error and never an exception out of :meth:`handle`.
"""

from __future__ import annotations

import contextvars
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from pydantic_core import from_json

from ..errors import (
    InternalError,
    InvalidParamsError,
    InvalidRequestError,
    MethodNotFoundError,
    ParseError,
    RemoteExecError,
)
from ..protocol import METHODS, WireModel, frames

__all__ = ["CURRENT_REQUEST_ID", "Dispatcher", "Handler", "WithPayload", "dump_json", "error_answer"]


@dataclass(frozen=True, slots=True)
class WithPayload:
    """A result and the binary payload that travels beside it (methods with ``gives_payload``)."""

    result: WireModel | bytes
    payload: bytes | bytearray | memoryview


Handler = Callable[..., Awaitable[WireModel | bytes | WithPayload]]
"""A typed operation: validated params in (and, for ``takes_payload`` methods, the request's
payload or ``None``), a result model (or its JSON, encoded ahead, or either with a payload) out."""
log = logging.getLogger("remote_exec.agent")
_NO_ID = object()

CURRENT_REQUEST_ID: contextvars.ContextVar[object] = contextvars.ContextVar("remote_exec_request_id", default=None)
"""The JSON-RPC id of the request being handled (each request runs in a task of its own):
what a method that pushes frames before its answer names them by."""


try:  # optional accelerator (the `fast` extra, and the agent bundle): ~5x faster on big text
    import orjson
except ImportError:  # pragma: no cover - exercised where orjson is absent
    orjson = None  # type: ignore[assignment]


def dump_json(result: WireModel) -> bytes:
    """A result as compact JSON; the bytes are the same with or without orjson."""
    if orjson is not None:
        return orjson.dumps(result.model_dump())
    return result.model_dump_json().encode()


def _error(id_: object, exc: RemoteExecError) -> bytes:
    err: dict[str, Any] = {"code": exc.code, "message": exc.message}
    data = exc.data
    job_id = getattr(exc, "job_id", None)
    if job_id is not None:
        data = {**(data if isinstance(data, dict) else {}), "job_id": job_id}
    if data is not None:
        err["data"] = data
    return json.dumps({"jsonrpc": "2.0", "id": id_, "error": err}, separators=(",", ":")).encode()


def error_answer(exc: RemoteExecError) -> bytes:
    """A JSON-RPC error answer to a request that could not be read (so has no known id)."""
    return _error(None, exc)


class Dispatcher:
    """Routes JSON-RPC request bodies to handlers registered per method name."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def register(self, handlers: dict[str, Handler]) -> None:
        for name in handlers:
            if name not in METHODS:
                raise ValueError(f"{name!r} is not a protocol method")
        self._handlers.update(handlers)

    async def handle(self, body: bytes) -> bytes | None:
        """Answer one request frame (an HTTP body) or a batch; ``None`` when nothing needs an answer."""
        try:
            frame = frames.split(body)
        except frames.FrameError as exc:
            return _error(None, ParseError(f"request frame: {exc}"))
        return await self.handle_frame(frame)

    async def handle_frame(self, frame: frames.Frame) -> bytes | None:
        """Like :meth:`handle`, for a frame already split into its message and payload."""
        payload = None if frame.payload is None else memoryview(frame.payload)
        try:
            # pydantic's parser, unlike json.loads, rejects lone surrogates that could never be
            # encoded back out (a job labelled with one would poison every later list).
            msg = from_json(frame.message)
        except (ValueError, RecursionError) as exc:
            return _error(None, ParseError(f"request is not valid JSON: {exc}"))
        if isinstance(msg, list):
            if not msg:
                return _error(None, InvalidRequestError("empty batch"))
            if payload is not None:
                return _error(None, InvalidRequestError("a batch cannot carry a payload"))
            answers = [a for a in [await self._one(m, None, batch=True) for m in msg] if a is not None]
            return b"[" + b",".join(answers) + b"]" if answers else None
        return await self._one(msg, payload)

    async def _one(self, msg: object, payload: memoryview | None, batch: bool = False) -> bytes | None:
        if not isinstance(msg, dict):
            return _error(None, InvalidRequestError("a request must be a JSON object"))
        id_ = msg.get("id", _NO_ID)
        if id_ is not _NO_ID and not (id_ is None or (isinstance(id_, (str, int)) and not isinstance(id_, bool))):
            return _error(None, InvalidRequestError("id must be a string, an integer or null"))
        reply_id = None if id_ is _NO_ID else id_
        method = msg.get("method")
        params = msg.get("params", {})
        extra = set(msg) - {"jsonrpc", "id", "method", "params"}
        if msg.get("jsonrpc") != "2.0" or not isinstance(method, str) or extra:
            why = f"unexpected members {sorted(extra)}" if extra else 'needs "jsonrpc": "2.0" and a string "method"'
            return _error(reply_id, InvalidRequestError(f"not a JSON-RPC 2.0 request: {why}"))
        CURRENT_REQUEST_ID.set(None if batch else reply_id)  # a batch answers at once: nothing pushes in one
        try:
            outcome = await self._call(method, params, payload)
            result, out_payload = (
                (outcome.result, outcome.payload) if isinstance(outcome, WithPayload) else (outcome, None)
            )
            if out_payload is not None and batch:  # the work is done; only its answer cannot be framed
                raise InvalidRequestError(f"{method} answers with a payload: it cannot be batched")
            # Encoded inside the try: a result that cannot be encoded still gets an answer.
            answer = frames.encode(
                b'{"jsonrpc":"2.0","id":%s,"result":%s}'
                % (json.dumps(reply_id).encode(), result if isinstance(result, bytes) else dump_json(result)),
                out_payload,
            )
        except RemoteExecError as exc:
            answer = _error(reply_id, exc)
        except Exception as exc:  # a bug in a handler must not take the agent down
            log.exception("internal error in %s", method)
            answer = _error(reply_id, InternalError(f"{type(exc).__name__}: {exc}"))
        return None if id_ is _NO_ID else answer

    async def _call(self, method: str, params: object, payload: memoryview | None) -> WireModel | bytes | WithPayload:
        handler = self._handlers.get(method)
        spec = METHODS.get(method)
        if handler is None or spec is None:
            raise MethodNotFoundError(f"no method {method!r}", data={"methods": sorted(self._handlers)})
        if not isinstance(params, dict):
            raise InvalidParamsError("params must be a JSON object (named parameters)")
        try:
            model = spec.params.model_validate(params)
        except ValidationError as exc:
            details = json.loads(exc.json(include_url=False, include_context=False, include_input=False))
            raise InvalidParamsError(
                f"invalid params for {method}: {exc.error_count()} error(s)", data=details
            ) from None
        if spec.takes_payload:
            return await handler(model, payload)
        if payload is not None:
            raise InvalidParamsError(f"{method} takes no payload")
        return await handler(model)
