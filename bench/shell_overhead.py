"""Per-run overhead of a shell session: ``sh.run("true")`` against ``exec_remote(["true"])``.

Both are timed end to end from the host (start RPC, the agent's work, polls until the result),
interleaved so drift hits both alike, over every channel kind of ``local://``. The target is at
most 2 ms extra per run for the shell (framing, sentinel scanning, the shell's own parsing).

    python bench/shell_overhead.py [--reps 500] [--out bench/results/shell_overhead.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
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

TARGET_MS = 2.0
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "shell_overhead.json"


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": statistics.median(ordered) * 1000,
        "p90_ms": ordered[int(0.9 * (len(ordered) - 1))] * 1000,
        "mean_ms": statistics.fmean(ordered) * 1000,
        "min_ms": ordered[0] * 1000,
        "n": len(ordered),
    }


async def measure(url: str, reps: int, warmup: int) -> dict[str, Any]:
    async with rx.open_sandbox(url) as sb, await sb.shell() as sh:
        shell: list[float] = []
        exec_: list[float] = []
        for i in range(warmup + reps):
            t0 = time.perf_counter()
            r1 = await sh.run("true")
            t1 = time.perf_counter()
            r2 = await sb.run(["true"])
            t2 = time.perf_counter()
            assert r1.success and r2.success
            if i >= warmup:
                shell.append(t1 - t0)
                exec_.append(t2 - t1)
    s, e = summary(shell), summary(exec_)
    return {"shell_run": s, "exec_remote": e, "extra_median_ms": s["median_ms"] - e["median_ms"]}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="rx-bench-") as tmp:
        for channel in args.channels:
            url = f"local://?dir={tmp}/agent&channel={channel}"
            results[channel] = await measure(url, args.reps, args.warmup)
        async with rx.open_sandbox(f"local://?dir={tmp}/agent") as sb:
            agent_pid = sb.info.pid
        os.kill(agent_pid, signal.SIGTERM)  # its state dir is about to go
    return results


def table(results: dict[str, Any]) -> str:
    lines = [
        f"{'channel':<8} {'what':<22} {'median ms':>10} {'p90 ms':>8} {'mean ms':>8} {'min ms':>7}",
    ]
    for channel, r in results.items():
        for label, key in (('sh.run("true")', "shell_run"), ('exec_remote(["true"])', "exec_remote")):
            s = r[key]
            lines.append(
                f"{channel:<8} {label:<22} {s['median_ms']:>10.3f} {s['p90_ms']:>8.3f} "
                f"{s['mean_ms']:>8.3f} {s['min_ms']:>7.3f}"
            )
        verdict = "ok" if r["extra_median_ms"] <= TARGET_MS else "OVER TARGET"
        extra = r["extra_median_ms"]
        lines.append(f"{channel:<8} {'extra (median)':<22} {extra:>10.3f}   target <= {TARGET_MS} ms: {verdict}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=500, help="timed runs of each kind per channel")
    p.add_argument("--warmup", type=int, default=50, help="untimed runs first")
    p.add_argument("--channels", nargs="+", default=["socket", "stdio"], choices=["socket", "stdio", "call"])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON results")
    args = p.parse_args()
    results = asyncio.run(main_async(args))
    print(table(results))
    report = {
        "bench": "shell_overhead",
        "target_extra_ms": TARGET_MS,
        "reps": args.reps,
        "machine": {
            "python": platform.python_version(),
            "kernel": platform.release(),
            "cpu_count": os.cpu_count(),
            "bash": subprocess.run(["bash", "--version"], capture_output=True, text=True).stdout.split("\n")[0],
        },
        "results": results,
        "ok": all(r["extra_median_ms"] <= TARGET_MS for r in results.values()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
