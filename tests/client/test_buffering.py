"""Bounded output: a watched stream loses nothing; one past its disk cap drops its head and says so."""

from __future__ import annotations

from pathlib import Path

import pytest

import remote_exec as rx

pytestmark = pytest.mark.anyio

SEQ = "".join(f"{i}\n" for i in range(1, 300001))  # ~2 MB


async def test_watched_fast_producer_loses_nothing_with_tiny_buffer(fresh_agent_dir: Path) -> None:
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}&buffer_limit=65536") as sb:
        res = await sb.run(["seq", "1", "300000"])
    assert res.stdout == SEQ and not res.truncated


async def test_unwatched_output_past_the_disk_cap_is_dropped_and_counted(fresh_agent_dir: Path) -> None:
    """Output is on disk (#14): an unwatched stream is kept whole up to its cap; past it the head
    is dropped in 4 KiB blocks and a reader is told exactly how many bytes it missed."""
    cap = 64 * 1024
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}&buffer_limit=65536") as sb:
        whole = await sb.exec_remote(["seq", "1", "300000"]).started()
        capped = await sb.exec_remote(["seq", "1", "300000"], output_cap=cap).started()
        # Nobody polls the jobs; wait for them to end by watching their pids from another job.
        await sb.run(
            ["sh", "-c", f"while kill -0 {whole.pid} || kill -0 {capped.pid}; do sleep 0.01; done 2>/dev/null"]
        )
        kept = await (await sb.attach(whole.job_id or "")).wait()
        res = await (await sb.attach(capped.job_id or "")).wait()
    assert kept.stdout == SEQ and not kept.truncated  # the in-RAM buffer_limit no longer bounds it
    dropped = res.stdout_truncated
    assert dropped % 4096 == 0 and len(SEQ) - cap - 4096 < dropped <= len(SEQ) - cap
    assert res.stdout == SEQ[dropped:]
    assert res.truncated
