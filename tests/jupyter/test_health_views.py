"""Health in the views without a browser: the JobView's link follows a real SIGSTOP/SIGCONT of
the agent (lost, then connected, the job's output whole), the usage is sampled only while a
view watches, and the dashboard's rows carry CPU, memory and the quiet time."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import remote_exec as rx
from remote_exec.jupyter import Dashboard, JobView, job_view
from remote_exec.jupyter.headless import HeadlessFrontEnd

from .conftest import wait_for


def traits(front: HeadlessFrontEnd, widget: Any) -> list[dict[str, Any]]:
    return front.updates(widget)


def last(front: HeadlessFrontEnd, widget: Any) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for update in front.updates(widget):
        state.update(update)
    return state


def test_job_view_shows_lost_then_connected_and_loses_nothing(
    fresh_agent_dir: Path, front: HeadlessFrontEnd, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    script = f"echo before; while [ ! -e {gate} ]; do sleep 0.05; done; seq 1 2000"
    # A 3 s liveness bound, not the default 8: the rule is tested, not the number.
    with rx.connect(f"local://?dir={fresh_agent_dir}", liveness=3.0) as sb:
        view = JobView(sb.exec_remote(["bash", "-c", script]), command="freeze me")
        front.send(view, {"type": "hello"})
        wait_for(
            lambda: view.text("stdout") == "before\n" and last(front, view).get("link") == "connected", what="start"
        )
        os.kill(sb.info.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            wait_for(lambda: last(front, view).get("link") == "lost", timeout=60, what="link lost")
            took = time.monotonic() - t0
            bound = sb.async_sandbox.liveness.bound if sb.async_sandbox.liveness else 0
            print(f"\nJobView link lost {took:.2f} s after SIGSTOP (liveness bound {bound:g} s)")
            state = last(front, view)
            assert view.state == "running"  # the job is not declared over: the agent is only silent
            assert "heartbeat" in state["link_reason"]
            assert not view.done
        finally:
            os.kill(sb.info.pid, signal.SIGCONT)
        wait_for(lambda: last(front, view).get("link") == "connected", timeout=60, what="link back")
        gate.touch()
        outcome = view.wait(60)
        assert outcome is not None and outcome.state == "completed"
        assert view.text("stdout") == "before\n" + "".join(f"{i}\n" for i in range(1, 2001))
        links = [u["link"] for u in traits(front, view) if "link" in u]
        assert links[-2:] == ["lost", "connected"], links


def test_usage_is_sampled_only_while_a_view_watches(
    sb: rx.Sandbox, front: HeadlessFrontEnd, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Shorter than the real periods (2 s, 15 s): what is tested is the rule, not the numbers.
    monkeypatch.setattr(job_view, "SAMPLE_PERIOD", 0.3)
    monkeypatch.setattr(job_view, "WATCH_TTL", 3.0)
    proc = sb.exec_remote(["bash", "-c", "while :; do :; done"])  # one busy core
    view = JobView(proc, command="busy")

    renewed = [0.0]

    def watched(check: Callable[[], bool]) -> Callable[[], bool]:
        def renew_then_check() -> bool:  # the page renews its watch while it shows the view
            if time.monotonic() - renewed[0] > 0.5:
                front.send(view, {"type": "watch", "view": "v1", "on": True})
                renewed[0] = time.monotonic()
            return check()

        return renew_then_check

    try:
        front.send(view, {"type": "hello"})
        wait_for(lambda: last(front, view).get("link") == "connected", what="the first link update")
        assert not view.sampling and view.usage == []  # nobody watches: nothing sampled
        samples = lambda: len(last(front, view).get("usage", [])) >= 2  # noqa: E731
        wait_for(watched(samples), timeout=60, what="two samples")
        # A busy loop: up to one core (less on a loaded machine: its share is what is measured).
        busy = lambda: any(p[1] > 20 for p in last(front, view)["usage"])  # noqa: E731
        wait_for(watched(busy), timeout=60, what="a sample of the busy loop")
        points = last(front, view)["usage"]
        assert all(len(p) == 3 for p in points)
        assert all(p[2] > 0 for p in points)  # resident memory in bytes
        front.send(view, {"type": "watch", "view": "v1", "on": False})
        wait_for(lambda: not view.sampling, timeout=30, what="sampling to stop")
        # a view that stops renewing (a closed tab) is forgotten after WATCH_TTL
        front.send(view, {"type": "watch", "view": "v2", "on": True})
        wait_for(lambda: view.sampling, what="sampling again")
        wait_for(lambda: not view.sampling, timeout=job_view.WATCH_TTL + 30, what="the stale watch to expire")
    finally:
        view.kill()
    assert view.wait(30) is not None


def test_dashboard_rows_carry_usage_quiet_and_links(sb: rx.Sandbox, front: HeadlessFrontEnd) -> None:
    quiet = sb.exec_remote(["bash", "-c", "echo hello; sleep 300"])
    wait_for(lambda: quiet.job_id, what="the job's start")
    dash = Dashboard(sb, known=[quiet], interval=0.5)
    try:
        front.send(dash, {"type": "hello"})

        def row() -> dict[str, Any] | None:
            for m in front.custom(dash):
                for r in m.get("rows", []):
                    if r.get("job_id") == quiet.job_id and r.get("rss"):
                        found: dict[str, Any] = r
                        return found
            return None

        wait_for(lambda: row() is not None, timeout=60, what="a row with usage")
        r = row()
        assert r is not None and r["cpu"] is not None and r["rss"] > 0
        assert r["last_output_at"] is not None and r["last_output_at"] <= time.time()
        assert last(front, dash)["links"][sb.url]["state"] == "connected"
    finally:
        dash.close()
        quiet.kill()


def test_watch_rule_hits_reach_the_view(sb: rx.Sandbox, front: HeadlessFrontEnd) -> None:
    """The agent's watch-rule matches, counted in each poll, become the view's ``hits`` (what the
    front end notifies about while the tab is hidden)."""
    rule = rx.JobPolicy(on_output=[rx.WatchRule(pattern=r"loss (nan|inf)")])
    # No later line: a new hit answers the view's long poll by itself.
    script = "echo 'loss 0.5'; echo 'loss nan'; echo 'loss inf'; exec sleep 300"
    view = JobView(sb.exec_remote(["sh", "-c", script], policy=rule), command="watched")
    try:
        front.send(view, {"type": "hello"})
        wait_for(lambda: last(front, view).get("hits") == 2, timeout=30, what="two hits")
        assert view.state == "running"
    finally:
        view.kill()
