"""A 1 GiB file up and down through the stdio channel in bounded memory on every process.

The host, the channel's relay (``remote-exec-agent stdio``) and the agent server are separate
processes here, as in any remote sandbox. Each one's peak RSS is reset (``/proc/PID/clear_refs``)
before the transfer and read (``VmHWM``) after it; the content is checked by SHA-256 computed
on the host and, for the uploaded copy, inside the sandbox.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

import remote_exec as rx

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

GIB = 1 << 30
LIMIT_MIB = 200  # growth of peak RSS allowed per process


def peak_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def reset_peak(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(4 << 20):
            h.update(block)
    return h.hexdigest()


def sparse_file(path: Path, size: int) -> None:
    """``size`` bytes, mostly holes, with a random MiB every 64 MiB (fast to make and to read)."""
    with open(path, "wb") as f:
        f.truncate(size)
        for offset in range(0, size, 64 << 20):
            f.seek(offset)
            f.write(os.urandom(1 << 20))


async def test_one_gib_round_trip_in_bounded_memory(fresh_agent_dir: Path, tmp_path: Path) -> None:
    src, dst, back = tmp_path / "src.bin", tmp_path / "dst.bin", tmp_path / "back.bin"
    sparse_file(src, GIB)
    want = sha256_of(src)
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}&channel=stdio") as sb:
        await sb.server_info()
        relay = sb._core.rpc.channel.process  # type: ignore[attr-defined]
        pids = {"host": os.getpid(), "relay": relay.pid, "agent": sb.info.pid}
        assert len(set(pids.values())) == 3
        for pid in pids.values():
            reset_peak(pid)
        before = {k: rss_mib(p) for k, p in pids.items()}
        t0 = time.perf_counter()
        await sb.write_file_from(src, str(dst))
        t1 = time.perf_counter()
        await sb.read_file_to(str(dst), back)
        t2 = time.perf_counter()
        growth = {k: peak_mib(p) - before[k] for k, p in pids.items()}
        remote = (await sb.run(["sha256sum", str(dst)], timeout=120)).stdout.split()[0]
    assert remote == want and sha256_of(back) == want
    print(
        f"\n1 GiB up {GIB / (t1 - t0) / 1e6:.0f} MB/s, down {GIB / (t2 - t1) / 1e6:.0f} MB/s; "
        + ", ".join(f"{k} peak RSS {before[k]:.0f} -> {before[k] + g:.0f} MiB (+{g:.0f})" for k, g in growth.items())
    )
    for name, g in growth.items():
        assert g < LIMIT_MIB, f"{name} peak RSS grew by {g:.0f} MiB moving 1 GiB"
