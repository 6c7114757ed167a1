"""The Dashboard with 1 000 running jobs, in a real browser (JupyterLab + Chromium).

1 000 ``sleep 600`` jobs run in a private ``local://`` agent; a notebook shows a ``Dashboard`` of
them (``mine_only=False``, a refresh a second). Over a 10 s window while nothing changes it
measures what the page receives on the kernel's websocket (bytes/s and frames/s: the
dashboard's refreshes, which must send nothing when nothing changed) and the renderer main
thread's busy time (Chrome's ``Performance.getMetrics`` ``TaskDuration``, in ms per second).
Also timed: starting the 1 000 jobs (from Python, one ``exec_remote`` each) and stopping the
agent with them (SIGTERM to its keeper: the agent's shutdown ends every job in one sweep),
until the keeper, the agent and every sleeper are gone.

Targets: < 2 000 bytes/s on the websocket and < 100 ms/s of main-thread work while idle.
The test (``tests/jupyter/test_browser_dashboard.py``) checks the behaviour with 120 jobs.

    python bench/dashboard.py [--jobs 1000] [--window 10] [--out bench/results/dashboard.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import select
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import nbformat
from terminal import CHROMIUM, jupyterlab

import remote_exec as rx
from remote_exec.agent.keeperlink import keeper_call

TARGET_BYTES_PER_S = 2_000.0
TARGET_MAIN_THREAD_MS_PER_S = 100.0
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "dashboard.json"


def alive(pid: int) -> bool:
    """True while ``pid`` is a process other than a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] != b"Z"


def stop_agent(state_dir: Path, sleepers: list[int]) -> float:
    """SIGTERM to the keeper of ``state_dir``; seconds until it, its agent and ``sleepers`` are gone."""
    hello = keeper_call(state_dir, {"op": "hello"}, 10.0)
    pids = [int(p) for p in (hello.get("pid"), hello.get("agent_pid")) if p]
    fds = [os.pidfd_open(pid) for pid in pids]
    try:
        t0 = time.monotonic()
        os.kill(pids[0], signal.SIGTERM)
        for fd in fds:  # a pidfd turns readable when its process exits
            if not select.select([fd], [], [], 300)[0]:
                raise RuntimeError(f"the agent of {state_dir} did not exit within 300 s")
        while any(map(alive, sleepers)):
            time.sleep(0.01)
        return time.monotonic() - t0
    finally:
        for fd in fds:
            os.close(fd)


def write_notebook(path: Path, url: str) -> None:
    """Cell 1 shows the Dashboard of every job in ``url``; cell 2 closes the kernel's sandbox."""
    setup = (
        "import remote_exec as rx\nfrom remote_exec.jupyter import Dashboard\n"
        f"sb = rx.connect({url!r})\nd = Dashboard(sb, mine_only=False, interval=1.0)\nd"
    )
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(setup), nbformat.v4.new_code_cell("sb.close()")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nbformat.write(nb, path)


def measure(jobs: int, window: float) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="rx-bench-dash-") as tmp:
        root = Path(tmp)
        state = root / "agent"
        url = f"local://?dir={state}"
        sb = rx.connect(url)
        try:
            t0 = time.monotonic()
            procs = [sb.exec_remote(["sleep", "600"], label=f"sleeper-{i:04d}") for i in range(jobs)]
            while not all(p.job_id for p in procs):
                time.sleep(0.05)
            start_s = time.monotonic() - t0
            sleepers = [p.pid for p in procs if p.pid is not None]
            write_notebook(root / "bench.ipynb", url)
            with jupyterlab(root) as lab, sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.set_default_timeout(120_000)
                frames: list[int] = []  # every websocket frame the page receives (the kernel's messages)
                page.on("websocket", lambda ws: ws.on("framereceived", lambda f: frames.append(len(f))))
                cdp = page.context.new_cdp_session(page)
                cdp.send("Performance.enable")

                def task_seconds() -> float:  # the renderer main thread's busy time so far
                    metrics = cdp.send("Performance.getMetrics")["metrics"]
                    return float(next(m["value"] for m in metrics if m["name"] == "TaskDuration"))

                page.goto(lab)
                page.locator(".jp-StatusBar-TextItem", has_text="(ipykernel) | Idle").wait_for()
                cells = page.locator(".jp-NotebookPanel:visible .jp-Notebook .jp-Cell")
                cells.nth(0).locator(".jp-InputArea-editor").click()
                page.keyboard.press("Shift+Enter")
                page.locator(".rx-dash-row").nth(49).wait_for()
                cells.nth(0).locator(".jp-InputPrompt", has_text="[1]").wait_for()
                page.wait_for_timeout(2_000)  # let the first refreshes settle before the window
                frames.clear()
                t1, busy0 = time.monotonic(), task_seconds()
                page.wait_for_timeout(window * 1000)
                seconds, main_thread = time.monotonic() - t1, task_seconds() - busy0
                idle = {
                    "window_s": seconds,
                    "bytes_per_s": sum(frames) / seconds,
                    "frames_per_s": len(frames) / seconds,
                    "main_thread_ms_per_s": 1000 * main_thread / seconds,
                }
                cells.nth(1).locator(".jp-InputArea-editor").click()  # the kernel lets go first
                page.keyboard.press("Shift+Enter")
                cells.nth(1).locator(".jp-InputPrompt", has_text="[2]").wait_for()
                browser.close()
            for proc in procs:  # the agent's shutdown ends them all, not 1 000 kill calls
                proc.detach()
            stop_s = stop_agent(state, sleepers)
        finally:
            sb.close()
    return {"jobs": jobs, "start_jobs_s": start_s, "idle": idle, "stop_agent_s": stop_s}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000, help="running jobs (default 1000)")
    parser.add_argument("--window", type=float, default=10.0, help="seconds measured while idle (default 10)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    r = measure(args.jobs, args.window)
    idle = r["idle"]
    print(f"{r['jobs']} jobs started in {r['start_jobs_s']:.1f} s; agent and jobs stopped in {r['stop_agent_s']:.2f} s")
    print(
        f"idle {idle['window_s']:.1f} s: {idle['bytes_per_s']:.0f} bytes/s, {idle['frames_per_s']:.2f} frames/s "
        f"on the websocket; main thread {idle['main_thread_ms_per_s']:.1f} ms/s"
    )
    targets = {"bytes_per_s": TARGET_BYTES_PER_S, "main_thread_ms_per_s": TARGET_MAIN_THREAD_MS_PER_S}
    met = {name: idle[name] < bound for name, bound in targets.items()}
    for name, bound in targets.items():
        print(f"target: {name} < {bound:g}: {'met' if met[name] else 'MISSED'}")
    report = {
        "bench": "dashboard",
        "targets": targets,
        "passed": all(met.values()),
        "met": met,
        "results": r,
        "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release()},
        "load_1min": load,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
