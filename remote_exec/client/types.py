"""The host API's value types: options, streaming events and the awaitable result."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal, TypedDict

from ..protocol import JobPolicy

__all__ = [
    "Completed",
    "ExecRemoteEvent",
    "ExecRemoteOptions",
    "ExecResult",
    "OptionOverrides",
    "StderrChunk",
    "StdoutChunk",
    "StreamTruncated",
]


@dataclass(frozen=True, slots=True)
class StdoutChunk:
    """A piece of the job's stdout, in order (``bytes`` for ``encoding="base64"`` jobs)."""

    data: str | bytes


@dataclass(frozen=True, slots=True)
class StderrChunk:
    """A piece of the job's stderr, in order (``bytes`` for ``encoding="base64"`` jobs)."""

    data: str | bytes


@dataclass(frozen=True, slots=True)
class Completed:
    """The job ended; always the last event. ``stdout``/``stderr`` hold the kept tails.

    ``exit_code`` is negative (``-N``) when signal N ended the process. ``reason`` says why
    the agent ended the job by itself (its :class:`~remote_exec.JobPolicy`), else ``None``.
    """

    exit_code: int
    stdout: str | bytes
    stderr: str | bytes
    reason: str | None = None

    @property
    def success(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True, slots=True)
class StreamTruncated:
    """A notice, in order with the chunks: the job truncated its own ``stream``
    (``: > /dev/stdout``), and ``lost`` bytes it had written before were never delivered
    (0: this reader had them all). The chunks that follow are what it wrote afterwards."""

    stream: Literal["stdout", "stderr"]
    lost: int


ExecRemoteEvent = StdoutChunk | StderrChunk | StreamTruncated | Completed
"""What iterating an :class:`ExecRemoteProcess` yields."""


@dataclass(frozen=True, slots=True)
class ExecResult:
    """Outcome of a job run to the end (``stream=False``, ``run()``, ``wait()``).

    When ``output_limit`` kept only the tail of a stream, ``stdout_truncated`` /
    ``stderr_truncated`` count what was cut from its head (characters, or bytes for base64
    jobs; bytes the agent dropped before they were read are counted too). ``reason`` says why
    the agent ended or interrupted the job by itself under its policy ("killed: memory limit
    2.0 GiB exceeded", "killed: watch rule 0 matched 'nan' on stdout"), else ``None``.
    ``state`` ``lost``: the job ended while nothing could record its exit status (``returncode``
    -1, ``reason`` says why).
    """

    success: bool
    returncode: int
    stdout: str | bytes
    stderr: str | bytes
    stdout_truncated: int = 0
    stderr_truncated: int = 0
    job_id: str = ""
    state: Literal["completed", "killed", "timed_out", "lost", "running"] = "completed"
    reason: str | None = None

    @property
    def truncated(self) -> bool:
        """True if either stream lost its head to ``output_limit`` or the agent's buffer."""
        return bool(self.stdout_truncated or self.stderr_truncated)


@dataclass(frozen=True)
class ExecRemoteOptions:
    """How to run a job; every field can also be passed to ``exec_remote`` as a keyword.

    :ivar input: written to stdin, which is then closed (unless ``stdin_open``).
    :ivar cwd: working directory inside the sandbox (``None``: on ``local://`` the client's own
        working directory when the job starts; elsewhere the agent's).
    :ivar env: variables added to (overriding) the agent's environment.
    :ivar user: run as this user (the agent must be able to switch to it).
    :ivar timeout: seconds; enforced inside the sandbox (SIGTERM, then SIGKILL after
        ``kill_grace``); the host then raises :class:`~remote_exec.ExecTimeoutError` carrying
        the partial output.
    :ivar timeout_retry: awaitable mode only: after a timeout, run again up to twice, with
        timeouts of at most 60 s and then 30 s (as inspect's ``exec`` does).
    :ivar poll_interval: the long-poll wait in seconds: how long one poll may wait for output.
        It does not delay output (a poll returns as soon as there is some).
    :ivar stdin_open: keep stdin open for :meth:`ExecRemoteProcess.write_stdin`.
    :ivar kill_grace: seconds between SIGTERM and SIGKILL when killing or timing out.
    :ivar output_limit: per stream, the most the awaitable result and ``Completed`` keep (the
        tail); characters for text, bytes for base64. Streamed chunks are never cut.
    :ivar encoding: ``"utf-8"`` text (invalid bytes become U+FFFD) or ``"base64"`` for bytes.
    :ivar label: a name shown by ``jobs()`` and dashboards.
    :ivar output_cap: per stream, the bytes the agent keeps on disk (None: the agent's default,
        1 GiB; at least 64 KiB); past it the oldest bytes are dropped and counted.
    :ivar tags: notes stored with the job and returned by ``jobs()`` (at most 16; keys up to
        64 characters, values up to 1024), e.g. the notebook that started it.
    :ivar tty: run the job in a pseudo-terminal: ``[ -t 1 ]`` is true, stdin takes keystrokes
        (:meth:`~remote_exec.ExecRemoteProcess.write_stdin`), output is one stream (stderr
        merged into stdout, as a terminal does), ``signal("INT")`` acts as Ctrl-C.
    :ivar tty_size: the terminal's ``(cols, rows)`` (None: 80x24); change it live with
        :meth:`~remote_exec.ExecRemoteProcess.resize`.
    :ivar policy: what the agent does to the job by itself, client or no client: kill it
        once no client is attached, interrupt it when silent, memory and CPU limits, watch
        rules on its output (see :class:`~remote_exec.JobPolicy`).
    """

    input: str | bytes | None = None
    cwd: str | None = None
    env: dict[str, str] | None = None
    user: str | None = None
    timeout: float | None = None
    timeout_retry: bool = False
    poll_interval: float = 10.0
    stdin_open: bool = False
    kill_grace: float = 5.0
    output_limit: int = 10 * 1024 * 1024
    encoding: Literal["utf-8", "base64"] = "utf-8"
    label: str | None = None
    output_cap: int | None = None
    tags: dict[str, str] | None = None
    tty: bool = False
    tty_size: tuple[int, int] | None = None
    policy: JobPolicy | None = None

    def merged(self, overrides: OptionOverrides) -> ExecRemoteOptions:
        """A copy with ``overrides`` applied."""
        return dataclasses.replace(self, **overrides) if overrides else self


class OptionOverrides(TypedDict, total=False):
    """Keyword form of :class:`ExecRemoteOptions` (``exec_remote(cmd, timeout=5)``)."""

    input: str | bytes | None
    cwd: str | None
    env: dict[str, str] | None
    user: str | None
    timeout: float | None
    timeout_retry: bool
    poll_interval: float
    stdin_open: bool
    kill_grace: float
    output_limit: int
    encoding: Literal["utf-8", "base64"]
    label: str | None
    output_cap: int | None
    tags: dict[str, str] | None
    tty: bool
    tty_size: tuple[int, int] | None
    policy: JobPolicy | None
