"""The magics in an IPython shell (``run_cell_magic`` + ``capture_output``), on the real agent."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

import remote_exec as rx
from remote_exec.jupyter import JobInterrupted, JobView, RemoteCommandError, RemoteExecMagics
from remote_exec.jupyter.background import BackgroundJob
from remote_exec.jupyter.headless import HeadlessFrontEnd
from remote_exec.jupyter.saving import RECORD_DRAFT

from .conftest import gone, wait_for


def magics(ip: InteractiveShell) -> RemoteExecMagics:
    m = ip.magics_manager.registry["RemoteExecMagics"]
    assert isinstance(m, RemoteExecMagics)
    return m


def test_foreground_streams_stdout_and_stderr_into_the_cell(ip: InteractiveShell) -> None:
    with capture_output() as cap:
        ip.run_cell_magic(
            "exec_remote", "--no-widget --name r --out o --err e", "echo hi; echo oops >&2; printf 'no newline'"
        )
    assert cap.stdout == "hi\nno newline" and cap.stderr == "oops\n"
    r = ip.user_ns["r"]
    assert isinstance(r, rx.ExecResult) and r.returncode == 0 and r.state == "completed"
    assert ip.user_ns["o"] == "hi\nno newline" and ip.user_ns["e"] == "oops\n"


def test_output_arrives_while_the_job_runs(ip: InteractiveShell, tmp_path: Path) -> None:
    """The first line is in the cell before the job ends: streamed, not collected."""
    gate = tmp_path / "gate"
    seen: list[str] = []

    class Spy:
        def write(self, s: str) -> None:
            seen.append(s)
            if "first" in s:
                gate.touch()  # only now may the job finish

        def flush(self) -> None: ...

    import sys

    old, sys.stdout = sys.stdout, Spy()
    try:
        ip.run_cell_magic(
            "exec_remote", "--no-widget", f"echo first; while [ ! -e {gate} ]; do sleep 0.02; done; echo second"
        )
    finally:
        sys.stdout = old
    assert "".join(seen) == "first\nsecond\n"


def test_failure_raises_a_short_error_unless_told_not_to(ip: InteractiveShell) -> None:
    with capture_output(), pytest.raises(RemoteCommandError) as info:
        ip.run_cell_magic("exec_remote", "--name r", "echo partial; exit 3")
    err = info.value
    assert err.returncode == 3 and isinstance(err, rx.RemoteExecError)
    assert err._render_traceback_() == ["\x1b[0;31mRemoteCommandError\x1b[0m: the command exited with code 3"]
    assert ip.user_ns["r"].stdout == "partial\n"  # stored before raising
    with capture_output():
        ip.run_cell_magic("exec_remote", "--no-raise-error --name r2", "exit 4")
    assert ip.user_ns["r2"].returncode == 4
    with capture_output() as cap:  # through run_cell, IPython shows just the one line
        res = ip.run_cell("%%exec_remote\nexit 5\n")
    assert isinstance(res.error_in_exec, RemoteCommandError)
    assert "Traceback" not in cap.stdout and "exited with code 5" in cap.stdout


def test_timeout_cwd_and_env(ip: InteractiveShell, tmp_path: Path) -> None:
    with capture_output() as cap:
        ip.run_cell_magic(
            "exec_remote", f"--no-widget --cwd {tmp_path} --env A=1 'B=x=y' # a comment", "pwd; echo $A $B"
        )
    assert cap.stdout == f"{tmp_path}\n1 x=y\n"
    with capture_output(), pytest.raises(RemoteCommandError, match=r"timed out after 0\.3 s"):
        ip.run_cell_magic("exec_remote", "--no-widget --timeout 0.3 --name t", "echo start; sleep 30")
    assert ip.user_ns["t"].stdout == "start\n" and ip.user_ns["t"].state == "timed_out"


def test_config_sets_the_kernel_defaults(ip: InteractiveShell, tmp_path: Path) -> None:
    ip.run_line_magic("exec_remote_config", f"--cwd {tmp_path} --env GREETING=hello --timeout 20")
    with capture_output() as cap:
        ip.run_line_magic("exec_remote_config", "")
    assert f"cwd = '{tmp_path}'" in cap.stdout and "timeout = 20.0" in cap.stdout
    with capture_output() as cap:
        ip.run_cell_magic("exec_remote", "--no-widget --env OTHER=1", "pwd; echo $GREETING $OTHER")
    assert cap.stdout == f"{tmp_path}\nhello 1\n"
    ip.run_line_magic("exec_remote_config", "--no-timeout")
    assert magics(ip).state.defaults.timeout is None


@pytest.mark.parametrize(
    ("line", "cell", "match"),
    [
        ("--env NOEQUALS", "true", "K=V"),
        ("--name 1x", "true", "variable name"),
        ("--out class", "true", "variable name"),
        ("--timeout -1", "true", "positive"),
        ("--bg --out o", "true", "--out/--err"),
        ("--tty --merged", "true", "--merged: a --tty terminal"),
        ("", "   \n", "needs a script"),
        ("--sandbox nope://x", "true", "unsupported"),
        ("--no-such-option", "true", "unrecognized"),
        ("--env 'A=1", "true", "cannot parse"),
    ],
)
def test_bad_input_is_a_usage_error(ip: InteractiveShell, line: str, cell: str, match: str) -> None:
    with pytest.raises(UsageError, match=match):
        ip.run_cell_magic("exec_remote", line, cell)


def test_plain_text_mode_prints_stdout_then_stderr_then_the_exit_code(ip: InteractiveShell, plain: None) -> None:
    with capture_output() as cap:
        ip.run_cell_magic("exec_remote", "--no-raise-error", "echo a; echo b >&2; sleep 0.1; echo c; exit 4")
    assert cap.stdout == "a\nc\nexit code: 4\n" and cap.stderr == "b\n"
    with capture_output() as cap:
        ip.run_cell_magic("exec_remote", "--bg", "true")
    assert cap.stdout == "started in the background\n"


def test_plain_text_merged_is_one_stream(ip: InteractiveShell, plain: None) -> None:
    """As ``2>&1``, in the order read (what one read brings: stdout first, so this order holds)."""
    with capture_output() as cap:
        ip.run_cell_magic("exec_remote", "--merged --no-raise-error", "echo a; echo b >&2; exit 4")
    assert cap.stdout == "a\nb\nexit code: 4\n" and cap.stderr == ""


def test_background_returns_at_once_and_the_handle_stays_usable(
    ip: InteractiveShell, front: HeadlessFrontEnd, tmp_path: Path, pollers: Any
) -> None:
    # The job waits for a gate that only this test opens once the magic has returned (or, if
    # the magic waited for the job, a timer does a minute later, and the gate is found open).
    gate = tmp_path / "gate"
    timer = threading.Timer(60, gate.touch)
    timer.start()
    try:
        with capture_output() as cap:
            ip.run_cell_magic(
                "exec_remote", "--bg --name job", f"while [ ! -e {gate} ]; do sleep 0.05; done; echo done"
            )
        assert not gate.exists(), "the --bg magic returned only after its job could end"
    finally:
        timer.cancel()
    jv = front.widget(cap.outputs[0])
    assert isinstance(jv, JobView)
    proc = ip.user_ns["job"]
    assert isinstance(proc, BackgroundJob) and not proc.done and proc.state == "running"
    gate.touch()
    assert proc.wait().stdout == "done\n"
    assert jv.wait(10) is not None and jv.text("stdout") == "done\n" and jv.state == "completed"
    assert proc.state == jv.state and len(pollers) == 1, pollers  # the view and wait(): one feed


def test_a_bg_handle_is_a_process_handle(ip: InteractiveShell, front: HeadlessFrontEnd) -> None:
    """Issue #23 point 6: pid, signal, stdin (with the view's input line: one cursor, nothing
    lost) and iteration on the --bg handle."""
    script = "trap 'echo usr1' USR1; while read -r l; do echo \"got $l\"; done; echo eof"
    with capture_output() as cap:
        ip.run_cell_magic("exec_remote", "--bg --stdin --name job", script)
    view = front.widget(cap.outputs[0])
    assert isinstance(view, JobView)
    job: BackgroundJob = ip.user_ns["job"]
    assert isinstance(job.pid, int) and job.pid > 0 and not gone(job.pid, timeout=0)
    job.write_stdin("from code\n")
    front.send(view, {"type": "stdin", "data": "from the view\n"})
    wait_for(lambda: "got from the view" in view.text("stdout"), what="the view's line")
    job.signal("USR1")
    wait_for(lambda: "usr1" in view.text("stdout"), what="the signal's trap")
    job.close_stdin()
    events = list(job)  # the handle's own reading, from the start
    assert events[-1] == rx.Completed(0, "got from code\ngot from the view\nusr1\neof\n", "")
    assert job.returncode == 0 or job.wait().returncode == 0


def test_foreground_widget_mode(ip: InteractiveShell, front: HeadlessFrontEnd) -> None:
    with capture_output() as cap, pytest.raises(RemoteCommandError):
        ip.run_cell_magic("exec_remote", "--widget --name r", "echo to-widget; exit 2")
    assert "to-widget" not in cap.stdout  # into the widget, not the cell's text
    assert ip.user_ns["r"].stdout == "to-widget\n"
    view = front.widget(cap.outputs[0])
    assert isinstance(view, JobView) and view.text("stdout") == "to-widget\n"
    deltas = [m for m in front.custom(view) if m["kind"] == "delta"]  # live: sent without a hello
    assert deltas and deltas[0]["data"] == [["stdout", "to-widget\n"]]


def test_shell_sessions_keep_state_between_cells(ip: InteractiveShell, tmp_path: Path) -> None:
    with capture_output() as cap:
        ip.run_cell_magic(
            "exec_remote", f"--no-widget --shell new --cwd {tmp_path}", "X=42; cd sub 2>/dev/null || mkdir sub"
        )
        ip.run_cell_magic("exec_remote", "--no-widget --shell last", "cd sub; echo $X")
        ip.run_cell_magic("exec_remote", "--no-widget --shell last", "pwd")
    assert cap.stdout == f"42\n{tmp_path}/sub\n"
    state = magics(ip).state
    found = state.last_shell()
    assert found is not None
    sid = found[1].session_id
    with capture_output() as cap:
        ip.run_cell_magic("exec_remote", f"--no-widget --shell {sid}", "echo $X")
        ip.run_cell_magic("exec_remote", "--no-widget --shell new", "echo [$X]")
    assert cap.stdout == "42\n[]\n"
    with pytest.raises(UsageError, match="--cwd/--env apply"):
        ip.run_cell_magic("exec_remote", "--shell last --cwd /", "true")
    with pytest.raises(RemoteCommandError, match="ShellNotFoundError"):
        ip.run_cell_magic("exec_remote", f"--shell {sid.rpartition('-sh')[0]}-sh99999", "true")


def _interrupt_when(path: Path) -> threading.Thread:
    """Send SIGINT to this process (what the notebook's ■ does to a kernel) once ``path`` exists."""

    def run() -> None:
        wait_for(path.exists, what=str(path))
        time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGINT)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_interrupt_sends_sigint_first(ip: InteractiveShell, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    _interrupt_when(ready)
    script = f"trap 'echo got-INT; exit 130' INT; touch {ready}; while :; do sleep 0.05; done"
    with capture_output() as cap, pytest.raises(KeyboardInterrupt, match=r"stopped \(SIGINT\)"):
        ip.run_cell_magic("exec_remote", "--no-widget", script)
    assert "got-INT" in cap.stdout and "SIGINT sent" in cap.stderr
    assert "killed" not in cap.stderr  # it ended on the SIGINT: no kill needed


def test_interrupt_kills_a_job_that_ignores_sigint(ip: InteractiveShell, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    _interrupt_when(ready)
    ip.run_line_magic("exec_remote_config", "--interrupt-grace 0.3")
    script = f"trap '' INT; echo $$ > {tmp_path}/pid; touch {ready}; sleep 60; echo not-reached"
    with capture_output() as cap, pytest.raises(JobInterrupted, match=r"then killed after 0\.3 s"):
        ip.run_cell_magic("exec_remote", "--no-widget", script)
    assert "killed" in cap.stderr and "not-reached" not in cap.stdout
    assert gone(int((tmp_path / "pid").read_text()))


def test_remote_jobs_lists_mine_or_every_job(ip: InteractiveShell, sb: rx.Sandbox, plain: None) -> None:
    other = sb.exec_remote(["sleep", "30"], label="from-another-client")
    try:
        with capture_output():
            ip.run_cell_magic("exec_remote", "--bg --name mine", "sleep 30")
        mine = ip.user_ns["mine"]
        wait_for(lambda: other.job_id is not None and mine.job_id is not None, what="started")
        assert other.job_id is not None and mine.job_id is not None
        with capture_output() as cap:
            ip.run_line_magic("remote_jobs", "")  # --mine: the handles this kernel made
        assert mine.job_id in cap.stdout and other.job_id not in cap.stdout
        assert "jobs of other clients hidden" in cap.stdout
        with capture_output() as cap:
            ip.run_line_magic("remote_jobs", "--all --state running --filter another")
        assert other.job_id in cap.stdout and "running" in cap.stdout and mine.job_id not in cap.stdout
    finally:
        other.kill()
        ip.user_ns["mine"].kill()


def test_remote_jobs_and_shell_give_widgets(ip: InteractiveShell, front: HeadlessFrontEnd) -> None:
    from remote_exec.jupyter import Dashboard, ShellView

    dash = ip.run_line_magic("remote_jobs", "")
    assert isinstance(dash, Dashboard)
    dash.close()
    with capture_output() as cap:
        ip.run_line_magic("remote_shell", "--shell new")
    view = front.widget(cap.outputs[0])
    assert isinstance(view, ShellView)
    found = magics(ip).state.last_shell()
    assert found is not None and found[1].session_id == view.session_id  # %%exec_remote --shell last uses it
    view.run("export FROM_VIEW=yes")
    with capture_output() as cap:
        ip.run_cell_magic("exec_remote", "--no-widget --shell last", "echo $FROM_VIEW")
    assert cap.stdout == "yes\n"


def test_remote_shell_shows_the_sessions_current_cwd(ip: InteractiveShell, tmp_path: Path, plain: None) -> None:
    """Cells that ran in the session since it opened moved its cwd: the magic shows where it is now."""
    with capture_output():
        ip.run_cell_magic("exec_remote", "--shell new", f"cd {tmp_path}")
    with capture_output() as cap:
        ip.run_line_magic("remote_shell", "--shell last")
    session = magics(ip).state.last_shell()
    assert session is not None
    assert cap.stdout == f"shell {session[1].session_id} in {session[0]}, cwd {tmp_path}\n"
    session[1].close()


# -- floods: capped, never Jupyter's silent IOPub drop (#15) ---------------------------------------


def _shown(msgs: list[dict[str, Any]], stream: str) -> tuple[str, int]:
    """What a view's pane shows after these messages (the last replay plus later deltas), and its
    "N lines hidden" count."""
    text, seq, hidden = "", 0, 0
    for m in msgs:
        if m["kind"] == "replay":
            pane = m["data"]["panes"][stream]
            text, seq, hidden = "".join(t for _, t in pane["pieces"]), m["seq"], pane["hidden"]
        elif m["kind"] == "delta" and m["seq"] > seq:
            text += "".join(t for s, t in m["data"] if s == stream)
            seq = m["seq"]
    return text, hidden


def test_a_foreground_flood_is_a_capped_live_view_under_the_iopub_limit(
    ip: InteractiveShell, front: HeadlessFrontEnd
) -> None:
    n = 400_000  # 2.6 MB of output in about a second: streamed as text, Jupyter would drop most of it
    with capture_output() as cap:
        ip.run_cell_magic("exec_remote", "--name r", f"seq 1 {n}")
    # one live view (and its record's draft), no text flood; its stored record is rewritten in place
    shown = [o for o in cap.outputs if not getattr(o, "update", False)]
    assert cap.stdout == "" and len(shown) == 2 and RECORD_DRAFT in shown[1].metadata
    view = front.widget(cap.outputs[0])
    assert isinstance(view, JobView) and view.state == "completed" and view.exit_code == 0
    full = "".join(f"{i}\n" for i in range(1, n + 1))
    assert view.text("stdout") == full == ip.user_ns["r"].stdout  # Copy/Download get everything
    text, hidden = _shown(front.custom(view), "stdout")
    lines = text.splitlines()
    assert lines[-1] == str(n) and hidden > 0 and hidden + len(lines) == n  # the newest lines + the count
    assert lines == [str(i) for i in range(hidden + 1, n + 1)]
    # what reached the front end stays far under Jupyter Server's 1 MB/s (iopub_data_rate_limit)
    sent = front.sent(view)
    assert sum(m.size for m in sent) < len(full) / 2
    worst = max(sum(m.size for m in sent if t.at <= m.at < t.at + 1.0) for t in sent)
    assert worst < 800_000, worst


def test_plain_text_caps_each_stream_with_an_explicit_hidden_count(ip: InteractiveShell, plain: None) -> None:
    from remote_exec.jupyter.display import TEXT_HEAD_LINES as HEAD
    from remote_exec.jupyter.display import TEXT_TAIL_LINES as TAIL

    n = 100_000
    with capture_output() as cap:
        ip.run_cell_magic("exec_remote", "--out o", f"seq 1 {n}; seq 1 3000 >&2")
    hidden = n - HEAD - TAIL
    expected = (
        "".join(f"{i}\n" for i in range(1, HEAD + 1))
        + f"[remote_exec] ... {hidden:,} lines hidden (--out VAR keeps the whole output) ...\n"
        + "".join(f"{i}\n" for i in range(n - TAIL + 1, n + 1))
        + "exit code: 0\n"
    )
    assert cap.stdout == expected
    assert f"... {3000 - HEAD - TAIL:,} lines hidden (--err VAR keeps" in cap.stderr
    assert cap.stderr.endswith("\n2999\n3000\n") and cap.stderr.startswith("1\n2\n")
    assert ip.user_ns["o"] == "".join(f"{i}\n" for i in range(1, n + 1))


def test_no_raise_error_still_reports_how_the_cell_ended(ip: InteractiveShell, front: HeadlessFrontEnd) -> None:
    with capture_output() as cap:  # capped text: the exit code on stderr, no exception
        ip.run_cell_magic("exec_remote", "--no-widget --no-raise-error", "echo out; exit 4")
    assert cap.stdout == "out\n" and cap.stderr == "exit code: 4\n"
    with capture_output() as cap:  # a succeeding text cell stays quiet
        ip.run_cell_magic("exec_remote", "--no-widget", "echo fine")
    assert cap.stdout == "fine\n" and cap.stderr == ""
    with capture_output() as cap:  # the live view (the default) shows the state and the exit code
        ip.run_cell_magic("exec_remote", "--no-raise-error", "exit 5")
    view = front.widget(cap.outputs[0])
    assert isinstance(view, JobView) and view.state == "failed" and view.exit_code == 5
    synced: dict[str, Any] = {}
    for update in front.updates(view):
        synced.update(update)
    assert synced["state"] == "failed" and synced["exit_code"] == 5  # what the browser was told


def test_the_help_reads_as_the_magic_is_typed(ip: InteractiveShell) -> None:
    """``%%exec_remote?`` shows IPython's help text: no RST ``::``, the cell magic's own ``%%``."""
    cell = ip.magics_manager.magics["cell"]["exec_remote"].__doc__
    line = ip.magics_manager.magics["line"]["remote_jobs"].__doc__
    assert cell.startswith("%%exec_remote [--sandbox URL]") and "::" not in cell
    assert line.startswith("%remote_jobs [--sandbox URL]")
    with pytest.raises(UsageError), capture_output() as cap:
        ip.run_cell_magic("exec_remote", "--bogus", "true")
    assert "%exec_remote:" not in cap.stderr.replace("%%exec_remote:", "")


def test_a_merged_cell_shows_one_pane(ip: InteractiveShell, front: HeadlessFrontEnd) -> None:
    with capture_output() as cap:
        ip.run_cell_magic("exec_remote", "--widget --merged", "echo a; echo b >&2")
    view = front.widget(cap.outputs[0])
    assert isinstance(view, JobView) and view.merged and set(view.panes.values()) == {"stdout"}
    assert view.text() == "a\nb\n" and view.text("stderr") == "b\n"
