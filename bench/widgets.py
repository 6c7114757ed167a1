"""Widget traffic: what a JobView sends to the browser while a job writes as fast as it can.

Measured headlessly on the comm messages (``remote_exec.jupyter.headless``: every message's
size is that of the whole Jupyter message as JSON). Targets, for a job writing 10 MB:

- traffic bytes per output byte <= 1.2 (output goes as deltas, each byte once);
- front-end update messages <= 10 in any second (output and state updates together).

    python bench/widgets.py [--mb 10] [--quick] [--out bench/results/widgets.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, uninstalled

import remote_exec as rx
from remote_exec.jupyter import JobView
from remote_exec.jupyter.headless import HeadlessFrontEnd

TARGET_RATIO = 1.2
TARGET_MSGS_PER_S = 10
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "widgets.json"
LINE = "2026-01-01T00:00:00Z INFO trainer step=000123 loss=0.4321 lr=3e-4 tokens/s=51234 ok"  # 84 chars


def scenarios(mb: float, quick: bool = False) -> dict[str, tuple[str, bool]]:
    """name -> (bash script, whether the targets apply to it); ``quick`` runs the slow ones shorter."""
    n = int(mb * 1_000_000)
    chunks, lines = (10, 100) if quick else (50, 300)
    return {
        "flood stdout": (f"yes '{LINE}' | head -c {n}", True),
        "flood stdout+stderr": (
            f"(yes '{LINE}' | head -c {n // 2}) & (yes 'E {LINE}' | head -c {n // 2} >&2); wait",
            True,
        ),
        f"steady ({chunks} chunks, one every 100 ms)": (
            f"for i in $(seq 1 {chunks}); do yes '{LINE}' | head -c {n // chunks}; sleep 0.1; done",
            True,
        ),
        "flood, ANSI colours": (f"yes $'\\e[32mOK\\e[0m {LINE}' | head -c {n}", False),
        f"trickle ({lines} lines, one / 10 ms)": (
            f'for i in $(seq 1 {lines}); do echo "line $i"; sleep 0.01; done',
            False,
        ),
    }


def measure(sb: rx.Sandbox, script: str) -> dict[str, Any]:
    with HeadlessFrontEnd() as fe:
        t0 = time.monotonic()
        view = JobView(sb.exec_remote(["bash", "-c", script]), command=script)
        fe.send(view, {"type": "hello"})  # a view is on screen from the start
        outcome = view.wait(600)
        elapsed = time.monotonic() - t0
        assert outcome is not None and outcome.state == "completed", outcome
        msgs = [m for m in fe.sent(view) if m.msg_type == "comm_msg"]  # after the comm_open
        custom = fe.custom(view)
        # What a view shows is the job's output as it ends: deltas after the latest replay add up to
        # its tail (a flood over OUTPUT_RATE is sent as a replay of its newest lines, not as deltas).
        shown = {"stdout": "", "stderr": ""}
        for c in custom:
            if c["kind"] == "replay":
                for stream, pane in c["data"]["panes"].items():
                    shown[stream] = "".join(t for _, t in pane["pieces"])
            elif c["kind"] == "delta":
                for stream, text in c["data"]:
                    shown[stream] += text
        out, err = view.text("stdout"), view.text("stderr")
        for stream, text in (("stdout", out), ("stderr", err)):
            assert text.endswith(shown[stream]) and bool(shown[stream]) == bool(text), f"{stream}: not its tail"
        output_bytes = len(out.encode()) + len(err.encode())
        traffic = sum(m.size for m in msgs)
        times = [m.at for m in msgs]
        worst = max(sum(1 for t in times if s <= t < s + 1.0) for s in times) if times else 0
        view.close()
    return {
        "output_bytes": output_bytes,
        "traffic_bytes": traffic,
        "bytes_per_output_byte": traffic / output_bytes if output_bytes else None,
        "messages": len(msgs),
        "output_messages": sum(1 for c in custom if c["kind"] in ("delta", "replay")),
        "state_messages": len(fe.updates(view)),
        "messages_per_s_avg": len(msgs) / max(elapsed, 1.0),  # over the job's life (a 1 s minimum)
        "max_messages_in_1s": worst,
        "job_seconds": elapsed,
    }


def table(results: dict[str, Any]) -> str:
    head = (
        f"{'scenario':<36} {'output':>9} {'traffic':>9} {'B/out B':>8} {'msgs':>5} {'max msgs/1s':>11} "
        f"{'job s':>6}  target"
    )
    lines = [head, "-" * len(head)]
    for name, r in results.items():
        ok = ("met" if r["passed"] else "MISSED") if r["target"] else "(info)"
        lines.append(
            f"{name:<36} {r['output_bytes'] / 1e6:>7.2f}MB {r['traffic_bytes'] / 1e6:>7.2f}MB "
            f"{r['bytes_per_output_byte']:>8.3f} {r['messages']:>5} {r['max_messages_in_1s']:>11} "
            f"{r['job_seconds']:>6.2f}  {ok}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=10.0, help="megabytes each flood writes (default 10)")
    parser.add_argument("--quick", action="store_true", help="1 MB floods: a smoke run")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    mb = 1.0 if args.quick else args.mb
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="rx-bench-widgets-") as tmp:
        url = f"local://?dir={tmp}/agent"
        with rx.connect(url) as sb:
            agent_pid = sb.info.pid
            for name, (script, target) in scenarios(mb, args.quick).items():
                r = measure(sb, script)
                r["target"] = target
                r["passed"] = (r["bytes_per_output_byte"] <= TARGET_RATIO) and (
                    r["max_messages_in_1s"] <= TARGET_MSGS_PER_S
                )
                if not target:  # informational: only the message rate is promised here
                    r["passed"] = r["max_messages_in_1s"] <= TARGET_MSGS_PER_S
                results[name] = r
        os.kill(agent_pid, signal.SIGTERM)  # its state dir is about to go
    print(table(results))
    report = {
        "bench": "widgets",
        "flood_mb": mb,
        "targets": {"bytes_per_output_byte": TARGET_RATIO, "max_messages_per_s": TARGET_MSGS_PER_S},
        "machine": {"python": platform.python_version(), "kernel": platform.release(), "cpu_count": os.cpu_count()},
        "results": results,
        "passed": all(r["passed"] for r in results.values()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwritten to {args.out}; targets {'met' if report['passed'] else 'MISSED'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
