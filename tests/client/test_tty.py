"""PTY jobs (#16) on the local agent: outliving the agent, several viewers, the blocking twin,
every keystroke's echo at once."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import threading
from pathlib import Path

import anyio
import pytest

import remote_exec as rx
from remote_exec.protocol import Method, WriteStdinParams, WriteStdinResult

from ..conftest import agent_killed, job_dir, stop_agent
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


async def test_a_tty_jobs_last_output_waits_for_a_copier_that_has_not_run(fresh_agent_dir: Path) -> None:
    """The job's last line is in the terminal when it exits, and its copier has not run yet (a
    loaded machine; here it is stopped past the 1 s linger): with no leftover holding the
    terminal, the end waits for the copier instead of killing it (soak: "got hello" was lost)."""
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}") as sb:
        proc = sb.exec_remote(["sh", "-c", "read x; echo got $x"], tty=True)
        await proc.started()
        meta = json.loads((job_dir(fresh_agent_dir, proc.job_id or "") / "job.json").read_bytes())
        copier = int(meta["relay"]["pid"])
        os.kill(copier, signal.SIGSTOP)
        thaw = threading.Timer(3.0, os.kill, (copier, signal.SIGCONT))  # past the linger
        thaw.start()
        try:
            await proc.write_stdin("hello\r")
            with anyio.fail_after(60):
                result = await proc.wait()
        finally:
            thaw.cancel()
            with contextlib.suppress(ProcessLookupError):
                os.kill(copier, signal.SIGCONT)
    assert isinstance(result.stdout, str) and result.returncode == 0
    assert result.stdout.endswith("got hello\r\n"), result.stdout


async def test_two_viewers_type_and_replay_from_a_cursor(tmp_path: Path, agent_dir: Path) -> None:
    url = f"local://?dir={agent_dir}"
    async with rx.open_sandbox(url) as a, rx.open_sandbox(url) as b:
        script = "read w; read x; read y; echo $w+$x+$y"
        proc = sb_proc = a.exec_remote(["sh", "-c", script], tty=True, tty_size=(90, 20), input="zero\r")
        await proc.started()
        # Both type: a tty write appends (a stdin cursor would drop the second viewer's keys),
        # each viewer counting its own bytes, whatever was typed before it came (input too).
        await sb_proc.write_stdin("one\r")
        other = await b.attach(proc.job_id or "")
        assert other.tty and other.info is not None and other.info.tty_size is not None
        assert (other.info.tty_size.cols, other.info.tty_size.rows) == (90, 20)
        await other.write_stdin("two\r")
        res = await proc.wait()
        assert res.stdout == "zero\r\none\r\ntwo\r\nzero+one+two\r\n"
        tail = await b.read_output(res.job_id, offset=5)
        assert tail.data == b"zero\r\none\r\ntwo\r\nzero+one+two\r\n"[5:]


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


# Echoes each byte of its stdin after a random think time of up to 0.3 ms, as a shell's line
# editor does: that spreads the echo over the moment the next poll arrives at the agent (with
# ``cat`` the terminal's own echo lands before the write is even answered, never in a race).
ECHOER = """
import os, random, sys, time, tty
if os.isatty(0):
    tty.setraw(0)
os.write(1, b"ready\\n")
while (key := os.read(0, 1)) not in (b"", b"\\x04"):
    time.sleep(random.uniform(0, 0.0003))
    os.write(1, key)
"""
N_KEYS = 400
ECHO_BOUND = 3.0  # seconds; a missed wake-up costs the whole poll wait (30 s here)


async def type_keys(url: str, tty: bool, n_keys: int = N_KEYS) -> list[float]:
    """Type ``n_keys`` keys into :data:`ECHOER`, each after the previous one's echo; return
    the seconds each echo took, sorted."""
    async with rx.open_sandbox(url) as sb:
        proc = sb.exec_remote([sys.executable, "-c", ECHOER], tty=tty, stdin_open=True, poll_interval=30.0)
        events = aiter(proc)
        text = ""
        with anyio.fail_after(60):
            while "ready" not in text:
                ev = await anext(events)
                assert isinstance(ev, rx.StdoutChunk)
                text += str(ev.data)
        times = []
        for i in range(n_keys):
            key = "abcdefghijklmnopqrstuvwxyz"[i % 26]
            at = len(text)
            started = anyio.current_time()
            await proc.write_stdin(key)
            with anyio.move_on_after(ECHO_BOUND) as late:
                while key not in text[at:]:
                    ev = await anext(events)
                    assert isinstance(ev, rx.StdoutChunk)
                    text += str(ev.data)
            assert not late.cancelled_caught, f"key {i} ({key!r}): no echo within {ECHO_BOUND} s"
            times.append(anyio.current_time() - started)
        await proc.close_stdin()
        assert (await proc.wait()).returncode == 0
    times.sort()
    print(f"{n_keys} echoes: median {times[n_keys // 2] * 1e3:.2f} ms, max {times[-1] * 1e3:.1f} ms")
    return times


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "plain"])
async def test_every_keystroke_echo_wakes_the_poll(agent_dir: Path, tty: bool) -> None:
    """Type keys one at a time, each after the previous one's echo: every echo must end the
    waiting poll at once. The agent arms its inotify watch only when a poll starts to wait, so
    bytes written between its look at the file and the arming woke nobody (about one key in
    30 here) and the echo waited out the poll. Same for a plain job writing its log itself."""
    await type_keys(f"local://?dir={agent_dir}", tty)


@pytest.mark.parametrize("limit", ["max_inotify_watches", "max_inotify_instances"])
async def test_echoes_come_without_inotify(tmp_path: Path, limit: str) -> None:
    """An agent that can have no inotify watch (the user's watches used up) or no inotify at all:
    nothing tells a waiting poll of new output, so it looks at the files every
    ``UNWATCHED_TICK`` instead of sleeping out its wait. The agent runs in a user namespace whose
    limit is 0 (the host's limits are not touched)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) to give the agent its own user namespace")
    state = tmp_path / "state"
    setup = f"echo 0 > /proc/sys/user/{limit} && exec {sys.executable} -m remote_exec.agent ensure --dir {state}"
    with anyio.fail_after(60):
        await anyio.run_process(["unshare", "--user", "--map-root-user", "sh", "-c", setup])
    try:
        # Each echo waits for the next look (0.1 s) of the follow that waits for it. 20 keys: a
        # poll that sleeps out its wait fails the first one (no echo within ECHO_BOUND), a slow
        # look most of them; the looks are a timer, with no race to catch by more keys.
        times = await type_keys(f"local://?dir={state}", tty=True, n_keys=20)
        assert times[10] < 1.0  # a look every 0.1 s, not a wait of 30
    finally:
        stop_agent(state)


async def test_a_retried_keystroke_write_is_typed_once(fresh_agent_dir: Path) -> None:
    """A terminal has many typists, so its writes append; each names its writer and counts its
    own bytes, so a write repeated (its answer lost) is skipped, also by the next agent, while
    another typist's keys go in between. (Appended blindly, "go" was typed twice when the
    agent died before it answered: CI.)"""
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}") as sb:
        proc = sb.exec_remote(["sh", "-c", 'read a; read b; read c; echo "got [$a] [$b] [$c]"'], tty=True)
        await proc.started()
        rpc, job_id = sb._core.rpc, proc.job_id or ""

        async def write(writer: str, offset: int, data: bytes) -> WriteStdinResult:
            params = WriteStdinParams(job_id=job_id, offset=offset, writer=writer)
            return await rpc.call(Method.EXEC_REMOTE_WRITE_STDIN, params, WriteStdinResult, payload=data)

        assert await write("typist-one", 0, b"one\r") == WriteStdinResult(written=4, stdin_bytes=4)
        assert await write("typist-one", 0, b"one\r") == WriteStdinResult(written=0, stdin_bytes=4)
        assert (await write("typist-two", 0, b"two\r")).written == 4  # another typist: its own cursor
        await agent_killed(sb)  # the cursors are the job's, on disk: the next agent skips too
        assert await write("typist-one", 0, b"one\rthree\r") == WriteStdinResult(written=6, stdin_bytes=10)
        screen = Screen(proc)
        await screen.expect("got [one] [two] [three]\r\n")
        assert (await screen.ended()).exit_code == 0
