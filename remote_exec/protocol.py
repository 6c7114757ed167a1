"""Wire models of the agent's JSON-RPC 2.0 protocol: the only module host and agent share.

Every method has a params model and a result model, all strict (``extra="forbid"``), so a typo
in a field name is an ``InvalidParams`` error rather than a silently ignored option. The method
table :data:`METHODS` ties each name to its two models; the agent dispatches with it and the
host validates results with it.

Output travels as **byte cursors**: a poll names the byte offsets the caller already holds in
each stream and gets the data that follows, so a lost response is simply asked for again.
"""

from __future__ import annotations

import os
import signal as _signal
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .errors import (
    ERROR_CLASSES,
    RemoteExecError,
    error_from_wire,
)

__all__ = [
    "DEFAULT_MAX_BYTES",
    "ERROR_CLASSES",
    "MAX_WAIT",
    "METHODS",
    "PROTOCOL_VERSION",
    "Empty",
    "Encoding",
    "JobIdParams",
    "JobInfo",
    "JobState",
    "KillParams",
    "KillResult",
    "ListResult",
    "Method",
    "MethodSpec",
    "PollParams",
    "PollResult",
    "RemoteExecError",
    "ServerInfo",
    "ShellIdParams",
    "ShellInfo",
    "ShellListParams",
    "ShellListResult",
    "ShellOpenParams",
    "ShellRunParams",
    "ShellState",
    "SignalParams",
    "StartParams",
    "StartResult",
    "WireModel",
    "WriteStdinParams",
    "WriteStdinResult",
    "default_agent_dir",
    "error_from_wire",
]

PROTOCOL_VERSION = 1
"""Bumped on any incompatible change; the host refuses an agent with another version."""

DEFAULT_MAX_BYTES = 1024 * 1024
"""Default cap on the bytes of one stream returned by one poll."""

MAX_WAIT = 30.0
"""Longest long-poll the agent honours, in seconds; larger ``wait`` values are clamped."""

Encoding = Literal["utf-8", "base64"]
JobState = Literal["running", "completed", "killed", "timed_out"]
TERMINAL_STATES: frozenset[str] = frozenset({"completed", "killed", "timed_out"})

_SIGNAL_NAMES = frozenset(s.name for s in _signal.Signals)


class Method(StrEnum):
    """Names of the JSON-RPC methods the agent serves."""

    EXEC_REMOTE_START = "exec_remote_start"
    EXEC_REMOTE_POLL = "exec_remote_poll"
    EXEC_REMOTE_WRITE_STDIN = "exec_remote_write_stdin"
    EXEC_REMOTE_SIGNAL = "exec_remote_signal"
    EXEC_REMOTE_KILL = "exec_remote_kill"
    EXEC_REMOTE_LIST = "exec_remote_list"
    EXEC_REMOTE_RELEASE = "exec_remote_release"
    SERVER_INFO = "server_info"
    SHELL_OPEN = "shell_open"
    SHELL_RUN = "shell_run"
    SHELL_LIST = "shell_list"
    SHELL_CLOSE = "shell_close"
    SHELL_INTERRUPT = "shell_interrupt"


class WireModel(BaseModel):
    """Base of every wire model: strict, immutable, unknown fields rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Empty(WireModel):
    """Params or result with no fields."""


JobId = Annotated[str, Field(min_length=1, max_length=128)]
Offset = Annotated[int, Field(ge=0)]


class StartParams(WireModel):
    """Params of ``exec_remote_start``: what to run and how.

    ``command`` as a list is run directly (no shell); as a string it is run by ``/bin/sh -c``.
    ``env`` adds to (and overrides) the agent's environment. ``input`` is written to stdin, which
    is then closed unless ``stdin_open``. ``timeout`` (seconds) is enforced inside the sandbox:
    the job's process group gets SIGTERM, then SIGKILL after ``kill_grace``. With
    ``encoding="base64"`` output (and ``input``) travel base64-encoded, byte-exact.
    ``idempotency_key`` makes a retried start return the job the first attempt created.
    """

    command: (
        Annotated[list[Annotated[str, Field(max_length=1 << 20)]], Field(min_length=1)]
        | Annotated[str, Field(min_length=1, max_length=1 << 20)]
    )
    cwd: str | None = None
    env: dict[str, str] | None = None
    user: str | None = None
    input: str | None = None
    stdin_open: bool = False
    timeout: Annotated[float, Field(gt=0)] | None = None
    kill_grace: Annotated[float, Field(ge=0, le=3600)] = 5.0
    encoding: Encoding = "utf-8"
    label: Annotated[str, Field(max_length=256)] | None = None
    idempotency_key: Annotated[str, Field(max_length=128)] | None = None

    @field_validator("command")
    @classmethod
    def _no_nul(cls, v: list[str] | str) -> list[str] | str:
        parts = [v] if isinstance(v, str) else v
        if any("\x00" in p for p in parts):
            raise ValueError("command must not contain NUL characters")
        return v


class StartResult(WireModel):
    """Result of ``exec_remote_start``: a unique job id (never a recycled PID) and the PID."""

    job_id: str
    pid: int


class PollParams(WireModel):
    """Params of ``exec_remote_poll``: the byte cursors the caller holds, and a long-poll wait."""

    job_id: JobId
    stdout_offset: Offset = 0
    stderr_offset: Offset = 0
    wait: Annotated[float, Field(ge=0)] = 0.0
    max_bytes: Annotated[int, Field(ge=1024, le=64 * 1024 * 1024)] = DEFAULT_MAX_BYTES


class PollResult(WireModel):
    """Result of ``exec_remote_poll``.

    ``stdout``/``stderr`` hold the data after the caller's offsets; ``*_offset`` are the new
    cursors; ``*_dropped`` count bytes between the caller's offset and the oldest byte the agent
    still held (they fell out of its bounded buffer before anyone read them). ``state`` is
    terminal only in the response that returns the last byte of both streams.
    """

    state: JobState
    exit_code: int | None = None
    stdout: str
    stderr: str
    stdout_offset: Offset
    stderr_offset: Offset
    stdout_dropped: Offset = 0
    stderr_dropped: Offset = 0


class WriteStdinParams(WireModel):
    """Params of ``exec_remote_write_stdin``; ``data`` is base64 for base64-encoded jobs.

    ``offset`` is the stdin byte cursor where ``data`` starts: bytes the agent already wrote are
    skipped, so a retried write is never duplicated. ``None`` appends.
    """

    job_id: JobId
    data: Annotated[str, Field(max_length=64 * 1024 * 1024)] = ""
    offset: Offset | None = None
    eof: bool = False


class WriteStdinResult(WireModel):
    """Bytes accepted into the job's stdin."""

    written: int


class SignalParams(WireModel):
    """Params of ``exec_remote_signal``: a signal name ("SIGINT") or number, sent to the group."""

    job_id: JobId
    signal: str | Annotated[int, Field(ge=1, le=64)]

    @field_validator("signal")
    @classmethod
    def _known_signal(cls, v: str | int) -> str | int:
        if isinstance(v, str) and v.upper() not in _SIGNAL_NAMES:
            raise ValueError(f"unknown signal name {v!r}")
        return v.upper() if isinstance(v, str) else v


class KillParams(WireModel):
    """Params of ``exec_remote_kill``; ``grace`` overrides the job's ``kill_grace``."""

    job_id: JobId
    grace: Annotated[float, Field(ge=0, le=3600)] | None = None


class KillResult(WireModel):
    """The job's state and exit code once the kill has finished (the group is gone)."""

    state: JobState
    exit_code: int | None = None


class JobIdParams(WireModel):
    """Params naming one job."""

    job_id: JobId


class JobInfo(WireModel):
    """One row of ``exec_remote_list``."""

    job_id: str
    pid: int
    command: list[str] | str
    label: str | None
    state: JobState
    exit_code: int | None
    started_at: float
    ended_at: float | None
    stdout_bytes: int
    stderr_bytes: int
    stdin_open: bool
    stdin_bytes: int
    encoding: Encoding


class ListResult(WireModel):
    """Running and retained jobs, oldest first."""

    jobs: list[JobInfo]


class ServerInfo(WireModel):
    """Result of ``server_info``.

    ``instance_id`` changes every time an agent starts; job ids carry it, which is how a client
    tells "job released" from "the agent restarted and every job died with it".
    """

    version: str
    protocol_version: int
    pid: int
    started_at: float
    instance_id: str
    capabilities: list[str]


ShellState = Literal["open", "closed"]
SessionId = Annotated[str, Field(min_length=1, max_length=128)]


class ShellOpenParams(WireModel):
    """Params of ``shell_open``: where the shell starts and what it adds to the environment."""

    cwd: str | None = None
    env: dict[str, str] | None = None


class ShellInfo(WireModel):
    """A shell session, as ``shell_open``, ``shell_list`` and ``shell_close`` report it.

    ``cwd`` is the shell's working directory now (``None`` once closed); ``run_id`` is the job id
    of the run in progress (``busy``); ``exit_code`` and ``closed_reason`` say how it ended.
    """

    session_id: str
    pid: int
    program: str
    state: ShellState
    cwd: str | None
    busy: bool
    run_id: str | None
    run_command: str | None
    created_at: float
    last_used_at: float
    exit_code: int | None = None
    closed_reason: str | None = None


class ShellRunParams(WireModel):
    """Params of ``shell_run``: a command line for the session's shell, run to its end.

    The result is a :class:`StartResult`: the run's job id (poll it with ``exec_remote_poll``)
    and the shell's pid. ``input`` becomes the command's stdin (else ``/dev/null``).
    ``timeout`` interrupts the command (SIGINT, then SIGKILL after ``kill_grace``) and keeps
    the shell. ``idempotency_key`` makes a retried call return the run the first one started.
    """

    session_id: SessionId
    command: Annotated[str, Field(min_length=1, max_length=1 << 20)]
    input: Annotated[str, Field(max_length=64 * 1024 * 1024)] | None = None
    timeout: Annotated[float, Field(gt=0)] | None = None
    kill_grace: Annotated[float, Field(ge=0, le=3600)] = 5.0
    idempotency_key: Annotated[str, Field(max_length=128)] | None = None

    @field_validator("command")
    @classmethod
    def _no_nul(cls, v: str) -> str:
        if "\x00" in v:
            raise ValueError("command must not contain NUL characters")
        return v


class ShellIdParams(WireModel):
    """Params naming one shell session."""

    session_id: SessionId


class ShellListParams(WireModel):
    """Params of ``shell_list``: every session, or just ``session_id`` (an error if unknown)."""

    session_id: SessionId | None = None


class ShellListResult(WireModel):
    """Open and recently closed shell sessions, oldest first."""

    shells: list[ShellInfo]


class MethodSpec(WireModel):
    """A method's params and result models."""

    params: type[WireModel]
    result: type[WireModel]


METHODS: dict[str, MethodSpec] = {
    Method.EXEC_REMOTE_START: MethodSpec(params=StartParams, result=StartResult),
    Method.EXEC_REMOTE_POLL: MethodSpec(params=PollParams, result=PollResult),
    Method.EXEC_REMOTE_WRITE_STDIN: MethodSpec(params=WriteStdinParams, result=WriteStdinResult),
    Method.EXEC_REMOTE_SIGNAL: MethodSpec(params=SignalParams, result=Empty),
    Method.EXEC_REMOTE_KILL: MethodSpec(params=KillParams, result=KillResult),
    Method.EXEC_REMOTE_LIST: MethodSpec(params=Empty, result=ListResult),
    Method.EXEC_REMOTE_RELEASE: MethodSpec(params=JobIdParams, result=Empty),
    Method.SERVER_INFO: MethodSpec(params=Empty, result=ServerInfo),
    Method.SHELL_OPEN: MethodSpec(params=ShellOpenParams, result=ShellInfo),
    Method.SHELL_RUN: MethodSpec(params=ShellRunParams, result=StartResult),
    Method.SHELL_LIST: MethodSpec(params=ShellListParams, result=ShellListResult),
    Method.SHELL_CLOSE: MethodSpec(params=ShellIdParams, result=ShellInfo),
    Method.SHELL_INTERRUPT: MethodSpec(params=ShellIdParams, result=Empty),
}
"""Every method the agent serves, with its params and result models."""


def default_agent_dir() -> Path:
    """The agent's per-user state dir when none is given (the local sandbox finds it here too).

    ``$REMOTE_EXEC_AGENT_DIR``, else ``$XDG_RUNTIME_DIR/remote-exec``, else ``/tmp/remote-exec-<uid>``.
    """
    env = os.environ.get("REMOTE_EXEC_AGENT_DIR")
    if env:
        return Path(env)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "remote-exec"
    return Path(f"/tmp/remote-exec-{os.geteuid()}")
