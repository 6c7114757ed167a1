"""The agent's shell sessions from the inside: framing, the session registry, expiry, sh fallback."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import remote_exec as rx
from remote_exec.agent.jobs import proctable
from remote_exec.agent.jobs.proctable import session_members
from remote_exec.agent.shell.controller import ShellController, ShellLimits
from remote_exec.agent.shell.framing import Frame, MarkerScanner, frame_script, recovery_lines
from remote_exec.protocol import (
    JobIdParams,
    KillParams,
    PollParams,
    PollResult,
    ShellIdParams,
    ShellListParams,
    ShellOpenParams,
    ShellRunParams,
    SignalParams,
    StartResult,
    WriteStdinParams,
)

from ..conftest import stop_agent, wait_exit, wait_for
from .homes import jobs_in

pytestmark = pytest.mark.anyio

NONCE = "0123456789abcdef"
PUBLIC = "feedfacefeedface"
DONE = f"__RX_DONE_{NONCE}__".encode()
GO = f"__RX_GO_{PUBLIC}__".encode()


def exit_marker(code: int) -> bytes:
    return f"__RX_EXIT_{NONCE}_{code:03d}__".encode()


def feed_all(frame: Frame, fd: int, chunks: list[bytes]) -> tuple[bytes, bytes]:
    visible, rest = b"", b""
    for chunk in chunks:
        v, r = frame.feed(fd, chunk)
        visible, rest = visible + v, rest + r
    return visible, rest


# -- framing ---------------------------------------------------------------------------------


def test_sentinels_split_at_every_point_never_leak() -> None:
    out = b"user output __RX_DONE_ almost__RX_" + DONE + b"late"
    err = b"noise" + GO + b"err text __RX_EXIT_" + exit_marker(130) + b"stray"
    for stream, fd, want_visible, want_rest in [
        (out, 1, b"user output __RX_DONE_ almost__RX_", b"late"),
        (err, 2, b"noiseerr text __RX_EXIT_", b"stray"),
    ]:
        for i in range(len(stream) + 1):
            for j in range(i, len(stream) + 1, 7):
                frame = Frame(PUBLIC, NONCE, drop_exit_echo=False)
                visible, rest = feed_all(frame, fd, [stream[:i], stream[i:j], stream[j:]])
                assert (visible, rest) == (want_visible, want_rest), (i, j)
    frame = Frame(PUBLIC, NONCE, drop_exit_echo=False)
    feed_all(frame, 2, [err])
    assert not frame.complete and frame.started and frame.exit_code == 130
    feed_all(frame, 1, [out])
    assert frame.complete


def test_a_possible_prefix_is_held_until_disproved() -> None:
    scanner = MarkerScanner([DONE])
    assert scanner.feed(b"abc__RX_DO") == (b"abc", b"")
    assert scanner.feed(b"G") == (b"__RX_DOG", b"")  # not a sentinel after all: released at once
    assert scanner.feed(b"x__RX_DONE_0123") == (b"x", b"")
    assert scanner.flush() == b"__RX_DONE_0123"  # the stream ended: nothing is kept back for good


def test_exit_echo_is_dropped_only_at_the_end() -> None:
    scanner = MarkerScanner([GO, exit_marker(0)], drop_tail=b"exit\n")
    assert scanner.feed(GO + b"text exit\n") == (b"text ", b"")
    assert scanner.feed(b"more exit\n") == (b"exit\nmore ", b"")  # followed by more: it was output
    assert scanner.flush() == b""  # the shell ended right after printing it: bash's echo of `exit`


@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(max_size=200).map(lambda b: b.replace(b"_", b"_R_X_")),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
    code=st.integers(min_value=0, max_value=255),
)
def test_any_chunking_gives_the_same_output(data: bytes, cuts: list[int], code: int) -> None:
    stream = data + GO + data + exit_marker(code) + data
    points = sorted({min(c, len(stream)) for c in cuts})
    chunks = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    frame = Frame(PUBLIC, NONCE, drop_exit_echo=False)
    assert feed_all(frame, 2, chunks) == (data + data, data)
    assert frame.exit_code == code


def test_scripts_quote_the_command_and_never_spell_a_sentinel() -> None:
    for bash in (True, False):
        script = frame_script(PUBLIC, NONCE, "echo 'it''s' \"$HOME\"", "/tmp/in put", bash).decode()
        assert "eval ' echo '\\''it'\\'''\\''s'\\'' \"$HOME\"'" in script and "</tmp/in put'" not in script
        assert "<'/tmp/in put'" in script and script.count("\n") == 1  # one line: parsed whole first
        # The secret comes only after the command; GO names the public id.
        assert script.index(NONCE) > script.index("echo '") > script.index(PUBLIC)
        recovery = recovery_lines(PUBLIC, NONCE, bash).decode()
        assert "'" not in recovery and '"' not in recovery  # a line cut by an interrupt cannot open a quote
        for text in (script, recovery):
            assert DONE.decode() not in text and GO.decode() not in text and "__RX_EXIT_" not in text


# -- sessions --------------------------------------------------------------------------------


@pytest.fixture
async def ctl(tmp_path: Path) -> AsyncIterator[ShellController]:
    controller = ShellController(jobs_in(tmp_path), ShellLimits(ttl=0))
    yield controller
    await controller.aclose()


async def poll(ctl: ShellController, p: PollParams) -> PollResult:
    """A text job's poll: the controller answers a ``PollResult`` unless asked for raw bytes."""
    return cast(PollResult, await ctl.jobs.poll(p))


async def follow(ctl: ShellController, job_id: str, stdout_offset: int = 0) -> tuple[str, int | None, str, str]:
    """Poll a run to its end with exec_remote_poll, as a client does: (state, code, out, err)."""
    out, err, offsets = "", "", (stdout_offset, 0)
    while True:
        r = await poll(ctl, PollParams(job_id=job_id, stdout_offset=offsets[0], stderr_offset=offsets[1], wait=5))
        out, err, offsets = out + r.stdout, err + r.stderr, (r.stdout_offset, r.stderr_offset)
        if r.state != "running":
            return r.state, r.exit_code, out, err


async def run(ctl: ShellController, session_id: str, command: str) -> tuple[str, int | None, str, str]:
    return await follow(ctl, (await ctl.run(ShellRunParams(session_id=session_id, command=command))).job_id)


async def test_runs_are_jobs_in_the_registry(ctl: ShellController) -> None:
    sid = (await ctl.open(ShellOpenParams(cwd="/tmp"))).session_id
    assert await run(ctl, sid, "pwd; echo e >&2; (exit 4)") == ("completed", 4, "/tmp\n", "e\n")
    (row,) = [j for j in (await ctl.jobs.list(rx.protocol.ListParams())).jobs if j.label == f"shell {sid}"]
    assert (row.command, row.state, row.exit_code, row.stdout_bytes) == ("pwd; echo e >&2; (exit 4)", "completed", 4, 5)
    await ctl.jobs.release(JobIdParams(job_id=row.job_id))
    with pytest.raises(rx.JobNotFoundError):
        await ctl.jobs.poll(PollParams(job_id=row.job_id))
    # The job methods control a run: a signal reaches its processes (never the shell)...
    start = await ctl.run(ShellRunParams(session_id=sid, command="echo up; sleep 300"))
    assert (await poll(ctl, PollParams(job_id=start.job_id, wait=5))).stdout == "up\n"
    with pytest.raises(rx.JobNotRunningError, match="input="):
        await ctl.jobs.write_stdin(WriteStdinParams(job_id=start.job_id, data="x"))
    await ctl.jobs.signal(SignalParams(job_id=start.job_id, signal="SIGTERM"))
    assert (await follow(ctl, start.job_id, stdout_offset=3))[:2] == ("completed", 143)
    # ...and a kill stops the run and keeps the shell.
    start = await ctl.run(ShellRunParams(session_id=sid, command="sleep 300"))
    killed = await ctl.jobs.kill(KillParams(job_id=start.job_id, grace=1.0))
    assert (killed.state, killed.exit_code) == ("killed", 130)
    assert await run(ctl, sid, "pwd") == ("completed", 0, "/tmp\n", "")


async def until(ctl: ShellController, job_id: str, out: str, err: str) -> None:
    """Long-poll a running run until its output so far is exactly ``out`` and ``err``."""
    seen, offsets = ("", ""), (0, 0)
    while seen != (out, err):
        assert len(seen[0]) <= len(out) and len(seen[1]) <= len(err), seen
        r = await poll(ctl, PollParams(job_id=job_id, stdout_offset=offsets[0], stderr_offset=offsets[1], wait=5))
        assert r.state == "running", r
        seen, offsets = (seen[0] + r.stdout, seen[1] + r.stderr), (r.stdout_offset, r.stderr_offset)


async def test_an_interrupted_run_that_ends_late_never_leaks_into_the_next_runs(
    ctl: ShellController, tmp_path: Path
) -> None:
    # The interrupt retries (recovery line, then a process scan) while the run goes on. Here the
    # run ends while that scan waits for a thread, and the next run begins before the scan is
    # back: the interrupt must not write the old run's recovery line after the new run's line,
    # or it prints the old run's sentinels into a later run's output.
    sid = (await ctl.open(ShellOpenParams())).session_id
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    script = (
        "import signal, sys; "
        "signal.signal(signal.SIGINT, lambda *a: print('got', file=sys.stderr, flush=True)); "
        "print('up', flush=True); open(sys.argv[1]).read()"
    )
    start = await ctl.run(ShellRunParams(session_id=sid, command=f'{sys.executable} -c "{script}" {fifo}'))
    await until(ctl, start.job_id, "up\n", "")
    await ctl.interrupt(ShellIdParams(session_id=sid))
    await until(ctl, start.job_id, "up\n", "got\n")  # the SIGINT went out, and the first recovery line
    gate = threading.Event()
    blockers = [proctable.scan(gate.wait, 30) for _ in range(2)]  # both scan threads busy
    tasks = [asyncio.ensure_future(b) for b in blockers]
    try:
        deadline = time.monotonic() + 10
        while proctable._POOL._work_queue.qsize() < 1:  # the interrupt's next scan is queued
            assert time.monotonic() < deadline, "the interrupt never scanned again"
            await asyncio.sleep(0.01)
        await asyncio.to_thread(fifo.write_bytes, b"")  # the run ends on its own
        assert (await follow(ctl, start.job_id, stdout_offset=3))[:2] == ("completed", 0)
        second = await ctl.run(ShellRunParams(session_id=sid, command="echo two"))
    finally:
        gate.set()
        await asyncio.gather(*tasks)
    session = ctl._sessions[sid]
    await session.background.wait()  # the interrupt is over
    assert await follow(ctl, second.job_id) == ("completed", 0, "two\n", "")
    assert await run(ctl, sid, "echo three") == ("completed", 0, "three\n", "")


async def test_a_long_session_keeps_only_its_recent_runs(tmp_path: Path) -> None:
    ctl = ShellController(jobs_in(tmp_path), ShellLimits(ttl=0, retain_runs=2))
    try:
        sid = (await ctl.open(ShellOpenParams())).session_id
        ids = []
        for i in range(6):
            ids.append((await ctl.run(ShellRunParams(session_id=sid, command=f"echo {i}"))).job_id)
            await follow(ctl, ids[-1])
        listed = [j.job_id for j in (await ctl.jobs.list(rx.protocol.ListParams())).jobs]
        assert listed == ids[-3:]  # the latest run, and the two before it
        with pytest.raises(rx.JobNotFoundError):
            await ctl.jobs.poll(PollParams(job_id=ids[0]))
    finally:
        await ctl.aclose()


async def test_one_run_at_a_time_and_retries_are_idempotent(ctl: ShellController) -> None:
    sid = (await ctl.open(ShellOpenParams())).session_id
    params = [ShellRunParams(session_id=sid, command="sleep 0.2", idempotency_key=f"k{i}") for i in range(2)]
    results = await asyncio.gather(*(ctl.run(p) for p in params), return_exceptions=True)
    assert sorted(type(r).__name__ for r in results) == ["ShellBusyError", "StartResult"]
    started = next(r for r in results if isinstance(r, StartResult))
    retry = next(p for p, r in zip(params, results, strict=True) if r is started)
    assert await ctl.run(retry) == started  # a lost response asked again: the same run, not "busy"


async def test_idle_sessions_expire_and_busy_ones_do_not(tmp_path: Path) -> None:
    now = [1000.0]  # a fake monotonic clock: the TTL passes when the test says so
    ctl = ShellController(jobs_in(tmp_path), ShellLimits(ttl=30), clock=lambda: now[0])
    try:
        idle = (await ctl.open(ShellOpenParams())).session_id
        busy = (await ctl.open(ShellOpenParams())).session_id
        start = await ctl.run(ShellRunParams(session_id=busy, command="echo up; sleep 300"))
        await ctl.jobs.poll(PollParams(job_id=start.job_id, wait=5))  # the run is under way
        now[0] += 29.9
        assert ctl.expire_idle() == 0
        now[0] += 0.2
        assert ctl.expire_idle() == 1
        await ctl._sessions[idle].wait_closed()
        (info,) = (await ctl.list(ShellListParams(session_id=idle))).shells
        assert info.state == "closed" and info.closed_reason == "idle for 30 s"
        assert ctl._sessions[busy].open  # still running its command past the TTL
        await ctl.interrupt(ShellIdParams(session_id=busy))
        assert (await follow(ctl, start.job_id, stdout_offset=3))[:2] == ("completed", 130)
        assert ctl.expire_idle() == 0  # the TTL counts from the end of the run
        now[0] += 29.9
        assert ctl.expire_idle() == 0 and ctl._sessions[busy].open
        now[0] += 0.2
        assert ctl.expire_idle() == 1
        await ctl._sessions[busy].wait_closed()
        with pytest.raises(rx.ShellClosedError):
            await ctl.interrupt(ShellIdParams(session_id=busy))
    finally:
        await ctl.aclose()


@pytest.mark.skipif(shutil.which("dash") is None and not os.path.exists("/bin/sh"), reason="no POSIX sh")
async def test_falls_back_to_sh(tmp_path: Path) -> None:
    ctl = ShellController(jobs_in(tmp_path), ShellLimits(ttl=0, argv=("sh", "-i")))
    try:
        sid = (await ctl.open(ShellOpenParams())).session_id
        assert await run(ctl, sid, "cd /tmp; X=1; f() { echo f$X; }") == ("completed", 0, "", "")
        assert await run(ctl, sid, "pwd; f") == ("completed", 0, "/tmp\nf1\n", "")
        state, code, _, err = await run(ctl, sid, "echo `unclosed")  # sh drops buffered input on errors
        assert (state, code) == ("completed", 2) and err
        start = await ctl.run(ShellRunParams(session_id=sid, command="echo up; sleep 300"))
        await ctl.jobs.poll(PollParams(job_id=start.job_id, wait=5))
        await ctl.interrupt(ShellIdParams(session_id=sid))
        assert (await follow(ctl, start.job_id, stdout_offset=3))[:2] == ("completed", 130)
        assert await run(ctl, sid, "echo $X; exit 6") == ("completed", 6, "1\n", "")
        assert not ctl._sessions[sid].open
    finally:
        await ctl.aclose()


def test_an_open_shell_keeps_the_agent_up(fresh_agent_dir: Path) -> None:
    with rx.connect(f"local://?dir={fresh_agent_dir}&idle_timeout=1") as sb:
        sh = sb.shell()
        # Asked now, not at the connect: an agent idle for 1 s before the shell opened has exited
        # by design, and the shell is the next one's (a soak failure named the first one).
        agent = sb.server_info().pid
    # The agent's own word that it was idle past idle_timeout and stayed up for the shell.
    log = fresh_agent_dir / "agent.log"
    staying = "1 shell session(s) open: staying up"
    wait_for(lambda: staying in log.read_text(errors="replace"), 30, what="the agent's idle check")
    assert not wait_exit(agent, 0)
    with rx.connect(f"local://?dir={fresh_agent_dir}&idle_timeout=1") as sb:
        sb.reattach_shell(sh.session_id).close()
    assert wait_exit(agent, 20)


def test_sessions_die_with_their_agent(fresh_agent_dir: Path) -> None:
    url = f"local://?dir={fresh_agent_dir}"
    with rx.connect(url) as sb:
        agent = sb.info.pid
        sh = sb.shell()
        sh.run("sleep 300 &")
        pid, session_id = sh.pid, sh.session_id
        assert len(session_members(pid)) == 2
    stop_agent(fresh_agent_dir)
    assert wait_exit(agent, 20)
    with rx.connect(url) as sb:
        with pytest.raises(rx.AgentLostError, match="die with their agent"):
            sb.reattach_shell(session_id)
        assert sb.shells() == []
    assert session_members(pid) == []
