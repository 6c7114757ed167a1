"""What a pod lost mid-stream does to a sandbox's waiters (the real and the fast tier's tests)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

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
