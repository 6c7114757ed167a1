"""The channel's observable state (``sb.link``): connected, lost within the liveness bound when
the agent freezes (real SIGSTOP), connected again after SIGCONT, reconnecting when the relay
dies, closed at the end; each change an event."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import anyio
import pytest

import remote_exec as rx
from remote_exec.client.channel import Liveness, StdioChannel
from remote_exec.client.link import Link, LinkState, LinkStatus

from ..conftest import relay_pid

pytestmark = pytest.mark.anyio

LIVENESS = Liveness(interval=0.5, timeout=1.5)


async def until(link: Link, state: LinkState, within: float) -> LinkStatus:
    with anyio.fail_after(within):
        while link.state != state:
            await link.changed()
    return link.status


@pytest.mark.parametrize("channel", ["socket", "stdio"])
async def test_link_lost_on_freeze_and_connected_after_thaw(fresh_agent_dir: Path, channel: str) -> None:
    seen: list[LinkState] = []
    url = f"local://?dir={fresh_agent_dir}&channel={channel}"
    async with rx.open_sandbox(url, liveness=LIVENESS) as sb:
        assert sb.link.state == "connected"  # server_info answered
        stop = sb.link.subscribe(lambda s: seen.append(s.state))
        proc = sb.exec_remote(["sh", "-c", "echo up; sleep 60"])
        async for ev in proc:
            assert isinstance(ev, rx.StdoutChunk)
            break
        os.kill(sb.info.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            # The job sleeps 60 s: without the heartbeat the poll would outlast this bound.
            with anyio.fail_after(LIVENESS.bound + 30), pytest.raises(rx.AgentUnresponsiveError):
                async for _ in proc:  # the long poll in flight is failed by the heartbeat
                    pass
            status = await until(sb.link, "lost", 5)
            took = time.monotonic() - t0
            print(f"\nlocal {channel}: link lost after {took:.2f} s (bound {LIVENESS.bound:g} s): {status.reason}")
            assert "heartbeat" in status.reason
        finally:
            os.kill(sb.info.pid, signal.SIGCONT)
        assert (await sb.run(["echo", "back"])).stdout == "back\n"  # reconnects from "lost"
        assert sb.link.state == "connected"
        stop()
        await proc.kill()
    assert sb.link.status.state == "closed"  # (a fresh read: mypy narrowed .state above)
    assert seen[:1] == ["lost"] and seen[-1] == "connected", seen


async def test_link_reconnecting_when_the_relay_dies(fresh_agent_dir: Path) -> None:
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}&channel=stdio") as sb:
        channel = sb._core.rpc.channel
        assert isinstance(channel, StdioChannel) and channel.process is not None
        os.kill(relay_pid(channel.process), signal.SIGKILL)
        status = await until(sb.link, "reconnecting", 20)
        assert "closed by the sandbox" in status.reason
        assert (await sb.run(["echo", "ok"])).stdout == "ok\n"
        assert sb.link.state == "connected"


def test_blocking_sandbox_shows_the_same_link(agent_dir: Path) -> None:
    with rx.connect(f"local://?dir={agent_dir}") as sb:
        assert sb.link is sb.async_sandbox.link
        assert sb.link.status.healthy
    assert sb.link.state == "closed"


@pytest.mark.parametrize("channel", ["socket", "stdio"])
async def test_an_agent_slower_than_the_liveness_bound_to_first_answer_still_opens(
    fresh_agent_dir: Path, channel: str
) -> None:
    """A cold agent on a loaded machine may take longer than a short liveness bound to answer
    its first call: the open waits for it within its own open_timeout, it is not "frozen" (the
    soak's test_link_lost_on_freeze_and_connected_after_thaw failed to open for this)."""
    url = f"local://?dir={fresh_agent_dir}&channel={channel}"
    async with rx.open_sandbox(url) as first:
        agent = first.info.pid
    os.kill(agent, signal.SIGSTOP)  # the agent answers nothing until it is continued...
    thaw = threading.Timer(3 * LIVENESS.bound, os.kill, (agent, signal.SIGCONT))  # ...past the bound
    thaw.start()
    try:
        async with rx.open_sandbox(url, liveness=LIVENESS, open_timeout=60) as sb:
            assert sb.link.state == "connected" and sb.info.pid == agent
    finally:
        thaw.cancel()
        os.kill(agent, signal.SIGCONT)
