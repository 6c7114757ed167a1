"""The one exception tree of remote_exec, shared by the host and the agent.

::

    RemoteExecError
    ├── TransportError              the channel to the agent failed
    │   ├── AgentUnavailableError   the agent cannot be reached or started
    │   │   ├── AgentLostError      the agent died (or restarted) under a job
    │   │   ├── UntrustedAgentError the state dir, socket or agent belongs to another user
    │   │   ├── AgentUnresponsiveError  (-32016) no heartbeat answer within the liveness bound
    │   │   └── SandboxLostError        (-32017) the sandbox itself is gone (container, box, host)
    │   └── ChannelBroken           the channel's transport failed; retried after a reconnect (host side)
    ├── ProtocolError               a malformed or unexpected JSON-RPC message
    │   ├── FrameError              a frame header that is malformed or over its limit (also ``ValueError``)
    │   ├── LineTooLong             a request line or body over the agent's limit (also ``ValueError``)
    │   ├── ParseError              (-32700) the request was not JSON
    │   ├── InvalidRequestError     (-32600) not a JSON-RPC 2.0 request
    │   ├── MethodNotFoundError     (-32601)
    │   ├── InvalidParamsError      (-32602) params failed validation (details attached)
    │   └── InternalError           (-32603) the agent hit a bug; it keeps serving
    ├── JobError                    something about one job
    │   ├── JobNotFoundError        unknown or released job id
    │   ├── JobNotRunningError      e.g. stdin written after the job ended
    │   ├── SpawnError              the command could not be started
    │   ├── JobKilledError          waited on a job that was killed on purpose
    │   └── ExecTimeoutError        the job's timeout expired (also a ``TimeoutError``)
    ├── ShellError                  something about one shell session
    │   ├── ShellNotFoundError      unknown (or long closed) session id
    │   ├── ShellClosedError        the session's shell has ended (exit, close, idle expiry)
    │   └── ShellBusyError          the session is already running a command
    ├── PortError                   something about one forwarded TCP connection
    │   ├── PortConnectError        the agent could not connect to the target (refused, not allowed...)
    │   ├── PortNotFoundError       unknown (or long closed) connection id
    │   └── PortClosedError         the connection has ended (reset, closed, expired)
    ├── FileError                   a file operation in the sandbox failed (any other OS error)
    │   ├── RemoteFileNotFoundError     no such file or directory (also a ``FileNotFoundError``)
    │   ├── RemoteFileExistsError       it exists already (also a ``FileExistsError``)
    │   ├── RemoteIsADirectoryError     a directory where a file is needed (also ``IsADirectoryError``)
    │   ├── RemoteNotADirectoryError    a file where a directory is needed (also ``NotADirectoryError``)
    │   ├── RemotePermissionError       permission denied (also a ``PermissionError``)
    │   ├── PathEscapeError             ``..`` or a symlink leads out of the workspace root
    │   ├── FileTooLargeError           a text read of a file over the size limit
    │   ├── FileEncodingError           a text read of bytes that are not UTF-8
    │   ├── WriteSessionNotFoundError   unknown, expired or aborted write session
    │   ├── NoSpaceError                the sandbox's disk (or quota) is full: ENOSPC/EDQUOT
    │   └── TransferLimitError          an upload/download over its file-count or size cap (host side)
    ├── ServerBusyError             the agent refuses more jobs (limit reached)
    ├── RemoteCommandError          a notebook cell's remote command failed (exit code, timeout)
    └── SandboxError                bad sandbox URL, unsupported scheme, setup failure
        ├── SandboxClosedError      the sandbox (or the one a handle belongs to) is closed (also ``RuntimeError``)
        ├── CliError                a host CLI (docker, podman, kubectl) exited non-zero
        └── KubeApiError            the Kubernetes API server refused a request (its HTTP status and reason)

    KeyboardInterrupt
    └── JobInterrupted              a cell was interrupted and its job stopped; a ``KeyboardInterrupt``
                                    on purpose (so ``except Exception`` does not swallow it), no wire code

Every class has its own JSON-RPC ``code`` (host-side ones too, so a code names one class);
:data:`ERROR_CLASSES` maps the codes of the classes that can cross the wire back to classes, so
the host raises the same class the agent raised.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "ERROR_CLASSES",
    "AgentLostError",
    "AgentUnavailableError",
    "AgentUnresponsiveError",
    "ChannelBroken",
    "CliError",
    "KubeApiError",
    "ExecTimeoutError",
    "FileEncodingError",
    "FileError",
    "FileTooLargeError",
    "FrameError",
    "InternalError",
    "InvalidParamsError",
    "InvalidRequestError",
    "JobError",
    "JobInterrupted",
    "JobKilledError",
    "JobNotFoundError",
    "JobNotRunningError",
    "LineTooLong",
    "MethodNotFoundError",
    "NoSpaceError",
    "ParseError",
    "PathEscapeError",
    "PortClosedError",
    "PortConnectError",
    "PortError",
    "PortNotFoundError",
    "ProtocolError",
    "RemoteCommandError",
    "RemoteExecError",
    "RemoteFileExistsError",
    "RemoteFileNotFoundError",
    "RemoteIsADirectoryError",
    "RemoteNotADirectoryError",
    "RemotePermissionError",
    "SandboxClosedError",
    "SandboxError",
    "SandboxLostError",
    "ServerBusyError",
    "ShellBusyError",
    "ShellClosedError",
    "ShellError",
    "ShellNotFoundError",
    "SpawnError",
    "TransferLimitError",
    "TransportError",
    "UntrustedAgentError",
    "WriteSessionNotFoundError",
    "error_from_wire",
]


class RemoteExecError(Exception):
    """Base class of every error raised by remote_exec.

    :ivar data: structured details sent by the agent (for example validation errors), or ``None``.
    """

    code: ClassVar[int] = -32000

    def __init__(self, message: str, *, data: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.data = data


class TransportError(RemoteExecError):
    """The channel to the agent failed (process died, pipe closed, response lost for good)."""

    code = -32010


class AgentUnavailableError(TransportError):
    """The agent could not be reached or started."""

    code = -32011


class AgentLostError(AgentUnavailableError):
    """The agent that held a job is gone; the job and its output died with it."""

    code = -32012


class UntrustedAgentError(AgentUnavailableError):
    """The agent's state dir, its socket or the process serving it is not the user's own.

    Another local user could have put it there to receive the user's commands or to have them
    run as themselves; nothing was sent, and retrying cannot help. ``data`` has ``path`` and
    the foreign ``uid`` when known.
    """

    code = -32013


class ChannelBroken(TransportError):
    """The channel's transport failed; the request may be retried after ``reconnect()``.

    Raised and handled inside the host client (a channel's reconnect loop), never sent.
    """

    code = -32014


class AgentUnresponsiveError(AgentUnavailableError):
    """The channel is up but the agent answered nothing, not even a heartbeat, within the
    liveness bound: the agent is frozen (SIGSTOP), its container paused, or the link silent.

    Every request in flight fails with it. Nothing in the sandbox was touched: once the agent
    answers again (SIGCONT, ``docker unpause``), the next call reconnects and a job's stream
    resumes from its cursors with nothing lost.
    """

    code = -32016


class SandboxLostError(AgentUnavailableError):
    """The sandbox itself is gone: its container was killed or removed, its box exited, its
    host cannot be reached. Jobs in it died with it, unless it comes back with its state."""

    code = -32017


class ProtocolError(RemoteExecError):
    """A message broke the protocol (the peer is buggy or hostile)."""

    code = -32002


class FrameError(ProtocolError, ValueError):
    """A frame header that is not ``\\x00<decimal length>\\n``, or a length over the limit."""

    code = -32008


class LineTooLong(ProtocolError, ValueError):
    """A JSON line (or request body) over the agent's request limit; it was read and dropped up
    to its newline. The agent answers it and reads on."""

    code = -32009


class ParseError(ProtocolError):
    """The request body was not valid JSON."""

    code = -32700


class InvalidRequestError(ProtocolError):
    """The JSON was not a valid JSON-RPC 2.0 request object."""

    code = -32600


class MethodNotFoundError(ProtocolError):
    """The method does not exist on this agent."""

    code = -32601


class InvalidParamsError(ProtocolError):
    """The params failed validation; ``data`` lists every problem found."""

    code = -32602


class InternalError(ProtocolError):
    """The agent failed unexpectedly while handling a request; it keeps serving others."""

    code = -32603


class JobError(RemoteExecError):
    """Base class for errors about one job.

    :ivar job_id: the job concerned, when known.
    """

    code = -32020

    def __init__(self, message: str, *, data: Any = None, job_id: str | None = None) -> None:
        super().__init__(message, data=data)
        self.job_id = job_id


class JobNotFoundError(JobError):
    """No job with that id (never existed, released, or expired from retention)."""

    code = -32001


class JobNotRunningError(JobError):
    """The operation needs a running job (or an open stdin) and the job has none."""

    code = -32003


class SpawnError(JobError):
    """The command could not be started (no such program, bad cwd, unknown user...)."""

    code = -32004


class JobKilledError(JobError):
    """Waited on a job that this handle killed; its output was discarded on purpose."""

    code = -32006


class ExecTimeoutError(JobError, TimeoutError):
    """The job ran past its ``timeout`` and was killed inside the sandbox.

    :ivar result: the partial :class:`~remote_exec.ExecResult` (output up to the kill), if known.
    """

    code = -32007

    def __init__(self, message: str, *, data: Any = None, job_id: str | None = None, result: Any = None) -> None:
        super().__init__(message, data=data, job_id=job_id)
        self.result = result


class ShellError(RemoteExecError):
    """Base class for errors about one shell session.

    :ivar session_id: the session concerned, when known (also sent as ``data["session_id"]``).
    """

    code = -32040

    def __init__(self, message: str, *, data: Any = None, session_id: str | None = None) -> None:
        if session_id is not None:
            data = {**(data if isinstance(data, dict) else {}), "session_id": session_id}
        super().__init__(message, data=data)
        sid = data.get("session_id") if isinstance(data, dict) else None
        self.session_id: str | None = sid if isinstance(sid, str) else None


class ShellNotFoundError(ShellError):
    """No shell session with that id (never opened, or closed long enough ago to be forgotten)."""

    code = -32041


class ShellClosedError(ShellError):
    """The session's shell has ended (``exit``, ``close()``, idle expiry); open a new one."""

    code = -32042


class ShellBusyError(ShellError):
    """The session is running a command; a shell runs one at a time (``data["run_id"]`` is it)."""

    code = -32043


class PortError(RemoteExecError):
    """Base class for errors about one TCP connection tunnelled through the agent.

    :ivar conn_id: the connection concerned, when known (also sent as ``data["conn_id"]``).
    """

    code = -32060

    def __init__(self, message: str, *, data: Any = None, conn_id: str | None = None) -> None:
        if conn_id is not None:
            data = {**(data if isinstance(data, dict) else {}), "conn_id": conn_id}
        super().__init__(message, data=data)
        cid = data.get("conn_id") if isinstance(data, dict) else None
        self.conn_id: str | None = cid if isinstance(cid, str) else None


class PortConnectError(PortError):
    """The agent could not connect to the target inside the sandbox.

    The message names the cause (``Connection refused``, a timeout, an unresolvable name, or
    a non-loopback target the agent does not allow); ``data`` has ``host``, ``port`` and, for
    an OS error, ``errno`` and its symbolic ``errno_name`` (``ECONNREFUSED``).
    """

    code = -32061


class PortNotFoundError(PortError):
    """No connection with that id (never made, or closed long enough ago to be forgotten)."""

    code = -32062


class PortClosedError(PortError):
    """The connection has ended (reset by the target, closed, or expired idle); ``data["reason"]``."""

    code = -32063


class FileError(RemoteExecError):
    """A file operation in the sandbox failed; the base of the file errors, and what an OS error
    without a class of its own (no space, read-only file system...) becomes.

    :ivar path: the path concerned, as the caller named it, when known (also ``data["path"]``);
        ``data["errno"]`` is the OS error's symbolic name (``"ENOSPC"``) when there was one.
    """

    code = -32050
    _errno: ClassVar[int | None] = None

    def __init__(self, message: str, *, data: Any = None, path: str | None = None) -> None:
        if path is not None:
            data = {**(data if isinstance(data, dict) else {}), "path": path}
        super().__init__(message, data=data)
        p = data.get("path") if isinstance(data, dict) else None
        self.path: str | None = p if isinstance(p, str) else None
        if isinstance(self, OSError) and self._errno is not None:  # the builtin's attribute, so that
            object.__setattr__(self, "errno", self._errno)  # `exc.errno == errno.ENOENT` holds


class RemoteFileNotFoundError(FileError, FileNotFoundError):
    """No such file or directory in the sandbox (a missing component on the way counts too)."""

    code = -32051
    _errno = 2


class RemoteFileExistsError(FileError, FileExistsError):
    """The path exists already (``mkdir(exist_ok=False)``, or a file where a directory must go)."""

    code = -32052
    _errno = 17


class RemoteIsADirectoryError(FileError, IsADirectoryError):
    """The path is a directory where a file is needed (a read, or a write over a directory)."""

    code = -32053
    _errno = 21


class RemoteNotADirectoryError(FileError, NotADirectoryError):
    """The path (or a component on the way) is a file where a directory is needed."""

    code = -32054
    _errno = 20


class RemotePermissionError(FileError, PermissionError):
    """The agent's user may not do this (``EACCES``/``EPERM``), or it would remove the workspace root."""

    code = -32055
    _errno = 13


class PathEscapeError(FileError):
    """The path leads out of the sandbox's workspace root: an absolute path elsewhere, ``..``
    above the root, or a symlink pointing outside it. Nothing was read or written."""

    code = -32056


class FileTooLargeError(FileError):
    """A text read of a file bigger than the limit (``data["size"]``, ``data["limit"]``): read it as
    bytes, raise ``max_size``, or stream it to a local file with ``read_file_to``."""

    code = -32057


class FileEncodingError(FileError):
    """A text read of a file that is not valid UTF-8 (``data["offset"]`` is the first bad byte):
    read it with ``text=False`` to get the bytes."""

    code = -32058


class WriteSessionNotFoundError(FileError):
    """No such write session: never opened, aborted, expired idle, or its agent restarted."""

    code = -32059


class NoSpaceError(FileError):
    """The sandbox's file system (or the user's quota) is full: ``ENOSPC`` or ``EDQUOT`` in
    ``data["errno"]``. Raised by file writes, and by a job or shell start whose files (a
    shell's private temporary directory, its stdin file) could not be made. Nothing partial is
    left behind: a write's temporary file is removed."""

    code = -32070


class TransferLimitError(FileError):
    """An upload or download would move more files or bytes than its cap allows.

    Raised on the host before anything is sent; the message names the biggest files and the
    directories with the most files. ``data`` has ``files``, ``bytes``, ``max_files``,
    ``max_bytes`` and ``largest`` (``[path, size]`` pairs).
    """

    code = -32071


class ServerBusyError(RemoteExecError):
    """The agent is at a limit (running jobs, its memory budget); retry after some work ends."""

    code = -32005


class RemoteCommandError(RemoteExecError):
    """A notebook cell's remote command failed (non-zero exit, timeout); shown as one short line.

    :ivar result: the (possibly partial) :class:`~remote_exec.ExecResult` of the command, or ``None``.
    """

    code = -32080

    def __init__(self, message: str, result: Any = None) -> None:
        super().__init__(message)
        self.result = result

    @property
    def returncode(self) -> int | None:
        return self.result.returncode if self.result is not None else None

    def _render_traceback_(self) -> list[str]:
        # IPython shows these lines instead of a traceback: the cell's own output above already
        # says what went wrong, and our call stack would only hide it.
        return [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {self.message}"]


class SandboxError(RemoteExecError):
    """The sandbox URL is bad, its scheme unsupported, or the sandbox failed to set up."""

    code = -32030


class SandboxClosedError(SandboxError, RuntimeError):
    """The sandbox was closed (or its pool closed it); so is every job, shell and forward handle
    that belongs to it. Open a new sandbox."""

    code = -32031


class CliError(SandboxError):
    """A host CLI (``docker``, ``podman``, ``kubectl``) exited non-zero.

    :ivar returncode: its exit status.
    :ivar stderr: what it printed on stderr (stripped).
    """

    code = -32032

    def __init__(self, message: str, *, returncode: int, stderr: str) -> None:
        super().__init__(message)
        self.returncode = returncode
        self.stderr = stderr


class KubeApiError(SandboxError):
    """The Kubernetes API server refused a request (``k8s://``, ``k8s+image://``).

    :ivar status: the HTTP status (404: no such pod, 403: RBAC said no, 409: it exists).
    :ivar reason: the ``Status`` object's reason (``NotFound``, ``Forbidden``...), if any.
    """

    code = -32033

    def __init__(self, message: str, status: int, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class JobInterrupted(KeyboardInterrupt):
    """A foreground cell was interrupted and its remote job stopped; shown as one line.

    A ``KeyboardInterrupt``, not a :class:`RemoteExecError`, so that ``except Exception`` in
    user code does not swallow the interrupt.
    """

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[0;31mKeyboardInterrupt\x1b[0m: {self}"]


ERROR_CLASSES: dict[int, type[RemoteExecError]] = {
    cls.code: cls
    for cls in (
        ProtocolError,
        ParseError,
        InvalidRequestError,
        MethodNotFoundError,
        InvalidParamsError,
        InternalError,
        JobNotFoundError,
        JobNotRunningError,
        SpawnError,
        ServerBusyError,
        TransportError,
        AgentUnavailableError,
        AgentLostError,
        UntrustedAgentError,
        AgentUnresponsiveError,
        SandboxLostError,
        ExecTimeoutError,
        JobKilledError,
        ShellNotFoundError,
        ShellClosedError,
        ShellBusyError,
        PortConnectError,
        PortNotFoundError,
        PortClosedError,
        FileError,
        RemoteFileNotFoundError,
        RemoteFileExistsError,
        RemoteIsADirectoryError,
        RemoteNotADirectoryError,
        RemotePermissionError,
        PathEscapeError,
        FileTooLargeError,
        FileEncodingError,
        WriteSessionNotFoundError,
        NoSpaceError,
        TransferLimitError,
    )
}


def error_from_wire(code: int, message: str, data: Any = None) -> RemoteExecError:
    """Rebuild the exception an agent reported as a JSON-RPC error object."""
    cls = ERROR_CLASSES.get(code, ProtocolError if -32768 <= code <= -32000 else RemoteExecError)
    if issubclass(cls, JobError):
        job_id = data.get("job_id") if isinstance(data, dict) else None
        return cls(message, data=data, job_id=job_id if isinstance(job_id, str) else None)
    return cls(message, data=data)
