"""Removing a job's dir never blocks the agent's event loop (a big log's unlink takes seconds on
a loaded disk): the dir is renamed into ``<state>/trash`` and deleted by a thread."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

import remote_exec as rx

from ..conftest import job_dir, wait_exit

pytestmark = pytest.mark.anyio

# A real agent on a disk whose deletes hang (what a multi-GB unlink on a loaded ext4 looks like
# to the caller): every rmtree waits until the test lets it go by creating the file "go".
SLOW_DISK_AGENT = """
import os, shutil, sys, time
from remote_exec.agent import cli
real, go = shutil.rmtree, sys.argv.pop(1)
def rmtree(path, *args, **kwargs):
    while not os.path.exists(go):
        time.sleep(0.01)
    return real(path, *args, **kwargs)
shutil.rmtree = rmtree
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.fixture
def slow_disk_agent(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """The state dir of a running :data:`SLOW_DISK_AGENT`, and the file that lets its deletes go."""
    state, go = tmp_path / "state", tmp_path / "go"
    read_fd, write_fd = os.pipe()
    argv = [sys.executable, "-c", SLOW_DISK_AGENT, str(go), "serve", "--dir", str(state), "--ready-fd", str(write_fd)]
    proc = subprocess.Popen(argv, pass_fds=(write_fd,), stderr=subprocess.DEVNULL)
    os.close(write_fd)
    try:
        with os.fdopen(read_fd, "rb") as ready:
            assert ready.readline() == b"ready\n"
        yield state, go
    finally:
        go.touch()
        proc.send_signal(signal.SIGTERM)
        assert wait_exit(proc.pid, 30)
        proc.wait()


async def test_forgetting_a_job_does_not_wait_for_its_dir_to_be_deleted(slow_disk_agent: tuple[Path, Path]) -> None:
    state, go = slow_disk_agent
    async with rx.open_sandbox(f"local://?dir={state}") as sb:
        result = await sb.run(["echo", "hi"])
        assert result.job_id is not None and (mine := job_dir(state, result.job_id)).is_dir()
        with anyio.fail_after(5):  # without the trash: blocked on the loop until "go", i.e. for good
            await sb.forget(result.job_id)
            assert (await sb.run(["echo", "still answering"])).stdout == "still answering\n"
        assert not mine.exists()  # gone from jobs/ at once
        assert [p.name.split(".")[0] for p in (state / "trash").iterdir()] == [mine.name]
        go.touch()
        with anyio.fail_after(30):
            while any((state / "trash").iterdir()):  # noqa: ASYNC110  (the thread's work, watched)
                await anyio.sleep(0.02)
