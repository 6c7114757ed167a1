"""Wire models of ``exec_remote_follow``: the agent pushes a job's output as it arrives.

A poll is one request and one answer per batch of output; a follow is one request, then as many
**push** frames as there is output, then one answer. Each push is a JSON-RPC notification of
method :data:`PUSH` whose params are a :class:`Push` (a poll's result, the bytes in the frame's
payload, plus the follow's request id and the job's id), so the client applies it as it applies
a poll's answer: its cursors must move by exactly the bytes it carries (plus those dropped). A
reconnect simply follows again from the cursors the client holds: nothing lost, nothing twice.

The call ends with a :class:`FollowResult` once the job's last push went out (its terminal
state), once ``budget`` bytes were pushed (the client asks again when it has room: its memory
stays bounded), or after ``wait`` seconds with nothing to push (a quiet job costs one request
per ``wait``). Pushes of one call are written in order, each after the one before it left: a
slow client slows its own connection, never the job (which writes to disk). The frame stream
only: over HTTP (``remote-exec-agent call``) there is no connection to push on.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from .base import DEFAULT_MAX_BYTES, JobId, Offset, WireModel
from .jobs import PollResult

__all__ = ["DEFAULT_FOLLOW_BUDGET", "PUSH", "FollowParams", "FollowResult", "Push"]

PUSH = "exec_remote_push"
"""The method name of a push notification (the agent sends it; it serves no such method)."""

DEFAULT_FOLLOW_BUDGET = 8 * 1024 * 1024


class FollowParams(WireModel):
    """Params of ``exec_remote_follow``: the cursors the caller holds (as a poll's), the most
    bytes one push carries per stream (``max_bytes``), the bytes after which the call ends
    (``budget``; a push may pass it by at most one chunk), and how long the call stays open
    with nothing to push (``wait``, at most :data:`~remote_exec.protocol.MAX_WAIT` whatever is
    asked). ``hits`` as a poll's: a new watch-rule match is pushed at once, output or not."""

    job_id: JobId
    stdout_offset: Offset = 0
    stderr_offset: Offset = 0
    hits: Offset | None = None
    max_bytes: Annotated[int, Field(ge=1024, le=64 * 1024 * 1024)] = DEFAULT_MAX_BYTES
    budget: Annotated[int, Field(ge=64 * 1024, le=1024 * 1024 * 1024)] = DEFAULT_FOLLOW_BUDGET
    wait: Annotated[float, Field(ge=0)] = 10.0


class FollowResult(WireModel):
    """Result of ``exec_remote_follow``: how many pushes it sent and whether the last one
    carried the job's end (``ended``; else the client follows again from its cursors)."""

    pushes: Offset
    ended: bool


class Push(PollResult):
    """The params of one push: a binary poll's result for ``job_id``, sent for the follow
    request ``call``; the bytes are the frame's payload (``payload_sizes``: stdout's, then
    stderr's)."""

    call: Annotated[int, Field(ge=0)]
    job_id: JobId
