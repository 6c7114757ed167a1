"""The terminal widget in a real browser: JupyterLab + Debian's Chromium, driven by Playwright.

``%%exec_remote --tty ls --color=always`` draws coloured cells (read from xterm.js's buffer);
``%remote_shell`` is an interactive shell whose keystrokes come from the page's keyboard: it
answers a ``read`` prompt, shows the same screen in a second view (``%exec_remote_attach``) where
keys typed reach the same shell, copies its selection, edits a file in ``vim`` (checked through the sandbox API), runs
``top`` full-screen, and follows the window when it narrows (``stty size``); a ``--bg --stdin``
cell's JobView takes lines in its input line and closes stdin on Ctrl+D. Screenshots go to
``test-artifacts/terminal-*.png``. Skipped like ``test_browser.py`` when there is no browser.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

import remote_exec as rx

from .conftest import wait_for
from .lab_page import failure_shot, open_and_run, open_notebook, run_cell, run_first_cell, setup_cell, shot, wait_done
from .labserver import LabServer

pytestmark = pytest.mark.slow

SCREEN = ".rx-term-screen"

# The terminal's buffer as text lines (what xterm.js holds, not pixels), and one cell's colours.
SCREEN_LINES = """el => {
  const t = el.rxTerminal, b = t.buffer.active, out = [];
  for (let y = 0; y < b.length; y++) out.push(b.getLine(y).translateToString(true));
  return out;
}"""
CELL_STYLE = """(el, [y, x]) => {
  const c = el.rxTerminal.buffer.active.getLine(y).getCell(x);
  return {palette: c.isFgPalette() ? c.getFgColor() : null, bold: c.isBold() !== 0, chars: c.getChars()};
}"""


def lines(term: Any) -> list[str]:
    return list(term.evaluate(SCREEN_LINES))


def wait_screen(term: Any, pattern: str, timeout: float = 60.0, *, last: bool = False) -> re.Match[str]:
    """Wait until a line of the terminal's buffer (``last``: its last non-empty line, where the
    cursor is) matches ``pattern``; returns the match."""
    deadline = time.monotonic() + timeout
    while True:
        shown = [line for line in lines(term) if line.strip()]
        for line in shown[-1:] if last else shown:
            if found := re.search(pattern, line):
                return found
        if time.monotonic() > deadline:
            raise AssertionError(f"no line matching {pattern!r} in the terminal:\n" + "\n".join(lines(term)))
        term.page.wait_for_timeout(50)  # polling the page's state; the event is the text appearing


def type_line(page: Any, text: str) -> None:
    page.keyboard.type(text)
    page.keyboard.press("Enter")


def test_the_terminal_widget_runs_colours_a_prompt_vim_top_and_resizes(
    lab: tuple[str, Path], lab_server: LabServer, page: Any, agent_dir: Path, tmp_path: Path
) -> None:
    listing = tmp_path / "listing"
    (listing / "subdir").mkdir(parents=True)
    (listing / "run.sh").write_text("#!/bin/sh\n")
    (listing / "run.sh").chmod(0o755)
    edited = tmp_path / "edited.txt"
    cells = [
        setup_cell(agent_dir),
        f"%%exec_remote --tty\nls --color=always {listing}",
        "%remote_shell",
        '%%exec_remote --bg --stdin\nread -r name; echo "hello $name"; cat; echo "stdin closed"',
        "%exec_remote_attach %remote_shell",  # the shell's job, by its label: a second view of it
    ]
    with failure_shot(page, "terminal"):
        open_notebook(page, lab, "terminal.ipynb", cells)
        run_first_cell(page)

        # colours: ls in a PTY, its SGR codes drawn as coloured cells
        cell = run_cell(page, 1)
        wait_done(cell)
        term = cell.locator(SCREEN)
        found = wait_screen(term, r"run\.sh")
        y = next(i for i, line in enumerate(lines(term)) if "subdir" in line)
        x = lines(term)[y].index("subdir")
        assert term.evaluate(CELL_STYLE, [y, x]) == {"palette": 4, "bold": True, "chars": "s"}  # 01;34: directory
        x = lines(term)[y].index("run.sh")
        assert term.evaluate(CELL_STYLE, [y, x])["palette"] == 2  # 01;32: executable
        assert found and cell.locator(".rx-badge", has_text="completed").count() == 1
        # finished: the terminal takes the rows its screen uses (the listing, the cursor's), not 24
        wait_for(lambda: term.evaluate("e => e.rxTerminal.rows") == 2, what="the finished terminal shrunk")
        assert "run.sh" in lines(term)[0]  # still in view
        shot(page, "terminal-1-ls-colours", cell)

        # an interactive shell: a read prompt answered from the keyboard
        cell = run_cell(page, 2)
        wait_done(cell)
        term = cell.locator(SCREEN)
        term.locator(".xterm-screen").click()
        type_line(page, "PS1='rx$ '")
        wait_screen(term, r"^rx\$ $", last=True)
        type_line(page, 'read -p "name? " n; echo "hello $n"')
        wait_screen(term, r"^name\? $")
        type_line(page, "Ada")
        wait_screen(term, r"^hello Ada$")
        shot(page, "terminal-2-read-prompt", cell)

        # a second view of the same terminal replays its screen, then both follow and both type
        second = run_cell(page, 4)
        wait_done(second)
        other = second.locator(SCREEN)
        wait_screen(other, r"^hello Ada$")
        other.locator(".xterm-screen").click()
        type_line(page, "echo typed-in-the-second")
        wait_screen(term, r"^typed-in-the-second$")
        wait_screen(other, r"^typed-in-the-second$")
        shot(page, "terminal-2b-second-view", second)

        # copy: the selection through the Copy button, onto the clipboard
        page.context.grant_permissions(["clipboard-read", "clipboard-write"])
        term.evaluate("el => el.rxTerminal.selectAll()")
        cell.locator(".rx-term button", has_text="Copy").click()
        cell.locator(".rx-term button", has_text="Copied").wait_for()
        assert "hello Ada" in page.evaluate("navigator.clipboard.readText()")
        term.locator(".xterm-screen").click()

        # vim: insert text, :wq; the file is checked through the sandbox API
        type_line(page, f"vim -u NONE -N -n {edited}")
        wait_screen(term, r"^~\s*$")
        page.keyboard.press("i")
        wait_screen(term, r"-- INSERT --")

        page.keyboard.type("written in vim")
        shot(page, "terminal-3-vim", cell)
        page.keyboard.press("Escape")
        type_line(page, ":wq")
        wait_screen(term, r"^rx\$ $", last=True)
        with rx.connect(f"local://?dir={agent_dir}") as sb:
            assert sb.run(["cat", str(edited)]).stdout == "written in vim\n"

        # top, full-screen: its header drawn, then q gives the shell back
        type_line(page, "top -d 1")
        wait_screen(term, r"^Tasks: +\d+ total")
        wait_screen(term, r"load average")
        shot(page, "terminal-4-top", cell)
        page.keyboard.press("q")
        wait_screen(term, r"^rx\$ $", last=True)

        # the width follows the window: stty size before and after it narrows
        type_line(page, 'echo "size-0 $(stty size)"')
        wide = int(wait_screen(term, r"^size-0 24 (\d+)$").group(1))
        page.set_viewport_size({"width": 900, "height": 1000})
        deadline = time.monotonic() + 60
        for i in range(1, 1000):  # ask again (each answered) until the PTY has the narrower size
            type_line(page, f'echo "size-{i} $(stty size)"')
            narrow = int(wait_screen(term, rf"^size-{i} 24 (\d+)$").group(1))
            if narrow < wide or time.monotonic() > deadline:
                break
        assert narrow < wide - 20, (wide, narrow)
        shot(page, "terminal-5-narrowed", cell)
        type_line(page, "exit")
        cell.locator(".rx-badge", has_text="completed").wait_for()

        # a plain job's stdin: the JobView's input line sends lines; Ctrl+D closes it
        cell = run_cell(page, 3)
        wait_done(cell)
        field = cell.locator("input.rx-job-stdin-input")
        field.fill("Ada")
        field.press("Enter")
        cell.locator(".rx-pane-stdout .rx-line", has_text="hello Ada").wait_for()
        field.fill("for cat")
        field.press("Enter")
        # each line typed is echoed where its answer comes (styled apart), then cat's copy
        typed = cell.locator(".rx-pane-stdout .rx-line", has_text="for cat")
        typed.nth(1).wait_for()  # the echo, then cat's copy
        assert typed.count() == 2 and typed.first.locator(".rx-kind-stdin").count() == 1
        assert typed.nth(1).locator(".rx-kind-stdin").count() == 0
        assert cell.locator(".rx-pane-stdout .rx-line").first.inner_text() == "Ada"
        shot(page, "terminal-6-jobview-stdin", cell)
        field.press("Control+d")
        cell.locator(".rx-pane-stdout .rx-line", has_text="stdin closed").wait_for()
        cell.locator(".rx-badge", has_text="completed").wait_for()
        assert cell.locator(".rx-job-stdin").is_hidden()
    # the server extension the wheel enables (kernel websockets without Nagle's ~40 ms wait)
    assert "kernel websockets send small messages at once" in lab_server.log.read_text()


def test_a_tty_cell_keeps_its_terminal_and_focus_while_it_runs(
    lab: tuple[str, Path], page: Any, agent_dir: Path
) -> None:
    """A running view's stored record is not rewritten (each rewrite renders the view anew)."""
    cells = [
        setup_cell(agent_dir),
        '%%exec_remote --tty\nfor i in 1 2 3 4 5 6 7; do read -r -p "line $i? " x; echo "got $x"; done',
    ]
    with failure_shot(page, "terminal-focus"):
        cell = open_and_run(page, lab, "focus.ipynb", cells)
        term = cell.locator(SCREEN)
        wait_screen(term, r"^line 1\? $", last=True)
        term.locator(".xterm-screen").click()
        started = time.monotonic()
        for i in range(1, 8):  # 7 answers over more than RECORD_PERIOD (5 s)
            type_line(page, f"answer-{i}")
            wait_screen(term, rf"^got answer-{i}$")
            page.wait_for_timeout(1000)  # paced like a person: the seconds are what is tested
        assert time.monotonic() - started > 6
        cell.locator(".rx-badge", has_text="completed").wait_for()
        assert cell.locator(SCREEN).count() == 1
