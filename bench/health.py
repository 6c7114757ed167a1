"""Cost of liveness and metrics: the agent's and client's CPU with 100 idle jobs.

Three phases of ``--seconds`` each over ``local://`` (socket channel), the agent's CPU time read
from ``/proc/<pid>/stat`` and the client's from ``os.times()``:

1. nobody watches: a sandbox open (its heartbeat on), 100 jobs sleeping, no poll, no stats;
2. the same with the heartbeat off (the difference is the heartbeat's cost);
3. a dashboard: ``job_stats`` of all 100 jobs and ``stats()`` once a second;
4. the same dashboard with one ``job_stats_many`` call instead of 100 ``job_stats``;
5. nobody watches, each job with a policy (``on_disconnect="kill"``, an idle timeout): the cost
   of the agent's policy checks;
6. as 5, with a ``memory_limit`` too (one ``/proc`` walk per check for all the jobs).

Targets (issue #17): < 0.1 % of a core when nobody watches, < 1 % with the dashboard.

    python bench/health.py [--jobs 100] [--seconds 20] [--out bench/results/health.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, uninstalled

import remote_exec as rx

TICK = os.sysconf("SC_CLK_TCK")


def cpu_of(pid: int) -> float:
    raw = Path(f"/proc/{pid}/stat").read_bytes()
    f = raw[raw.rfind(b")") + 2 :].split()
    return (int(f[11]) + int(f[12])) / TICK


def own_cpu() -> float:
    t = os.times()
    return t.user + t.system


async def phase(
    url: str, jobs: int, seconds: float, liveness: float, watch: str = "", policy: rx.JobPolicy | None = None
) -> dict[str, float]:
    # A small workspace: ``stats()`` counts its disk use (every 30 s), and the agent's own
    # working directory (a checkout with its .venv) would make that walk the cost measured.
    async with rx.open_sandbox(
        url, liveness=liveness, workspace_root=str(Path(url[len("local://?dir=") :]).parent)
    ) as sb:
        procs = [sb.exec_remote(["sleep", "3600"], policy=policy) for _ in range(jobs)]
        for p in procs:
            await p.started()
        agent = sb.info.pid
        await asyncio.sleep(1.0)  # starts settle
        a0, c0, t0 = cpu_of(agent), own_cpu(), time.monotonic()
        while time.monotonic() - t0 < seconds:
            if watch == "each":
                await asyncio.gather(*(sb.job_stats(p.job_id or "") for p in procs), sb.stats())
            elif watch == "many":
                await asyncio.gather(sb.job_stats_many([p.job_id or "" for p in procs]), sb.stats())
            await asyncio.sleep(1.0)
        wall = time.monotonic() - t0
        agent_pct = (cpu_of(agent) - a0) / wall * 100
        client_pct = (own_cpu() - c0) / wall * 100
        for p in procs:
            await p.kill(grace=0)
    return {"agent_percent": round(agent_pct, 4), "client_percent": round(client_pct, 4), "seconds": round(wall, 1)}


IDLE = rx.JobPolicy(on_disconnect="kill", disconnect_grace=3600, idle_timeout=3600)
LIMITED = IDLE.model_copy(update={"memory_limit": 1 << 30})


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--out", default="bench/results/health.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"local://?dir={tmp}/state"
        results = {
            "idle, heartbeat on": await phase(url, args.jobs, args.seconds, 8.0),
            "idle, heartbeat off": await phase(url, args.jobs, args.seconds, 0),
            "dashboard (job_stats x jobs + stats, 1 Hz)": await phase(url, args.jobs, args.seconds, 8.0, "each"),
            "dashboard (job_stats_many + stats, 1 Hz)": await phase(url, args.jobs, args.seconds, 8.0, "many"),
            "idle, policy (on_disconnect kill, idle timeout)": await phase(url, args.jobs, args.seconds, 8.0, "", IDLE),
            "idle, policy with memory_limit": await phase(url, args.jobs, args.seconds, 8.0, "", LIMITED),
        }
    for name, r in results.items():
        print(f"{name:<50} agent {r['agent_percent']:.3f} %  client {r['client_percent']:.3f} % of a core")
    save(Path(args.out), {"jobs": args.jobs, "results": results})


def save(out: Path, data: object) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
