"""The notebook face in a real browser: JupyterLab + Debian's Chromium driven by Playwright.

A ``%%exec_remote --bg`` cell shows a live JobView whose stdout and stderr panes fill; its Kill
button kills the job. A foreground cell streams into the cell and the toolbar's interrupt (■)
stops it and its job. Screenshots go to ``test-artifacts/``.

Skipped (with the reason) when Chromium or Playwright is missing, except under
``REMOTE_EXEC_REQUIRE_BACKENDS=1`` (CI), where that fails. ``.ci/setup-browser.sh`` installs it.
"""

from __future__ import annotations

import json
import re
import secrets
from pathlib import Path
from typing import Any

import pytest

from .conftest import gone, wait_for
from .lab_page import (
    BASE_URL,
    failure_shot,
    open_and_run,
    open_notebook,
    run_cell,
    run_first_cell,
    save_until,
    setup_cell,
    shot,
    wait_done,
)

pytestmark = pytest.mark.slow


def test_bg_widget_and_foreground_interrupt_in_jupyterlab(
    lab: tuple[str, Path], page: Any, agent_dir: Path, tmp_path: Path
) -> None:
    pid_file = tmp_path / "fg.pid"
    cells = [
        # the records' period shortened: the view must outlive many rewrites of its record
        f"%load_ext remote_exec\n%exec_remote_config --sandbox local://?dir={agent_dir}\n"
        "import remote_exec.jupyter.job_view as jv\njv.RECORD_PERIOD = 0.3",
        "%%exec_remote --bg\nprintf '\\033[32mgreen\\033[0m text\\n'\n"
        'for i in $(seq 1 2000); do echo "out line $i"; echo "err line $i" >&2; sleep 0.05; done',
        f"%%exec_remote\necho $$ > {pid_file}\necho fg-started\nsleep 300",
    ]
    with failure_shot(page, "browser-job"):
        open_notebook(page, lab, "job.ipynb", cells)
        run_first_cell(page)

        # --bg: a live job view; both panes fill while the kernel is free
        cell = run_cell(page, 1)
        wait_done(cell)
        job = cell.locator(".rx-job")
        job.locator(".rx-pane-stdout .rx-line", has_text=re.compile(r"^out line 20\s*$")).wait_for()
        job.locator(".rx-pane-stderr .rx-line", has_text=re.compile(r"^err line 20\s*$")).wait_for()
        assert job.locator(".rx-pane-stdout span.rx-fg-2").first.inner_text() == "green"  # ANSI colours
        assert job.locator(".rx-badge").inner_text().strip().lower() == "running"
        # The record is kept fresh beside the view (a draft), never by re-rendering the view:
        # the same element lives on while the record follows the job (seen in the saved file).
        job.evaluate("el => { el.dataset.rxMark = 'first'; }")
        job.locator(".rx-pane-stdout .rx-line", has_text=re.compile(r"^out line 60\s*$")).wait_for()
        draft_row = cell.locator(".jp-OutputArea-child:has(.rx-record-draft)")
        assert draft_row.count() == 1 and draft_row.bounding_box() is None  # takes no room
        save_until(page, lab[1] / "job.ipynb", lambda: saved_line(lab[1] / "job.ipynb", 1) >= 60)
        assert cell.locator(".rx-job").count() == 1 and job.get_attribute("data-rx-mark") == "first"
        shot(page, "browser-1-bg-running", cell)
        job.locator("button", has_text="Kill").click()
        job.locator(".rx-badge", has_text="killed").wait_for()
        assert job.get_attribute("data-state") == "killed"
        lines = job.locator(".rx-pane-stdout .rx-line:not(.rx-empty)").all_inner_texts()
        assert lines[0] == "green text" and lines[1] == "out line 1" and lines[-1].startswith("out line")
        shot(page, "browser-2-bg-killed", cell)

        # foreground: output streams into the cell; the toolbar's ■ interrupts the kernel
        cell = run_cell(page, 2)
        cell.locator(".jp-OutputArea-output", has_text="fg-started").wait_for()
        assert cell.locator(".rx-job .rx-pane-stderr").is_hidden()  # nothing on stderr: no empty pane
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the foreground job's pid")
        shot(page, "browser-3-fg-running", cell)
        interrupt = "[data-command='notebook:interrupt-kernel']"  # the toolbar's ■
        page.locator(f"jp-button{interrupt}, button{interrupt}").first.click()
        cell.locator(".jp-OutputArea-output", has_text="KeyboardInterrupt: the remote job was stopped").wait_for()
        assert gone(int(pid_file.read_text()))
        assert "SIGINT sent" in cell.locator(".jp-OutputArea").inner_text()
        shot(page, "browser-4-fg-interrupted", cell)


def saved_line(notebook: Path, index: int) -> int:
    """The newest ``out line N`` in the saved record of cell ``index`` (its one output), or 0."""
    try:
        outputs = json.loads(notebook.read_text())["cells"][index]["outputs"]
    except (OSError, ValueError, KeyError, IndexError):
        return 0
    if len(outputs) != 1:  # the view's output alone: its draft is never saved
        return 0
    plain = outputs[0]["data"].get("text/plain", "")
    plain = "".join(plain) if isinstance(plain, list) else plain  # a file keeps text as a list of lines
    return max(map(int, re.findall(r"out line (\d+)", plain)), default=0)


def test_dashboard_and_shell_view_in_jupyterlab(lab: tuple[str, Path], page: Any, agent_dir: Path) -> None:
    cells = [
        setup_cell(agent_dir),
        '%%exec_remote --bg --no-widget\nfor i in $(seq 1 3000); do echo "tick $i"; sleep 0.1; done',
        "%remote_jobs",
        "%remote_shell --shell new",  # the session view (alone, %remote_shell is a terminal)
    ]
    with failure_shot(page, "browser-dash"):
        open_notebook(page, lab, "dash.ipynb", cells)
        run_first_cell(page)
        wait_done(run_cell(page, 1))

        # the dashboard: the job's row with its last line; Open shows its JobView under the table
        cell = run_cell(page, 2)
        row = cell.locator(".rx-dash-row[data-state='running']", has_text="tick")
        row.wait_for()
        row.locator("button", has_text="Open").click()
        opened = cell.locator(".rx-dash-opened .rx-job")
        opened.locator(".rx-pane-stdout .rx-line", has_text="tick 1").first.wait_for()
        shot(page, "browser-5-dashboard-open", cell)
        row.locator("button", has_text="Kill").click()
        cell.locator(".rx-dash-row[data-state='killed']", has_text="tick").first.wait_for()
        opened.locator(".rx-badge", has_text="killed").wait_for()

        # the shell view: commands typed in, cwd in the prompt, stderr told apart, history
        cell = run_cell(page, 3)
        shell = cell.locator(".rx-shell")
        field = shell.locator("input.rx-shell-input")
        field.wait_for()
        field.fill("cd /tmp && X=5")
        field.press("Enter")
        shell.locator(".rx-shell-prompt", has_text="/tmp$").wait_for()
        field.fill("echo out $X; echo oops >&2")
        field.press("Enter")
        shell.locator(".rx-kind-stdout", has_text=re.compile(r"^out 5\s*$")).wait_for()
        shell.locator(".rx-kind-stderr", has_text="oops").wait_for()
        field.press("ArrowUp")
        assert field.input_value() == "echo out $X; echo oops >&2"
        shot(page, "browser-6-shell", cell)


def test_forwarded_port_opens_through_the_servers_proxy(
    lab: tuple[str, Path], page: Any, agent_dir: Path, tmp_path: Path
) -> None:
    """``IFrame(fwd.browser_url)``: the frame loads the sandbox's page through jupyter-server-proxy
    under the server's base URL (what works on Binder and JupyterHub), not from 127.0.0.1."""
    token = secrets.token_hex(8)
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text(
        f'<html><body><h1 id="rx-forwarded">served in the sandbox {token}</h1></body></html>'
    )
    cells = [
        f"import re, sys\nimport remote_exec as rx\nfrom IPython.display import IFrame\n"
        f"sb = rx.connect('local://?dir={agent_dir}')",
        # a web server in the sandbox, on a port of its own; the notebook opens it through the tunnel
        f"srv = sb.exec_remote([sys.executable, '-u', '-m', 'http.server', '0', '--bind', '127.0.0.1', "
        f"'--directory', '{site}'])\n"
        "out = ''\n"
        "for ev in srv:\n"
        "    out += getattr(ev, 'data', '')\n"
        "    if found := re.search(r'port (\\d+)', out):\n"
        "        break\n"
        "fwd = sb.forward_port(int(found.group(1)))\n"
        "print('local', fwd.url, 'browser', fwd.browser_url)\n"
        "IFrame(fwd.browser_url, width=700, height=160)",
        "fwd.close(); srv.kill(); sb.close()",
    ]
    with failure_shot(page, "browser-port"):
        cell = open_and_run(page, lab, "port.ipynb", cells)
        src = cell.locator("iframe").get_attribute("src")
        assert src is not None and re.fullmatch(rf"{BASE_URL}proxy/\d+/", src), src
        printed = cell.locator(".jp-OutputArea-output").first.inner_text()
        assert re.search(rf"local http://127\.0\.0\.1:(\d+) browser {BASE_URL}proxy/\1/", printed), printed
        heading = cell.frame_locator("iframe").locator("#rx-forwarded")
        heading.wait_for()
        assert heading.inner_text() == f"served in the sandbox {token}"
        # the frame's document came from the Jupyter server's origin and path, through its proxy
        frame = next(f for f in page.frames if "/proxy/" in f.url)
        assert frame.url.startswith(page.url.split("/user/")[0] + f"{BASE_URL}proxy/"), frame.url
        shot(page, "browser-7-forwarded-port-proxied", cell)
        wait_done(run_cell(page, 2))


def test_a_foreground_flood_ends_capped_without_the_iopub_warning(
    lab: tuple[str, Path], page: Any, agent_dir: Path
) -> None:
    """``%%exec_remote seq 1 2000000``: a live view showing the newest lines and an explicit "N lines
    hidden", never Jupyter's "IOPub data rate exceeded"; Copy gets all 2 M lines and says so."""
    n = 2_000_000
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    cells = [
        setup_cell(agent_dir),
        f"%%exec_remote\nseq 1 {n}",
        "print('next cell ran')",
    ]
    with failure_shot(page, "browser-flood"):
        cell = open_and_run(page, lab, "flood.ipynb", cells)
        job = cell.locator(".rx-job")
        job.locator(".rx-badge", has_text="completed").wait_for()
        pane = job.locator(".rx-pane-stdout")
        pane.locator(".rx-line", has_text=re.compile(rf"^{n}$")).wait_for()
        hidden_text = pane.locator(".rx-hidden").inner_text()
        found = re.fullmatch(r"([\d,]+) lines hidden", hidden_text.strip())
        assert found, hidden_text
        shown = pane.locator(".rx-line:not(.rx-empty)").all_inner_texts()
        hidden = int(found.group(1).replace(",", ""))
        assert hidden + len(shown) == n and shown[-1] == str(n) and shown[0] == str(hidden + 1)
        assert job.locator(".rx-job-command").inner_text() == f"seq 1 {n}"  # one line: no " …"
        wait_done(run_cell(page, 2))
        notebook_text = page.locator(".jp-NotebookPanel:visible .jp-Notebook").inner_text()
        assert "IOPub data rate exceeded" not in notebook_text and "next cell ran" in notebook_text
        # the full output is one click away, and the click says it worked
        copy = pane.locator("button", has_text="Copy")
        copy.click()
        # (the "Copied ✓ (N lines)" flash lasts 1.5 s: a loaded machine's page can pass it by)
        pane.locator(f"button[data-copied='{n}']").wait_for()
        copied = page.evaluate("navigator.clipboard.readText()")
        assert copied.count("\n") == n and copied.endswith(f"\n{n}\n")
        shot(page, "browser-8-foreground-flood-capped", cell)
        # Earlier lines come above the held ones, a press at a time (from the kernel's copy),
        # and the find box finds among them.
        pane.locator("button.rx-earlier").click()
        pane.locator(".rx-line", has_text=re.compile(rf"^{hidden - 1999}$")).wait_for()
        assert pane.locator(".rx-hidden").inner_text().strip() == f"{hidden - 2000:,} lines hidden"
        find = pane.locator("input.rx-find-input")
        find.fill(str(hidden - 1500))
        find.press("Enter")
        pane.locator(".rx-line.rx-match-current", has_text=re.compile(rf"^{hidden - 1500}$")).wait_for()
        assert pane.locator(".rx-find-count").inner_text() == "1/1"
        shot(page, "browser-8b-flood-earlier-and-find", cell)


def test_an_800px_window_keeps_a_job_views_controls_inside_and_says_its_name_and_end(
    lab: tuple[str, Path], page: Any, agent_dir: Path
) -> None:
    """Issue #23 points 5 and 7: at 800 px the header wraps (Interrupt and Kill inside the output
    area, clickable), the name and the script's first meaningful line lead it, and the end is
    told in words."""
    page.set_viewport_size({"width": 800, "height": 1000})
    cells = [
        setup_cell(agent_dir),
        "%%exec_remote --bg --name training_run_with_a_long_name\n# the model\nset -e\n"
        "echo started; for i in $(seq 1 300); do sleep 1; done  # a long line of a long-running job",
    ]
    with failure_shot(page, "browser-800px"):
        cell = open_and_run(page, lab, "narrow.ipynb", cells)
        job = cell.locator(".rx-job")
        job.locator(".rx-pane-stdout .rx-line", has_text="started").wait_for()
        assert job.locator(".rx-job-command").inner_text().startswith("training_run_with_a_long_name · echo started")
        area = job.bounding_box()
        assert area is not None
        for name in ("Interrupt", "Kill"):
            box = job.locator("button", has_text=name).bounding_box()
            assert box is not None, name
            assert area["x"] <= box["x"] and box["x"] + box["width"] <= area["x"] + area["width"], name
        assert job.locator(".rx-pane-stderr").is_hidden()  # nothing on stderr: no empty pane
        shot(page, "browser-800px-job-view", cell)
        job.locator("button", has_text="Kill").click()
        job.locator(".rx-badge", has_text="killed").wait_for()
        wait_for(lambda: "killed (SIGTERM)" in job.locator(".rx-job-meta").inner_text(), what="the end in words")
        shot(page, "browser-800px-killed", cell)


# WCAG's contrast ratio of an element's text colour against the first background behind it.
CONTRAST = """(el) => {
  // rgb(r, g, b[, a]) in 0-255, or color(srgb r g b[ / a]) in 0-1 (what color-mix() computes to)
  const rgba = (s) => {
    const v = (s.match(/[\\d.]+/g) || []).map(Number);
    return s.startsWith("color(srgb") ? v.map((x, i) => (i < 3 ? x * 255 : x)) : v;
  };
  const lum = ([r, g, b]) => {
    const f = (c) => ((c /= 255) <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4);
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  };
  let bg = [255, 255, 255];
  for (let n = el; n; n = n.parentElement) {
    const c = rgba(getComputedStyle(n).backgroundColor);
    if (c.length === 3 || (c.length === 4 && c[3] > 0.5)) { bg = c; break; }
  }
  const [hi, lo] = [lum(rgba(getComputedStyle(el).color)), lum(bg)].sort((x, y) => y - x);
  return (hi + 0.05) / (lo + 0.05);
}"""


def _use_theme(page: Any, theme: str, light: bool) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text="Settings").click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Theme$")).hover()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(rf"^{theme}$")).click()
    page.wait_for_function(f"document.body.dataset.jpThemeLight === '{str(light).lower()}'")
    page.locator("#jupyterlab-splash").wait_for(state="detached")  # the theme's styles are in


def test_the_dark_theme_keeps_the_job_views_text_readable(lab: tuple[str, Path], page: Any, agent_dir: Path) -> None:
    """Issue #23 point 7: in JupyterLab Dark, "stderr", its lines, the end and the header are
    readable (contrast >= 3, WCAG's floor for large text; the fixed dark red was 2.3)."""
    cells = [
        setup_cell(agent_dir),
        "%%exec_remote --no-raise-error\necho to stdout; echo an error line >&2; exit 3",
    ]
    with failure_shot(page, "browser-dark"):
        open_notebook(page, lab, "dark.ipynb", cells)
        run_first_cell(page)
        _use_theme(page, "JupyterLab Dark", light=False)
        try:
            cell = run_cell(page, 1)
            wait_done(cell)
            job = cell.locator(".rx-job")
            job.locator(".rx-pane-stderr .rx-line", has_text="an error line").wait_for()
            shot(page, "browser-dark-theme", cell)
            for part in (".rx-pane-stderr .rx-pane-title strong", ".rx-pane-stderr .rx-line", ".rx-job-meta"):
                ratio = job.locator(part).first.evaluate(CONTRAST)
                assert ratio >= 3, (part, ratio)
        finally:
            _use_theme(page, "JupyterLab Light", light=True)  # the lab's settings outlive this test


def test_a_merged_view_shows_one_pane_with_stderr_in_its_colour(
    lab: tuple[str, Path], page: Any, agent_dir: Path
) -> None:
    cells = [
        setup_cell(agent_dir),
        "%%exec_remote --merged --no-raise-error\necho to stdout; echo an error line >&2; exit 3",
    ]
    with failure_shot(page, "browser-merged"):
        cell = open_and_run(page, lab, "merged.ipynb", cells)
        job = cell.locator(".rx-job")
        pane = job.locator(".rx-pane-stdout")
        pane.locator(".rx-line .rx-kind-stderr", has_text="an error line").wait_for()
        assert pane.locator(".rx-pane-title strong").inner_text() == "output"
        assert pane.locator(".rx-line:not(.rx-empty)").all_inner_texts() == ["to stdout", "an error line"]
        assert job.locator(".rx-pane-stderr").is_hidden()
        colour = "e => getComputedStyle(e).color"
        out, err = (pane.locator(f".rx-kind-{s}").first.evaluate(colour) for s in ("stdout", "stderr"))
        assert out != err  # stderr in its colour
        shot(page, "browser-merged-view", cell)
