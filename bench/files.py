"""File transfer benchmark: our file API against ``docker cp`` and ``scp``, in the same run.

    python bench/files.py            # needs docker.io + busybox-static and openssh-server
    python bench/files.py --quick    # a smaller file, one repetition
    python bench/files.py --mib 512  # another file size
    python bench/files.py --out /tmp/files.json

One file of random bytes (256 MiB by default) goes up and comes back down, each way timed
and checked by size, through:

- **docker://** (a private dockerd from ``tests/sandboxes/dockerd.py``, a container with the
  host's /usr and the injected agent): ``sb.write_file_from`` / ``sb.read_file_to``, which for
  a file this big take the engine's archive API (a staged write: ``docker cp -`` of a one-file
  tar stream into the agent's staging directory, then the agent's checked rename; a download:
  ``docker cp CONTAINER:PATH -``), against ``docker cp`` in and out of the same container's /tmp.
  ``--channel-only`` measures the persistent ``docker exec -i ... stdio`` channel instead.
- **ssh://** (a private sshd on 127.0.0.1 from ``tests/sandboxes/sshd.py``): the same calls
  over the SSH channel, against OpenSSH ``scp`` to and from the same machine.
- **local stdio**: the same calls through the agent's stdio relay on this machine (no
  container, no SSH): what the relay itself costs.

Target: ours ≥ 50 % of the native tool's MB/s, per direction. Our sandbox is opened once
(the agent's channel is persistent); each ``docker cp``/``scp`` is a new process (``scp``
includes its SSH handshake, ~0.1-0.2 s, as a user running it pays). Prints a table and writes
``bench/results/files.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from benchlib import MB, Stat, machine_info

import remote_exec as rx

HERE = Path(__file__).resolve().parent
TARGET = 0.5  # ours / native, per direction
CHANNEL_ONLY = False  # --channel-only: no docker cp for ours


def _load(name: str) -> ModuleType:
    """tests/sandboxes/<name>.py by path: the same engine/server the tests use, without pytest."""
    spec = importlib.util.spec_from_file_location(name, HERE.parent / "tests" / "sandboxes" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def make_file(path: Path, mib: int) -> None:
    with open(path, "wb") as f:
        for _ in range(mib):
            f.write(os.urandom(1 << 20))


def timed_run(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, capture_output=True, timeout=600)
    return time.perf_counter() - t0


async def ours(url: str, src: Path, remote: str, back: Path, reps: int) -> dict[str, Stat]:
    size = os.path.getsize(src)  # noqa: ASYNC240 (a bench: nothing else runs on this loop)
    up, down = [], []
    async with rx.open_sandbox(url) as sb:
        if CHANNEL_ONLY:
            sb.transport.native_copy = lambda: None  # type: ignore[method-assign]
        await sb.write_file_from(src, remote)  # warm-up (page cache, agent, channel)
        # All uploads, then all downloads: the same order as the native tools' runs below (a
        # download's 256 MiB of dirty pages would otherwise be written back during the next upload).
        for _ in range(reps):
            t0 = time.perf_counter()
            info = await sb.write_file_from(src, remote)
            up.append(size / (time.perf_counter() - t0) / MB)
            assert info.size == size
        for _ in range(reps):
            back.unlink(missing_ok=True)  # noqa: ASYNC240 (as before each native download below)
            t0 = time.perf_counter()
            got = await sb.read_file_to(remote, back)
            down.append(size / (time.perf_counter() - t0) / MB)
            assert got.size == size
        await sb.remove(remote)
    return {"up": Stat.of(up), "down": Stat.of(down)}


def native(put: list[str], get: list[str], size: int, back: Path, reps: int) -> dict[str, Stat]:
    timed_run(put)  # warm-up
    up = [size / timed_run(put) / MB for _ in range(reps)]
    down = []
    for _ in range(reps):
        back.unlink(missing_ok=True)
        down.append(size / timed_run(get) / MB)
        assert back.stat().st_size == size
    return {"up": Stat.of(up), "down": Stat.of(down)}


def measure(mib: int, reps: int, tmp: Path) -> list[dict[str, Any]]:
    src, back = tmp / "payload.bin", tmp / "back.bin"
    make_file(src, mib)
    size = src.stat().st_size
    results: dict[str, dict[str, Stat] | str] = {}

    dockerd = _load("dockerd")
    try:
        engine = dockerd.shared_dockerd()
        container = engine.run("rx-bench-files", dockerd.usr_image(engine), "-v", "/usr:/usr:ro")
    except dockerd.DockerUnavailable as exc:
        results["docker"] = results["docker_cp"] = f"skipped: {exc}"
    else:
        try:
            results["docker"] = asyncio.run(ours(f"docker://{container}", src, "/tmp/payload.bin", back, reps))
            results["docker_cp"] = native(
                ["docker", "cp", str(src), f"{container}:/tmp/payload.bin"],
                ["docker", "cp", f"{container}:/tmp/payload.bin", str(back)],
                size,
                back,
                reps,
            )
        finally:
            engine.docker("rm", "-f", container, check=False)

    sshd = _load("sshd")
    try:
        with sshd.running_sshd(tmp / "sshd") as server:
            results["ssh"] = asyncio.run(ours(server.url(), src, str(tmp / "remote-ssh.bin"), back, reps))
            options = [f"UserKnownHostsFile={server.known_hosts}", "StrictHostKeyChecking=yes", "BatchMode=yes"]
            scp = ["scp", "-O", "-q", "-P", str(server.port), "-i", str(server.client_key), "-F", "/dev/null"]
            scp += [arg for opt in [*options, "LogLevel=ERROR"] for arg in ("-o", opt)]
            remote = f"{server.user}@{server.host}:{tmp / 'remote-scp.bin'}"
            results["scp"] = native([*scp, str(src), remote], [*scp, remote, str(back)], size, back, reps)
            url = f"local://?dir={server.agent_dir}&channel=stdio"
            results["local_stdio"] = asyncio.run(ours(url, src, str(tmp / "remote-local.bin"), back, reps))
    except sshd.SSHServerUnavailable as exc:
        results["ssh"] = results["scp"] = results["local_stdio"] = f"skipped: {exc}"

    rows = []
    for direction, label in (("up", "upload"), ("down", "download")):
        row: dict[str, Any] = {"metric": f"{label} {mib} MiB", "unit": "MB/s"}
        for col in COLUMNS:
            cell = results[col]
            row[col] = cell[direction] if isinstance(cell, dict) else cell
        for ours_col, native_col in (("docker", "docker_cp"), ("ssh", "scp")):
            a, b = row[ours_col], row[native_col]
            if isinstance(a, Stat) and isinstance(b, Stat):
                row[f"{ours_col}_ratio"] = round(a.median / b.median, 3)
        ratios = [row[k] for k in ("docker_ratio", "ssh_ratio") if k in row]
        row["target"] = f"ours >= {TARGET:.0%} of docker cp / scp"
        row["met"] = bool(ratios) and all(r >= TARGET for r in ratios)
        rows.append(row)
    return rows


COLUMNS = {
    "docker": "ours: docker://",
    "docker_cp": "docker cp",
    "ssh": "ours: ssh://",
    "scp": "scp (OpenSSH)",
    "local_stdio": "ours: local stdio",
}


def fmt(cell: Stat | str | None) -> str:
    if cell is None:
        return "—"
    if isinstance(cell, str):
        return cell
    return f"{cell.median:.0f} (min {cell.min:.0f}, max {cell.max:.0f}, n={cell.n})"


def table(rows: list[dict[str, Any]]) -> str:
    head = ["metric", "unit", *COLUMNS.values(), "ours/docker cp", "ours/scp", "target"]
    body = [
        [
            r["metric"],
            r["unit"],
            *(fmt(r[c]) for c in COLUMNS),
            f"{r['docker_ratio']:.0%}" if "docker_ratio" in r else "—",
            f"{r['ssh_ratio']:.0%}" if "ssh_ratio" in r else "—",
            "met" if r["met"] else "MISSED",
        ]
        for r in rows
    ]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in [head, *body]]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 32 MiB file, one repetition")
    parser.add_argument("--mib", type=int, help="file size in MiB (default 256, --quick 32)")
    parser.add_argument("--reps", type=int, help="repetitions per direction (default 3, --quick 1)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "files.json")
    parser.add_argument("--channel-only", action="store_true", help="ours without the engine's archive API")
    args = parser.parse_args()
    global CHANNEL_ONLY
    CHANNEL_ONLY = channel_only = args.channel_only
    mib = args.mib or (32 if args.quick else 256)
    reps = args.reps or (1 if args.quick else 3)
    with tempfile.TemporaryDirectory(prefix="bench-files-") as tmp:
        rows = measure(mib, reps, Path(tmp))
    print(table(rows))
    notes = [
        "MB/s = 10^6 bytes/s of a file of random bytes; median of the repetitions after one warm-up",
        "ours: write_file_from / read_file_to on an open sandbox, atomic (temp file or staging dir + rename) with "
        "mode and mtime kept; docker: the engine's archive API (docker cp with tar streams, staged and checked by "
        "the agent) for files >= 16 MiB"
        + (" (disabled: --channel-only)" if channel_only else "")
        + "; ssh and local: 4 MiB chunks as frame payloads, 4 in flight",
        "docker cp / scp: a new process per copy (scp includes its SSH handshake); scp -O (the classic scp "
        "protocol: the test sshd has no sftp subsystem)",
        "private dockerd (data-root in /tmp), sshd on 127.0.0.1; all on one 2-core machine, run one after another; "
        "the machine's load moves numbers by ±30 %",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "machine": machine_info(),
        "quick": args.quick,
        "channel_only": channel_only,
        "mib": mib,
        "reps": reps,
        "rows": [{k: dataclasses.asdict(v) if isinstance(v, Stat) else v for k, v in r.items()} for r in rows],
        "notes": notes,
    }
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
