"""Liveness: a frozen agent is an ``AgentUnresponsiveError`` within the bound, and a thawed one
resumes the stream from its cursors with not one byte lost (real agent, real SIGSTOP)."""

from __future__ import annotations

import hashlib
import os
import signal
import time
from pathlib import Path

import anyio
import pytest

import remote_exec as rx
from remote_exec.client.channel import DEFAULT_LIVENESS, Liveness, StdioChannel
from remote_exec.protocol import HEARTBEAT_ANSWER, frames

pytestmark = pytest.mark.anyio

LINES = 3000
# A job whose output is known exactly: numbered lines, slowly enough to span the freeze.
TEXT = "of a stream that must arrive whole"
JOB = f'i=0; while [ $i -lt {LINES} ]; do i=$((i+1)); echo "line $i {TEXT}"; [ $((i % 100)) = 0 ] && sleep 0.05; done'
EXPECTED = "".join(f"line {i} {TEXT}\n" for i in range(1, LINES + 1)).encode()


def as_bytes(data: str | bytes) -> bytes:
    return data if isinstance(data, bytes) else data.encode()


async def frozen_then_thawed(sb: rx.AsyncSandbox, freeze: list[int], what: str) -> None:
    """Start the job, SIGSTOP ``freeze`` mid-stream, expect the precise error within the bound,
    SIGCONT, then read on to the end and compare every byte."""
    proc = sb.exec_remote(["sh", "-c", JOB])
    got = bytearray()
    async for ev in proc:
        assert isinstance(ev, rx.StdoutChunk)
        got += as_bytes(ev.data)
        break
    assert sb.liveness is not None
    bound = sb.liveness.bound  # the sandbox's own: the default, or a shorter one its test opened it with
    for pid in freeze:
        os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        with anyio.fail_after(bound + 15):
            with pytest.raises(rx.AgentUnresponsiveError, match=sb.url.split("?")[0]) as caught:
                async for ev in proc:
                    if isinstance(ev, rx.StdoutChunk):
                        got += as_bytes(ev.data)
        elapsed = time.monotonic() - t0
        assert f"liveness bound {bound:g} s" in str(caught.value)  # the sandbox's bound, not another
        print(f"\n{what}: {type(caught.value).__name__} after {elapsed:.2f} s (bound {bound:g} s): {caught.value}")
    finally:
        for pid in freeze:
            os.kill(pid, signal.SIGCONT)
    with anyio.fail_after(60):
        async for ev in proc:  # the same handle, from its cursors
            if isinstance(ev, rx.StdoutChunk):
                got += as_bytes(ev.data)
            elif isinstance(ev, rx.Completed):
                assert ev.exit_code == 0
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(EXPECTED).hexdigest()


# A freeze is noticed within the liveness bound of the last frame: these tests wait it out. The
# socket channel's test runs with the default (8 s), which is what catches a freeze out of the box;
# the other freezes (the stdio channel here, the backends in tests/sandboxes/test_liveness.py)
# go through the same heartbeat with a shorter bound, set as a user would (``liveness=``).
SHORT_LIVENESS = Liveness.within(4.0)


@pytest.mark.parametrize("channel", ["socket", "stdio"])
async def test_sigstopped_agent_is_unresponsive_within_the_bound_then_resumes(
    fresh_agent_dir: Path, channel: str
) -> None:
    url = f"local://?dir={fresh_agent_dir}&channel={channel}"
    async with rx.open_sandbox(url, liveness=None if channel == "socket" else SHORT_LIVENESS) as sb:
        assert sb.liveness == (DEFAULT_LIVENESS if channel == "socket" else SHORT_LIVENESS)  # None: the default
        await frozen_then_thawed(sb, [sb.info.pid], f"local {channel}: SIGSTOP agent")


async def test_idle_channel_sends_heartbeats_the_agent_stamps(fresh_agent_dir: Path) -> None:
    """Both ways: an idle client is heard by the agent (its Peer's last_seen moves)."""
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}", liveness=Liveness(interval=0.2, timeout=5)) as sb:
        channel = sb._core.rpc.channel
        assert isinstance(channel, StdioChannel)
        answered = anyio.Event()
        deliver = channel._deliver

        def noting(frame: frames.Frame) -> None:
            if frame.message == HEARTBEAT_ANSWER:
                answered.set()
            deliver(frame)

        channel._deliver = noting  # type: ignore[method-assign]
        with anyio.fail_after(10):
            await answered.wait()  # sent with no request at all in flight


async def test_liveness_off_leaves_the_deadlines(fresh_agent_dir: Path) -> None:
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}", liveness=0) as sb:
        assert sb.liveness is None
        assert (await sb.run(["echo", "ok"])).stdout == "ok\n"
