"""A job's logs at any offset, its tail, forget and prune (#14): real agent, bytes asserted."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

import remote_exec as rx

from ..conftest import job_dir

pytestmark = pytest.mark.anyio

SEQ = b"".join(b"%d\n" % i for i in range(1, 100001))  # 588 895 bytes


async def _ended(sb: rx.AsyncSandbox, command: list[str], **kw: object) -> str:
    res = await sb.run(command, **kw)  # type: ignore[arg-type]
    return res.job_id


async def test_read_at_any_offset_and_the_tail_are_exact(fresh_agent_dir: Path) -> None:
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}") as sb:
        job = await _ended(sb, ["sh", "-c", "seq 1 100000; echo oops >&2"])
        first = await sb.read_output(job, offset=0, max_bytes=4096)
        middle = await sb.read_output(job, offset=300_000, max_bytes=70_000)
        last = await sb.read_output(job, offset=len(SEQ) - 10)
        assert (first.data, first.offset, first.dropped, first.size) == (SEQ[:4096], 0, 0, len(SEQ))
        assert middle.data == SEQ[300_000:370_000] and middle.end == 370_000 and not middle.complete
        assert last.data == SEQ[-10:] and last.complete and last.exit_code == 0 and last.state == "completed"
        tail = await sb.tail_output(job, 12)
        assert (tail.data, tail.offset) == (SEQ[-12:], len(SEQ) - 12)
        err = await sb.tail_output(job, 100, "stderr")
        assert (err.data, err.offset, err.size) == (b"oops\n", 0, 5)
        with pytest.raises(rx.InvalidParamsError, match="past the end"):
            await sb.read_output(job, offset=len(SEQ) + 1)
        with pytest.raises(rx.JobNotFoundError):
            await sb.read_output(job.rsplit("-", 1)[0] + "-999999")


async def test_a_running_jobs_tail_and_the_disk_cap_count(fresh_agent_dir: Path) -> None:
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}") as sb:
        proc = sb.exec_remote(["sh", "-c", "seq 1 100000; echo done; exec sleep 300"], output_cap=64 * 1024)
        async for ev in proc:  # follow until the last line is out (an event, not a sleep)
            if isinstance(ev, rx.StdoutChunk) and isinstance(ev.data, str) and ev.data.endswith("done\n"):
                break
        tail = await proc.tail(5)
        assert tail.data == b"done\n" and tail.state == "running" and tail.exit_code is None
        # The cap is enforced by the agent's sweeper (every second) while the job runs.
        with anyio.fail_after(10):
            while (head := await sb.read_output(proc.job_id or "", offset=0, max_bytes=16)).dropped == 0:  # noqa: ASYNC110
                await anyio.sleep(0.1)
        whole = SEQ + b"done\n"
        assert head.dropped % 4096 == 0 and head.offset == head.dropped
        assert len(whole) - 64 * 1024 - 4096 < head.dropped <= len(whole) - 64 * 1024
        assert head.data == whole[head.offset : head.offset + 16]
        await proc.kill(grace=0)


async def test_forget_and_prune(fresh_agent_dir: Path) -> None:
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}") as sb:
        ended = [await _ended(sb, ["echo", str(i)]) for i in range(5)]
        running = await sb.exec_remote(["sleep", "300"]).started()
        jobs_dir = fresh_agent_dir / "jobs"
        dirs = {j: job_dir(fresh_agent_dir, j) for j in [*ended, running.job_id or ""]}
        assert all(dirs[j].is_dir() for j in ended)
        with pytest.raises(rx.InvalidParamsError, match="still running"):
            await sb.forget(running.job_id or "")
        await sb.forget(ended[0])
        assert not dirs[ended[0]].exists()
        with pytest.raises(rx.JobNotFoundError):
            await sb.read_output(ended[0])
        pruned = await sb.prune(keep=2)
        assert (pruned.forgotten, pruned.job_ids) == (2, ended[1:3])
        assert [j.job_id for j in await sb.jobs()] == [*ended[3:], running.job_id]
        assert (await sb.prune(older_than=0)).job_ids == ended[3:]
        assert [j.job_id for j in await sb.jobs()] == [running.job_id]
        assert sorted(p.name for p in jobs_dir.iterdir() if p.is_dir()) == [dirs[running.job_id or ""].name]
        await running.kill(grace=0)


def test_the_blocking_twins(fresh_agent_dir: Path) -> None:
    with rx.connect(f"local://?dir={fresh_agent_dir}") as sb:
        proc = sb.exec_remote(["seq", "1", "100000"])
        proc.wait()
        job = proc.job_id or ""
        assert sb.read_output(job, offset=10, max_bytes=5).data == SEQ[10:15]
        assert sb.tail_output(job, 7).data == SEQ[-7:] == proc.tail(7).data
        sb.forget(job)
        assert sb.prune(keep=0).forgotten == 0
