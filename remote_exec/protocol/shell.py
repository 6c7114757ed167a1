"""Wire models of the ``shell_*`` methods: persistent shell sessions."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from .base import JobId, WireModel
from .jobs import Tags

__all__ = [
    "SessionId",
    "ShellIdParams",
    "ShellInfo",
    "ShellListParams",
    "ShellListResult",
    "ShellOpenParams",
    "ShellRunParams",
    "ShellState",
]


ShellState = Literal["open", "closed"]
SessionId = JobId
"""A shell session's id: of the job id form (its runs' ids are ``<session id>-<n>``)."""


class ShellOpenParams(WireModel):
    """Params of ``shell_open``: where the shell starts and what it adds to the environment."""

    cwd: str | None = None
    env: dict[str, str] | None = None


class ShellInfo(WireModel):
    """A shell session, as ``shell_open``, ``shell_list`` and ``shell_close`` report it.

    ``cwd`` is the shell's working directory now (``None`` once closed); ``run_id`` is the job id
    of the run in progress (``busy``); ``exit_code`` and ``closed_reason`` say how it ended.
    """

    session_id: SessionId
    pid: int
    program: str
    state: ShellState
    cwd: str | None
    busy: bool
    run_id: JobId | None
    run_command: str | None
    created_at: float
    last_used_at: float
    exit_code: int | None = None
    closed_reason: str | None = None


class ShellRunParams(WireModel):
    """Params of ``shell_run``: a command line for the session's shell, run to its end.

    The result is a :class:`StartResult`: the run's job id (poll it with ``exec_remote_poll``)
    and the shell's pid. ``input`` becomes the command's stdin (else ``/dev/null``); with
    ``stdin_open`` the stdin stays open after it for ``exec_remote_write_stdin`` (EOF when closed).
    ``timeout`` interrupts the command (SIGINT, then SIGKILL after ``kill_grace``) and keeps
    the shell. ``idempotency_key`` makes a retried call return the run the first one started.
    ``tags`` are stored with the run's job as with ``exec_remote_start`` (e.g. the notebook and
    kernel that ran a ``%%exec_remote --shell`` cell). ``output_cap``: as ``exec_remote_start``'s,
    the bytes per stream of the run's output kept on disk (a durable session's run; default the
    agent's, 1 GiB), the head dropped and counted past it.
    """

    session_id: SessionId
    command: Annotated[str, Field(min_length=1, max_length=1 << 20)]
    input: Annotated[str, Field(max_length=64 * 1024 * 1024)] | None = None
    stdin_open: bool = False
    timeout: Annotated[float, Field(gt=0)] | None = None
    kill_grace: Annotated[float, Field(ge=0, le=3600)] = 5.0
    idempotency_key: Annotated[str, Field(max_length=128)] | None = None
    tags: Tags | None = None
    output_cap: Annotated[int, Field(ge=64 * 1024)] | None = None

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
