"""TerminalView without a browser: keystrokes in order, output as deltas, and a plain-text
fallback that is the rendered screen (no control sequences) — on the real agent."""

from __future__ import annotations

import os
import stat

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

import remote_exec as rx
from remote_exec.jupyter import TerminalView, job_view, terminal_view
from remote_exec.jupyter.background import BackgroundJob
from remote_exec.jupyter.controls import control_dir
from remote_exec.jupyter.headless import HeadlessFrontEnd
from remote_exec.jupyter.saving import RECORD_DRAFT
from remote_exec.jupyter.terminal_view import DEFAULT_SIZE
from remote_exec.jupyter.vt import RENDER_CHARS, render_screen

from .conftest import wait_for

ESC = "\x1b"


def shown(msgs: list[dict[str, object]]) -> str:
    """The raw text a view wrote into its terminal: the last replay, then the later deltas."""
    text, seq = "", 0
    for m in msgs:
        data = m["data"]
        if m["kind"] == "replay":
            assert isinstance(data, dict)
            text = "".join(t for _, t in data["panes"]["main"]["pieces"])
            seq = int(str(m["seq"]))
        elif m["kind"] == "delta" and int(str(m["seq"])) > seq:
            assert isinstance(data, list)
            text += "".join(t for _, t in data)
            seq = int(str(m["seq"]))
    return text


# -- the rendered screen ---------------------------------------------------------------------------


def test_control_sequences_render_as_the_screen_a_person_saw() -> None:
    raw = (
        f"{ESC}]0;user@box: ~{ESC}\\"  # an OSC window title
        f"{ESC}[?2004h$ ls --color=always\r\n"  # bracketed paste on, a prompt
        f"{ESC}[01;34mdir{ESC}[0m  {ESC}[01;32mrun.sh{ESC}[0m\r\n"
        "progress  10%\rprogress 100%\r\n"  # a progress bar redrawn in place
        f"{ESC}[?1049h{ESC}[H{ESC}[2Jvim's screen{ESC}[5;1H~{ESC}[?1049l"  # a full-screen program, gone
        f"{ESC}[?2004l$ "
    )
    text = render_screen(raw, 40, 10)
    assert text == "$ ls --color=always\ndir  run.sh\nprogress 100%\n$"
    assert ESC not in text and "\x07" not in text


def test_a_full_screen_program_still_running_shows_its_screen() -> None:
    raw = f"before\r\n{ESC}[?1049h{ESC}[H{ESC}[2Jtop - 10:00:00 up 1 day\r\nTasks: 3 total"
    assert render_screen(raw, 40, 5) == "top - 10:00:00 up 1 day\nTasks: 3 total"


def test_rendering_is_bounded_to_the_newest_output() -> None:
    raw = "".join(f"line {i}\r\n" for i in range(200_000))  # ~2.3 MB
    assert len(raw) > 4 * RENDER_CHARS
    text = render_screen(raw, 40, 5, max_lines=3)
    assert text == "line 199997\nline 199998\nline 199999"


# -- the widget on a real job -----------------------------------------------------------------------


def test_keystrokes_reach_the_job_in_order_and_its_output_comes_back_as_deltas(
    sb: rx.Sandbox, front: HeadlessFrontEnd
) -> None:
    # `cat` with stdin open echoes what it is given: the keystroke path without a PTY.
    proc = sb.exec_remote(["cat"], stdin_open=True)
    view = TerminalView(proc, command="cat")
    front.send(view, {"type": "hello"})
    wait_for(lambda: front.custom(view), what="the replay")
    for ch in "abcdefghij":  # one message per key, as xterm sends them
        front.send(view, {"type": "input", "data": ch})
    front.send(view, {"type": "input", "data": "\n"})
    wait_for(lambda: shown(front.custom(view)) == "abcdefghij\n", what="the echo")
    kinds = {m["kind"] for m in front.custom(view)}
    assert kinds == {"replay", "delta"}
    proc.close_stdin()
    outcome = view.wait(20)
    assert outcome is not None and outcome.state == "completed"
    assert view.screen() == "abcdefghij"


def test_the_plain_text_fallback_is_the_rendered_screen(sb: rx.Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    script = r"printf '\033]0;title\007\033[?2004h\033[31mred\033[0m text\r\nstep 1\rstep 2\r\n\033[?2004l'"
    view = TerminalView(sb.exec_remote(["bash", "-c", script]), command="demo")
    assert view.wait(20) is not None
    monkeypatch.setenv("REMOTE_EXEC_NONINTERACTIVE", "1")
    plain = repr(view)
    assert plain.splitlines()[1:] == ["--- stdout ---", "red text", "step 2"], plain
    assert ESC not in plain
    monkeypatch.setenv("REMOTE_EXEC_NONINTERACTIVE", "0")
    data = view._repr_mimebundle_()  # beside the widget: what a saved notebook shows
    bundle = data[0] if isinstance(data, tuple) else data
    assert ESC not in bundle["text/plain"] and ESC not in bundle["text/html"]
    assert "red text" in bundle["text/plain"]


# -- on a PTY job ------------------------------------------------------------------------------------


def test_the_views_width_sets_the_ptys_size(sb: rx.Sandbox, front: HeadlessFrontEnd) -> None:
    proc = sb.exec_remote(["bash", "-c", "while read -r x; do stty size; done"], tty=True, tty_size=(80, 24))
    view = TerminalView(proc)
    front.send(view, {"type": "hello"})
    front.send(view, {"type": "resize", "cols": 132, "rows": 40})
    asked = [0]

    def answered_with_new_size() -> bool:
        # An Enter the job answers with `stty size`; the first may come before the resize did.
        lines = [ln for ln in view.text().split("\r\n") if ln.strip() and ln[0].isdigit()]
        if "40 132" in lines:
            return True
        if len(lines) == asked[0]:
            view.send_keys("\r")
            asked[0] += 1
        return False

    wait_for(answered_with_new_size, what="stty size 40 132")
    assert (view.cols, view.rows) == (132, 40)
    view.kill()
    assert view.wait(20) is not None


def test_two_views_of_one_pty_job_show_the_same_screen(sb: rx.Sandbox, front: HeadlessFrontEnd) -> None:
    script = (
        "printf '\\033]0;title\\007\\033[1;31mred\\033[0m\\n'; tput cup 5 10; echo moved; "
        'read -r line; echo "got $line"'
    )
    proc = sb.exec_remote(["bash", "-c", script], tty=True)
    first = TerminalView(proc, command="demo")
    assert proc.job_id is not None
    second = TerminalView.attach(sb, proc.job_id)  # as another notebook (or kernel) would
    wait_for(lambda: "moved" in first.screen() and "moved" in second.screen(), what="both screens")
    second.send_keys("typed in the second\r")  # either view's keys reach the one terminal
    assert first.wait(20) is not None and second.wait(20) is not None
    assert first.screen() == second.screen()
    assert first.screen().splitlines()[-2:] == ["typed in the second", "got typed in the second"]
    assert "          moved" in first.screen().splitlines()


# -- the magics ----------------------------------------------------------------------------------------


def test_a_tty_cell_is_a_terminal_to_type_into(ip: InteractiveShell, front: HeadlessFrontEnd) -> None:
    with capture_output() as cap:
        ip.run_cell_magic(
            "exec_remote", "--tty --name job", 'read -p "name? " n; echo "hello $n"; [ -t 1 ] && echo tty'
        )
    view = front.widget(cap.outputs[0])  # returned at once: the kernel is free for the keystrokes
    assert isinstance(view, TerminalView)
    job = ip.user_ns["job"]
    assert isinstance(job, BackgroundJob) and not job.done
    front.send(view, {"type": "hello"})
    wait_for(lambda: "name?" in view.screen(), what="the prompt")
    for key in "Ada\r":
        front.send(view, {"type": "input", "data": key})
    assert job.wait().returncode == 0
    assert view.wait(20) is not None
    assert view.screen().splitlines() == ["name? Ada", "hello Ada", "tty"]


def test_a_running_terminals_record_follows_its_screen(
    ip: InteractiveShell, front: HeadlessFrontEnd, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the job runs its newest screen goes into the record's draft (what a notebook saved
    after its kernel was SIGKILLed keeps), never into the view's own output (a rewrite there would
    make JupyterLab render a new terminal, taking the focus of someone typing)."""
    monkeypatch.setattr(job_view, "RECORD_PERIOD", 0.2)
    with capture_output() as cap:
        ip.run_cell_magic("exec_remote", "--tty --name term", "read -p 'name? ' n; echo \"hi $n\"; sleep 300")
        view = front.widget(cap.outputs[0])
        assert isinstance(view, TerminalView)
        front.send(view, {"type": "hello"})
        for key in "Ada\r":
            front.send(view, {"type": "input", "data": key})

        def drafted() -> str:
            drafts = [o.metadata[RECORD_DRAFT] for o in cap.outputs if RECORD_DRAFT in o.metadata]
            return next((d["data"]["text/plain"] for d in reversed(drafts) if "data" in d), "")

        wait_for(lambda: "hi Ada" in drafted(), what="a draft with the screen")
        view_id = cap.outputs[0].transient["display_id"]
        assert not [o for o in cap.outputs[1:] if o.transient.get("display_id") == view_id]  # the view: untouched
        assert "\x1b" not in drafted() and drafted().startswith("[running]")
        ip.user_ns["term"].kill()


def test_a_terminal_starts_at_the_width_the_page_measured(ip: InteractiveShell, front: HeadlessFrontEnd) -> None:
    """Not at 80 columns until its view resizes it: the first lines (``ls``, ``tput cols``) are
    laid out for the width the page measured this kernel's terminals at."""
    assert terminal_view.start_cols() == DEFAULT_SIZE[0]  # a fresh kernel (the autouse fixture)
    with capture_output() as cap:
        ip.run_cell_magic("exec_remote", "--tty --name first", "read -r _")
    front.send(front.widget(cap.outputs[0]), {"type": "resize", "cols": 132, "rows": 24})
    wait_for(lambda: terminal_view.start_cols() == 132, what="the page's measure")
    first = ip.user_ns["first"]
    first.kill()
    # its view's last record written before the next capture (which would catch it first)
    assert first.view is not None and first.view.wait(20) is not None
    with capture_output() as cap:
        ip.run_cell_magic("exec_remote", "--tty --name second", "tput cols")
    view = front.widget(cap.outputs[0])
    assert ip.user_ns["second"].wait().returncode == 0
    assert isinstance(view, TerminalView) and view.wait(20) is not None
    assert view.screen() == "132"


def test_a_new_kernels_first_terminal_starts_at_the_width_another_kernel_measured(
    ip: InteractiveShell, front: HeadlessFrontEnd
) -> None:
    with capture_output() as cap:
        ip.run_cell_magic("exec_remote", "--tty --name first", "read -r _")
    front.send(front.widget(cap.outputs[0]), {"type": "resize", "cols": 117, "rows": 24})
    wait_for(lambda: terminal_view.start_cols() == 117, what="the page's measure")
    ip.user_ns["first"].kill()
    saved = control_dir() / terminal_view.MEASURE_FILE
    assert saved.read_text() == "117" and stat.S_IMODE(saved.parent.stat().st_mode) == 0o700
    terminal_view._measured["cols"] = None  # a kernel that just started
    assert terminal_view.start_cols() == 117
    # The file is read as untrusted: out of bounds, not a number, or not a regular file -> 80.
    for content in ("100000", "3", "wide", ""):
        saved.write_text(content)
        terminal_view._measured["cols"] = None
        assert terminal_view.start_cols() == DEFAULT_SIZE[0], content
    saved.unlink()
    os.mkfifo(saved)  # would block a plain open
    terminal_view._measured["cols"] = None
    assert terminal_view.start_cols() == DEFAULT_SIZE[0]


def test_a_tty_cell_in_plain_text_prints_the_rendered_screen(ip: InteractiveShell, plain: None) -> None:
    script = "printf '\\033[?1049h\\033[2Jfull screen\\033[?1049l'; printf '\\033[32mok\\033[0m 1\\rok 2\\n'; tput cols"
    with capture_output() as cap:
        ip.run_cell_magic("exec_remote", "--tty", script)
    assert cap.stdout == "ok 2\n80\nexit code: 0\n"
    with pytest.raises(UsageError, match="--tty"):
        ip.run_cell_magic("exec_remote", "--tty --shell new", "true")


def test_remote_shell_is_an_interactive_shell_in_a_terminal(ip: InteractiveShell, front: HeadlessFrontEnd) -> None:
    with capture_output() as cap:
        ip.run_line_magic("remote_shell", "--rows 30")
    view = front.widget(cap.outputs[0])
    assert isinstance(view, TerminalView) and view.rows == 30
    front.send(view, {"type": "hello"})
    view.send_keys("echo $((6*7)) $-; stty size\r")
    wait_for(lambda: any(ln.startswith("42 ") for ln in view.screen().splitlines()), what="the answer")
    answer = next(ln for ln in view.screen().splitlines() if ln.startswith("42 "))
    assert "i" in answer.split()[1]  # $- holds i: an interactive shell
    wait_for(lambda: "30 80" in view.screen().splitlines(), what="stty size")
    view.send_keys("exit\r")
    outcome = view.wait(20)
    assert outcome is not None and outcome.exit_code == 0


def test_remote_shell_in_plain_text_starts_nothing(ip: InteractiveShell, sb: rx.Sandbox, plain: None) -> None:
    before = {j.job_id for j in sb.jobs()}
    with capture_output() as cap:
        ip.run_line_magic("remote_shell", "")
    assert "interactive terminal where widgets render" in cap.stdout
    assert {j.job_id for j in sb.jobs()} == before


# -- JobView's stdin line --------------------------------------------------------------------------


def test_a_bg_stdin_cell_takes_lines_and_an_eof_from_its_view(ip: InteractiveShell, front: HeadlessFrontEnd) -> None:
    script = 'read -r name; echo "hello $name"; cat; echo "stdin closed"'
    with capture_output() as cap:
        ip.run_cell_magic("exec_remote", "--bg --stdin --name job", script)
    view = front.widget(cap.outputs[0])
    assert view.stdin_open
    front.send(view, {"type": "hello"})
    front.send(view, {"type": "stdin", "data": "Ada\n"})
    wait_for(lambda: view.text("stdout") == "hello Ada\n", what="the answer")
    front.send(view, {"type": "stdin", "data": "line for cat\n"})  # typed after the answer, as a user would
    wait_for(lambda: view.text("stdout") == "hello Ada\nline for cat\n", what="the answers")
    # each line echoed in the pane where it was typed, before its answer, as a terminal shows it
    assert view.text() == "Ada\nhello Ada\nline for cat\nline for cat\n" and view.text("stdin") == "Ada\nline for cat\n"
    front.send(view, {"type": "close_stdin"})
    assert ip.user_ns["job"].wait().stdout == "hello Ada\nline for cat\nstdin closed\n"
    assert view.wait(20) is not None and not view.stdin_open
    with pytest.raises(UsageError, match="--stdin needs --bg"):
        ip.run_cell_magic("exec_remote", "--stdin", "cat")


def test_a_job_without_stdin_has_no_input_line(sb: rx.Sandbox, front: HeadlessFrontEnd) -> None:
    from remote_exec.jupyter import JobView

    view = JobView(sb.exec_remote(["bash", "-c", "read -r x || echo eof"]))
    assert not view.stdin_open
    front.send(view, {"type": "stdin", "data": "ignored\n"})  # nothing is written to a closed stdin
    outcome = view.wait(20)
    assert outcome is not None and view.text("stdout") == "eof\n"


def test_expect_waits_for_a_prompt_then_keys_answer_it(sb: rx.Sandbox) -> None:
    proc = sb.exec_remote(["bash", "-c", 'sleep 0.3; read -p "name? " n; echo "hello $n"'], tty=True)
    view = TerminalView(proc)
    assert view.expect("name?", timeout=30)
    view.send_keys("Ada\r")
    assert view.expect("hello Ada", timeout=30)
    assert view.wait(20) is not None
    assert view.screen() == "name? Ada\nhello Ada"
    assert not view.expect("never shown", timeout=0.2)  # ended: returns at once


def test_a_pty_flood_is_paced_and_download_has_all_of_it(sb: rx.Sandbox, front: HeadlessFrontEnd) -> None:
    from remote_exec.jupyter.base import OUTPUT_RATE

    # 3 MB of coloured lines through a PTY: more than the view may send in a second
    script = "yes $'\\e[32mok\\e[0m line' | head -n 200000; echo THE-END"
    view = TerminalView(sb.exec_remote(["bash", "-c", script], tty=True))
    front.send(view, {"type": "hello"})
    outcome = view.wait(120)
    assert outcome is not None and outcome.exit_code == 0
    sent = [m for m in front.sent(view) if m.msg_type == "comm_msg"]
    times = [m.at for m in sent]
    assert max(sum(1 for t in times if s <= t < s + 1.0) for s in times) <= 100  # rounds a second
    custom = front.custom(view)
    size = sum(len(t) for m in custom if m["kind"] == "delta" for _, t in m["data"])
    size += sum(
        len(t) for m in custom if m["kind"] == "replay" for p in m["data"]["panes"].values() for _, t in p["pieces"]
    )
    assert size <= OUTPUT_RATE * (times[-1] - times[0] + 2)  # at most OUTPUT_RATE a second
    assert shown(custom).endswith("THE-END\r\n")  # the view ends showing the end
    front.send(view, {"type": "fetch", "stream": None, "purpose": "download"})
    wait_for(lambda: any(m["kind"] == "full" for m in front.custom(view)), what="the download")
    full = next(m for m in front.custom(view) if m["kind"] == "full")["data"]
    assert full["text"].count("ok line\r\n") == 200_000 and ESC not in full["text"]


def test_keys_the_kernel_swapped_reach_the_job_in_the_order_typed(sb: rx.Sandbox, front: HeadlessFrontEnd) -> None:
    """ipykernel may handle a later comm message first: the view's numbers put them back."""
    proc = sb.exec_remote(["cat"], tty=True)
    view = TerminalView(proc)
    keys = [*"PS1='rx$ '", "\r"]
    order = [1, 0, 3, 2, *range(4, len(keys))]  # as the kernel handed them on
    for i in order:
        front.send(view, {"type": "input", "data": keys[i], "view": "v1", "n": i})
    front.send(view, {"type": "input", "data": "x", "view": "v1", "n": 2})  # a duplicate: dropped
    assert view.expect("PS1='rx$ '\nPS1='rx$ '", timeout=30)  # the echo, then cat's copy
    view.kill()


def test_in_order_gives_up_a_gap_past_its_bound() -> None:
    from remote_exec.jupyter.base import InOrder

    order = InOrder()
    assert order.take({"type": "x"}) == [{"type": "x"}]  # unnumbered: at once
    assert order.take({"view": "a", "n": 1}) == []
    assert order.take({"view": "b", "n": 0}) == [{"view": "b", "n": 0}]  # views are independent
    assert [m["n"] for m in order.take({"view": "a", "n": 0})] == [0, 1]
    for n in range(3, 3 + InOrder.MAX_WAITING):  # 2 never comes
        assert order.take({"view": "a", "n": n}) == []
    ready = order.take({"view": "a", "n": 3 + InOrder.MAX_WAITING})
    assert [m["n"] for m in ready] == list(range(3, 4 + InOrder.MAX_WAITING))
