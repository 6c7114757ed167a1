"""Pushes sent from the logs (``sendfile``): a range being sent is never punched out by the cap,
and a log the job truncated meanwhile still yields a whole frame."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest

from remote_exec.agent.filespan import FileSpan, send_span
from remote_exec.agent.jobs.logfile import LogFile

pytestmark = pytest.mark.anyio


def test_a_pinned_range_outlives_the_cap(tmp_path: Path) -> None:
    path = tmp_path / "stdout"
    path.write_bytes(os.urandom(64 * 1024))
    log = LogFile(os.fspath(path), cap=8192)
    assert log.pin(4096)  # a push of [4096, ...) is on its way
    log.enforce_cap()
    assert log.base == 4096  # punched up to the pin, not to the cap's 57344
    log.unpin(4096)
    log.enforce_cap()
    assert log.base == 64 * 1024 - 8192
    assert not log.pin(4096)  # punched out now: no span of it can be sent


async def _received(span: FileSpan) -> bytes:
    """What a peer reads of ``span`` sent over a socket (read as it is sent: a socket holds little)."""
    ours, theirs = socket.socketpair()
    _, writer = await asyncio.open_connection(sock=ours)
    reader, their_writer = await asyncio.open_connection(sock=theirs)

    async def send() -> None:
        await send_span(writer, span)
        writer.write_eof()

    try:
        _, got = await asyncio.gather(send(), reader.read())
    finally:
        for w in (writer, their_writer):
            w.close()
            await w.wait_closed()
    return got


async def test_a_span_comes_whole_from_the_page_cache_or_as_zeros_where_the_file_ended(tmp_path: Path) -> None:
    path = tmp_path / "stdout"
    data = os.urandom(3 * 1024 * 1024 + 5)
    path.write_bytes(data)
    assert await _received(FileSpan(os.fspath(path), 100, len(data) - 100)) == data[100:]
    with path.open("r+b") as f:
        f.truncate(1000)  # the job truncated its log while the push was on its way
    assert await _received(FileSpan(os.fspath(path), 500, 2000)) == data[500:1000] + bytes(1500)
    path.unlink()
    path.symlink_to("/etc/passwd")  # or put something else there: never followed, never read
    assert await _received(FileSpan(os.fspath(path), 0, 10)) == bytes(10)
