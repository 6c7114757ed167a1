"""The host's JSON-RPC client: typed calls over a :class:`Channel`, with retries that lose nothing.

Every method of the protocol is safe to repeat (polls are cursor reads, starts carry an
idempotency key, stdin writes carry a byte offset, kills and releases are idempotent), so a
lost response or a broken channel is handled by asking again, after reconnecting if needed.

Nothing from the sandbox is trusted, so every call is bounded twice:

- **in time**: a call has a deadline (``timeout``, default :data:`RPC_TIMEOUT`; a long poll
  passes its wait plus a margin). An unanswered request is asked once more, with the same
  deadline; so a silent agent fails the call with :class:`TransportError` after at most twice
  the deadline. A broken channel is reconnected and the call asked again (a jittered backoff
  from the second break on); a reconnect that succeeds gives the call at least one more
  ``timeout``, so an agent that crashes and is restarted many times during one long poll does not
  fail the poll: up to :data:`MAX_BREAKS` breaks per call, which is what ends a crash loop.
- **in size**: the response's JSON may be at most :data:`MAX_MESSAGE` bytes (a listing page
  :data:`MAX_PAGE_MESSAGE`), and its payload at most what the call asked for, checked before
  the JSON is parsed; items in the models are bounded too. A response over its bound is a
  :class:`ProtocolError`, not retried.

A silent agent is noticed sooner by the channel's heartbeat
(:class:`~remote_exec.client.channel.Liveness`, within 8 s by default): the call then fails
with :class:`AgentUnresponsiveError` at once, not retried. Before a call fails for the
transport, the sandbox is asked what became of it (``diagnose``): a killed container, an exited
box or an unreachable host turns the failure into :class:`SandboxLostError`.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ..errors import (
    AgentUnavailableError,
    AgentUnresponsiveError,
    RemoteExecError,
    SandboxClosedError,
    SandboxLostError,
    TransportError,
    UntrustedAgentError,
)
from ..protocol import WireModel, frames
from .channel import Channel, ChannelBroken, OnPush
from .responses import MAX_MESSAGE, MAX_PAGE_MESSAGE, decode, message_limit, payload_limit

__all__ = [
    "DIAGNOSE_TIMEOUT",
    "MAX_BREAKS",
    "MAX_MESSAGE",
    "MAX_PAGE_MESSAGE",
    "RPC_TIMEOUT",
    "Diagnose",
    "RpcClient",
]

MAX_BREAKS = 64
"""Most broken channels one call reconnects after (each one after an agent that came back)."""

RPC_TIMEOUT = 15.0
"""Seconds a call waits for its response by default (then asks once more, as long again)."""

DIAGNOSE_TIMEOUT = 5.0
"""Seconds the sandbox gets to say what became of it (``docker inspect``, a new SSH connection)."""

Diagnose = Callable[[], Awaitable[RemoteExecError | None]]
"""Asks the sandbox's transport what became of it after a transport failure: the error to raise
instead (:class:`SandboxLostError`, or a more precise :class:`AgentUnresponsiveError`), or
``None`` when it has nothing to add."""

T = TypeVar("T", bound=WireModel)
R = TypeVar("R")


class RpcClient:
    """Typed JSON-RPC calls with per-call deadlines, bounded responses, retry and reconnect.

    :param channel: how requests reach the agent.
    :param default_timeout: seconds to wait for a response when a call names none.
    :param attempts: most tries per call; ``None`` (the default): as many as fit in its deadline.
    :param name: the sandbox, as errors name it.
    :param diagnose: asked before a call fails for the transport (see :data:`Diagnose`).
    """

    def __init__(
        self,
        channel: Channel,
        *,
        default_timeout: float = RPC_TIMEOUT,
        attempts: int | None = None,
        name: str = "the sandbox",
        diagnose: Diagnose | None = None,
    ) -> None:
        self.channel = channel
        self.diagnose = diagnose
        self.default_timeout = default_timeout
        self.attempts = attempts
        self.name = name
        self._ids = itertools.count(1)
        self._generation = 0
        self._reconnect_lock = asyncio.Lock()
        self._closed = False
        self._asking: asyncio.Task[RemoteExecError | None] | None = None  # the diagnose in flight

    @property
    def closed(self) -> bool:
        """True once :meth:`aclose` ran: every call fails at once, nothing reconnects."""
        return self._closed

    async def aclose(self) -> None:
        """Refuse every later call (a task still running, say a kill, must not reconnect or
        restart an agent after the sandbox closed), then close the channel."""
        self._closed = True
        asking = self._asking
        if asking is not None and not asking.done():
            # A question to the sandbox in flight (a `docker inspect`, an SSH connection) ends with
            # it: it outlived the close by up to DIAGNOSE_TIMEOUT, and the blocking API's loop.
            asking.cancel()
            await asyncio.wait({asking})  # (its cancellation is not ours: wait, do not await it)
        await self.channel.aclose()

    def _check_open(self, method: str) -> None:
        if self._closed:
            raise SandboxClosedError(f"{self.name} is closed: {method} not sent")

    async def call(
        self,
        method: str,
        params: WireModel,
        result: type[T],
        *,
        timeout: float | None = None,
        payload: bytes | memoryview | None = None,
        deadline: float | None = None,
    ) -> T:
        """Call ``method`` and return its validated result.

        ``payload`` travels raw beside the params (methods that take one). ``timeout``: seconds
        to wait for the response before asking again; ``deadline``: seconds for the whole call,
        retries included (default ``2 * timeout``). Cancelling the call abandons the response;
        the request itself may still run in the agent.

        :raises RemoteExecError: the agent's error, mapped to its class (e.g. ``JobNotFoundError``).
        :raises TransportError: no valid response within the deadline.
        :raises AgentUnresponsiveError: the agent answered no heartbeat within the channel's
            liveness bound (frozen, paused, cut off).
        :raises SandboxLostError: the sandbox itself is gone (container killed, box exited...).
        :raises AgentUnavailableError: the channel broke and could not be re-established, or the
            client is closed.
        :raises ProtocolError: the response is malformed or over its size bound.
        """
        res = await self.call_with_payload(method, params, result, timeout=timeout, payload=payload, deadline=deadline)
        return res[0]

    async def call_with_payload(
        self,
        method: str,
        params: WireModel,
        result: type[T],
        *,
        timeout: float | None = None,
        payload: bytes | memoryview | None = None,
        deadline: float | None = None,
        max_payload: int | None = None,
    ) -> tuple[T, memoryview | None]:
        """Like :meth:`call`, and also return the response's payload (``None`` if it has none),
        which may be at most ``max_payload`` bytes (default: one file chunk, for a method that
        answers with a payload at all)."""
        limits = (message_limit(method), payload_limit(method, max_payload))
        return await self._mapped(
            method, self._call(method, lambda: params, result, timeout, payload, deadline, limits)
        )

    async def _mapped(self, method: str, call: Awaitable[R]) -> R:
        """``call``'s result; a transport failure turned into what the sandbox says became of it."""
        try:
            return await call
        except SandboxLostError as exc:
            self.channel.link.set("gone", str(exc))
            raise
        except AgentUnresponsiveError as exc:
            raise self._noted(await self._diagnosed(AgentUnresponsiveError(f"{self.name}: {method}: {exc}"))) from exc
        except TransportError as exc:
            if self._closed or type(exc) is UntrustedAgentError:
                raise
            better = self._noted(await self._diagnosed(exc))
            if better is exc:
                raise
            raise better from exc

    async def stream(
        self,
        method: str,
        params_of: Callable[[], WireModel],
        result: type[T],
        on_push: OnPush,
        *,
        timeout: float,
    ) -> T:
        """Call a method that pushes frames before its response (``exec_remote_follow``).

        Each try sends ``params_of()`` (so a retry carries the cursors the pushes so far have
        moved); ``on_push`` takes the pushes in order, on the channel's reading task, and may
        raise (a :class:`ProtocolError` for a lying push) to fail the call. ``timeout`` bounds
        the silence between frames: a call that keeps pushing has no deadline, one that falls
        silent is asked again (after a reconnect if the channel broke), as :meth:`call` is.

        :raises: as :meth:`call`.
        """
        call = self._call(method, params_of, result, timeout, None, None, (MAX_MESSAGE, 0), on_push)
        return (await self._mapped(method, call))[0]

    def _noted(self, exc: RemoteExecError) -> RemoteExecError:
        """``exc``, its verdict on the sandbox set on the channel's link (for the views)."""
        if isinstance(exc, SandboxLostError):
            self.channel.link.set("gone", str(exc))
        elif isinstance(exc, AgentUnresponsiveError) and self.channel.link.state != "gone":
            self.channel.link.set("lost", str(exc))
        return exc

    async def _diagnosed(self, exc: TransportError) -> RemoteExecError:
        """``exc``, or what the sandbox says became of it (its own failure to say changes nothing)."""
        if self.diagnose is None or self._closed:  # (a closed sandbox is not asked: no new SSH connection)
            return exc
        asking = self._asking
        if asking is None or asking.done():
            asking = self._asking = asyncio.ensure_future(self._ask_sandbox(self.diagnose))
        try:
            better = await asyncio.shield(asking)  # one caller cancelled leaves the answer to the others
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not asking.cancelled() or (task is not None and task.cancelling()):
                raise  # this caller is cancelled
            return exc  # the sandbox was closed meanwhile (aclose ended the question)
        if better is None:
            return exc
        # The answer is shared: each caller's copy names its own failure (copied by its state,
        # not by its constructor, which may take arguments of its own).
        mine = type(better).__new__(type(better))
        mine.__dict__.update(better.__dict__)
        mine.message = f"{better.message} ({exc.message})"
        mine.args = (mine.message,)
        return mine

    @staticmethod
    async def _ask_sandbox(diagnose: Diagnose) -> RemoteExecError | None:
        """One question to the sandbox, bounded by :data:`DIAGNOSE_TIMEOUT`. Every call that fails
        while it is asked shares its answer: a channel break fails every call in flight at
        once (200 followers of a killed agent), and each asked by itself was a ``docker inspect``
        (an SSH connection, an API read) apiece: 1,355 of them in one fault-suite run."""
        try:
            async with asyncio.timeout(DIAGNOSE_TIMEOUT):
                return await diagnose()
        except (TimeoutError, RemoteExecError, OSError):
            return None

    async def _call(
        self,
        method: str,
        params_of: Callable[[], WireModel],
        result: type[T],
        timeout: float | None,
        payload: bytes | memoryview | None,
        deadline: float | None,
        limits: tuple[int, int],
        on_push: OnPush | None = None,
    ) -> tuple[T, memoryview | None]:
        """One call, asked again after a silence or a break until its deadline; with
        ``on_push``, every push is progress that moves the deadline (see :meth:`stream`)."""
        self._check_open(method)
        timeout = timeout or self.default_timeout
        loop = asyncio.get_running_loop()
        span = deadline if deadline is not None else 2 * timeout
        end = loop.time() + span
        taken: OnPush | None = None
        if on_push is not None:
            push_to = on_push

            def taken(frame: frames.Frame) -> None:
                nonlocal end
                end = max(end, loop.time() + span)  # a pushing call is alive: its deadline moves
                push_to(frame)

        why = "no attempt made"
        tries = 0
        broken = 0  # breaks so far in this call
        while self.attempts is None or tries < self.attempts:
            tries += 1
            left = end - loop.time()
            if left <= 0:
                break
            request_id = next(self._ids)
            # Each try asks with the params as they are now: a follow's pushes moved its cursors.
            body = frames.encode(
                b'{"jsonrpc":"2.0","id":%d,"method":"%s","params":%s}'
                % (request_id, method.encode(), params_of().model_dump_json().encode()),
                payload,
            )
            generation = self._generation
            wait = min(timeout, left)
            try:
                raw = await self.channel.request(body, request_id, wait, on_push=taken)
            except TimeoutError:
                why = f"no {'frame of' if on_push else 'response to'} {method} within {wait:.1f} s"
                continue
            except ChannelBroken as exc:
                why = str(exc)
                broken += 1
                end = await self._recover(method, broken, generation, end, timeout)
                continue
            try:
                return decode(self.name, raw, request_id, result, limits)
            except AgentUnavailableError as exc:
                if type(exc) is not AgentUnavailableError:
                    raise  # AgentLostError: the job is gone, retrying cannot help
                why = f"the relay lost the agent server: {exc}"
                broken += 1
                end = await self._recover(method, broken, generation, end, timeout)
        raise TransportError(f"{self.name}: {method} failed: {why}")

    async def _recover(self, method: str, broken: int, generation: int, end: float, timeout: float) -> float:
        """Reconnect after the ``broken``-th break of one call; return the call's new deadline.

        A reconnect that succeeds is a sign of life (a restarted agent answers again), so the call
        gets at least one more ``timeout`` from there: the deadline bounds waiting on an agent that
        does not answer, not the number of times one was restarted. What bounds a crash-looping
        agent is :data:`MAX_BREAKS`; a frozen one, the channel's heartbeat. From the second break
        on, a jittered, growing pause (at most 1 s) keeps a crash loop from being hammered.
        """
        if broken > MAX_BREAKS:
            raise TransportError(
                f"{self.name}: {method}: the channel to the agent broke {broken} times in one call "
                "(an agent that crashes again each time it is restarted?)"
            )
        if broken > 1 and self.diagnose is not None:
            # Broken again right after a reconnect: a container that was killed or removed
            # reconnects (a `docker exec` starts) and breaks at once, over and over. Ask the
            # transport before spending the call's time on that: "the sandbox is gone" within
            # seconds, not after MAX_BREAKS reconnects.
            verdict = await self._diagnosed(TransportError(f"{self.name}: {method}: the channel broke {broken} times"))
            if isinstance(verdict, SandboxLostError):
                raise verdict
        loop = asyncio.get_running_loop()
        end = max(end, loop.time() + timeout)
        if broken > 1:
            await asyncio.sleep(random.uniform(0, min(0.05 * 2 ** min(broken, 5), 1.0)))
        await self._reconnect(generation, end)
        return max(end, loop.time() + timeout)

    async def _reconnect(self, generation: int, end: float) -> None:
        async with self._reconnect_lock:
            self._check_open("reconnect")
            if generation != self._generation:
                return  # another caller already reconnected this broken generation
            if self.channel.link.state in ("connecting", "connected"):
                self.channel.link.set("reconnecting", "the channel broke")
            try:
                async with asyncio.timeout_at(end):  # the call's deadline bounds the reconnect too
                    await self.channel.reconnect()
            except TimeoutError:
                raise TransportError(f"{self.name}: reconnecting to the agent took past the call's deadline") from None
            except RemoteExecError:
                raise
            except Exception as exc:
                raise AgentUnavailableError(f"cannot reconnect to the agent: {exc}") from exc
            self._generation += 1
