"""How one job handle reads its output when the agent pushes it: a follow call at a time.

:class:`Follower` keeps at most one ``exec_remote_follow`` call under way for its handle
(:mod:`remote_exec.protocol.follow`). The agent pushes the job's output as it comes; each push
is checked and applied by the handle as a poll's answer would be (its cursors must move by
exactly what it carries), and wakes whoever waits for events. A call ends after its byte budget
(the next starts when the handle's consumer has taken nearly all of it: the host's memory per
job stays within two budgets whatever the producer does), after a quiet ``wait`` (the next one
starts at once), or with the job's end. A broken channel or a restarted agent is followed again
from the handle's cursors by :meth:`RpcClient.stream`: nothing lost, nothing twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import ProtocolError
from ..protocol import DEFAULT_FOLLOW_BUDGET, PUSH, FollowParams, FollowResult, Method, Push, frames
from .responses import MAX_MESSAGE, one_line
from .rpc import RpcClient

__all__ = ["FOLLOW_BUDGET", "Follower"]

FOLLOW_BUDGET = DEFAULT_FOLLOW_BUDGET
"""Bytes one follow call may push before it ends (a push may pass it by one chunk)."""


class _PushEnvelope(BaseModel):
    model_config = ConfigDict(extra="forbid")
    jsonrpc: Literal["2.0"]
    method: Literal["exec_remote_push"]
    params: Push


assert PUSH == "exec_remote_push"  # the Literal above


class Follower:
    """The follow calls of one handle.

    :param rpc: the handle's connection.
    :param params: the next call's params (the handle's cursors, hits and chunk size now).
    :param apply: applies one push to the handle (raises :class:`ProtocolError` for a lie).
    :param ended: whether the handle has read the job's end.
    :param backlog: the bytes its pushes brought that its consumer has not taken yet: a call
        that ended at its budget is followed at once by the next while they are under one
        budget (no round trip's pause in a fast stream; at most two budgets held).
    """

    def __init__(
        self,
        rpc: RpcClient,
        job_id: str,
        params: Callable[[], FollowParams],
        apply: Callable[[Push, memoryview | None], None],
        ended: Callable[[], bool],
        timeout: float,
        backlog: Callable[[], int],
    ) -> None:
        self._rpc = rpc
        self._backlog = backlog
        self._job_id = job_id
        self._params = params
        self._apply = apply
        self._ended = ended
        self._timeout = timeout
        self._max_bytes = 0  # of the call under way: what bounds its pushes' payloads
        self._task: asyncio.Task[None] | None = None
        self._arrival: asyncio.Future[None] | None = None
        self._error: BaseException | None = None

    def start(self) -> None:
        """Start a call unless one is under way or the job's end was read (a prefetch). A
        call that ended well is replaced; a failed one is kept for :meth:`more` to raise."""
        task = self._task
        if task is not None and task.done() and (task.cancelled() or task.exception() is None):
            self._task = None  # its budget or quiet wait ended it: a prefetch starts the next
        if self._task is None and not self._ended():
            self._task = asyncio.get_running_loop().create_task(self._follow())
            self._task.add_done_callback(self._call_ended)

    def _call_ended(self, task: asyncio.Task[None]) -> None:
        # Seen here, kept for more(): a handle whose consumer stopped reading must not leave
        # "Task exception was never retrieved" behind when its last call fails (a closed sandbox).
        if task.cancelled() or task.exception() is not None:
            return
        if self._task is task and self._backlog() < FOLLOW_BUDGET:
            self.start()  # it ended at its budget or a quiet wait: the next goes on at once

    async def more(self, queued: Callable[[], bool]) -> None:
        """Return once ``queued()`` (a push brought events) or the call under way ended; a call
        is started if none is. Raises the call's failure once nothing it brought is waiting.

        Cancelled: the call goes on in the background until its budget or quiet wait ends it
        (its pushes, if any, are applied: nothing is lost for a later reader of this handle).
        """
        if self._error is not None and not queued():
            error, self._error = self._error, None
            raise error
        self.start()
        task = self._task
        if task is not None and not task.done() and not queued():
            arrival = self._arrival = asyncio.get_running_loop().create_future()
            task.add_done_callback(lambda _: None if arrival.done() else arrival.set_result(None))
            try:
                await arrival
            finally:
                self._arrival = None
        if task is not None and task.done():
            if self._task is task:  # (not the next one, which its end may have started)
                self._task = None
            failure = None if task.cancelled() else task.exception()
            if failure is not None:
                if queued():
                    self._error = failure  # raised once what it brought was taken
                else:
                    raise failure

    def cancel(self) -> None:
        """Stop following (a kill: the rest of the output is not wanted)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _follow(self) -> None:
        def params() -> FollowParams:
            p = self._params()
            self._max_bytes = p.max_bytes
            return p

        result = await self._rpc.stream(
            Method.EXEC_REMOTE_FOLLOW, params, FollowResult, self._on_push, timeout=self._timeout
        )
        if result.ended and not self._ended():
            raise ProtocolError(f"job {self._job_id}: the agent said its follow ended with the job, but sent no end")

    def _on_push(self, frame: frames.Frame) -> None:
        # Bounds before parsing, as for any answer: the agent is not trusted.
        if len(frame.message) > MAX_MESSAGE:
            raise ProtocolError(f"job {self._job_id}: a {len(frame.message)}-byte push, over the {MAX_MESSAGE} bound")
        payload = None if frame.payload is None else memoryview(frame.payload)
        if payload is not None and len(payload) > 2 * self._max_bytes:
            raise ProtocolError(f"job {self._job_id}: a push of {len(payload)} bytes for chunks of {self._max_bytes}")
        try:
            push = _PushEnvelope.model_validate_json(frame.message).params
        except ValidationError as exc:
            raise ProtocolError(f"job {self._job_id}: malformed push from the agent: {one_line(exc)}") from None
        if push.job_id != self._job_id:
            raise ProtocolError(f"job {self._job_id}: a push for another job, refused")
        if self._ended():
            return  # the end was read (this call is being dropped): nothing after it counts
        self._apply(push, payload)
        if self._arrival is not None and not self._arrival.done():
            self._arrival.set_result(None)
        if self._ended() and self._task is not None:
            # The end is read: the call's own answer says nothing more (and, lost, would only
            # be asked for again).
            self._task.cancel()
