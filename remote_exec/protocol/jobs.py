"""Wire models of the ``exec_remote_*`` methods and ``server_info``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, ValidationInfo, field_validator

from .base import _SIGNAL_NAMES, DEFAULT_MAX_BYTES, MAX_PAGE_ITEMS, Encoding, JobId, JobState, Offset, WireModel
from .names import TAG_KEY_MAX, WRITER_PATTERN, tag_key_form, tags_form
from .policy import MAX_HITS_KEPT, MAX_RULES, JobPolicy, WatchHit

MAX_TAGS = 16
"""The most tags a job carries (each key at most 64 characters, each value at most 1024)."""

Tags = Annotated[
    dict[
        Annotated[str, Field(min_length=1, max_length=TAG_KEY_MAX), AfterValidator(tag_key_form)],
        Annotated[str, Field(max_length=1024)],
    ],
    Field(max_length=MAX_TAGS),
    AfterValidator(tags_form),
]
"""A job's tags, bounded so a job list stays small whatever the starter sent; keys printable,
and the ``name`` tag (a notebook's ``--name``) a safe Python name (see ``protocol/names.py``)."""

__all__ = [
    "MAX_TAGS",
    "JobIdParams",
    "JobInfo",
    "KillParams",
    "KillResult",
    "ListParams",
    "ListResult",
    "PollParams",
    "PollResult",
    "PruneParams",
    "PruneResult",
    "ReadParams",
    "ReadResult",
    "ResizeParams",
    "ServerInfo",
    "SignalParams",
    "StartParams",
    "StartResult",
    "Tags",
    "TtySize",
    "WriteStdinParams",
    "WriteStdinResult",
]


TtyCells = Annotated[int, Field(ge=1, le=1000)]
"""Columns or rows of a terminal: 1 to 1000 (a 4K screen in a small font is about 500 wide)."""


class TtySize(WireModel):
    """A terminal's size in character cells (the default is the classic 80x24)."""

    cols: TtyCells = 80
    rows: TtyCells = 24


class StartParams(WireModel):
    """Params of ``exec_remote_start``: what to run and how.

    ``command`` as a list is run directly (no shell); as a string it is run by ``/bin/sh -c``.
    ``env`` adds to (and overrides) the agent's environment. ``input`` is written to stdin, which
    is then closed unless ``stdin_open``. ``timeout`` (seconds) is enforced inside the sandbox:
    the job's process group gets SIGTERM, then SIGKILL after ``kill_grace``. With
    ``encoding="base64"`` output (and ``input``) travel base64-encoded, byte-exact.
    ``idempotency_key`` makes a retried start return the job the first attempt created.
    ``job_id``: the id the client chose for the job (the safe form of ``protocol/names.py``; not
    one of the agent's own ``<state dir id>-<n>``): a repeated start under an id the agent holds
    answers with that job if it runs the same command, and is refused otherwise. None: the agent
    makes one up.
    ``output_cap``: bytes of each output stream kept on disk (default: the agent's, 1 GiB);
    past it the oldest bytes are dropped, and counted, as ``*_dropped``.
    ``tags`` are the starter's own bounded notes on the job (e.g. the notebook and kernel that
    started it), stored with it and returned by ``exec_remote_list``; the agent never reads them.
    ``tty``: run the job in a pseudo-terminal of ``tty_size`` (default 80x24): stdin is the
    keyboard, stdout carries the screen (stderr merged, as a terminal does; the stderr stream
    stays empty), ``TERM`` is ``xterm-256color`` unless ``env`` sets it.
    ``policy``: what the agent does to the job by itself (see :class:`JobPolicy`).
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
    job_id: JobId | None = None
    output_cap: Annotated[int, Field(ge=64 * 1024)] | None = None
    tags: Tags | None = None
    tty: bool = False
    tty_size: TtySize | None = None
    policy: JobPolicy | None = None

    @field_validator("command")
    @classmethod
    def _no_nul(cls, v: list[str] | str) -> list[str] | str:
        parts = [v] if isinstance(v, str) else v
        if any("\x00" in p for p in parts):
            raise ValueError("command must not contain NUL characters")
        return v


_Reason = Annotated[str, Field(max_length=512)]


class StartResult(WireModel):
    """Result of ``exec_remote_start``: a unique job id (never a recycled PID) and the PID."""

    job_id: JobId
    pid: int


class PollParams(WireModel):
    """Params of ``exec_remote_poll``: the byte cursors the caller holds, and a long-poll wait.

    With ``binary``, the output travels raw in the response's payload (stdout's bytes, then
    stderr's) rather than as JSON strings: no escaping, no base64. Text jobs still get slices
    cut on a character boundary. ``hits``: the watch-rule matches the caller has seen (the last
    result's ``hits``); the poll answers as soon as the job has more, output or not, so a rule
    that fires on a job's last line reaches a waiting client at once (None: only a match made
    during the wait answers early).
    """

    job_id: JobId
    stdout_offset: Offset = 0
    stderr_offset: Offset = 0
    wait: Annotated[float, Field(ge=0)] = 0.0
    max_bytes: Annotated[int, Field(ge=1024, le=64 * 1024 * 1024)] = DEFAULT_MAX_BYTES
    binary: bool = False
    hits: Offset | None = None


class PollResult(WireModel):
    """Result of ``exec_remote_poll``.

    ``stdout``/``stderr`` hold the data after the caller's offsets; ``*_offset`` are the new
    cursors; ``*_dropped`` count bytes between the caller's offset and the oldest byte the agent
    still held (they fell out of its bounded buffer before anyone read them). ``state`` is
    terminal only in the response that returns the last byte of both streams.
    ``payload_sizes`` is set when the data is in the payload (a ``binary`` poll): the byte
    counts of stdout and stderr there, in that order; ``stdout``/``stderr`` are then empty.
    ``reason``: why the agent ended the job by itself (its policy), with the terminal state;
    ``hits``: how many watch-rule matches the job has had so far (``JobInfo.hits`` lists them).
    ``*_truncated``: the part of ``*_dropped`` that the job itself took away by truncating its
    own log (``: > /dev/stdout``); the cursor then jumps past what was lost, and what the job
    wrote after the truncation follows.
    """

    state: JobState
    exit_code: int | None = None
    stdout: str
    stderr: str
    stdout_offset: Offset
    stderr_offset: Offset
    stdout_dropped: Offset = 0
    stderr_dropped: Offset = 0
    stdout_truncated: Offset = 0
    stderr_truncated: Offset = 0
    payload_sizes: tuple[Offset, Offset] | None = None
    reason: _Reason | None = None
    hits: Offset = 0


class ReadParams(WireModel):
    """Params of ``exec_remote_read``: up to ``max_bytes`` of one stream from ``offset``, or, with
    ``tail``, its last ``tail`` bytes, or, with ``since`` (wall-clock seconds since the epoch),
    from where the bytes written at or after that time begin, to the second (``offset`` is then
    ignored; ``tail`` and ``since`` exclude each other). It answers at once (no wait) and moves
    no cursor: any number of readers may read a job's log at any offset."""

    job_id: JobId
    stream: Literal["stdout", "stderr"] = "stdout"
    offset: Offset = 0
    tail: Annotated[int, Field(ge=0, le=64 * 1024 * 1024)] | None = None
    since: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    max_bytes: Annotated[int, Field(ge=1, le=64 * 1024 * 1024)] = DEFAULT_MAX_BYTES


class ReadResult(WireModel):
    """Result of ``exec_remote_read``; the bytes are the response's payload.

    ``offset``: where the payload starts (past the asked offset by ``dropped`` bytes that the disk
    cap dropped); ``size``: the stream's bytes written so far; ``state``/``exit_code``: the job's
    now. The stream is complete once ``state`` is terminal and ``offset`` + payload == ``size``.
    """

    offset: Offset
    dropped: Offset
    size: Offset
    state: JobState
    exit_code: int | None = None


class PruneParams(WireModel):
    """Params of ``exec_remote_prune``: forget ended jobs (record and logs) that ended more than
    ``older_than`` seconds ago, or beyond the newest ``keep`` ended ones. Running jobs stay."""

    older_than: Annotated[float, Field(ge=0)] | None = None
    keep: Annotated[int, Field(ge=0)] | None = None


class PruneResult(WireModel):
    """Result of ``exec_remote_prune``: how many jobs were forgotten, and (at most a page of) their ids."""

    forgotten: Offset
    job_ids: Annotated[list[JobId], Field(max_length=MAX_PAGE_ITEMS)]


class WriteStdinParams(WireModel):
    """Params of ``exec_remote_write_stdin``; ``data`` is base64 for base64-encoded jobs.

    The bytes may come instead as the request's payload (raw, whatever the job's encoding);
    ``data`` must then be empty.

    ``offset`` is the stdin byte cursor where ``data`` starts: bytes the agent already wrote are
    skipped, so a retried write is never duplicated. ``None`` appends.

    ``writer`` names one typist of a terminal (a tty job has many: every view of it sends
    keystrokes): ``offset`` then counts that writer's own bytes, so its retried write is skipped
    as a cursor write is, while other writers' keys go in between (each write is appended).
    """

    job_id: JobId
    data: Annotated[str, Field(max_length=64 * 1024 * 1024)] = ""
    offset: Offset | None = None
    eof: bool = False
    writer: Annotated[str, Field(pattern=rf"^{WRITER_PATTERN}$")] | None = None

    @field_validator("writer")
    @classmethod
    def _writer_has_a_cursor(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and info.data.get("offset") is None:
            raise ValueError("a writer's write needs its offset")
        return v


class WriteStdinResult(WireModel):
    """Bytes accepted into the job's stdin.

    The agent takes only what fits its stdin queue and memory budget (back-pressure, as a pipe
    gives): ``written`` counts the new bytes taken, ``stdin_bytes`` is the job's stdin cursor
    after the write (a named ``writer``'s own cursor); a writer sends the rest from there.
    ``eof`` applied only if all was taken.
    ``stdin_bytes`` is ``None`` from agents that always took everything.
    """

    written: int
    stdin_bytes: int | None = None


class SignalParams(WireModel):
    """Params of ``exec_remote_signal``: a signal name ("SIGINT" or "INT") or number, sent to the
    job's process group (a tty job's: its terminal's foreground group, as Ctrl-C sends)."""

    job_id: JobId
    signal: str | Annotated[int, Field(ge=1, le=64)]

    @field_validator("signal")
    @classmethod
    def _known_signal(cls, v: str | int) -> str | int:
        if isinstance(v, int):
            return v
        name = v.upper() if v.upper().startswith("SIG") else "SIG" + v.upper()  # "INT" as kill -INT takes it
        if name not in _SIGNAL_NAMES:
            raise ValueError(f"unknown signal name {v!r}")
        return name


class ResizeParams(WireModel):
    """Params of ``exec_remote_resize``: the new size of a tty job's terminal (the kernel then
    sends SIGWINCH to the terminal's foreground process group)."""

    job_id: JobId
    cols: TtyCells
    rows: TtyCells


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


_Arg = Annotated[str, Field(max_length=1 << 20)]


class JobInfo(WireModel):
    """One row of ``exec_remote_list`` (its strings bounded as :class:`StartParams` bounds them).

    ``leftovers``: pids of the job's processes still alive after its leader exited (``sleep 300 &``
    in a finished script); ``exec_remote_kill`` on the ended job ends them. ``tty``: the job runs
    in a pseudo-terminal, whose current size is ``tty_size`` (a second viewer sizes itself by it).
    ``policy``: the job's policy as started; ``reason``: why the agent ended or interrupted it
    by itself ("killed: memory limit 2.0 GiB exceeded"); ``hits``: its first watch-rule
    matches, ``hits_total`` all of them; ``rules_disabled``: watch rules the agent stopped
    running (a match took too long: a catastrophic pattern); ``watch_skipped``: output bytes
    the rules never saw (the job wrote faster than they are run, see docs/concepts.md).
    ``last_output_at``: when the job last wrote to stdout or stderr (seconds since the epoch, on
    the sandbox's clock; None: nothing yet), so a listing tells how long a running job is quiet."""

    job_id: JobId
    pid: int
    command: Annotated[list[_Arg], Field(max_length=1 << 16)] | _Arg
    label: Annotated[str, Field(max_length=256)] | None
    state: JobState
    exit_code: int | None
    started_at: float
    ended_at: float | None
    stdout_bytes: int
    stderr_bytes: int
    last_output_at: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    stdin_open: bool
    stdin_bytes: int
    encoding: Encoding
    leftovers: list[int] = Field(default_factory=list, max_length=1024)
    tags: Tags | None = None
    tty: bool = False
    tty_size: TtySize | None = None
    policy: JobPolicy | None = None
    reason: _Reason | None = None
    hits: Annotated[list[WatchHit], Field(max_length=MAX_HITS_KEPT)] = Field(default_factory=list)
    hits_total: Offset = 0
    rules_disabled: Annotated[list[Annotated[int, Field(ge=0, lt=MAX_RULES)]], Field(max_length=MAX_RULES)] = Field(
        default_factory=list
    )
    watch_skipped: Offset = 0


class ListParams(WireModel):
    """Params of ``exec_remote_list``: the page after job ``after`` (``None``: the first page),
    at most ``limit`` jobs (fewer when their JSON passes :data:`PAGE_BYTES`)."""

    after: JobId | None = None
    limit: Annotated[int, Field(ge=1, le=MAX_PAGE_ITEMS)] = MAX_PAGE_ITEMS


class ListResult(WireModel):
    """One page of running and retained jobs, oldest first. ``next``: more follow; ask again
    with ``after=next`` (the last job of this page)."""

    jobs: Annotated[list[JobInfo], Field(max_length=MAX_PAGE_ITEMS)]
    next: JobId | None = None


class ServerInfo(WireModel):
    """Result of ``server_info``.

    ``instance_id`` changes every time an agent starts. Job ids do not carry it (jobs outlive
    the agent): they carry the state dir's id. ``keeper_pid`` is the process that holds the jobs
    while agents come and go (``None``: an agent run without one, whose jobs die with it).
    """

    version: Annotated[str, Field(max_length=64)]
    protocol_version: int
    pid: int
    started_at: float
    instance_id: Annotated[str, Field(max_length=128)]
    capabilities: Annotated[list[Annotated[str, Field(max_length=64)]], Field(max_length=256)]
    keeper_pid: int | None = None
