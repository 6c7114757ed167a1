"""Controls that act while the kernel is busy, in a real JupyterLab and Chromium (issue #23, point 1).

A widget's buttons used to be comm messages, which wait behind a running cell. With the control
route (remote_exec/jupyter/controls.py and control_route.py) Kill and Interrupt on a foreground
cell's view, and Kill on a ``--bg`` view while another cell runs, act at once. The click → gone
time is measured and printed (the issue asks for under a second), not asserted.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import gone, wait_for
from .lab_page import failure_shot, open_notebook, run_cell, run_first_cell, shot, wait_done

pytestmark = pytest.mark.slow

RUNNING = re.compile(r"\[\*\]")


def _setup(agent_dir: Path) -> str:
    return f"%load_ext remote_exec\n%exec_remote_config --sandbox local://?dir={agent_dir}"


def _click_until_gone(job: Any, button: str, pid: int, what: str) -> float:
    """Click ``button`` of the view ``job`` (its controls on the socket route) and wait for ``pid``
    to be gone; the seconds from the click to gone."""
    wait_for(lambda: job.get_attribute("data-controls") == "socket", what="the view's control route")
    t0 = time.monotonic()
    job.locator("button", has_text=button).first.click()
    assert gone(pid, timeout=60), f"{what}: the job is still running"
    elapsed = time.monotonic() - t0
    print(f"\n{what}: click -> job gone in {elapsed:.3f} s")
    return elapsed


@pytest.mark.parametrize("button", ["Kill", "Interrupt"])
def test_a_foreground_cells_view_stops_its_job(
    lab: tuple[str, Path], page: Any, agent_dir: Path, tmp_path: Path, button: str
) -> None:
    pid_file = tmp_path / "fg.pid"
    cells = [_setup(agent_dir), f"%%exec_remote\necho $$ > {pid_file}\necho fg-started\nsleep 300"]
    with failure_shot(page, f"busy-fg-{button.lower()}"):
        open_notebook(page, lab, f"busy-fg-{button.lower()}.ipynb", cells)
        run_first_cell(page)
        cell = run_cell(page, 1)
        cell.locator(".jp-OutputArea-output", has_text="fg-started").wait_for()
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the foreground job's pid")
        assert RUNNING.search(cell.locator(".jp-InputPrompt").inner_text())  # the kernel is busy with it
        _click_until_gone(cell.locator(".rx-job"), button, int(pid_file.read_text()), f"foreground {button}")
        wait_done(cell)  # the cell ends with its job
        assert "Task exception" not in cell.locator(".jp-OutputArea").inner_text()
        shot(page, f"busy-fg-{button.lower()}", cell)


def test_a_bg_view_kills_its_job_while_another_cell_runs(
    lab: tuple[str, Path], page: Any, agent_dir: Path, tmp_path: Path
) -> None:
    pid_file = tmp_path / "bg.pid"
    cells = [
        _setup(agent_dir),
        f"%%exec_remote --bg\necho $$ > {pid_file}\necho bg-started\nsleep 300",
        "import time; print('sleeping', flush=True); time.sleep(120)",
    ]
    with failure_shot(page, "busy-bg-kill"):
        open_notebook(page, lab, "busy-bg.ipynb", cells)
        run_first_cell(page)
        bg = run_cell(page, 1)
        wait_done(bg)
        job = bg.locator(".rx-job")
        job.locator(".rx-pane-stdout .rx-line", has_text="bg-started").wait_for()
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the bg job's pid")
        sleeper = run_cell(page, 2)
        sleeper.locator(".jp-OutputArea-output", has_text="sleeping").wait_for()
        _click_until_gone(job, "Kill", int(pid_file.read_text()), "bg Kill while a cell runs")
        job.locator(".rx-badge", has_text="killed").wait_for()
        assert RUNNING.search(sleeper.locator(".jp-InputPrompt").inner_text())  # that cell still runs
        assert "Task exception" not in bg.locator(".jp-OutputArea").inner_text()
        shot(page, "busy-bg-killed-while-busy", bg)
        interrupt = "[data-command='notebook:interrupt-kernel']"  # end the sleeping cell
        page.locator(f"jp-button{interrupt}, button{interrupt}").first.click()
        wait_done(sleeper)


@pytest.mark.parametrize("without", ["refused", "a page"])
def test_a_control_held_by_a_busy_kernel_says_so(
    lab: tuple[str, Path], page: Any, agent_dir: Path, tmp_path: Path, without: str
) -> None:
    """Without the route (its requests fail, or a server without the extension answers with a
    page), Kill goes by the comm and waits behind the cell: the button says so, and is itself
    again once the kernel took it."""
    pid_file = tmp_path / "fg.pid"
    cells = [_setup(agent_dir), f"%%exec_remote\necho $$ > {pid_file}\necho fg-started\nsleep 300"]
    logs: list[str] = []
    page.on("console", lambda m: logs.append(m.text))
    with failure_shot(page, "busy-fallback"):
        if without == "refused":
            page.route("**/remote-exec/controls/**", lambda route: route.abort())
        else:
            page.route("**/remote-exec/controls/**", lambda route: route.fulfill(status=200, body="<html></html>"))
        open_notebook(page, lab, f"busy-fallback-{without[0]}.ipynb", cells)
        run_first_cell(page)
        cell = run_cell(page, 1)
        cell.locator(".jp-OutputArea-output", has_text="fg-started").wait_for()
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the foreground job's pid")
        job = cell.locator(".rx-job")
        kill = job.locator("button.rx-danger")
        kill.click()
        try:
            job.locator("button", has_text="kernel busy: use ■").wait_for(timeout=20_000)
        except Exception:
            print("\n".join(logs))
            raise
        shot(page, "busy-fallback-flagged", cell)
        interrupt = "[data-command='notebook:interrupt-kernel']"  # the toolbar's ■, as the button says
        page.locator(f"jp-button{interrupt}, button{interrupt}").first.click()
        assert gone(int(pid_file.read_text()), timeout=60)
        wait_done(cell)
        assert "Task exception" not in cell.locator(".jp-OutputArea").inner_text()
        job.locator("button.rx-danger", has_text=re.compile(r"^Kill$")).wait_for()  # acknowledged


def test_a_dashboard_row_kills_its_job_while_another_cell_runs(
    lab: tuple[str, Path], page: Any, agent_dir: Path, tmp_path: Path
) -> None:
    """Unlike the JobView tests, this one also passes without the route here: JupyterLab 4 sends
    widget comm messages on a kernel subshell (ipykernel 7.4), and the Dashboard's comm Kill was
    seen to act while a ``time.sleep`` cell ran (a JobView's did not; not yet understood)."""
    pid_file = tmp_path / "dash.pid"
    cells = [
        _setup(agent_dir),
        f"%%exec_remote --bg --name dashjob\necho $$ > {pid_file}\necho dash-started\nsleep 300",
        "%remote_jobs",
        "import time; print('sleeping', flush=True); time.sleep(120)",
    ]
    with failure_shot(page, "busy-dash-kill"):
        open_notebook(page, lab, "busy-dash.ipynb", cells)
        run_first_cell(page)
        wait_done(run_cell(page, 1))
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the job's pid")
        dash_cell = run_cell(page, 2)
        wait_done(dash_cell)
        dash = dash_cell.locator(".rx-dashboard")
        row = dash.locator(".rx-dash-row", has_text="dash-started").first
        row.wait_for()
        sleeper = run_cell(page, 3)
        sleeper.locator(".jp-OutputArea-output", has_text="sleeping").wait_for()
        _click_until_gone(dash, "Kill", int(pid_file.read_text()), "dashboard row Kill while a cell runs")
        dash.locator(".rx-dash-row", has_text=re.compile("killed", re.IGNORECASE)).wait_for()  # updated meanwhile
        assert RUNNING.search(sleeper.locator(".jp-InputPrompt").inner_text())  # that cell still runs
        shot(page, "busy-dash-killed-while-busy", dash_cell)
        interrupt = "[data-command='notebook:interrupt-kernel']"
        page.locator(f"jp-button{interrupt}, button{interrupt}").first.click()
        wait_done(sleeper)
