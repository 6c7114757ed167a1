"""An open stdin for one shell run: what the user sends reaches the command, never the shell.

A run's stdin is ``/dev/null`` by default, or the file of its ``input=``: never the shell's own
stdin (the framing socketpair), so a command that reads stdin cannot swallow the lines that
follow it. With ``stdin_open`` it is a FIFO in the session's private directory instead, fed from
``exec_remote_write_stdin`` through the run's :class:`~remote_exec.agent.jobs.stdin.StdinQueue`
(the same cursor, bound and back-pressure as a job's stdin). ``read -t 5 x`` then waits for
input and ``python3 -c "input()"`` is answered; ``close_stdin`` is EOF. Whatever the command left
unread is dropped with the FIFO when the run ends: it never runs as a command.

The agent holds a reader of its own on the FIFO for the run's life, so that the write end opens
at once (before the shell has opened its end), never sees "no reader" while the command has
not opened it yet, and what is written before keeps in the pipe; it never reads from it.

An EOF can come before the shell has opened the FIFO (``input`` + an immediate close). Closing
the only writer then would leave the shell's ``open()`` waiting for a writer forever (and a
shell-side trick cannot help: for a builtin such as ``eval`` the shell keeps copies of the fds
it redirects, so any writer it opened itself would stay open). So the agent keeps a writer until
the shell holds the FIFO: it watches the shell's fds in ``/proc`` (no event exists for "another
process opened this FIFO"), which takes a few milliseconds, and only in that race.

**Outliving the agent.** In a durable session the keeper holds a dup of the FIFO's write end
(``hold`` under the run's job id), as it holds a job's stdin pipe: the agent's death then is no
EOF to the command, and what it wrote stays in the FIFO. The next agent takes the write end back
(``fd``, :meth:`RunStdin.adopt`) and the stdin cursor from the run's dir (``stdin_bytes``), so a
writer goes on at the byte it was at. EOF (``close_stdin``) and the run's end drop the keeper's
copy: the command reads EOF once both the agent's and the keeper's ends are closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from typing import Any, Protocol

from ..jobs.stdin import StdinQueue
from ..keeperlink import KeeperLink
from .runlog import RunLog
from .store import SessionStore, no_space, write_private

__all__ = ["RunStdin", "StdinRun", "open_run_stdin", "resume_run_stdin", "run_input"]


class StdinRun(Protocol):
    """What this module uses of a :class:`~remote_exec.agent.shell.run.ShellRun` (named here, as
    that module imports this one)."""

    job_id: str
    pid: int
    stdin: StdinQueue
    feed: RunStdin | None


class ResumedRun(StdinRun, Protocol):
    """A re-adopted run: its log (``stdin_cursor``) has its stdin cursor."""

    log: RunLog


async def open_run_stdin(run: StdinRun, tmpdir: str, input: bytes | None, keeper: KeeperLink | None = None) -> str:
    """Give ``run`` an open stdin (``input`` queued first); return the path its frame reads.
    ``keeper``: holds a copy of its write end (a durable session's run), so the agent's death is
    no EOF.

    :raises ServerBusyError: ``input`` does not fit the memory budget.
    :raises OSError: the FIFO cannot be made.
    """
    if input:
        run.stdin.reserve_input(len(input))  # ServerBusyError before anything is made
    try:
        run.feed = await RunStdin.open(tmpdir, run.job_id, run.stdin, run.pid, keeper)
    except BaseException:
        run.stdin.release()
        raise
    if input:
        run.stdin.write(input, offset=None, eof=False, reserved=True)
    return run.feed.path


async def run_input(
    run: StdinRun, store: SessionStore, input: bytes | None, stdin_open: bool, keeper: KeeperLink | None
) -> str | None:
    """What the frame of ``run`` reads its stdin from: its open stdin's FIFO (``stdin_open``,
    ``input`` queued first), else the private file of ``input``, else None (``/dev/null``).

    :raises NoSpaceError: the disk is full (nothing is left behind).
    :raises SpawnError: it cannot be made for another reason.
    :raises ServerBusyError: ``input`` does not fit the memory budget.
    """
    assert store.tmpdir is not None
    if stdin_open:
        try:
            return await open_run_stdin(run, store.tmpdir, input, keeper)
        except OSError as exc:
            raise no_space(exc, f"the stdin of run {run.job_id}") from None
    if input is None:
        return None
    path = store.input_path(run.job_id)
    try:
        await asyncio.to_thread(write_private, path, input)
    except OSError as exc:
        store.remove_input(run.job_id)
        raise no_space(exc, f"the input of run {run.job_id}") from None
    return path


async def resume_run_stdin(run: ResumedRun, keeper: KeeperLink, tmpdir: str, shell_pid: int) -> None:
    """Feed ``run``'s open stdin again through the write end the keeper held (and from the
    cursor its dir kept). Without that copy the stdin stays closed: writes are refused."""
    _, fds = await keeper.request({"op": "fd", "key": run.job_id})
    for extra in fds[1:]:
        os.close(extra)
    if not fds:
        return
    run.stdin.written = run.log.stdin_cursor()
    # The path is ours to name, not the record's (a file the shell's user may write).
    path = os.path.join(tmpdir, f"{run.job_id}.fifo")
    with contextlib.suppress(OSError):
        run.feed = await RunStdin.adopt(path, fds[0], run.job_id, run.stdin, shell_pid, keeper)


OPEN_WATCH = 0.01  # seconds between looks at the shell's fds while an early EOF waits for it


class _Feed(asyncio.BaseProtocol):
    def __init__(self, queue: StdinQueue, on_closed: Callable[[], None]) -> None:
        self._queue = queue
        self._on_closed = on_closed

    def resume_writing(self) -> None:  # the queue drained (its high-water mark is 0)
        self._queue.room()

    def connection_lost(self, exc: Exception | None) -> None:  # whatever was queued went with it
        self._queue.room()
        self._on_closed()


def _held_by(pid: int, path: str) -> bool:
    """True if process ``pid`` has ``path`` open (or is gone: nobody will open it then)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return True
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{fd}") == path:
                return True
    return False


class RunStdin:
    """The FIFO behind one run's open stdin; :meth:`close` when the run ends."""

    def __init__(self, path: str, shell_pid: int, keeper: KeeperLink | None = None, key: str = "") -> None:
        self.path = path
        self._shell_pid = shell_pid
        self._keeper = keeper if keeper is not None and keeper.present else None
        self._key = key  # what the keeper holds its copy of the write end under (the run's id)
        self._drop: asyncio.Task[Any] | None = None
        self._reader = -1
        self._pipe: asyncio.WriteTransport | None = None
        self._eof_task: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls, tmpdir: str, job_id: str, queue: StdinQueue, shell_pid: int, keeper: KeeperLink | None = None
    ) -> RunStdin:
        """Make the FIFO ``<tmpdir>/<job_id>.fifo`` and attach its write end to ``queue``
        (``keeper``: give it a copy of the write end).

        :raises OSError: it cannot be made (a full disk, ...).
        """
        self = cls(os.path.join(tmpdir, f"{job_id}.fifo"), shell_pid, keeper, job_id)
        os.mkfifo(self.path, 0o600)
        writer = -1
        try:
            self._reader = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            writer = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            self._pipe, _ = await asyncio.get_running_loop().connect_write_pipe(
                lambda: _Feed(queue, self._closed_for_writing), os.fdopen(writer, "wb", buffering=0)
            )
        except BaseException:
            if self._pipe is None and writer >= 0:
                with contextlib.suppress(OSError):
                    os.close(writer)
            self.close()
            raise
        queue.attach(self._pipe, True)
        if self._keeper is not None:
            dup = os.dup(writer)
            try:
                await self._keeper.request({"op": "hold", "key": self._key}, dup)
            finally:
                os.close(dup)
        return self

    @classmethod
    async def adopt(
        cls, path: str, fd: int, job_id: str, queue: StdinQueue, shell_pid: int, keeper: KeeperLink
    ) -> RunStdin:
        """Go on feeding the FIFO ``path`` an earlier agent made, through ``fd``, its write end
        the keeper held (taken over: closed here, also on failure).

        :raises OSError: the FIFO is gone.
        """
        self = cls(path, shell_pid, keeper, job_id)
        try:
            self._reader = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            os.set_blocking(fd, False)
            self._pipe, _ = await asyncio.get_running_loop().connect_write_pipe(
                lambda: _Feed(queue, self._closed_for_writing), os.fdopen(fd, "wb", buffering=0)
            )
        except BaseException:
            if self._pipe is None:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self.close()
            raise
        queue.attach(self._pipe, True)
        return self

    def _let_go(self) -> None:
        """The keeper's copy of the write end goes (EOF, or the run ended): then the command
        reads EOF once ours is closed too."""
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            self._drop = asyncio.get_running_loop().create_task(keeper.request({"op": "drop", "key": self._key}))

    def _closed_for_writing(self) -> None:
        self._let_go()
        if self._reader >= 0 and not _held_by(self._shell_pid, self.path):
            with contextlib.suppress(OSError):  # a writer until the shell has opened it
                spare = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
                self._eof_task = asyncio.get_running_loop().create_task(self._release_when_held(spare))

    async def _release_when_held(self, spare: int) -> None:
        """Close ``spare`` once the shell holds the FIFO; cancelled (by :meth:`close`): at once."""
        try:
            while not _held_by(self._shell_pid, self.path):  # noqa: ASYNC110 (no event for it: see above)
                await asyncio.sleep(OPEN_WATCH)
        finally:
            os.close(spare)

    def close(self) -> None:
        """The run ended: drop what is queued and what the command left unread."""
        self._let_go()
        pipe = self._pipe
        if pipe is not None and (not pipe.is_closing() or pipe.get_write_buffer_size()):
            pipe.abort()  # (a transport closed and flushed already is gone: nothing to abort)
        if self._eof_task is not None:
            self._eof_task.cancel()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        if self._reader >= 0:
            with contextlib.suppress(OSError):
                os.close(self._reader)
            self._reader = -1
