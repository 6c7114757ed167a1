"""Wire models of the agent's JSON-RPC 2.0 protocol: the only module host and agent share.

Every method has a params model and a result model, all strict (``extra="forbid"``), so a typo
in a field name is an ``InvalidParams`` error rather than a silently ignored option. The method
table :data:`METHODS` ties each name to its two models; the agent dispatches with it and the
host validates results with it.

Output travels as **byte cursors**: a poll names the byte offsets the caller already holds in
each stream and gets the data that follows, so a lost response is simply asked for again.
"""

# ruff: noqa: F403, F405  (the star imports are for type checkers only; see __getattr__)

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # eager for type checkers; lazy at run time (see __getattr__ below)
    from ..errors import ERROR_CLASSES as ERROR_CLASSES
    from ..errors import RemoteExecError as RemoteExecError
    from ..errors import error_from_wire as error_from_wire
    from .agentdir import *
    from .base import *
    from .files import *
    from .follow import *
    from .jobs import *
    from .method_names import *
    from .methods import *
    from .metrics import *
    from .policy import *
    from .ports import *
    from .shell import *

__all__ = [
    "DEFAULT_CHUNK",
    "DEFAULT_FOLLOW_BUDGET",
    "DEFAULT_MAX_BYTES",
    "ERROR_CLASSES",
    "HEARTBEAT",
    "HEARTBEAT_ANSWER",
    "MAX_CHUNK",
    "MAX_HASH_PATHS",
    "MAX_HITS_KEPT",
    "MAX_RULES",
    "MAX_RULE_PATTERN",
    "STAGED_NAME",
    "MAX_LIST_ENTRIES",
    "MAX_PAGE_ITEMS",
    "MAX_STATS_WINDOW",
    "MAX_WAIT",
    "METHODS",
    "PAGE_BYTES",
    "PUSH",
    "PROTOCOL_VERSION",
    "STREAM_SOCKET",
    "TERMINAL_STATES",
    "DisconnectAction",
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
    "FollowParams",
    "FollowResult",
    "IdleAction",
    "JobIdParams",
    "JobInfo",
    "JobPolicy",
    "JobState",
    "JobStats",
    "JobStatsParams",
    "JobStatsMany",
    "JobStatsManyParams",
    "KillParams",
    "KillResult",
    "ListParams",
    "ListResult",
    "Method",
    "MethodSpec",
    "PollParams",
    "PollResult",
    "PruneParams",
    "Push",
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
    "RuleAction",
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
    "WatchHit",
    "WatchRule",
    "WireModel",
    "WriteStdinParams",
    "WriteStdinResult",
    "default_agent_dir",
    "error_from_wire",
]

# Where each name lives, searched in this order on first use. Lazy because the agent's stdio
# relay (one per channel a host opens) needs only the light modules (agentdir, frames,
# ownership, pipes): importing every wire model and pydantic cost it ~0.4 s of CPU per channel.
_SUBMODULES = (
    "agentdir",
    "method_names",
    "base",
    "methods",
    "jobs",
    "follow",
    "files",
    "shell",
    "ports",
    "metrics",
    "policy",
)
_FROM_ERRORS = {"ERROR_CLASSES", "RemoteExecError", "error_from_wire"}


def __getattr__(name: str) -> Any:
    if name in _FROM_ERRORS:
        value = getattr(importlib.import_module("..errors", __name__), name)
    elif name in __all__:
        for sub in _SUBMODULES:
            module = importlib.import_module(f".{sub}", __name__)
            if name in module.__all__:
                value = getattr(module, name)
                break
        else:  # pragma: no cover  (tests/test_api.py resolves every name)
            raise AttributeError(f"{__name__}.{name} is listed but defined nowhere")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # once: later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
