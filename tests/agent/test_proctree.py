"""Walks of ``/proc`` shared by concurrent scans (``proctree._table``): many scans at once cost a
few walks, not one each, and a scan never gets a walk begun before it asked."""

from __future__ import annotations

import os
import subprocess
import threading
import uuid
from collections.abc import Callable

import pytest

from remote_exec.agent.jobs import proctree
from remote_exec.agent.jobs.proctree import MARKER, Tree, tree_members


def in_threads(n: int, fn: Callable[[], object]) -> None:
    """Run ``fn`` in ``n`` threads released together; re-raise the first failure."""
    start = threading.Barrier(n)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            start.wait(30)
            fn()
        except BaseException as exc:  # handed to the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors


def test_concurrent_scans_share_walks(monkeypatch: pytest.MonkeyPatch) -> None:
    # 1 000 kills at once each walked /proc several times: O(jobs x processes) of reads.
    walks = 0
    lock = threading.Lock()
    walk = proctree._walk_proc

    def counted() -> proctree._Table:
        nonlocal walks
        with lock:
            walks += 1
        return walk()

    monkeypatch.setattr(proctree, "_walk_proc", counted)
    tree = Tree(f"rx-test-{uuid.uuid4().hex[:8]}")
    calls = 16 * 10
    in_threads(16, lambda: [tree_members(tree) for _ in range(10)])
    print(f"{calls} scans, {walks} walks of /proc")
    assert walks < calls / 2


def test_a_scan_sees_what_was_started_before_it_while_others_walk() -> None:
    # A shared walk must have begun after the call: one begun before could miss a process the
    # caller just started (a kill would then report a tree empty that is not).
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            tree_members(Tree("rx-test-churn"))

    churners = [threading.Thread(target=churn) for _ in range(3)]
    for t in churners:
        t.start()
    try:
        for _ in range(20):
            job_id = f"rx-test-{uuid.uuid4().hex[:8]}"
            proc = subprocess.Popen(["sleep", "30"], env={**os.environ, MARKER: job_id})
            try:
                assert proc.pid in tree_members(Tree(job_id))
            finally:
                proc.kill()
                proc.wait()
    finally:
        stop.set()
        for t in churners:
            t.join(60)
