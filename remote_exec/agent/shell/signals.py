"""Signalling what a shell run started: Ctrl-C that is never lost, and signals to its processes.

A shell without a terminal has no job control: its commands share its process group, so SIGINT
to that group reaches the shell and its foreground command, while background jobs ignore it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Iterable

from ..jobs.proctable import SessionProcess, group_alive, scan, session_members, session_processes

__all__ = ["interrupt", "kill_group", "killpg", "signal_pids", "signal_run_processes"]

RETRY_INTERVAL = 0.2  # while an interrupted run goes on, look this often for what it missed...
RETRIES = 10  # ...this many times
GONE_WAIT = 10.0  # seconds a SIGKILLed group may take to be gone (only a process stuck in the kernel takes long)


async def interrupt(shell_pid: int, run_started: float, ended: asyncio.Event, resend: Callable[[], None]) -> None:
    """Ctrl-C for the run that began at ``run_started`` (``CLOCK_BOOTTIME``), until ``ended``.

    ``resend`` writes the run's recovery line: the shell drops the rest of the command line
    it aborts (and sh even the lines it had read ahead), so it is resent while the run goes on.
    """
    # SIGINT can land while the shell starts a command: the shell gets it and waits for a child
    # that did not (not forked yet, or forked but still running the shell's inherited handler,
    # which swallows it before exec). So note who was there, and later signal the ones that came
    # after, or that were such a copy of the shell then (same handlers) and run a program now.
    before = {p.pid: p for p in await scan(session_processes, shell_pid)}
    shell = before.get(shell_pid)
    if ended.is_set():
        return
    killpg(shell_pid, signal.SIGINT)
    # A command that moved to a process group of its own (timeout(1) does) is out of the shell's
    # group; a terminal's Ctrl-C would reach it as the foreground job, so do that here.
    signal_pids(p.pid for p in before.values() if p.pgid != shell_pid and p.started >= run_started - 0.01)

    def missed(p: SessionProcess) -> bool:
        old = before.get(p.pid)
        if old is None:
            return p.pid != shell_pid
        return shell is not None and old.caught == shell.caught and p.caught != old.caught

    for _ in range(RETRIES):
        if ended.is_set():  # it ended during the scan: a line resent now would follow the next run's
            return
        resend()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ended.wait(), RETRY_INTERVAL)
        if ended.is_set():
            return
        late = [p for p in await scan(session_processes, shell_pid) if missed(p)]
        signal_pids(p.pid for p in late)
        before.update((p.pid, p) for p in late)


async def signal_run_processes(shell_pid: int, run_started: float, sig: int) -> None:
    """Send ``sig`` to the shell's processes started since the run began (never the shell)."""
    pids = await scan(session_members, shell_pid, run_started)
    signal_pids((pid for pid in pids if pid != shell_pid), sig)


def signal_pids(pids: Iterable[int], sig: int = signal.SIGINT) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


async def kill_group(pgid: int) -> None:
    """SIGKILL process group ``pgid`` and return once nothing of it is left alive (or after
    :data:`GONE_WAIT`: a process in uninterruptible sleep dies when the kernel lets it). A killed
    process is still there until the scheduler runs it, later still on a loaded machine."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + GONE_WAIT
    killpg(pgid, signal.SIGKILL)
    # No event says "the group emptied" (Job._terminate polls too); each round kills again what
    # a member forked while it was being killed.
    while await scan(group_alive, pgid) and loop.time() < deadline:
        await asyncio.sleep(0.02)
        killpg(pgid, signal.SIGKILL)


def killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
