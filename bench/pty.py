"""PTY jobs (#16): output throughput through a pseudo-terminal, beside a plain job, on ``local://``.

A tty job's output is read by the agent from the terminal's master and appended to the job's log
(a plain job writes its log file itself): this measures what that reader costs. Each run streams
``--mib`` MiB of ``a`` (no newlines, so the terminal's ``\\n`` -> ``\\r\\n`` adds nothing) to a
client reading it live, base64 (bytes) over the socket channel; the median of ``--reps`` runs,
with the agent's CPU seconds per run. ``bare_pty`` is the same stream through a bare
pseudo-terminal and a blocking Python reader (no agent): what the kernel's terminal layer allows.

    python bench/pty.py [--mib 200] [--reps 3] [--out bench/results/pty.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, uninstalled

import remote_exec as rx
from bench.benchlib import MB, code_info, machine_info, proc_cpu

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "pty.json"


def bare_pty(mib: int) -> float:
    """MB/s of the same stream through a bare pseudo-terminal read by a blocking loop (no
    agent, no disk, no client): the kernel's ceiling on this machine, measured in the same run."""
    master, slave = os.openpty()
    t0 = time.perf_counter()
    child = subprocess.Popen(["sh", "-c", f"head -c {mib}M /dev/zero | tr '\\0' a"], stdin=slave, stdout=slave)
    os.close(slave)
    n = 0
    while True:
        try:
            data = os.read(master, 1 << 20)
        except OSError:  # EIO: the writer is gone and everything was read
            break
        if not data:
            break
        n += len(data)
    dt = time.perf_counter() - t0
    child.wait()
    os.close(master)
    return n / dt / MB


async def one_run(sb: rx.AsyncSandbox, mib: int, tty: bool) -> dict[str, float]:
    cmd = ["sh", "-c", f"head -c {mib}M /dev/zero | tr '\\0' a"]
    cpu0 = proc_cpu(sb.info.pid)
    t0 = time.perf_counter()
    n = 0
    async for ev in sb.exec_remote(cmd, encoding="base64", tty=tty):
        if isinstance(ev, rx.StdoutChunk):
            n += len(ev.data)
    dt = time.perf_counter() - t0
    if n != mib * 1024 * 1024:
        raise RuntimeError(f"expected {mib} MiB, got {n} bytes")
    return {"mb_s": n / dt / MB, "seconds": dt, "agent_cpu_s": proc_cpu(sb.info.pid) - cpu0}


async def main(mib: int, reps: int) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        async with rx.open_sandbox(f"local://?dir={Path(tmp) / 'state'}") as sb:
            await one_run(sb, 8, True)  # warm up both paths
            await one_run(sb, 8, False)
            for kind in ("tty", "plain"):
                runs = [await one_run(sb, mib, kind == "tty") for _ in range(reps)]
                rows[kind] = {
                    "mb_s_median": round(statistics.median(r["mb_s"] for r in runs), 1),
                    "mb_s_all": [round(r["mb_s"], 1) for r in runs],
                    "agent_cpu_s_median": round(statistics.median(r["agent_cpu_s"] for r in runs), 3),
                }
            await sb.run(["true"])
            os.kill(sb.info.keeper_pid or sb.info.pid, 15)  # an explicit shutdown: the dir can go
    return {"mib": mib, "reps": reps, "results": rows, "machine": machine_info(), "code": code_info(HERE.parent)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=200)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    bare = [bare_pty(args.mib) for _ in range(args.reps)]  # blocking: before any event loop runs
    report = asyncio.run(main(args.mib, args.reps))
    report["results"]["bare_pty"] = {
        "mb_s_median": round(statistics.median(bare), 1),
        "mb_s_all": [round(b, 1) for b in bare],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["results"], indent=2))
