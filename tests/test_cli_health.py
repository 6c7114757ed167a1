"""Health on the command line: ``attach`` tells a quiet job and a frozen agent apart on stderr
(a real SIGSTOP of the agent), rides the freeze out and loses no byte; ``top`` shows the link
and how long each job has been quiet."""

from __future__ import annotations

import asyncio
import io
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import anyio
import pytest

import remote_exec as rx
from remote_exec.cli.health import format_quiet, report_health
from remote_exec.client.link import Link

from .conftest import run_cli


def lines_of(stream: object) -> queue.Queue[str]:
    """The lines of a pipe, read in a thread (so a test can wait on them with a deadline); an
    empty string at its end."""
    q: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in stream:  # type: ignore[attr-defined]
            q.put(line)
        q.put("")

    threading.Thread(target=pump, daemon=True).start()
    return q


def expect(q: queue.Queue[str], needle: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        line = q.get(timeout=max(0.01, deadline - time.monotonic()))
        assert line, f"the stream ended before {needle!r}"
        if needle in line:
            return line


def rest(q: queue.Queue[str], timeout: float = 30) -> str:
    got = ""
    while line := q.get(timeout=timeout):
        got += line
    return got


def test_attach_tells_quiet_from_frozen_and_rides_the_freeze_out(fresh_agent_dir: Path, tmp_path: Path) -> None:
    url = f"local://?dir={fresh_agent_dir}"
    gate = tmp_path / "gate"
    script = f"echo first; while [ ! -e {gate} ]; do sleep 0.05; done; seq 1 3000"
    with rx.connect(url) as sb:
        job = sb.exec_remote(["bash", "-c", script])
        job.stats(window=0.1)  # it started
        job.detach()
        agent = sb.info.pid
    # A 3 s liveness bound, not the default 8: the rule is tested, not the number.
    attach_job = ["attach", job.job_id or "", "--quiet-after", "2"]
    argv = [sys.executable, "-m", "remote_exec.cli", "-s", url, "--liveness", "3", *attach_job]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as attach:
        try:
            out, err = lines_of(attach.stdout), lines_of(attach.stderr)
            assert expect(out, "first", 30) == "first\n"
            quiet = expect(err, "no output for", 30)
            assert quiet.startswith("remote-exec: no output for 2 s; the job is running"), quiet
            os.kill(agent, signal.SIGSTOP)
            t0 = time.monotonic()
            try:
                # The link's own line (a silence notice may say "agent not answering" first).
                lost = expect(err, "heartbeat", 60)
                print(f"\nattach: told of the freeze {time.monotonic() - t0:.2f} s after SIGSTOP: {lost.strip()}")
                assert "agent not answering" in lost and url.split("?")[0] in lost
                assert attach.poll() is None  # still following: a freeze is not an end
            finally:
                os.kill(agent, signal.SIGCONT)
            expect(err, ": connected", 60)
            gate.touch()
            assert rest(out) == "".join(f"{i}\n" for i in range(1, 3001))  # nothing lost, nothing twice
            assert attach.wait(timeout=60) == 0
        finally:
            if attach.poll() is None:  # a failure above: Popen's exit would wait for it for good
                attach.kill()


def test_top_shows_the_link_and_quiet_jobs(agent_dir: Path) -> None:
    url = f"local://?dir={agent_dir}"
    with rx.connect(url) as sb:
        job = sb.exec_remote(["sh", "-c", "sleep 300"])  # never writes: quiet since its start
        job.stats(window=0.1)  # it started
        top = run_cli("-s", url, "top", "-n", "1")
        assert top.returncode == 0, top.stderr
        first, header, *rows = top.stdout.splitlines()
        assert first.startswith("sandbox (") and first.endswith("link connected")
        assert "QUIET" in header
        row = next(r for r in rows if r.startswith(job.job_id or "?"))
        assert row.split()[8].endswith("s")  # seconds since its start, exact (no ">")
        job.kill()


def test_ps_shows_how_long_a_running_job_is_quiet(agent_dir: Path, tmp_path: Path) -> None:
    url = f"local://?dir={agent_dir}"
    gate = tmp_path / "gate"
    with rx.connect(url) as sb:
        # It writes once, then nothing: its silence counts from that write, not from its start
        # nor from `ps`'s look (a one-shot listing sees no count change).
        job = sb.exec_remote(["sh", "-c", f"echo once; while [ ! -e {gate} ]; do sleep 0.05; done"])
        wrote = time.time()
        deadline = time.monotonic() + 60
        while True:  # the agent's listing carries the write's time (its log file's mtime)
            info = next(j for j in sb.jobs() if j.job_id == job.job_id)
            if info.stdout_bytes:
                break
            assert time.monotonic() < deadline
        assert info.last_output_at is not None
        assert info.started_at - 1 <= info.last_output_at <= wrote + 1
        ps = run_cli("-s", url, "ps")
        assert ps.returncode == 0, ps.stderr
        header, *rows = ps.stdout.splitlines()
        col = slice(header.index(" QUIET"), header.index(" QUIET") + 6)  # right-aligned, 6 wide
        row = next(r for r in rows if r.startswith(job.job_id or "?"))
        quiet = row[col].strip()
        assert quiet.endswith("s") and not quiet.startswith(">"), row  # exact: the agent's time
        assert 0 <= int(quiet[:-1]) <= time.time() - info.last_output_at + 1
        gate.touch()
        job.wait()
        ps = run_cli("-s", url, "ps", "-a")  # an ended job is listed with -a
        ended = next(r for r in ps.stdout.splitlines() if r.startswith(job.job_id or "?"))
        assert ended[col].strip() == "", ended  # an ended job is not "quiet"


def test_format_quiet() -> None:
    assert format_quiet(5) == "no output for 5 s"
    assert format_quiet(303) == "no output for 5 min 03 s"
    assert format_quiet(7500) == "no output for 2 h 05 min"


class _Told(io.StringIO):
    """What report_health prints, with an event per line (a test waits on it, not on time)."""

    def __init__(self) -> None:
        super().__init__()
        self.wrote = asyncio.Event()

    def write(self, s: str) -> int:
        self.wrote.set()
        return super().write(s)


async def _told(out: _Told, lines: int) -> list[str]:
    with anyio.fail_after(30):
        while len(out.getvalue().splitlines()) < lines:
            out.wrote.clear()
            await out.wrote.wait()
    return out.getvalue().splitlines()


@pytest.mark.anyio
async def test_every_link_change_is_told_in_order() -> None:
    """Two changes in a row (the agent froze, then answered again) are two lines: a change made
    while the reporter was busy printing was lost for good (a freeze attach never told)."""
    link, out = Link(), _Told()
    reporter = asyncio.create_task(report_health("local://x", link, time.monotonic, quiet_after=0, out=out))
    try:
        await asyncio.sleep(0)  # one step: the reporter is waiting (no time waited)
        link.set("lost", "the agent answered nothing, not even a heartbeat")
        link.set("connected")
        assert await _told(out, 2) == [
            "remote-exec: local://x: agent not answering (frozen, paused or cut off); still trying: "
            "the agent answered nothing, not even a heartbeat",
            "remote-exec: local://x: connected",
        ]
    finally:
        reporter.cancel()
