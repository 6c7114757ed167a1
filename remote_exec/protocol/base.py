"""Shared building blocks of the wire models: the strict base model, limits and small types."""

from __future__ import annotations

import signal as _signal
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from .method_names import PROTOCOL_VERSION
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
JobState = Literal["running", "completed", "killed", "timed_out", "lost"]
"""``lost``: the job ended while nothing could record its exit status (neither the agent nor its
keeper ran); the result's ``reason`` says so. Never ``completed`` without an exit code."""
TERMINAL_STATES: frozenset[str] = frozenset({"completed", "killed", "timed_out", "lost"})

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
