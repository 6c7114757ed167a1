"""The magics in a real ipykernel (the installed version), driven over ZMQ like a front end.

Checks what in-process tests cannot: output lands in the cell that ran the job (written by
the cell's own thread, ipykernel#1450), a --bg job never writes into later cells, a kernel
interrupt (the notebook's ■) kills the job, and plain-text mode gives nbval a stable order.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

from .conftest import gone, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def kernel_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("REMOTE_EXEC_NONINTERACTIVE", raising=False)  # a kernel detects for itself
    for var, sub in (("JUPYTER_RUNTIME_DIR", "runtime"), ("IPYTHONDIR", "ipython")):
        monkeypatch.setenv(var, str(tmp_path / sub))


def run_notebook(cells: list[str], tmp_path: Path) -> list[Any]:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    client = NotebookClient(nb, timeout=60, allow_errors=True, resources={"metadata": {"path": str(tmp_path)}})
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


def test_output_lands_in_the_cell_that_ran_it(agent_dir: Path, tmp_path: Path) -> None:
    setup = f"%load_ext remote_exec\n%exec_remote_config --sandbox local://?dir={agent_dir}"
    outs = run_notebook(
        [
            setup,
            "%%exec_remote --bg --no-widget\nfor i in 1 2 3 4 5 6; do echo bg$i; sleep 0.1; done",
            "%%exec_remote\necho one; sleep 0.2; echo two >&2; sleep 0.2; echo three",
            "import time; time.sleep(0.5); print('python cell')",
            "%%exec_remote --bg\nfor i in 1 2 3; do echo w$i; sleep 0.1; done",
            "print('after the widget')",
            "%%exec_remote\necho failing; exit 3",
        ],
        tmp_path,
    )
    assert outs[0] == []
    assert streams(outs[1]) == [("stdout", f"started job {_job_id(outs[1])} in the background\n")]
    assert streams(outs[2]) == [("stdout", "one\n"), ("stderr", "two\n"), ("stdout", "three\n")]
    assert streams(outs[3]) == [("stdout", "python cell\n")]
    (widget,) = outs[4]
    assert widget.output_type == "display_data" and "application/vnd.jupyter.widget-view+json" in widget.data
    assert streams(outs[5]) == [("stdout", "after the widget\n")]
    assert streams(outs[6]) == [("stdout", "failing\n")]
    (error,) = [o for o in outs[6] if o.output_type == "error"]
    assert error.ename == "RemoteCommandError" and len(error.traceback) == 1  # one short line
    assert "exited with code 3" in error.traceback[0]


def _job_id(outputs: list[Any]) -> str:
    return str(outputs[0].text.split()[2])


def test_plain_text_mode_is_stable_for_nbval(agent_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REMOTE_EXEC_NONINTERACTIVE", "1")  # the kernel inherits it
    setup = f"%load_ext remote_exec\n%exec_remote_config --sandbox local://?dir={agent_dir}"
    cell = "%%exec_remote --no-raise-error\necho a; echo b >&2; sleep 0.2; echo c >&2; echo d; exit 2"
    outs = run_notebook([setup, cell, "%%exec_remote --bg\necho x"], tmp_path)
    assert streams(outs[1]) == [("stdout", "a\nd\n"), ("stderr", "b\nc\n"), ("stdout", "exit code: 2\n")]
    assert streams(outs[2]) == [("stdout", "started in the background\n")]


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[tuple[KernelManager, Any]]:
    km = KernelManager(kernel_name="python3")
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
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the job's pid")
    km.interrupt_kernel()  # what the notebook's ■ does
    reply = kc.get_shell_msg(timeout=60)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "JobInterrupted"
    assert reply["content"]["traceback"] == [
        "\x1b[0;31mKeyboardInterrupt\x1b[0m: the remote job was stopped (SIGINT, then killed after 1 s)"
    ]
    assert gone(int(pid_file.read_text()))
    # the kernel is fine afterwards, and the sandbox connection too
    reply, msgs = execute(kc, "%%exec_remote\necho after")
    assert reply["content"]["status"] == "ok"
    assert [m["content"]["text"] for m in msgs if m["msg_type"] == "stream"] == ["after\n"]
