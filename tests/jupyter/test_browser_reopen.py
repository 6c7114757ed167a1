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
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest

import remote_exec as rx

from .conftest import gone, new_page, wait_for
from .lab_page import (
    ARTIFACTS,
    CELLS,
    failure_shot,
    kernel_idle,
    open_notebook,
    restart_kernel,
    run_cell,
    run_first_cell,
    save_until,
    shot,
    wait_done,
)

pytestmark = pytest.mark.slow

WIDGET = "application/vnd.jupyter.widget-view+json"
RECORD_MIME = "application/vnd.remote-exec.record+json"
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


def fresh_records(path: Path, count: int, index: int, after: int) -> bool:
    """The saved file has ``count`` records and record ``index`` shows a tick past ``after``."""
    outs = saved_outputs(path)
    return len(outs) == count and last_tick(outs[index]["data"]["text/plain"]) > after


def test_a_reopened_notebook_and_its_html_show_each_jobs_true_record(
    lab: tuple[str, Path],
    browser: Any,
    agent_dir: Path,
    no_ticking_left: None,
) -> None:
    url, notebooks = lab
    cells = [
        f"%load_ext remote_exec\n%exec_remote_config --sandbox local://?dir={agent_dir}",
        "%%exec_remote --bg --name fin\nprintf '\\033[31mred fin\\033[0m\\n'; echo fin-done; exit 3",
        f"%%exec_remote --bg --name run\n{TICKS}",
        "print('a later cell ran')",
        "%remote_jobs",
    ]
    path = notebooks / "reopen.ipynb"
    pg = new_page(browser)
    with failure_shot(pg, "browser-reopen"):
        open_notebook(pg, lab, path.name, cells)
        run_first_cell(pg)
        fin = run_cell(pg, 1)
        fin.locator(".rx-job .rx-badge", has_text="failed").wait_for()
        run = run_cell(pg, 2)
        run.locator(".rx-pane-stdout .rx-line", has_text="tick 5").first.wait_for()
        wait_done(run_cell(pg, 3))
        dash = run_cell(pg, 4)
        dash.locator(".rx-dash-row", has_text="tick").first.wait_for()
        # the running view keeps moving after another cell ran, and so does its record (it replies
        # to its own cell): the save below waits for a record past ran_after (rewritten every
        # RECORD_PERIOD, 5 s), not this view
        ran_after = last_tick(run.locator(".rx-pane-stdout").inner_text())
        run.locator(".rx-pane-stdout .rx-line", has_text=f"tick {ran_after + 10}").wait_for()

        def records_saved() -> bool:
            outs = saved_outputs(path)
            return len(outs) == 3 and last_tick(outs[1]["data"].get("text/plain", "")) > ran_after

        save_until(pg, path, records_saved)
        fin_out, run_out, dash_out = saved_outputs(path)
        assert WIDGET not in fin_out["data"] and WIDGET not in run_out["data"]  # the records only
        assert fin_out["data"]["text/plain"].startswith("[failed] printf")
        assert "exit 3" in fin_out["data"]["text/plain"] and "fin-done" in fin_out["data"]["text/plain"]
        assert run_out["data"]["text/plain"].startswith("[running] for i in")
        saved_tick = last_tick(run_out["data"]["text/plain"])
        run_id, fin_id = (o["metadata"]["remote_exec"]["job_id"] for o in (run_out, fin_out))
        assert WIDGET not in dash_out["data"] and run_id in dash_out["data"]["text/html"]
        assert fin_id in dash_out["data"]["text/plain"] and "no jobs" not in dash_out["data"]["text/plain"]
        shot(pg, "browser-reopen-1-live-before-closing", run)
    pg.context.close()
    shut_down_kernels(lab)
    # the saver's bundle for the JupyterLab extension, beside the records every other reader shows
    assert dash_out["data"][RECORD_MIME]["sandboxes"] == [f"local://?dir={agent_dir}"]  # a dashboard's Reconnect
    assert run_out["data"][RECORD_MIME] == {
        "kind": "job",
        "job_id": run_id,
        "sandbox": f"local://?dir={agent_dir}",
        "label": TICKS.split("\n")[0],
        "state": "running",
        "html": run_out["data"]["text/html"],
    }

    # nbconvert, with no kernel and no network: the same records
    html = subprocess.run(
        [sys.executable, "-m", "nbconvert", "--to", "html", "--stdout", str(path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    assert html.count("data-remote-exec-record=") == 3 and WIDGET not in html and RECORD_MIME not in html
    assert "exit 3" in html and '<span style="color:#cd3131">red fin</span>' in html
    assert f"tick {saved_tick}" in html and f"%exec_remote_attach {run_id}" in html
    (ARTIFACTS / "browser-reopen-nbconvert.html").write_text(html)

    # reopened with a new kernel: the records, not "Error displaying widget: model not found"
    pg = new_page(browser)
    try:
        with failure_shot(pg, "browser-reopen-2"):
            pg.goto(url.format(workspace="reopened", name=path.name))
            kernel_idle(pg)
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
            dash_text = cells_on_screen.nth(4).locator(".jp-OutputArea-output").inner_text()
            assert run_id in dash_text and fin_id in dash_text and "running" in dash_text, dash_text
            shot(pg, "browser-reopen-3-records-after-reopening")
            shot(pg, "browser-reopen-4-dashboard-record-after-reopening", cells_on_screen.nth(4))

            # (the extension) the record offers Reconnect under the new kernel (a trusted notebook:
            # this server saved it). Its sandbox, local://?dir=, is not on the one-click list: the
            # kernel opens it once the user has (the set-up cell, run again), not before, when the
            # click says which magic would, the record kept above the message.
            run_cell_on_screen = cells_on_screen.nth(2)
            run_rec.locator("button.rx-record-reconnect:visible").click()
            refused = run_cell_on_screen.locator(".jp-OutputArea-output", has_text="Not opened")
            refused.wait_for()
            assert f"%exec_remote_attach {run_id} --sandbox" in refused.inner_text()
            assert run_cell_on_screen.locator(".rx-record").count() == 1
            shot(pg, "browser-reopen-5a-reconnect-names-the-magic-first", run_cell_on_screen)
            run_first_cell(pg)
            run_cell_on_screen.locator("button.rx-record-reconnect:visible").click()
            live = run_cell_on_screen.locator(".rx-job")
            live.locator(".rx-badge", has_text="running").wait_for()
            live.locator(".rx-pane-stdout .rx-line", has_text=f"tick {saved_tick + 10}").wait_for()
            assert live.locator(".rx-pane-stdout .rx-line").first.inner_text() == "tick 1"
            assert run_cell_on_screen.locator(".rx-record").count() == 0
            shot(pg, "browser-reopen-5-reconnected-from-the-record", run_cell_on_screen)

            # a page reload while the kernel runs: the live view comes back by itself
            pg.reload()
            kernel_idle(pg)
            back = pg.locator(CELLS).nth(2).locator(".rx-job")
            back.locator(".rx-badge", has_text="running").wait_for()
            now = last_tick(back.locator(".rx-pane-stdout").inner_text())
            back.locator(".rx-pane-stdout .rx-line", has_text=f"tick {now + 5}").wait_for()
            assert pg.locator(CELLS).nth(2).locator(".rx-record").count() == 0

            # saved again: that cell's record is the live view's, not the pre-restart one
            save_until(pg, path, lambda: fresh_records(path, 3, 1, now))
            resaved = saved_outputs(path)[1]
            assert resaved["data"][RECORD_MIME]["job_id"] == run_id and WIDGET not in resaved["data"]
            shot(pg, "browser-reopen-6-live-again-after-a-reload", pg.locator(CELLS).nth(2))
    finally:
        pg.context.close()

    kill_ticking(agent_dir)


def shown_seconds(meta: str) -> float:
    """The elapsed time a view's meta line shows (rxFormatDuration's forms)."""
    found = re.search(r"· (?:(\d+) min (\d+) s|([\d.]+) s)\b", meta)
    assert found, meta
    if found.group(3):
        return float(found.group(3))
    return int(found.group(1)) * 60 + int(found.group(2))


def assert_live_and_whole(view: Any, started: tuple[float, float], frozen_at: int) -> None:
    """``view`` follows the job: the whole output from its first line on, new lines coming, the
    job's true command, and the elapsed time counted from the job's start (``started``: the
    moments before and after it started)."""
    view.locator(".rx-badge", has_text="running").wait_for()
    pane = view.locator(".rx-pane-stdout")
    pane.locator(".rx-line", has_text=f"tick {frozen_at + 20}").wait_for()  # live: past the freeze
    assert pane.locator(".rx-line").first.inner_text() == "tick 1"  # the whole kept output
    assert pane.locator(".rx-hidden").inner_text() == ""
    assert view.locator(".rx-job-command").inner_text() == f"ticker · {TICKS}"  # its name leads
    shown, now = shown_seconds(view.locator(".rx-job-meta").inner_text()), time.time()
    assert now - started[1] - 2 <= shown <= now - started[0] + 2, (shown, now - started[0])


def test_after_a_kernel_restart_reconnect_or_the_attach_magic_gives_a_live_view(
    lab: tuple[str, Path],
    page: Any,
    agent_dir: Path,
    no_ticking_left: None,
) -> None:
    url = f"local://?dir={agent_dir}"
    cells = [
        f"%load_ext remote_exec\n%exec_remote_config --sandbox {url}",
        f"%%exec_remote --bg --name ticker\n{TICKS}",
        # Reconnect stored the handle under the cell's own --name (the extension passes it: a cell
        # run in this page is trusted)
        f'print("reconnect bound:", type(ticker).__name__)\n%load_ext remote_exec\n'
        f"%exec_remote_config --sandbox {url}\n%exec_remote_attach ticker",
    ]
    with failure_shot(page, "browser-restart"):
        open_notebook(page, lab, "restart.ipynb", cells)
        run_first_cell(page)
        before = time.time()
        cell = run_cell(page, 1)
        old = cell.locator(".rx-job")
        old.wait_for()
        started = (before, time.time())
        old.locator(".rx-pane-stdout .rx-line", has_text=re.compile(r"^tick 30\s*$")).wait_for()

        # a restart: the old view says so, its buttons are disabled, its output stops
        page.locator("jp-button[data-command='notebook:restart-kernel']").first.click()
        page.locator(".jp-Dialog button", has_text="Restart").click()
        old.locator(".rx-badge", has_text="disconnected").wait_for()
        assert old.get_attribute("data-state") == "disconnected"
        assert old.locator("button", has_text="Kill").is_disabled()
        assert old.locator("button", has_text="Interrupt").is_disabled()
        assert "The kernel that showed this view is gone" in old.locator(".rx-job-error").inner_text()
        kernel_idle(page)
        run_first_cell(page)  # the user's set-up again: the new kernel opens the sandbox it names
        reconnect = old.locator("button.rx-reconnect:enabled")
        reconnect.wait_for()
        frozen_at = last_tick(old.locator(".rx-pane-stdout").inner_text())
        shot(page, "browser-restart-1-disconnected", cell)

        # one click: a live view in its place, the whole output, the true command and elapsed time
        reconnect.click()
        live = cell.locator(".rx-job")
        live.locator(".rx-badge", has_text="running").wait_for()
        assert cell.locator(".rx-job").count() == 1 and cell.locator(".rx-reconnect:visible").count() == 0
        assert_live_and_whole(live, started, frozen_at)
        shot(page, "browser-restart-2-reconnected", cell)

        # (the extension) the live view replaced the cell's output: a save stores its record,
        # not the one from before the restart
        path = lab[1] / "restart.ipynb"
        save_until(page, path, lambda: fresh_records(path, 1, 0, frozen_at))

        # the same from the magic, in a new cell of the new kernel
        attached = run_cell(page, 2)
        wait_done(attached)
        said = attached.locator(".jp-OutputArea-output").first.inner_text()
        assert said.startswith("reconnect bound: BackgroundJob\n"), said
        view = attached.locator(".rx-job")
        assert_live_and_whole(view, started, frozen_at)
        shot(page, "browser-restart-3-attached", attached)

        view.locator("button", has_text="Kill").click()
        view.locator(".rx-badge", has_text="killed").wait_for()
        live.locator(".rx-badge", has_text="killed").wait_for()  # the reconnected view saw it end too


def kill_terminals(agent_dir: Path) -> None:
    """Kill the running ``%remote_shell`` terminals in the test agent (ours, and none left behind)."""
    with rx.connect(f"local://?dir={agent_dir}") as sb:
        for info in sb.jobs():
            if info.state == "running" and info.tty and info.label == "%remote_shell":
                job = sb.attach(info.job_id)
                job.kill()
                assert gone(job.pid)


def test_a_kernel_restart_puts_every_widget_in_one_disconnected_state_and_each_reconnects(
    lab: tuple[str, Path],
    page: Any,
    agent_dir: Path,
    no_ticking_left: None,
) -> None:
    """A JobView, a TerminalView, a ShellView and a Dashboard on one page, then a kernel restart:
    each says "disconnected" the same way (grey badge, inputs and buttons disabled, one
    Reconnect, enabled once a kernel is up), and each Reconnect gives a live widget of the same
    job, terminal, shell session or sandbox in its place."""
    url = f"local://?dir={agent_dir}"
    cells = [
        f"%load_ext remote_exec\n%exec_remote_config --sandbox {url}",
        f"%%exec_remote --bg --name ticker\n{TICKS}",
        "%remote_shell",
        "%remote_shell --shell new",
        "%remote_jobs",
    ]
    kinds = {1: ".rx-job", 2: ".rx-term", 3: ".rx-shell", 4: ".rx-dashboard"}
    try:
        with failure_shot(page, "browser-restart-all"):
            open_notebook(page, lab, "restart-all.ipynb", cells)
            run_first_cell(page)
            cells_on, widgets = {}, {}
            for i, kind in kinds.items():
                cells_on[i] = run_cell(page, i)
                widgets[i] = cells_on[i].locator(kind)
                widgets[i].wait_for()
            job, term, shell, dash = (widgets[i] for i in kinds)
            job.locator(".rx-pane-stdout .rx-line", has_text=re.compile(r"^tick 3\s*$")).wait_for()
            shell.locator(".rx-shell-input").fill("cd /tmp")
            shell.locator(".rx-shell-input").press("Enter")
            shell.locator(".rx-shell-prompt", has_text="/tmp$").wait_for()
            dash.locator(".rx-dash-row", has_text="ticker").wait_for()
            for w in widgets.values():
                assert w.get_attribute("data-connection") == "connected"
                assert w.locator(".rx-reconnect").is_hidden()

            page.locator("jp-button[data-command='notebook:restart-kernel']").first.click()
            page.locator(".jp-Dialog button", has_text="Restart").click()
            # one story: each says so, its controls disabled, one Reconnect
            for i, w in widgets.items():
                cells_on[i].locator(f"{kinds[i]}[data-connection=disconnected]").wait_for()
                w.locator(".rx-badge", has_text="disconnected").first.wait_for()
                assert "The kernel that showed this view is gone" in w.inner_text()
                assert w.locator(".rx-reconnect").count() == 1
            assert job.locator("button", has_text="Kill").is_disabled()
            assert term.locator("button", has_text="Ctrl-C").is_disabled()
            assert shell.locator(".rx-shell-input").is_disabled()
            assert dash.locator("button", has_text="Refresh").is_disabled()
            assert dash.locator(".rx-dash-row button", has_text="Kill").first.is_disabled()
            kernel_idle(page)
            run_first_cell(page)  # the user's set-up again: the new kernel opens the sandbox it names
            for w in widgets.values():
                w.locator(".rx-reconnect:enabled").wait_for()
            shot(page, "browser-restart-all-1-disconnected")
            shot(page, "browser-restart-all-1-disconnected-shell", cells_on[3])
            shot(page, "browser-restart-all-1-disconnected-dashboard", cells_on[4])
            assert dash.locator(".rx-dash-links").is_hidden() and job.locator(".rx-link").is_hidden()

            # each Reconnect: a live widget in its place (one at a time: a replaced output moves
            # the page under the pointer)
            for i, kind in kinds.items():
                # the click as an event on the button, not at a point of the page: the outputs
                # above are being replaced and grow meanwhile (the soak once lost a click to it)
                widgets[i].locator(".rx-reconnect").dispatch_event("click")
                cells_on[i].locator(f"{kind}[data-connection=connected]").wait_for()
                assert cells_on[i].locator(kind).count() == 1
            cells_now = cells_on
            cells_now[1].locator(".rx-job .rx-badge", has_text="running").wait_for()
            cells_now[2].locator(".rx-term .rx-badge", has_text="running").wait_for()
            live_shell = cells_now[3].locator(".rx-shell")
            live_shell.locator(".rx-shell-prompt", has_text="/tmp$").wait_for()  # the same session
            live_shell.locator(".rx-shell-input").fill("echo still-$((6*7))")
            live_shell.locator(".rx-shell-input").press("Enter")
            live_shell.locator(".rx-line", has_text=re.compile(r"^still-42\s*$")).wait_for()
            cells_now[4].locator(".rx-dash-row", has_text="ticker").wait_for()
            shot(page, "browser-restart-all-2-reconnected")
            shot(page, "browser-restart-all-2-reconnected-dashboard", cells_on[4])
            assert cells_on[4].locator(".rx-dashboard .rx-state-disconnected").is_hidden()
            live_shell.locator(".rx-shell-input").fill("exit")
            live_shell.locator(".rx-shell-input").press("Enter")
            live_shell.locator(".rx-badge", has_text="closed").wait_for()
    finally:
        kill_terminals(agent_dir)


def test_remote_jobs_shows_this_notebooks_jobs_after_a_restart_and_all_on_request(
    lab: tuple[str, Path],
    page: Any,
    agent_dir: Path,
) -> None:
    """``%remote_jobs`` in a restarted kernel (no handles left): this notebook's ``--bg`` job and
    ``--shell`` run by their tags, not another client's job until "only mine" is unticked."""
    url = f"local://?dir={agent_dir}"
    cells = [
        f"%load_ext remote_exec\n%exec_remote_config --sandbox {url}",
        "%%exec_remote --bg --name mybg\necho mine-bg; sleep 300",
        "%%exec_remote --shell new\necho mine-shell",
        f"%load_ext remote_exec\n%exec_remote_config --sandbox {url}\n%remote_jobs",
    ]
    with rx.connect(url) as sb:
        other = sb.exec_remote(["bash", "-c", "echo other-client; sleep 300"], label="other-client")
        try:
            with failure_shot(page, "browser-mine"):
                open_notebook(page, lab, "mine.ipynb", cells)
                run_first_cell(page)
                run_cell(page, 1).locator(".rx-job .rx-pane-stdout .rx-line", has_text="mine-bg").wait_for()
                wait_done(run_cell(page, 2))
                restart_kernel(page)
                cell = run_cell(page, 3)
                rows = cell.locator(".rx-dash-row")
                rows.filter(has_text="mine-bg").first.wait_for()
                rows.filter(has_text="mine-shell").first.wait_for()  # the shell session's row
                assert rows.filter(has_text="other-client").count() == 0
                assert "other clients hidden" in cell.locator(".rx-dashboard").inner_text()
                shot(page, "browser-mine-1-only-mine", cell)
                cell.locator(".rx-dash-check", has_text="only mine").locator("input").uncheck()
                rows.filter(has_text="other-client").first.wait_for()
                assert rows.filter(has_text="mine-bg").count() >= 1
                shot(page, "browser-mine-2-all", cell)
        finally:
            other.kill()
            for info in sb.jobs():
                if info.state == "running" and "mine-bg" in str(info.command):
                    sb.attach(info.job_id).kill()
