"""The notebook face in a real browser: JupyterLab + Debian's Chromium driven by Playwright.

A ``%%exec_remote --bg`` cell shows a live JobView whose stdout and stderr panes fill; its Kill
button kills the job. A foreground cell streams into the cell and the toolbar's interrupt (■)
stops it and its job. Screenshots go to ``test-artifacts/``.

Skipped (with the reason) when Chromium or Playwright is missing, except under
``REMOTE_EXEC_REQUIRE_BACKENDS=1`` (CI), where that fails. ``.ci/setup-browser.sh`` installs it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest

from .conftest import gone, wait_for

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
LABEXTENSION = Path(__file__).resolve().parents[2] / "labextension" / "built"
CELLS = ".jp-NotebookPanel:visible .jp-Notebook .jp-Cell"  # of the notebook on screen
BASE_URL = "/user/rx-test/"  # the kernel must find it: forwarded ports go through <base>proxy/<port>/
BROWSER_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def unavailable(reason: str) -> None:
    if os.environ.get("REMOTE_EXEC_REQUIRE_BACKENDS") == "1":
        pytest.fail(f"browser test required but cannot run: {reason}")
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """JupyterLab on 127.0.0.1 under a base URL (as JupyterHub serves one: ``/user/<name>/``), with a
    token, a temp notebook dir and temp Jupyter dirs; jupyter-server-proxy is enabled in it."""
    if not CHROMIUM.exists():
        unavailable(f"{CHROMIUM} is missing (run .ci/setup-browser.sh)")
    try:
        import jupyterlab  # noqa: F401
        import playwright  # noqa: F401
    except ImportError as exc:
        unavailable(f"{exc.name} is not installed (pip install -e '.[test]')")
    root = tmp_path_factory.mktemp("lab")
    notebooks = root / "notebooks"
    notebooks.mkdir()
    # The checkout's prebuilt JupyterLab extension (labextension/built), found before any copy an
    # install left in the environment: what is tested is what is committed.
    ext = root / "jupyter" / "labextensions" / "remote-exec"
    ext.parent.mkdir(parents=True)
    ext.symlink_to(LABEXTENSION)
    port, token = free_port(), secrets.token_hex(16)
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(root / "config"),
        "JUPYTER_PATH": os.pathsep.join(p for p in (str(root / "jupyter"), os.environ.get("JUPYTER_PATH")) if p),
        "JUPYTER_RUNTIME_DIR": str(root / "runtime"),
        "IPYTHONDIR": str(root / "ipython"),
        "JUPYTERLAB_SETTINGS_DIR": str(root / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(root / "workspaces"),
    }
    env.pop("REMOTE_EXEC_NONINTERACTIVE", None)  # the kernel detects its front end itself
    news = root / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text('{"fetchNews": "false", "checkForUpdates": false}')  # no pop-up over the cells
    log = (root / "lab.log").open("wb")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--allow-root",
            "--LabApp.extension_manager=readonly",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}",
            f"--ServerApp.base_url={BASE_URL}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={notebooks}",
            "--LabApp.news_url=",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}{BASE_URL.rstrip('/')}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as r:
                    json.load(r)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        "JupyterLab did not start: " + (root / "lab.log").read_text()[-3000:]
                    ) from None
                time.sleep(0.3)
        # One workspace per notebook: a fresh page must not restore another test's open tabs.
        yield f"{base}/lab/workspaces/{{workspace}}/tree/{{name}}?token={token}", notebooks
    finally:
        server.terminate()
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


@pytest.fixture(scope="module")
def browser(lab: tuple[str, Path]) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=BROWSER_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser context per test: its own JupyterLab page, one notebook in it."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    pg.set_default_timeout(60_000)
    yield pg
    context.close()


def shot(page: Any, name: str, cell: Any = None) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    if cell is not None:
        cell.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def run_cell(page: Any, index: int) -> Any:
    """Click into cell ``index``, run it with Shift+Enter; return the cell's locator."""
    cell = page.locator(CELLS).nth(index)
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")
    return cell


def run_first_cell(page: Any) -> None:
    """Run cell 0 (the set-up) and wait for ``[1]``; press again if the first press was lost.

    A run requested while the page is still connecting to the new kernel can vanish; the
    set-up cell is idempotent, so asking again is safe.
    """
    for attempt in range(3):
        cell = run_cell(page, 0)
        try:
            cell.locator(".jp-InputPrompt", has_text=re.compile(r"\[[1-9*]")).wait_for(timeout=15_000)
            break
        except Exception:
            if attempt == 2:
                raise
    wait_done(cell)


def wait_done(cell: Any) -> None:
    """Wait until the cell shows ``[N]:`` (it has finished running)."""
    cell.locator(".jp-InputPrompt", has_text=re.compile(r"\[\d+\]")).wait_for()


@contextlib.contextmanager
def failure_shot(page: Any, name: str) -> Iterator[None]:
    """On failure, keep what the page looked like (PNG and HTML) next to the other screenshots."""
    try:
        yield
    except BaseException:
        shot(page, f"{name}-failure")
        (ARTIFACTS / f"{name}-failure.html").write_text(page.content())
        raise


def open_notebook(page: Any, lab: tuple[str, Path], name: str, cells: list[str]) -> None:
    url, notebooks = lab
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nbformat.write(nb, notebooks / name)
    page.goto(url.format(workspace=Path(name).stem, name=name))
    page.locator(CELLS).first.wait_for()
    # The toolbar's indicator says "idle" before a kernel exists; the status bar names the kernel.
    page.locator(".jp-StatusBar-TextItem", has_text="(ipykernel) | Idle").wait_for(timeout=90_000)


def test_bg_widget_and_foreground_interrupt_in_jupyterlab(
    lab: tuple[str, Path], page: Any, agent_dir: Path, tmp_path: Path
) -> None:
    pid_file = tmp_path / "fg.pid"
    cells = [
        f"%load_ext remote_exec\n%exec_remote_config --sandbox local://?dir={agent_dir}",
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
        job.locator(".rx-pane-stdout .rx-line", has_text="out line 20").wait_for()
        job.locator(".rx-pane-stderr .rx-line", has_text="err line 20").wait_for()
        assert job.locator(".rx-pane-stdout span.rx-fg-2").first.inner_text() == "green"  # ANSI colours
        assert job.locator(".rx-badge").inner_text().strip().lower() == "running"
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
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the foreground job's pid")
        shot(page, "browser-3-fg-running", cell)
        interrupt = "[data-command='notebook:interrupt-kernel']"  # the toolbar's ■
        page.locator(f"jp-button{interrupt}, button{interrupt}").first.click()
        cell.locator(".jp-OutputArea-output", has_text="KeyboardInterrupt: the remote job was stopped").wait_for()
        assert gone(int(pid_file.read_text()))
        assert "SIGINT sent" in cell.locator(".jp-OutputArea").inner_text()
        shot(page, "browser-4-fg-interrupted", cell)


def test_dashboard_and_shell_view_in_jupyterlab(lab: tuple[str, Path], page: Any, agent_dir: Path) -> None:
    cells = [
        f"%load_ext remote_exec\n%exec_remote_config --sandbox local://?dir={agent_dir}",
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
        shell.locator(".rx-kind-stdout", has_text="out 5").wait_for()
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
        open_notebook(page, lab, "port.ipynb", cells)
        run_first_cell(page)
        cell = run_cell(page, 1)
        wait_done(cell)
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
        f"%load_ext remote_exec\n%exec_remote_config --sandbox local://?dir={agent_dir}",
        f"%%exec_remote\nseq 1 {n}",
        "print('next cell ran')",
    ]
    with failure_shot(page, "browser-flood"):
        open_notebook(page, lab, "flood.ipynb", cells)
        run_first_cell(page)
        cell = run_cell(page, 1)
        wait_done(cell)
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
        pane.locator("button", has_text=f"Copied ✓ ({n:,} lines)").wait_for()
        copied = page.evaluate("navigator.clipboard.readText()")
        assert copied.count("\n") == n and copied.endswith(f"\n{n}\n")
        shot(page, "browser-8-foreground-flood-capped", cell)
