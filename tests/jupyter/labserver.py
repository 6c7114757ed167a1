"""JupyterLab for the browser tests: one server per xdist worker, a folder of its own per module.

A JupyterLab start costs 5-17 s of a loaded machine's CPU; the browser modules a worker runs
share one (``lab_server`` in ``conftest.py``). What a module had of a server of its own, it
keeps: its notebooks in a folder of its own (the same file name in two modules is two files),
workspaces named after it (a fresh page restores no other module's tabs), and at its end every
kernel and terminal shut down, as the end of its server did (the next module's "no kernels
left" is about its own). A module that needs the server's environment to be its own (a
variable its kernels must inherit) starts one with :func:`running_lab`, as
``test_browser_untrusted`` does.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..conftest import wait_for
from .lab_page import BASE_URL, LABEXTENSION, serving_jupyter

__all__ = ["LabServer", "running_lab"]

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class LabServer:
    """A running JupyterLab: ``base`` (its URL under :data:`BASE_URL`, no trailing slash), its
    ``token``, the ``notebooks`` dir it serves and its ``log`` (stdout and stderr)."""

    base: str
    token: str
    notebooks: Path
    log: Path

    def api(self, method: str, path: str) -> Any:
        """A call to the Jupyter Server's REST API; its JSON answer (None for an empty one)."""
        req = urllib.request.Request(f"{self.base}/api/{path}?token={self.token}", method=method)
        with urllib.request.urlopen(req, timeout=30) as r:
            body = r.read()
        return json.loads(body) if body else None

    @contextlib.contextmanager
    def folder(self, name: str) -> Iterator[tuple[str, Path]]:
        """What the browser tests call ``lab``: a URL template (``{workspace}``, ``{name}``: a
        notebook in the folder) and the folder ``name``, new; on the way out, every kernel and
        terminal of the server is shut down."""
        notebooks = self.notebooks / name
        notebooks.mkdir()
        # One workspace per notebook: a fresh page must not restore another test's open tabs.
        url = f"{self.base}/lab/workspaces/{name}-{{workspace}}/tree/{name}/{{name}}?token={self.token}"
        try:
            yield url, notebooks
        finally:
            self.shut_down_everything()

    def shut_down_everything(self) -> None:
        """Shut down every session's kernel, any other kernel and every terminal; wait until no
        kernel is left."""
        for session in self.api("GET", "sessions"):
            with contextlib.suppress(OSError):  # (gone meanwhile: 404)
                self.api("DELETE", f"sessions/{session['id']}")
        for kernel in self.api("GET", "kernels"):
            with contextlib.suppress(OSError):
                self.api("DELETE", f"kernels/{kernel['id']}")
        for terminal in self.api("GET", "terminals"):
            with contextlib.suppress(OSError):
                self.api("DELETE", f"terminals/{terminal['name']}")
        wait_for(lambda: not self.api("GET", "kernels"), timeout=60, what="the kernels to stop")


@contextlib.contextmanager
def running_lab(root: Path) -> Iterator[LabServer]:
    """JupyterLab on 127.0.0.1 under a base URL (as JupyterHub serves one: ``/user/<name>/``), with a
    token, a temp notebook dir and temp Jupyter dirs under ``root``; jupyter-server-proxy is
    enabled in it. Its kernels inherit this process's environment as it is now."""
    notebooks = root / "notebooks"
    notebooks.mkdir()
    # The checkout's prebuilt JupyterLab extension (labextension/built), found before any copy an
    # install left in the environment: what is tested is what is committed.
    ext = root / "jupyter" / "labextensions" / "remote-exec"
    ext.parent.mkdir(parents=True)
    ext.symlink_to(LABEXTENSION)
    token = secrets.token_hex(16)
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
    # The checkout's server extensions that the venv's install may predate (what is tested is committed).
    server_config = root / "config" / "jupyter_server_config.d"
    server_config.mkdir(parents=True)
    for name in ("remote_exec_controls.json",):
        shutil.copy(ROOT / "jupyter-config" / "server-config" / name, server_config / name)
    # No build check: each page load had the server run `node yarn.js config` (~0.5 s of CPU; 15 s
    # of a CI run's) to ask whether extensions need a rebuild, which a readonly lab never does.
    page_config = root / "config" / "labconfig" / "page_config.json"
    page_config.parent.mkdir(parents=True)
    page_config.write_text('{"buildCheck": false, "buildAvailable": false}')
    news = root / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text('{"fetchNews": "false", "checkForUpdates": false}')  # no pop-up over the cells
    log_path = root / "lab.log"
    log = log_path.open("wb")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--allow-root",
            "--LabApp.extension_manager=readonly",
            "--ServerApp.ip=127.0.0.1",
            "--ServerApp.port=0",  # its own pick (see serving_jupyter)
            f"--ServerApp.base_url={BASE_URL}",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={notebooks}",
            "--LabApp.news_url=",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        base = serving_jupyter(server, root / "runtime", token, log_path, BASE_URL)
        yield LabServer(base, token, notebooks, log_path)
    finally:
        server.terminate()
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
