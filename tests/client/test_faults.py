"""Faults: lost responses, a killed channel, a killed agent. Nothing is lost, nothing hangs."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import anyio
import pytest

import remote_exec as rx
from remote_exec.agent.jobs.proctable import group_members
from remote_exec.client.channel import Liveness, OnPush, StdioChannel
from remote_exec.protocol import frames

from ..conftest import relay_pid

pytestmark = pytest.mark.anyio

SLOW_LINES = "for i in $(seq 1 300); do echo line $i; echo err $i >&2; [ $((i % 30)) = 0 ] && sleep 0.05; done; exit 4"
EXPECTED_OUT = "".join(f"line {i}\n" for i in range(1, 301))
EXPECTED_ERR = "".join(f"err {i}\n" for i in range(1, 301))


def _is_poll_with_data(frame: frames.Frame) -> bool:
    """A poll response carrying output (binary polls carry it in a non-empty payload)."""
    message, payload = frame
    if payload is not None:
        return b'"stdout_offset"' in message and len(payload) > 0
    return b'"stdout_offset"' in message and (b'"stdout":""' not in message or b'"stderr":""' not in message)


_PUSH_OF = re.compile(rb'^\{"jsonrpc":"2\.0","method":"exec_remote_push","params":\{"call":(\d+),')
_ANSWER_TO = re.compile(rb'^\{"jsonrpc":"2\.0","id":(\d+),')


def drop_poll_responses(sb: rx.AsyncSandbox, which: set[int]) -> list[int]:
    """Make the channel lose the n-th poll responses that carry data (1-based); return a log.

    A channel that pushes loses, from the n-th push that carries data on, every frame of that
    follow call (the rest of its pushes and its answer), as a call lost on its way would be:
    the client hears nothing more of it and follows again from its cursors."""
    channel = sb._core.rpc.channel
    seen: list[int] = []
    # Every persistent channel (the socket one included) reads frames in one loop: drop them there.
    assert isinstance(channel, StdioChannel)
    deliver = channel._deliver
    lost: set[int] = set()

    def lossy_deliver(frame: frames.Frame) -> None:
        if not channel.pushes:
            if _is_poll_with_data(frame):
                seen.append(len(seen) + 1)
                if seen[-1] in which:
                    return  # the response vanishes on its way back
            deliver(frame)
            return
        m = _PUSH_OF.match(frame.message) or _ANSWER_TO.match(frame.message)
        call = int(m.group(1)) if m is not None else None
        if call in lost:
            return
        if call is not None and frame.message.startswith(b'{"jsonrpc":"2.0","method"') and frame.payload:
            seen.append(len(seen) + 1)
            if seen[-1] in which:
                lost.add(call)
                return
        deliver(frame)

    channel._deliver = lossy_deliver  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize("channel", ["socket", "stdio", "polls"])
async def test_dropped_poll_responses_lose_and_duplicate_nothing(agent_dir: Path, channel: str) -> None:
    """Polls whose answers are lost (``polls``: a socket channel told it cannot push, as the
    stateless channel cannot), and follow calls lost on their way (see drop_poll_responses),
    are asked again from the handle's cursors."""
    # Lost answers counted from the first that carries data, so the faults do not hang on how the
    # job's output happens to fall into answers: a lost answer is asked again at the same cursors,
    # whose answer carries data too. A poll is asked up to three times within its deadline, a
    # follow call twice.
    which = {1, 2} if channel == "polls" else {1}
    url = f"local://?dir={agent_dir}&channel={'socket' if channel == 'polls' else channel}"
    async with rx.open_sandbox(url, response_margin=1.0) as sb:  # a re-ask gets ~1 s even on a loaded machine
        if channel == "polls":
            sb._core.rpc.channel.pushes = False
        seen = drop_poll_responses(sb, which)
        proc = sb.exec_remote(["bash", "-c", SLOW_LINES], poll_interval=0.1)
        with anyio.fail_after(30):
            res = await proc.wait()
    assert which <= set(seen)  # the faults really happened
    assert res.stdout == EXPECTED_OUT
    assert res.stderr == EXPECTED_ERR
    assert res.returncode == 4


async def test_killed_stdio_channel_reconnects_without_loss(agent_dir: Path, tmp_path: Path) -> None:
    go = tmp_path / "go"  # the job streams its lines only once the channel was killed
    async with rx.open_sandbox(f"local://?dir={agent_dir}&channel=stdio") as sb:
        channel = sb._core.rpc.channel
        assert isinstance(channel, StdioChannel)
        wait_go = f"until [ -e {go} ]; do sleep 0.01; done; "
        proc = sb.exec_remote(["bash", "-c", "echo first; " + wait_go + SLOW_LINES])
        first = await anext(aiter(proc))
        assert first == rx.StdoutChunk("first\n")
        relay = channel.process
        assert relay is not None
        relay.kill()  # kill -9 of the host-side channel process
        go.touch()
        with anyio.fail_after(30):
            res = await proc.wait()
        assert channel.process is not None and relay_pid(channel.process) != relay_pid(relay)  # a new relay
    assert res.stdout == "first\n" + EXPECTED_OUT
    assert res.stderr == EXPECTED_ERR
    assert res.returncode == 4


@pytest.mark.parametrize("channel", ["socket", "stdio"])
async def test_agent_killed_mid_job_job_lives_on(fresh_agent_dir: Path, channel: str) -> None:
    """kill -9 of the agent: the keeper starts another, which re-adopts the job; the client goes on."""
    url = f"local://?dir={fresh_agent_dir}&channel={channel}"
    async with rx.open_sandbox(url, response_margin=1.0) as sb:
        proc = sb.exec_remote(["sh", "-c", "echo up; read x; echo got $x"], stdin_open=True)
        assert await anext(aiter(proc)) == rx.StdoutChunk("up\n")
        os.kill(sb.info.pid, signal.SIGKILL)
        await proc.write_stdin("it\n")
        with anyio.fail_after(20):
            res = await proc.wait()
        assert res.stdout == "up\ngot it\n" and res.returncode == 0
        assert sb.info.instance_id != (await sb.server_info()).instance_id


async def test_job_survives_client_and_is_reattached(agent_dir: Path) -> None:
    url = f"local://?dir={agent_dir}"
    async with rx.open_sandbox(url) as sb:
        proc = sb.exec_remote(["sh", "-c", "read a; echo one $a; read b; echo two $b"], stdin_open=True)
        await proc.write_stdin("A\n")
        assert await anext(aiter(proc)) == rx.StdoutChunk("one A\n")
        job_id = proc.detach()
    async with rx.open_sandbox(url) as sb:  # as a restarted kernel would
        again = await sb.attach(job_id or "")
        await again.write_stdin("B\n")  # continues after the 2 bytes the first client wrote
        res = await again.wait()
    assert res.stdout == "one A\ntwo B\n"
    assert group_members(again.pid or 0) == []


async def test_an_agent_without_a_frame_stream_is_named_not_retried(fresh_agent_dir: Path) -> None:
    """An older agent (HTTP socket only) still serving the dir: a precise error at once, no hang."""
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}") as sb:
        pid = sb.info.pid
    (fresh_agent_dir / "agent.stream").unlink()  # the server lives on; new connections cannot reach it
    try:
        with anyio.fail_after(30), pytest.raises(rx.AgentUnavailableError, match="older version without a frame"):
            async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}"):
                pass
    finally:
        os.kill(pid, signal.SIGTERM)


@pytest.mark.parametrize("channel", ["socket", "stdio"])
async def test_one_poll_outlives_many_agent_crashes(fresh_agent_dir: Path, channel: str) -> None:
    """Six agents killed during ONE long poll: the poll reconnects each time while its deadline
    has time left, and the job's output and exit status arrive (four breaks used to end it).

    Each kill lands on the agent that holds the poll: a retried poll counts as delivered once
    an agent answered on the connection that carries it (the link is ``connected`` again: the
    heartbeat is written after the poll, and the agent reads a connection in order). Waiting
    only for the client to *send* it raced a stdio relay still starting up: the kill then hit
    the agent before the relay reached it, the relay started the next one, and the poll sat
    there until the agent's 30 s long-poll cap, breaking nothing. How soon the poll is back in
    an agent after each kill is measured and bounded."""
    url = f"local://?dir={fresh_agent_dir}&channel={channel}"
    # Frequent pings: the link reports "connected" soon after a new agent answers; no false
    # "unresponsive" while a relay and an agent start under load.
    liveness = Liveness(interval=0.25, timeout=30.0)
    async with rx.open_sandbox(url, liveness=liveness) as sb, rx.open_sandbox(url) as probe:
        rpc_channel = sb._core.rpc.channel
        polls: list[int] = []
        news = anyio.Event()  # a poll was sent or the link changed
        request = rpc_channel.request

        def bump() -> None:
            nonlocal news
            news.set()
            news = anyio.Event()

        async def counting(body: bytes, request_id: int, timeout: float, on_push: OnPush | None = None) -> frames.Frame:
            if b'"exec_remote_follow"' in body or b'"exec_remote_poll"' in body:
                polls.append(request_id)
                bump()
            return await request(body, request_id, timeout, on_push)

        async def in_an_agent(sent_before: int) -> None:
            """Until a poll sent after the first ``sent_before`` is in a live agent."""
            while True:
                n, changed = len(polls), news
                if n > sent_before and sb.link.state == "connected":
                    return
                await changed.wait()

        rpc_channel.request = counting  # type: ignore[method-assign]
        stop_watching = sb.link.subscribe(lambda _: bump())
        # One follow call waits (up to 30 s at a time) for output that never comes until the kills are over.
        proc = sb.exec_remote(["sh", "-c", "echo up; read x; echo got $x"], stdin_open=True, poll_interval=60)
        assert await anext(aiter(proc)) == rx.StdoutChunk("up\n")
        result: list[rx.ExecResult] = []
        resumed: list[float] = []  # seconds from each kill until the poll is in the next agent

        async def finish() -> None:
            result.append(await proc.wait())

        with anyio.fail_after(90):
            async with anyio.create_task_group() as tg:
                tg.start_soon(finish)
                # The follow call that brought "up" stays open in the agent (it pushed, it did not end).
                await in_an_agent(len(polls) - 1)
                for _ in range(6):
                    sent = len(polls)
                    os.kill((await probe.server_info()).pid, signal.SIGKILL)
                    killed = time.monotonic()
                    # The break was seen, the poll asked again, and delivered: a relay's start, the
                    # keeper's restart (back-off at most 1.6 s) and a ping, far below the 30 s long-poll
                    # cap a missed break would wait out.
                    with anyio.fail_after(25):
                        await in_an_agent(sent)
                    resumed.append(time.monotonic() - killed)
                await proc.write_stdin("it\n")
        stop_watching()
    assert result[0].stdout == "up\ngot it\n" and result[0].returncode == 0
    assert len(set(polls)) >= 7  # the follow call, and each of the 6 kills broke it and it was asked again
    print(f"{channel}: the poll was back in an agent {', '.join(f'{t:.2f}' for t in resumed)} s after each kill")
