"""Health in a real browser (JupyterLab + Debian's Chromium via Playwright): a JobView shows its
sandbox's link, lost within the liveness bound after a real SIGSTOP of the agent and connected
again after SIGCONT; its CPU/memory sparkline renders; a job that ends while the tab is hidden
sends a browser notification (Playwright grants the permission); on return the pane marks the
first line that is new since the user last looked, "First error" jumps to the Traceback, and
each line tells its arrival time on hover. Screenshots go to ``test-artifacts/``.

The hidden tab is emulated in the page (``document.hidden``/``visibilityState`` and a
``visibilitychange`` event): this Chromium keeps every Playwright page "visible" whatever is in
front of it (tried headless and headed under Xvfb: another page or tab brought to the front, a
minimised window, CDP ``Target.activateTarget``, focus emulation off), so nothing real hides it.
The ``Notification`` constructor is wrapped to record what the page sent; the real one still runs.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from ..conftest import agent_pid
from .lab_page import failure_shot, open_notebook, run_cell, run_first_cell, shot, wait_done

pytestmark = pytest.mark.slow

SPY = """
(() => {
  let hidden = false;
  Object.defineProperty(Document.prototype, "hidden", { get: () => hidden, configurable: true });
  Object.defineProperty(Document.prototype, "visibilityState", {
    get: () => (hidden ? "hidden" : "visible"), configurable: true,
  });
  window.__rxSetHidden = (h) => { hidden = h; document.dispatchEvent(new Event("visibilitychange")); };
  window.__rxNotes = [];
  const Real = window.Notification;
  if (!Real) return;
  class Recorded extends Real {
    constructor(title, options) {
      super(title, options);
      window.__rxNotes.push({ title, body: options && options.body });
    }
  }
  Object.defineProperty(Recorded, "permission", { get: () => Real.permission });
  Recorded.requestPermission = (...a) => Real.requestPermission(...a);
  window.Notification = Recorded;
})();
"""

LIVENESS_BOUND = 8.0  # the kernel's sandbox uses the default liveness


BURST = "i=0; while [ $i -lt 1000 ]; do i=$((i+1)); done"  # ~10 ms of a shell's arithmetic


def test_health_in_the_job_view(
    lab: tuple[str, Path],
    page: Any,
    fresh_agent_dir: Path,
    tmp_path: Path,
) -> None:
    gate = tmp_path / "gate"
    page.context.grant_permissions(["notifications"])
    page.add_init_script(SPY)
    script = (
        f"echo started; for i in $(seq 1 40); do echo line $i; done; "
        # Busy (a fifth of a core: the sparkline's points need CPU to show, and a full core taken
        # for the test's half minute slowed the rest of a 2-core CI) until the gate opens.
        f"( while [ ! -e {gate} ]; do {BURST}; sleep 0.04; done ) & wait; "
        "echo after the gate; echo 'Traceback (most recent call last):'; echo '  File x, line 1'; "
        "sleep 1; echo 'error: boom' >&2; exit 3"  # the rule's hit is counted by the poll of a later line
    )
    cells = [
        "import remote_exec as rx\nfrom remote_exec.jupyter import Dashboard, JobView\n"
        f"sb = rx.connect('local://?dir={fresh_agent_dir}')",
        "rule = rx.JobPolicy(on_output=[rx.WatchRule(pattern='^Traceback')])\n"
        f"view = JobView(sb.exec_remote(['bash', '-c', {script!r}], policy=rule), command='health demo')\n"
        "view.quiet_after = 2.0\nview",
        f"spin = sb.exec_remote(['sh', '-c', 'echo spinning; while :; do {BURST}; sleep 0.04; done'])\n"
        "dash = Dashboard(sb, known=[spin], interval=1.0)\ndash",
        "spin.kill(); dash.close()",
    ]
    with failure_shot(page, "browser-health"):
        open_notebook(page, lab, "health.ipynb", cells)
        run_first_cell(page)
        cell = run_cell(page, 1)
        wait_done(cell)
        job = cell.locator(".rx-job")
        job.locator(".rx-pane-stdout .rx-line", has_text=re.compile(r"^line 40\s*$")).wait_for()
        cell.locator(".rx-job[data-link='connected']").wait_for()

        # the sparkline: sampled while the view is on screen
        page.wait_for_function(
            "() => Number(document.querySelector('.rx-job .rx-spark-cpu')?.dataset.points || 0) >= 3",
            timeout=60_000,
        )
        points = job.locator(".rx-spark-cpu polyline").get_attribute("points") or ""
        assert len(points.split()) >= 3
        assert "%" in job.locator(".rx-usage-text").inner_text()
        # labelled, and its tooltip says the newest value, the peak and the time it covers
        assert job.locator(".rx-spark-label").all_inner_texts() == ["CPU", "MEM"]  # (CSS upper case)
        tip = job.locator(".rx-spark-cpu title").text_content() or ""
        assert re.fullmatch(r"CPU % of .*: \d+% now, peak \d+% over the last .+", tip), tip
        assert job.locator(".rx-quiet").inner_text().startswith("no output for")  # quiet, alive
        assert job.locator(".rx-link").inner_text() == "connected"
        shot(page, "browser-health-1-sparkline-quiet", cell)

        # a frozen agent: "agent not answering" within the bound, the job still "running"
        agent = agent_pid(fresh_agent_dir)
        assert agent is not None
        os.kill(agent, signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            cell.locator(".rx-job[data-link='lost']").wait_for(timeout=(LIVENESS_BOUND + 20) * 1000)
            took = time.monotonic() - t0
            print(f"\nbrowser: the JobView showed 'lost' {took:.2f} s after SIGSTOP (bound {LIVENESS_BOUND:g} s)")
            assert job.locator(".rx-link").inner_text() == "agent not answering"
            assert "heartbeat" in (job.locator(".rx-link").get_attribute("title") or "")
            assert job.get_attribute("data-state") == "running"
            assert job.locator(".rx-quiet").inner_text() == ""  # not "quiet": the agent is the problem
            shot(page, "browser-health-2-agent-lost", cell)
        finally:
            os.kill(agent, signal.SIGCONT)
        cell.locator(".rx-job[data-link='connected']").wait_for(timeout=60_000)
        shot(page, "browser-health-3-connected-again", cell)

        # the tab is hidden; the job fails meanwhile: a notification, and a mark on return
        page.evaluate("window.__rxSetHidden(true)")
        gate.touch()
        job.locator(".rx-badge", has_text="failed").wait_for()
        page.wait_for_function("() => window.__rxNotes.length >= 2")  # the end, and the rule's hit
        notes = page.evaluate("window.__rxNotes")
        titles = sorted(n["title"] for n in notes)
        assert titles == ["remote_exec: a watch rule fired (1)", "remote_exec: failed (exit 3)"], notes
        assert all("health demo" in n["body"] for n in notes)
        page.evaluate("window.__rxSetHidden(false)")
        mark = job.locator(".rx-pane-stdout .rx-new-since")
        mark.wait_for()
        assert mark.inner_text() == "after the gate"

        # "First error" scrolls to the Traceback; every line tells when it arrived
        job.locator(".rx-pane-stdout button", has_text="First error").click()
        first = job.locator(".rx-pane-stdout .rx-error-line")
        assert first.inner_text() == "Traceback (most recent call last):"
        assert (first.get_attribute("title") or "").startswith("arrived ")
        job.locator(".rx-pane-stderr button", has_text="First error").click()
        assert job.locator(".rx-pane-stderr .rx-error-line").inner_text() == "error: boom"
        assert job.locator(".rx-notify").is_hidden()  # permission granted: no need to ask
        shot(page, "browser-health-4-notified-marked-first-error", cell)

        # the dashboard: the sandbox's link above the table, CPU and memory of a running job
        cell = run_cell(page, 2)
        wait_done(cell)
        dash = cell.locator(".rx-dashboard")
        dash.locator(".rx-dash-link .rx-link[data-link='connected']").wait_for()
        row = dash.locator(".rx-dash-row[data-state='running']", has_text="spinning")
        usage = row.locator(".rx-dash-col-usage", has_text=re.compile(r"^\d+% · [\d.]+ (B|KiB|MiB)$"))
        usage.wait_for(timeout=60_000)
        box = usage.bounding_box()
        assert box is not None and box["width"] > 60  # a column of its own, not squeezed out
        shot(page, "browser-health-5-dashboard-usage", cell)
        wait_done(run_cell(page, 3))
