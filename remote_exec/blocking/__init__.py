"""The blocking twin of the async API, for scripts and plain notebook cells.

:mod:`~remote_exec.blocking.sandbox` holds the shared event-loop thread, ``Sandbox`` and ``connect``;
:mod:`~remote_exec.blocking.handles` the job, shell and port-forward handles;
:mod:`~remote_exec.blocking.pool` the ``BlockingSandboxPool``.
"""

from .handles import BlockingExecRemoteProcess as BlockingExecRemoteProcess
from .handles import BlockingPortForward as BlockingPortForward
from .handles import BlockingShellSession as BlockingShellSession
from .pool import BlockingSandboxPool as BlockingSandboxPool
from .sandbox import Sandbox as Sandbox
from .sandbox import connect as connect

__all__ = [
    "BlockingExecRemoteProcess",
    "BlockingPortForward",
    "BlockingSandboxPool",
    "BlockingShellSession",
    "Sandbox",
    "connect",
]
