"""Notebooks that tell the truth in JupyterLab + Chromium: a saved notebook reopened with a new
kernel (and rendered by ``jupyter nbconvert``) shows each job's record, not "model not found"; a
kernel restart leaves a running view disconnected, and Reconnect or ``%exec_remote_attach``
brings a live one back with the whole output and the true elapsed time.

Screenshots go to ``test-artifacts/``; the jobs run in the shared test agent and are killed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest

import remote_exec as rx

from .conftest import gone, wait_for
from .test_browser import (  # noqa: F401  (fixtures)
    ARTIFACTS,
    CELLS,
    browser,
    failure_shot,
    lab,
    open_notebook,
    page,
    run_cell,
    run_first_cell,
    shot,
    wait_done,
)

pytestmark = pytest.mark.slow

WIDGET = "application/vnd.jupyter.widget-view+json"
TICKS = 'for i in $(seq 1 100000); do echo "tick $i"; sleep 0.1; done'


def api(server: tuple[str, Path], method: str, path: str) -> Any:
    """A call to the Jupyter Server's REST API (with the test's token)."""
    url = server[0]
    base, token = url.split("/lab/")[0], re.search(r"token=(\w+)", url)
    assert token is not None
    req = urllib.request.Request(f"{base}/api/{path}?token={token.group(1)}", method=method)
    with urllib.request.urlopen(req, timeout=30) as r:
        body = r.read()
    return json.loads(body) if body else None


def shut_down_kernels(server: tuple[str, Path]) -> None:
    """What closing a notebook with "Shut Down Kernel" does: its session and kernel go."""
    for session in api(server, "GET", "sessions"):
        api(server, "DELETE", f"sessions/{session['id']}")
    wait_for(lambda: not api(server, "GET", "kernels"), timeout=60, what="the kernels to stop")


def kill_ticking(agent_dir: Path) -> None:
    """Kill this file's running ``tick`` jobs (a failed test leaves none behind either)."""
    with rx.connect(f"local://?dir={agent_dir}") as sb:
        for info in sb.jobs():
            if info.state == "running" and "tick $i" in str(info.command):
                job = sb.attach(info.job_id)
                job.kill()
                assert gone(job.pid)


@pytest.fixture
def no_ticking_left(agent_dir: Path) -> Iterator[None]:
    yield
    kill_ticking(agent_dir)


def last_tick(text: str) -> int:
    ticks = [int(n) for n in re.findall(r"tick (\d+)", text)]
    return max(ticks) if ticks else 0


def saved_outputs(path: Path) -> list[Any]:
    nb = nbformat.read(path, as_version=4)
    return [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "display_data"]


def test_a_reopened_notebook_and_its_html_show_each_jobs_true_record(
    lab: tuple[str, Path],  # noqa: F811
    browser: Any,  # noqa: F811
    agent_dir: Path,
    no_ticking_left: None,
) -> None:
    url, notebooks = lab
    cells = [
        f"%load_ext remote_exec\n%exec_remote_config --sandbox local://?dir={agent_dir}",
        "%%exec_remote --bg --name fin\nprintf '\\033[31mred fin\\033[0m\\n'; echo fin-done; exit 3",
        f"%%exec_remote --bg --name run\n{TICKS}",
        "print('a later cell ran')",
    ]
    path = notebooks / "reopen.ipynb"
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    pg.set_default_timeout(60_000)
    with failure_shot(pg, "browser-reopen"):
        open_notebook(pg, lab, path.name, cells)
        run_first_cell(pg)
        fin = run_cell(pg, 1)
        fin.locator(".rx-job .rx-badge", has_text="failed").wait_for()
        run = run_cell(pg, 2)
        run.locator(".rx-pane-stdout .rx-line", has_text="tick 5").first.wait_for()
        wait_done(run_cell(pg, 3))
        # the running view's record keeps moving after another cell ran (it replies to its own cell)
        ran_after = last_tick(run.locator(".rx-pane-stdout").inner_text())
        run.locator(".rx-pane-stdout .rx-line", has_text=f"tick {ran_after + 70}").wait_for()
        pg.locator(".jp-NotebookPanel:visible .jp-Notebook").click()
        pg.keyboard.press("Control+s")

        def records_saved() -> bool:
            outs = saved_outputs(path) if path.stat().st_size else []
            return len(outs) == 2 and last_tick(outs[1]["data"].get("text/plain", "")) > ran_after

        wait_for(records_saved, timeout=60, what="the notebook saved with fresh records")
        fin_out, run_out = saved_outputs(path)
        assert WIDGET not in fin_out["data"] and WIDGET not in run_out["data"]  # the records only
        assert fin_out["data"]["text/plain"].startswith("[failed] printf")
        assert "exit 3" in fin_out["data"]["text/plain"] and "fin-done" in fin_out["data"]["text/plain"]
        assert run_out["data"]["text/plain"].startswith("[running] for i in")
        saved_tick = last_tick(run_out["data"]["text/plain"])
        run_id = run_out["metadata"]["remote_exec"]["job_id"]
        shot(pg, "browser-reopen-1-live-before-closing", run)
    context.close()
    shut_down_kernels(lab)

    # reopened with a new kernel: the records, not "Error displaying widget: model not found"
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    pg.set_default_timeout(60_000)
    try:
        with failure_shot(pg, "browser-reopen-2"):
            pg.goto(url.format(workspace="reopened", name=path.name))
            pg.locator(".jp-StatusBar-TextItem", has_text="(ipykernel) | Idle").wait_for(timeout=90_000)
            cells_on_screen = pg.locator(CELLS)
            fin_rec = cells_on_screen.nth(1).locator(".jp-OutputArea-output")
            run_rec = cells_on_screen.nth(2).locator(".jp-OutputArea-output")
            fin_rec.locator("pre", has_text="fin-done").wait_for()
            notebook_text = pg.locator(".jp-NotebookPanel:visible .jp-Notebook").inner_text()
            assert "Error displaying widget" not in notebook_text and "model not found" not in notebook_text
            fin_text, run_text = fin_rec.inner_text(), run_rec.inner_text()
            assert re.search(r"\bfailed\b", fin_text) and "exit 3" in fin_text and "printf" in fin_text, fin_text
            assert fin_rec.locator("pre span", has_text="red fin").evaluate("e => getComputedStyle(e).color") == (
                "rgb(205, 49, 49)"  # the ANSI red kept in the stored HTML
            )
            assert re.search(r"\brunning\b", run_text) and f"job {run_id}" in run_text, run_text
            assert last_tick(run_text) == saved_tick and "for i in $(seq 1 100000)" in run_text
            assert f"%exec_remote_attach {run_id}" in run_text
            shot(pg, "browser-reopen-3-records-after-reopening")
    finally:
        context.close()

    # nbconvert, with no kernel and no network: the same records
    html = subprocess.run(
        [sys.executable, "-m", "nbconvert", "--to", "html", "--stdout", str(path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    assert html.count("data-remote-exec-record=") == 2 and WIDGET not in html
    assert "exit 3" in html and '<span style="color:#cd3131">red fin</span>' in html
    assert f"tick {saved_tick}" in html and f"%exec_remote_attach {run_id}" in html
    (ARTIFACTS / "browser-reopen-nbconvert.html").write_text(html)

    kill_ticking(agent_dir)
