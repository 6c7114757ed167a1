"""Point 10: no file the sandbox controls can block the agent.

A FIFO opened for reading without ``O_NONBLOCK`` waits for a writer forever, holding a worker
thread; six such reads filled the default pool, so ``stat`` hung, a timed-out job was never
SIGKILLed (its process-table scan queued behind them) and SIGTERM could not stop the agent
(``asyncio.run`` waits for the pool). Now every open for reading goes through ``O_PATH`` first
and refuses FIFOs, sockets and devices; a write never replaces one; kills scan the process
table in threads of their own; the agent exits without waiting for stuck worker threads.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import remote_exec as rx
from remote_exec.protocol import FileReadParams, FileReadResult, Method, PollParams, PollResult, StartParams

from ..agent.homes import jobs_in
from ..conftest import wait_exit
from .agentproc import agent
from .conftest import Adversary

pytestmark = pytest.mark.anyio

# Generous (a loaded machine), yet far short of what a refusal that fails looks like: a blocked
# open never answers at all, and the jobs killed here sleep 60 s.
DEADLINE = 30.0


@pytest.fixture
def specials(tmp_path: Path) -> Iterator[dict[str, Path]]:
    """A FIFO, a listening Unix socket and the usual devices, in a workspace with a plain file."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "plain.txt").write_bytes(b"plain\n")
    os.mkfifo(ws / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(ws / "sock"))
    sock.listen()
    try:
        yield {"fifo": ws / "fifo", "socket": ws / "sock", "zero": Path("/dev/zero"), "null": Path("/dev/null")}
    finally:
        sock.close()


KIND = {"fifo": "FIFO", "socket": "socket", "zero": "character device", "null": "character device"}


async def test_reads_of_fifos_sockets_and_devices_are_refused_at_once(
    tmp_path: Path, specials: dict[str, Path], adversary: Adversary
) -> None:
    local = tmp_path / "local"
    local.mkdir()
    with agent(tmp_path / "state") as pid:
        async with rx.open_sandbox(f"local://?dir={tmp_path / 'state'}") as sb:
            for name, path in specials.items():
                for how in ("read_file", "read_file_to"):
                    async with asyncio.timeout(DEADLINE):
                        with pytest.raises(rx.FileError) as err:
                            if how == "read_file":
                                await sb.read_file(str(path), text=False)
                            else:
                                await sb.read_file_to(str(path), local / name)
                    refused = f"not a regular file: {path} is a {KIND[name]}" in err.value.message
                    adversary.tried("special files", f"{how} of a {KIND[name]} ({name})", refused=refused)
                    assert refused, err.value.message
                    assert err.value.data["file_type"] == KIND[name]
                async with asyncio.timeout(DEADLINE):
                    assert (await sb.stat(str(path))).type == "other"  # stat never opens it
                    assert await sb._files().hashes([str(path)], [0]) == [None]
            assert not any(local.iterdir())  # nothing half-written locally either
            adversary.agent_peak(pid)


async def test_a_tree_download_skips_a_fifo(tmp_path: Path, specials: dict[str, Path], adversary: Adversary) -> None:
    with agent(tmp_path / "state"):
        async with rx.open_sandbox(f"local://?dir={tmp_path / 'state'}") as sb:
            async with asyncio.timeout(DEADLINE * 2):
                await sb.download(str(specials["fifo"].parent), tmp_path / "copy")
    assert (tmp_path / "copy" / "plain.txt").read_bytes() == b"plain\n"
    assert not (tmp_path / "copy" / "fifo").exists()
    adversary.tried("special files", "download of a tree holding a FIFO and a socket", refused=True)


async def test_a_write_never_replaces_a_fifo_or_device(
    tmp_path: Path, specials: dict[str, Path], adversary: Adversary
) -> None:
    with agent(tmp_path / "state"):
        async with rx.open_sandbox(f"local://?dir={tmp_path / 'state'}") as sb:
            for name in ("fifo", "socket"):
                path = specials[name]
                for size in (10, 3 * 1024 * 1024):  # one request, and a write session
                    async with asyncio.timeout(DEADLINE):
                        with pytest.raises(rx.FileError) as err:
                            await sb.write_file(str(path), b"x" * size)
                    refused = f"is a {KIND[name]}" in err.value.message and not path.is_file()
                    adversary.tried("special files", f"write_file of {size} bytes over a {KIND[name]}", refused=refused)
                    assert refused, err.value.message
            assert sorted(p.name for p in specials["fifo"].parent.iterdir()) == ["fifo", "plain.txt", "sock"]


async def test_fifo_reads_in_flight_do_not_stop_timeouts_stat_or_sigterm(
    tmp_path: Path, specials: dict[str, Path], adversary: Adversary
) -> None:
    state = tmp_path / "state"
    with agent(state) as pid:
        async with rx.open_sandbox(f"local://?dir={state}") as sb:
            rpc = sb._core.rpc
            params = FileReadParams(path=str(specials["fifo"]))
            reads = [asyncio.ensure_future(rpc.call(Method.FILE_READ, params, FileReadResult)) for _ in range(10)]
            try:
                # A job that ignores SIGTERM and outlives its timeout: only SIGKILL ends it.
                job = await sb.exec_remote("trap '' TERM; echo up; sleep 60", timeout=0.5, kill_grace=0.5).started()
                async with asyncio.timeout(DEADLINE):
                    info = await sb.stat(str(specials["fifo"].parent / "plain.txt"))
                assert info.size == 6
                async with asyncio.timeout(DEADLINE):
                    while True:
                        polled = await rpc.call(
                            Method.EXEC_REMOTE_POLL, PollParams(job_id=job.job_id or "", wait=1.0), PollResult
                        )
                        if polled.state != "running":
                            break
                killed = polled.state == "timed_out"  # within the timeout above (the job sleeps 60 s)
                adversary.tried("special files", "timed-out job SIGKILLed with 10 FIFO reads in flight", refused=killed)
                assert killed, polled
            finally:
                for r in reads:
                    r.cancel()
                await asyncio.gather(*reads, return_exceptions=True)
        os.kill(pid, signal.SIGTERM)
        stopped = wait_exit(pid, DEADLINE)
        adversary.tried("special files", "SIGTERM stops the agent after 10 FIFO reads", refused=stopped)
        assert stopped


async def test_kills_do_not_wait_for_a_stuck_worker_pool(adversary: Adversary, tmp_path: Path) -> None:
    """The default pool full of stuck threads (a hung mount, say): a timeout still SIGKILLs."""
    loop = asyncio.get_running_loop()
    release = threading.Event()
    stuck = [loop.run_in_executor(None, release.wait) for _ in range(64)]
    jobs = jobs_in(tmp_path)
    try:
        started = await jobs.start(StartParams(command="trap '' TERM; sleep 60", timeout=0.3, kill_grace=0.3))
        job = jobs._get(started.job_id)
        async with asyncio.timeout(DEADLINE):
            while job.running:
                await job.poll(PollParams(job_id=started.job_id, wait=1.0))
        killed = job.state == "timed_out"  # within the timeout above (the job sleeps 60 s)
        adversary.tried("special files", "timed-out job SIGKILLed with the worker pool stuck", refused=killed)
        assert killed
    finally:
        await jobs.aclose()
        release.set()
        await asyncio.gather(*stuck)


STUCK_AGENT = """
import asyncio, sys, threading
from remote_exec.agent import cli, server
real = server.build_app
def build_app(config):
    app = real(config)
    # Stand-ins for file operations stuck in worker threads for good (a hung mount).
    for _ in range(8):
        asyncio.get_running_loop().run_in_executor(None, threading.Event().wait)
    return app
server.build_app = build_app
sys.exit(cli.main(sys.argv[1:]))
"""


def test_sigterm_stops_an_agent_whose_worker_threads_are_stuck(tmp_path: Path, adversary: Adversary) -> None:
    read_fd, write_fd = os.pipe()
    argv = [sys.executable, "-c", STUCK_AGENT, "serve", "--dir", str(tmp_path / "state"), "--ready-fd", str(write_fd)]
    proc = subprocess.Popen(argv, pass_fds=(write_fd,), stderr=subprocess.DEVNULL)
    os.close(write_fd)
    try:
        with os.fdopen(read_fd, "rb") as ready:
            assert ready.readline() == b"ready\n"
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(DEADLINE)
            stopped = True
        except subprocess.TimeoutExpired:
            stopped = False
        adversary.tried("special files", "SIGTERM with worker threads stuck for good", refused=stopped)
        assert stopped
    finally:
        proc.kill()
        proc.wait()
