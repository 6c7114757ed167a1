"""remote_exec: run long-running commands inside sandboxes and watch them live.

Async::

    async with rx.open_sandbox("local://") as sb:
        async for ev in sb.exec_remote(["pytest", "-v"]): ...

Blocking::

    with rx.connect("local://") as sb:
        print(sb.run(["echo", "hi"]).stdout)
"""

from typing import TYPE_CHECKING

from ._version import DISTRIBUTION
from ._version import __version__ as __version__

if TYPE_CHECKING:  # eager for type checkers; lazy at run time (see __getattr__ below)
    from .blocking import BlockingExecRemoteProcess as BlockingExecRemoteProcess
    from .blocking import BlockingPortForward as BlockingPortForward
    from .blocking import BlockingSandboxPool as BlockingSandboxPool
    from .blocking import BlockingShellSession as BlockingShellSession
    from .blocking import Sandbox as Sandbox
    from .blocking import connect as connect
    from .client.logs import OutputSlice as OutputSlice
    from .client.ports import PortForward as PortForward
    from .client.process import ExecRemoteProcess as ExecRemoteProcess
    from .client.sandbox import AsyncSandbox as AsyncSandbox
    from .client.shell import ShellSession as ShellSession
    from .client.transfer import TransferResult as TransferResult
    from .client.transport import SandboxTransport as SandboxTransport
    from .client.types import Completed as Completed
    from .client.types import ExecRemoteEvent as ExecRemoteEvent
    from .client.types import ExecRemoteOptions as ExecRemoteOptions
    from .client.types import ExecResult as ExecResult
    from .client.types import StderrChunk as StderrChunk
    from .client.types import StdoutChunk as StdoutChunk
    from .client.types import StreamTruncated as StreamTruncated
    from .errors import AgentLostError as AgentLostError
    from .errors import AgentUnavailableError as AgentUnavailableError
    from .errors import AgentUnresponsiveError as AgentUnresponsiveError
    from .errors import ExecTimeoutError as ExecTimeoutError
    from .errors import FileEncodingError as FileEncodingError
    from .errors import FileError as FileError
    from .errors import FileTooLargeError as FileTooLargeError
    from .errors import InvalidParamsError as InvalidParamsError
    from .errors import JobError as JobError
    from .errors import JobKilledError as JobKilledError
    from .errors import JobNotFoundError as JobNotFoundError
    from .errors import JobNotRunningError as JobNotRunningError
    from .errors import NoSpaceError as NoSpaceError
    from .errors import PathEscapeError as PathEscapeError
    from .errors import PortClosedError as PortClosedError
    from .errors import PortConnectError as PortConnectError
    from .errors import PortError as PortError
    from .errors import PortNotFoundError as PortNotFoundError
    from .errors import ProtocolError as ProtocolError
    from .errors import RemoteExecError as RemoteExecError
    from .errors import RemoteFileExistsError as RemoteFileExistsError
    from .errors import RemoteFileNotFoundError as RemoteFileNotFoundError
    from .errors import RemoteIsADirectoryError as RemoteIsADirectoryError
    from .errors import RemoteNotADirectoryError as RemoteNotADirectoryError
    from .errors import RemotePermissionError as RemotePermissionError
    from .errors import SandboxClosedError as SandboxClosedError
    from .errors import SandboxError as SandboxError
    from .errors import SandboxLostError as SandboxLostError
    from .errors import ServerBusyError as ServerBusyError
    from .errors import ShellBusyError as ShellBusyError
    from .errors import ShellClosedError as ShellClosedError
    from .errors import ShellError as ShellError
    from .errors import ShellNotFoundError as ShellNotFoundError
    from .errors import SpawnError as SpawnError
    from .errors import TransferLimitError as TransferLimitError
    from .errors import TransportError as TransportError
    from .errors import UntrustedAgentError as UntrustedAgentError
    from .errors import WriteSessionNotFoundError as WriteSessionNotFoundError
    from .fleet import Fleet as Fleet
    from .fleet import FleetEvent as FleetEvent
    from .fleet import gather as gather
    from .pool import SandboxPool as SandboxPool
    from .protocol import FileInfo as FileInfo
    from .protocol import JobInfo as JobInfo
    from .protocol import JobPolicy as JobPolicy
    from .protocol import JobStats as JobStats
    from .protocol import PortConnInfo as PortConnInfo
    from .protocol import ServerInfo as ServerInfo
    from .protocol import ShellInfo as ShellInfo
    from .protocol import WatchHit as WatchHit
    from .protocol import WatchRule as WatchRule
    from .sandboxes import open_sandbox as open_sandbox
    from .sandboxes import sandbox_url as sandbox_url

# Names load on first use, so `import remote_exec.agent` inside a sandbox pulls in only the
# protocol and the agent (no host client, no blocking portal): the agent bundles small.
_LAZY: dict[str, str] = {
    "BlockingExecRemoteProcess": ".blocking",
    "BlockingPortForward": ".blocking",
    "BlockingShellSession": ".blocking",
    "Sandbox": ".blocking",
    "connect": ".blocking",
    "PortForward": ".client.ports",
    "ExecRemoteProcess": ".client.process",
    "AsyncSandbox": ".client.sandbox",
    "OutputSlice": ".client.logs",
    "SandboxTransport": ".client.transport",
    "TransferResult": ".client.transfer",
    "ShellSession": ".client.shell",
    "Completed": ".client.types",
    "ExecRemoteEvent": ".client.types",
    "ExecRemoteOptions": ".client.types",
    "ExecResult": ".client.types",
    "StderrChunk": ".client.types",
    "StdoutChunk": ".client.types",
    "StreamTruncated": ".client.types",
    "AgentLostError": ".errors",
    "AgentUnavailableError": ".errors",
    "AgentUnresponsiveError": ".errors",
    "SandboxLostError": ".errors",
    "ExecTimeoutError": ".errors",
    "InvalidParamsError": ".errors",
    "JobError": ".errors",
    "JobKilledError": ".errors",
    "JobNotFoundError": ".errors",
    "JobNotRunningError": ".errors",
    "PortClosedError": ".errors",
    "PortConnectError": ".errors",
    "PortError": ".errors",
    "PortNotFoundError": ".errors",
    "ProtocolError": ".errors",
    "RemoteExecError": ".errors",
    "SandboxClosedError": ".errors",
    "SandboxError": ".errors",
    "ServerBusyError": ".errors",
    "ShellBusyError": ".errors",
    "ShellClosedError": ".errors",
    "ShellError": ".errors",
    "ShellNotFoundError": ".errors",
    "SpawnError": ".errors",
    "TransportError": ".errors",
    "UntrustedAgentError": ".errors",
    "FileEncodingError": ".errors",
    "FileError": ".errors",
    "FileTooLargeError": ".errors",
    "PathEscapeError": ".errors",
    "RemoteFileExistsError": ".errors",
    "RemoteFileNotFoundError": ".errors",
    "RemoteIsADirectoryError": ".errors",
    "RemoteNotADirectoryError": ".errors",
    "RemotePermissionError": ".errors",
    "TransferLimitError": ".errors",
    "WriteSessionNotFoundError": ".errors",
    "NoSpaceError": ".errors",
    "Fleet": ".fleet",
    "FleetEvent": ".fleet",
    "gather": ".fleet",
    "SandboxPool": ".pool",
    "BlockingSandboxPool": ".blocking",
    "FileInfo": ".protocol",
    "JobInfo": ".protocol",
    "JobPolicy": ".protocol",
    "JobStats": ".protocol",
    "WatchHit": ".protocol",
    "WatchRule": ".protocol",
    "PortConnInfo": ".protocol",
    "ServerInfo": ".protocol",
    "ShellInfo": ".protocol",
    "open_sandbox": ".sandboxes",
    "sandbox_url": ".sandboxes",
}


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext remote_exec``: register the notebook magics (imports the jupyter extra only now).

    :raises ImportError: the kernel's environment lacks the ``jupyter`` extra (the message says
        what to install where: the kernel's Python, which may not be the Jupyter server's).
    """
    try:
        from .jupyter import load_ipython_extension as load
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in ("IPython", "ipywidgets", "anywidget", "traitlets"):
            raise
        import sys

        raise ImportError(
            f"%load_ext remote_exec needs the jupyter extra in this kernel's environment (no {exc.name}): "
            f"{sys.executable} -m pip install '{DISTRIBUTION}[jupyter]'"
        ) from exc
    load(ipython)


def unload_ipython_extension(ipython: object) -> None:
    """``%unload_ext remote_exec``: close the notebook magics' sandboxes."""
    from .jupyter import unload_ipython_extension as unload

    unload(ipython)


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'remote_exec' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "AgentLostError",
    "AgentUnavailableError",
    "AgentUnresponsiveError",
    "AsyncSandbox",
    "BlockingExecRemoteProcess",
    "BlockingPortForward",
    "BlockingSandboxPool",
    "BlockingShellSession",
    "Completed",
    "ExecRemoteEvent",
    "ExecRemoteOptions",
    "ExecRemoteProcess",
    "ExecResult",
    "ExecTimeoutError",
    "FileEncodingError",
    "FileError",
    "FileInfo",
    "FileTooLargeError",
    "Fleet",
    "FleetEvent",
    "InvalidParamsError",
    "JobError",
    "JobInfo",
    "JobKilledError",
    "JobNotFoundError",
    "JobNotRunningError",
    "JobPolicy",
    "JobStats",
    "NoSpaceError",
    "OutputSlice",
    "PathEscapeError",
    "PortClosedError",
    "PortConnInfo",
    "PortConnectError",
    "PortError",
    "PortForward",
    "PortNotFoundError",
    "ProtocolError",
    "RemoteExecError",
    "RemoteFileExistsError",
    "RemoteFileNotFoundError",
    "RemoteIsADirectoryError",
    "RemoteNotADirectoryError",
    "RemotePermissionError",
    "Sandbox",
    "SandboxClosedError",
    "SandboxError",
    "SandboxLostError",
    "SandboxPool",
    "SandboxTransport",
    "ServerBusyError",
    "ServerInfo",
    "ShellBusyError",
    "ShellClosedError",
    "ShellError",
    "ShellInfo",
    "ShellNotFoundError",
    "ShellSession",
    "SpawnError",
    "StderrChunk",
    "StdoutChunk",
    "StreamTruncated",
    "TransferLimitError",
    "TransferResult",
    "TransportError",
    "UntrustedAgentError",
    "WatchHit",
    "WatchRule",
    "WriteSessionNotFoundError",
    "__version__",
    "connect",
    "gather",
    "open_sandbox",
    "sandbox_url",
]
