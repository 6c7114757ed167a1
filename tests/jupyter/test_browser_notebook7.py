"""The widgets in Notebook 7 (the classic-style front end built from JupyterLab's parts), in
Chromium: a ``--bg`` view shows its job live and its Kill acts while another cell runs (by the
control route, past the busy kernel), and a kernel restart leaves it disconnected with a
Reconnect that brings a live view back. The same server as the JupyterLab tests (``lab``):
Notebook 7 is served beside JupyterLab at ``/notebooks/<path>``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import nbformat
import pytest

from .conftest import gone, wait_for
from .lab_page import CELLS, failure_shot, run_cell, run_first_cell, shot, wait_done

pytestmark = pytest.mark.slow

RUNNING = re.compile(r"\[\*\]")
TICKS = 'for i in $(seq 1 100000); do echo "tick $i"; sleep 0.1; done'


def open_in_notebook7(page: Any, lab: tuple[str, Path], name: str, cells: list[str]) -> None:
    url, notebooks = lab
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nbformat.write(nb, notebooks / name)
    lab_url = url.format(workspace="unused", name=name)  # JupyterLab's: .../lab/workspaces/W/tree/PATH?token=T
    base, path, token = lab_url.split("/lab/")[0], lab_url.split("/tree/")[1].split("?")[0], lab_url.split("?token=")[1]
    page.goto(f"{base}/notebooks/{path}?token={token}")
    page.locator(CELLS).first.wait_for()
    notebook7_idle(page)


def notebook7_idle(page: Any) -> None:
    """Wait until Notebook 7's kernel indicator says the kernel is up and idle."""
    page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(timeout=90_000)


def test_a_bg_view_in_notebook7_acts_while_a_cell_runs_and_reconnects_after_a_restart(
    lab: tuple[str, Path], page: Any, agent_dir: Path, tmp_path: Path
) -> None:
    pid_file = tmp_path / "bg.pid"
    cells = [
        f"%load_ext remote_exec\n%exec_remote_config --sandbox local://?dir={agent_dir}",
        f"%%exec_remote --bg --name nb7\necho $$ > {pid_file}\n{TICKS}",
        "import time; print('sleeping', flush=True); time.sleep(120)",
    ]
    with failure_shot(page, "notebook7"):
        open_in_notebook7(page, lab, "nb7.ipynb", cells)
        run_first_cell(page)
        bg = run_cell(page, 1)
        wait_done(bg)
        job = bg.locator(".rx-job")
        job.locator(".rx-pane-stdout .rx-line", has_text=re.compile(r"^tick 3\s*$")).wait_for()
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the bg job's pid")
        pid = int(pid_file.read_text())

        # a restart: disconnected, then Reconnect gives a live view of the same job
        page.locator("[data-command='notebook:restart-kernel']").first.click()
        page.locator(".jp-Dialog button", has_text="Restart").click()
        job.locator(".rx-badge", has_text="disconnected").wait_for()
        assert job.locator("button", has_text="Kill").is_disabled()
        notebook7_idle(page)
        run_first_cell(page)
        job.locator(".rx-reconnect:enabled").click()
        live = bg.locator(".rx-job[data-connection=connected]")
        live.locator(".rx-badge", has_text="running").wait_for()
        shot(page, "notebook7-1-reconnected", bg)

        # Kill while another cell runs: by the control route, the kernel busy
        sleeper = run_cell(page, 2)
        sleeper.locator(".jp-OutputArea-output", has_text="sleeping").wait_for()
        wait_for(lambda: live.get_attribute("data-controls") == "socket", what="the view's control route")
        live.locator("button", has_text="Kill").click()
        assert gone(pid, timeout=60), "the job is still running"
        live.locator(".rx-badge", has_text="killed").wait_for()
        assert RUNNING.search(sleeper.locator(".jp-InputPrompt").inner_text())  # that cell still runs
        shot(page, "notebook7-2-killed-while-busy", bg)
        page.locator("[data-command='notebook:interrupt-kernel']").first.click()
        wait_done(sleeper)
