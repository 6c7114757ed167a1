"""What the agent reads back from its state dir, where the jobs' user can write, is bounded: a
session record's replay span, a job's oversized ``job.json``, a log's forged mtime."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import remote_exec as rx
from remote_exec.agent.jobs.readopt import MAX_RECORD, _load_meta
from remote_exec.agent.shell.follow import ShellFiles

from ..conftest import job_dir

pytestmark = pytest.mark.anyio


async def test_a_replay_span_from_a_record_is_capped(tmp_path: Path) -> None:
    (tmp_path / "out").write_bytes(b"x" * 100)
    (tmp_path / "err").write_bytes(b"")
    files = ShellFiles(tmp_path, (0, 0), 0, lambda fd, data: None, None)
    files.open()
    try:
        assert files.replay(1, 0, 1 << 62, limit=10) == b""  # no 4 EiB allocation: the last 10, past the end
        assert files.replay(1, 0, 100, limit=10) == b"x" * 10
        with pytest.raises(ValueError):
            files.replay(1, -5, 10, limit=10)
    finally:
        files.close()


def test_an_oversized_job_record_is_refused_unread(tmp_path: Path) -> None:
    (tmp_path / "job.json").write_bytes(b'{"pad": "' + b"x" * MAX_RECORD + b'"}')
    with pytest.raises(ValueError, match="over"):
        _load_meta(str(tmp_path))
    (tmp_path / "job.json").write_text(json.dumps({"job_id": "a-1"}))
    assert _load_meta(str(tmp_path)) == {"job_id": "a-1"}


async def test_a_forged_log_mtime_breaks_no_listing(agent_dir: Path) -> None:
    """A job can write to its log and set its mtime (it holds the file as its fd 1: ``touch -d
    @-100 /proc/self/fd/1``); done here from outside for a deterministic order: a write, then an
    mtime before 1970. The listing must still answer, without that time."""
    import os

    async with rx.open_sandbox(f"local://?dir={agent_dir}") as sb:
        res = await sb.run(["echo", "hi"])
        assert res.job_id is not None
        log = job_dir(agent_dir, res.job_id) / "stdout"
        log.write_bytes(log.read_bytes() + b"more\n")
        os.utime(log, (-100, -100))
        mine = [j for j in await sb.jobs() if j.job_id == res.job_id]  # refused on the old agent
        assert len(mine) == 1 and mine[0].last_output_at is None
