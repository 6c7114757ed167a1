"""Dashboard without a browser: rows from jobs(), row buttons, Open, a fleet of two agents."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import remote_exec as rx
from remote_exec.jupyter import Dashboard, JobView
from remote_exec.jupyter.headless import HeadlessFrontEnd

from .conftest import gone, wait_for


@pytest.fixture
def dash(sb: rx.Sandbox, front: HeadlessFrontEnd) -> Iterator[Dashboard]:
    d = Dashboard(sb, interval=0.2)
    yield d
    d.close()


def row(d: Dashboard, job_id: str | None) -> dict[str, object] | None:
    return next((r for r in d.rows if r["job_id"] == job_id), None)


def test_rows_include_jobs_of_other_clients_with_a_tail_line(dash: Dashboard, jurl: str) -> None:
    with rx.connect(jurl) as other:
        proc = other.exec_remote(["bash", "-c", "printf 'first\\n\\033[32mgreen last\\n'; sleep 30"], label="train")
        wait_for(lambda: (_refresh(dash, proc.job_id) or {}).get("tail") == "green last", what="row with a tail")
        r = row(dash, proc.job_id)
        assert r is not None
        assert (r["state"], r["label"], r["tail"], r["exit_code"]) == ("running", "train", "green last", None)
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
        fleet = Dashboard([a, b])
        try:
            fleet.refresh()
            assert fleet.sandboxes == [a.url, b.url]
            ra, rb = row(fleet, ja.job_id), row(fleet, jb.job_id)
            assert ra is not None and rb is not None
            assert (ra["sandbox"], ra["tail"], rb["sandbox"], rb["tail"]) == (0, "from-a", 1, "from-b")
            b.close()  # one sandbox gone: its error is shown, the other's rows stay
            fleet.refresh()
            assert row(fleet, ja.job_id) is not None and b.url in fleet.errors
        finally:
            fleet.close()


def test_plain_text_dashboard(sb: rx.Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REMOTE_EXEC_NONINTERACTIVE", "1")
    proc = sb.exec_remote(["echo", "x"])
    proc.wait()
    d = Dashboard(sb)  # refreshes at once: a plain front end shows a snapshot
    try:
        bundle = d._repr_mimebundle_()
        assert list(bundle) == ["text/plain"] and str(proc.job_id) in bundle["text/plain"]
        assert bundle["text/plain"].splitlines()[0].split() == ["sandbox", "job", "state", "exit", "elapsed", "out",
                                                              "command"]  # fmt: skip
    finally:
        d.close()
