"""``remote-exec logs`` and ``remote-exec prune`` (#14) against a real agent."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import remote_exec as rx

from .conftest import run_cli

SEQ = "".join(f"{i}\n" for i in range(1, 20001))


def test_logs_whole_tail_stderr_and_binary_bytes_raw(fresh_agent_dir: Path) -> None:
    sb = f"local://?dir={fresh_agent_dir}"
    script = "seq 1 20000; printf '\\033]0;title\\007\\377' >&2"
    r = run_cli("-s", sb, "run", "--detach", "--", "sh", "-c", script)
    job_id = r.stdout.strip()
    # The job ends by itself; `logs --follow` returns once it has and its log is read to the end.
    follow = run_cli("-s", sb, "logs", "--follow", job_id)
    assert follow.returncode == 0 and follow.stdout == SEQ and "completed, exit 0" in follow.stderr
    assert run_cli("-s", sb, "logs", job_id).stdout == SEQ
    assert run_cli("-s", sb, "logs", "-n", "3", job_id).stdout == "19998\n19999\n20000\n"  # lines, not bytes
    err = subprocess.run(
        [sys.executable, "-m", "remote_exec.cli", "-s", sb, "logs", "--stderr", job_id], capture_output=True, timeout=60
    )
    assert err.stdout == b"\033]0;title\007\377"  # the job's bytes, raw, as cat would show them
    missing = run_cli("-s", sb, "logs", job_id.rsplit("-", 1)[0] + "-99999")
    assert missing.returncode == 2 and "JobNotFoundError" in missing.stderr


def test_logs_follow_prints_live_output_then_the_end(fresh_agent_dir: Path) -> None:
    sb = f"local://?dir={fresh_agent_dir}"
    job_id = run_cli("-s", sb, "run", "--detach", "--", "sh", "-c", "echo first; exec sleep 300").stdout.strip()
    argv = [sys.executable, "-m", "remote_exec.cli", "-s", sb, "logs", "-f", job_id]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as logs:
        assert logs.stdout is not None and logs.stdout.readline() == "first\n"
        assert run_cli("-s", sb, "kill", job_id, "--grace", "0").returncode == 0
        out, err = logs.communicate(timeout=30)
    assert logs.returncode == 0 and out == "" and "killed" in err


def test_prune_by_count_and_by_name(fresh_agent_dir: Path) -> None:
    sb = f"local://?dir={fresh_agent_dir}"
    # Three ended jobs, in this order: what prune acts on (run -d and logs -f are tested above
    # and in test_cli_habits; started here in one client, not six CLI processes).
    with rx.connect(sb) as client:
        ids = []
        for _ in range(3):
            job = client.exec_remote(["true"])
            assert job.wait().returncode == 0
            ids.append(job.job_id or "")
    assert run_cli("-s", sb, "prune", ids[0]).stdout.split() == [ids[0]]
    assert run_cli("-s", sb, "prune", "--keep", "1").stdout.split() == [ids[1]]
    listed = run_cli("-s", sb, "ps", "-a").stdout
    assert ids[0] not in listed and ids[1] not in listed and ids[2] in listed
    usage = run_cli("-s", sb, "prune")
    assert usage.returncode != 0 and "--older-than" in usage.stderr
