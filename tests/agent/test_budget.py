"""The agent's memory budget, its reclaimers and the output buffers charged to it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from remote_exec.agent.budget import DEFAULT_BUDGET, MemoryBudget, default_budget
from remote_exec.agent.buffer import StreamBuffer

pytestmark = pytest.mark.anyio


def test_holders_get_three_quarters_and_requests_the_rest() -> None:
    b = MemoryBudget(100)
    assert b.reserve_up_to(90) == 75  # holders stop at their share
    assert b.free() == 0 and b.free(intake=True) == 25
    assert not b.try_reserve(26, intake=True) and b.try_reserve(25, intake=True)
    b.release(25, intake=True)
    b.release(75)
    assert (b.used, b.held, b.peak) == (0, 0, 100)


def test_a_short_budget_asks_reclaimers_first() -> None:
    b = MemoryBudget(100)
    b.force(75)
    asked: list[int] = []

    def reclaim(n: int) -> int:
        asked.append(n)
        b.release(n)
        return n

    b.add_reclaimer(reclaim)
    assert b.try_reserve(10)
    assert asked == [10] and b.held == 75


async def test_freed_wakes_a_waiter() -> None:
    b = MemoryBudget(10)
    b.force(10)
    waiter = asyncio.ensure_future(b.freed())
    await asyncio.sleep(0)  # let it start waiting
    assert not waiter.done()
    b.release(4)
    await asyncio.wait_for(waiter, 1)


def test_default_budget_is_a_quarter_of_the_cgroup_limit(tmp_path: Path) -> None:
    (tmp_path / "memory.max").write_text("536870912\n")
    assert default_budget(tmp_path) == 128 * 1024 * 1024
    (tmp_path / "memory.max").write_text("max\n")
    assert default_budget(tmp_path) == DEFAULT_BUDGET
    (tmp_path / "memory.max").write_text("1000\n")
    assert default_budget(tmp_path) == 16 * 1024 * 1024  # a floor
    assert default_budget(tmp_path / "absent") == DEFAULT_BUDGET


def test_a_buffer_drops_its_head_when_the_budget_is_short_and_counts_it() -> None:
    b = MemoryBudget(400)  # holders: 300
    one, two = StreamBuffer(1000, b), StreamBuffer(1000, b)
    one.append(b"a" * 200)
    two.append(b"b" * 200)  # over the share by 100: its own oldest bytes go
    assert b.held == 300 and two.held == 100
    assert two.read(0, 1000, "utf-8").dropped == 100
    freed = one.discard()
    assert freed == 200 and b.held == 100
    assert one.read(0, 1000, "utf-8").dropped == 200


def test_a_watched_buffer_keeps_unread_bytes_and_asks_for_a_pause() -> None:
    b = MemoryBudget(400)
    buf = StreamBuffer(1000, b)
    buf.append(b"x" * 400, keep_unread=True)  # nobody read them: kept, over the budget
    assert buf.held == 400 and b.over == 100
    assert buf.wants_pause()
    buf.read(0, 400, "utf-8")
    buf.append(b"y", keep_unread=True)  # now read bytes may go
    assert b.over == 0
