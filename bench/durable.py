"""Durable jobs (#14): what output on disk costs and saves, on ``local://``.

- agent (and keeper) RSS with 10 / 1 000 / 5 000 idle jobs (``sleep``), each state dir fresh;
- agent RSS before and after a 5 GB unwatched output (it goes to a file: RSS must stay flat);
- stdout throughput through the on-disk path (200 MiB, text and base64, socket and stdio
  channels: ``measure_ours.throughput``, the same measurement as ``bench/run.py``) beside the
  numbers of the in-memory path in ``bench/results/latest.json``;
- first byte of ``echo hi`` (``measure_ours.first_byte``).

With ``--baseline REF`` the throughput and first-byte rows are also measured, in the same run and
on the same machine, for the engine of git ref ``REF`` (e.g. ``main``, the in-memory path): its
sources are exported to a temporary directory and run (agent included) through ``PYTHONPATH``.

    python bench/durable.py [--quick] [--baseline main] [--out bench/results/durable.json]
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

# Run from a checkout, uninstalled; or, for the baseline, from another engine's sources.
sys.path.insert(0, os.environ.get("REMOTE_EXEC_BENCH_SRC") or str(Path(__file__).resolve().parent.parent))

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
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
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
        stop(sb.info)  # an explicit shutdown ends every job
        return row


def stop(info: rx.ServerInfo) -> None:
    """An explicit shutdown (SIGTERM to the keeper, passed on to the agent, which ends its jobs),
    waited for, so the state dir can go."""
    pids = [p for p in (getattr(info, "keeper_pid", None), info.pid) if p]  # the baseline has no keeper
    os.kill(pids[0], signal.SIGTERM)
    deadline = time.monotonic() + 120
    while any(Path(f"/proc/{p}").exists() for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


async def unwatched_output(gb: float) -> dict[str, Any]:
    """Agent RSS before and after a job writes ``gb`` GB that nobody reads."""
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
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
        stop(sb.info)
        return {
            "bytes": size,
            "on_disk": on_disk,
            "agent_rss_before_mib": round(before, 1),
            "agent_rss_peak_mib": round(peak, 1),
            "agent_rss_after_mib": round(after, 1),
            "write_s": round(seconds, 1),
        }


def measure_baseline(ref: str, quick: bool) -> tuple[str, list[dict[str, Any]]]:
    """The channel rows of the engine at git ``ref``, measured now in a child process."""
    root = HERE.parent
    commit = subprocess.run(["git", "rev-parse", ref], cwd=root, capture_output=True, text=True, check=True)
    with tempfile.TemporaryDirectory() as src:
        archive = subprocess.run(["git", "archive", ref, "remote_exec"], cwd=root, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", src], input=archive.stdout, check=True)
        out = Path(src) / "rows.json"
        env = {**os.environ, "PYTHONPATH": src, "REMOTE_EXEC_BENCH_SRC": src}
        argv = [sys.executable, __file__, "--channels-only", "--out", str(out)] + (["--quick"] if quick else [])
        subprocess.run(argv, env=env, cwd=src, check=True)  # cwd: ``python -m`` puts it first on sys.path
        return commit.stdout.strip(), json.loads(out.read_text())


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
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
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
                stop(sb.info)  # after the close: nothing reconnects
    return rows


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--baseline", metavar="REF", help="also measure the channel rows of git REF's engine")
    ap.add_argument("--channels-only", action="store_true", help=argparse.SUPPRESS)  # the baseline's child
    args = ap.parse_args()
    raise_fd_limit()
    if args.channels_only:
        args.out.write_text(json.dumps(await channel_rows(args.quick)))
        return
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
    same_run: dict[str, Any] = {}
    if args.baseline:
        commit, rows = measure_baseline(args.baseline, args.quick)
        same_run = {"ref": args.baseline, "commit": commit, "rows": rows}
        theirs = {r["name"]: r["median"] for r in rows}
        for row in channels:
            row["same_run_baseline"] = theirs.get(row["name"])
            if row["unit"] == "MB/s" and theirs.get(row["name"]):
                row["vs_same_run_baseline"] = round(row["median"] / theirs[row["name"]], 3)
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
        "same_run_baseline": same_run,
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
