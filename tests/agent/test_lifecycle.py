"""The agent's own lifecycle: idle exit, one server per state dir, clean shutdown."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import remote_exec as rx
from remote_exec.agent import cli as agent_cli
from remote_exec.agent import relay, upgrade
from remote_exec.agent.jobs.proctable import group_members

from ..conftest import job_dir, wait_exit


def test_idle_agent_exits_but_not_while_a_job_runs(fresh_agent_dir: Path) -> None:
    url = f"local://?dir={fresh_agent_dir}&idle_timeout=1"
    with rx.connect(url) as sb:
        proc = sb.exec_remote(["sleep", "3"])
        assert proc.pid  # started
        # Asked now, not at the connect: an agent idle for 1 s before the job started has exited
        # by design (a loaded machine), and the job is the next one's.
        pid = sb.server_info().pid
        proc.detach()
    assert wait_exit(pid, 30)
    # Its own record: the job ran to its end, not cut short by the agent's exit.
    end = json.loads((job_dir(fresh_agent_dir, proc.job_id or "") / "job.json").read_text())["end"]
    assert (end["state"], end["exit_code"]) == ("completed", 0)
    assert not (fresh_agent_dir / "agent.sock").exists()


def test_concurrent_starts_make_one_server(fresh_agent_dir: Path) -> None:
    argv = [sys.executable, "-m", "remote_exec.agent", "ensure", "--dir", str(fresh_agent_dir)]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE) for _ in range(4)]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    pids = {json.loads(o)["result"]["pid"] for o in outs}
    assert len(pids) == 1


def test_sigterm_kills_running_jobs(fresh_agent_dir: Path) -> None:
    with rx.connect(f"local://?dir={fresh_agent_dir}") as sb:
        pid = sb.info.pid
        proc = sb.exec_remote(["sh", "-c", "sleep 300 & wait"])
        job_pid = proc.pid or 0
        proc.detach()
        assert group_members(job_pid)
        os.kill(pid, signal.SIGTERM)
        assert wait_exit(pid, 20)
    assert group_members(job_pid) == []


def test_aiohttp_is_loaded_only_once_the_http_socket_is_used(fresh_agent_dir: Path) -> None:
    """aiohttp (the HTTP socket's server) was a third of an agent's start-up CPU, and most
    agents are only reached through the frame stream: it is loaded at the first HTTP client,
    whose request is then answered as before (it waited in the socket's backlog). Each later
    ``ensure`` and channel start asks the running agent's version over the frame stream (over
    HTTP, the first of them made every agent load aiohttp after all)."""
    base = [sys.executable, "-m", "remote_exec.agent"]
    ensured = subprocess.run([*base, "ensure", "--dir", str(fresh_agent_dir)], capture_output=True, timeout=60)
    pid = json.loads(ensured.stdout)["result"]["pid"]
    maps = Path(f"/proc/{pid}/maps")
    try:
        again = subprocess.run([*base, "ensure", "--dir", str(fresh_agent_dir)], capture_output=True, timeout=60)
        assert json.loads(again.stdout)["result"]["pid"] == pid  # the running one, its version asked
        assert "/aiohttp/" not in maps.read_text()  # its compiled parser is not mapped
        # Probes (connect, close) leave no connection open in the agent (they did: one fd each).
        fds = Path(f"/proc/{pid}/fd")
        before = len(list(fds.iterdir()))
        for _ in range(20):
            with socket.socket(socket.AF_UNIX) as probe:
                probe.connect(str(fresh_agent_dir / "agent.sock"))
        deadline = time.monotonic() + 30
        while len(list(fds.iterdir())) > before and time.monotonic() < deadline:
            time.sleep(0.05)  # (the poll interval of a bounded wait for the agent's closes)
        assert len(list(fds.iterdir())) <= before
        request = b'{"jsonrpc":"2.0","id":1,"method":"server_info","params":{}}'
        called = subprocess.run(
            [*base, "call", "--dir", str(fresh_agent_dir)], input=request, capture_output=True, timeout=60
        )
        assert json.loads(called.stdout)["result"]["pid"] == pid, called
        assert "/aiohttp/_http_parser" in maps.read_text()
    finally:
        os.kill(pid, signal.SIGTERM)
    assert wait_exit(pid, 20)
    assert not (fresh_agent_dir / "agent.sock").exists()


def test_ensure_asks_a_running_agent_once(
    fresh_agent_dir: Path, monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    """``ensure`` on a running agent of its version prints the ``server_info`` it asked to decide
    on a handover; it asked a second time for the same answer (every ``local://`` open, every
    relay's start)."""
    argv = [sys.executable, "-m", "remote_exec.agent", "ensure", "--dir", str(fresh_agent_dir)]
    started = json.loads(subprocess.run(argv, capture_output=True, timeout=60, check=True).stdout)["result"]
    asked: list[bytes] = []
    real = relay.frame_request

    def counted(sock: Path, request: bytes, timeout: float = 10.0) -> bytes:
        asked.append(request)
        return real(sock, request, timeout)

    monkeypatch.setattr(relay, "frame_request", counted)
    monkeypatch.setattr(upgrade, "frame_request", counted)
    assert agent_cli.main(["ensure", "--dir", str(fresh_agent_dir)]) == 0
    answer = json.loads(capsysbinary.readouterr().out)["result"]
    assert answer["pid"] == started["pid"] and answer["version"] == started["version"]
    assert len(asked) == 1, asked
