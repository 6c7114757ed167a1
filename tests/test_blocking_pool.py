"""BlockingSandboxPool: the pool from threads, one opening per key, LRU, leases, closing."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import cast

import pytest

import remote_exec as rx


@pytest.fixture
def url(agent_dir: Path) -> str:
    return f"local://?dir={agent_dir}"


def test_threads_racing_for_one_key_share_one_opening(url: str, tmp_path: Path) -> None:
    opened: list[str] = []
    lock = threading.Lock()

    def factory(key: str) -> str:
        with lock:
            opened.append(key)
        return url

    with rx.BlockingSandboxPool(factory, max_size=4) as pool:
        start = threading.Barrier(8)

        def use(i: int) -> rx.Sandbox:
            start.wait()  # all eight ask at once
            sb = pool.get("alice")
            assert sb.run(["echo", str(i)]).stdout == f"{i}\n"
            return sb

        with ThreadPoolExecutor(8) as threads:
            faces = list(threads.map(use, range(8)))
        assert opened == ["alice"]
        assert all(face is faces[0] for face in faces)  # one blocking face per pooled sandbox
        assert pool.stats.opened == 1 and pool.stats.reused == 7
        assert "alice" in pool and len(pool) == 1 and pool.keys() == ["alice"]


def test_lru_eviction_leases_and_close(url: str) -> None:
    with rx.BlockingSandboxPool(url, max_size=2) as pool:
        alice, bob = pool.get("alice"), pool.get("bob")
        with pool.lease("alice") as leased:
            assert leased is alice
            carol = pool.get("carol")  # bob is the least recently used idle one: evicted
            assert pool.keys() == ["alice", "carol"]
        assert bob.async_sandbox.closed and not alice.async_sandbox.closed
        assert pool.stats.evicted == 1
        assert pool.discard("carol") and carol.async_sandbox.closed
        assert pool.get("bob") is not bob  # a new sandbox for an evicted key
        assert repr(pool).startswith("<BlockingSandboxPool open 2/2")
    assert alice.async_sandbox.closed  # leaving the block closed every sandbox
    assert len(pool) == 0
    with pytest.raises(RuntimeError, match="not open"):
        pool.get("alice")


def test_a_failing_opening_raises_and_is_not_cached(url: str) -> None:
    attempts: list[str] = []

    def factory(key: str) -> str:
        attempts.append(key)
        return "nosuch://" if len(attempts) == 1 else url

    with rx.BlockingSandboxPool(factory) as pool:
        with pytest.raises(rx.SandboxError):
            pool.get("k")
        assert pool.get("k").run(["true"]).returncode == 0  # the next call tries again
    assert attempts == ["k", "k"]


def test_usable_inside_a_running_event_loop(url: str) -> None:
    import asyncio

    async def cell() -> str:  # a notebook cell's situation: a loop runs in this thread
        with rx.BlockingSandboxPool(url) as pool:
            return cast(str, pool.get("nb").run(["echo", "hi"]).stdout)

    assert asyncio.run(cell()) == "hi\n"
