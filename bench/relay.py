"""The ``stdio`` relay's way down (:func:`remote_exec.agent.relay._relay_down`), alone: a socket pair
and a pipe, the relay in a process of its own as in a container, each way it can move bytes.

- **copy**: ``recv`` and ``write`` (where ``splice`` is refused: seccomp, gVisor);
- **splice**: every frame spliced into the pipe, no copy through the relay (what it does now).

Per way: the time a small frame (201 bytes) takes across, from the sender's ``send`` to the
reader's ``read`` (3,000 frames, a 4 MiB burst after every 100 as a stream would send), and the
throughput of one 64 MiB burst. ``docker://`` puts dockerd, its shim and the docker CLI on the
same path, whose own copies and noise hide this difference (``bench/sandboxes.py``).

    python bench/relay.py [--frames 3000] [--out bench/results/relay.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, uninstalled

from bench.benchlib import MB, code_info, machine_info

HERE = Path(__file__).resolve().parent
RELAY = """
import socket, sys
from remote_exec.agent import relay
conn = socket.socket(fileno=int(sys.argv[1]))
splices = sys.argv[2] == "splice"
if splices:
    conn.settimeout(relay._FOREVER)
relay._relay_down(conn, splices)
"""


def _read(fd: int, n: int) -> None:
    got = 0
    while got < n:
        chunk = os.read(fd, min(n - got, 1 << 20))
        assert chunk, f"EOF after {got} of {n} bytes"
        got += len(chunk)


def _burst(ours: socket.socket, out: int, size: int) -> float:
    """Seconds for ``size`` bytes across (sent by a thread: the pipe holds less than that)."""
    t0 = time.perf_counter()
    sender = threading.Thread(target=ours.sendall, args=(b"z" * size,))
    sender.start()
    _read(out, size)
    sender.join()
    return time.perf_counter() - t0


def measure(way: str, frames: int) -> dict[str, Any]:
    ours, theirs = socket.socketpair()
    r, w = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-c", RELAY, str(theirs.fileno()), way], stdout=w, pass_fds=[theirs.fileno()]
    )
    os.close(w)
    theirs.close()
    try:
        small = b"x" * 200 + b"\n"
        times = []
        for i in range(frames):
            t0 = time.perf_counter()
            ours.sendall(small)
            _read(r, len(small))
            times.append(time.perf_counter() - t0)
            if i % 100 == 0:
                _burst(ours, r, 4 << 20)
        times = times[100:]
        size = 64 << 20
        took = _burst(ours, r, size)
        return {
            "small_frame_us": {
                "median": 1e6 * statistics.median(times),
                "p90": 1e6 * sorted(times)[len(times) * 9 // 10],
            },
            "throughput_mb_s": size / took / MB,
        }
    finally:
        ours.close()
        proc.wait(30)
        os.close(r)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=3000)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "relay.json")
    args = parser.parse_args()
    ways = ("copy", "splice")
    runs: dict[str, list[dict[str, Any]]] = {way: [] for way in ways}
    for _ in range(2):  # alternated: the machine's drift falls on both
        for way in ways:
            runs[way].append(measure(way, args.frames))
    results = {"machine": machine_info(), "code": code_info(HERE.parent), "frames": args.frames, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    for way in ways:
        cells = [f"{r['small_frame_us']['median']:.1f} us, {r['throughput_mb_s']:.0f} MB/s" for r in runs[way]]
        print(f"{way}: small frame / 64 MiB burst: {'; '.join(cells)}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
