"""``exec_remote_follow`` in the agent: pushes in order, the end with the last bytes, one read
per chunk for every follower at the same cursors, and no follow where nothing can be pushed."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from remote_exec.agent.filespan import FileSpan
from remote_exec.agent.jobs.logfile import LogFile
from remote_exec.protocol import FollowParams, PollResult, StartParams, frames

from .homes import jobs_in
from .rawhttp import post, rpc

pytestmark = pytest.mark.anyio

HEAD = b'{"jsonrpc":"2.0","method":"exec_remote_push","params":{"call":7,"job_id":"mine",'


def _span_bytes(span: FileSpan) -> bytes:
    fd = os.open(span.path, os.O_RDONLY)
    try:
        return os.pread(fd, span.size, span.offset)
    finally:
        os.close(fd)


class Connection:
    """What a follower's pushes reach: each one parsed; a write takes a turn of the loop."""

    def __init__(self) -> None:
        self.pushes: list[tuple[dict[str, Any], bytes]] = []

    async def send(self, message: bytes, payload: bytes | tuple[FileSpan, ...] | None = None) -> None:
        if isinstance(payload, tuple):  # spans of the logs, as the connection would send them
            payload = b"".join(_span_bytes(span) for span in payload)
        frame = frames.split(frames.encode(message, payload))
        self.pushes.append((json.loads(frame.message), bytes(frame.payload or b"")))
        await asyncio.sleep(0)

    def output(self) -> bytes:
        return b"".join(p[:n] for (_, p), n in ((x, x[0]["params"]["payload_sizes"][0]) for x in self.pushes))


async def test_twenty_followers_share_one_read_per_chunk(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    reads: collections.Counter[int] = collections.Counter()
    real = LogFile.span

    def counted(self: LogFile, *args: Any, **kwargs: Any) -> Any:
        reads[id(self)] += 1
        return real(self, *args, **kwargs)

    monkeypatch.setattr(LogFile, "span", counted)
    jobs = jobs_in(tmp_path)
    script = "for i in $(seq 1 40); do echo line $i; sleep 0.01; done; exit 3"
    try:
        await jobs.start(StartParams(command=["sh", "-c", script], job_id="mine"))
        job = await jobs.held("mine")
        followers = [Connection() for _ in range(20)]
        results = await asyncio.gather(
            *(job.follow(FollowParams(job_id="mine", wait=5), c.send, HEAD) for c in followers)
        )
        await job.ended()
    finally:
        await jobs.aclose()
    expected = "".join(f"line {i}\n" for i in range(1, 41)).encode()
    for connection, result in zip(followers, results, strict=True):
        assert result.ended and result.pushes == len(connection.pushes)
        assert connection.output() == expected
        last = PollResult.model_validate(
            {k: v for k, v in connection.pushes[-1][0]["params"].items() if k not in ("call", "job_id")}
        )
        assert (last.state, last.exit_code) == ("completed", 3)  # ran to its end, with its code
        assert all(p[0]["params"]["state"] == "running" for p in connection.pushes[:-1])  # the end comes last
        assert {(p[0]["params"]["call"], p[0]["params"]["job_id"]) for p in connection.pushes} == {(7, "mine")}
    stdout_reads = reads[id(job.streams[1])]
    one_follower = max(len(c.pushes) for c in followers)
    # Twenty followers alone would read at least 20 times per push; shared, about once (a
    # follower that wakes after the next write reads for itself now and then).
    assert stdout_reads <= 3 * one_follower, (stdout_reads, one_follower)


async def test_a_follow_ends_after_its_budget_and_after_a_quiet_wait(tmp_path: Path) -> None:
    jobs = jobs_in(tmp_path)
    try:
        await jobs.start(
            StartParams(command=["sh", "-c", "head -c 300000 /dev/zero; read _"], job_id="mine", stdin_open=True)
        )
        job = await jobs.held("mine")
        first = Connection()
        result = await job.follow(FollowParams(job_id="mine", max_bytes=65536, budget=65536, wait=5), first.send, HEAD)
        taken = len(first.output())
        assert not result.ended and 65536 <= taken < 2 * 65536  # ended by its budget (passed by < a chunk)
        rest = Connection()
        params = FollowParams(job_id="mine", stdout_offset=taken, max_bytes=65536, budget=1 << 20, wait=0.2)
        result = await job.follow(params, rest.send, HEAD)
        assert not result.ended and len(rest.output()) == 300000 - taken  # then quiet: the wait
        job.send_signal(signal.SIGKILL)
        await job.ended()  # reaped, its pipes closed: nothing left running after the test
    finally:
        await jobs.aclose()


def test_a_follow_over_http_is_refused(agent_sock: Path) -> None:
    job = rpc(agent_sock, "exec_remote_start", {"command": ["true"]})["result"]["job_id"]
    err = rpc(agent_sock, "exec_remote_follow", {"job_id": job})["error"]
    assert err["code"] == -32600 and "frame stream" in err["message"]


async def test_a_connection_is_read_while_its_pushes_stream(agent_sock: Path) -> None:
    """A request sent on a connection whose follow pushes back to back is read and answered
    long before that follow ends: pushing never stops the agent reading the connection.

    (``loop.sendfile`` pauses reading for each span it sends and nothing yielded between two:
    a follow request behind a burst of pushes went unanswered for 11 s in a CI fault suite.)
    """
    size = 96 << 20
    started = rpc(agent_sock, "exec_remote_start", {"command": ["head", "-c", str(size), "/dev/zero"]})
    job_id = started["result"]["job_id"]
    offsets, state = [0, 0], "running"
    while state == "running":  # long polls until it has written it all: the pushes never wait for it
        params = {"job_id": job_id, "stdout_offset": offsets[0], "stderr_offset": offsets[1]}
        status, raw = post(agent_sock, _request("exec_remote_poll", {**params, "binary": True, "max_bytes": 64 << 20}))
        assert status == 200
        result = json.loads(frames.split(raw).message)["result"]
        offsets, state = [result["stdout_offset"], result["stderr_offset"]], result["state"]
    assert offsets[0] == size
    reader, writer = await asyncio.open_unix_connection(os.fspath(agent_sock.parent / "agent.stream"), limit=4 << 20)
    follow = {"job_id": job_id, "max_bytes": 1 << 20, "budget": size, "wait": 5}
    writer.write(_request("exec_remote_follow", follow, id_=1) + b"\n")
    pushed = asked_at = 0
    try:
        while True:
            frame = await frames.read_frame(reader, 4 << 20)
            assert frame is not None, "the agent closed the connection"
            message = json.loads(frame.message)
            if message.get("id") == 2:
                break
            assert message.get("id") != 1, f"the follow ended ({pushed} bytes pushed) before server_info was answered"
            pushed += len(frame.payload or b"")
            if not asked_at:
                writer.write(_request("server_info", {}, id_=2) + b"\n")
                asked_at = pushed
    finally:
        writer.close()
        await writer.wait_closed()
    assert "result" in message
    # Answered while the follow still had nearly all of its 96 MiB to push: a few pushes and
    # what the socket buffers hold went ahead of it (4 MiB each way), not the whole budget.
    assert pushed - asked_at < 24 << 20, f"{pushed - asked_at} bytes were pushed before server_info was answered"


def _request(method: str, params: dict[str, Any], id_: int = 1) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": id_, "method": method, "params": params}).encode()
