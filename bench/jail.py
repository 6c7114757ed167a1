"""jail:// benchmark: our persistent channel into a bubblewrap box against bare ``nsenter``.

    python bench/jail.py                # needs bubblewrap (.ci/setup-jail.sh); run as root
    python bench/jail.py --quick        # fewer repetitions, smaller streams
    python bench/jail.py --out /tmp/jail.json

Per metric, measured in the same run and in the same box:

- **ours**: a ``jail://`` sandbox: ONE persistent ``nsenter ... remote_exec.agent stdio``
  channel; a bare RPC is ``server_info``, an exec is ``run(["true"])``.
- **bare nsenter**: ``nsenter -a -t INIT ... CMD`` per command with the same env and capability
  cleaning (:func:`remote_exec.sandboxes.jailbox.exec_argv`): what a ``docker exec``-style
  transport without an agent pays per command.

Rows: open (box + agent vs box alone), RPC round trip, ``true`` round trip, first byte of
``echo hi``, stdout throughput of ``head -c N | tr``. Prints a table and writes
``bench/results/jail.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import MB, Stat, machine_info, ours_first_byte, ours_throughput, timed

import remote_exec as rx
from remote_exec.sandboxes.jail import JailTransport
from remote_exec.sandboxes.jailbox import JailBox, JailConfig, exec_argv

HERE = Path(__file__).resolve().parent
Cell = Stat | str | None
STREAM = "head -c {mib}M /dev/zero | tr '\\0' a"


# -- ours ---------------------------------------------------------------------------------------


# -- bare nsenter, one process per command -------------------------------------------------------


async def nsenter(pid: int, argv: list[str], first_byte: bool = False) -> tuple[float, int]:
    """Run ``argv`` in the box with nsenter; (ms to the first stdout byte, or to the end; bytes)."""
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *exec_argv(pid, argv), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    n = len(await proc.stdout.read(1))
    first = time.perf_counter() - t0
    while chunk := await proc.stdout.read(1 << 20):
        n += len(chunk)
    if await proc.wait() != 0:
        raise RuntimeError(f"{argv!r} through nsenter failed")
    return (first if first_byte else time.perf_counter() - t0) * 1e3, n


async def nsenter_throughput(pid: int, mib: int) -> float:
    t0 = time.perf_counter()
    _, n = await nsenter(pid, ["sh", "-c", STREAM.format(mib=mib)])
    assert n == mib << 20, n
    return n / (time.perf_counter() - t0) / MB


# -- the run ------------------------------------------------------------------------------------


async def measure(work: Path, quick: bool) -> list[dict[str, Any]]:
    reps, opens, mib, tp_reps = (30, 3, 20, 1) if quick else (200, 10, 200, 3)
    rows: list[dict[str, Any]] = []

    def row(metric: str, unit: str, ours: Cell, bare: Cell) -> None:
        rows.append({"metric": metric, "unit": unit, "ours": ours, "nsenter": bare})

    async def open_close() -> None:
        async with rx.open_sandbox(f"jail://?work={work}"):
            pass

    async def box_alone() -> None:
        box = JailBox.launch(JailConfig(work))
        await asyncio.to_thread(box.wait_ready)
        await asyncio.to_thread(box.kill)

    row("open: box + agent / box alone", "ms", await timed(open_close, opens, 1), await timed(box_alone, opens, 1))
    async with rx.open_sandbox(f"jail://?work={work}") as sb:
        assert isinstance(sb.transport, JailTransport) and sb.transport.pid is not None
        pid = sb.transport.pid

        async def bare_true() -> None:
            await nsenter(pid, ["true"])

        row("RPC round trip (server_info)", "ms", await timed(sb.server_info, reps), None)
        row("exec `true` round trip", "ms", await timed(lambda: sb.run(["true"]), reps), await timed(bare_true, reps))
        row(
            "first byte of `echo hi`",
            "ms",
            Stat.of([await ours_first_byte(sb) for _ in range(reps)]),
            Stat.of([(await nsenter(pid, ["echo", "hi"], first_byte=True))[0] for _ in range(reps)]),
        )
        row(
            f"stdout throughput ({mib} MiB)",
            "MB/s",
            Stat.of([await ours_throughput(sb, mib) for _ in range(tp_reps)]),
            Stat.of([await nsenter_throughput(pid, mib) for _ in range(tp_reps)]),
        )
    return rows


def fmt(cell: Cell) -> str:
    if cell is None:
        return "—"
    if isinstance(cell, str):
        return cell
    return f"{cell.median:.3g} (p90 {cell.p90:.3g}, n={cell.n})"


def table(rows: list[dict[str, Any]]) -> str:
    head = ["metric", "unit", "ours: jail:// persistent channel", "bare nsenter per command"]
    body = [[r["metric"], r["unit"], fmt(r["ours"]), fmt(r["nsenter"])] for r in rows]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in [head, *body]]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, smaller streams")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "jail.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-jail-") as tmp:
        rows = asyncio.run(measure(Path(tmp) / "work", args.quick))  # made by jail://, for its uid
    print(table(rows))
    bwrap = subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip()
    notes = [
        "ours: median over ONE stdio channel (nsenter into the box, then the agent's stdio relay)",
        "bare nsenter: nsenter + setpriv (caps dropped) + env -i per command, as jail:// runs its own execs",
        "open: `async with open_sandbox('jail://')` (box, agent cold start, channel, close) vs starting "
        "and killing the box alone",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "machine": machine_info(),
        "quick": args.quick,
        "versions": {"bubblewrap": bwrap},
        "rows": [{k: dataclasses.asdict(v) if isinstance(v, Stat) else v for k, v in r.items()} for r in rows],
        "notes": notes,
    }
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
