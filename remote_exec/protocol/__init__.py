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
import stat
from enum import StrEnum
from pathlib import Path

from ..errors import ERROR_CLASSES, RemoteExecError, error_from_wire
from .base import (
    DEFAULT_MAX_BYTES,
    MAX_PAGE_ITEMS,
    MAX_WAIT,
    PAGE_BYTES,
    PROTOCOL_VERSION,
    TERMINAL_STATES,
    Empty,
    Encoding,
    JobState,
    WireModel,
)
from .files import (
    DEFAULT_CHUNK,
    MAX_CHUNK,
    MAX_HASH_PATHS,
    MAX_LIST_ENTRIES,
    STAGED_NAME,
    FileHashParams,
    FileHashResult,
    FileInfo,
    FileListParams,
    FileListResult,
    FileMkdirParams,
    FileReadParams,
    FileReadResult,
    FileRemoveParams,
    FileRemoveResult,
    FileSessionParams,
    FileStatParams,
    FileType,
    FileWriteChunkParams,
    FileWriteChunkResult,
    FileWriteCommitParams,
    FileWriteOpenParams,
    FileWriteOpenResult,
    FileWriteParams,
)
from .jobs import (
    JobIdParams,
    JobInfo,
    KillParams,
    KillResult,
    ListParams,
    ListResult,
    PollParams,
    PollResult,
    PruneParams,
    PruneResult,
    ReadParams,
    ReadResult,
    ResizeParams,
    ServerInfo,
    SignalParams,
    StartParams,
    StartResult,
    TtySize,
    WriteStdinParams,
    WriteStdinResult,
)
from .metrics import (
    HEARTBEAT,
    HEARTBEAT_ANSWER,
    MAX_STATS_WINDOW,
    JobStats,
    JobStatsParams,
    SandboxStats,
    SandboxStatsParams,
)
from .ports import (
    PortConnectParams,
    PortConnInfo,
    PortIdParams,
    PortListResult,
    PortRecvParams,
    PortRecvResult,
    PortSendParams,
    PortSendResult,
    PortState,
)
from .shell import (
    ShellIdParams,
    ShellInfo,
    ShellListParams,
    ShellListResult,
    ShellOpenParams,
    ShellRunParams,
    ShellState,
)

__all__ = [
    "DEFAULT_CHUNK",
    "DEFAULT_MAX_BYTES",
    "ERROR_CLASSES",
    "HEARTBEAT",
    "HEARTBEAT_ANSWER",
    "MAX_CHUNK",
    "MAX_HASH_PATHS",
    "STAGED_NAME",
    "MAX_LIST_ENTRIES",
    "MAX_PAGE_ITEMS",
    "MAX_STATS_WINDOW",
    "MAX_WAIT",
    "METHODS",
    "PAGE_BYTES",
    "PROTOCOL_VERSION",
    "STREAM_SOCKET",
    "TERMINAL_STATES",
    "Empty",
    "Encoding",
    "FileHashParams",
    "FileHashResult",
    "FileInfo",
    "FileListParams",
    "FileListResult",
    "FileMkdirParams",
    "FileReadParams",
    "FileReadResult",
    "FileRemoveParams",
    "FileRemoveResult",
    "FileSessionParams",
    "FileStatParams",
    "FileType",
    "FileWriteChunkParams",
    "FileWriteChunkResult",
    "FileWriteCommitParams",
    "FileWriteOpenParams",
    "FileWriteOpenResult",
    "FileWriteParams",
    "JobIdParams",
    "JobInfo",
    "JobState",
    "JobStats",
    "JobStatsParams",
    "KillParams",
    "KillResult",
    "ListParams",
    "ListResult",
    "Method",
    "MethodSpec",
    "PollParams",
    "PollResult",
    "PruneParams",
    "PruneResult",
    "ReadParams",
    "ReadResult",
    "ResizeParams",
    "PortConnInfo",
    "PortConnectParams",
    "PortIdParams",
    "PortListResult",
    "PortRecvParams",
    "PortRecvResult",
    "PortSendParams",
    "PortSendResult",
    "PortState",
    "RemoteExecError",
    "SandboxStats",
    "SandboxStatsParams",
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
    "TtySize",
    "WireModel",
    "WriteStdinParams",
    "WriteStdinResult",
    "default_agent_dir",
    "error_from_wire",
]


class Method(StrEnum):
    """Names of the JSON-RPC methods the agent serves."""

    EXEC_REMOTE_START = "exec_remote_start"
    EXEC_REMOTE_POLL = "exec_remote_poll"
    EXEC_REMOTE_WRITE_STDIN = "exec_remote_write_stdin"
    EXEC_REMOTE_SIGNAL = "exec_remote_signal"
    EXEC_REMOTE_KILL = "exec_remote_kill"
    EXEC_REMOTE_LIST = "exec_remote_list"
    EXEC_REMOTE_RELEASE = "exec_remote_release"
    EXEC_REMOTE_READ = "exec_remote_read"
    EXEC_REMOTE_FORGET = "exec_remote_forget"
    EXEC_REMOTE_PRUNE = "exec_remote_prune"
    EXEC_REMOTE_RESIZE = "exec_remote_resize"
    SERVER_INFO = "server_info"
    SERVER_HANDOVER = "server_handover"
    SHELL_OPEN = "shell_open"
    SHELL_RUN = "shell_run"
    SHELL_LIST = "shell_list"
    SHELL_CLOSE = "shell_close"
    SHELL_INTERRUPT = "shell_interrupt"
    FILE_STAT = "file_stat"
    FILE_READ = "file_read"
    FILE_LIST = "file_list"
    FILE_REMOVE = "file_remove"
    FILE_MKDIR = "file_mkdir"
    FILE_WRITE = "file_write"
    FILE_WRITE_OPEN = "file_write_open"
    FILE_WRITE_CHUNK = "file_write_chunk"
    FILE_WRITE_COMMIT = "file_write_commit"
    FILE_WRITE_ABORT = "file_write_abort"
    FILE_HASH = "file_hash"
    PORT_CONNECT = "port_connect"
    PORT_SEND = "port_send"
    PORT_RECV = "port_recv"
    PORT_CLOSE = "port_close"
    PORT_LIST = "port_list"
    PING = "ping"
    JOB_STATS = "job_stats"
    SANDBOX_STATS = "sandbox_stats"


class MethodSpec(WireModel):
    """A method's params and result models, and whether its messages may carry a payload.

    ``takes_payload``: the request may carry binary data beside its params (see
    :mod:`remote_exec.protocol.frames`); ``gives_payload``: the result may.
    """

    params: type[WireModel]
    result: type[WireModel]
    takes_payload: bool = False
    gives_payload: bool = False


METHODS: dict[str, MethodSpec] = {
    Method.EXEC_REMOTE_START: MethodSpec(params=StartParams, result=StartResult),
    Method.EXEC_REMOTE_POLL: MethodSpec(params=PollParams, result=PollResult, gives_payload=True),
    Method.EXEC_REMOTE_WRITE_STDIN: MethodSpec(params=WriteStdinParams, result=WriteStdinResult, takes_payload=True),
    Method.EXEC_REMOTE_SIGNAL: MethodSpec(params=SignalParams, result=Empty),
    Method.EXEC_REMOTE_KILL: MethodSpec(params=KillParams, result=KillResult),
    Method.EXEC_REMOTE_LIST: MethodSpec(params=ListParams, result=ListResult),
    Method.EXEC_REMOTE_RELEASE: MethodSpec(params=JobIdParams, result=Empty),
    Method.EXEC_REMOTE_READ: MethodSpec(params=ReadParams, result=ReadResult, gives_payload=True),
    Method.EXEC_REMOTE_FORGET: MethodSpec(params=JobIdParams, result=Empty),
    Method.EXEC_REMOTE_PRUNE: MethodSpec(params=PruneParams, result=PruneResult),
    Method.EXEC_REMOTE_RESIZE: MethodSpec(params=ResizeParams, result=Empty),
    Method.SERVER_INFO: MethodSpec(params=Empty, result=ServerInfo),
    Method.SERVER_HANDOVER: MethodSpec(params=Empty, result=ServerInfo),
    Method.SHELL_OPEN: MethodSpec(params=ShellOpenParams, result=ShellInfo),
    Method.SHELL_RUN: MethodSpec(params=ShellRunParams, result=StartResult),
    Method.SHELL_LIST: MethodSpec(params=ShellListParams, result=ShellListResult),
    Method.SHELL_CLOSE: MethodSpec(params=ShellIdParams, result=ShellInfo),
    Method.SHELL_INTERRUPT: MethodSpec(params=ShellIdParams, result=Empty),
    Method.FILE_STAT: MethodSpec(params=FileStatParams, result=FileInfo),
    Method.FILE_READ: MethodSpec(params=FileReadParams, result=FileReadResult, gives_payload=True),
    Method.FILE_LIST: MethodSpec(params=FileListParams, result=FileListResult),
    Method.FILE_REMOVE: MethodSpec(params=FileRemoveParams, result=FileRemoveResult),
    Method.FILE_MKDIR: MethodSpec(params=FileMkdirParams, result=FileInfo),
    Method.FILE_WRITE: MethodSpec(params=FileWriteParams, result=FileInfo, takes_payload=True),
    Method.FILE_WRITE_OPEN: MethodSpec(params=FileWriteOpenParams, result=FileWriteOpenResult),
    Method.FILE_WRITE_CHUNK: MethodSpec(params=FileWriteChunkParams, result=FileWriteChunkResult, takes_payload=True),
    Method.FILE_WRITE_COMMIT: MethodSpec(params=FileWriteCommitParams, result=FileInfo),
    Method.FILE_WRITE_ABORT: MethodSpec(params=FileSessionParams, result=Empty),
    Method.FILE_HASH: MethodSpec(params=FileHashParams, result=FileHashResult),
    Method.PORT_CONNECT: MethodSpec(params=PortConnectParams, result=PortConnInfo),
    Method.PORT_SEND: MethodSpec(params=PortSendParams, result=PortSendResult, takes_payload=True),
    Method.PORT_RECV: MethodSpec(params=PortRecvParams, result=PortRecvResult, gives_payload=True),
    Method.PORT_CLOSE: MethodSpec(params=PortIdParams, result=PortConnInfo),
    Method.PORT_LIST: MethodSpec(params=Empty, result=PortListResult),
    Method.PING: MethodSpec(params=Empty, result=Empty),
    Method.JOB_STATS: MethodSpec(params=JobStatsParams, result=JobStats),
    Method.SANDBOX_STATS: MethodSpec(params=SandboxStatsParams, result=SandboxStats),
}
"""Every method the agent serves, with its params and result models."""


STREAM_SOCKET = "agent.stream"
"""The agent's frame-stream socket (``stdio``-style frames, no HTTP), beside ``agent.sock``."""


def default_agent_dir() -> Path:
    """The agent's per-user state dir when none is given (the local sandbox finds it here too).

    ``$REMOTE_EXEC_AGENT_DIR``, else ``$XDG_RUNTIME_DIR/remote-exec``, else ``/tmp/remote-exec-<uid>``.
    ``$XDG_RUNTIME_DIR`` counts only if it is a directory of ours that others cannot write:
    ``su`` and ``sudo`` keep the first user's, and an agent there would be theirs to replace.
    The ``/tmp`` name is predictable; another user who makes it first is refused when it is
    used (:mod:`remote_exec.protocol.ownership`), never trusted.
    """
    env = os.environ.get("REMOTE_EXEC_AGENT_DIR")
    if env:
        return Path(env)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        try:
            st = os.stat(runtime)
        except OSError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022:
            return Path(runtime) / "remote-exec"
    return Path(f"/tmp/remote-exec-{os.geteuid()}")
