"""remote_exec: run long-running commands inside sandboxes and watch them live.

Async::

    async with rx.open_sandbox("local://") as sb:
        async for ev in sb.exec_remote(["pytest", "-v"]): ...

Blocking::

    with rx.connect("local://") as sb:
        print(sb.run(["echo", "hi"]).stdout)
"""

from ._version import __version__ as __version__
from .blocking import BlockingExecRemoteProcess as BlockingExecRemoteProcess
from .blocking import Sandbox as Sandbox
from .blocking import connect as connect
from .client.process import ExecRemoteProcess as ExecRemoteProcess
from .client.sandbox import AsyncSandbox as AsyncSandbox
from .client.sandbox import SandboxTransport as SandboxTransport
from .client.types import Completed as Completed
from .client.types import ExecRemoteEvent as ExecRemoteEvent
from .client.types import ExecRemoteOptions as ExecRemoteOptions
from .client.types import ExecResult as ExecResult
from .client.types import StderrChunk as StderrChunk
from .client.types import StdoutChunk as StdoutChunk
from .errors import AgentLostError as AgentLostError
from .errors import AgentUnavailableError as AgentUnavailableError
from .errors import ExecTimeoutError as ExecTimeoutError
from .errors import InvalidParamsError as InvalidParamsError
from .errors import JobError as JobError
from .errors import JobKilledError as JobKilledError
from .errors import JobNotFoundError as JobNotFoundError
from .errors import JobNotRunningError as JobNotRunningError
from .errors import ProtocolError as ProtocolError
from .errors import RemoteExecError as RemoteExecError
from .errors import SandboxError as SandboxError
from .errors import ServerBusyError as ServerBusyError
from .errors import SpawnError as SpawnError
from .errors import TransportError as TransportError
from .protocol import JobInfo as JobInfo
from .protocol import ServerInfo as ServerInfo
from .sandboxes import open_sandbox as open_sandbox

__all__ = [
    "AgentLostError",
    "AgentUnavailableError",
    "AsyncSandbox",
    "BlockingExecRemoteProcess",
    "Completed",
    "ExecRemoteEvent",
    "ExecRemoteOptions",
    "ExecRemoteProcess",
    "ExecResult",
    "ExecTimeoutError",
    "InvalidParamsError",
    "JobError",
    "JobInfo",
    "JobKilledError",
    "JobNotFoundError",
    "JobNotRunningError",
    "ProtocolError",
    "RemoteExecError",
    "Sandbox",
    "SandboxError",
    "SandboxTransport",
    "ServerBusyError",
    "ServerInfo",
    "SpawnError",
    "StderrChunk",
    "StdoutChunk",
    "TransportError",
    "__version__",
    "connect",
    "open_sandbox",
]
