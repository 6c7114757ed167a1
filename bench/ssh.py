"""ssh:// benchmark: our persistent channel against plain SSH, measured in the same run.

    python bench/ssh.py                 # needs openssh-server (.ci/setup-ssh.sh) and asyncssh
    python bench/ssh.py --quick         # fewer repetitions, smaller streams
    python bench/ssh.py --out /tmp/ssh.json

Starts a private sshd on 127.0.0.1 (``tests/sandboxes/sshd.py``, fresh keys, host key checked)
and compares, per metric:

- **ours**: an ``ssh://`` sandbox: ONE SSH connection, ONE persistent ``stdio`` channel to the
  agent; a bare RPC is ``server_info``, an exec is ``run(["true"])``.
- **local stdio**: the same agent through the same ``stdio`` relay, spawned on this machine
  (``local://?channel=stdio``): what the ssh:// column costs beyond SSH itself.
- **asyncssh**: ``conn.run("true")`` on an already open asyncssh connection (a new session
  channel per command: the floor for "one command over SSH").
- **OpenSSH**: ``ssh host true`` with the OpenSSH client, a new connection per command (what a
  script calling ``ssh`` pays).

Rows: open/connect, RPC round trip, ``true`` round trip, first byte of ``echo hi``, and stdout
throughput of ``head -c N | tr``. Prints a table and writes ``bench/results/ssh.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import asyncssh
from benchlib import MB, Stat, machine_info, ours_first_byte, ours_throughput, timed

import remote_exec as rx

HERE = Path(__file__).resolve().parent
Cell = Stat | str | None


def _load_sshd() -> ModuleType:
    """tests/sandboxes/sshd.py by path: the same sshd the tests use, without importing pytest."""
    spec = importlib.util.spec_from_file_location("sshd", HERE.parent / "tests" / "sandboxes" / "sshd.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["sshd"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


# -- ours ---------------------------------------------------------------------------------------


# -- asyncssh, one open connection --------------------------------------------------------------


async def asyncssh_first_byte(conn: asyncssh.SSHClientConnection) -> float:
    t0 = time.perf_counter()
    proc: asyncssh.SSHClientProcess[bytes] = await conn.create_process("echo hi", encoding=None)
    assert await proc.stdout.read(1)
    first = time.perf_counter() - t0
    await proc.wait()
    return first * 1e3


async def asyncssh_throughput(conn: asyncssh.SSHClientConnection, mib: int) -> float:
    t0 = time.perf_counter()
    proc: asyncssh.SSHClientProcess[bytes] = await conn.create_process(
        f"head -c {mib}M /dev/zero | tr '\\0' a", encoding=None
    )
    n = 0
    while chunk := await proc.stdout.read(1 << 20):
        n += len(chunk)
    await proc.wait()
    assert n == mib << 20, n
    return n / (time.perf_counter() - t0) / MB


# -- OpenSSH client, new connection each time ---------------------------------------------------


async def openssh(argv: list[str], command: str, first_byte: bool = False) -> tuple[float, int]:
    """Run ``ssh ... command``; return (ms to the first stdout byte, or to the end; bytes read)."""
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *argv, command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    n = len(await proc.stdout.read(1))
    first = time.perf_counter() - t0
    while chunk := await proc.stdout.read(1 << 20):
        n += len(chunk)
    if await proc.wait() != 0:
        raise RuntimeError(f"{command!r} over OpenSSH failed")
    return (first if first_byte else time.perf_counter() - t0) * 1e3, n


async def openssh_throughput(argv: list[str], mib: int) -> float:
    t0 = time.perf_counter()
    _, n = await openssh(argv, f"head -c {mib}M /dev/zero | tr '\\0' a")
    assert n == mib << 20, n
    return n / (time.perf_counter() - t0) / MB


# -- the run ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    reps: int  # fast calls
    slow_reps: int  # OpenSSH calls (a new connection each)
    opens: int  # sandbox opens / connects
    mib: int  # throughput stream size
    tp_reps: int

    @classmethod
    def make(cls, quick: bool) -> Sizes:
        return cls(30, 5, 3, 20, 1) if quick else cls(200, 20, 10, 200, 3)


async def measure_ours(url: str, z: Sizes) -> dict[str, Stat]:
    """The four rows for one of our sandbox URLs."""

    async def open_close() -> None:
        async with rx.open_sandbox(url):
            pass

    out = {"open": await timed(open_close, z.opens, warmup=1)}
    async with rx.open_sandbox(url) as sb:
        out["rpc"] = await timed(sb.server_info, z.reps)
        out["true"] = await timed(lambda: sb.run(["true"]), z.reps)
        out["first"] = Stat.of([await ours_first_byte(sb) for _ in range(z.reps)])
        out["tp"] = Stat.of([await ours_throughput(sb, z.mib) for _ in range(z.tp_reps)])
    return out


async def measure_asyncssh(server: Any, z: Sizes) -> dict[str, Stat]:
    async def connect() -> asyncssh.SSHClientConnection:
        return await asyncssh.connect(
            server.host, server.port, username=server.user, known_hosts=str(server.known_hosts),
            client_keys=[str(server.client_key)], config=None,
        )  # fmt: skip

    async def connect_close() -> None:
        conn = await connect()
        conn.close()
        await conn.wait_closed()

    out = {"open": await timed(connect_close, z.opens, warmup=1)}
    conn = await connect()
    try:
        out["true"] = await timed(lambda: conn.run("true", check=True), z.reps)
        out["first"] = Stat.of([await asyncssh_first_byte(conn) for _ in range(z.reps)])
        out["tp"] = Stat.of([await asyncssh_throughput(conn, z.mib) for _ in range(z.tp_reps)])
    finally:
        conn.close()
        await conn.wait_closed()
    return out


async def measure_openssh(server: Any, z: Sizes) -> dict[str, Stat]:
    options = [f"UserKnownHostsFile={server.known_hosts}", "StrictHostKeyChecking=yes", "BatchMode=yes"]
    argv = ["ssh", "-p", str(server.port), "-i", str(server.client_key), "-F", "/dev/null"]
    argv += [arg for opt in [*options, "LogLevel=ERROR"] for arg in ("-o", opt)] + [f"{server.user}@{server.host}"]
    true = Stat.of([(await openssh(argv, "true"))[0] for _ in range(z.slow_reps)])
    return {
        "open": true,
        "true": true,
        "first": Stat.of([(await openssh(argv, "echo hi", first_byte=True))[0] for _ in range(z.slow_reps)]),
        "tp": Stat.of([await openssh_throughput(argv, z.mib) for _ in range(z.tp_reps)]),
    }


COLUMNS = {
    "ssh": "ours: ssh:// persistent channel",
    "local_stdio": "ours: local stdio (same relay, no SSH)",
    "asyncssh": "asyncssh, open connection",
    "openssh": "OpenSSH `ssh host cmd`, new connection",
}
METRICS = {
    "open": ("open sandbox / connect", "ms"),
    "rpc": ("RPC round trip (server_info)", "ms"),
    "true": ("exec `true` round trip", "ms"),
    "first": ("first byte of `echo hi`", "ms"),
    "tp": ("stdout throughput", "MB/s"),
}


async def measure(server: Any, quick: bool) -> list[dict[str, Any]]:
    z = Sizes.make(quick)
    results = {
        "ssh": await measure_ours(server.url(), z),
        # The very agent the ssh:// sandbox uses, through the same stdio relay, minus SSH.
        "local_stdio": await measure_ours(f"local://?dir={server.agent_dir}&channel=stdio", z),
        "asyncssh": await measure_asyncssh(server, z),
        "openssh": await measure_openssh(server, z),
    }
    rows = []
    for key, (metric, unit) in METRICS.items():
        name = f"{metric} ({z.mib} MiB)" if key == "tp" else metric
        rows.append({"metric": name, "unit": unit, **{col: results[col].get(key) for col in COLUMNS}})
    return rows


def fmt(cell: Cell) -> str:
    if cell is None:
        return "—"
    if isinstance(cell, str):
        return cell
    return f"{cell.median:.3g} (p90 {cell.p90:.3g}, n={cell.n})"


def table(rows: list[dict[str, Any]]) -> str:
    head = ["metric", "unit", *COLUMNS.values()]
    body = [[r["metric"], r["unit"], *(fmt(r[col]) for col in COLUMNS)] for r in rows]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in [head, *body]]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, smaller streams")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "ssh.json")
    args = parser.parse_args()
    sshd = _load_sshd()
    with tempfile.TemporaryDirectory(prefix="bench-ssh-") as tmp, sshd.running_sshd(Path(tmp)) as server:
        rows = asyncio.run(measure(server, args.quick))
    print(table(rows))
    notes = [
        "ours: `server_info` / `run(['true'])` over ONE ssh connection and ONE stdio channel",
        "local stdio: the same agent through the same `stdio` relay, spawned locally (no SSH)",
        "OpenSSH `open` and `true` rows are the same samples: `ssh host true` includes the connection",
        "columns run one after another; the machine's load moves numbers by ±30 %",
        "sshd on 127.0.0.1 with SetEnv SHLVL=1 (root's ~/.bashrc would add pyenv init to every command)",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "machine": machine_info(),
        "quick": args.quick,
        "versions": {"asyncssh": asyncssh.__version__},
        "rows": [{k: dataclasses.asdict(v) if isinstance(v, Stat) else v for k, v in r.items()} for r in rows],
        "notes": notes,
    }
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
