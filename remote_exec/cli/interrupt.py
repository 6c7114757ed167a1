"""Ctrl-C on ``remote-exec run``: SIGINT to the job first, as a local terminal would send it.

The first Ctrl-C sends SIGINT to the job's process group and gives it the job's ``kill_grace``
to clean up (a ``trap ... INT`` that saves a checkpoint runs); if it still runs then, it is
killed (SIGTERM, ``kill_grace``, SIGKILL). A second Ctrl-C kills it at once. Each step is said
on stderr. The notebook's stop button does the same. A third Ctrl-C (an agent that does not
answer) goes to asyncio.run's own handler: the run is cancelled and ``remote-exec`` exits 130.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any

from ..client.process import ExecRemoteProcess
from ..errors import RemoteExecError
from ..termsafe import terminal_safe

__all__ = ["ctrl_c_interrupts"]


class _CtrlC:
    def __init__(self, proc: ExecRemoteProcess, grace: float, previous: Callable[[int, Any], Any] | None) -> None:
        self.proc, self.grace, self.presses, self.previous = proc, grace, 0, previous
        self.tasks: list[asyncio.Task[None]] = []

    def _say(self, text: str) -> None:
        print(f"\nremote-exec: {text}", file=sys.stderr, flush=True)

    def pressed(self) -> None:
        self.presses += 1
        job = terminal_safe(self.proc.job_id)
        loop = asyncio.get_running_loop()
        if self.presses == 1:
            self._say(f"sent SIGINT to job {job}; it is killed if it still runs in {self.grace:g}s (Ctrl-C: now)")
            self.tasks.append(loop.create_task(self._interrupt()))
        elif self.presses == 2:
            for task in self.tasks:
                task.cancel()  # the grace is over: no SIGTERM after the SIGKILL
            self._say(f"killing job {job} now")
            self.tasks.append(loop.create_task(self._kill(0.0)))
        elif self.previous is not None:
            self.previous(signal.SIGINT, None)  # asyncio.run's: cancels the run, raises KeyboardInterrupt

    async def _interrupt(self) -> None:
        with contextlib.suppress(RemoteExecError):  # it ended meanwhile: the follower tells its end
            await self.proc.signal("SIGINT")
        await asyncio.sleep(self.grace)  # the job's time to clean up, a deadline, not a wait for an event
        self._say(f"job {terminal_safe(self.proc.job_id)} still runs after {self.grace:g}s: killing it (SIGTERM)")
        await self._kill(None)

    async def _kill(self, grace: float | None) -> None:
        with contextlib.suppress(RemoteExecError):
            await self.proc.kill(grace)


@contextlib.contextmanager
def ctrl_c_interrupts(proc: ExecRemoteProcess, grace: float) -> Iterator[_CtrlC]:
    """For the block, SIGINT to this process interrupts ``proc`` as above instead of raising
    ``KeyboardInterrupt``; the previous handler is put back after (asyncio.run's own)."""
    loop = asyncio.get_running_loop()
    previous = signal.getsignal(signal.SIGINT)
    ctrl = _CtrlC(proc, grace, previous if callable(previous) else None)
    loop.add_signal_handler(signal.SIGINT, ctrl.pressed)
    try:
        yield ctrl
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        signal.signal(signal.SIGINT, previous)
        for task in ctrl.tasks:
            task.cancel()
