"""Point 13: nothing is left behind, and a full disk is one precise error.

An agent killed mid-upload left its temporary file (a 172 MiB ``.rxtmp``) for good; a full
state dir made ``remote-exec-agent ensure`` print a traceback (and the host quote it); a write
that filled the disk was a generic ``FileError``. Now open writes are journalled in the state
dir and the next agent removes what a killed one left; start errors are one line; ENOSPC and
EDQUOT are :class:`~remote_exec.NoSpaceError`, with no temporary file left.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import remote_exec as rx
from remote_exec.protocol import (
    FileWriteChunkParams,
    FileWriteChunkResult,
    FileWriteOpenParams,
    FileWriteOpenResult,
    Method,
)

from ..conftest import wait_exit
from .agentproc import AGENT, agent
from .conftest import Adversary

pytestmark = pytest.mark.anyio


async def test_a_killed_agents_upload_temp_is_removed_by_the_next_agent(tmp_path: Path, adversary: Adversary) -> None:
    state, target = tmp_path / "state", tmp_path / "w" / "big.bin"
    target.parent.mkdir()
    with agent(state) as pid:
        async with rx.open_sandbox(f"local://?dir={state}") as sb:
            rpc = sb._core.rpc
            opened = FileWriteOpenParams(session_id="killed-upload", path=str(target))
            await rpc.call(Method.FILE_WRITE_OPEN, opened, FileWriteOpenResult)
            chunk = FileWriteChunkParams(session_id="killed-upload", offset=0)
            got = await rpc.call(Method.FILE_WRITE_CHUNK, chunk, FileWriteChunkResult, payload=b"x" * (4 << 20))
            assert got.received == 4 << 20  # a chunk was accepted: the agent is mid-upload
            temps = [p for p in target.parent.iterdir() if p.name.endswith(".rxtmp")]
            assert len(temps) == 1 and temps[0].stat().st_size == 4 << 20
            os.kill(pid, signal.SIGKILL)
            assert wait_exit(pid, 10)
    with agent(state):  # the next agent in that state dir
        left = sorted(p.name for p in target.parent.iterdir())
    adversary.tried("leftovers", "agent SIGKILLed mid-upload: its .rxtmp", refused=left == [])
    assert left == []


def _in_full_tmpfs(tmp_path: Path, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (Python) in a private mount namespace where ``tmp_path/full`` is a tiny
    tmpfs (256 KiB, 64 inodes); the mount vanishes with the namespace."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) for a private tmpfs")
    full = tmp_path / "full"
    full.mkdir()
    shell = 'mount -t tmpfs -o size=256k,nr_inodes=64 tmpfs "$1" && shift && exec "$@"'
    argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", shell, "sh", str(full)]
    return subprocess.run(
        [*argv, sys.executable, "-c", script, str(full), *args], capture_output=True, text=True, timeout=90
    )


START_IN_FULL_DIR = """
import json, os, subprocess, sys
import remote_exec as rx
full = sys.argv[1]
os.mkdir(f"{full}/state", 0o700)
n = 0
while True:  # use up every inode: nothing more can be created in the state dir
    try:
        open(f"{full}/f{n}", "x").close()
    except OSError:
        break
    n += 1
cli = subprocess.run(sys.argv[2:] + ["ensure", "--dir", f"{full}/state"], capture_output=True, text=True)
try:
    rx.connect(f"local://?dir={full}/state")
    host = None
except Exception as exc:
    host = [type(exc).__name__, str(exc)]
print(json.dumps({"rc": cli.returncode, "stderr": cli.stderr, "host": host}))
"""


def test_a_full_state_dir_is_one_precise_start_error(tmp_path: Path, adversary: Adversary) -> None:
    done = _in_full_tmpfs(tmp_path, START_IN_FULL_DIR, *AGENT)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    stderr, (host_class, host_message) = out["stderr"], out["host"]
    precise = "No space left on device (ENOSPC)" in stderr and "Traceback" not in stderr + host_message
    adversary.tried("leftovers", "agent start in a full state dir", refused=precise)
    assert out["rc"] == 3 and stderr.count("\n") == 1 and precise, stderr
    assert host_class == "AgentUnavailableError" and "No space left on device (ENOSPC)" in host_message


WRITE_TO_FULL_DISK = """
import json, os, sys
import remote_exec as rx
full, state = sys.argv[1], sys.argv[2]
os.mkdir(f"{full}/tmp")
seen = {}
with rx.connect(f"local://?dir={state}") as sb:
    pid = sb.info.pid
    for name, size in [("one-request", 300_000), ("session", 3 << 20)]:
        try:
            sb.write_file(f"{full}/{name}.bin", b"x" * size)
            seen[name] = None
        except rx.RemoteExecError as exc:
            seen[name] = [type(exc).__name__, exc.data.get("errno")]
left = sorted(os.listdir(full))
os.kill(pid, 15)
print(json.dumps({"seen": seen, "left": left}))
"""


def test_a_write_that_fills_the_disk_is_no_space_and_leaves_nothing(tmp_path: Path, adversary: Adversary) -> None:
    done = _in_full_tmpfs(tmp_path, WRITE_TO_FULL_DISK, str(tmp_path / "state"))
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    for name, seen in out["seen"].items():
        precise = seen == ["NoSpaceError", "ENOSPC"]
        adversary.tried("leftovers", f"write ({name}) that fills the disk", refused=precise)
        assert precise, (name, seen)
    assert out["left"] == ["tmp"]  # no temporary file, no partial target
