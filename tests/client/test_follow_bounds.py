"""A handle's pushed output is bounded by its consumer: a fast stream is followed call after call
with no pause while the consumer keeps up, and a consumer that stops reading stops the calls
once two budgets wait unread (the host's memory per job)."""

from __future__ import annotations

import asyncio

import anyio
import pytest

import remote_exec as rx
from remote_exec.client.follower import FOLLOW_BUDGET
from remote_exec.client.process import MAX_POLL_BYTES

pytestmark = pytest.mark.anyio

BYTES = 30_000_000  # base64: 40 MB, five budgets


async def test_a_reader_that_stops_holds_at_most_two_budgets(url: str) -> None:
    async with rx.open_sandbox(url) as sb:
        proc = sb.exec_remote(["sh", "-c", f"head -c {BYTES} /dev/zero | base64 -w 0"], encoding="base64")
        first = await anext(aiter(proc))  # the reader takes one chunk, then reads no more
        assert isinstance(first, rx.StdoutChunk)
        follower = proc._follower
        assert follower is not None
        with anyio.fail_after(120):  # until no call is under way: the last ended with two budgets unread
            while (call := follower._task) is not None and not call.done():
                await asyncio.wait([call])  # its end may start the next (its done callback runs first)
        assert FOLLOW_BUDGET <= proc._queued <= 2 * FOLLOW_BUDGET + 2 * MAX_POLL_BYTES
        got = len(first.data) + sum([len(ev.data) async for ev in proc if isinstance(ev, rx.StdoutChunk)])
        assert got == 4 * BYTES // 3  # reading again: the rest comes, all of it, once
