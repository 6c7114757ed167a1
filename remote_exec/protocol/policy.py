"""Wire models of a job's policy: what the agent does on its own, with no client, to a job.

A :class:`JobPolicy` travels in ``exec_remote_start`` (``StartParams.policy``) and is enforced
inside the sandbox, so it holds when the host is gone: kill a throwaway job once no client has
been attached for ``disconnect_grace`` seconds, interrupt or kill a job silent for
``idle_timeout`` seconds, kill one past its ``memory_limit`` or ``cpu_time``, run it at a lower
priority (``nice``), and act on output lines matching ``on_output`` rules. Why a job was ended
by the agent is its ``reason`` (in ``JobInfo`` and the poll that reports the end); each rule
match is a :class:`WatchHit` on the job.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from .base import Offset, WireModel

__all__ = [
    "MAX_HITS_KEPT",
    "MAX_RULES",
    "MAX_RULE_PATTERN",
    "DisconnectAction",
    "IdleAction",
    "JobPolicy",
    "RuleAction",
    "WatchHit",
    "WatchRule",
]

MAX_RULES = 16
"""Most watch rules a job carries (each one is run over every output line)."""

MAX_RULE_PATTERN = 512
"""Longest pattern of a watch rule, in characters."""

MAX_HITS_KEPT = 64
"""Watch hits kept per job (the first ones; ``hits_total`` counts them all)."""

DisconnectAction = Literal["keep", "kill"]
IdleAction = Literal["interrupt", "kill"]
RuleAction = Literal["notify", "interrupt", "kill"]

_Seconds = Annotated[float, Field(gt=0, le=365 * 86_400.0)]


class WatchRule(WireModel):
    """Act when an output line matches ``pattern``.

    ``pattern`` is a regular expression (Python ``re`` syntax, run by the ``regex`` module with
    a time limit), searched in each line of ``stream`` (``"both"``: stdout and stderr).
    ``notify`` only records the hit; ``interrupt`` sends SIGINT to the job's group; ``kill``
    ends its tree. ``once``: the rule stops after its first hit.
    """

    pattern: Annotated[str, Field(min_length=1, max_length=MAX_RULE_PATTERN)]
    action: RuleAction = "notify"
    stream: Literal["stdout", "stderr", "both"] = "both"
    once: bool = False

    @field_validator("pattern")
    @classmethod
    def _no_nul(cls, v: str) -> str:
        if "\x00" in v:
            raise ValueError("a watch pattern must not contain NUL characters")
        return v


class JobPolicy(WireModel):
    """What the agent does to a job by itself (see the module docstring).

    :ivar on_disconnect: ``"keep"`` (default: long jobs outlive their kernel) or ``"kill"``
        once no client has been attached for ``disconnect_grace`` seconds. A client is attached
        while a connection that started, polled, read, signalled or asked the stats of the job
        is open and heard from within the last ``disconnect_grace`` seconds (clients send a
        heartbeat every few seconds, so a frozen client counts as gone too).
    :ivar idle_timeout: seconds with no output on either stream before ``idle_action``.
    :ivar idle_action: ``"interrupt"`` (SIGINT to the group; the job decides) or ``"kill"``.
    :ivar memory_limit: bytes of resident memory (the whole tree's RSS, checked every
        second); past it the tree is killed.
    :ivar cpu_time: seconds of CPU the whole tree may use; past it the tree is killed.
    :ivar nice: the job's niceness (0-19: it can only be made to yield, never to take more).
    :ivar on_output: watch rules, evaluated in the agent over each output line.
    """

    on_disconnect: DisconnectAction = "keep"
    disconnect_grace: _Seconds = 30.0
    idle_timeout: _Seconds | None = None
    idle_action: IdleAction = "interrupt"
    memory_limit: Annotated[int, Field(ge=1 << 20, le=1 << 50)] | None = None
    cpu_time: _Seconds | None = None
    nice: Annotated[int, Field(ge=0, le=19)] | None = None
    on_output: Annotated[list[WatchRule], Field(max_length=MAX_RULES)] = Field(default_factory=list)

    @property
    def active(self) -> bool:
        """True if the agent has anything to watch for this job (``nice`` is applied at start)."""
        return bool(
            self.on_disconnect == "kill"
            or self.idle_timeout is not None
            or self.memory_limit is not None
            or self.cpu_time is not None
            or self.on_output
        )


class WatchHit(WireModel):
    """One match of a watch rule: which rule (its index in ``on_output``), what it did, where.

    ``offset`` is the byte offset in ``stream`` where the matching line starts; ``line`` its
    first 256 characters; ``at`` the agent's wall-clock time of the match.
    """

    rule: Annotated[int, Field(ge=0, lt=MAX_RULES)]
    pattern: Annotated[str, Field(max_length=MAX_RULE_PATTERN)]
    action: RuleAction
    stream: Literal["stdout", "stderr"]
    offset: Offset
    line: Annotated[str, Field(max_length=256)]
    at: float
