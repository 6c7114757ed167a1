"""ShellView without a browser: commands typed in, output kinds, cwd prompt, Interrupt, reattach."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import remote_exec as rx
from remote_exec.jupyter import ShellView
from remote_exec.jupyter.headless import HeadlessFrontEnd

from .conftest import wait_for


def pieces(front: HeadlessFrontEnd, view: ShellView) -> list[list[str]]:
    """Everything the view was sent, as ``[kind, text]`` in order (replays reset it)."""
    out: list[list[str]] = []
    for m in front.custom(view):
        if m["kind"] == "replay":
            out = [list(p) for p in m["data"]["panes"]["main"]["pieces"]]
        elif m["kind"] == "delta":
            out += [list(p) for p in m["data"]]
    return out


def typed(front: HeadlessFrontEnd, view: ShellView, command: str) -> None:
    """Type ``command`` and press Enter, as in the browser; wait for it to finish."""
    n = len(view.history)
    front.send(view, {"type": "run", "command": command})
    wait_for(lambda: len(view.history) > n and not view.busy, what=command)


def test_commands_keep_state_and_output_kinds_are_told_apart(
    sb: rx.Sandbox, front: HeadlessFrontEnd, tmp_path: Path
) -> None:
    view = ShellView(sb)
    try:
        front.send(view, {"type": "hello"})
        typed(front, view, f"cd {tmp_path} && X=7")
        wait_for(lambda: view.cwd == str(tmp_path), what="cwd")  # the prompt shows it
        typed(front, view, "echo out $X; echo err >&2; false")
        wait_for(lambda: ["info", "[failed (exit 1)]\n"] in pieces(front, view), what="exit note")
        got = pieces(front, view)
        assert ["command", f"{tmp_path}$ echo out $X; echo err >&2; false\n"] in got
        assert ["stdout", "out 7\n"] in got and ["stderr", "err\n"] in got
        assert view.history == [f"cd {tmp_path} && X=7", "echo out $X; echo err >&2; false"]
        assert "out 7" in repr(view) and f"{tmp_path}$" in repr(view)
    finally:
        view.session.close()
        view.close()


def test_interrupt_stops_the_command_and_the_shell_lives_on(sb: rx.Sandbox, front: HeadlessFrontEnd) -> None:
    with sb.shell() as session:
        view = ShellView(session)
        front.send(view, {"type": "hello"})
        front.send(view, {"type": "run", "command": "echo going; sleep 60"})
        wait_for(lambda: ["stdout", "going\n"] in pieces(front, view), what="running")
        assert view.busy or not view.wait_idle(0)
        front.send(view, {"type": "interrupt"})
        assert view.wait_idle(20)
        view.run("echo still-here")
        wait_for(lambda: ["stdout", "still-here\n"] in pieces(front, view), what="after interrupt")
        assert view.state == "open"
        view.close()


def test_reattach_by_session_id(sb: rx.Sandbox, jurl: str, front: HeadlessFrontEnd) -> None:
    with rx.connect(jurl) as other, other.shell() as theirs:
        theirs.run("export WHO=them")
        view = ShellView(sb)
        try:
            front.send(view, {"type": "hello"})
            front.send(view, {"type": "reattach", "session_id": theirs.session_id})
            wait_for(lambda: view.session_id == theirs.session_id, what="reattached")
            typed(front, view, "echo $WHO")
            wait_for(lambda: ["stdout", "them\n"] in pieces(front, view), what="their variable")
            front.send(view, {"type": "reattach", "session_id": "nope-sh1"})
            wait_for(lambda: any("reattach failed" in t for _, t in pieces(front, view)), what="failure note")
            assert view.session_id == theirs.session_id
        finally:
            view.close()


def test_a_replay_shows_the_transcript_to_a_late_view(sb: rx.Sandbox, front: HeadlessFrontEnd) -> None:
    view = ShellView(sb)
    try:
        view.run("echo before-any-view")
        assert front.custom(view) == []
        front.send(view, {"type": "hello"})
        wait_for(lambda: front.custom(view), what="replay")
        replay: dict[str, Any] = front.custom(view)[0]
        assert replay["kind"] == "replay"
        assert ["stdout", "before-any-view\n"] in replay["data"]["panes"]["main"]["pieces"]
    finally:
        view.session.close()
        view.close()


def test_a_running_command_reads_what_is_typed_and_sees_ctrl_d(sb: rx.Sandbox, front: HeadlessFrontEnd) -> None:
    """``read`` waits for the user (it used to get /dev/null and return at once); a line typed
    while it runs is its input, not the shell's next command; Ctrl+D closes its stdin."""
    view = ShellView(sb)
    try:
        front.send(view, {"type": "hello"})
        front.send(view, {"type": "run", "command": 'read -t 60 n; echo "hello $n"; cat; echo end'})
        wait_for(lambda: view.busy, what="the command running")
        front.send(view, {"type": "stdin", "data": "Ada\n", "view": "v", "n": 0})
        front.send(view, {"type": "stdin", "data": "for cat\n", "view": "v", "n": 1})
        wait_for(lambda: "for cat\n" in view.text("stdout"), what="cat's copy")
        front.send(view, {"type": "close_stdin", "view": "v", "n": 2})
        assert view.wait_idle(30)
        assert view.text("stdout").endswith("hello Ada\nfor cat\nend\n")
        assert view.text("stdin") == "Ada\nfor cat\n"  # shown where it was typed, as a terminal echoes
        typed(front, view, "echo $n")  # read ran in the session's shell: its variable stays
        assert view.text("stdout").endswith("end\nAda\n")
        assert "not found" not in view.text()  # no typed line was run as a command
    finally:
        view.session.close()
