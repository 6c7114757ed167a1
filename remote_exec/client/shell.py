"""``ShellSession``: the host's handle on a stateful shell in the sandbox.

The shell lives in the agent, not in this handle: any client can reattach to it by id, and it
keeps its working directory, variables and functions between runs until it is closed, exits,
idles past the agent's shell TTL, or the agent stops (sessions die with their agent).
"""

from __future__ import annotations

import secrets
from types import TracebackType

from ..errors import ShellClosedError
from ..protocol import (
    Empty,
    Method,
    ShellIdParams,
    ShellInfo,
    ShellListParams,
    ShellListResult,
    ShellOpenParams,
    ShellRunParams,
    StartResult,
)
from .core import SandboxCore
from .process import ExecRemoteProcess, starting
from .rpc import RpcClient
from .types import ExecRemoteOptions, ExecResult

__all__ = ["ShellSession", "list_shells", "open_shell", "reattach_shell"]


async def list_shells(rpc: RpcClient, session_id: str | None = None) -> list[ShellInfo]:
    """The sandbox's shell sessions (or just ``session_id``), oldest first."""
    return (await rpc.call(Method.SHELL_LIST, ShellListParams(session_id=session_id), ShellListResult)).shells


async def open_shell(core: SandboxCore, cwd: str | None, env: dict[str, str] | None) -> ShellSession:
    """Open a new session (see :meth:`AsyncSandbox.shell`)."""
    return ShellSession(core, await core.rpc.call(Method.SHELL_OPEN, ShellOpenParams(cwd=cwd, env=env), ShellInfo))


async def reattach_shell(core: SandboxCore, session_id: str) -> ShellSession:
    """A handle on the session ``session_id`` (see :meth:`AsyncSandbox.reattach_shell`)."""
    (info,) = await list_shells(core.rpc, session_id)
    if info.state == "closed":
        raise ShellClosedError(f"shell {session_id} is closed: {info.closed_reason}", session_id=session_id)
    return ShellSession(core, info)


class ShellSession:
    """A shell in the sandbox whose state persists across runs, like a terminal tab.

    ``await sb.shell()`` opens one; ``await sb.reattach_shell(session_id)`` picks one up from
    another client or after a kernel restart. It runs one command at a time: a second
    :meth:`run` while one is in progress raises :class:`~remote_exec.ShellBusyError`.
    ``exit N`` in a run closes the shell (that run returns code N; later runs raise
    :class:`~remote_exec.ShellClosedError`); ``( exit N )`` in a subshell does not.

    Closing the sandbox handle kills the runs this handle started (the shell survives); the
    shell itself stays open for others until :meth:`close`.
    """

    def __init__(self, core: SandboxCore, info: ShellInfo) -> None:
        self._core = core
        self._info = info

    @property
    def session_id(self) -> str:
        return self._info.session_id

    @property
    def url(self) -> str:
        """The URL of the sandbox the shell runs in."""
        return self._core.url

    @property
    def pid(self) -> int:
        """The shell's PID inside the sandbox."""
        return self._info.pid

    @property
    def info(self) -> ShellInfo:
        """The session as last seen (see :meth:`refresh`)."""
        return self._info

    @property
    def closed(self) -> bool:
        """True once this handle saw the session closed (:meth:`refresh` looks again)."""
        return self._info.state == "closed"

    def start(
        self,
        command: str,
        *,
        timeout: float | None = None,
        input: str | bytes | None = None,
        kill_grace: float = 5.0,
        tags: dict[str, str] | None = None,
        stdin_open: bool = False,
        output_cap: int | None = None,
    ) -> ExecRemoteProcess:
        """Run ``command`` in the shell, streaming: the same events as ``exec_remote``.

        Hot, as ``exec_remote`` is: the run starts without an ``await``. ``input`` becomes the
        command's stdin (text; without it stdin is ``/dev/null``). With ``stdin_open`` the
        command's stdin stays open after ``input``: send it what it reads with
        :meth:`~ExecRemoteProcess.write_stdin` and end it with
        :meth:`~ExecRemoteProcess.close_stdin` (``read -t 5 x`` waits, ``input()`` is answered);
        what it leaves unread is dropped when it ends, never run by the shell. ``timeout`` interrupts the
        command inside the sandbox (SIGINT, then SIGKILL of what it started after
        ``kill_grace``), keeps the shell, and makes the process raise
        :class:`~remote_exec.ExecTimeoutError`. Cancelling the iteration or ``wait()`` kills the
        run the same way; the shell survives. ``tags`` are stored with the run's job, as
        ``exec_remote``'s are (``jobs()`` returns them). ``output_cap``: per stream, the bytes
        of the run's output the agent keeps on disk, as ``exec_remote``'s (None: the agent's
        default, 1 GiB); past it the head is dropped and counted (``*_dropped``).
        """
        rpc = self._core.rpc
        text = input.decode() if isinstance(input, bytes) else input  # the wire carries text
        params = ShellRunParams(
            session_id=self.session_id,
            command=command,
            input=text,
            stdin_open=stdin_open,
            timeout=timeout,
            kill_grace=kill_grace,
            idempotency_key=secrets.token_hex(8),
            tags=tags,
            output_cap=output_cap,
        )
        opts = ExecRemoteOptions(
            timeout=timeout,
            kill_grace=kill_grace,
            label=f"shell {self.session_id}",
            input=text,
            stdin_open=stdin_open,
            tags=tags,
            output_cap=output_cap,
        )
        return self._core.track(starting(rpc, self._start(rpc, params), opts, self._core.response_margin))

    async def _start(self, rpc: RpcClient, params: ShellRunParams) -> StartResult:
        try:
            return await rpc.call(Method.SHELL_RUN, params, StartResult)
        except ShellClosedError:
            self._info = self._info.model_copy(update={"state": "closed"})
            raise

    async def run(
        self, command: str, *, timeout: float | None = None, input: str | bytes | None = None, kill_grace: float = 5.0
    ) -> ExecResult:
        """Run ``command`` in the shell to its end; a non-zero exit code is returned, not raised.

        Cancelling ``run()`` kills the run (SIGINT, then SIGKILL after ``kill_grace``); the
        shell survives.

        :raises ShellBusyError: another run is in progress in this session.
        :raises ShellClosedError: the shell has ended.
        :raises ExecTimeoutError: ``timeout`` expired (``.result`` holds the partial output).
        """
        return await self.start(command, timeout=timeout, input=input, kill_grace=kill_grace).wait()

    async def interrupt(self) -> None:
        """Ctrl-C: SIGINT to the running command; the shell lives on. Idle: does nothing.

        The run then ends with code 130 (its stderr may get the newline a shell prints for ^C).
        Cancelling ``interrupt()`` may or may not have sent the signal.

        :raises ShellClosedError: the shell has ended.
        """
        await self._core.rpc.call(Method.SHELL_INTERRUPT, ShellIdParams(session_id=self.session_id), Empty)

    async def refresh(self) -> ShellInfo:
        """Fetch the session's state (cwd, busy, current run...) from the agent.

        Asking does not count as use: only runs keep a session from idling out. Cancelling
        ``refresh()`` leaves :attr:`info` as it was.

        :raises ShellNotFoundError: the agent no longer knows the session.
        """
        (self._info,) = await list_shells(self._core.rpc, self.session_id)
        return self._info

    async def close(self) -> None:
        """Kill the shell and everything still running in it, for every client. Idempotent.

        Cancelling ``close()`` does not stop it: the agent finishes closing.
        """
        params = ShellIdParams(session_id=self.session_id)
        self._info = await self._core.rpc.call(Method.SHELL_CLOSE, params, ShellInfo)

    async def reattach_shell(self, session_id: str) -> ShellSession:
        """A handle on another session in the same sandbox, as :meth:`AsyncSandbox.reattach_shell`
        gives (for code that holds a session but not its sandbox, e.g. a widget switching sessions).

        Only looks the session up: cancelling it changes nothing in the sandbox.

        :raises ShellNotFoundError: no such session (or closed long ago).
        :raises ShellClosedError: the session's shell has ended.
        :raises AgentLostError: the session died with the agent that held it.
        """
        return await reattach_shell(self._core, session_id)

    async def __aenter__(self) -> ShellSession:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<ShellSession {self.session_id} pid={self.pid} {self._info.state}>"
