"""The front end's per-model store (remote_exec/jupyter/static/common.js), run under Node without a browser.

What every view renders from: replays reset it, deltas append (older ones are ignored), the
tail is capped with a hidden-line count, ``\\r`` redraws a line, colours carry across chunks.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess

import pytest

from remote_exec.jupyter._assets import STATIC

SCRIPT = r"""
const out = {};
const store = new RxStore((s) => s, 3);
const msgs = [];
store.listeners.add((m) => msgs.push(m.kind));
store.handle({kind: "replay", seq: 4, now: 0, data: {now: Date.now() / 1000,
  panes: {stdout: {pieces: [["stdout", "a\nb\n"]], hidden: 7}}}});
store.handle({kind: "delta", seq: 3, data: [["stdout", "old\n"]]});  // before the replay: ignored
store.handle({kind: "delta", seq: 5, data: [["stdout", "c\nprogress 1\rprogress 2"], ["stderr", "e\n"]]});
const pane = store.pane("stdout");
out.lines = pane.lines.map((l) => l.map((p) => p.text).join(""));
out.hidden = pane.hidden;
out.base = pane.base;
out.stderr = store.pane("stderr").text();
out.msgs = msgs;
const colours = new RxPane(10);
colours.feed("stdout", "\x1b[31mred ");
colours.feed("stdout", "line\nstill red\x1b[0m");
out.sgr = colours.lines.map((l) => l.map((p) => p.sgr.fg));
const v = colours.version;
colours.feed("stdout", " more");
out.changed = colours.lines.map((l) => l.v > v);
console.log(JSON.stringify(out));
"""


def test_store_replay_delta_tail_and_colours() -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    code = (STATIC / "common.js").read_text() + SCRIPT
    proc = subprocess.run([node, "-e", code], capture_output=True, text=True, timeout=30, check=True)
    out = json.loads(proc.stdout)
    assert out["lines"] == ["b", "c", "progress 2"]  # 3 lines kept; the \r redrew the last one
    assert out["hidden"] == 7 + 1 and out["base"] == 1  # "a" fell off the top
    assert out["stderr"] == "e\n"
    assert out["msgs"] == ["replay", "delta"]  # the stale delta never reaches a view
    assert out["sgr"] == [[None], [1]]  # each part starts in the colour in force: red carries into line 2
    assert out["changed"] == [False, True]  # only the line that changed is re-rendered


ARRIVALS = r"""
const store = new RxStore((s) => s, 100);
store.handle({kind: "replay", seq: 1, data: {now: Date.now() / 1000,
  panes: {stdout: {pieces: [["stdout", "replayed\npartial "]], hidden: 0}}}});
const before = Date.now();
for (let seq = 2; seq < 2 + 5000; seq++) store.handle({kind: "delta", seq, data: [["stdout", `chunk ${seq}\n`]]});
const pane = store.pane("stdout");
const times = pane.lines.filter((l) => l.length).map((l) => l.t);
console.log(JSON.stringify({
  kept: pane.lines.length,
  timed: times.filter((t) => typeof t === "number" && t >= before).length,
  untimed: times.filter((t) => t === null || t === undefined).length,
}));
"""


def test_arrival_times_are_kept_per_line_and_capped_with_the_lines() -> None:
    """One arrival time per kept line: 5000 chunks into a 100-line pane keep 100 times, not 5000."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    code = (STATIC / "common.js").read_text() + ARRIVALS
    proc = subprocess.run([node, "-e", code], capture_output=True, text=True, timeout=30, check=True)
    out = json.loads(proc.stdout)
    assert out["kept"] == 100  # the cap holds; the times live on the lines, so they go with them
    assert out["timed"] == 99 and out["untimed"] == 0  # every text line kept has its arrival time


HINTS = r"""
const model = (traits) => ({get: (k) => traits[k]});
const evil = 'import os; os.system("id")';
console.log(JSON.stringify([
  rxAttachHint(model({job_id: "j0a1b2c3d4e5f6a7b", sandbox: "docker://box", hint: evil})),
  rxAttachHint(model({job_id: "j-1", sandbox: "k8s://ns/pod?kubectl=./x y"})),
  rxAttachHint(model({job_id: "j-1", sandbox: "ssh://h?config=./c'x"})),
  rxAttachHint(model({job_id: 'x{__import__("os")}', sandbox: "local://", hint: evil})),
  rxAttachHint(model({job_id: "j-1", sandbox: "local://\nimport os"})),
]));
"""


def test_a_disconnected_views_hint_is_made_from_its_id_and_url() -> None:
    """A stranger's notebook can save any widget state, a ready-made ``hint`` included: the
    views build the magic they tell the user to paste from the job id and URL (trust.py's rules),
    so a saved hint is never shown, nor a hint for an unsafe id or a URL of more than one line."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    code = (STATIC / "common.js").read_text() + HINTS
    proc = subprocess.run([node, "-e", code], capture_output=True, text=True, timeout=30, check=True)
    assert json.loads(proc.stdout) == [
        "%exec_remote_attach j0a1b2c3d4e5f6a7b --sandbox docker://box",
        "",  # a space: not one plain word of a line
        "%exec_remote_attach j-1 --sandbox 'ssh://h?config=./c'\"'\"'x'",
        "",
        "",
    ]
    for view in ("job_view.js", "terminal_view.js"):
        assert 'model.get("hint")' not in (STATIC / view).read_text()


def test_a_reconnects_values_reach_python_as_exactly_those_strings() -> None:
    """Every widget's Reconnect (connection.js) writes the call's values as Python string
    literals: whatever a saved widget state holds -- quotes, backslashes, braces, U+2028 (a line
    break to IPython), an astral character -- Python reads back exactly that string, one line."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    values = ['a"b', "c\\d", "{__import__('os')}", "x\u2028y\u0085z\u2029", "😀", "$HOME\n1"]
    code = (
        STATIC / "connection.js"
    ).read_text() + f"\nconsole.log(JSON.stringify({json.dumps(values)}.map(rxPyString)));"
    proc = subprocess.run([node, "-e", code], capture_output=True, text=True, timeout=30, check=True)
    literals = json.loads(proc.stdout)
    for value, literal in zip(values, literals, strict=True):
        assert literal.isascii() and "\n" not in literal and len(literal.splitlines()) == 1, literal
        assert ast.literal_eval(literal) == value
