"""The magics in a real ipykernel, driven over ZMQ like a front end.

Checks what in-process tests cannot: output lands in the cell that ran the job (written by
the cell's own thread, ipykernel#1450), a --bg job never writes into later cells, a kernel
interrupt (the notebook's ■) kills the job, and plain-text mode gives nbval a stable order.

Each test runs twice: in the installed ipykernel (>= 7.1) and in ipykernel 6.29.5, whose
thread output works differently (7.0.0 broke it, ipykernel#1450). The 6.29 kernel runs in a
venv of its own, built once per session (uv, a few seconds; the module's tests run in one xdist
worker, so once per run); where it cannot be built (no index) those
tests skip, or fail under ``REMOTE_EXEC_REQUIRE_BACKENDS=1`` (CI).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

import remote_exec as rx
from remote_exec.jupyter.display import WIDGET_FRONT_END_ENV
from remote_exec.jupyter.rerun import attached_line
from remote_exec.jupyter.saving import RECORD_DRAFT

from ..venvs import install, make_venv
from .conftest import gone

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
OLD_IPYKERNEL = "6.29.5"
OLD_KERNEL_NAME = "ipykernel-6.29"  # its kernelspec, in a JUPYTER_PATH of the session's own
KERNELS = {"installed": "python3", "6.29": OLD_KERNEL_NAME}


def unavailable(reason: str) -> None:
    if os.environ.get("REMOTE_EXEC_REQUIRE_BACKENDS") == "1":
        pytest.fail(f"ipykernel {OLD_IPYKERNEL} required but unavailable: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def old_kernel_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A JUPYTER_PATH dir whose ``kernels/`` has ipykernel 6.29.5 (with this package) in a venv.

    Built once per session (pytest caches a failure too, so later tests skip at once).
    """
    root = tmp_path_factory.mktemp("ipykernel-6.29")
    venv = root / "venv"
    python = venv / "bin" / "python"
    check = f"import ipykernel; assert ipykernel.__version__ == {OLD_IPYKERNEL!r}, ipykernel.__version__"
    make_venv(venv)
    try:
        built = install(python, "-e", f"{REPO}[jupyter]", f"ipykernel=={OLD_IPYKERNEL}")
    except subprocess.TimeoutExpired:
        built = subprocess.CompletedProcess([], -1, "", "timed out")
    if built.returncode != 0:
        lines = [line.strip() for line in (built.stderr + built.stdout).splitlines() if line.strip()]
        why = [line for line in lines if line.startswith(("ERROR", "error"))] or lines[-3:]  # uv's own reason
        unavailable(f"cannot build an ipykernel {OLD_IPYKERNEL} venv: uv pip install failed: " + " | ".join(why))
    subprocess.run([str(python), "-c", check], check=True, timeout=60)  # the version asked for, or fail
    spec = root / "share" / "kernels" / OLD_KERNEL_NAME / "kernel.json"
    spec.parent.mkdir(parents=True)
    argv = [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec.write_text(json.dumps({"argv": argv, "display_name": f"ipykernel {OLD_IPYKERNEL}", "language": "python"}))
    return spec.parents[2]


@pytest.fixture(params=list(KERNELS))
def kernel_name(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The kernel the test runs in: the installed ipykernel, then ipykernel 6.29.5."""
    name = KERNELS[request.param]
    if name == OLD_KERNEL_NAME:
        monkeypatch.setenv("JUPYTER_PATH", str(request.getfixturevalue("old_kernel_path")))
    return name


@pytest.fixture(autouse=True)
def kernel_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("REMOTE_EXEC_NONINTERACTIVE", raising=False)  # a kernel detects for itself
    for var in WIDGET_FRONT_END_ENV:  # as if no front end started the test run
        monkeypatch.delenv(var, raising=False)
    for var, sub in (("JUPYTER_RUNTIME_DIR", "runtime"), ("IPYTHONDIR", "ipython")):
        monkeypatch.setenv(var, str(tmp_path / sub))


def run_notebook(cells: list[str], tmp_path: Path, kernel_name: str) -> list[Any]:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    client = NotebookClient(
        nb,
        timeout=60,
        allow_errors=True,
        kernel_name=kernel_name,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()
    return [c.outputs for c in nb.cells]


def streams(outputs: list[Any]) -> list[tuple[str, str]]:
    """``(name, text)`` of a cell's stream outputs, neighbours of the same name merged."""
    merged: list[tuple[str, str]] = []
    for o in outputs:
        if o.output_type == "stream":
            if merged and merged[-1][0] == o.name:
                merged[-1] = (o.name, merged[-1][1] + o.text)
            else:
                merged.append((o.name, o.text))
    return merged


def test_output_lands_in_the_cell_that_ran_it(
    agent_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel_name: str
) -> None:
    # What Jupyter Server (JupyterLab, Notebook 7) puts in a kernel's environment: widgets on.
    monkeypatch.setenv("JPY_SESSION_NAME", str(tmp_path / "demo.ipynb"))
    setup = f"%load_ext remote_exec\n%exec_remote_config --sandbox local://?dir={agent_dir}"
    outs = run_notebook(
        [
            setup,
            "%%exec_remote --bg --no-widget\nfor i in 1 2 3 4 5 6; do echo bg$i; sleep 0.1; done",
            "%%exec_remote --no-widget\necho one; sleep 0.2; echo two >&2; sleep 0.2; echo three",
            "import time; time.sleep(0.5); print('python cell')",
            "%%exec_remote --bg\nfor i in 1 2 3; do echo w$i; sleep 0.1; done",
            "print('after the widget')",
            "%%exec_remote --no-widget\necho failing; exit 3",
        ],
        tmp_path,
        kernel_name,
    )
    assert outs[0] == []
    assert streams(outs[1]) == [("stdout", f"started job {_job_id(outs[1])} in the background\n")]
    assert streams(outs[2]) == [("stdout", "one\n"), ("stderr", "two\n"), ("stdout", "three\n")]
    assert streams(outs[3]) == [("stdout", "python cell\n")]
    widget, draft = outs[4]  # the view, and the hidden draft its record is kept fresh in
    assert widget.output_type == "display_data" and "application/vnd.jupyter.widget-view+json" in widget.data
    assert draft.output_type == "display_data" and RECORD_DRAFT in draft.metadata
    assert streams(outs[5]) == [("stdout", "after the widget\n")]
    assert streams(outs[6]) == [("stdout", "failing\n"), ("stderr", "exit code: 3\n")]
    (error,) = [o for o in outs[6] if o.output_type == "error"]
    assert error.ename == "RemoteCommandError" and len(error.traceback) == 1  # one short line
    assert "exited with code 3" in error.traceback[0]


def _job_id(outputs: list[Any]) -> str:
    return str(outputs[0].text.split()[2])


def test_plain_text_mode_is_stable_for_nbval(
    agent_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel_name: str
) -> None:
    monkeypatch.setenv("REMOTE_EXEC_NONINTERACTIVE", "1")  # the kernel inherits it
    setup = f"%load_ext remote_exec\n%exec_remote_config --sandbox local://?dir={agent_dir}"
    cell = "%%exec_remote --no-raise-error\necho a; echo b >&2; sleep 0.2; echo c >&2; echo d; exit 2"
    outs = run_notebook([setup, cell, "%%exec_remote --bg\necho x"], tmp_path, kernel_name)
    assert streams(outs[1]) == [("stdout", "a\nd\n"), ("stderr", "b\nc\n"), ("stdout", "exit code: 2\n")]
    assert streams(outs[2]) == [("stdout", "started in the background\n")]


def test_a_headless_front_end_gets_plain_text_without_a_switch(
    agent_dir: Path, tmp_path: Path, kernel_name: str
) -> None:
    # nbclient (like nbval and papermill) renders no widgets and sets no front-end variable.
    setup = f"%load_ext remote_exec\n%exec_remote_config --sandbox local://?dir={agent_dir}"
    cells = [setup, "%%exec_remote\necho a; echo b >&2", "%%exec_remote --bg\necho x", "%remote_jobs"]
    outs = run_notebook(cells, tmp_path, kernel_name)
    assert streams(outs[1]) == [("stdout", "a\n"), ("stderr", "b\n"), ("stdout", "exit code: 0\n")]
    assert streams(outs[2]) == [("stdout", "started in the background\n")]
    assert not any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for out in outs for o in out)


WIDGET = "application/vnd.jupyter.widget-view+json"


def test_restart_and_run_all_attaches_to_the_named_job_and_jobs_run_in_the_notebooks_folder(
    agent_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#23, points 3 and 4, as JupyterLab does them: each run below is a new kernel of the same
    notebook (Restart & Run All), in the notebook's folder, on an agent started elsewhere."""
    folder = tmp_path / "project" / "analysis"
    folder.mkdir(parents=True)
    notebook = str(folder / "work.ipynb")
    monkeypatch.setenv("JPY_SESSION_NAME", notebook)  # what Jupyter Server gives a notebook's kernel
    url = f"local://?dir={agent_dir}"
    setup = f"%load_ext remote_exec\n%exec_remote_config --sandbox {url}"
    pwd = "%%exec_remote --no-widget\npwd -P"
    with rx.connect(url) as sb:

        def job1() -> list[rx.JobInfo]:
            tags = {"notebook": notebook, "name": "job1"}
            return [j for j in sb.jobs() if j.tags is not None and tags.items() <= j.tags.items()]

        assert os.readlink(f"/proc/{sb.info.pid}/cwd") != os.path.realpath(folder)  # the agent's is not it
        try:
            cells = [setup, "%%exec_remote --bg --name job1\necho one; sleep 300", pwd]
            first = run_notebook(cells, folder, "python3")
            (started,) = job1()
            # the view and its record's draft
            assert started.state == "running" and [o.output_type for o in first[1]] == ["display_data"] * 2
            assert WIDGET in first[1][0].data and RECORD_DRAFT in first[1][1].metadata
            assert streams(first[2]) == [("stdout", f"{os.path.realpath(folder)}\n")]
            again = run_notebook(cells, folder, "python3")  # the job still runs: attached, not doubled
            assert [j.job_id for j in job1()] == [started.job_id]
            assert streams(again[1]) == [("stdout", attached_line("job1", started.job_id) + "\n")]
            view, draft = again[1][-2:]  # its live view is the cell's output (and the view's draft)
            assert WIDGET in view.data and RECORD_DRAFT in draft.metadata
            cells[1] = "%%exec_remote --bg --name job1 --replace\necho two; sleep 300"
            run_notebook(cells, folder, "python3")
            old, new = job1()
            assert old.job_id == started.job_id and old.state == "killed" and new.state == "running"
        finally:
            for info in job1():
                if info.state == "running":
                    sb.attach(info.job_id).kill()


@pytest.fixture
def kernel(tmp_path: Path, kernel_name: str) -> Iterator[tuple[KernelManager, Any]]:
    km = KernelManager(kernel_name=kernel_name)
    km.start_kernel(cwd=str(tmp_path))
    kc = km.blocking_client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    yield km, kc
    kc.stop_channels()
    km.shutdown_kernel(now=True)


def execute(kc: Any, code: str, timeout: float = 60) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run ``code``; return the reply and the iopub messages of that execution."""
    msg_id = kc.execute(code)
    reply = kc.get_shell_msg(timeout=timeout)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kc.get_shell_msg(timeout=timeout)
    seen: list[dict[str, Any]] = []
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        seen.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return reply, seen


def test_kernel_interrupt_kills_the_job(kernel: tuple[KernelManager, Any], agent_dir: Path, tmp_path: Path) -> None:
    km, kc = kernel
    setup = f"%load_ext remote_exec\n%exec_remote_config --sandbox local://?dir={agent_dir} --interrupt-grace 1"
    assert execute(kc, setup)[0]["content"]["status"] == "ok"
    pid_file = tmp_path / "pid"
    msg_id = kc.execute(f"%%exec_remote\ntrap '' INT\necho $$ > {pid_file}\necho started\nsleep 300")
    # The cell shows "started" once it is following the job: the moment a user would press ■.
    while not any(
        m["msg_type"] == "stream" and "started" in m["content"]["text"] for m in [kc.get_iopub_msg(timeout=60)]
    ):
        pass
    km.interrupt_kernel()  # what the notebook's ■ does
    reply = kc.get_shell_msg(timeout=60)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "JobInterrupted", reply["content"]
    assert reply["content"]["traceback"] == [
        "\x1b[0;31mKeyboardInterrupt\x1b[0m: the remote job was stopped (SIGINT, then killed after 1 s)"
    ]
    assert gone(int(pid_file.read_text()))
    # the kernel is fine afterwards, and the sandbox connection too
    reply, msgs = execute(kc, "%%exec_remote\necho after")
    for _ in range(3):  # ipykernel aborts requests that reach it while it handles an error reply
        if reply["content"]["status"] != "aborted":
            break
        reply, msgs = execute(kc, "%%exec_remote\necho after")
    assert reply["content"]["status"] == "ok"
    # plain text: nothing in this test run starts the kernel from a widget front end
    assert [m["content"]["text"] for m in msgs if m["msg_type"] == "stream"] == ["after\n", "exit code: 0\n"]
