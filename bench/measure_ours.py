"""Measurements of our engine (``remote_exec``) through its public async API.

Every function takes an open :class:`remote_exec.AsyncSandbox` and returns raw numbers; turning
them into table rows is the runner's job.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal, TypeVar

from benchlib import MB, proc_cpu, rss_mib, self_cpu

import remote_exec as rx

T = TypeVar("T")
ECHO = ["echo", "hi"]
TRAP_CMD = ["sh", "-c", "trap '' TERM; sleep 300 & echo ready; wait"]  # "ready": the trap is set
IDLE_CMD = ["sh", "-c", "echo ready; exec sleep 300"]  # one line, then idle: its watcher's first poll returns
STREAM_CMD = ["sh", "-c", "tr '\\0' a < /dev/zero"]  # endless output, as fast as the reader takes it


def relay_pid(sb: rx.AsyncSandbox) -> int | None:
    """PID of the ``stdio`` relay process of a ``channel=stdio`` sandbox (None for other channels)."""
    channel = sb._core.rpc.channel
    proc = getattr(channel, "process", None)
    return getattr(proc, "pid", None)


async def _drain(proc: rx.ExecRemoteProcess) -> None:
    async for _ in proc:
        pass


async def first_byte_once(sb: rx.AsyncSandbox) -> float:
    """Seconds from ``exec_remote(["echo", "hi"])`` to its first StdoutChunk (then drained)."""
    t0 = time.perf_counter()
    first: float | None = None
    async for ev in sb.exec_remote(ECHO):
        if first is None and isinstance(ev, rx.StdoutChunk):
            first = time.perf_counter() - t0
    if first is None:
        raise RuntimeError("echo hi produced no stdout chunk")
    return first


async def first_byte(sb: rx.AsyncSandbox, reps: int, warmup: int = 5) -> list[float]:
    """First-byte latencies in ms (after ``warmup`` unrecorded runs)."""
    for _ in range(warmup):
        await first_byte_once(sb)
    return [await first_byte_once(sb) * 1e3 for _ in range(reps)]


async def late_output(sb: rx.AsyncSandbox, reps: int, sleep: float) -> list[float]:
    """Seconds from ``exec_remote(sh -c "sleep S; echo x")`` to the chunk with ``x``."""
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        got: float | None = None
        async for ev in sb.exec_remote(["sh", "-c", f"sleep {sleep}; echo x"]):
            if got is None and isinstance(ev, rx.StdoutChunk):
                got = time.perf_counter() - t0
        if got is None:
            raise RuntimeError("late output never arrived")
        out.append(got)
    return out


async def run_true(sb: rx.AsyncSandbox, reps: int, warmup: int = 5) -> list[float]:
    """Round trips of ``await sb.run(["true"])`` in ms."""
    for _ in range(warmup):
        await sb.run(["true"])
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        res = await sb.run(["true"])
        out.append((time.perf_counter() - t0) * 1e3)
        if not res.success:
            raise RuntimeError(f"true failed: {res}")
    return out


async def throughput(sb: rx.AsyncSandbox, size_mb: int, encoding: Literal["utf-8", "base64"]) -> dict[str, Any]:
    """Stream ``size_mb`` MiB of 'a's through a job; MB/s of payload plus the CPU it cost."""
    cmd = ["sh", "-c", f"head -c {size_mb}M /dev/zero | tr '\\0' a"]
    pids = {"agent": sb.info.pid}
    relay = relay_pid(sb)
    if relay is not None:
        pids["relay"] = relay
    cpu0 = {k: proc_cpu(p) for k, p in pids.items()}
    client0 = self_cpu()
    t0 = time.perf_counter()
    n = chunks = 0
    async for ev in sb.exec_remote(cmd, encoding=encoding):
        if isinstance(ev, rx.StdoutChunk):
            n += len(ev.data)
            chunks += 1
    dt = time.perf_counter() - t0
    if n != size_mb * 1024 * 1024:
        raise RuntimeError(f"expected {size_mb} MiB, got {n} bytes")
    cpu = {f"{k}_cpu_s": round(proc_cpu(p) - cpu0[k], 3) for k, p in pids.items()}
    return {
        "mb_s": n / dt / MB,
        "seconds": round(dt, 3),
        "bytes": n,
        "chunks": chunks,
        "client_cpu_s": round(self_cpu() - client0, 3),
        **cpu,
    }


async def idle_cpu(sb: rx.AsyncSandbox, n: int, window: float, settle: float = 1.0) -> dict[str, Any]:
    """Watch ``n`` idle ``sleep`` jobs for ``window`` s; CPU as % of one core per job, per process."""
    procs = [sb.exec_remote(["sleep", "300"], kill_grace=1.0) for _ in range(n)]
    await asyncio.gather(*(p.started() for p in procs))
    watchers = [asyncio.create_task(_drain(p)) for p in procs]
    try:
        await asyncio.sleep(settle)  # every watcher is now parked in a long-poll
        pids = {"agent": sb.info.pid}
        relay = relay_pid(sb)
        if relay is not None:
            pids["relay"] = relay
        cpu0 = {k: proc_cpu(p) for k, p in pids.items()}
        client0 = self_cpu()
        t0 = time.perf_counter()
        await asyncio.sleep(window)
        elapsed = time.perf_counter() - t0
        used = {k: proc_cpu(p) - cpu0[k] for k, p in pids.items()}
        used["client"] = self_cpu() - client0
    finally:
        await _kill_all(procs, watchers)
    pct = {k: v / elapsed / n * 100 for k, v in used.items()}
    return {"pct_per_job": pct, "cpu_s": used, "window_s": elapsed, "jobs": n}


async def _kill_all(procs: list[rx.ExecRemoteProcess], watchers: list[asyncio.Task[None]]) -> float:
    t0 = time.perf_counter()
    await asyncio.gather(*(p.kill() for p in procs), return_exceptions=True)
    dt = time.perf_counter() - t0
    done, pending = await asyncio.wait(watchers, timeout=10) if watchers else (set(), set())
    for t in pending:
        t.cancel()
    for t in done:
        with contextlib.suppress(Exception, asyncio.CancelledError):
            t.result()
    return dt


def _group_gone(pgid: int | None) -> bool:
    if pgid is None:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


async def kill_latency(sb: rx.AsyncSandbox, grace: float, reps: int, trap: bool) -> dict[str, Any]:
    """Seconds ``proc.kill(grace)`` takes; with ``trap`` the job ignores SIGTERM (needs SIGKILL)."""
    times: list[float] = []
    gone: list[bool] = []
    for _ in range(reps):
        proc = sb.exec_remote(TRAP_CMD if trap else ["sleep", "300"])
        if trap:
            ev = await anext(proc)  # "ready": the trap is installed and the child started
            if not isinstance(ev, rx.StdoutChunk):
                raise RuntimeError(f"unexpected first event {ev!r}")
        else:
            await proc.started()
            await asyncio.sleep(0.05)
        t0 = time.perf_counter()
        await proc.kill(grace=grace)
        times.append(time.perf_counter() - t0)
        gone.append(_group_gone(proc.pid))
    return {"seconds": times, "group_gone_after_kill": all(gone)}


async def _poll_rtt(sb: rx.AsyncSandbox, job_id: str) -> float:
    """Seconds of one ``exec_remote_poll`` with ``wait=0`` on an idle job (a bare RPC round trip)."""
    from remote_exec.protocol import Method, PollParams, PollResult

    t0 = time.perf_counter()
    await sb._core.rpc.call(Method.EXEC_REMOTE_POLL, PollParams(job_id=job_id, wait=0), PollResult)
    return time.perf_counter() - t0


async def _bounded(aws: Sequence[Awaitable[Any]], limit: int) -> list[Any]:
    """Await ``aws`` with at most ``limit`` in flight; exceptions are returned, not raised."""
    sem = asyncio.Semaphore(limit)

    async def one(aw: Awaitable[Any]) -> Any:
        async with sem:
            return await aw

    return await asyncio.gather(*(one(a) for a in aws), return_exceptions=True)


async def _running_ids(sb: rx.AsyncSandbox) -> set[str]:
    return {j.job_id for j in await sb.jobs() if j.state == "running"}


async def _kill_ids(sb: rx.AsyncSandbox, job_ids: set[str], grace: float, limit: int) -> int:
    """Kill jobs by id with bare RPCs (no handle needed), retrying once; returns how many kills failed."""
    from remote_exec.protocol import KillParams, KillResult, Method

    rpc = sb._core.rpc
    left = list(job_ids)
    for _ in range(2):
        kills = [rpc.call(Method.EXEC_REMOTE_KILL, KillParams(job_id=j, grace=grace), KillResult) for j in left]
        got = await _bounded(kills, limit)
        left = [j for j, r in zip(left, got, strict=True) if isinstance(r, BaseException)]
    return len(left)


async def _until_ok(fn: Callable[[], Awaitable[T]], give_up: float) -> tuple[T | None, float, str | None]:
    """Call ``fn`` until it succeeds (or ``give_up`` s pass): its result, the seconds it took, the last error."""
    t0 = time.perf_counter()
    err: str | None = None
    while time.perf_counter() - t0 < give_up:
        try:
            return await fn(), time.perf_counter() - t0, err
        except rx.RemoteExecError as exc:
            err = f"{type(exc).__name__}: {exc}"
            await asyncio.sleep(0.2)
    return None, time.perf_counter() - t0, err


async def burst_start(sb: rx.AsyncSandbox, n: int, limit: int) -> dict[str, Any]:
    """``n`` exec_remote() calls at once (all start RPCs in flight together): who got started?

    Afterwards: how long until the sandbox answers again, and how many jobs the agent really
    started (a start whose response was lost still runs: without a handle it is an orphan).
    All of them are killed by id at the end.
    """
    before, _, _ = await _until_ok(lambda: _running_ids(sb), 30)
    t0 = time.perf_counter()
    procs = [sb.exec_remote(["sleep", "300"], kill_grace=1.0) for _ in range(n)]
    got = await asyncio.gather(*(p.started() for p in procs), return_exceptions=True)
    dt = time.perf_counter() - t0
    errors = [r for r in got if isinstance(r, BaseException)]
    for p in procs:
        p.detach()  # cleaned up by id below, including jobs whose start "failed" but ran
    res: dict[str, Any] = {"n": n, "seconds": dt, "failed": len(errors)}
    if errors:
        res["first_error"] = f"{type(errors[0]).__name__}: {errors[0]}"
    ran, res["recovered_after_s"], res["error_while_recovering"] = await _until_ok(lambda: sb.run(["true"]), 30)
    if ran is None:
        res["recovered_after_s"] = None
    now, _, _ = await _until_ok(lambda: _running_ids(sb), 30)
    extra = (now or set()) - (before or set())
    res["handles_ok"] = n - len(errors)
    res["running_in_agent"] = len(extra)
    res["orphans"] = max(0, len(extra) - res["handles_ok"])
    res["cleanup_kill_failures"] = await _kill_ids(sb, extra, 1.0, limit)
    return res


async def load(
    sb: rx.AsyncSandbox, n_idle: int, n_stream: int, window: float, limit: int, settle: float = 1.0
) -> dict[str, Any]:
    """``n_idle`` watched idle jobs + ``n_stream`` endless streams; latencies and throughput under load.

    Jobs are started, and their watchers launched, ``limit`` at a time (see :func:`burst_start`).
    Every job started here is killed at the end, orphans (a start that raised but ran) included.
    """
    agent = sb.info.pid
    res: dict[str, Any] = {"agent_rss_mib_before": rss_mib(agent), "n_idle": n_idle, "n_stream": n_stream}
    res["start_limit"] = limit
    res["start_failures"] = 0
    procs: list[rx.ExecRemoteProcess] = []
    watchers: list[asyncio.Task[None]] = []
    counts = [0] * n_stream

    async def count(i: int, proc: rx.ExecRemoteProcess) -> None:
        async for ev in proc:
            if isinstance(ev, rx.StdoutChunk):
                counts[i] += len(ev.data)

    async def watch(proc: rx.ExecRemoteProcess, connected: asyncio.Event) -> None:
        async for ev in proc:
            if isinstance(ev, rx.StdoutChunk):
                connected.set()  # its first poll was answered: it holds a connection of its own

    async def start(cmd: list[str], n: int, **opts: Any) -> list[rx.ExecRemoteProcess]:
        out: list[rx.ExecRemoteProcess] = []
        for k in range(0, n, limit):
            batch = [sb.exec_remote(cmd, **opts) for _ in range(min(limit, n - k))]
            procs.extend(batch)
            got = await asyncio.gather(*(p.started() for p in batch), return_exceptions=True)
            out += [p for p, r in zip(batch, got, strict=True) if not isinstance(r, BaseException)]
            res["start_failures"] += sum(isinstance(r, BaseException) for r in got)
        return out

    try:
        t0 = time.perf_counter()
        idle = await start(IDLE_CMD, n_idle, kill_grace=2.0)
        res["start_idle_s"] = time.perf_counter() - t0
        # Watchers join `limit` at a time, each batch once its polls were answered: a burst of
        # new connections overflows the agent's listen backlog (see burst_start).
        t0 = time.perf_counter()
        for k in range(0, len(idle), limit):
            flags = [asyncio.Event() for _ in idle[k : k + limit]]
            watchers.extend(asyncio.create_task(watch(p, f)) for p, f in zip(idle[k : k + limit], flags, strict=True))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*(f.wait() for f in flags)), 30)
        res["watchers_joined_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        streams = await start(STREAM_CMD, n_stream, kill_grace=2.0, output_limit=64 * 1024)
        res["start_stream_s"] = time.perf_counter() - t0
        watchers += [asyncio.create_task(count(i, p)) for i, p in enumerate(streams)]
        await asyncio.sleep(settle)  # let every watcher reach its steady state
        first_bytes: list[float] = []
        polls: list[float] = []
        bytes0, cpu0, t0 = sum(counts), proc_cpu(agent), time.perf_counter()
        while time.perf_counter() - t0 < window:
            first_bytes.append(await first_byte_once(sb))
            job_id = idle[len(polls) % len(idle)].job_id if idle else None
            if job_id is not None:
                polls.append(await _poll_rtt(sb, job_id))
        elapsed = time.perf_counter() - t0
        res.update(
            window_s=elapsed,
            stream_mb_s=(sum(counts) - bytes0) / elapsed / MB,
            per_stream_min_mb=min(counts) / MB if counts else 0,
            agent_cpu_pct=(proc_cpu(agent) - cpu0) / elapsed * 100,
            first_byte_ms=[x * 1e3 for x in first_bytes],
            poll_rtt_ms=[x * 1e3 for x in polls],
            agent_rss_mib_loaded=rss_mib(agent),
            agent_rss_mib_peak=rss_mib(agent, "VmHWM"),
            client_rss_mib=rss_mib(os.getpid()),
            watchers_failed=sum(1 for w in watchers if w.done() and not w.cancelled() and w.exception()),
        )
    finally:
        t0 = time.perf_counter()
        kills = await _bounded([p.kill() for p in procs if p.job_id is not None], limit)
        res["kill_all_s"] = time.perf_counter() - t0
        res["kill_failures"] = sum(isinstance(k, BaseException) for k in kills)
        await _kill_all([], watchers)
        left, _, _ = await _until_ok(lambda: _running_ids(sb), 30)  # jobs whose start "failed" but ran
        res["orphans_killed"] = len(left or ())
        await _kill_ids(sb, left or set(), 1.0, limit)
    res["agent_rss_mib_after"] = rss_mib(agent)
    return res
