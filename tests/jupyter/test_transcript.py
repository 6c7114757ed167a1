"""The bookkeeping behind the widgets: tails, hidden-line counts, pending deltas, the pace."""

from __future__ import annotations

from remote_exec.jupyter.transcript import RateLimit, Transcript, strip_ansi

PANES = {"stdout": "stdout", "stderr": "stderr"}


def test_pending_holds_only_new_text_in_order_with_neighbours_merged() -> None:
    t = Transcript(PANES)
    t.append("stdout", "a")
    t.append("stdout", "b")
    t.append("stderr", "E")
    t.append("stdout", "c")
    assert t.take_pending() == [["stdout", "ab"], ["stderr", "E"], ["stdout", "c"]]
    assert t.take_pending() == [] and not t.has_pending
    t.append("stdout", "d\n")
    assert t.take_pending() == [["stdout", "d\n"]]
    assert t.text("stdout") == "abcd\n" and t.text("stderr") == "E" and t.text() == "abEcd\n"
    assert t.chars == {"stdout": 5, "stderr": 1}


def test_tail_keeps_the_last_lines_and_counts_the_hidden_ones() -> None:
    t = Transcript(PANES)
    for i in range(10):
        t.append("stdout", f"line {i}\n")
    t.append("stdout", "partial")
    pieces, hidden = t.tail("stdout", 3)  # a view holds 3 lines: two full ones and the open one
    assert "".join(x for _, x in pieces) == "line 8\nline 9\npartial"
    assert hidden == 8
    pieces, hidden = t.tail("stdout", 100)
    assert hidden == 0 and "".join(x for _, x in pieces).startswith("line 0\n")
    assert t.tail("stderr", 3) == ([], 0)


def test_tail_of_a_shared_pane_keeps_streams_interleaved() -> None:
    t = Transcript({"stdout": "main", "stderr": "main", "command": "main"})
    t.append("command", "$ x\n")
    t.append("stdout", "out1\nout2\n")
    t.append("stderr", "err\n")
    pieces, hidden = t.tail("main", 3)
    assert pieces == [["stdout", "out2\n"], ["stderr", "err\n"]] and hidden == 2


def test_the_kept_text_is_bounded_and_what_fell_out_is_counted() -> None:
    t = Transcript(PANES, limit=100)
    for _ in range(20):
        t.append("stdout", "x" * 9 + "\n")
        t.append("stderr", "e\n")
    assert len(t.text()) <= 100
    assert t.dropped["stdout"] + t.dropped["stderr"] == 20 * 12 - len(t.text())
    assert t.tail("stdout", 1000)[1] == 20 - t.text("stdout").count("\n")  # dropped lines count as hidden


def test_rate_limit_spaces_rounds_and_caps_messages_per_second() -> None:
    r = RateLimit(max_messages=10, per=1.0, min_gap=0.1, slack=0.0)
    now = 100.0
    assert r.delay(2, now) == 0
    r.record(2, now)
    assert abs(r.delay(1, now + 0.05) - 0.05) < 1e-9  # rounds at least min_gap apart
    sent = 2
    t = now
    while t < now + 1.0:  # a flood: send whenever allowed
        t += r.delay(2, t)
        r.record(2, t)
        sent += 2
    window = [x for x in r._sent if x > t - 1.0]
    assert len(window) <= 10


def test_strip_ansi() -> None:
    assert strip_ansi("\x1b[1;31mred\x1b[0m \x1b]0;title\x07plain\x1b[2K") == "red plain"


def test_lines_before_gives_whole_lines_above_a_views_top_line() -> None:
    t = Transcript({"stdout": "out", "stderr": "err"})
    for i in range(10):
        t.append("stdout", f"o{i}\n")
        t.append("stderr", f"e{i}\n")
    t.append("stdout", "par")
    t.append("stdout", "tial\nlast")  # one line in two appends; the unfinished one is never given
    assert t.lines_before("out", 8, 3, 10**6) == ([["stdout", f"o{i}\n"] for i in (5, 6, 7)], 5)
    assert t.lines_before("out", 2, 5, 10**6) == ([["stdout", "o0\n"], ["stdout", "o1\n"]], 0)
    assert t.lines_before("out", 11, 2, 10**6) == ([["stdout", "o9\n"], ["stdout", "partial\n"]], 9)
    assert t.lines_before("out", 8, 3, 7) == ([["stdout", "o6\n"], ["stdout", "o7\n"]], 6)  # the nearest fit
    assert t.lines_before("err", 3, 1, 10**6) == ([["stderr", "e2\n"]], 2)


def test_lines_before_skips_what_is_no_longer_kept() -> None:
    whole = Transcript({"stdout": "out", "x": "out"}, limit=10)
    for i in range(6):
        whole.append("stdout" if i % 2 else "x", f"L{i}\n")  # separate segments: whole lines dropped
    assert whole.lines_before("out", 6, 6, 10**6) == ([["stdout", "L3\n"], ["x", "L4\n"], ["stdout", "L5\n"]], 3)
    cut = Transcript({"stdout": "out", "x": "out"}, limit=10)
    for i in range(6):
        cut.append("stdout" if i % 2 else "x", f"L{i}\nM")  # each segment ends mid-line
    pieces, first = cut.lines_before("out", 6, 6, 10**6)
    assert (pieces, first) == ([["x", "M"], ["stdout", "L5\n"]], 5)  # line 4 ("M" + "L4") lost its start: not given
