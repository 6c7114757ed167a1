"""SandboxPool: one opening per key under races, failures not cached, LRU eviction, idle TTL."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import pytest

import remote_exec as rx
from remote_exec.agent.jobs.proctable import group_members
from remote_exec.pool import SandboxPool
from remote_exec.sandboxes.local import LocalTransport

pytestmark = pytest.mark.anyio


@pytest.fixture
def url(agent_dir: Path) -> str:
    return f"local://?dir={agent_dir}"


async def until(condition: Callable[[], bool], timeout: float = 10) -> None:
    """Wait (bounded) for ``condition``: for what the pool does in the background."""
    with anyio.fail_after(timeout):
        while not condition():  # noqa: ASYNC110 (state a background task changes; bounded)
            await anyio.sleep(0.01)


def gated_factory(
    url: str, go: anyio.Event, fail_first: bool = False
) -> tuple[list[str], Callable[[str], Awaitable[rx.AsyncSandbox]]]:
    """A factory that records each call and holds every opening until ``go`` is set."""
    calls: list[str] = []

    async def factory(key: str) -> rx.AsyncSandbox:
        calls.append(key)
        await go.wait()
        if fail_first and len(calls) == 1:
            raise rx.SandboxError("first opening fails")
        return await rx.open_sandbox(url)

    return calls, factory


async def test_get_opens_once_and_runs_commands(url: str) -> None:
    async with SandboxPool(url) as pool:
        sb = await pool.get("alice")
        assert await pool.get("alice") is sb
        async with pool.lease("alice") as leased:
            assert leased is sb
            res = await sb.exec_remote(["echo", "hi"], stream=False)
        assert res.stdout == "hi\n" and res.success
        assert (len(pool), pool.keys(), "alice" in pool, "bob" in pool) == (1, ["alice"], True, False)
        assert (pool.stats.opened, pool.stats.reused, pool.stats.in_use) == (1, 2, 0)
    assert sb.closed


async def test_concurrent_gets_share_one_opening(url: str) -> None:
    go = anyio.Event()
    calls, factory = gated_factory(url, go)
    got: list[rx.AsyncSandbox] = []
    async with SandboxPool(factory) as pool:

        async def want() -> None:
            got.append(await pool.get("k"))

        async with anyio.create_task_group() as tg:
            for _ in range(10):
                tg.start_soon(want)
            await anyio.wait_all_tasks_blocked()  # all ten are inside get(), the opening is held
            assert (calls, pool.stats.reused, pool.stats.in_use, len(pool)) == (["k"], 9, 1, 1)
            go.set()
        assert len(got) == 10 and all(sb is got[0] for sb in got)
        assert calls == ["k"] and pool.stats.opened == 1
        assert (await got[0].run(["echo", "one"])).stdout == "one\n"


async def test_cancelled_waiters_do_not_cancel_the_opening(url: str) -> None:
    go = anyio.Event()
    calls, factory = gated_factory(url, go)
    async with SandboxPool(factory) as pool:
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(pool.get, "k")
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()  # every waiter gives up while the opening is held
        assert pool.stats.in_use == 0 and "k" in pool
        go.set()
        with anyio.fail_after(10):
            sb = await pool.get("k")  # the opening finished for nobody and was kept
        assert calls == ["k"] and not sb.closed and pool.stats.opened == 1


async def test_failed_opening_reaches_every_waiter_and_is_not_cached(url: str) -> None:
    go = anyio.Event()
    calls, factory = gated_factory(url, go, fail_first=True)
    errors: list[Exception] = []
    async with SandboxPool(factory) as pool:

        async def want() -> None:
            try:
                await pool.get("k")
            except rx.SandboxError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(want)
            await anyio.wait_all_tasks_blocked()
            go.set()
        assert len(errors) == 5 and all(e is errors[0] for e in errors)
        assert "k" not in pool and pool.stats.failed == 1
        sb = await pool.get("k")  # tried again, not the cached failure
        assert calls == ["k", "k"] and (await sb.run(["true"])).success


async def test_discard_or_aclose_during_an_opening_cancels_it(url: str) -> None:
    go = anyio.Event()  # never set: the openings are held until cancelled
    cancelled: list[str] = []

    async def factory(key: str) -> rx.AsyncSandbox:
        try:
            await go.wait()
        except anyio.get_cancelled_exc_class():
            cancelled.append(key)
            raise
        raise AssertionError("unreachable")

    errors: list[Exception] = []

    async def want(key: str) -> None:
        try:
            await pool.get(key)
        except (rx.SandboxError, RuntimeError) as exc:
            errors.append(exc)

    async with SandboxPool(factory) as pool:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(want, "a")
                tg.start_soon(want, "b")
                await anyio.wait_all_tasks_blocked()
                assert await pool.discard("a") and pool.keys() == ["b"]
                await until(lambda: len(errors) == 1)
                await pool.aclose()
    assert [type(e) for e in errors] == [rx.SandboxError, RuntimeError]
    assert "discarded while being opened" in str(errors[0]) and "pool closed" in str(errors[1])
    assert sorted(cancelled) == ["a", "b"]


async def test_lru_eviction_closes_the_least_recently_used_idle_sandbox(url: str) -> None:
    async with SandboxPool(lambda key: url, max_size=2) as pool:  # a key -> URL function
        a, b = await pool.get("a"), await pool.get("b")
        proc = b.exec_remote(["sh", "-c", "echo $$; exec sleep 300"], kill_grace=0.1)
        async for ev in proc:
            assert isinstance(ev, rx.StdoutChunk)
            pid = int(str(ev.data))
            break
        assert await pool.get("a") is a  # a is now the most recently used: b goes first
        c = await pool.get("c")
        await until(lambda: b.closed)
        assert pool.keys() == ["a", "c"] and pool.stats.evicted == 1
        assert not a.closed and not c.closed
        await until(lambda: group_members(pid) == [])  # closing the evicted sandbox killed its job
        d = await pool.get("d")
        await until(lambda: a.closed)
        assert pool.keys() == ["c", "d"] and not d.closed


async def test_leased_sandboxes_are_never_evicted(url: str) -> None:
    async with SandboxPool(url, max_size=1) as pool:
        async with pool.lease("a") as a:
            b = await pool.get("b")  # over max_size: a is leased, so the pool grows
            await anyio.wait_all_tasks_blocked()  # (a background close would have run by now)
            assert len(pool) == 2 and not b.closed
            assert await pool.get("b") is b  # reusing b while over max_size does not evict it
            c = await pool.get("c")  # the idle b goes, never the leased a
            await until(lambda: b.closed)
            assert pool.keys() == ["a", "c"] and not a.closed
        # the lease ended: back to max_size, the least recently used (c) goes
        await until(lambda: c.closed)
        assert pool.keys() == ["a"] and not a.closed and pool.stats.evicted == 2


class FakeClock:
    """Monotonic seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


async def test_idle_sandboxes_expire_after_ttl_but_not_while_leased(url: str) -> None:
    clock, ttl = FakeClock(), 3600.0  # an hour: only the fake clock can pass it
    async with SandboxPool(url, idle_ttl=ttl, clock=clock) as pool:
        a = await pool.get("a")
        clock.advance(ttl - 1)
        assert pool.expire_idle() == 0 and not a.closed and "a" in pool
        clock.advance(1)
        assert pool.expire_idle() == 1 and "a" not in pool and pool.stats.expired == 1
        await until(lambda: a.closed)

        async with pool.lease("b") as b:
            c = await pool.get("c")  # idle beside the leased b
            clock.advance(3 * ttl)  # b is held well past the TTL
            assert pool.expire_idle() == 1
            await until(lambda: c.closed)
            assert not b.closed and "b" in pool
        clock.advance(ttl - 1)  # the TTL counts from the end of the lease
        assert pool.expire_idle() == 0 and not b.closed
        clock.advance(1)
        assert pool.expire_idle() == 1
        await until(lambda: b.closed)
        assert pool.stats.expired == 3
        assert await pool.get("a") is not a  # an expired key opens afresh


async def test_the_reaper_expires_by_the_pools_clock(url: str) -> None:
    clock = FakeClock()  # a short TTL, so the reaper's real-time nap between checks is short
    async with SandboxPool(url, idle_ttl=0.05, clock=clock) as pool:
        a = await pool.get("a")
        clock.advance(0.05)
        await until(lambda: a.closed)  # the background task did it, no call from here
        assert pool.stats.expired == 1


async def test_closed_sandbox_is_replaced_on_next_get(url: str) -> None:
    async with SandboxPool(lambda key: rx.open_sandbox(url)) as pool:  # a key -> opener function
        old = await pool.get("k")
        await old.aclose()
        new = await pool.get("k")
        assert new is not old and not new.closed and pool.stats.replaced == 1
        assert (await new.run(["echo", "back"])).stdout == "back\n"


async def test_discard(url: str) -> None:
    async with SandboxPool(url) as pool:
        a = await pool.get("a")
        assert await pool.discard("a") and a.closed and "a" not in pool
        assert not await pool.discard("a")
        async with pool.lease("b") as b:
            assert await pool.discard("b") and "b" not in pool
            assert not b.closed  # a lease is never cut short...
            assert (await b.run(["true"])).success
            assert await pool.get("b") is not b  # ...but the key already opens afresh
        await until(lambda: b.closed)  # ...and the discarded one closes when it ends
        assert pool.stats.discarded == 2


async def test_aclose_closes_everything_even_leased(url: str) -> None:
    async with SandboxPool(url, idle_ttl=60) as pool:
        a, b = await pool.get("a"), await pool.get("b")
        async with pool.lease("c") as c:
            await pool.aclose()
            assert a.closed and b.closed and c.closed and len(pool) == 0
        with pytest.raises(RuntimeError, match="closed"):
            await pool.get("a")
    with pytest.raises(RuntimeError, match="new"):
        await SandboxPool(url).get("a")


async def test_close_failures_are_logged_or_raised_together(url: str, caplog: pytest.LogCaptureFixture) -> None:
    class FailingClose(LocalTransport):
        async def aclose(self) -> None:
            raise OSError(f"cannot tear down {self.url}")

    async def factory(key: str) -> rx.AsyncSandbox:
        return rx.AsyncSandbox(FailingClose.from_url(f"{url}&idle_timeout=900"))  # unopened: the pool opens it

    with pytest.raises(ExceptionGroup) as info:
        async with SandboxPool(factory, max_size=1) as pool:
            x = await pool.get("x")
            y = await pool.get("y")  # evicts x: its close fails in the background, logged
            await until(lambda: any(f"closing pooled sandbox {x.url}" in r.getMessage() for r in caplog.records))
            assert x.closed and all(r.levelno == logging.WARNING for r in caplog.records)
            z = await pool.get("z")
    assert y.closed and z.closed
    assert [str(e) for e in info.value.exceptions] == [f"cannot tear down {url}&idle_timeout=900"]


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="max_size"):
        SandboxPool("local://", max_size=0)
    with pytest.raises(ValueError, match="idle_ttl"):
        SandboxPool("local://", idle_ttl=0)
