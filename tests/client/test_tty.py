"""PTY jobs (#16) on the local agent: outliving the agent, several viewers, the blocking twin."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from pathlib import Path

import anyio
import pytest

import remote_exec as rx

from ..conftest import stop_agent
from ..sandboxes.test_tty import Screen

pytestmark = pytest.mark.anyio

N_LINES = 20000  # ~200 KB: far more than a terminal buffers, so the job blocks while no agent reads


async def test_tty_job_survives_agent_sigkill(fresh_agent_dir: Path) -> None:
    """The agent dies mid-flood: the keeper's copy of the master keeps the terminal up (no
    hangup), the job blocks on the full terminal, the next agent reads on: every line arrives,
    in order, and the job still takes keystrokes."""
    script = (
        f"read go; i=0; while [ $i -lt {N_LINES} ]; do echo line$i; i=$((i+1)); done; "
        "[ -t 0 ] && echo still-a-tty; read x; echo got $x"
    )
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}", response_margin=1.0) as sb:
        old = sb.info
        assert old.keeper_pid is not None
        proc = sb.exec_remote(["sh", "-c", script], tty=True, poll_interval=1.0)
        await proc.started()
        await proc.write_stdin("go\r")
        os.kill(old.pid, signal.SIGKILL)  # the agent, not the keeper; the flood starts now
        screen = Screen(proc)
        at = await screen.expect("still-a-tty\r\n")
        assert (await sb.server_info()).pid != old.pid  # a new agent re-adopted the job
        await proc.write_stdin("hello\r")
        await screen.expect("got hello\r\n", at)
        end = await screen.ended()
    assert end.exit_code == 0
    expected = "".join(f"line{i}\r\n" for i in range(N_LINES))
    assert expected in screen.text  # nothing lost, nothing doubled, in order
    assert screen.text.count("line") == N_LINES


async def test_two_viewers_type_and_replay_from_a_cursor(tmp_path: Path, agent_dir: Path) -> None:
    url = f"local://?dir={agent_dir}"
    async with rx.open_sandbox(url) as a, rx.open_sandbox(url) as b:
        proc = sb_proc = a.exec_remote(["sh", "-c", "read x; read y; echo $x+$y"], tty=True, tty_size=(90, 20))
        await proc.started()
        other = await b.attach(proc.job_id or "")
        assert other.tty and other.info is not None and other.info.tty_size is not None
        assert (other.info.tty_size.cols, other.info.tty_size.rows) == (90, 20)
        # Both type: a tty write appends (a stdin cursor would drop the second viewer's keys).
        await sb_proc.write_stdin("one\r")
        await other.write_stdin("two\r")
        res = await proc.wait()
        assert res.stdout == "one\r\ntwo\r\none+two\r\n"
        tail = await b.read_output(res.job_id, offset=5)
        assert tail.data == b"one\r\ntwo\r\none+two\r\n"[5:]


def test_blocking_twin(agent_dir: Path) -> None:
    with rx.Sandbox(f"local://?dir={agent_dir}") as sb:
        proc = sb.exec_remote(["sh", "-c", "echo ready; read x; stty size"], tty=True)
        assert proc.tty
        first = next(iter(proc))
        assert first == rx.StdoutChunk("ready\r\n")
        proc.resize(33, 11)
        proc.write_stdin("\r")
        assert str(proc.wait().stdout).endswith("11 33\r\n")


async def test_no_terminal_without_a_tty_device(tmp_path: Path) -> None:
    """An agent whose ``/dev/ptmx`` is not a terminal multiplexer (``/dev/null`` bound over it, in
    its own mount namespace): a tty start is a precise ``SpawnError``; plain jobs still run."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) to give the agent its own mounts")
    state = tmp_path / "state"
    setup = f"mount --bind /dev/null /dev/ptmx && exec {sys.executable} -m remote_exec.agent ensure --dir {state}"
    with anyio.fail_after(60):
        await anyio.run_process(["unshare", "-m", "sh", "-c", setup])
    try:
        async with rx.open_sandbox(f"local://?dir={state}") as sb:
            with pytest.raises(rx.SpawnError, match="cannot allocate a pseudo-terminal"), anyio.fail_after(30):
                await sb.run(["true"], tty=True)
            assert (await sb.run(["true"])).returncode == 0
    finally:
        stop_agent(state)


async def test_a_program_that_is_not_there(agent_dir: Path) -> None:
    async with rx.open_sandbox(f"local://?dir={agent_dir}") as sb:
        with pytest.raises(rx.SpawnError, match="nonexistent"):
            await sb.run(["/nonexistent/prog"], tty=True)
        assert not [j for j in await sb.jobs() if j.tty and j.state == "running"]


async def test_tty_job_handed_over_to_an_upgraded_agent(fresh_agent_dir: Path) -> None:
    """An upgrade in place (``server_handover``): the next agent takes the terminal back from
    the keeper; keystrokes, resizes and Ctrl-C still reach the job, its output goes on."""
    agent = [sys.executable, "-m", "remote_exec.agent"]
    await anyio.run_process([*agent, "ensure", "--dir", str(fresh_agent_dir), "--report-version", "0.0.1-old"])
    script = "read a; echo got $a; read b; stty size; trap 'echo int; exit 9' INT; echo armed; sleep 100 & wait"
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}", response_margin=1.0) as sb:
        old_pid = sb.info.pid
        proc = sb.exec_remote(["sh", "-c", script], tty=True)
        screen = Screen(proc)
        await proc.write_stdin("one\r")
        at = await screen.expect("got one\r\n")
        new = await anyio.run_process([*agent, "ensure", "--dir", str(fresh_agent_dir)])
        assert json.loads(new.stdout)["result"]["pid"] != old_pid
        await proc.resize(77, 17)  # the new agent's master (from the keeper)
        await proc.write_stdin("two\r")
        at = await screen.expect("17 77\r\n", at)
        await screen.expect("armed\r\n", at)
        await proc.signal("INT")
        assert (await screen.ended()).exit_code == 9
