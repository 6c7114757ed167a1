"""The exec_remote contract, against the real agent, over every channel kind."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import signal
from pathlib import Path
from typing import Any, cast

import anyio
import anyio.lowlevel
import pytest

import remote_exec as rx
from remote_exec.agent.jobs.proctable import group_members
from remote_exec.protocol import frames

pytestmark = pytest.mark.anyio


async def collect(proc: rx.ExecRemoteProcess) -> list[rx.ExecRemoteEvent]:
    return [ev async for ev in proc]


def joined(events: list[rx.ExecRemoteEvent], kind: type) -> str:
    return "".join(cast(str, getattr(e, "data")) for e in events if isinstance(e, kind))  # noqa: B009 - kind has .data


async def test_events_order_streams_and_exit_code(url: str) -> None:
    # out2 is written only once this test has seen out1 (the script waits for a line on stdin):
    # streaming is shown by the event, not by a sleep that a loaded machine can outlast
    script = "echo out1; echo err1 >&2; read -r go; echo out2; echo err2 >&2; exit 3"
    async with rx.open_sandbox(url) as sb:
        proc = sb.exec_remote(["sh", "-c", script], stdin_open=True)
        events: list[rx.ExecRemoteEvent] = []
        with anyio.fail_after(60):
            async for ev in proc:
                events.append(ev)
                if isinstance(ev, rx.StdoutChunk) and "out1" in str(ev.data):
                    await proc.write_stdin("go\n")
    assert isinstance(events[-1], rx.Completed)
    assert all(not isinstance(e, rx.Completed) for e in events[:-1])
    assert joined(events, rx.StdoutChunk) == "out1\nout2\n"
    assert joined(events, rx.StderrChunk) == "err1\nerr2\n"
    done = events[-1]
    assert (done.exit_code, done.success, done.stdout, done.stderr) == (3, False, "out1\nout2\n", "err1\nerr2\n")
    # out1 arrived before out2 was written: streaming, not buffering to the end
    first_out = next(i for i, e in enumerate(events) if isinstance(e, rx.StdoutChunk))
    assert events[first_out].data == "out1\n"  # type: ignore[union-attr]


async def test_awaitable_mode_and_run(url: str) -> None:
    async with rx.open_sandbox(url) as sb:
        res = await sb.exec_remote(["sh", "-c", "printf abc; printf xyz >&2; exit 7"], stream=False)
        assert (res.success, res.returncode, res.stdout, res.stderr, res.truncated) == (False, 7, "abc", "xyz", False)
        ok = await sb.run(["true"])
        assert ok.success and ok.returncode == 0 and ok.state == "completed"


async def test_string_command_runs_in_shell_and_signal_exit_code(url: str) -> None:
    async with rx.open_sandbox(url) as sb:
        res = await sb.run("echo $((6*7)); kill -USR1 $$")
    assert res.stdout == "42\n"
    assert res.returncode == -10  # killed by SIGUSR1


async def test_input_and_cwd_env(url: str, tmp_path: object) -> None:
    async with rx.open_sandbox(url) as sb:
        res = await sb.run(["sh", "-c", "cat; pwd; echo $FOO"], input="from stdin\n", cwd="/tmp", env={"FOO": "bar"})
    assert res.stdout == "from stdin\n/tmp\nbar\n"


async def test_stdin_streaming(url: str) -> None:
    async with rx.open_sandbox(url) as sb:
        proc = sb.exec_remote(["sh", "-c", 'while read l; do echo "got $l"; done; echo eof'], stdin_open=True)
        await proc.write_stdin("one\n")
        it = aiter(proc)
        assert await anext(it) == rx.StdoutChunk("got one\n")  # answered before stdin closed
        await proc.write_stdin(b"two\n")
        await proc.close_stdin()
        res = await proc.wait()
    assert res.stdout == "got one\ngot two\neof\n"
    assert res.success


async def test_concurrent_writes_to_one_handle_all_arrive_in_order(url: str) -> None:
    """A view's stdin line and the notebook's code may write through one handle at once: each
    write is whole, in the order they were made (two at once took the same offset, and the agent
    dropped the second as a retry of the first)."""
    lines = [f"line {i}\n" * 50 for i in range(20)]  # 20 writes of ~350 bytes, all in flight together
    async with rx.open_sandbox(url) as sb:
        proc = sb.exec_remote(["cat"], stdin_open=True)
        async with anyio.create_task_group() as tg:
            for text in lines:
                tg.start_soon(proc.write_stdin, text)
                await anyio.lowlevel.checkpoint()  # each task begins before the next (so the order is theirs)
        await proc.close_stdin()
        res = await proc.wait()
    assert res.stdout == "".join(lines)


async def test_writes_called_before_the_start_came_back_go_first(agent_dir: Path) -> None:
    """The order the soak once saw broken: writes called while the job's start was in flight
    were woken a few loop steps after it came back, and a write called after it (finding the
    job started) went first. Here the early callers are woken late on purpose."""
    async with rx.open_sandbox(f"local://?dir={agent_dir}") as sb:
        proc = sb.exec_remote(["cat"], stdin_open=True)
        real_started, gate, early = proc.started, anyio.Event(), [0]

        async def started_late_for_early_callers() -> rx.ExecRemoteProcess:
            early[0] += 1
            if early[0] <= 5:
                await gate.wait()
                for _ in range(5):  # a wake-up that takes a few loop steps
                    await anyio.lowlevel.checkpoint()
            return await real_started()

        proc.started = started_late_for_early_callers  # type: ignore[method-assign]
        async with anyio.create_task_group() as tg:
            for i in range(5):
                tg.start_soon(proc.write_stdin, f"early {i}\n")
                await anyio.lowlevel.checkpoint()
            await real_started()
            gate.set()
            for i in range(5):
                tg.start_soon(proc.write_stdin, f"late {i}\n")
                await anyio.lowlevel.checkpoint()
        await proc.close_stdin()
        res = await proc.wait()
    assert res.stdout == "".join(f"early {i}\n" for i in range(5)) + "".join(f"late {i}\n" for i in range(5))


async def test_stdin_closed_by_default_and_write_without_stdin_open(url: str) -> None:
    async with rx.open_sandbox(url) as sb:
        res = await sb.run(["cat"], timeout=10)  # would hang if stdin were left open
        assert res.stdout == "" and res.success
        proc = sb.exec_remote(["sleep", "5"])
        with pytest.raises(rx.JobNotRunningError, match="stdin"):
            await proc.write_stdin("x")
        await proc.kill(grace=0)


async def test_timeout_streaming_keeps_partial_output(url: str) -> None:
    async with rx.open_sandbox(url) as sb:
        proc = sb.exec_remote(["sh", "-c", "echo partial; sleep 30"], timeout=0.5, kill_grace=0.5)
        seen = []
        with pytest.raises(rx.ExecTimeoutError) as info:
            async for ev in proc:
                seen.append(ev)
        assert seen == [rx.StdoutChunk("partial\n")]
        assert isinstance(info.value, TimeoutError)
        assert info.value.result.stdout == "partial\n" and info.value.result.state == "timed_out"
        assert group_members(proc.pid or 0) == []


async def test_timeout_awaitable_and_retry(url: str, tmp_path: object) -> None:
    async with rx.open_sandbox(url) as sb:
        # The jobs sleep 300 s: fail_after tells a timeout that works from one that does not.
        with anyio.fail_after(60), pytest.raises(rx.ExecTimeoutError) as info:
            await sb.run(["sh", "-c", "echo before; sleep 300"], timeout=0.4, kill_grace=0.1)
        assert info.value.result.stdout == "before\n"
        # timeout_retry: the first try hangs, the retry (a fresh job) succeeds
        marker = f"{tmp_path}/marker"
        script = f"if [ -e {marker} ]; then echo second; else touch {marker}; sleep 300; fi"
        with anyio.fail_after(60):
            res = await sb.run(["sh", "-c", script], timeout=0.5, kill_grace=0.1, timeout_retry=True)
        assert res.stdout == "second\n"
        # and gives up after 3 tries in all
        tries = f"{tmp_path}/tries"
        with anyio.fail_after(60), pytest.raises(rx.ExecTimeoutError):
            await sb.run(
                ["sh", "-c", f"echo try >> {tries}; sleep 300"], timeout=0.3, kill_grace=0.1, timeout_retry=True
            )
        assert await anyio.Path(tries).read_text() == "try\n" * 3  # three tries in all, each one killed


async def test_kill_term_ignoring_tree_leaves_no_process(url: str) -> None:
    async with rx.open_sandbox(url) as sb:
        proc = sb.exec_remote(["sh", "-c", "trap '' TERM; sleep 300 & echo started; wait"], kill_grace=0.3)
        assert await anext(aiter(proc)) == rx.StdoutChunk("started\n")
        pgid = proc.pid
        assert pgid is not None and len(group_members(pgid)) == 2  # sh and sleep
        with anyio.fail_after(30):  # the sleep would last 300 s
            await proc.kill()
        assert group_members(pgid) == []
        assert [ev async for ev in proc] == []  # killed: not interested in more events
        with pytest.raises(rx.JobKilledError):
            await proc.wait()
        info = {j.job_id: j for j in await sb.jobs()}[proc.job_id or ""]
        assert info.state == "killed" and info.exit_code == -9


async def test_kill_reaches_group_after_leader_exits(url: str) -> None:
    # The leader exits on SIGTERM at once; its TERM-ignoring child must still get SIGKILL.
    async with rx.open_sandbox(url) as sb:
        proc = sb.exec_remote(["sh", "-c", "(trap '' TERM; exec sleep 300) & echo up; sleep 300"], kill_grace=0.3)
        assert await anext(aiter(proc)) == rx.StdoutChunk("up\n")
        pgid = proc.pid or 0
        await proc.kill()
        assert group_members(pgid) == []


async def test_cancelled_iteration_kills_job(url: str) -> None:
    async with rx.open_sandbox(url) as sb:
        proc = sb.exec_remote(["sh", "-c", "echo go; sleep 300"], kill_grace=0.2)
        got = []
        with anyio.move_on_after(1.0):
            async for ev in proc:
                got.append(ev)
        assert got == [rx.StdoutChunk("go\n")]
        assert group_members(proc.pid or 0) == []
        info = {j.job_id: j for j in await sb.jobs()}[proc.job_id or ""]
        assert info.state == "killed"


async def test_closing_sandbox_kills_its_jobs_but_not_detached(url: str) -> None:
    async with rx.open_sandbox(url) as sb:
        owned = await sb.exec_remote(["sleep", "300"], kill_grace=0.1).started()
        kept = await sb.exec_remote(["sleep", "300"]).started()
        kept_id = kept.detach()
    assert group_members(owned.pid or 0) == []
    assert group_members(kept.pid or 0) != []
    async with rx.open_sandbox(url) as sb:
        again = await sb.attach(kept_id or "")
        await again.kill(grace=0)
    assert group_members(kept.pid or 0) == []


async def test_utf8_split_across_writes(url: str) -> None:
    # "é" and "€" and an emoji, each written one byte at a time with pauses in between.
    script = r"for b in '\303' '\251' '\342' '\202' '\254' '\360' '\237' '\230' '\200'; do printf $b; sleep 0.05; done"
    async with rx.open_sandbox(url) as sb:
        events = await collect(sb.exec_remote(["bash", "-c", script], poll_interval=0.02))
    chunks = [e.data for e in events if isinstance(e, rx.StdoutChunk)]
    assert "".join(chunks) == "é€😀"  # type: ignore[arg-type]
    assert "\ufffd" not in "".join(chunks)  # type: ignore[arg-type]
    assert len(chunks) >= 2  # it really streamed in pieces


async def test_invalid_utf8_is_replaced_deterministically(url: str) -> None:
    async with rx.open_sandbox(url) as sb:
        res = await sb.run(["printf", r"a\377b\300"])
        again = await sb.run(["printf", r"a\377b\300"])
    assert res.stdout == again.stdout == "a\ufffdb\ufffd"


@pytest.fixture(scope="module")
def big_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, bytes, str]:
    """50 MB of random bytes, and the same as base64 text (lines of 76 characters)."""
    import base64
    import os

    d = tmp_path_factory.mktemp("big")
    raw = os.urandom(50 * 1024 * 1024)
    text = base64.encodebytes(raw).decode()
    (d / "raw.bin").write_bytes(raw)
    (d / "text.txt").write_text(text)
    return str(d / "raw.bin"), str(d / "text.txt"), raw, text


async def test_50mb_text_byte_exact(url: str, big_files: tuple[str, str, bytes, str]) -> None:
    _, text_path, _, text = big_files
    async with rx.open_sandbox(url) as sb:
        digest, total, chunks = hashlib.sha256(), 0, 0
        async for ev in sb.exec_remote(["cat", text_path], output_limit=1024):
            if isinstance(ev, rx.StdoutChunk):
                assert isinstance(ev.data, str)
                digest.update(ev.data.encode())
                total += len(ev.data)
                chunks += 1
    assert total == len(text) > 50 * 1024 * 1024
    assert digest.hexdigest() == hashlib.sha256(text.encode()).hexdigest()
    assert chunks > 10  # bounded polls, not one giant message


async def test_50mb_binary_byte_exact(url: str, big_files: tuple[str, str, bytes, str]) -> None:
    raw_path, _, raw, _ = big_files
    async with rx.open_sandbox(url) as sb:
        res = await sb.run(["cat", raw_path], encoding="base64", output_limit=len(raw))
    assert isinstance(res.stdout, bytes)
    assert len(res.stdout) == len(raw) and hashlib.sha256(res.stdout).digest() == hashlib.sha256(raw).digest()
    assert not res.truncated


async def test_binary_base64_exact(url: str) -> None:
    data = bytes(range(256)) * 4096 + b"\x00\xff\xfe"
    async with rx.open_sandbox(url) as sb:
        res = await sb.run(["cat"], input=data, encoding="base64")
    assert isinstance(res.stdout, bytes)
    assert res.stdout == data


async def test_output_limit_keeps_tail_and_counts(url: str) -> None:
    async with rx.open_sandbox(url) as sb:
        res = await sb.run(["sh", "-c", "seq 1 100000"], output_limit=1000)
    assert cast(str, res.stdout).endswith("99999\n100000\n")
    assert len(res.stdout) == 1000
    assert res.stdout_truncated == len("".join(f"{i}\n" for i in range(1, 100001))) - 1000
    assert res.truncated


async def test_spawn_errors(url: str) -> None:
    async with rx.open_sandbox(url) as sb:
        with pytest.raises(rx.SpawnError, match="no-such-program"):
            await sb.run(["no-such-program-xyz"])
        with pytest.raises(rx.SpawnError, match="/no/such/dir"):
            await sb.run(["true"], cwd="/no/such/dir")
        with pytest.raises(rx.SpawnError, match="unknown user"):
            await sb.run(["true"], user="no-such-user-xyz")


async def test_signal_and_unknown_job(url: str) -> None:
    async with rx.open_sandbox(url) as sb:
        proc = sb.exec_remote(["sh", "-c", "trap 'echo caught; exit 5' INT; echo ready; while :; do sleep 0.05; done"])
        assert await anext(aiter(proc)) == rx.StdoutChunk("ready\n")
        await proc.signal("SIGINT")
        res = await proc.wait()
        assert (res.stdout, res.returncode) == ("ready\ncaught\n", 5)
        with pytest.raises(rx.JobNotFoundError):
            await sb.attach(f"{sb.info.instance_id}-999999")


async def test_attach_from_second_client_sees_same_bytes(url: str) -> None:
    script = "for i in $(seq 1 200); do echo line $i; echo err $i >&2; done; sleep 0.3; echo tail"
    async with rx.open_sandbox(url) as a, rx.open_sandbox(url) as b:
        proc = a.exec_remote(["sh", "-c", script])
        await proc.started()
        watcher = await b.attach(proc.job_id or "")
        first, second = await proc.wait(), await watcher.wait()
    assert first.stdout == second.stdout and first.stderr == second.stderr
    assert cast(str, first.stdout).endswith("line 200\ntail\n")
    assert second.returncode == 0


async def test_jobs_lists_running_and_finished(url: str) -> None:
    async with rx.open_sandbox(url) as sb:
        done = await sb.run(["echo", "x"], label="finished-one")
        running = await sb.exec_remote(["sleep", "30"], label="running-one").started()
        rows = {j.job_id: j for j in await sb.jobs()}
        assert rows[done.job_id].state == "completed" and rows[done.job_id].stdout_bytes == 2
        assert rows[done.job_id].label == "finished-one"
        assert rows[running.job_id or ""].state == "running"
        await running.release()
        assert running.job_id not in {j.job_id for j in await sb.jobs()}


async def test_pid_and_job_id_are_there_once_the_agent_answered(url: str) -> None:
    async with rx.open_sandbox(url) as sb:
        proc = sb.exec_remote(["sleep", "300"], label="pid-without-started")
        with anyio.fail_after(10):  # the agent-side job exists: the start has been answered
            while not any(j.label == "pid-without-started" and j.state == "running" for j in await sb.jobs()):
                await anyio.lowlevel.checkpoint()
        with anyio.fail_after(10):  # its answer may be a moment behind the listing's; never awaited here
            while proc.pid is None:
                await anyio.lowlevel.checkpoint()
        assert proc.job_id is not None  # no `await proc.started()`
        assert proc.pid == {j.job_id: j.pid for j in await sb.jobs()}[proc.job_id]
        await proc.kill()


async def test_second_iteration_raises_and_late_close_stdin_is_a_no_op(url: str) -> None:
    async with rx.open_sandbox(url) as sb:
        proc = sb.exec_remote(["cat"], stdin_open=True)
        await proc.write_stdin("hi\n")
        await proc.close_stdin()
        assert [ev async for ev in proc][-1] == rx.Completed(0, "hi\n", "")
        with pytest.raises(RuntimeError, match="consumed already"):
            async for _ in proc:
                pass
        assert (await proc.wait()).stdout == "hi\n"  # the result stays
        await proc.close_stdin()  # the job ended: nothing to close, no JobNotRunningError
        with pytest.raises(rx.JobNotRunningError):
            await proc.write_stdin("late")  # writing is still an error


def test_blocking_second_iteration_raises(agent_dir: Path) -> None:
    with rx.connect(f"local://?dir={agent_dir}") as sb:
        proc = sb.exec_remote(["echo", "x"])
        assert list(proc)[-1] == rx.Completed(0, "x\n", "")
        with pytest.raises(RuntimeError, match="consumed already"):
            list(proc)
        proc.close_stdin()


async def test_a_held_back_character_does_not_freeze_the_agent(url: str) -> None:
    """A running job's output that ends in the first byte of a UTF-8 character: the poll holds
    that byte back, and must then wait, not spin (a spin froze the whole agent until the job
    wrote again: here, never, since only a later call feeds it)."""
    async with rx.open_sandbox(url) as sb:
        proc = sb.exec_remote(["sh", "-c", r"printf 'a\303'; read x; printf '\251\n'"], stdin_open=True)
        assert await anext(aiter(proc)) == rx.StdoutChunk("a")
        results: list[rx.ExecResult] = []

        async def finish() -> None:
            results.append(await proc.wait())  # its poll finds the held-back byte and waits

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(finish)
                await sb.server_info()  # a round trip: the waiting poll was sent meanwhile
                await proc.write_stdin("go\n")  # answered only by an agent that is not spinning
        assert results[0].stdout == "a\u00e9\n"


async def test_a_jobs_follow_goes_out_behind_its_start_not_after_its_answer(fresh_agent_dir: Path) -> None:
    """The first push leaves as the job writes: the follow is sent right behind the start (the
    agent holds a call on an id still spawning until the spawn is through), not a round trip
    after the start's answer. With the agent stopped, nothing is answered: what is sent is the
    client's own doing."""
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}") as sb:
        channel = sb._core.rpc.channel
        sent: list[str] = []
        both = anyio.Event()
        real = channel.request

        async def recording(body: bytes, *args: Any, **kwargs: Any) -> Any:
            method = re.search(rb'"method":"(\w+)"', bytes(body[:300]))
            if method is not None and method.group(1).startswith(b"exec_remote"):
                sent.append(method.group(1).decode())
            if "exec_remote_follow" in sent:
                both.set()
            return await real(body, *args, **kwargs)

        channel.request = recording  # type: ignore[method-assign]
        agent = sb.info.pid
        os.kill(agent, signal.SIGSTOP)
        try:
            proc = sb.exec_remote(["echo", "hi"])
            first = asyncio.ensure_future(anext(aiter(proc)))
            with anyio.fail_after(10):
                await both.wait()
            assert sent == ["exec_remote_start", "exec_remote_follow"] and proc.pid is None
        finally:
            os.kill(agent, signal.SIGCONT)
        with anyio.fail_after(60):
            events = [await first, *[ev async for ev in proc]]
    assert joined(events, rx.StdoutChunk) == "hi\n"
    assert isinstance(events[-1], rx.Completed) and events[-1].exit_code == 0
    assert proc.pid is not None


async def test_a_command_that_cannot_start_says_so_to_an_early_follower(url: str) -> None:
    """The follow sent behind a start that fails is refused as an unknown job: the reader is
    told what the start met instead."""
    async with rx.open_sandbox(url) as sb:
        with anyio.fail_after(60), pytest.raises(rx.SpawnError, match="no-such-command-here"):
            async for _ in sb.exec_remote(["no-such-command-here"]):
                pass


async def test_a_follow_that_overtook_its_start_is_asked_again(url: str) -> None:
    """The agent calls a job unknown if its follow arrives before its start (a reconnect can
    reorder them): the reader waits for the start and follows again, losing nothing."""
    async with rx.open_sandbox(url) as sb:
        channel = sb._core.rpc.channel
        real = channel.request
        refused: list[int] = []

        async def overtaken(body: bytes, request_id: int, *args: Any, **kwargs: Any) -> Any:
            if b'"method":"exec_remote_follow"' in bytes(body[:300]) and not refused:
                refused.append(request_id)
                message = b'{"jsonrpc":"2.0","id":%d,"error":{"code":%d,"message":"unknown job"}}'
                return frames.Frame(message % (request_id, rx.JobNotFoundError.code))
            return await real(body, request_id, *args, **kwargs)

        channel.request = overtaken  # type: ignore[method-assign]
        with anyio.fail_after(60):
            events = [ev async for ev in sb.exec_remote(["sh", "-c", "echo one; echo two"])]
    assert refused, "no follow was refused"
    assert joined(events, rx.StdoutChunk) == "one\ntwo\n"
    assert isinstance(events[-1], rx.Completed) and events[-1].exit_code == 0
