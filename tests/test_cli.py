"""The `remote-exec` and `remote-exec-agent` command lines, as a user runs them."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from remote_exec.agent.jobs.proctable import group_members

from .conftest import run_cli


def test_run_streams_separately_and_exits_with_code(agent_dir: Path) -> None:
    r = run_cli("--sandbox", f"local://?dir={agent_dir}", "run", "--", "sh", "-c", "echo out; echo err >&2; exit 3")
    assert (r.returncode, r.stdout, r.stderr) == (3, "out\n", "err\n")


def test_run_env_cwd_timeout(agent_dir: Path) -> None:
    sb = f"local://?dir={agent_dir}"
    r = run_cli("-s", sb, "run", "--cwd", "/tmp", "-e", "A=1", "--", "sh", "-c", "pwd; echo $A")
    assert (r.returncode, r.stdout) == (0, "/tmp\n1\n")
    r = run_cli("-s", sb, "run", "--timeout", "0.3", "--kill-grace", "0.1", "--", "sh", "-c", "echo x; sleep 30")
    assert r.returncode == 124 and r.stdout == "x\n" and "timed out" in r.stderr


def test_detach_ps_attach_kill(agent_dir: Path) -> None:
    sb = f"local://?dir={agent_dir}"
    r = run_cli("-s", sb, "run", "--detach", "--label", "cli-test", "--", "sh", "-c", "echo hello; sleep 300")
    job_id = r.stdout.strip()
    assert r.returncode == 0 and job_id
    ps = run_cli("-s", sb, "ps")
    row = next(line for line in ps.stdout.splitlines() if line.startswith(job_id))
    assert "running" in row and "[cli-test]" in row
    pid = int(row.split()[1])
    argv = [sys.executable, "-m", "remote_exec.cli", "-s", sb, "attach", job_id]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as attach:
        assert attach.stdout is not None
        assert attach.stdout.readline() == "hello\n"  # replayed from the start
        assert run_cli("-s", sb, "kill", job_id, "--grace", "0.2").returncode == 0
        assert attach.wait(timeout=30) == 128 + 15  # the follower sees the SIGTERM death
    assert group_members(pid) == []


def test_ctrl_c_kills_the_remote_job(agent_dir: Path) -> None:
    sb = f"local://?dir={agent_dir}"
    argv = [sys.executable, "-m", "remote_exec.cli", "-s", sb, "run", "--label", "ctrl-c", "--", "sh", "-c",
            "echo started; exec sleep 300"]  # fmt: skip
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as cli:
        assert cli.stdout is not None and cli.stdout.readline() == "started\n"
        ps = run_cli("-s", sb, "ps").stdout.splitlines()
        pid = int(next(line for line in reversed(ps) if "[ctrl-c]" in line and "running" in line).split()[1])
        cli.send_signal(signal.SIGINT)
        assert cli.wait(timeout=30) == 130
    assert group_members(pid) == []


def test_usage_errors() -> None:
    r = run_cli("run")
    assert r.returncode != 0 and "no command" in r.stderr
    r = run_cli("-s", "nope://x", "ps")
    assert r.returncode == 2 and "unsupported sandbox URL" in r.stderr
    r = run_cli("--liveness", "-1", "ps")
    assert r.returncode != 0 and r.stderr == "remote-exec: --liveness takes 0 (off) or seconds >= 0.5, not -1\n"
    for bad in ("nan", "inf", "0.001"):  # a heartbeat that spins, never waits, or loses a healthy agent
        r = run_cli("--liveness", bad, "ps")
        assert r.returncode != 0 and r.stderr.startswith("remote-exec: --liveness takes 0 (off)"), bad


def test_agent_call_and_stdio(agent_dir: Path) -> None:
    agent = [sys.executable, "-m", "remote_exec.agent"]
    call = subprocess.run(
        [*agent, "call", "--dir", str(agent_dir)],
        input=b'{"jsonrpc":"2.0","id":7,"method":"server_info","params":{}}', capture_output=True, timeout=60,
    )  # fmt: skip
    assert call.returncode == 0 and json.loads(call.stdout)["id"] == 7
    lines = b"".join(
        [
            b'{"jsonrpc":"2.0","id":1,"method":"exec_remote_start","params":{"command":["echo","x"]}}\n',
            b"not json\n",
            b'{"jsonrpc":"2.0","id":2,"method":"server_info"}\n',
        ]
    )
    stdio = subprocess.run([*agent, "stdio", "--dir", str(agent_dir)], input=lines, capture_output=True, timeout=60)
    answers = [json.loads(line) for line in stdio.stdout.splitlines()]
    assert stdio.returncode == 0 and len(answers) == 3
    by_id = {a["id"]: a for a in answers}
    assert "job_id" in by_id[1]["result"] and "pid" in by_id[2]["result"]
    assert by_id[None]["error"]["code"] == -32700
