"""``jobs.spare`` is a job's to replace too (issue #21, point 7, a variant).

The agent keeps the next job's dir ready (``<state>/jobs.spare``, its files open) and a start
renames it to ``jobs/<name>``. A job swapped it for a symlink to an outside dir: the next job's dir
became that symlink, so its listed output was the outside dir's ``stdout`` (not what it wrote),
its records were written into the outside dir, and the log budget punched that file. With a real
``local://`` agent: the next job must show its own output and leave the outside dir alone.
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

import remote_exec as rx

from ..conftest import job_dir
from .conftest import Adversary

pytestmark = pytest.mark.anyio

# The attacker's job waits for the spare the agent makes after its own start (a thread), then
# moves it away and puts a symlink in its place.
SWAP = """
while [ ! -d "$1/jobs.spare" ] || [ -e "$1/jobs.spare.new" ]; do sleep 0.01; done
mv "$1/jobs.spare" "$1/moved" && ln -s "$2" "$1/jobs.spare" && echo swapped
"""


async def test_a_swapped_spare_is_not_a_job_dir(fresh_agent_dir: Path, tmp_path: Path, adversary: Adversary) -> None:
    d = fresh_agent_dir
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "stdout").write_text("not mine\n")
    async with rx.open_sandbox(f"local://?dir={d}") as sb:
        await sb.run(["true"])  # the agent's first spare is there from now on
        with anyio.fail_after(60):
            swap = await sb.run(["sh", "-c", SWAP, "sh", os.fspath(d), os.fspath(outside)])
        assert swap.stdout == "swapped\n" and (d / "jobs.spare").is_symlink()
        mine = await sb.run(["echo", "mine"])
        own = mine.stdout == "mine\n" and (await sb.read_output(mine.job_id or "")).data == b"mine\n"
        dir_is_ours = not job_dir(d, mine.job_id or "").is_symlink()
    untouched = sorted(os.listdir(outside)) == ["stdout"] and (outside / "stdout").read_text() == "not mine\n"
    logged = f"skipped {d / 'jobs.spare'}: " in (d / "agent.log").read_text(errors="replace")
    refused = own and dir_is_ours and untouched and logged
    adversary.tried("state files", "jobs.spare swapped for a symlink to an outside dir", refused=refused)
    assert refused, (mine.stdout, dir_is_ours, os.listdir(outside), logged)
