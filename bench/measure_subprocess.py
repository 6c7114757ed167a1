"""The same measurements done with plain local subprocesses: the floor our engine is compared to.

``asyncio.create_subprocess_exec`` in this very process (no agent, no RPC), plus ``subprocess.run``
where a blocking call is the natural comparison.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from asyncio.subprocess import DEVNULL, PIPE
from typing import Any

from benchlib import MB, rss_mib, self_cpu

READ = 1 << 20


async def first_byte_once() -> float:
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec("echo", "hi", stdout=PIPE)
    assert proc.stdout is not None
    data = await proc.stdout.read(READ)
    dt = time.perf_counter() - t0
    if not data:
        raise RuntimeError("echo hi produced nothing")
    await proc.stdout.read()
    await proc.wait()
    return dt


async def first_byte(reps: int, warmup: int = 5) -> list[float]:
    for _ in range(warmup):
        await first_byte_once()
    return [await first_byte_once() * 1e3 for _ in range(reps)]


async def late_output(reps: int, sleep: float) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        proc = await asyncio.create_subprocess_exec("sh", "-c", f"sleep {sleep}; echo x", stdout=PIPE)
        assert proc.stdout is not None
        await proc.stdout.read(READ)
        out.append(time.perf_counter() - t0)
        await proc.wait()
    return out


async def run_true(reps: int, warmup: int = 5) -> dict[str, list[float]]:
    """ms per ``true``: with asyncio (create + wait) and with blocking ``subprocess.run``."""
    res: dict[str, list[float]] = {"asyncio": [], "subprocess.run": []}
    for i in range(warmup + reps):
        t0 = time.perf_counter()
        proc = await asyncio.create_subprocess_exec("true", stdout=PIPE, stderr=PIPE)
        await proc.communicate()
        t1 = time.perf_counter()
        subprocess.run(["true"], capture_output=True, check=True)  # noqa: ASYNC221 - the blocking baseline
        t2 = time.perf_counter()
        if i >= warmup:
            res["asyncio"].append((t1 - t0) * 1e3)
            res["subprocess.run"].append((t2 - t1) * 1e3)
    return res


async def throughput(size_mb: int) -> dict[str, Any]:
    """MB/s read by asyncio from the same pipeline, and the pipeline's own speed into /dev/null."""
    pipeline = f"head -c {size_mb}M /dev/zero | tr '\\0' a"
    c0 = self_cpu()
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec("sh", "-c", pipeline, stdout=PIPE)
    assert proc.stdout is not None
    n = 0
    while chunk := await proc.stdout.read(READ):
        n += len(chunk)
    await proc.wait()
    dt = time.perf_counter() - t0
    client_cpu = self_cpu() - c0
    if n != size_mb * 1024 * 1024:
        raise RuntimeError(f"expected {size_mb} MiB, got {n} bytes")
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec("sh", "-c", pipeline + " > /dev/null")
    await proc.wait()
    raw = time.perf_counter() - t0
    return {
        "mb_s": n / dt / MB,
        "seconds": round(dt, 3),
        "client_cpu_s": round(client_cpu, 3),
        "devnull_mb_s": n / raw / MB,
    }


async def _reader(proc: asyncio.subprocess.Process, counter: list[int] | None = None, i: int = 0) -> None:
    assert proc.stdout is not None
    while chunk := await proc.stdout.read(READ):
        if counter is not None:
            counter[i] += len(chunk)


async def _spawn_many(argv: list[str], n: int) -> list[asyncio.subprocess.Process]:
    return list(
        await asyncio.gather(
            *(
                asyncio.create_subprocess_exec(*argv, stdout=PIPE, stdin=DEVNULL, start_new_session=True)
                for _ in range(n)
            )
        )
    )


async def _kill_group(proc: asyncio.subprocess.Process, grace: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), grace)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers of a TERM-ignoring group


async def _stop(procs: list[asyncio.subprocess.Process], tasks: list[asyncio.Task[None]]) -> float:
    t0 = time.perf_counter()
    await asyncio.gather(*(_kill_group(p, 2.0) for p in procs))
    dt = time.perf_counter() - t0
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return dt


async def idle_cpu(n: int, window: float, settle: float = 1.0) -> dict[str, Any]:
    """This process's CPU while ``n`` idle ``sleep`` children are read by asyncio."""
    procs = await _spawn_many(["sleep", "300"], n)
    tasks = [asyncio.create_task(_reader(p)) for p in procs]
    try:
        await asyncio.sleep(settle)
        c0, t0 = self_cpu(), time.perf_counter()
        await asyncio.sleep(window)
        elapsed, used = time.perf_counter() - t0, self_cpu() - c0
    finally:
        await _stop(procs, tasks)
    return {"pct_per_job": {"client": used / elapsed / n * 100}, "cpu_s": {"client": used}, "window_s": elapsed}


async def kill_latency(grace: float, reps: int, trap: bool) -> list[float]:
    """SIGTERM the group, SIGKILL after ``grace`` if it lives on: the same algorithm as the agent's."""
    out = []
    for _ in range(reps):
        argv = ["sh", "-c", "trap '' TERM; sleep 300 & echo ready; wait"] if trap else ["sleep", "300"]
        proc = (await _spawn_many(argv, 1))[0]
        if trap:
            assert proc.stdout is not None
            await proc.stdout.readline()
        else:
            await asyncio.sleep(0.05)
        t0 = time.perf_counter()
        await _kill_group(proc, grace)
        out.append(time.perf_counter() - t0)
    return out


async def load(n_idle: int, n_stream: int, window: float, settle: float = 1.0) -> dict[str, Any]:
    """``n_idle`` sleeping children + ``n_stream`` endless streams, all read by this process."""
    res: dict[str, Any] = {"n_idle": n_idle, "n_stream": n_stream}
    counts = [0] * n_stream
    procs: list[asyncio.subprocess.Process] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        t0 = time.perf_counter()
        idle = await _spawn_many(["sleep", "300"], n_idle)
        procs += idle
        res["start_idle_s"] = time.perf_counter() - t0
        tasks += [asyncio.create_task(_reader(p)) for p in idle]
        t0 = time.perf_counter()
        streams = await _spawn_many(["sh", "-c", "tr '\\0' a < /dev/zero"], n_stream)
        procs += streams
        res["start_stream_s"] = time.perf_counter() - t0
        tasks += [asyncio.create_task(_reader(p, counts, i)) for i, p in enumerate(streams)]
        await asyncio.sleep(settle)
        first_bytes: list[float] = []
        bytes0, t0 = sum(counts), time.perf_counter()
        while time.perf_counter() - t0 < window:
            first_bytes.append(await first_byte_once() * 1e3)
        elapsed = time.perf_counter() - t0
        res.update(
            window_s=elapsed,
            stream_mb_s=(sum(counts) - bytes0) / elapsed / MB,
            first_byte_ms=first_bytes,
            client_rss_mib=rss_mib(os.getpid()),
        )
    finally:
        res["kill_all_s"] = await _stop(procs, tasks)
    return res
