"""The client chooses each job's id (issue #21: ids are data): known the moment ``exec_remote()``
returns, of the safe form, and a start repeated under it is the same job, with the real agent."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import anyio
import pytest

import remote_exec as rx
from remote_exec.client.process import new_job_id
from remote_exec.protocol import ListParams, ListResult, Method, StartParams, StartResult
from remote_exec.protocol.names import is_job_id

from ..agent.rawhttp import rpc
from ..conftest import agent_killed, job_dir

pytestmark = pytest.mark.anyio


async def _start(sb: rx.AsyncSandbox, **params: object) -> StartResult:
    return await sb._core.rpc.call(Method.EXEC_REMOTE_START, StartParams.model_validate(params), StartResult)


async def test_the_job_id_is_known_when_exec_remote_returns(url: str) -> None:
    async with rx.open_sandbox(url) as sb:
        proc = sb.exec_remote(["sh", "-c", "exit 3"])
        chosen = proc.job_id  # before any await: the client chose it
        assert is_job_id(chosen) and not chosen.startswith(sb.info.instance_id)
        result = await proc.wait()
        assert (result.job_id, result.returncode) == (chosen, 3)
        assert chosen in [j.job_id for j in await sb.jobs()]
        other = sb.exec_remote(["true"])
        assert other.job_id != chosen
        await other.wait()


async def test_a_repeated_start_under_one_id_is_one_job(url: str) -> None:
    """A start whose answer was lost is sent again with the same params: the agent answers with
    the job the first made, whether it still spawns (a concurrent repeat), runs or ended."""
    async with rx.open_sandbox(url) as sb:
        job_id = new_job_id()
        first, second = await _both(sb, job_id)
        assert first == second
        again = await _start(sb, command=["sleep", "300"], job_id=job_id)
        assert again == first
        assert [j.job_id for j in await sb.jobs()].count(job_id) == 1
        await (await sb.attach(job_id)).kill(grace=0)
        assert await _start(sb, command=["sleep", "300"], job_id=job_id) == first  # ended: still the same job
        with pytest.raises(rx.InvalidParamsError, match="taken by another job"):
            await _start(sb, command=["sleep", "301"], job_id=job_id)


async def _both(sb: rx.AsyncSandbox, job_id: str) -> tuple[StartResult, StartResult]:
    results: list[StartResult] = []

    async def one() -> None:
        results.append(await _start(sb, command=["sleep", "300"], job_id=job_id))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(one)
            tg.start_soon(one)
    return results[0], results[1]


async def test_the_agent_refuses_ids_of_an_unsafe_or_its_own_form(agent_dir: Path, url: str) -> None:
    async with rx.open_sandbox(url) as sb:
        # An id the caller gives that no job can have is refused before it is sent.
        for call in (sb.read_output, sb.forget, sb.attach, sb.job_stats, sb.reattach_shell):
            with pytest.raises(rx.InvalidParamsError, match="not a job id"):
                await call('a{__import__("os")}')
    sock = agent_dir / "agent.sock"
    for bad in ['a{__import__("os")}', "$(touch x)", "../x", "x" * 129, ""]:
        answer = await anyio.to_thread.run_sync(rpc, sock, "exec_remote_start", {"command": ["true"], "job_id": bad})
        assert answer["error"]["code"] == -32602, (bad, answer)  # invalid params: nothing started
    started = await anyio.to_thread.run_sync(rpc, sock, "exec_remote_start", {"command": ["true"]})
    agent_form = started["result"]["job_id"]  # no id asked for: the agent makes one, <state id>-<n>
    prefix = agent_form.rpartition("-")[0]
    assert is_job_id(agent_form) and prefix.isalnum()
    clash = await anyio.to_thread.run_sync(
        rpc, sock, "exec_remote_start", {"command": ["true"], "job_id": f"{prefix}-999999"}
    )
    assert clash["error"]["code"] == -32602 and "agent's own ids" in clash["error"]["message"]


async def test_listing_order_paging_and_readoption_keep_the_start_order(fresh_agent_dir: Path) -> None:
    """Client ids and agent ids mixed: listed in the order started, page after page, and so
    again under the next agent (which re-adopts them from their records)."""
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}", response_margin=1.0) as sb:
        sock = fresh_agent_dir / "agent.sock"
        order: list[str] = []
        for i in range(6):
            if i % 2:
                answer = await anyio.to_thread.run_sync(rpc, sock, "exec_remote_start", {"command": ["true"]})
                order.append(answer["result"]["job_id"])
            else:
                order.append((await sb.run(["true"])).job_id)
        assert await _paged(sb) == order
        await sb.forget(order[2])  # a page cursor naming a forgotten job still works
        page = await sb._core.rpc.call(Method.EXEC_REMOTE_LIST, ListParams(after=order[2], limit=2), ListResult)
        assert [j.job_id for j in page.jobs] == order[3:5]
        del order[2]
        await agent_killed(sb)
        assert await _paged(sb) == order  # the next agent's re-adoption kept ids and order
        late = (await sb.run(["true"])).job_id
        assert await _paged(sb) == [*order, late]


async def _paged(sb: rx.AsyncSandbox) -> list[str]:
    ids: list[str] = []
    after: str | None = None
    while True:
        page = await sb._core.rpc.call(Method.EXEC_REMOTE_LIST, ListParams(after=after, limit=2), ListResult)
        ids += [j.job_id for j in page.jobs]
        if page.next is None:
            return ids
        after = page.next


async def test_a_forged_record_reusing_a_client_id_does_not_replace_the_job(fresh_agent_dir: Path) -> None:
    """A job can copy its own job dir under a later name: the next agent keeps the first job
    under that id (its own output), leaves the copy out and says so in agent.log."""
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}", response_margin=1.0) as sb:
        done = await sb.run(["echo", "genuine"])
        mine = job_dir(fresh_agent_dir, done.job_id)
        prefix = mine.name.rpartition("-")[0]
        forged = mine.with_name(f"{prefix}-999999")
        shutil.copytree(mine, forged)
        meta = json.loads((forged / "job.json").read_bytes())
        (forged / "job.json").write_text(json.dumps({**meta, "job_id": forged.name}))
        (forged / "stdout").write_bytes(b"forged\n")
        await agent_killed(sb)
        assert [j.job_id for j in await sb.jobs()] == [done.job_id]
        assert (await sb.read_output(done.job_id)).data == b"genuine\n"
    assert f"its id {done.job_id} is another job's" in (fresh_agent_dir / "agent.log").read_text()
