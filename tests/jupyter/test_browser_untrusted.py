"""A stranger's notebook in JupyterLab + Chromium: its saved records cannot run a host program or
create a container with a click (issue #21, point 2).

The notebook is written straight to disk (not signed by this server: untrusted, as a downloaded
one is), with job records as the saver stores them, whose sandbox URLs would run a script shipped
beside the notebook (``k8s://ns/pod?kubectl=./run-me``) and start a container with the host's
root mounted (``docker+image://IMG?volume=/:/host``, against the suite's private dockerd). The
test clicks whatever the extension shows on each record, then has the kernel run a later cell
(requests run in order: anything a click asked for has run by then) and checks that the script
wrote no marker, dockerd holds no new container, and remote_exec was never even imported in the
kernel. A record on the one-click list (``local://``) still offers its button.

Screenshots go to ``test-artifacts/``.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest

from remote_exec.jupyter.record import JobRecord
from remote_exec.jupyter.saving import RECORD_META, RECORD_MIME, saved_record

from .conftest import require_browser
from .lab_page import CELLS, failure_shot, kernel_idle, shot, wait_done
from .labserver import running_lab

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def docker_host() -> Iterator[str | None]:
    """The suite's private dockerd, started before ``lab`` so the kernel inherits its
    ``DOCKER_HOST`` (autouse: set up first in this module); ``None`` where Docker cannot run."""
    from ..sandboxes.dockerd import DockerUnavailable, shared_dockerd, usr_image

    try:
        engine = shared_dockerd()
        usr_image(engine)  # an image the record names exists: a click would start a container
    except DockerUnavailable:
        yield None
        return
    yield engine.host


@pytest.fixture(scope="module")
def lab(docker_host: str | None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A JupyterLab of this module's own, started after ``docker_host``: its kernels inherit
    ``DOCKER_HOST`` from the server's start, which the worker's shared one (``lab_server``) may
    have been started without."""
    require_browser()
    with running_lab(tmp_path_factory.mktemp("lab")) as server, server.folder("untrusted") as folder:
        yield folder


def created_since(host: str, since: float) -> list[str]:
    """The containers dockerd created since ``since`` (its event log: one started and removed
    again, as a failed sandbox open does, counts too)."""
    window = ["--since", f"{since:.3f}", "--until", f"{time.time():.3f}"]
    only = ["--filter", "type=container", "--filter", "event=create", "--format", "{{.Actor.ID}}"]
    out = subprocess.run(
        ["docker", "events", *window, *only],
        env={**os.environ, "DOCKER_HOST": host},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return out.stdout.split()


def record_output(job_id: str, url: str) -> dict[str, Any]:
    """A job's output as the saver stores it: the record's text, HTML and bundle."""
    record = JobRecord(job_id, "python train.py", url, "running", None, 42.0, ("epoch 3\n", 0), ("", 0))
    html = record.html()
    bundle = saved_record({"job_id": job_id, "state": "running", "sandbox": url, "label": "python train.py"}, html)
    assert bundle is not None
    data = {"text/plain": record.plain(), "text/html": html, RECORD_MIME: bundle}
    meta = {RECORD_META: {"job_id": job_id, "state": "running", "sandbox": url, "label": "python train.py"}}
    output: dict[str, Any] = nbformat.v4.new_output("display_data", data=data, metadata=meta)
    return output


def test_a_strangers_records_run_no_host_program_and_create_no_container(
    lab: tuple[str, Path], page: Any, docker_host: str | None
) -> None:
    url, notebooks = lab
    marker = notebooks / "ran-me"
    script = notebooks / "run-me"  # shipped beside the notebook, as in a cloned repository
    script.write_text(f"#!/bin/sh\ntouch {shlex.quote(str(marker))}\nexit 1\n")
    script.chmod(0o755)
    records = [
        ("train-0042", "k8s://ns/pod?kubectl=./run-me"),
        ("train-0043", "docker+image://rx-test/usr:1?volume=/:/host"),
        ("train-0044", "local://"),
    ]
    cells = []
    for job_id, sandbox in records:
        cell = nbformat.v4.new_code_cell(f"%%exec_remote --bg --name job\npython train.py  # {job_id}")
        cell.outputs = [record_output(job_id, sandbox)]
        cells.append(cell)
    cells.append(
        nbformat.v4.new_code_cell(
            'import os, sys; print("imported:", "remote_exec" in sys.modules, os.environ.get("DOCKER_HOST"))'
        )
    )
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    name = "stranger.ipynb"
    nbformat.write(nb, notebooks / name)  # unsigned: JupyterLab opens it untrusted
    since = time.time()

    with failure_shot(page, "browser-untrusted"):
        page.goto(url.format(workspace="stranger", name=name))
        kernel_idle(page)
        on_screen = page.locator(CELLS)
        for i in range(2):
            # click what the extension shows: a button if it offered one (it must not), else the hint
            shown = on_screen.nth(i).locator(".rx-record-bar button:visible, .rx-record-bar .rx-record-hint:visible")
            shown.first.click()

        # a later request: the kernel runs requests in order, so any click's code has run by now
        last = on_screen.nth(3)
        last.locator(".jp-InputArea-editor").click()
        page.keyboard.press("Shift+Enter")
        wait_done(last)
        assert not marker.exists()  # kubectl=./run-me never ran
        if docker_host:
            assert created_since(docker_host, since) == []  # no container created
        # not even imported; and the kernel reaches the private dockerd, where a click would have run
        assert last.locator(".jp-OutputArea-output").inner_text().strip() == f"imported: False {docker_host}"
        shot(page, "browser-untrusted-1-nothing-ran", last)

        for i, (job_id, sandbox) in enumerate(records[:2]):
            bar = on_screen.nth(i).locator(".rx-record .rx-record-bar")
            assert bar.locator("button.rx-record-reconnect:visible").count() == 0
            hint = bar.locator(".rx-record-hint")  # shown in place of the button
            expected = f"%exec_remote_attach {job_id} --sandbox {shlex.quote(sandbox)}"
            assert hint.locator("code").inner_text() == expected
            assert "not trusted" in hint.inner_text()
        # on the one-click list: the button, naming the sandbox (not clicked: it would start an agent)
        safe = on_screen.nth(2).locator(".rx-record button.rx-record-reconnect:visible")
        assert safe.inner_text() == "Reconnect to local://"
        assert on_screen.nth(2).locator(".rx-record-hint:visible").count() == 0
        shot(page, "browser-untrusted-2-records-show-the-magic")
