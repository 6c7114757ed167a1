"""Point 8: the agent's memory is bounded by one budget, whatever the sandbox or a client does.

Each attack runs against a real agent with a small budget (32 MiB) and reads the agent's peak
RSS (``VmHWM``) from /proc: it must stay under the RSS the agent had before the attack plus the
budget plus a slack for one pipe read or frame piece in flight per holder and the allocator.
Before the budget these grew without bound: 1280 MiB of stdin to a job that never reads, 2500 MiB
of finished jobs' output, 1436 MiB of half-sent requests, and an OOM kill in a small container.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest

import remote_exec as rx
from remote_exec.protocol import STREAM_SOCKET, frames

from ..conftest import stop_agent
from .conftest import Adversary

pytestmark = pytest.mark.anyio

MiB = 1024 * 1024
BUDGET = 32 * MiB
SLACK = 24 * MiB  # frames/pipe reads in flight past the budget, allocator rounding, Python's heap


def _status(pid: int, field: str) -> int:
    """A ``Vm*`` field of /proc/<pid>/status, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for {pid}")


class Raw:
    """One raw frame-stream connection to the agent: requests as the attacker writes them."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer, self._id = reader, writer, 0

    async def call(self, method: str, params: dict[str, Any], payload: bytes | None = None) -> dict[str, Any]:
        self._id += 1
        msg = json.dumps({"jsonrpc": "2.0", "id": self._id, "method": method, "params": params}).encode()
        self.writer.write(frames.encode(msg, payload) + b"\n")
        await self.writer.drain()
        frame = await asyncio.wait_for(frames.read_frame(self.reader, 1 << 30), 30)
        assert frame is not None, f"{method}: the agent closed the connection"
        answer: dict[str, Any] = json.loads(frame.message)
        return answer

    async def aclose(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


@contextlib.asynccontextmanager
async def small_agent(tmp_path: Path, buffer_limit: int = 8 * MiB) -> AsyncIterator[tuple[int, Path]]:
    """A fresh agent with a 32 MiB budget: (pid, state dir); stopped on the way out."""
    state = tmp_path / "state"
    url = f"local://?dir={state}&memory_budget={BUDGET}&buffer_limit={buffer_limit}&idle_timeout=0"
    async with rx.open_sandbox(url) as sb:
        pid = sb.info.pid
    try:
        yield pid, state
    finally:
        await anyio.to_thread.run_sync(stop_agent, state)  # the keeper too; waits until both are gone


@contextlib.asynccontextmanager
async def raw(state: Path) -> AsyncIterator[Raw]:
    r, w = await asyncio.open_unix_connection(os.fspath(state / STREAM_SOCKET), limit=1 << 30)
    conn = Raw(r, w)
    try:
        yield conn
    finally:
        await conn.aclose()


async def _start(conn: Raw, command: str, **params: Any) -> str:
    answer = await conn.call("exec_remote_start", {"command": command, **params})
    job_id: str = answer["result"]["job_id"]
    return job_id


def _bounded(adversary: Adversary, pid: int, baseline: int, area_case: tuple[str, str]) -> int:
    peak = adversary.agent_peak(pid) * 1024
    held = peak <= baseline + BUDGET + SLACK
    adversary.tried(*area_case, refused=held)
    assert held, f"agent peak RSS {peak / MiB:.0f} MiB, over {baseline / MiB:.0f} + {BUDGET / MiB:.0f} + slack"
    return peak


async def test_stdin_to_a_job_that_never_reads_is_back_pressured(tmp_path: Path, adversary: Adversary) -> None:
    """(a) 6 jobs that never read, 24 MiB each sent at them: what is taken stays in the budget."""
    async with small_agent(tmp_path) as (pid, state), raw(state) as conn:
        baseline = _status(pid, "VmRSS")
        jobs = [await _start(conn, "sleep 300", stdin_open=True) for _ in range(6)]
        taken = dict.fromkeys(jobs, 0)
        refused = dict.fromkeys(jobs, False)

        async def flood(job_id: str) -> None:
            async with raw(state) as c:
                for _ in range(24):  # 24 x 1 MiB; stop at the first write not taken whole
                    answer = await c.call("exec_remote_write_stdin", {"job_id": job_id}, b"x" * MiB)
                    taken[job_id] += answer["result"]["written"]
                    if answer["result"]["written"] < MiB:
                        refused[job_id] = True
                        return

        async with asyncio.TaskGroup() as tg:
            for job_id in jobs:
                tg.create_task(flood(job_id))
        total = sum(taken.values())
        adversary.tried(
            "agent memory", f"stdin: 144 MiB at 6 jobs that never read ({total} taken)", refused=all(refused.values())
        )
        assert all(refused.values()) and total <= BUDGET, taken
        listed = (await conn.call("exec_remote_list", {}))["result"]["jobs"]
        assert {j["job_id"]: j["stdin_bytes"] for j in listed} == taken  # the cursor says what was taken
        _bounded(adversary, pid, baseline, ("agent memory", "stdin flood: peak RSS"))


async def test_an_honest_big_stdin_write_still_arrives_whole(tmp_path: Path, adversary: Adversary) -> None:
    """(a) The client resends what the agent did not take: 64 MiB (twice the budget) arrive."""
    async with small_agent(tmp_path) as (pid, state):
        baseline = _status(pid, "VmRSS")
        async with rx.open_sandbox(f"local://?dir={state}") as sb:
            proc = sb.exec_remote(["wc", "-c"], rx.ExecRemoteOptions(stdin_open=True))
            await proc.write_stdin(b"y" * (64 * MiB))
            await proc.close_stdin()
            result = await proc.wait()
        assert result.stdout.strip() == str(64 * MiB)
        _bounded(adversary, pid, baseline, ("agent memory", "64 MiB stdin write: peak RSS"))


async def test_finished_jobs_output_is_on_disk_and_capped_with_exact_counts(
    tmp_path: Path, adversary: Adversary
) -> None:
    """(b) 12 finished jobs x 8 MiB (96 MiB, three budgets) used to be held in RAM; output is now
    on disk (#14): the agent's RSS stays flat, and a stream past its disk cap loses its head with
    an exact count, never silently."""
    cap = MiB
    async with small_agent(tmp_path) as (pid, state), raw(state) as conn:
        baseline = _status(pid, "VmRSS")
        jobs = [await _start(conn, "head -c 8388608 /dev/zero", output_cap=cap) for _ in range(11)]
        jobs.append(await _start(conn, "head -c 8388608 /dev/zero"))  # the default cap (1 GiB): all kept
        # Nobody polls them: wait for the process state in the job list instead, with a deadline.
        deadline = asyncio.get_running_loop().time() + 60
        while True:
            listed = (await conn.call("exec_remote_list", {}))["result"]["jobs"]
            if all(j["state"] != "running" for j in listed):
                break
            assert asyncio.get_running_loop().time() < deadline, listed
            await asyncio.sleep(0.1)
        assert [(j["exit_code"], j["stdout_bytes"]) for j in listed] == [(0, 8 * MiB)] * 12
        dropped, read = [], []
        for job_id in jobs:  # each job's output from 0: what is gone is counted, not hidden
            params = {"job_id": job_id, "stdout_offset": 0, "stderr_offset": 0, "max_bytes": MiB, "wait": 0}
            answer = (await conn.call("exec_remote_poll", params))["result"]
            dropped.append(answer["stdout_dropped"])
            read.append(answer["stdout_offset"] - answer["stdout_dropped"])
        # 8 MiB - 1 MiB is a whole number of 4 KiB blocks: exactly that much of the head is gone.
        assert dropped == [7 * MiB] * 11 + [0], dropped
        assert read == [MiB] * 12, read
        on_disk = sum(f.stat().st_blocks * 512 for f in (state / "jobs").glob("*/stdout"))
        assert on_disk <= 11 * cap + 8 * MiB + 12 * 4096, on_disk  # the punched heads are freed blocks
        adversary.tried("agent memory", "96 MiB of finished jobs' output: on disk, capped, counted", refused=True)
        peak = _bounded(adversary, pid, baseline, ("agent memory", "finished jobs' output: peak RSS"))
        flat = peak <= baseline + SLACK  # not even the budget: the bytes never pass through the agent
        adversary.tried(
            "agent memory", f"RSS flat with 96 MiB of output (+{(peak - baseline) // MiB} MiB)", refused=flat
        )
        assert flat, f"agent peak RSS {peak / MiB:.0f} MiB against {baseline / MiB:.0f} MiB before"


async def test_half_sent_requests_are_refused_and_the_agent_keeps_answering(
    tmp_path: Path, adversary: Adversary
) -> None:
    """(c) 8 connections each send 20 MiB of a payload (or a JSON line) and stall."""
    async with small_agent(tmp_path) as (pid, state):
        baseline = _status(pid, "VmRSS")
        sock = os.fspath(state / STREAM_SOCKET)
        conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        reads: list[asyncio.Future[bytes]] = []
        try:
            for i in range(8):
                r, w = await asyncio.open_unix_connection(sock)
                conns.append((r, w))
                head = b"\x00%d\n" % (20 * MiB + 10) if i % 2 == 0 else b'{"jsonrpc":"2.0","id":1,"params":{"x":"'
                with contextlib.suppress(ConnectionError):
                    w.write(head + b"a" * (20 * MiB))
                    await asyncio.wait_for(w.drain(), 10)
            async with raw(state) as probe:  # the agent still answers somebody else
                info = await probe.call("server_info", {})
                assert info["result"]["pid"] == pid
            # Refused ones got an error frame, then EOF; the one whose payload fit still waits.
            reads = [asyncio.ensure_future(r.read()) for r, _ in conns]
            finished, _ = await asyncio.wait(reads, timeout=5)
            # An error frame naming the budget, or a reset (the agent closed with our bytes unread).
            closed = sum(isinstance(t.exception(), ConnectionError) or b"memory budget" in t.result() for t in finished)
            assert len(finished) == len(conns) - 1  # the first payload fit: that one is still being read
        finally:
            for t in reads:
                t.cancel()
            for _, w in conns:
                w.close()
        adversary.tried("agent memory", f"8 x 20 MiB half-sent requests ({closed} refused)", refused=closed >= 6)
        assert closed >= 6
        _bounded(adversary, pid, baseline, ("agent memory", "half-sent requests: peak RSS"))


def _host_pid(container_id: str, pid_inside: int) -> int:
    """The host pid of a container's process (its NSpid ends with ``pid_inside``)."""
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError):
            nspid = next(x for x in status.read_text().splitlines() if x.startswith("NSpid:")).split()[1:]
            if (
                len(nspid) > 1
                and int(nspid[-1]) == pid_inside
                and container_id in (status.parent / "cgroup").read_text()
            ):
                return int(nspid[0])
    raise AssertionError(f"no host process for pid {pid_inside} of container {container_id[:12]}")


@pytest.mark.backend  # dockerd
async def test_agent_survives_an_output_flood_in_a_small_container(adversary: Adversary) -> None:
    """(d) docker+image with memory=256m: 24 jobs x 8 MiB of retained output (192 MiB) used to get
    the agent OOM-killed with every job: first in RAM, then (#14) as logs on the ``/tmp`` tmpfs,
    whose pages the memory cgroup charges too. The log budget (on a tmpfs, a quarter of the
    cgroup limit: 64 MiB) drops the oldest ended jobs' heads, each byte counted. (256m, not
    192m: the injected bundle's ~30 MiB on that same tmpfs, the keeper and the relay count too,
    and at 192m a loaded machine left too little room for the budget's one-sweep lag.)"""
    from ..sandboxes.backend_docker import docker_or_skip, image_or_skip
    from ..sandboxes.test_docker import docker_transport

    engine = docker_or_skip()
    nopy = image_or_skip(engine, "nopy")
    async with rx.open_sandbox(f"docker+image://{nopy}?pull=never&memory=256m") as sb:
        pid = sb.info.pid
        cid = engine.docker("inspect", "-f", "{{.Id}}", docker_transport(sb).container).stdout.decode().strip()
        host_pid = _host_pid(cid, pid)
        for _ in range(24):
            await sb.exec_remote(["head", "-c", str(8 * MiB), "/dev/zero"]).started()
        deadline = asyncio.get_running_loop().time() + 90
        jobs = await sb.jobs()
        while any(j.state == "running" for j in jobs):  # the process state, with a deadline
            assert asyncio.get_running_loop().time() < deadline, jobs
            await asyncio.sleep(0.2)
            jobs = await sb.jobs()
        peak = adversary.agent_peak(host_pid) * 1024
        info = await sb.server_info()
        survived = info.pid == pid and [(j.exit_code, j.stdout_bytes) for j in jobs] == [(0, 8 * MiB)] * 24
        adversary.tried(
            "agent memory", f"192 MiB output flood in a 256m container (peak {peak // MiB} MiB)", refused=survived
        )
        assert survived, jobs
        kept = dropped = 0
        for job in jobs:  # every byte is either still there or counted as dropped, never hidden
            got = await sb.read_output(job.job_id, offset=0, max_bytes=8 * MiB)
            assert got.offset == got.dropped and got.dropped + len(got.data) == 8 * MiB, (job.job_id, got.dropped)
            kept, dropped = kept + len(got.data), dropped + got.dropped
        # Within the budget (plus what the last, still running jobs wrote before the next check).
        assert kept <= 64 * MiB + 8 * MiB and dropped == 24 * 8 * MiB - kept, (kept, dropped)
        adversary.tried(
            "agent memory", f"logs on a tmpfs: {kept // MiB} MiB kept, {dropped // MiB} dropped", refused=True
        )
