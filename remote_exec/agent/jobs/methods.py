"""The ``exec_remote_*`` JSON-RPC methods: names bound to :class:`JobController` operations."""

from __future__ import annotations

from ...protocol import Method
from ..rpc import Handler
from .controller import JobController
from .pushes import follow_method

__all__ = ["job_methods"]


def job_methods(ctl: JobController) -> dict[str, Handler]:
    """The job methods served by ``ctl``; params arrive validated by the dispatcher."""
    return {
        Method.EXEC_REMOTE_START: ctl.start,
        Method.EXEC_REMOTE_POLL: ctl.poll,
        Method.EXEC_REMOTE_FOLLOW: follow_method(ctl),
        Method.EXEC_REMOTE_WRITE_STDIN: ctl.write_stdin,
        Method.EXEC_REMOTE_SIGNAL: ctl.signal,
        Method.EXEC_REMOTE_KILL: ctl.kill,
        Method.EXEC_REMOTE_LIST: ctl.list,
        Method.EXEC_REMOTE_RELEASE: ctl.release,
        Method.EXEC_REMOTE_READ: ctl.read,
        Method.EXEC_REMOTE_FORGET: ctl.forget,
        Method.EXEC_REMOTE_PRUNE: ctl.prune,
        Method.EXEC_REMOTE_RESIZE: ctl.resize,
    }
