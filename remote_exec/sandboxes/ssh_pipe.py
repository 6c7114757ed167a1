"""``SSHPipeProcess``: an asyncssh session channel as a :class:`~remote_exec.client.channel.PipeProcess`.

asyncssh is imported only for type checking here and when a process is wrapped, so importing
this module does not need it (``ssh://`` is an optional extra).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from typing import TYPE_CHECKING

from ..client.channel import MAX_RESPONSE

if TYPE_CHECKING:
    import asyncssh

__all__ = ["SSHPipeProcess"]

_CHUNK = 256 * 1024


class _SSHStdout:
    """A :class:`~remote_exec.client.channel.PipeReader` over an SSH channel's stdout.

    asyncssh's own ``readline`` returns a partial line once the channel's receive window (2 MiB)
    fills without a newline, and joins chunks quadratically; responses are up to
    :data:`MAX_RESPONSE` bytes, so lines are assembled here in a bytearray instead.
    """

    def __init__(self, reader: asyncssh.SSHReader[bytes], errors: tuple[type[Exception], ...]) -> None:
        self._reader = reader
        self._errors = errors
        self._buf = bytearray()
        self._eof = False

    async def _fill(self) -> bool:
        if self._eof:
            return False
        try:
            chunk = await self._reader.read(_CHUNK)
        except self._errors:  # channel or connection closed under us: for a pipe, that is EOF
            chunk = b""
        if not chunk:
            self._eof = True
            return False
        self._buf += chunk
        return True

    async def readline(self) -> bytes:
        """Read up to and including ``\\n``; at EOF, the rest (``b""`` when nothing is left).

        :raises ValueError: the line is longer than :data:`MAX_RESPONSE` (the buffer is dropped).
        """
        start = 0
        while True:
            end = self._buf.find(b"\n", start)
            if end >= 0:
                line = bytes(self._buf[: end + 1])
                del self._buf[: end + 1]
                return line
            if len(self._buf) > MAX_RESPONSE:
                self._buf.clear()
                raise ValueError(f"line longer than {MAX_RESPONSE} bytes")
            start = len(self._buf)
            if not await self._fill():
                line = bytes(self._buf)
                self._buf.clear()
                return line

    async def readexactly(self, n: int) -> bytes:
        """Read exactly ``n`` bytes (a frame's payload).

        :raises asyncio.IncompleteReadError: EOF came first.
        """
        while len(self._buf) < n:
            if not await self._fill():
                partial = bytes(self._buf)
                self._buf.clear()
                raise asyncio.IncompleteReadError(partial, n)
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data

    async def read(self, n: int = -1) -> bytes:
        """Read up to ``n`` bytes (all of them until EOF when ``n < 0``)."""
        while (n < 0 or not self._buf) and await self._fill():
            pass
        take = len(self._buf) if n < 0 else min(n, len(self._buf))
        data = bytes(self._buf[:take])
        del self._buf[:take]
        return data


class _SSHStdin:
    """A :class:`~remote_exec.client.channel.PipeWriter` over an SSH channel's stdin."""

    def __init__(self, writer: asyncssh.SSHWriter[bytes], errors: tuple[type[Exception], ...]) -> None:
        self._writer = writer
        self._errors = errors

    def write(self, data: bytes) -> None:
        try:
            self._writer.write(data)
        except self._errors as exc:
            raise BrokenPipeError(f"ssh channel closed: {exc}") from exc

    async def drain(self) -> None:
        try:
            await self._writer.drain()
        except self._errors as exc:
            raise BrokenPipeError(f"ssh channel closed: {exc}") from exc

    def close(self) -> None:
        # Closing a pipe's write end means EOF for the reader; SSHWriter.close() would close the
        # whole channel (stdout included), so send EOF instead.
        with contextlib.suppress(*self._errors):
            self._writer.write_eof()


class SSHPipeProcess:
    """One SSH session channel running a command, as a :class:`~remote_exec.client.channel.PipeProcess`.

    :param process: the asyncssh process, opened in binary mode (``encoding=None``).
    """

    def __init__(self, process: asyncssh.SSHClientProcess[bytes]) -> None:
        import asyncssh

        errors = (asyncssh.Error, OSError)
        self._process = process
        self._errors: tuple[type[Exception], ...] = errors
        self._killed = False
        self.stdin = _SSHStdin(process.stdin, errors)
        self.stdout = _SSHStdout(process.stdout, errors)

    def kill(self) -> None:
        """Close the channel (after asking sshd to SIGKILL the command); never raises.

        Like killing a host-side ``ssh``: the session ends, but jobs held by the agent live on.
        """
        self._killed = True
        with contextlib.suppress(*self._errors):
            self._process.send_signal("KILL")  # OpenSSH >= 8.1 honours it; older ones ignore it
        with contextlib.suppress(*self._errors):
            self._process.close()

    async def wait(self) -> int:
        """Wait until the channel is closed; return the exit status.

        That is ``-signal`` for a command killed by a signal, ``-9`` when :meth:`kill` closed the
        channel first, and 255 (as ``ssh`` does) when the connection was lost. Cancelling the wait
        leaves the channel as it is.
        """
        await self._process.wait_closed()
        code = self._process.returncode
        if code is not None:
            return code
        return -signal.SIGKILL if self._killed else 255
