"""Bounded agent buffers: a watched stream is flow-controlled, an unwatched one drops and says so."""

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


async def test_unwatched_output_is_dropped_and_counted(fresh_agent_dir: Path) -> None:
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}&buffer_limit=65536") as sb:
        proc = await sb.exec_remote(["seq", "1", "300000"]).started()
        # Nobody polls the job; wait for it to end by watching its pid from another job.
        await sb.run(["sh", "-c", f"while kill -0 {proc.pid} 2>/dev/null; do sleep 0.01; done"])
        job = await sb.attach(proc.job_id or "")
        res = await job.wait()
    assert res.stdout_truncated == len(SEQ) - 65536
    assert res.stdout == SEQ[-65536:]
    assert res.truncated
