"""The host's JSON-RPC client: typed calls over a :class:`Channel`, with retries that lose nothing.

Every method of the protocol is safe to repeat (polls are cursor reads, starts carry an
idempotency key, stdin writes carry a byte offset, kills and releases are idempotent), so a
lost response or a broken channel is handled by asking again, after reconnecting if needed.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import AgentUnavailableError, ProtocolError, RemoteExecError, TransportError, error_from_wire
from ..protocol import WireModel, frames
from .channel import Channel, ChannelBroken

__all__ = ["RpcClient"]

T = TypeVar("T", bound=WireModel)


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


class RpcClient:
    """Typed JSON-RPC calls with per-call timeouts, retry and reconnect.

    :param channel: how requests reach the agent.
    :param default_timeout: seconds to wait for a response when a call names none.
    :param attempts: tries per call before giving up with :class:`TransportError`.
    """

    def __init__(self, channel: Channel, *, default_timeout: float = 60.0, attempts: int = 4) -> None:
        self.channel = channel
        self.default_timeout = default_timeout
        self.attempts = attempts
        self._ids = itertools.count(1)
        self._generation = 0
        self._reconnect_lock = asyncio.Lock()

    async def call(
        self,
        method: str,
        params: WireModel,
        result: type[T],
        *,
        timeout: float | None = None,
        payload: bytes | memoryview | None = None,
    ) -> T:
        """Call ``method`` and return its validated result.

        ``payload`` travels raw beside the params (methods that take one). Cancelling the call
        abandons the response; the request itself may still run in the agent.

        :raises RemoteExecError: the agent's error, mapped to its class (e.g. ``JobNotFoundError``).
        :raises TransportError: no valid response after every attempt.
        :raises AgentUnavailableError: the channel broke and could not be re-established.
        """
        return (await self.call_with_payload(method, params, result, timeout=timeout, payload=payload))[0]

    async def call_with_payload(
        self,
        method: str,
        params: WireModel,
        result: type[T],
        *,
        timeout: float | None = None,
        payload: bytes | memoryview | None = None,
    ) -> tuple[T, memoryview | None]:
        """Like :meth:`call`, and also return the response's payload (``None`` if it has none)."""
        params_json = params.model_dump_json().encode()
        why = "no attempt made"
        for attempt in range(self.attempts):
            request_id = next(self._ids)
            body = frames.encode(
                b'{"jsonrpc":"2.0","id":%d,"method":"%s","params":%s}' % (request_id, method.encode(), params_json),
                payload,
            )
            generation = self._generation
            try:
                raw = await self.channel.request(body, request_id, timeout or self.default_timeout)
            except TimeoutError:
                why = f"no response to {method} within {timeout or self.default_timeout:.1f} s"
                continue
            except ChannelBroken as exc:
                why = str(exc)
                if attempt:  # a second failure in a row: back off (jittered) before hammering again
                    await asyncio.sleep(random.uniform(0, min(0.05 * 2**attempt, 1.0)))
                await self._reconnect(generation)
                continue
            try:
                return self._decode(raw, request_id, result)
            except AgentUnavailableError as exc:
                if type(exc) is not AgentUnavailableError:
                    raise  # AgentLostError: the job is gone, retrying cannot help
                why = f"the relay lost the agent server: {exc}"
                await self._reconnect(generation)
        raise TransportError(f"{method} failed after {self.attempts} attempts: {why}")

    async def _reconnect(self, generation: int) -> None:
        async with self._reconnect_lock:
            if generation != self._generation:
                return  # another caller already reconnected this broken generation
            try:
                await self.channel.reconnect()
            except RemoteExecError:
                raise
            except Exception as exc:
                raise AgentUnavailableError(f"cannot reconnect to the agent: {exc}") from exc
            self._generation += 1

    def _decode(self, frame: frames.Frame, request_id: int, result: type[T]) -> tuple[T, memoryview | None]:
        try:
            env = _Envelope[result].model_validate_json(frame.message)  # type: ignore[valid-type]
        except ValidationError as exc:
            raise ProtocolError(f"malformed response from the agent: {exc.errors(include_url=False)[:3]}") from None
        if env.id != request_id:
            raise ProtocolError(f"response id {env.id!r} does not match request id {request_id}")
        if env.error is not None:
            raise error_from_wire(env.error.code, env.error.message, env.error.data)
        if env.result is None:
            raise ProtocolError("response has neither result nor error")
        return env.result, None if frame.payload is None else memoryview(frame.payload)
