"""The one exception tree of remote_exec, shared by the host and the agent.

::

    RemoteExecError
    ├── TransportError              the channel to the agent failed
    │   └── AgentUnavailableError   the agent cannot be reached or started
    │       └── AgentLostError      the agent died (or restarted) under a job
    ├── ProtocolError               a malformed or unexpected JSON-RPC message
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
    ├── ServerBusyError             the agent refuses more jobs (limit reached)
    └── SandboxError                bad sandbox URL, unsupported scheme, setup failure

Every class that can cross the wire has a JSON-RPC ``code``; :data:`ERROR_CLASSES` maps codes back
to classes so the host raises the same class the agent raised.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "ERROR_CLASSES",
    "AgentLostError",
    "AgentUnavailableError",
    "ExecTimeoutError",
    "InternalError",
    "InvalidParamsError",
    "InvalidRequestError",
    "JobError",
    "JobKilledError",
    "JobNotFoundError",
    "JobNotRunningError",
    "MethodNotFoundError",
    "ParseError",
    "ProtocolError",
    "RemoteExecError",
    "SandboxError",
    "ServerBusyError",
    "ShellBusyError",
    "ShellClosedError",
    "ShellError",
    "ShellNotFoundError",
    "SpawnError",
    "TransportError",
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


class ProtocolError(RemoteExecError):
    """A message broke the protocol (the peer is buggy or hostile)."""

    code = -32000


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


class ServerBusyError(RemoteExecError):
    """The agent is at its job limit; retry after some jobs end or are released."""

    code = -32005


class SandboxError(RemoteExecError):
    """The sandbox URL is bad, its scheme unsupported, or the sandbox failed to set up."""

    code = -32030


ERROR_CLASSES: dict[int, type[RemoteExecError]] = {
    cls.code: cls
    for cls in (
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
        ExecTimeoutError,
        JobKilledError,
        ShellNotFoundError,
        ShellClosedError,
        ShellBusyError,
    )
}


def error_from_wire(code: int, message: str, data: Any = None) -> RemoteExecError:
    """Rebuild the exception an agent reported as a JSON-RPC error object."""
    cls = ERROR_CLASSES.get(code, ProtocolError if -32768 <= code <= -32000 else RemoteExecError)
    if issubclass(cls, JobError):
        job_id = data.get("job_id") if isinstance(data, dict) else None
        return cls(message, data=data, job_id=job_id if isinstance(job_id, str) else None)
    return cls(message, data=data)
