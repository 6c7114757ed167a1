"""Pushed streams (protocol 10): throughput, first byte and fan-out against a plain pipe.

    python bench/follow.py              # writes bench/results/follow.json
    python bench/follow.py --quick      # smaller streams, fewer runs

Measured in one run, alternating so that machine load falls on both sides alike:

- **throughput**: ``head -c N /dev/zero | base64 -w 0`` read to its end through ``local://``
  (socket and stdio channels; the handle follows, the agent pushes) against the same command
  read by a plain asyncio subprocess pipe (the physical limit of this machine for that command).
- **first byte**: ``echo hi`` from ``exec_remote`` to its first chunk, against spawning it with
  asyncio and reading its first byte; back to back, and after 0.2 s of quiet each (a notebook's
  next cell: what a person waits for).
- **fan-out**: the agent's CPU seconds while 1 and while 20 handles (20 views of one job) follow a
  job that writes N bytes; shared reads make 20 cost far less than 20 times one.
- **idle**: the agent's CPU over a quiet window with 20 followers of a silent job.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchlib import MB, machine_info, proc_cpu

import remote_exec as rx
from remote_exec.client.feed import JobFeed

HERE = Path(__file__).resolve().parent
PAUSE = 0.2  # seconds of quiet before each "after a pause" first byte


def _command(n: int) -> list[str]:
    return ["sh", "-c", f"head -c {n} /dev/zero | base64 -w 0"]


def _b64_len(n: int) -> int:
    return 4 * ((n + 2) // 3)


async def pipe_throughput(n: int) -> float:
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(*_command(n), stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    got = 0
    while chunk := await proc.stdout.read(1 << 20):
        got += len(chunk)
    await proc.wait()
    assert got == _b64_len(n), got
    return got / (time.perf_counter() - t0) / MB


async def file_throughput(n: int, where: str) -> float:
    """The same command with its stdout on a file in ``where`` (the agent's filesystem): what any
    design that keeps a job's output on disk (so that it outlives the agent) can reach at most."""
    with tempfile.NamedTemporaryFile(dir=where) as out:
        t0 = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(*_command(n), stdout=out)
        await proc.wait()
        took = time.perf_counter() - t0
        assert os.fstat(out.fileno()).st_size == _b64_len(n)
    return _b64_len(n) / took / MB


async def ours_throughput(sb: rx.AsyncSandbox, n: int) -> float:
    t0 = time.perf_counter()
    got = 0
    async for ev in sb.exec_remote(_command(n), encoding="base64"):
        if isinstance(ev, rx.StdoutChunk):
            got += len(ev.data)
    assert got == _b64_len(n), got
    return got / (time.perf_counter() - t0) / MB


async def pipe_first_byte() -> float:
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec("echo", "hi", stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    await proc.stdout.read(1)
    ms = (time.perf_counter() - t0) * 1e3
    await proc.wait()
    return ms


async def ours_first_byte(sb: rx.AsyncSandbox) -> float:
    t0 = time.perf_counter()
    first = None
    async for ev in sb.exec_remote(["echo", "hi"]):
        if first is None and isinstance(ev, rx.StdoutChunk):
            first = (time.perf_counter() - t0) * 1e3
    assert first is not None
    return first


async def _gated_job(sb: rx.AsyncSandbox, n: int) -> tuple[rx.ExecRemoteProcess, Path]:
    """A job that writes ``n`` bytes (base64) once its gate file exists: every reader can be
    following before the first byte."""
    gate = Path(tempfile.mkdtemp()) / "go"
    script = f"while [ ! -e {gate} ]; do sleep 0.01; done; head -c {n} /dev/zero | base64 -w 0"
    return await sb.exec_remote(["sh", "-c", script], encoding="base64").started(), gate


async def fan_out(url: str, followers: int, n: int) -> float:
    """Agent CPU seconds while ``followers`` handles (one connection each) read one job to its end."""
    sandboxes = [await rx.open_sandbox(url) for _ in range(followers)]
    try:
        agent = sandboxes[0].info.pid
        job, gate = await _gated_job(sandboxes[0], n)
        assert job.job_id is not None
        handles = [job, *[await sb.attach(job.job_id) for sb in sandboxes[1:]]]

        async def drain(h: rx.ExecRemoteProcess) -> int:
            return sum(len(ev.data) for ev in [e async for e in h] if isinstance(ev, rx.StdoutChunk))

        tasks = [asyncio.ensure_future(drain(h)) for h in handles]
        await asyncio.sleep(0.5)  # every handle is following (a quiet job): the gate opens for all at once
        before = proc_cpu(agent)
        gate.touch()
        sizes = await asyncio.gather(*tasks)
        used = proc_cpu(agent) - before
        assert sizes == [_b64_len(n)] * followers, sizes
        return used
    finally:
        for sb in sandboxes:
            await sb.aclose()


async def fan_out_views(url: str, views: int, n: int) -> float:
    """Agent CPU seconds while ``views`` views in one kernel (one connection: the cell's, the
    dashboard's, attach's) show one job to its end: they share its :class:`JobFeed`."""
    async with rx.open_sandbox(url) as sb:
        agent = sb.info.pid
        job, gate = await _gated_job(sb, n)
        assert job.job_id is not None
        handles = [job, *[await sb.attach(job.job_id) for _ in range(views - 1)]]
        seen = [0] * views

        def shown(i: int) -> Callable[[str, str], None]:
            def show(stream: str, text: str) -> None:
                seen[i] += len(text)

            return show

        feeds = [JobFeed.of(h) for h in handles]
        assert len({id(f) for f in feeds}) == 1  # one reader of the job on this connection
        for i, feed in enumerate(feeds):
            feed.subscribe(shown(i))
        await asyncio.sleep(0.5)  # following (a quiet job)
        before = proc_cpu(agent)
        gate.touch()
        await feeds[0].ended()
        used = proc_cpu(agent) - before
        assert seen == [_b64_len(n)] * views, seen
        return used


async def idle(url: str, followers: int, window: float) -> float:
    """Agent CPU % over ``window`` seconds with ``followers`` handles following a silent job."""
    async with rx.open_sandbox(url) as sb:
        job = await sb.exec_remote(["sleep", "600"]).started()
        assert job.job_id is not None
        handles = [job, *[await sb.attach(job.job_id) for _ in range(followers - 1)]]
        tasks = [asyncio.ensure_future(anext(aiter(h), None)) for h in handles]
        await asyncio.sleep(1.0)  # settled: every follow call is waiting
        before = proc_cpu(sb.info.pid)
        await asyncio.sleep(window)
        used = proc_cpu(sb.info.pid) - before
        await job.kill(0)
        for t in tasks:
            t.cancel()
        return 100 * used / window


async def measure(quick: bool) -> dict[str, Any]:
    n = (20 if quick else 150) * 1_000_000
    runs = 1 if quick else 5
    with tempfile.TemporaryDirectory() as state:
        results: dict[str, Any] = {"machine": machine_info(), "bytes": _b64_len(n), "runs": runs}
        for channel in ("socket", "stdio"):
            url = f"local://?dir={state}/agent&channel={channel}"
            async with rx.open_sandbox(url) as sb:
                ours, pipe, file = [], [], []
                await ours_throughput(sb, n // 10)  # warm
                for _ in range(runs):
                    ours.append(await ours_throughput(sb, n))
                    pipe.append(await pipe_throughput(n))
                    file.append(await file_throughput(n, state))
                results[f"throughput_{channel}"] = {"ours": ours, "pipe": pipe, "file": file}
                fb_ours, fb_pipe = [], []
                for _ in range(5 if quick else 30):
                    fb_ours.append(await ours_first_byte(sb))
                    fb_pipe.append(await pipe_first_byte())
                results[f"first_byte_{channel}"] = {"ours": fb_ours, "pipe": fb_pipe}
                # After a pause: a notebook's next cell, not a loop. Each start then found the
                # kernel's cgroup lock cold (15-25 ms, see agent/jobs/cgroup.py).
                fb_ours, fb_pipe = [], []
                for _ in range(3 if quick else 15):
                    await asyncio.sleep(PAUSE)
                    fb_ours.append(await ours_first_byte(sb))
                    await asyncio.sleep(PAUSE)
                    fb_pipe.append(await pipe_first_byte())
                results[f"first_byte_after_pause_{channel}"] = {"ours": fb_ours, "pipe": fb_pipe, "pause": PAUSE}
        url = f"local://?dir={state}/agent"
        fan = n // 3
        results["fan_out"] = {
            "bytes": _b64_len(fan),
            "one": [await fan_out(url, 1, fan) for _ in range(runs)],
            "twenty": [await fan_out(url, 20, fan) for _ in range(runs)],
            "twenty_views_one_kernel": [await fan_out_views(url, 20, fan) for _ in range(runs)],
        }
        results["idle_cpu_percent_20_followers"] = await idle(url, 20, 3.0 if quick else 10.0)
    return results


def report(results: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    med = statistics.median
    for channel in ("socket", "stdio"):
        t = results[f"throughput_{channel}"]
        f = results[f"first_byte_{channel}"]
        print(
            f"{channel}: throughput {med(t['ours']):.0f} MB/s vs pipe {med(t['pipe']):.0f} MB/s "
            f"({100 * med(t['ours']) / med(t['pipe']):.0f} %), vs the job writing a file alone "
            f"{med(t['file']):.0f} MB/s ({100 * med(t['ours']) / med(t['file']):.0f} %); "
            f"first byte {med(f['ours']):.2f} ms "
            f"vs spawn {med(f['pipe']):.2f} ms ({med(f['ours']) / med(f['pipe']):.2f}x)"
        )
        f = results.get(f"first_byte_after_pause_{channel}")
        if f is not None:
            print(
                f"{channel}: first byte after {f['pause']} s of quiet {med(f['ours']):.2f} ms "
                f"vs spawn {med(f['pipe']):.2f} ms ({med(f['ours']) / med(f['pipe']):.2f}x)"
            )
    fo = results["fan_out"]
    one, twenty, views = (med(fo[k]) for k in ("one", "twenty", "twenty_views_one_kernel"))
    print(
        f"fan-out: agent CPU {one:.3f} s for 1 follower, {twenty:.3f} s for 20 connections "
        f"({twenty / one:.1f}x), {views:.3f} s for 20 views in one kernel ({views / one:.1f}x); "
        f"idle with 20 followers: {results['idle_cpu_percent_20_followers']:.2f} % CPU"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "follow.json")
    args = parser.parse_args()
    report(asyncio.run(measure(args.quick)), args.out)
    sys.exit(0)
