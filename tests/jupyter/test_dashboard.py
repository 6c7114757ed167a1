"""Dashboard without a browser: rows from jobs(), row buttons, Open, a fleet of two agents; whose
jobs are shown, filters, shell runs folded, pages, "clear finished", rows sent only when changed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import remote_exec as rx
from remote_exec.jupyter import Dashboard, JobView
from remote_exec.jupyter.dashboard_view import KERNEL_TAG, NOTEBOOK_TAG, Identity, is_mine
from remote_exec.jupyter.headless import HeadlessFrontEnd
from remote_exec.protocol import JobInfo

from .conftest import gone, wait_for


@pytest.fixture
def dash(sb: rx.Sandbox, front: HeadlessFrontEnd) -> Iterator[Dashboard]:
    d = Dashboard(sb, interval=0.2, mine_only=False)  # the shared agent: every test's jobs
    yield d
    d.close()


def row(d: Dashboard, job_id: str | None) -> dict[str, object] | None:
    return next((r for r in d.rows if r["job_id"] == job_id), None)


def test_rows_include_jobs_of_other_clients_with_a_tail_line(dash: Dashboard, jurl: str) -> None:
    with rx.connect(jurl) as other:
        script = "set -e\nprintf 'first\\n\\033[32mgreen last\\n'; sleep 30"
        proc = other.exec_remote(["bash", "-c", script], label="train", tags={"name": "job1"})
        wait_for(lambda: (_refresh(dash, proc.job_id) or {}).get("tail") == "green last", what="row with a tail")
        r = row(dash, proc.job_id)
        assert r is not None
        assert (r["state"], r["label"], r["tail"], r["exit_code"]) == ("running", "train", "green last", None)
        # the name leads the row, then the script's first meaningful line (not "set -e")
        assert (r["name"], r["title"]) == ("job1", "[train] printf 'first\\n\\033[32mgreen last\\n'; sleep 30")
        assert r["bytes"] == len("first\n\x1b[32mgreen last\n") and r["sandbox"] == 0
        proc.kill()
    r = _refresh(dash, proc.job_id)
    assert r is not None and r["state"] == "killed"
    assert str(proc.job_id) in repr(dash)  # plain-text table


def _refresh(d: Dashboard, job_id: str | None) -> dict[str, object] | None:
    d.refresh()
    return row(d, job_id)


def test_buttons_kill_interrupt_and_open(dash: Dashboard, sb: rx.Sandbox, front: HeadlessFrontEnd) -> None:
    victim = sb.exec_remote(["bash", "-c", "sleep 300 & sleep 300"], kill_grace=0.5)
    polite = sb.exec_remote(["bash", "-c", "trap 'echo bye; exit 0' INT; echo hello; while :; do sleep 0.05; done"])
    front.send(dash, {"type": "hello"})  # starts the auto refresh
    wait_for(lambda: row(dash, victim.job_id) and row(dash, polite.job_id), what="rows")
    front.send(dash, {"type": "kill", "sandbox": 0, "job_id": victim.job_id})
    assert gone(victim.pid)
    wait_for(lambda: (r := row(dash, victim.job_id)) is not None and r["state"] == "killed", what="killed row")

    front.send(dash, {"type": "open", "sandbox": 0, "job_id": polite.job_id})
    wait_for(lambda: isinstance(dash.opened, JobView), what="opened view")
    view = dash.opened
    assert isinstance(view, JobView) and view.job_id == polite.job_id
    # The trait is set on the loop thread a moment before its state message is sent: wait for it.
    wait_for(lambda: any("opened" in u for u in front.updates(dash)), what="the opened view's state message")
    update = next(u for u in front.updates(dash) if "opened" in u)
    assert update["opened"] == f"anywidget:{view.model_id}"  # the front end renders it by reference
    wait_for(lambda: view.text("stdout") == "hello\n", what="replayed output")
    front.send(dash, {"type": "interrupt", "sandbox": 0, "job_id": polite.job_id})
    outcome = view.wait(20)
    assert outcome is not None and outcome.state == "completed" and view.text("stdout") == "hello\nbye\n"
    front.send(dash, {"type": "close_view"})
    wait_for(lambda: dash.opened is None, what="closed view")
    assert view.comm is None


def test_auto_refresh_can_be_switched_off(dash: Dashboard, sb: rx.Sandbox, front: HeadlessFrontEnd) -> None:
    front.send(dash, {"type": "auto", "on": False})
    wait_for(lambda: not dash.auto_refresh, what="auto off")
    proc = sb.exec_remote(["true"])
    proc.wait()
    front.send(dash, {"type": "refresh"})
    wait_for(lambda: row(dash, proc.job_id) is not None, what="manual refresh")


def test_fleet_view_over_two_sandboxes(jurl: str, fresh_agent_dir: Path, front: HeadlessFrontEnd) -> None:
    with rx.connect(jurl) as a, rx.connect(f"local://?dir={fresh_agent_dir}") as b:
        ja, jb = a.exec_remote(["echo", "from-a"]), b.exec_remote(["echo", "from-b"])
        ja.wait(), jb.wait()
        fleet = Dashboard([a, b], mine_only=False)
        try:
            fleet.refresh()
            assert fleet.sandboxes == [a.url, b.url]
            ra, rb = row(fleet, ja.job_id), row(fleet, jb.job_id)
            assert ra is not None and rb is not None
            assert (ra["sandbox"], ra["tail"], rb["sandbox"], rb["tail"]) == (0, "from-a", 1, "from-b")
            b.close()  # one sandbox gone: its error is shown (in the blocking API's words), the other's rows stay
            fleet.refresh()
            assert row(fleet, ja.job_id) is not None
            assert fleet.errors[b.url] == "this sandbox is closed; open a new one with rx.connect()"
        finally:
            fleet.close()


def test_plain_text_dashboard(sb: rx.Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REMOTE_EXEC_NONINTERACTIVE", "1")
    proc = sb.exec_remote(["echo", "x"])
    proc.wait()
    d = Dashboard(sb, mine_only=False)  # refreshes at once: a plain front end shows a snapshot
    try:
        bundle = d._repr_mimebundle_()
        assert list(bundle) == ["text/plain"] and str(proc.job_id) in bundle["text/plain"]
        assert bundle["text/plain"].splitlines()[0].split() == ["sandbox", "job", "state", "exit", "elapsed", "out",
                                                              "command"]  # fmt: skip
    finally:
        d.close()


def test_only_this_kernels_jobs_by_default_with_a_toggle_for_all(sb: rx.Sandbox, front: HeadlessFrontEnd) -> None:
    mine = sb.exec_remote(["sleep", "30"], label="mine")
    theirs = sb.exec_remote(["sleep", "30"], label="theirs")
    d = Dashboard(sb, known=[mine])  # the handles this kernel created count as its own
    try:
        wait_for(lambda: mine.job_id is not None and theirs.job_id is not None, what="started")
        d.refresh()
        assert row(d, mine.job_id) is not None and row(d, theirs.job_id) is None
        assert d.counts["total"] > d.counts["scope"] >= 1
        assert "jobs of other clients hidden (mine_only=False shows them)" in repr(d)
        d.mine_only = False  # the "only mine" box unticked
        wait_for(lambda: row(d, theirs.job_id) is not None, what="every client's jobs")
    finally:
        d.close()
        mine.kill()
        theirs.kill()


class _Tagged(JobInfo):
    tags: dict[str, str] | None = None  # what the job protocol's optional tags will carry


def _info(job_id: str, tags: dict[str, str] | None = None) -> JobInfo:
    fields = {"job_id": job_id, "pid": 1, "command": "x", "label": None, "state": "running", "exit_code": None,
              "started_at": 0.0, "ended_at": None, "stdout_bytes": 0, "stderr_bytes": 0, "stdin_open": False,
              "stdin_bytes": 0, "encoding": "utf-8"}  # fmt: skip
    return JobInfo.model_validate(fields) if tags is None else _Tagged.model_validate({**fields, "tags": tags})


def test_tags_name_the_kernel_or_the_notebook() -> None:
    who = Identity(kernel_id="k1", notebook="work/a.ipynb")
    assert is_mine(_info("j1", {KERNEL_TAG: "k1"}), who)
    # a job of an earlier kernel of the same notebook (after a restart) is still mine
    assert is_mine(_info("j2", {KERNEL_TAG: "k0", NOTEBOOK_TAG: "work/a.ipynb"}), who)
    assert not is_mine(_info("j3", {NOTEBOOK_TAG: "other.ipynb"}), who)
    assert not is_mine(_info("j4"), who) and is_mine(_info("j4"), who, {"j4"})


@pytest.fixture
def own(fresh_agent_dir: Path) -> Iterator[rx.Sandbox]:
    """A sandbox whose agent holds only this test's jobs."""
    with rx.connect(f"local://?dir={fresh_agent_dir}") as s:
        yield s


def test_shell_runs_fold_under_their_session(own: rx.Sandbox, front: HeadlessFrontEnd) -> None:
    plain = own.exec_remote(["echo", "plain"])
    plain.wait()
    shell = own.shell()
    shell.run("echo one")
    shell.run("echo two")
    d = Dashboard(own, mine_only=False)
    try:
        d.refresh()
        kinds = [(r["kind"], r["command"]) for r in d.rows]
        assert kinds == [("session", "echo two"), ("job", "echo plain")]  # newest first, one line per session
        session = d.rows[0]
        assert (session["count"], session["running"], session["session"]) == (2, 0, shell.session_id)
        d.expanded = [session["key"]]  # the fold button
        wait_for(lambda: len(d.rows) == 4, what="unfolded session")
        assert [(r["command"], r["depth"]) for r in d.rows[:3]] == [("echo two", 0), ("echo two", 1), ("echo one", 1)]
    finally:
        d.close()
        shell.close()


def test_filters_paging_and_clear_finished(own: rx.Sandbox, front: HeadlessFrontEnd) -> None:
    done = [own.exec_remote(["sh", "-c", f"exit {i % 2}"], label=f"batch-{i}") for i in range(7)]
    for p in done:
        p.wait()
    runner = own.exec_remote(["sleep", "30"], label="long")
    d = Dashboard(own, mine_only=False, page_size=3)
    try:
        d.refresh()
        assert d.counts["pages"] == 3 and len(d.rows) == 3 and d.rows[0]["job_id"] == runner.job_id
        d.page = 2
        wait_for(lambda: d.counts["page"] == 2 and len(d.rows) == 2, what="last page")
        d.state_filter = "failed"  # a new filter starts at page 1
        wait_for(lambda: d.page == 0 and d.counts["matching"] == 3, what="failed jobs")
        assert all(r["exit_code"] == 1 for r in d.rows)
        d.state_filter, d.text_filter = "all", "LONG"
        wait_for(lambda: [r["job_id"] for r in d.rows] == [runner.job_id], what="text filter")
        d.text_filter = ""
        d.clear_finished()  # the running job stays; the finished ones are hidden, not released
        assert [r["job_id"] for r in d.rows] == [runner.job_id] and d.counts["cleared"] == 7
        assert len(own.jobs()) == 8
        d.show_cleared()
        assert d.counts["matching"] == 8
    finally:
        d.close()
        runner.kill()


def test_rows_are_sent_only_when_they_change(own: rx.Sandbox, front: HeadlessFrontEnd) -> None:
    a = own.exec_remote(["sleep", "30"])
    b = own.exec_remote(["sleep", "30"])
    d = Dashboard(own, mine_only=False, interval=60)  # refreshed by hand below
    try:
        front.send(d, {"type": "hello"})  # a view rendered: every row, once
        wait_for(lambda: [m for m in front.custom(d) if len(m["rows"]) == 2], what="first rows")
        first = front.custom(d)[-1]
        assert first["order"] == [b.job_id, a.job_id]
        d.refresh()
        d.refresh()
        assert front.custom(d) == [first]  # nothing changed: nothing sent
        a.kill()
        d.refresh()
        last = front.custom(d)[-1]
        assert [r["job_id"] for r in last["rows"]] == [a.job_id] and last["rows"][0]["state"] == "killed"
        assert last["order"] == first["order"]
        updates = front.updates(d)
        assert not any("rows" in u for u in updates)  # rows are messages, not state
    finally:
        d.close()
        b.kill()


def test_a_closed_sandbox_is_named_in_the_words_of_its_api(jurl: str) -> None:
    sb = rx.connect(jurl)
    sb.close()
    with pytest.raises(rx.SandboxClosedError, match=r"open a new one with rx\.connect\(\)") as info:
        Dashboard(sb)
    assert "async with" not in str(info.value)


@pytest.mark.anyio
async def test_the_async_api_says_async_with(jurl: str) -> None:
    async with rx.open_sandbox(jurl) as asb:
        pass
    with pytest.raises(RuntimeError, match=r"async with rx\.open_sandbox"):
        await asb.jobs()
