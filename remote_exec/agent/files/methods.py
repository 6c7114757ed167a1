"""The ``file_*`` JSON-RPC methods: names bound to :class:`FileController` operations."""

from __future__ import annotations

from ...protocol import Method
from ..rpc import Handler
from .controller import FileController

__all__ = ["file_methods"]


def file_methods(ctl: FileController) -> dict[str, Handler]:
    """The file methods served by ``ctl``; params arrive validated by the dispatcher."""
    return {
        Method.FILE_STAT: ctl.stat,
        Method.FILE_READ: ctl.read,
        Method.FILE_LIST: ctl.list,
        Method.FILE_REMOVE: ctl.remove,
        Method.FILE_MKDIR: ctl.mkdir,
        Method.FILE_WRITE: ctl.write,
        Method.FILE_WRITE_OPEN: ctl.sessions.write_open,
        Method.FILE_WRITE_CHUNK: ctl.sessions.write_chunk,
        Method.FILE_WRITE_COMMIT: ctl.sessions.write_commit,
        Method.FILE_WRITE_ABORT: ctl.sessions.write_abort,
        Method.FILE_HASH: ctl.hash,
    }
