"""TerminalView without a browser: keystrokes in order, output as deltas, and a plain-text
fallback that is the rendered screen (no control sequences) — on the real agent."""

from __future__ import annotations

import pytest

import remote_exec as rx
from remote_exec.jupyter import TerminalView
from remote_exec.jupyter.headless import HeadlessFrontEnd
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
