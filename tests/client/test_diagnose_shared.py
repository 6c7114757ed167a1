"""Calls that fail together ask the sandbox what became of it once, not once each.

A channel's break fails every call in flight at the same moment (200 followers of a killed
agent); each then asked the transport's ``diagnose`` by itself: a ``docker inspect`` (an SSH
connection, an API read) per call, 1,355 of them in one fault-suite run. The question in flight
is shared; each call's error still names its own failure."""

from __future__ import annotations

import asyncio

import pytest

from remote_exec.client.channel import StdioChannel
from remote_exec.client.rpc import RpcClient
from remote_exec.errors import KubeApiError, RemoteExecError, SandboxLostError
from remote_exec.protocol import Empty, ServerInfo

pytestmark = pytest.mark.anyio


async def test_calls_failing_together_ask_the_sandbox_once() -> None:
    asked = 0

    async def diagnose() -> RemoteExecError | None:
        nonlocal asked
        asked += 1
        await (await asyncio.create_subprocess_exec("true")).wait()  # as `docker inspect` is asked
        return SandboxLostError("box: container c no longer exists")

    async def agent_that_dies_at_once() -> asyncio.subprocess.Process:
        pipe = asyncio.subprocess.PIPE
        return await asyncio.create_subprocess_exec("sh", "-c", "exit 1", stdin=pipe, stdout=pipe)

    rpc = RpcClient(StdioChannel(agent_that_dies_at_once), name="box", diagnose=diagnose)
    try:
        calls = (rpc.call("server_info", Empty(), ServerInfo) for _ in range(20))
        results = await asyncio.gather(*calls, return_exceptions=True)
    finally:
        await rpc.aclose()
    assert all(isinstance(r, SandboxLostError) for r in results), results
    assert all("no longer exists" in str(r) and "broke" in str(r) for r in results), results
    # 20 when each call asked by itself; shared, one question per wave of calls that broke
    # together (the calls re-send one by one after a reconnect: a few waves at most).
    assert asked <= 10, asked


async def test_a_shared_answer_keeps_its_class_and_facts_for_each_call() -> None:
    """Each call gets its own copy of the answer, made from its state, not by its constructor
    (``KubeApiError``'s takes a status too). (No error class is made here: the API's test finds
    every subclass of ``RemoteExecError`` in errors.py.)"""

    async def diagnose() -> RemoteExecError | None:
        return KubeApiError("pod p: forbidden", 403, "Forbidden")

    async def agent_that_dies_at_once() -> asyncio.subprocess.Process:
        pipe = asyncio.subprocess.PIPE
        return await asyncio.create_subprocess_exec("sh", "-c", "exit 1", stdin=pipe, stdout=pipe)

    # Three tries each: the calls then fail for the transport and take the sandbox's answer.
    rpc = RpcClient(StdioChannel(agent_that_dies_at_once), name="box", diagnose=diagnose, attempts=3)
    try:
        calls = (rpc.call("server_info", Empty(), ServerInfo) for _ in range(3))
        results = await asyncio.gather(*calls, return_exceptions=True)
    finally:
        await rpc.aclose()
    assert all(isinstance(r, KubeApiError) and (r.status, r.reason) == (403, "Forbidden") for r in results), results
    assert all(str(r).startswith("pod p: forbidden (") for r in results), results
    assert len({id(r) for r in results}) == 3


async def test_a_question_in_flight_ends_with_the_sandbox() -> None:
    """Closing the sandbox ends the question asked of it (a `docker inspect` in flight outlived
    the close by up to its 5 s bound); the call that failed says its own failure."""
    asking, ended = asyncio.Event(), asyncio.Event()

    async def diagnose() -> RemoteExecError | None:
        asking.set()
        try:
            await asyncio.Event().wait()  # a sandbox that does not answer
        finally:
            ended.set()
        return None

    async def agent_that_dies_at_once() -> asyncio.subprocess.Process:
        pipe = asyncio.subprocess.PIPE
        return await asyncio.create_subprocess_exec("sh", "-c", "exit 1", stdin=pipe, stdout=pipe)

    rpc = RpcClient(StdioChannel(agent_that_dies_at_once), name="box", diagnose=diagnose)
    call = asyncio.ensure_future(rpc.call("server_info", Empty(), ServerInfo))
    try:
        async with asyncio.timeout(30):
            await asking.wait()
    finally:
        await rpc.aclose()
    assert ended.is_set()  # (before: still asking, for DIAGNOSE_TIMEOUT after the close)
    with pytest.raises(RemoteExecError) as caught:
        await call
    assert not isinstance(caught.value, SandboxLostError) and "box" in str(caught.value), caught.value
