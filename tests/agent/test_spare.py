"""The ready job dir (``agent/jobs/spare.py``) and the event loop: closing it never waits for a
fill in progress (issue #22: a ``threading.Lock`` taken on the loop). The autouse blockbuster
fixture (tests/conftest.py) fails a lock wait on the loop."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import anyio
import pytest

from remote_exec.agent.jobs.spare import SpareDir

pytestmark = pytest.mark.anyio


def _stale_tree(path: Path, files: int) -> None:
    """A previous agent's spare with many files: the first fill removes it, which takes a while."""
    path.mkdir()
    for i in range(files):
        os.close(os.open(path / str(i), os.O_WRONLY | os.O_CREAT, 0o600))


async def test_close_returns_while_a_fill_holds_the_lock(tmp_path: Path) -> None:
    """A fill on a loaded disk holds the spare's lock for as long as its file operations take;
    ``close()`` runs on the event loop and must not wait for it. (Blockbuster does not see a
    ``with lock:``, which calls no ``acquire``: this test does.)"""
    spare = SpareDir(tmp_path / "jobs.spare")
    holding, release = threading.Event(), threading.Event()

    def a_slow_fill() -> None:
        with spare._lock:
            holding.set()
            release.wait(120)

    filler = threading.Thread(target=a_slow_fill)
    filler.start()
    try:
        await anyio.to_thread.run_sync(holding.wait, 60)
        with anyio.fail_after(30):  # the fill would hold it until released: a wait is a hang
            await anyio.to_thread.run_sync(spare.close, abandon_on_cancel=True)
        assert spare._lock.locked()  # returned while the fill still runs
    finally:
        release.set()
        await anyio.to_thread.run_sync(filler.join)


async def test_a_close_during_a_real_fill_leaves_no_spare(tmp_path: Path) -> None:
    """Closed while its fill may run (it has a stale tree to remove first), the spare ends with
    no ready dir and nothing half-made, whichever of the two got the lock first."""
    spare = SpareDir(tmp_path / "jobs.spare")
    await anyio.to_thread.run_sync(_stale_tree, spare.path, 5000)
    spare.refill()  # in a thread: removes the stale tree (under the lock), then makes the spare
    spare.close()
    with anyio.fail_after(60):  # the fill's thread sees the close and removes what it made
        while spare._filling or spare._lock.locked():  # noqa: ASYNC110
            await anyio.sleep(0.01)
    assert not spare.ready
    # No spare made: at most the stale tree, left for the next agent if the close came first.
    assert not await anyio.Path(spare.path / "job.json").exists()
    assert not await anyio.Path(f"{spare.path}.new").exists()


async def test_close_removes_a_ready_spare(tmp_path: Path) -> None:
    spare = SpareDir(tmp_path / "jobs.spare")
    await anyio.to_thread.run_sync(spare.fill)
    made = sorted(p.name for p in spare.path.iterdir())
    assert spare.ready and made == ["job.json", "job.json.tmp", "stderr", "stderr.times", "stdout", "stdout.times"]
    spare.close()
    assert not spare.ready and not spare.path.exists()
    spare.refill()  # closed: no more spares
    assert not spare.ready and not spare.path.exists()
