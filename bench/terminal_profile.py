"""Where a keystroke's echo spends its time in the terminal widget (JupyterLab + Chromium).

The setting of ``bench/terminal.py`` (a TerminalView on a PTY ``cat``, keys typed into xterm.js),
with stamps on one clock (epoch milliseconds, one machine) at each hop: the page types the key,
the kernel's comm handler gets it (``TerminalView._action``), the view's writer starts and ends
``write_stdin`` (the agent round trip), the echo comes back from the job's poll
(``TerminalView._emit``), the view sends its delta (``_send_msg``), xterm.js has parsed it, the
next frame has drawn it. The kernel's stamps are taken by wrapping those methods in the notebook
(a measurement, not a change to the view), written to a file by the last cell.

    python bench/terminal_profile.py [--keys 120] [--out bench/results/terminal_profile.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from terminal import typed_in_browser

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "terminal_profile.json"

# As terminal.py's MEASURE, returning each key's epoch stamps: typed, parsed, drawn.
MEASURE = """async (n) => {
  const t = document.querySelector(".rx-term-screen").rxTerminal;
  const buf = () => t.buffer.active;
  const until = (pred) => new Promise((resolve) => {
    if (pred()) return resolve();
    const d = t.onWriteParsed(() => { if (pred()) { d.dispose(); resolve(); } });
  });
  const o = performance.timeOrigin, rows = [];
  for (let i = 0; i < n; i++) {
    if (i % 40 === 0) { t.input("\\x15", true); await until(() => buf().cursorX === 0); }
    const x0 = buf().cursorX;
    const t0 = performance.now();
    t.input("abcdefghijklmnopqrstuvwxyz"[i % 26], true);
    await until(() => buf().cursorX === x0 + 1);
    const t1 = performance.now();
    await new Promise((r) => requestAnimationFrame(() => r()));
    rows.push([o + t0, o + t1, o + performance.now()]);
  }
  return rows;
}"""

# The kernel's stamps: (epoch ms, what) at each hop, what being the key or the echo text.
SETUP = """import json, time
import remote_exec as rx
from remote_exec.jupyter import TerminalView

STAMPS = {"action": [], "typed": [], "written": [], "emit": [], "send": []}
_action, _emit, _send = TerminalView._action, TerminalView._emit, TerminalView._send_msg

def action(self, kind, content):
    if kind == "input":
        STAMPS["action"].append((time.time() * 1000, content.get("data")))
    return _action(self, kind, content)

def emit(self, stream, text):
    STAMPS["emit"].append((time.time() * 1000, text))
    return _emit(self, stream, text)

def send(self, kind, data):
    if kind == "delta":
        STAMPS["send"].append((time.time() * 1000, None))
    return _send(self, kind, data)

TerminalView._action, TerminalView._emit, TerminalView._send_msg = action, emit, send
sb = rx.connect("local://?dir=ROOT/agent")
proc = sb.exec_remote(["cat"], tty=True)
_write = proc.async_process.write_stdin

async def write(data):
    STAMPS["typed"].append((time.time() * 1000, data))
    await _write(data)
    STAMPS["written"].append((time.time() * 1000, data))

proc.async_process.write_stdin = write
TerminalView(proc)"""

SEGMENTS = {
    "page -> kernel comm handler": ("page", "action"),
    "comm handler -> write_stdin": ("action", "typed"),
    "write_stdin round trip": ("typed", "written"),
    "write_stdin -> echo polled": ("typed", "emit"),
    "echo -> delta sent": ("emit", "send"),
    "delta sent -> parsed in page": ("send", "parsed"),
    "parsed -> drawn (next frame)": ("parsed", "drawn"),
    "total: typed -> drawn": ("page", "drawn"),
}


def profile(keys: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rx-bench-prof-") as tmp:
        root = Path(tmp)
        stamps_file = root / "stamps.json"
        last = (
            f"open({str(stamps_file)!r}, 'w').write(json.dumps(STAMPS)); proc.kill(); pid = sb.info.pid; "
            "sb.close(); import os, signal; os.kill(pid, signal.SIGTERM)"
        )
        rows: list[list[float]] = typed_in_browser(
            root, SETUP.replace("ROOT", str(root)), last, nodelay=True, keys=keys, measure_js=MEASURE
        )
        kernel = json.loads(stamps_file.read_text())
    return breakdown(rows, kernel)


def breakdown(rows: list[list[float]], kernel: dict[str, list[list[Any]]]) -> dict[str, Any]:
    """Each key's hops; the line kills (Ctrl+U) and their echoes are left out."""
    n = len(rows)

    def letter(what: object) -> bool:
        return isinstance(what, str) and len(what) == 1 and what.isalpha()

    at = {name: [t for t, what in kernel[name] if letter(what)][-n:] for name in ("action", "typed", "written", "emit")}
    sends = [t for t, _ in kernel["send"]]
    at["send"] = [min((s for s in sends if s >= e), default=float("nan")) for e in at["emit"]]
    at["page"], at["parsed"], at["drawn"] = ([r[i] for r in rows] for i in range(3))
    if any(len(v) != n for v in at.values()):  # an echo split in two chunks: the pairing is off
        raise RuntimeError(f"stamps do not pair up: { {k: len(v) for k, v in at.items()} }")
    result: dict[str, Any] = {}
    for name, (a, b) in SEGMENTS.items():
        ordered = sorted(at[b][i] - at[a][i] for i in range(n))
        result[name] = {"median_ms": statistics.median(ordered), "p90_ms": ordered[int(0.9 * (n - 1))]}
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=120, help="keystrokes timed (default 120)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    result = profile(args.keys)
    for name, r in result.items():
        print(f"{name:<30} median {r['median_ms']:6.2f} ms  p90 {r['p90_ms']:6.2f} ms")
    print(f"load average (1 min) {load:.1f} before, {os.getloadavg()[0]:.1f} after, on {os.cpu_count()} cores")
    report = {"bench": "terminal_profile", "keys": args.keys, "segments": result, "load_1min": load}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
