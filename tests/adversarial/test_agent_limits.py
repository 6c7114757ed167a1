"""Point 9: the agent's limits hold under concurrent requests.

Each limit used to be checked, then awaited past (a shell starting, a file being created, a
connect, a spawn), then registered: N concurrent requests all passed the check. Now the slot is
taken before the await. N >> limit concurrent requests: exactly ``limit`` succeed, the rest get
``ServerBusyError`` naming the limit, and a refused write open leaves no temporary file.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

import remote_exec as rx
from remote_exec.protocol import (
    FileWriteOpenParams,
    FileWriteOpenResult,
    Method,
    PortConnectParams,
    PortConnInfo,
    ShellInfo,
    ShellOpenParams,
    StartParams,
    StartResult,
)

from .agentproc import agent
from .conftest import Adversary

pytestmark = pytest.mark.anyio

LIMIT = 4
N = 40


async def _race(
    adversary: Adversary,
    case: str,
    state_dir: Path,
    flag: str,
    call: Callable[[rx.AsyncSandbox, int], Awaitable[object]],
) -> list[object]:
    with agent(state_dir, flag, str(LIMIT)) as pid:
        async with rx.open_sandbox(f"local://?dir={state_dir}") as sb:
            results = await asyncio.gather(*(call(sb, i) for i in range(N)), return_exceptions=True)
            adversary.agent_peak(pid)
    ok = [r for r in results if not isinstance(r, BaseException)]
    busy = [r for r in results if isinstance(r, rx.ServerBusyError)]
    adversary.tried("limits", f"{N} concurrent {case}, limit {LIMIT}", refused=len(ok) == LIMIT)
    assert len(ok) == LIMIT, f"{len(ok)} of {N} concurrent {case} got through a limit of {LIMIT}"
    assert len(busy) == N - LIMIT, [r for r in results if isinstance(r, BaseException) and r not in busy]
    assert all("the limit of this agent" in b.message and b.data == {"limit": LIMIT} for b in busy)
    return ok


async def test_concurrent_shell_opens_stop_at_the_limit(tmp_path: Path, adversary: Adversary) -> None:
    async def call(sb: rx.AsyncSandbox, _: int) -> ShellInfo:
        return await sb._core.rpc.call(Method.SHELL_OPEN, ShellOpenParams(), ShellInfo)

    await _race(adversary, "shell_open", tmp_path / "state", "--max-shells", call)


async def test_concurrent_write_opens_stop_at_the_limit(tmp_path: Path, adversary: Adversary) -> None:
    target = tmp_path / "w"
    target.mkdir()

    async def call(sb: rx.AsyncSandbox, i: int) -> FileWriteOpenResult:
        params = FileWriteOpenParams(session_id=f"race{i:04d}", path=str(target / f"f{i}"))
        return await sb._core.rpc.call(Method.FILE_WRITE_OPEN, params, FileWriteOpenResult)

    await _race(adversary, "file_write_open", tmp_path / "state", "--max-write-sessions", call)
    assert list(target.iterdir()) == []  # the agent stopped: its sessions aborted, refused ones made nothing


async def test_concurrent_port_connects_stop_at_the_limit(tmp_path: Path, adversary: Adversary) -> None:
    accepted: list[asyncio.StreamWriter] = []

    async def on_connect(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]

    async def call(sb: rx.AsyncSandbox, _: int) -> PortConnInfo:
        return await sb._core.rpc.call(Method.PORT_CONNECT, PortConnectParams(port=port), PortConnInfo)

    try:
        await _race(adversary, "port_connect", tmp_path / "state", "--max-conns", call)
    finally:
        for writer in accepted:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_concurrent_job_starts_stop_at_max_running(tmp_path: Path, adversary: Adversary) -> None:
    async def call(sb: rx.AsyncSandbox, _: int) -> StartResult:
        params = StartParams(command=["sleep", "60"])
        return await sb._core.rpc.call(Method.EXEC_REMOTE_START, params, StartResult)

    started = await _race(adversary, "exec_remote_start", tmp_path / "state", "--max-running", call)
    assert len({s.job_id for s in started if isinstance(s, StartResult)}) == LIMIT
