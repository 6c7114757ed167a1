"""A host process (``docker exec``, ``nsenter``, ``kubectl exec``) whose stdout is read by a socket.

The channel's relay writes frames to its stdout; a pipe read by asyncio's ``StreamReader``
copies each byte three times on its way to a frame's payload. Here the process's stdout is one
end of a socketpair instead, and the other end is read by the socket channel's
:class:`~remote_exec.client.framesocket.FrameSocket`: the kernel writes a payload into a reused
buffer, and one copy makes it ``bytes``. Every program these channels run writes to its fd 1
whatever it is; none needs it to be a pipe. Its stdin stays a pipe (what the host writes is
small: requests, stdin bytes).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Mapping, Sequence

from ..client.channel import MAX_RESPONSE
from ..client.framesocket import FrameSocket
from ..protocol.agentdir import SOCKET_BUFFER
from ..protocol.pipes import widen_pipe

__all__ = ["HostProcess", "spawn_checked", "spawn_host"]


class _Stdout(FrameSocket):
    """The read end: at EOF (the process and whatever it started have closed the other end)
    the socket is closed; what was read before stays readable."""

    def eof_received(self) -> bool:
        super().eof_received()
        return False


class HostProcess:
    """A :class:`~remote_exec.client.channel.PipeProcess`: the process, its stdin pipe and
    its stdout socket."""

    def __init__(self, proc: asyncio.subprocess.Process, stdout: FrameSocket) -> None:
        self._proc = proc
        self._stdout = stdout

    @property
    def stdin(self) -> asyncio.StreamWriter | None:
        return self._proc.stdin

    @property
    def stdout(self) -> FrameSocket:
        return self._stdout

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    def kill(self) -> None:
        """SIGKILL, and its stdout closed: whoever kills it reads no more (an EOF it never
        reads would leave the socket open). One that exited by itself is left to its EOF.

        :raises ProcessLookupError: it has exited already.
        """
        self._proc.kill()
        self._stdout.close()

    async def wait(self) -> int:
        """Its exit status, once it has exited; cancelling abandons the wait only."""
        return await self._proc.wait()


async def spawn_checked(argv: Sequence[str]) -> asyncio.subprocess.Process:
    """Start a host process whose stdout and stderr are read whole (a check's words: ``kubectl
    exec ... true``), with pipes, in a session of its own."""
    return await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        limit=MAX_RESPONSE,
        start_new_session=True,
    )


async def spawn_host(argv: Sequence[str], env: Mapping[str, str] | None = None) -> HostProcess:
    """Start ``argv`` on the host (with ``env``, else ours) with a stdin pipe, its stdout a
    socket and stderr discarded, in a session of its own (a Ctrl-C meant for the host must not
    hit the channel's process)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        for sock, option in ((theirs, socket.SO_SNDBUF), (ours, socket.SO_RCVBUF)):
            with contextlib.suppress(OSError):  # as big as allowed: big frames cross in few wakeups
                sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=theirs.fileno(),
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()  # the child has its copy: EOF comes when it (and its children) close it
    try:
        _, stdout = await asyncio.get_running_loop().create_unix_connection(lambda: _Stdout(MAX_RESPONSE), sock=ours)
    except BaseException:
        ours.close()
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    if proc.stdin is not None:
        pipe = proc.stdin.transport.get_extra_info("pipe")
        if pipe is not None:
            widen_pipe(pipe)
    return HostProcess(proc, stdout)
