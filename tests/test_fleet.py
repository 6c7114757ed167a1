"""Fleet and gather: one command, many sandboxes, failures kept apart."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import anyio
import pytest

import remote_exec as rx
from remote_exec.agent.jobs.proctable import group_members
from remote_exec.fleet import Fleet, FleetEvent, gather

pytestmark = pytest.mark.anyio


async def test_gather_in_order_with_errors(agent_dir: Path, tmp_path: Path) -> None:
    urls = [f"local://?dir={agent_dir}", f"local://?dir={tmp_path}/second", f"local://?dir={agent_dir}&channel=stdio"]
    results = await gather(urls, ["sh", "-c", 'echo "$PPID" >/dev/null; echo ok'])
    assert [r.stdout for r in results if isinstance(r, rx.ExecResult)] == ["ok\n"] * 3
    async with rx.open_sandbox(urls[0]) as sb:
        mixed = await gather([sb, urls[1]], ["sh", "-c", "exit 3"], timeout=10)
        assert [r.returncode for r in mixed if isinstance(r, rx.ExecResult)] == [3, 3]
        failed = await gather([sb], ["no-such-command-xyz"])
        assert isinstance(failed[0], rx.SpawnError)
        assert await sb.run(["true"])  # a sandbox given open is left open
    async with rx.open_sandbox(urls[1]) as sb2:
        os.kill(sb2.info.pid, signal.SIGTERM)  # the second agent is this test's own


async def test_stream_merges_tagged_events(agent_dir: Path) -> None:
    urls = [f"local://?dir={agent_dir}", f"local://?dir={agent_dir}&channel=stdio"]
    async with Fleet(urls) as fleet:
        seen: dict[int, list[FleetEvent]] = {0: [], 1: []}
        async with fleet.stream(["sh", "-c", "echo a; sleep 0.1; echo b"]) as events:
            async for item in events:
                seen[item.index].append(item)
    for i in (0, 1):
        got = [s.event for s in seen[i]]
        # (how the output is cut into chunks depends on when each poll comes: not asserted)
        assert "".join(str(e.data) for e in got if isinstance(e, rx.StdoutChunk)) == "a\nb\n"
        assert got[-1] == rx.Completed(0, "a\nb\n", "") and all(isinstance(e, rx.StdoutChunk) for e in got[:-1])


async def test_leaving_stream_early_kills_the_rest(agent_dir: Path) -> None:
    urls = [f"local://?dir={agent_dir}"] * 3
    async with Fleet(urls) as fleet:
        pids: list[int] = []
        async with fleet.stream(["sh", "-c", "echo $$; sleep 300"], kill_grace=0.1) as events:
            async for item in events:
                assert isinstance(item.event, rx.StdoutChunk)
                pids.append(int(str(item.event.data)))
                if len(pids) == 3:
                    break
        with anyio.fail_after(10):
            async with rx.open_sandbox(urls[0]) as sb:
                await sb.run(["sh", "-c", f"while kill -0 {' '.join(map(str, pids))} 2>/dev/null; do sleep 0.02; done"])
    assert all(group_members(p) == [] for p in pids)


async def test_the_fleet_closes_its_sandboxes_together(agent_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each close waits until all three have begun: closed one after another, the first would
    wait for ever (a hundred pods closed in turn took their sum: 20 s for 20 on the real tier)."""
    started = 0
    all_started = anyio.Event()
    close = rx.AsyncSandbox.aclose

    async def closing_together(self: rx.AsyncSandbox) -> None:
        nonlocal started
        started += 1
        if started == 3:
            all_started.set()
        try:
            with anyio.fail_after(10):  # (inside the fleet's shielded close: its own deadline)
                await all_started.wait()
        finally:
            await close(self)

    urls = [f"local://?dir={agent_dir}"] * 3
    with anyio.fail_after(60):
        async with Fleet(urls) as fleet:
            monkeypatch.setattr(rx.AsyncSandbox, "aclose", closing_together)
            assert [r.returncode for r in await fleet.run(["true"]) if isinstance(r, rx.ExecResult)] == [0] * 3
    assert started == 3
