"""Shared building blocks of the wire models: the strict base model, limits and small types."""

from __future__ import annotations

import signal as _signal
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from .names import job_id_form

__all__ = [
    "DEFAULT_MAX_BYTES",
    "Empty",
    "Encoding",
    "JobId",
    "JobState",
    "MAX_PAGE_ITEMS",
    "MAX_WAIT",
    "Offset",
    "PAGE_BYTES",
    "PROTOCOL_VERSION",
    "TERMINAL_STATES",
    "WireModel",
]


PROTOCOL_VERSION = 8
"""Bumped on any incompatible change; the host refuses an agent with another version.

3: ``exec_remote_list`` and ``file_list`` answer in pages (``after`` / ``next``).
4: jobs outlive the agent: job ids stay valid across agents, ``JobInfo.leftovers``,
``StartParams.output_cap``, ``ServerInfo.keeper_pid``, ``server_handover``, ``exec_remote_read``
(a log at any offset, or its tail), ``exec_remote_forget``, ``exec_remote_prune``.
5: PTY jobs: ``StartParams.tty``/``tty_size``, ``JobInfo.tty``/``tty_size``, ``exec_remote_resize``
(a v4 agent refuses a start that names ``tty`` at all).
6: ``PollParams.hits``: a poll answers as soon as the job has more watch-rule hits than the
caller has seen (a v5 agent refuses a poll that names it).
7: ``JobInfo.last_output_at`` (a v6 host refuses a listing that carries it, so it is a version).
8: ``StartParams.job_id`` (the client chooses the id), ``PollResult.stdout_truncated`` /
``stderr_truncated`` (bytes lost to a job truncating its own log); every job id on the wire is
of the safe form of ``protocol/names.py``."""

MAX_PAGE_ITEMS = 1000
"""Most items one page of ``exec_remote_list`` or ``file_list`` holds."""

PAGE_BYTES = 1024 * 1024
"""The JSON a listing page aims at: the agent ends a page once its items pass this size (a
page always holds at least one item). The host refuses a page over 4 times this."""

DEFAULT_MAX_BYTES = 1024 * 1024
"""Default cap on the bytes of one stream returned by one poll."""

MAX_WAIT = 30.0
"""Longest long-poll the agent honours, in seconds; larger ``wait`` values are clamped."""

Encoding = Literal["utf-8", "base64"]
JobState = Literal["running", "completed", "killed", "timed_out"]
TERMINAL_STATES: frozenset[str] = frozenset({"completed", "killed", "timed_out"})

_SIGNAL_NAMES = frozenset(s.name for s in _signal.Signals)


class WireModel(BaseModel):
    """Base of every wire model: strict, immutable, unknown fields rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class Empty(WireModel):
    """Params or result with no fields."""


JobId = Annotated[str, Field(min_length=1, max_length=128), AfterValidator(job_id_form)]
"""A job's (or shell session's) id, of the safe form of :mod:`.names`: checked wherever a model
carrying one is parsed (a request in the agent, every answer on the host)."""
Offset = Annotated[int, Field(ge=0)]
