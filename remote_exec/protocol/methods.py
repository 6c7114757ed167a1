"""The method table: each JSON-RPC method's params and result models, and whether its
messages carry a binary payload (the names alone: :mod:`.method_names`)."""

from __future__ import annotations

from typing import NamedTuple

from .base import (
    Empty,
    WireModel,
)
from .files import (
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
    FileWriteChunkParams,
    FileWriteChunkResult,
    FileWriteCommitParams,
    FileWriteOpenParams,
    FileWriteOpenResult,
    FileWriteParams,
)
from .follow import FollowParams, FollowResult
from .jobs import (
    JobIdParams,
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
    WriteStdinParams,
    WriteStdinResult,
)
from .method_names import Method
from .metrics import (
    JobStats,
    JobStatsMany,
    JobStatsManyParams,
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
)
from .shell import (
    ShellIdParams,
    ShellInfo,
    ShellListParams,
    ShellListResult,
    ShellOpenParams,
    ShellRunParams,
)

__all__ = ["METHODS", "MethodSpec"]


class MethodSpec(NamedTuple):
    """A method's params and result models, and whether its messages may carry a payload.

    ``takes_payload``: the request may carry binary data beside its params (see
    :mod:`remote_exec.protocol.frames`); ``gives_payload``: the result may. (A tuple, not a
    model: a model of models built its validator at import, 25-30 ms of every agent's and every
    client's start.)
    """

    params: type[WireModel]
    result: type[WireModel]
    takes_payload: bool = False
    gives_payload: bool = False


METHODS: dict[str, MethodSpec] = {
    Method.EXEC_REMOTE_START: MethodSpec(params=StartParams, result=StartResult),
    Method.EXEC_REMOTE_POLL: MethodSpec(params=PollParams, result=PollResult, gives_payload=True),
    Method.EXEC_REMOTE_FOLLOW: MethodSpec(params=FollowParams, result=FollowResult),
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
    Method.JOB_STATS_MANY: MethodSpec(params=JobStatsManyParams, result=JobStatsMany),
}
"""Every method the agent serves, with its params and result models."""
