"""Durable jobs (#14): what output on disk costs and saves, on ``local://``.

- agent (and keeper) RSS with 10 / 1 000 / 5 000 idle jobs (``sleep``), each state dir fresh;
- agent RSS before and after a 5 GB unwatched output (it goes to a file: RSS must stay flat);
- stdout throughput through the on-disk path (200 MiB, text and base64, socket and stdio
  channels: ``measure_ours.throughput``, the same measurement as ``bench/run.py``) beside the
  numbers of the in-memory path in ``bench/results/latest.json``;
- first byte of ``echo hi`` (``measure_ours.first_byte``).

    python bench/durable.py [--quick] [--out bench/results/durable.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, uninstalled

import remote_exec as rx
from bench.benchlib import code_info, machine_info, raise_fd_limit, rss_mib
from bench.measure_ours import first_byte, throughput

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "durable.json"
BASELINE = HERE / "results" / "latest.json"  # the in-memory engine's numbers (main)


def start_agent(state: Path, max_running: int) -> None:
    """Start the agent (and its keeper) over ``state`` with room for ``max_running`` jobs."""
    argv = [sys.executable, "-m", "remote_exec.agent", "ensure", "--dir", str(state), "--max-running", str(max_running)]
    subprocess.run(argv, check=True, capture_output=True, timeout=60)


async def idle_rss(n: int) -> dict[str, Any]:
    """RSS of the agent and the keeper with ``n`` running ``sleep`` jobs (nobody watching)."""
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        start_agent(state, n + 100)
        async with rx.open_sandbox(f"local://?dir={state}") as sb:
            agent, keeper = sb.info.pid, sb.info.keeper_pid or 0
            base = rss_mib(agent)
            gate = asyncio.Semaphore(100)

            async def start() -> None:
                async with gate:
                    proc = sb.exec_remote(["sleep", "3600"])
                    await proc.started()
                    proc.detach()

            t0 = time.perf_counter()
            async with asyncio.TaskGroup() as tg:
                for _ in range(n):
                    tg.create_task(start())
            started = time.perf_counter() - t0
            listed = len(await sb.jobs())
            row = {
                "jobs": n,
                "listed": listed,
                "agent_rss_mib": round(rss_mib(agent), 1),
                "agent_rss_before_mib": round(base, 1),
                "keeper_rss_mib": round(rss_mib(keeper), 1),
                "start_s": round(started, 2),
            }
            t0 = time.perf_counter()
            await sb.server_info()  # one more round trip: the agent still answers at once
            row["rpc_ms_with_jobs"] = round((time.perf_counter() - t0) * 1e3, 2)
        signal_agent(agent)  # an explicit shutdown ends every job
        return row


def signal_agent(pid: int) -> None:
    """An explicit shutdown (SIGTERM): the agent ends its jobs, then the keeper leaves."""
    os.kill(pid, signal.SIGTERM)


async def unwatched_output(gb: float) -> dict[str, Any]:
    """Agent RSS before and after a job writes ``gb`` GB that nobody reads."""
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        async with rx.open_sandbox(f"local://?dir={state}") as sb:
            agent = sb.info.pid
            await sb.run(["true"])
            before = rss_mib(agent)
            size = int(gb * 1e9)
            proc = sb.exec_remote(["sh", "-c", f"head -c {size} /dev/zero"])
            await proc.started()
            job_id = proc.detach()
            t0 = time.perf_counter()
            peak = before
            while True:  # the agent's own state, asked for (a bench, not a test)
                peak = max(peak, rss_mib(agent))
                done = [j for j in await sb.jobs() if j.job_id == job_id and j.state != "running"]
                if done:
                    break
                await asyncio.sleep(0.2)
            seconds = time.perf_counter() - t0
            on_disk = (state / "jobs" / str(job_id) / "stdout").stat().st_size
            after = rss_mib(agent)
        signal_agent(agent)
        return {
            "bytes": size,
            "on_disk": on_disk,
            "agent_rss_before_mib": round(before, 1),
            "agent_rss_peak_mib": round(peak, 1),
            "agent_rss_after_mib": round(after, 1),
            "write_s": round(seconds, 1),
        }


def baseline() -> dict[str, float]:
    """Median MB/s per throughput row, and first-byte ms, from the in-memory engine's run."""
    try:
        data = json.loads(BASELINE.read_text())
    except (OSError, ValueError):
        return {}
    return {r["name"]: r["ours"]["median"] for r in data["results"] if r["bench"] in ("throughput", "first_byte")}


async def channel_rows(quick: bool) -> list[dict[str, Any]]:
    base = baseline()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        for channel in ("socket", "stdio"):
            async with rx.open_sandbox(f"local://?dir={state}&channel={channel}") as sb:
                fb = await first_byte(sb, 20 if quick else 200)
                name = f"first byte, echo hi [{channel}]"
                rows.append({"name": name, "unit": "ms", "median": statistics.median(fb), "main": base.get(name)})
                for enc in ("utf-8", "base64"):
                    runs = [await throughput(sb, 20 if quick else 200, enc) for _ in range(1 if quick else 3)]
                    name = f"stdout throughput, {enc} [{channel}]"
                    mbs = statistics.median(r["mb_s"] for r in runs)
                    main = base.get(name)
                    rows.append(
                        {
                            "name": name,
                            "unit": "MB/s",
                            "median": mbs,
                            "runs": [round(r["mb_s"], 1) for r in runs],
                            "main": main,
                            "vs_main": None if not main else round(mbs / main, 3),
                        }
                    )
            if channel == "stdio":
                signal_agent(sb.info.pid)  # after the close: nothing reconnects
    return rows


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    raise_fd_limit()
    t0 = time.time()
    sizes = [10, 100] if args.quick else [10, 1000, 5000]
    idle = []
    for n in sizes:
        idle.append(await idle_rss(n))
        print(f"idle {n}: {idle[-1]}", flush=True)
    out = []
    for gb in [0.05] if args.quick else [0.5, 5.0]:
        out.append(await unwatched_output(gb))
        print(f"unwatched {gb} GB: {out[-1]}", flush=True)
    channels = await channel_rows(args.quick)
    for row in channels:
        print(row, flush=True)
    result = {
        "machine": machine_info(),
        "code": code_info(HERE.parent),
        "quick": args.quick,
        "duration_s": round(time.time() - t0, 1),
        "idle_jobs": idle,
        "unwatched_output": out,
        "channels": channels,
        "baseline": {"file": str(BASELINE.relative_to(HERE.parent)), "commit": _baseline_commit()},
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


def _baseline_commit() -> str | None:
    try:
        return str(json.loads(BASELINE.read_text())["code"]["commit"])
    except (OSError, ValueError, KeyError):
        return None


if __name__ == "__main__":
    asyncio.run(main())
