"""JobFeed: one reader per job on a connection, however many subscribe, on the real agent."""

from __future__ import annotations

import collections
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

import remote_exec as rx
from remote_exec.client.feed import JobFeed, Outcome

pytestmark = pytest.mark.anyio


def collector() -> tuple[list[tuple[str, str]], Callable[[str, str], None]]:
    got: list[tuple[str, str]] = []
    return got, lambda stream, text: got.append((stream, text))


def joined(pieces: list[tuple[str, str]], stream: str) -> str:
    return "".join(text for s, text in pieces if s == stream)


async def test_every_subscriber_sees_everything_from_one_reader(
    url: str, tmp_path: Path, pollers: collections.Counter[int]
) -> None:
    gate = tmp_path / "gate"
    script = f"echo one; echo e1 >&2; while [ ! -e {gate} ]; do sleep 0.02; done; seq 2 400; echo e2 >&2; exit 3"
    async with rx.open_sandbox(url) as sb:
        proc = sb.exec_remote(["sh", "-c", script])
        await proc.started()
        first, on_first = collector()
        feed = JobFeed.of(proc)
        feed.subscribe(on_first)
        with anyio.fail_after(20):
            while joined(first, "stdout") != "one\n" or joined(first, "stderr") != "e1\n":  # noqa: ASYNC110
                await anyio.sleep(0.01)
        # Views made elsewhere (other handles of the same job, same connection) share the feed.
        other = await sb.attach(proc.job_id or "")
        assert JobFeed.of(other) is feed
        late, on_late = collector()
        feed.subscribe(on_late)
        assert late == first  # what was kept, at once
        gate.touch()
        outcome = await feed.ended()
        after, on_after = collector()
        assert await feed.follow(on_after) is outcome  # after the end: the kept output and the end
    lines = "one\n" + "".join(f"{i}\n" for i in range(2, 401))
    for got in (first, late, after):
        assert (joined(got, "stdout"), joined(got, "stderr")) == (lines, "e1\ne2\n")
    assert (outcome.state, outcome.exit_code, feed.state) == ("failed", 3, "failed")
    assert outcome.result is not None and outcome.result.stdout == lines
    assert len(pollers) == 1, pollers  # one handle polled: the agent served each chunk once


async def test_each_connection_has_its_own_feed(url: str) -> None:
    async with rx.open_sandbox(url) as a, rx.open_sandbox(url) as b:
        proc = await a.exec_remote(["echo", "hi"]).started()
        there = await b.attach(proc.job_id or "")
        assert JobFeed.of(proc) is not JobFeed.of(there)
        result = (await JobFeed.of(there).ended()).result
        assert result is not None and result.stdout == "hi\n"


async def test_a_late_subscriber_gets_the_newest_kept_output(url: str) -> None:
    async with rx.open_sandbox(url) as sb:
        proc = await sb.exec_remote(["sh", "-c", "printf '%01000d' 0; printf '%01000d' 1; printf 'end'"]).started()
        feed = JobFeed(proc, keep_chars=1500)
        await feed.ended()
        got, on_got = collector()
        feed.subscribe(on_got)
    assert joined(got, "stdout") == ("0" * 1000 + "0" * 999 + "1" + "end")[-1500:]
    assert feed.dropped_chars == 2003 - 1500


async def test_a_failing_subscriber_does_not_starve_the_others(url: str) -> None:
    async with rx.open_sandbox(url) as sb:
        proc = await sb.exec_remote(["sh", "-c", "echo a; sleep 0.2; echo b"]).started()
        feed = JobFeed.of(proc)

        def broken(_stream: str, _text: str) -> None:
            raise RuntimeError("a broken view")

        feed.subscribe(broken)
        got, on_got = collector()
        outcome = await feed.follow(on_got)
    assert joined(got, "stdout") == "a\nb\n" and outcome.state == "completed"


async def test_a_kill_through_another_handle_is_the_feeds_end_with_the_output(url: str) -> None:
    async with rx.open_sandbox(url) as sb:
        proc = await sb.exec_remote(["sh", "-c", "echo started; exec sleep 300"]).started()
        feed = JobFeed.of(proc)
        got, on_got = collector()
        feed.subscribe(on_got)
        with anyio.fail_after(20):
            while not got:  # noqa: ASYNC110 (the first chunk: no event to wait on but the callback)
                await anyio.sleep(0.01)
        await (await sb.attach(proc.job_id or "")).kill(0.5)
        outcome = await feed.ended()
    assert outcome.state == "killed" and outcome.result is not None and outcome.result.stdout == "started\n"


async def test_a_feed_whose_reading_failed_is_not_handed_out_again(url: str) -> None:
    async with rx.open_sandbox(url) as sb:
        proc = await sb.exec_remote(["echo", "hi"]).started()
        broken = JobFeed.of(proc)
        broken.outcome = Outcome("error", None, RuntimeError("the channel broke"))  # as a failed read ends
        fresh = JobFeed.of(await sb.attach(proc.job_id or ""))
        assert fresh is not broken and (await fresh.ended()).state == "completed"
        assert JobFeed.of(proc) is fresh
