"""``remote-exec run -t`` and ``attach -t``: the local terminal as the remote job's terminal.

The local terminal goes raw (every key, Ctrl-C included, is a byte for the remote program, as
with ``ssh -t``), its size is the job's (``SIGWINCH`` -> :meth:`ExecRemoteProcess.resize`), the
job's output bytes go to stdout untouched. ``Ctrl-]`` leaves: the job runs on (its id is
printed) and ``attach -t`` finds it again. The terminal's settings are restored on every way
out: the job's end, ``Ctrl-]``, an error, SIGTERM/SIGHUP to this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import termios
import tty
from collections.abc import Iterator

from ..client.process import ExecRemoteProcess
from ..client.types import Completed, StderrChunk, StdoutChunk
from ..errors import ExecTimeoutError, JobNotRunningError
from ..termsafe import terminal_safe

__all__ = ["DETACH_KEY", "follow_tty", "local_size"]

DETACH_KEY = b"\x1d"  # Ctrl-]: telnet's escape; no shell or editor binds it by default
READ_CHUNK = 4096
DETACHED = 0  # "stopped by" Ctrl-], not by a signal


def local_size() -> tuple[int, int] | None:
    """The local terminal's ``(cols, rows)``, None if stdout/stdin is not a terminal."""
    for fd in (sys.stdout.fileno(), sys.stdin.fileno()):
        with contextlib.suppress(OSError):
            size = os.get_terminal_size(fd)
            return max(1, min(size.columns, 1000)), max(1, min(size.lines, 1000))
    return None


@contextlib.contextmanager
def raw_terminal(fd: int) -> Iterator[None]:
    """``fd``'s terminal in raw mode for the block, its settings restored however it ends."""
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd, termios.TCSANOW)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSAFLUSH, saved)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:  # a non-blocking stdout (shared with a parent): wait until it takes more
            import select

            select.select([], [fd], [])


async def follow_tty(proc: ExecRemoteProcess) -> int:
    """Be ``proc``'s terminal until it ends (its exit status, shell-style) or ``Ctrl-]`` (0).

    The job keeps its size (``run -t`` started it with this terminal's; an attached job keeps
    its starter's) until this terminal's size changes: then it takes the new one.

    Cancelling it (SIGTERM, SIGHUP or SIGINT to this process) restores the terminal and leaves
    the job to the handle's rules (``run``'s job is killed, an attached one is left).
    """
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    if not os.isatty(stdin):
        raise SystemExit("remote-exec: -t needs a terminal on stdin (use it without -t in a pipe)")
    loop = asyncio.get_running_loop()
    keys: asyncio.Queue[bytes] = asyncio.Queue()
    main = asyncio.current_task()
    assert main is not None

    def on_key() -> None:
        try:
            data = os.read(stdin, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            loop.remove_reader(stdin)  # EOF: nothing more to type
            return
        if DETACH_KEY in data:
            proc.detach()  # first: the cancelled iteration would kill a job it still tracks
            stop(DETACHED)
            data = data[: data.index(DETACH_KEY)]
        if data:
            keys.put_nowait(data)

    async def typist() -> None:
        while True:
            data = await keys.get()
            while not keys.empty():  # coalesce a burst (a paste) into one write
                data += keys.get_nowait()
            with contextlib.suppress(JobNotRunningError):  # it just ended: the screen says so
                await proc.write_stdin(data)

    winched = asyncio.Event()

    async def resizer() -> None:
        while True:  # one resize per burst of SIGWINCH (a window dragged wider sends dozens)
            await winched.wait()
            winched.clear()
            size = local_size()
            if size is not None:
                with contextlib.suppress(JobNotRunningError):
                    await proc.resize(*size)

    async def screen() -> int:
        try:
            async for ev in proc:
                if isinstance(ev, StdoutChunk | StderrChunk):
                    data = ev.data if isinstance(ev.data, bytes) else ev.data.encode()
                    _write_all(stdout, data)
                elif isinstance(ev, Completed):
                    code = ev.exit_code
                    return 128 - code if code < 0 else code
        except ExecTimeoutError:
            return 124
        return 1

    stopped_by: list[int] = []

    def stop(sig: int) -> None:
        stopped_by.append(sig)
        main.cancel()

    stoppers = (signal.SIGTERM, signal.SIGHUP)
    tasks: list[asyncio.Task[None]] = []
    with raw_terminal(stdin):
        try:
            for sig in stoppers:
                loop.add_signal_handler(sig, stop, sig)
            loop.add_signal_handler(signal.SIGWINCH, winched.set)
            loop.add_reader(stdin, on_key)
            tasks = [loop.create_task(typist()), loop.create_task(resizer())]
            return await screen()  # its cancellation kills run's job (not an attached one)
        except asyncio.CancelledError:
            if not stopped_by:
                raise
            main.uncancel()
        finally:
            loop.remove_reader(stdin)
            for sig in (*stoppers, signal.SIGWINCH):
                loop.remove_signal_handler(sig)
            for task in tasks:
                task.cancel()
    if stopped_by[0] == DETACHED:
        job = terminal_safe(proc.job_id)
        print(f"\r\nremote-exec: left job {job} running (attach -t to see it again)", file=sys.stderr)
        return 0
    raise SystemExit(128 + stopped_by[0])  # as the signal would have, the terminal restored
