"""A re-run cell finds what its earlier runs left running (#23, point 3): a ``--bg --name`` job
and a ``%remote_shell`` terminal, in this kernel and after a restart (a fresh magics instance on
the same agent, as ``test_notebook_record`` makes one; the real kernels are in ``test_kernel``).
The agent's own listing says what runs: never a duplicate, never a shell left without a view."""

from __future__ import annotations

from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

import remote_exec as rx
from remote_exec.jupyter import JobView
from remote_exec.jupyter.background import BackgroundJob
from remote_exec.jupyter.headless import HeadlessFrontEnd
from remote_exec.jupyter.kernel_state import KernelState
from remote_exec.jupyter.rerun import SHELL_LABEL, attached_line
from remote_exec.jupyter.terminal_view import TerminalView

from .conftest import gone, wait_for


@pytest.fixture
def notebook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """This test's own notebook path, as Jupyter Server gives it to the kernel: its jobs are its own."""
    path = str(tmp_path / "work.ipynb")
    monkeypatch.setenv("JPY_SESSION_NAME", path)
    return path


def restart(ip: InteractiveShell, jurl: str) -> None:
    """What a kernel restart does to the magics: its exit (--bg jobs left running), then a fresh
    magics instance with no handles and no names, and the variables gone."""
    ip.magics_manager.registry["RemoteExecMagics"].state.close(keep_background=True)
    ip.run_line_magic("unload_ext", "remote_exec")
    for var in [k for k, v in ip.user_ns.items() if isinstance(v, BackgroundJob)]:
        del ip.user_ns[var]
    ip.run_line_magic("load_ext", "remote_exec")
    ip.run_line_magic("exec_remote_config", f"--sandbox {jurl}")


def running(sb: rx.Sandbox, notebook: str, *, name: str | None = None, label: str | None = None) -> list[str]:
    """The ids of the notebook's running jobs (of that ``--name`` or label), in the agent's record."""
    return [
        j.job_id
        for j in sb.jobs()
        if j.state == "running"
        and (j.tags or {}).get("notebook") == notebook
        and (name is None or (j.tags or {}).get("name") == name)
        and (label is None or j.label == label)
    ]


def test_a_rerun_attaches_to_its_running_job_here_and_after_a_restart_and_replace_restarts_it(
    ip: InteractiveShell, front: HeadlessFrontEnd, sb: rx.Sandbox, jurl: str, notebook: str
) -> None:
    cell = "echo one; sleep 300"
    with capture_output():
        ip.run_cell_magic("exec_remote", "--bg --name job1", cell)
    first: BackgroundJob = ip.user_ns["job1"]
    try:
        assert first.view is not None
        # Re-run in the same kernel: no error in place of the view; the view is the cell's output.
        with capture_output() as cap:
            ip.run_cell_magic("exec_remote", "--bg --name job1", cell)
        assert cap.stdout == attached_line("job1", first.job_id) + "\n"
        assert ip.user_ns["job1"] is first and front.widget(cap.outputs[0]) is first.view
        assert running(sb, notebook, name="job1") == [first.job_id]
        # Restart & Run All: a new kernel of the same notebook knows nothing; the agent does.
        restart(ip, jurl)
        with capture_output() as cap:
            ip.run_cell_magic("exec_remote", "--bg --name job1", cell)
        again: BackgroundJob = ip.user_ns["job1"]
        assert cap.stdout == attached_line("job1", first.job_id) + "\n"
        assert again.job_id == first.job_id and isinstance(again.view, JobView)
        assert front.widget(cap.outputs[0]) is again.view
        wait_for(lambda: again.view is not None and again.view.text("stdout") == "one\n", what="the kept output")
        assert running(sb, notebook, name="job1") == [first.job_id]
        # --replace kills the earlier kernel's job (found by its tags) and starts the cell.
        with capture_output():
            ip.run_cell_magic("exec_remote", "--bg --name job1 --replace", "echo two; sleep 300")
        new: BackgroundJob = ip.user_ns["job1"]
        assert new.job_id != first.job_id and gone(first.process.pid)
        assert running(sb, notebook, name="job1") == [new.job_id]
        assert [j.state for j in sb.jobs() if j.job_id == first.job_id] == ["killed"]
        new.kill()
    finally:
        for job_id in running(sb, notebook, name="job1"):
            sb.attach(job_id).kill()


def test_a_finished_job_does_not_hold_its_name(
    ip: InteractiveShell, front: HeadlessFrontEnd, sb: rx.Sandbox, jurl: str, notebook: str
) -> None:
    with capture_output():
        ip.run_cell_magic("exec_remote", "--bg --name fin --no-widget", "echo done")
    old: BackgroundJob = ip.user_ns["fin"]
    assert old.wait().stdout == "done\n"
    restart(ip, jurl)  # the earlier kernel's job, known to the agent only: ended, so no match
    with capture_output() as cap:
        ip.run_cell_magic("exec_remote", "--bg --name fin --no-widget", "echo again")
    new: BackgroundJob = ip.user_ns["fin"]
    assert new.job_id != old.job_id and cap.stdout == f"started job {new.job_id} in the background\n"
    assert new.wait().stdout == "again\n"


def test_remote_shell_reruns_show_the_notebooks_one_terminal(
    ip: InteractiveShell, front: HeadlessFrontEnd, sb: rx.Sandbox, jurl: str, notebook: str
) -> None:
    def shell() -> TerminalView:
        with capture_output() as cap:
            ip.run_line_magic("remote_shell", "")
        view = front.widget(cap.outputs[0])
        assert isinstance(view, TerminalView)
        return view

    views = [shell(), shell()]
    restart(ip, jurl)
    views.append(shell())
    terminal = views[0].job_id
    try:
        assert [v.job_id for v in views] == [terminal] * 3
        assert running(sb, notebook, label=SHELL_LABEL) == [terminal]
        # Typed into the view shown after the restart: it is the same shell.
        front.send(views[2], {"type": "hello"})
        views[2].send_keys("echo $((6*7)); exit\r")
        assert (outcome := views[2].wait(30)) is not None and outcome.exit_code == 0
        wait_for(lambda: "42" in views[2].screen().splitlines(), what="the answer on the screen")
        # Ended: the next run starts a new terminal.
        fresh = shell()
        assert fresh.job_id != terminal and running(sb, notebook, label=SHELL_LABEL) == [fresh.job_id]
        sb.attach(fresh.job_id).kill()
    finally:
        for job_id in running(sb, notebook, label=SHELL_LABEL):
            sb.attach(job_id).kill()


def test_shell_last_after_a_restart_is_the_notebooks_own_shell(
    ip: InteractiveShell, jurl: str, notebook: str, monkeypatch: pytest.MonkeyPatch, plain: None
) -> None:
    """``--shell last`` in a fresh kernel of the same notebook takes the notebook's open session
    (found by its commands' tags), its cwd kept; another notebook's kernel gets a new one."""

    def state() -> KernelState:  # the magics' state now (a fresh one after each restart)
        found: KernelState = ip.magics_manager.registry["RemoteExecMagics"].state
        return found

    with capture_output():
        ip.run_cell_magic("exec_remote", "--shell last", "cd /tmp && echo first")
    found = state().last_shell()
    assert found is not None
    first = found[1].session_id
    restart(ip, jurl)
    with capture_output() as cap:
        ip.run_cell_magic("exec_remote", "--shell last", "pwd")
    assert cap.stdout.startswith("/tmp\n"), cap.stdout  # the cwd the first kernel left
    again = state().last_shell()
    assert again is not None and again[1].session_id == first
    restart(ip, jurl)
    monkeypatch.setenv("JPY_SESSION_NAME", notebook + ".other")
    with capture_output():
        ip.run_cell_magic("exec_remote", "--shell last", "true")
    other = state().last_shell()
    assert other is not None and other[1].session_id != first
    other[1].close()
    state().sandbox(jurl).reattach_shell(first).close()
