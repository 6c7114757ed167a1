"""A notebook that tells the truth (#15): stored records, handles that follow their job, one
kill outcome, named --bg jobs, and attaching from a later kernel — headless, on a real agent."""

from __future__ import annotations

import html
import shlex
import time
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

import remote_exec as rx
from remote_exec.jupyter import JobView, RemoteCommandError, job_view
from remote_exec.jupyter.background import BackgroundJob
from remote_exec.jupyter.headless import HeadlessFrontEnd
from remote_exec.jupyter.record import ansi_to_html
from remote_exec.jupyter.saving import DRAFT_MIME, RECORD_DRAFT, RECORD_META
from remote_exec.jupyter.trust import attach_hint

from .conftest import gone, wait_for

WIDGET = "application/vnd.jupyter.widget-view+json"


def newest_record(outputs: list[Any], kind: str = "text/html", drafts_only: bool = False) -> str:
    """The newest record among captured outputs: a draft's (while the job runs) or a view's own
    output rewritten (at its end, or as first shown)."""
    found = ""
    for o in outputs:
        draft = o.metadata.get(RECORD_DRAFT)
        if isinstance(draft, dict) and "data" in draft:
            found = draft["data"][kind]
        elif kind in o.data and RECORD_META in o.metadata and not drafts_only:
            found = o.data[kind]
    return found


def test_ansi_colours_become_inline_styles_and_text_is_escaped() -> None:
    html = ansi_to_html("\x1b[1;32mok\x1b[0m <b>&\x1b[2K \x1b[38;2;1;2;3mrgb\x1b[m")
    assert html == (
        '<span style="color:#0d7d2c;font-weight:bold">ok</span> &lt;b&gt;&amp; <span style="color:#010203">rgb</span>'
    )


def test_the_stored_record_follows_the_job_to_its_end(
    ip: InteractiveShell, front: HeadlessFrontEnd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the job runs, only the draft beside the view is rewritten (a rewrite of the view's
    own output makes JupyterLab render a new view: a lost click, focus, scroll); at the end, the
    view's output gets the final record once and the draft is emptied."""
    monkeypatch.setattr(job_view, "RECORD_PERIOD", 0.2)
    gate = tmp_path / "gate"
    script = f"printf '\\033[31mred line\\033[0m\\n'; echo err >&2; while [ ! -e {gate} ]; do sleep 0.02; done; exit 3"
    with capture_output() as cap:
        ip.run_cell_magic("exec_remote", "--bg --name rec", script)
        job = ip.user_ns["rec"]
        first, draft = cap.outputs[:2]
        view_id = first.transient["display_id"]
        assert WIDGET in first.data  # the widget and its record, in one output
        assert first.data["text/plain"].startswith("[running] printf")
        assert first.metadata[RECORD_META]["display"] == view_id  # what the saver pairs the draft by
        assert draft.transient["display_id"] == f"{view_id}-draft" and draft.data["text/plain"] == ""
        assert draft.metadata[RECORD_DRAFT] == {"for": view_id}  # nothing newer yet
        wait_for(lambda: "err" in newest_record(cap.outputs, "text/plain", drafts_only=True), what="a draft")
        assert not [o for o in cap.outputs[2:] if o.transient["display_id"] == view_id]  # the view: untouched
        gate.touch()
        wait_for(lambda: job.done, what="the job's end")
        assert job.view is not None and job.view.wait(10) is not None

        def rewrites() -> list[Any]:
            return [o for o in cap.outputs[2:] if o.transient["display_id"] == view_id]

        wait_for(rewrites, what="the final record")
        wait_for(lambda: cap.outputs[-1].metadata.get(RECORD_DRAFT) == {"for": view_id}, what="the draft emptied")
    (final,) = rewrites()  # once
    assert WIDGET in final.data
    plain, html = final.data["text/plain"], final.data["text/html"]
    assert plain.startswith("[failed] printf") and "exit 3" in plain and f"job {job.job_id}" in plain
    assert "red line" in plain and "\x1b" not in plain and "err" in plain
    assert '<span style="color:#cd3131">red line</span>' in html and ">failed<" in html and "exit 3" in html
    assert "<script" not in html


def test_the_saver_moves_a_drafts_record_into_its_view_and_drops_every_draft() -> None:
    """A notebook saved while a job runs (a kernel killed the next second): the view's output
    holds the record of the newest draft, checked as any record is; drafts are never saved."""
    from remote_exec.jupyter.saving import RECORD_MIME, keep_records

    mark = {"job_id": "j-1", "state": "running", "sandbox": "local://", "label": "x", "display": "d1"}
    view = {
        "output_type": "display_data",
        "metadata": {RECORD_META: mark},
        "data": {WIDGET: {"model_id": "m"}, "text/html": "<p>old</p>", "text/plain": "old"},
    }
    newest = {"text/html": "<p>newest</p>", "text/plain": "newest"}
    draft = {
        "output_type": "display_data",
        "metadata": {RECORD_DRAFT: {"for": "d1", "data": newest, "mark": {**mark, "state": "completed"}}},
        "data": {"text/plain": "", DRAFT_MIME: {}},
    }
    stray = {"output_type": "display_data", "metadata": {RECORD_DRAFT: {"for": "gone"}}, "data": {"text/plain": ""}}
    model: dict[str, Any] = {
        "type": "notebook",
        "content": {"cells": [{"cell_type": "code", "outputs": [view, draft, stray]}]},
    }
    keep_records(model)
    (kept,) = model["content"]["cells"][0]["outputs"]
    assert kept["data"]["text/html"] == "<p>newest</p>" and kept["data"]["text/plain"] == "newest"
    assert kept["data"][RECORD_MIME]["state"] == "completed" and WIDGET not in kept["data"]


@pytest.mark.parametrize(
    ("draft", "why"),
    [
        ({"for": "d1", "data": {"text/html": "x" * (256 * 1024 + 1), "text/plain": ""}, "mark": {}}, "too much HTML"),
        ({"for": "d1", "data": {"text/html": "<p>", "text/plain": ["no"]}, "mark": {}}, "text that is not text"),
        ({"for": "d1", "data": "<p>", "mark": {}}, "data that is not a bundle"),
        ({"for": "d1", "data": {"text/html": "<p>", "text/plain": "p"}, "mark": "m"}, "a mark that is not one"),
        ({"for": "other", "data": {"text/html": "<p>", "text/plain": "p"}, "mark": {}}, "another view's draft"),
    ],
)
def test_a_malformed_draft_changes_nothing(draft: object, why: str) -> None:
    from remote_exec.jupyter.saving import keep_records

    mark = {"job_id": "j-1", "state": "running", "display": "d1"}
    view = {
        "output_type": "display_data",
        "metadata": {RECORD_META: mark},
        "data": {"text/html": "<p>old</p>", "text/plain": "old"},
    }
    forged = {"output_type": "display_data", "metadata": {RECORD_DRAFT: draft}, "data": {"text/plain": ""}}
    model: dict[str, Any] = {
        "type": "notebook",
        "content": {"cells": [{"cell_type": "code", "outputs": [view, forged]}]},
    }
    keep_records(model)
    (kept,) = model["content"]["cells"][0]["outputs"]
    assert kept["data"]["text/html"] == "<p>old</p>", why
    assert kept["metadata"][RECORD_META]["job_id"] == "j-1", why


def test_a_running_record_says_how_to_reconnect(sb: rx.Sandbox, front: HeadlessFrontEnd) -> None:
    proc = sb.exec_remote(["bash", "-c", "echo hi; sleep 30"])
    view = JobView.attach(sb, proc.job_id or "")
    wait_for(lambda: view.text("stdout") == "hi\n", what="output")
    data = view._repr_mimebundle_()
    data = data[0] if isinstance(data, tuple) else data
    hint = f"%exec_remote_attach {proc.job_id} --sandbox {shlex.quote(sb.url)}"  # pasted: these values exactly
    assert html.escape(hint) in data["text/html"] and hint in data["text/plain"]
    assert attach_hint(view.job_id, view.sandbox) == hint  # what the view says once its kernel is gone (rxAttachHint)
    view.kill()
    assert gone(proc.pid)


def test_handles_follow_the_job_without_wait(ip: InteractiveShell, front: HeadlessFrontEnd) -> None:
    with capture_output():
        ip.run_cell_magic("exec_remote", "--bg --name job3 --no-widget", "exit 5")
    job: BackgroundJob = ip.user_ns["job3"]
    wait_for(lambda: job.done, what="done without wait()")
    assert job.returncode == 5 and job.state == "failed"


@pytest.mark.parametrize("how", ["button", "code"])
def test_kill_then_wait_is_the_same_from_the_button_and_from_code(
    ip: InteractiveShell, front: HeadlessFrontEnd, how: str
) -> None:
    with capture_output() as cap:
        ip.run_cell_magic("exec_remote", "--bg --name victim", "echo before; sleep 30")
    job: BackgroundJob = ip.user_ns["victim"]
    assert job.view is not None
    wait_for(lambda: job.view is not None and job.view.text("stdout") == "before\n", what="output")
    if how == "button":
        front.send(front.widget(cap.outputs[0]), {"type": "kill"})
    else:
        job.kill()
    result = job.wait()  # never JobKilledError: a kill is one of the job's ends
    assert result.state == "killed" and result.stdout == "before\n" and not result.success
    wait_for(lambda: job.done, what="the view's end")
    assert job.state == "killed" and job.returncode == result.returncode
    assert gone(job.process.pid)


def test_a_named_bg_cell_attaches_while_its_job_runs_and_replace_kills_it(
    ip: InteractiveShell, front: HeadlessFrontEnd
) -> None:
    with capture_output():
        ip.run_cell_magic("exec_remote", "--bg --name dup --no-widget", "sleep 30")
    first: BackgroundJob = ip.user_ns["dup"]
    with capture_output() as cap:  # no second job (tests/jupyter/test_rerun.py has the rest)
        ip.run_cell_magic("exec_remote", "--bg --name dup --no-widget", "sleep 30")
    assert cap.stdout == f"dup is still running (job {first.job_id}): attached; --replace restarts it\n"
    assert ip.user_ns["dup"] is first and first.state == "running"
    with capture_output():
        ip.run_cell_magic("exec_remote", "--bg --name dup --replace --no-widget", "echo second")
    assert first.state == "killed" and gone(first.process.pid)
    assert ip.user_ns["dup"].wait().stdout == "second\n"


def test_attach_after_a_restart_finds_the_job_by_name_with_its_true_command_and_start(
    ip: InteractiveShell, front: HeadlessFrontEnd, sb: rx.Sandbox, jurl: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JPY_SESSION_NAME", "/home/me/work.ipynb")
    with capture_output():
        ip.run_cell_magic("exec_remote", "--bg --name long --no-widget", "echo one; sleep 30")
    old: BackgroundJob = ip.user_ns["long"]
    (info,) = [j for j in sb.jobs() if j.job_id == old.job_id]
    assert info.tags == {"notebook": "/home/me/work.ipynb", "name": "long"}  # stored by the agent
    attached_at = time.time()
    # A restarted kernel: what its exit does (--bg jobs left running), then a fresh magics
    # instance (no handles, no names) on the same agent.
    ip.magics_manager.registry["RemoteExecMagics"].state.close(keep_background=True)
    ip.run_line_magic("unload_ext", "remote_exec")
    del ip.user_ns["long"]
    ip.run_line_magic("load_ext", "remote_exec")
    ip.run_line_magic("exec_remote_config", f"--sandbox {jurl}")
    with capture_output() as cap:
        ip.run_line_magic("exec_remote_attach", "long")
    job: BackgroundJob = ip.user_ns["long"]
    assert job.job_id == old.job_id and job.view is not None
    view = front.widget(cap.outputs[0])
    assert view is job.view and view.command == "echo one; sleep 30"
    assert view.started_at == info.started_at < attached_at  # elapsed counts from the job's start
    front.send(view, {"type": "hello"})
    wait_for(lambda: view.text("stdout") == "one\n", what="the full replay")
    job.kill()
    assert job.wait().state == "killed" and gone(old.process.pid)


def test_attach_names_what_it_could_not_find(ip: InteractiveShell) -> None:
    with pytest.raises(RemoteCommandError, match="no job 'nosuch'"):
        ip.run_line_magic("exec_remote_attach", "nosuch")


def test_a_saved_notebook_keeps_the_record_in_place_of_the_widget(
    ip: InteractiveShell, front: HeadlessFrontEnd
) -> None:
    """The server's pre-save hook (remote_exec.jupyter.saving) drops the widget of a view's output
    and keeps its record; any other widget output is saved as the browser sent it."""
    import json

    import nbformat

    from remote_exec.jupyter.saving import RECORD_META, RECORD_MIME, keep_records

    with capture_output() as cap:
        ip.run_cell_magic("exec_remote", "--bg --name saved", "echo saved-line")
        assert ip.user_ns["saved"].view.wait(30) is not None
    view_output = cap.outputs[0]
    other = {"output_type": "display_data", "metadata": {}, "data": {WIDGET: {"model_id": "x"}, "text/plain": "w"}}
    cell = nbformat.v4.new_code_cell("%%exec_remote --bg --name saved\necho saved-line")
    cell.outputs = [
        nbformat.v4.new_output("display_data", data=view_output.data, metadata=view_output.metadata),
        other,
    ]
    model = {"type": "notebook", "content": json.loads(json.dumps(nbformat.v4.new_notebook(cells=[cell])))}
    keep_records(model, path="x.ipynb", contents_manager=None)
    kept, untouched = model["content"]["cells"][0]["outputs"]
    assert WIDGET not in kept["data"] and RECORD_META in kept["metadata"]
    assert kept["data"]["text/html"].startswith("<div data-remote-exec-record=")
    state = kept["metadata"][RECORD_META]["state"]  # as shown when it was saved
    assert kept["data"]["text/plain"].startswith(f"[{state}] echo saved-line")
    assert untouched == other
    # what the JupyterLab extension reads: enough to reconnect, and the record to show meanwhile
    assert kept["data"][RECORD_MIME] == {
        "kind": "job",
        "job_id": ip.user_ns["saved"].job_id,
        "sandbox": ip.user_ns["saved"].view.sandbox,
        "label": "echo saved-line",
        "state": state,
        "html": kept["data"]["text/html"],
    }
    nbformat.validate(nbformat.from_dict(model["content"]))


@pytest.mark.parametrize(
    ("mark", "html", "why"),
    [
        ({"jobs": True}, "<div></div>", "an old dashboard mark: nothing to reconnect"),
        ({"kind": "dashboard", "sandboxes": []}, "<div></div>", "a dashboard of no sandbox"),
        ({"kind": "dashboard", "sandboxes": ["local://"] * 65}, "<div></div>", "too many sandboxes"),
        ({"kind": "dashboard", "sandboxes": ["local://", 7]}, "<div></div>", "a sandbox that is not text"),
        ({"kind": "dashboard", "sandboxes": ["s" * 2001]}, "<div></div>", "too long a sandbox URL"),
        ({"kind": "shell", "session_id": "s{__import__('os')}"}, "<div></div>", "a shell id IPython would expand"),
        ({"kind": "shell", "job_id": "j-1"}, "<div></div>", "a shell with no session id"),
        ({"kind": "exec", "job_id": "j-1"}, "<div></div>", "a kind nobody reconnects"),
        ({"job_id": "x'); import os #", "state": "running"}, "<div></div>", "not a job id"),
        ({"job_id": "a" * 129, "state": "running"}, "<div></div>", "too long an id"),
        ({"job_id": "j{__import__('os')}", "state": "running"}, "<div></div>", "an id IPython would expand"),
        ({"job_id": "-j", "state": "running"}, "<div></div>", "an id that reads as an option"),
        ({"job_id": "j-1", "state": "running"}, "x" * (256 * 1024 + 1), "too much HTML"),
        ({"job_id": "j-1", "state": "running"}, ["not", "text"], "HTML that is not text"),
    ],
)
def test_the_saver_adds_no_reconnect_bundle_it_cannot_vouch_for(mark: object, html: object, why: str) -> None:
    """The notebook comes from the browser: a forged or oversized mark gives no bundle, and a
    bundle already in the output (stale or forged) is dropped rather than kept."""
    from remote_exec.jupyter.saving import RECORD_META, RECORD_MIME, keep_records

    output = {
        "output_type": "display_data",
        "metadata": {RECORD_META: mark},
        "data": {"text/html": html, "text/plain": "r", RECORD_MIME: {"job_id": "forged"}},
    }
    model = {"type": "notebook", "content": {"cells": [{"cell_type": "code", "outputs": [output]}]}}
    keep_records(model)
    assert RECORD_MIME not in output["data"], why


def test_the_saver_bounds_each_field_of_the_bundle() -> None:
    from remote_exec.jupyter.saving import saved_record

    got = saved_record({"job_id": "j-1", "state": "<b>", "sandbox": "s" * 5000, "label": 7}, "<div></div>")
    assert got == {
        "kind": "job",
        "job_id": "j-1",
        "sandbox": "s" * 2000,
        "label": "",
        "state": "unknown",
        "html": "<div></div>",
    }
    shell = saved_record({"kind": "shell", "session_id": "s-1", "state": "busy", "sandbox": "local://"}, "<p>")
    assert shell == {
        "kind": "shell",
        "session_id": "s-1",
        "sandbox": "local://",
        "label": "",
        "state": "unknown",
        "html": "<p>",
    }
    dash = saved_record({"kind": "dashboard", "sandboxes": ["local://", "docker://c"]}, "<table>")
    assert dash == {"kind": "dashboard", "sandboxes": ["local://", "docker://c"], "html": "<table>"}


def test_a_kernel_says_which_jobs_it_shows_and_shows_one_again(ip: InteractiveShell, front: HeadlessFrontEnd) -> None:
    """What the JupyterLab extension asks on a reloaded page (``live_view``) and then runs
    (``show_again``): the same view, displayed again with its record, as long as it is open."""
    from remote_exec.errors import JobNotFoundError
    from remote_exec.jupyter.attach import live_view, show_again

    with capture_output():
        ip.run_cell_magic("exec_remote", "--bg --name shown", "echo shown-line")
    job: BackgroundJob = ip.user_ns["shown"]
    view = job.view
    assert view is not None and job.job_id is not None
    assert live_view(job.job_id) and not live_view("nosuch")
    with capture_output() as cap:
        show_again(job.job_id)
    assert front.widget(cap.outputs[0]) is view and view.wait(30) is not None
    assert cap.outputs[0].data["text/html"].startswith("<div data-remote-exec-record=")
    view.close()
    assert not live_view(job.job_id)
    with pytest.raises(JobNotFoundError, match="shows no view of job"):
        show_again(job.job_id)


def test_the_wheel_enables_the_server_extension_that_saves_records() -> None:
    import json
    import tomllib

    root = Path(__file__).resolve().parents[2]
    shared = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]
    source = {v: k for k, v in shared["shared-data"].items()}["etc/jupyter/jupyter_server_config.d/remote_exec.json"]
    config = json.loads((root / source).read_text())
    assert config == {"ServerApp": {"jpserver_extensions": {"remote_exec.jupyter.saving": True}}}


def test_reconnect_loads_the_extension_and_attaches_where_the_view_pointed(
    ip: InteractiveShell, front: HeadlessFrontEnd, jurl: str
) -> None:
    """What a disconnected view's Reconnect button runs in a fresh kernel (nothing loaded): a
    live view of its job in its sandbox, the handle under the cell's --name the front end passes.
    The sandbox is not on the one-click list (``local://?dir=``): the kernel opens it only once
    the user has (here: the notebook's config cell, run again); before, it names the magic."""
    from remote_exec.jupyter.attach import reconnect

    with capture_output():
        ip.run_cell_magic("exec_remote", "--bg --name again --no-widget", "echo back; sleep 30")
    old: BackgroundJob = ip.user_ns.pop("again")
    ip.magics_manager.registry["RemoteExecMagics"].state.close(keep_background=True)
    ip.run_line_magic("unload_ext", "remote_exec")
    with pytest.raises(UsageError, match="Not opened") as refusal:
        reconnect(jurl, old.job_id or "", "again")
    assert "RemoteExecMagics" in ip.magics_manager.registry
    assert f"%exec_remote_attach {old.job_id} --sandbox '{jurl}'" in str(refusal.value)
    assert "again" not in ip.user_ns
    ip.run_line_magic("exec_remote_config", f"--sandbox {jurl}")
    with capture_output() as cap:
        reconnect(jurl, old.job_id or "", "again")
    job: BackgroundJob = ip.user_ns["again"]
    view = job.view
    assert view is not None and front.widget(cap.outputs[0]) is view
    assert job.job_id == old.job_id and view.command == "echo back; sleep 30"
    front.send(view, {"type": "hello"})
    wait_for(lambda: view.text("stdout") == "back\n", what="the full replay")
    job.kill()
    assert job.wait().state == "killed" and gone(old.process.pid)


def test_shell_and_foreground_cells_are_tagged_so_a_later_kernel_finds_them(
    ip: InteractiveShell, sb: rx.Sandbox, jurl: str, plain: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``%%exec_remote --shell`` runs and foreground cells carry the notebook's tags like --bg jobs:
    a fresh kernel of the same notebook (no handles) lists them under ``%remote_jobs --mine``."""
    monkeypatch.setenv("JPY_SESSION_NAME", "/home/me/shells.ipynb")
    with capture_output():
        ip.run_cell_magic("exec_remote", "--shell new", "echo in-a-shell")
        ip.run_cell_magic("exec_remote", "", "echo in-the-foreground")
    tagged = {j.job_id: j for j in sb.jobs() if (j.tags or {}).get("notebook") == "/home/me/shells.ipynb"}
    shell_runs = [j for j in tagged.values() if (j.label or "").startswith("shell ")]
    assert len(shell_runs) == 1 and shell_runs[0].tags == {"notebook": "/home/me/shells.ipynb"}
    assert any(j.label == "%%exec_remote" for j in tagged.values())
    ip.magics_manager.registry["RemoteExecMagics"].state.close()  # a restart: no handles left
    ip.run_line_magic("unload_ext", "remote_exec")
    ip.run_line_magic("load_ext", "remote_exec")
    ip.run_line_magic("exec_remote_config", f"--sandbox {jurl}")
    with capture_output() as cap:
        ip.run_line_magic("remote_jobs", "")
    assert all(job_id in cap.stdout for job_id in tagged), cap.stdout


def test_the_dashboards_record_lists_its_jobs_and_follows_them(
    ip: InteractiveShell, front: HeadlessFrontEnd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``%remote_jobs`` shows the dashboard with a record of its rows from the start (not "no
    jobs"), marked to be saved in place of the widget, and rewritten as the jobs move."""
    import remote_exec.jupyter.dashboard as dashboard_module
    from remote_exec.jupyter import Dashboard
    from remote_exec.jupyter.saving import RECORD_META

    monkeypatch.setattr(dashboard_module, "RECORD_PERIOD", 0.1)  # the test need not wait 5 s
    gate = tmp_path / "gate"
    with capture_output():
        ip.run_cell_magic(
            "exec_remote", "--bg --name dj --no-widget", f"echo dash-line; until [ -e {gate} ]; do sleep 0.02; done"
        )
    job: BackgroundJob = ip.user_ns["dj"]
    with capture_output() as cap:
        ip.run_cell("%remote_jobs")
        first = cap.outputs[0]
        dash = front.widget(first)
        assert isinstance(dash, Dashboard) and WIDGET in first.data and RECORD_META in first.metadata
        assert job.job_id in first.data["text/plain"] and job.job_id in first.data["text/html"]
        assert ">running<" in first.data["text/html"]
        front.send(dash, {"type": "hello"})  # a view: the dashboard refreshes while shown
        gate.touch()

        wait_for(lambda: ">completed<" in newest_record(cap.outputs), what="the record with the job's end")
    final = [o for o in cap.outputs if getattr(o, "update", False)][-1]
    assert final.metadata[RECORD_DRAFT]["for"] == first.transient["display_id"]  # the dashboard's own draft
    assert final.metadata[RECORD_DRAFT]["mark"]["kind"] == "dashboard"
    record = newest_record(cap.outputs)
    assert "dash-line" in record and "data-remote-exec-record=" in record
    dash.close()


def test_a_view_as_a_cells_value_keeps_its_record_up_to_date(
    ip: InteractiveShell, front: HeadlessFrontEnd, sb: rx.Sandbox, tmp_path: Path
) -> None:
    """``JobView.attach(sb, job_id)`` as the last line of a cell is shown as ``show()`` shows it:
    with a display id, so its record is rewritten at the job's end (not frozen as displayed)."""
    gate = tmp_path / "gate"
    proc = sb.exec_remote(["bash", "-c", f"echo value-line; until [ -e {gate} ]; do sleep 0.02; done"])
    ip.user_ns.update(sb_=sb, job_id_=proc.job_id)
    with capture_output() as cap:
        ip.run_cell("from remote_exec.jupyter import JobView\nJobView.attach(sb_, job_id_)")
        first, draft = cap.outputs
        assert WIDGET in first.data and first.transient["display_id"]
        assert draft.metadata[RECORD_DRAFT] == {"for": first.transient["display_id"]}
        gate.touch()

        def ended() -> bool:
            return any(
                getattr(o, "update", False) and "[completed]" in o.data.get("text/plain", "") for o in cap.outputs
            )

        wait_for(ended, what="the record rewritten at the job's end")
    final = [o for o in cap.outputs if getattr(o, "update", False) and WIDGET in o.data][-1]
    assert final.transient["display_id"] == first.transient["display_id"] and "value-line" in final.data["text/html"]


def test_a_shells_reconnect_shows_the_same_session_and_its_record(
    ip: InteractiveShell, front: HeadlessFrontEnd, jurl: str
) -> None:
    """What a disconnected ShellView's Reconnect runs in a fresh kernel: the same session shown
    again (its cwd kept by the agent), its output marked with the record the saver keeps."""
    from remote_exec.jupyter import ShellView
    from remote_exec.jupyter.attach import reconnect_shell
    from remote_exec.jupyter.saving import RECORD_META, saved_record

    with capture_output() as cap:
        ip.run_line_magic("remote_shell", "--shell new")
    old = front.widget(cap.outputs[0])
    assert isinstance(old, ShellView)
    old.run("cd /tmp && echo here-it-was")
    meta = cap.outputs[0].metadata  # the first record; rewritten after the command
    display = cap.outputs[0].transient["display_id"]  # what the saver pairs the record's draft by
    want = {"kind": "shell", "session_id": old.session_id, "sandbox": jurl, "state": "open", "display": display}
    assert meta[RECORD_META] == want
    record = old.record()
    assert "here-it-was" in record.html() and "/tmp$" in record.plain()
    assert saved_record(meta[RECORD_META], record.html()) is not None
    ip.magics_manager.registry["RemoteExecMagics"].state.close(keep_background=True)  # the kernel goes
    ip.run_line_magic("unload_ext", "remote_exec")
    with pytest.raises(UsageError, match="Not opened") as refusal:
        reconnect_shell(jurl, old.session_id)
    assert f"%remote_shell --shell {old.session_id} --sandbox '{jurl}'" in str(refusal.value)
    ip.run_line_magic("exec_remote_config", f"--sandbox {jurl}")  # the notebook's set-up, run again
    with capture_output() as cap:
        reconnect_shell(jurl, old.session_id)
    view = front.widget(cap.outputs[0])
    assert isinstance(view, ShellView) and view.session_id == old.session_id and view.cwd == "/tmp"
    view.run("pwd")
    assert view.text("stdout") == "/tmp\n"  # run() returns once the command has ended
    view.session.close()


def test_a_dashboards_reconnect_shows_the_same_sandboxes(
    ip: InteractiveShell, front: HeadlessFrontEnd, jurl: str
) -> None:
    from remote_exec.jupyter import Dashboard
    from remote_exec.jupyter.attach import reconnect_dashboard
    from remote_exec.jupyter.saving import RECORD_META

    ip.run_line_magic("exec_remote_config", f"--sandbox {jurl}")
    with capture_output() as cap:
        reconnect_dashboard(jurl, jurl)  # the same URL twice: one sandbox
    dash = front.widget(cap.outputs[0])
    assert isinstance(dash, Dashboard) and dash.sandboxes == [jurl]
    display = cap.outputs[0].transient["display_id"]
    assert cap.outputs[0].metadata[RECORD_META] == {"kind": "dashboard", "sandboxes": [jurl], "display": display}
    dash.close()


def test_a_held_view_s_final_record_waits_for_the_release(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the final record rewrites the view's own output (which re-creates the live view in
    JupyterLab: a press spanning it never clicked). While a view says a person presses or types
    in it, that rewrite waits for the release; the record goes into the draft at once (what a
    save keeps meanwhile), as every record before it did."""
    import IPython.display

    from remote_exec.jupyter.record import HOLD_MAX, RecordedDisplay

    rewrites: list[tuple[str, str]] = []

    def update_display(data: dict[str, Any], *, display_id: str, metadata: dict[str, Any], **_: Any) -> None:
        draft = metadata.get(RECORD_DRAFT, {})
        rewrites.append((display_id, draft["data"]["text/plain"] if "data" in draft else data["text/plain"]))

    monkeypatch.setattr(IPython.display, "update_display", update_display)
    monkeypatch.setattr(IPython.display, "display", lambda *a, **k: None)
    value = ["v1"]
    shown = RecordedDisplay(lambda: ({"text/plain": value[0]}, {RECORD_META: {"job_id": "j-1"}}))
    shown.show("d1")
    shown.hold(True)
    value[0] = "v2"
    shown.update()  # a draft: never held
    assert rewrites == [("d1-draft", "v2")]
    value[0] = "v3"
    shown.update(final=True)
    assert rewrites[1:] == [("d1-draft", "v3")]  # held: the final record in the draft only
    shown.hold(False)
    assert rewrites[2:] == [("d1", "v3"), ("d1-draft", "")]  # the view's output, the draft emptied
    shown.hold(False)  # a second release: nothing pending, nothing sent
    assert len(rewrites) == 4
    shown.hold(True)  # a release that never comes lapses
    later = time.monotonic() + HOLD_MAX + 1
    monkeypatch.setattr(time, "monotonic", lambda: later)
    value[0] = "v4"
    shown.update(final=True)
    assert rewrites[4:] == [("d1", "v4"), ("d1-draft", "")]
