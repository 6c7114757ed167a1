"""Helpers of the real and the fast tier's tests: what a pod lost mid-stream does to a sandbox's
waiters, and the sockets this process holds to an API server."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import pytest

import remote_exec as rx

STREAM = "while :; do echo tick; sleep 0.05; done"


async def lost_waiters(sb: rx.AsyncSandbox, act: Callable[[], object], what: str) -> list[str]:
    """Two waiters (a streaming job, a blocking run), then ``act``; each one's error text."""
    errors: list[str] = []
    both = anyio.Event()
    proc = sb.exec_remote(["sh", "-c", STREAM])
    async for ev in proc:
        if isinstance(ev, rx.StdoutChunk):
            break  # streaming
    waiting = sb.exec_remote(["sleep", "60"])
    await waiting.started()

    async def wait_on(events: AsyncIterator[object]) -> None:
        with pytest.raises(rx.SandboxLostError) as caught:
            async for _ in events:
                pass
        errors.append(str(caught.value))
        if len(errors) == 2:
            both.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait_on, proc.__aiter__())
        tg.start_soon(wait_on, waiting.__aiter__())
        t0 = time.monotonic()
        with anyio.fail_after(20):  # a guard against a hang, not the bound (printed below)
            await anyio.to_thread.run_sync(act)
            await both.wait()
    print(f"\n{what}: both waiters failed {time.monotonic() - t0:.2f} s after: {errors[0]}")
    return errors


def our_sockets_to(port: int) -> int:
    """How many of this process's open TCP sockets are connected to ``port`` (any state)."""
    ours = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                ours.add(target[8:-1])
    rows = (line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:])
    return sum(1 for f in rows if int(f[2].split(":")[1], 16) == port and f[9] in ours)
