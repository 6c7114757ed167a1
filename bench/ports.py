"""Port-forward throughput: a download through ``sb.forward_port()`` against the same one direct.

A ``python -m http.server`` in the sandbox serves a file of random bytes; the host downloads it
with aiohttp through the forward (byte-exact, checked by SHA-256) and, for ``local://`` where
the server is reachable directly too, without it. Median of ``--reps`` downloads per channel;
``jail://`` (no network at all, so no direct baseline) is measured when bubblewrap can run.

    python bench/ports.py [--mb 50] [--reps 3] [--out bench/results/ports.json]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, uninstalled

import aiohttp

import remote_exec as rx

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "ports.json"
MB = 1_000_000


async def download(url: str) -> tuple[float, str]:
    """Seconds to GET ``url`` to the end, and the body's SHA-256."""
    digest = hashlib.sha256()
    async with aiohttp.ClientSession() as session:
        t0 = time.perf_counter()
        async with session.get(url) as resp:
            resp.raise_for_status()
            async for chunk in resp.content.iter_chunked(1 << 20):
                digest.update(chunk)
        return time.perf_counter() - t0, digest.hexdigest()


async def server_port(proc: rx.ExecRemoteProcess) -> int:
    out = ""
    async for ev in proc:
        out += str(getattr(ev, "data", ""))
        if found := re.search(r"port (\d+)", out):
            return int(found.group(1))
    raise RuntimeError(f"http.server did not start: {out}")


async def measure(url: str, directory: str, size: int, expected: str, reps: int, direct: bool) -> dict[str, Any]:
    argv = [sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory", directory]
    async with rx.open_sandbox(url) as sb:
        server = sb.exec_remote(argv)
        port = await server_port(server)
        rows: dict[str, list[float]] = {"forward": [], "direct": []}
        async with sb.forward_port(port) as fwd:
            await download(f"{fwd}/blob")  # warm-up
            for _ in range(reps):
                seconds, digest = await download(f"{fwd}/blob")
                assert digest == expected, "the forwarded download is not byte-exact"
                rows["forward"].append(size / MB / seconds)
                if direct:
                    seconds, digest = await download(f"http://127.0.0.1:{port}/blob")
                    assert digest == expected
                    rows["direct"].append(size / MB / seconds)
        await server.kill(grace=0)
    return {
        kind: {"median_mb_s": statistics.median(v), "min_mb_s": min(v), "max_mb_s": max(v), "n": len(v)}
        for kind, v in rows.items()
        if v
    }


def jail_available() -> bool:
    import shutil

    return all(shutil.which(t) for t in ("bwrap", "nsenter", "setpriv")) and os.geteuid() == 0


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    size = args.mb * 1024 * 1024
    blob = os.urandom(size)
    expected = hashlib.sha256(blob).hexdigest()
    with tempfile.TemporaryDirectory(prefix="rx-bench-ports-") as tmp:
        (Path(tmp) / "www").mkdir()
        (Path(tmp) / "www" / "blob").write_bytes(blob)
        for channel in ("socket", "stdio"):
            url = f"local://?dir={tmp}/agent&channel={channel}"
            results[f"local ({channel})"] = await measure(url, f"{tmp}/www", size, expected, args.reps, True)
        async with rx.open_sandbox(f"local://?dir={tmp}/agent") as sb:
            agent_pid = sb.info.pid
        os.kill(agent_pid, signal.SIGTERM)  # its state dir is about to go
        if jail_available():
            url = f"jail://?work={tmp}/www"
            results["jail (stdio, no network)"] = await measure(url, "/workspace", size, expected, args.reps, False)
        else:
            results["jail (stdio, no network)"] = "skipped: bubblewrap (as root) is not available"
    return results


def table(results: dict[str, Any], mb: int) -> str:
    lines = [f"download of {mb} MiB, MB/s (median, min-max)"]
    for where, r in results.items():
        if isinstance(r, str):
            lines.append(f"  {where:<26} {r}")
            continue
        for kind, s in r.items():
            spread = f"({s['min_mb_s']:.1f}-{s['max_mb_s']:.1f}, n={s['n']})"
            lines.append(f"  {where:<26} {kind:<8} {s['median_mb_s']:>7.1f}  {spread}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=int, default=50, help="size of the downloaded file, MiB")
    p.add_argument("--reps", type=int, default=3, help="timed downloads per sandbox")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON results")
    args = p.parse_args()
    results = asyncio.run(main_async(args))
    print(table(results, args.mb))
    report = {
        "bench": "ports",
        "mib": args.mb,
        "reps": args.reps,
        "machine": {"python": platform.python_version(), "kernel": platform.release(), "cpu_count": os.cpu_count()},
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
