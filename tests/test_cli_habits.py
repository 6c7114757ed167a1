"""``remote-exec`` keeps the habits of docker, kubectl and ssh (#25), driven as a user drives it:
through a real pseudo-terminal (pexpect) where a terminal matters, against a real agent."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import termios
import time
from pathlib import Path

import pexpect

import remote_exec as rx
from remote_exec.agent.jobs.proctable import group_members

from .conftest import run_cli, wait_for

TIMEOUT = 60  # generous: the machine is shared; an event that comes costs nothing


def cli(agent_dir: Path, *args: str, rows: int = 30, cols: int = 100) -> pexpect.spawn[bytes]:
    argv = ["-m", "remote_exec.cli", "-s", f"local://?dir={agent_dir}", *args]
    return pexpect.spawn(sys.executable, argv, dimensions=(rows, cols), timeout=TIMEOUT)


def ended(child: pexpect.spawn[bytes]) -> int:
    """Wait for the child's end; its exit status."""
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus is not None
    return child.exitstatus


def started(agent_dir: Path, *command: str, name: str | None = None, label: str | None = None) -> str:
    """The id of a job started as ``remote-exec run -d [--name NAME] [--label LABEL] -- COMMAND``
    starts one, from this process: the set-up of a test of another command (``run -d`` itself
    is tested in test_cli.py and test_cli_logs.py), without a cold CLI process for it."""
    with rx.connect(f"local://?dir={agent_dir}") as sb:
        job_id = sb.exec_remote(list(command), label=label, tags={"name": name} if name else None).detach()
    assert job_id
    return job_id


def killed(agent_dir: Path, *job_ids: str) -> None:
    """``remote-exec kill JOB --grace 0`` for each job, from this process (set-up or clean-up)."""
    with rx.connect(f"local://?dir={agent_dir}") as sb:
        for job_id in job_ids:
            sb.attach(job_id).kill(0)


def jobs(agent_dir: Path, *args: str) -> list[dict[str, object]]:
    r = run_cli("-s", f"local://?dir={agent_dir}", "ps", "--format", "json", *args)
    assert r.returncode == 0, r.stderr
    found: list[dict[str, object]] = json.loads(r.stdout)
    return found


def test_ctrl_c_on_run_sends_sigint_and_the_trap_runs(fresh_agent_dir: Path) -> None:
    script = "trap 'echo cleanup; exit 130' INT; echo ready; while :; do sleep 1; done"
    child = cli(fresh_agent_dir, "run", "--", "sh", "-c", script)
    child.expect_exact("ready")
    child.sendintr()
    child.expect_exact("sent SIGINT to job")
    child.expect_exact("cleanup")
    assert ended(child) == 130
    (job,) = jobs(fresh_agent_dir, "-a")
    assert (job["state"], job["exit_code"]) == ("completed", 130)  # it ended by itself, not killed


def test_second_ctrl_c_kills_at_once(fresh_agent_dir: Path) -> None:
    script = "trap 'echo cleanup; sleep 300' INT; echo ready; while :; do sleep 1; done"
    child = cli(fresh_agent_dir, "run", "--kill-grace", "600", "--", "sh", "-c", script)
    child.expect_exact("ready")
    (job,) = jobs(fresh_agent_dir)
    child.sendintr()
    child.expect_exact("cleanup")  # the trap runs, and sleeps: only the second Ctrl-C ends it
    child.sendintr()
    child.expect_exact("killing job")
    assert ended(child) != 0
    assert jobs(fresh_agent_dir, "-a")[0]["state"] == "killed"
    assert group_members(int(str(job["pid"]))) == []


def test_ctrl_c_on_attach_detaches_and_the_job_goes_on(fresh_agent_dir: Path) -> None:
    sb = f"local://?dir={fresh_agent_dir}"
    job_id = started(fresh_agent_dir, "sh", "-c", "echo step1; exec sleep 300", name="train")
    child = cli(fresh_agent_dir, "attach", "train")
    child.expect_exact("step1")
    child.sendintr()
    child.expect_exact(f"detached; job {job_id} goes on")
    assert ended(child) == 130
    assert [j["state"] for j in jobs(fresh_agent_dir)] == ["running"]
    assert run_cli("-s", sb, "kill", job_id).returncode == 0


def test_ps_running_newest_first_all_filters_and_json(fresh_agent_dir: Path) -> None:
    sb = f"local://?dir={fresh_agent_dir}"
    done = run_cli("-s", sb, "run", "--label", "once", "--", "sh", "-c", "exit 3")
    assert done.returncode == 3
    older = started(fresh_agent_dir, "sleep", "300", name="a")
    newer = started(fresh_agent_dir, "sleep", "300", name="b", label="tr")
    rows = run_cli("-s", sb, "ps").stdout.splitlines()
    assert rows[0].startswith("JOB ID") and [r.split()[0] for r in rows[1:]] == [newer, older]
    every = [r.split()[0] for r in run_cli("-s", sb, "ps", "-a").stdout.splitlines()[1:]]
    assert every[:2] == [newer, older] and len(every) == 3
    assert [r.split()[0] for r in run_cli("-s", sb, "ps", "-n", "1").stdout.splitlines()[1:]] == [newer]
    assert [j["job_id"] for j in jobs(fresh_agent_dir, "--filter", "name=a")] == [older]
    assert [j["job_id"] for j in jobs(fresh_agent_dir, "--filter", "label=tr")] == [newer]
    (ended_job,) = jobs(fresh_agent_dir, "--filter", "state=completed")
    assert (ended_job["label"], ended_job["exit_code"]) == ("once", 3)
    bad = run_cli("-s", sb, "ps", "--filter", "colour=red")
    assert bad.returncode != 0 and "--filter" in bad.stderr
    killed(fresh_agent_dir, older, newer)


def test_ps_fits_a_100_column_terminal_one_line_per_job(fresh_agent_dir: Path) -> None:
    script = "set -e\necho " + "x" * 150 + "\nexec sleep 300"
    job_id = started(fresh_agent_dir, "sh", "-c", script)
    child = cli(fresh_agent_dir, "ps", cols=100)
    assert ended(child) == 0
    lines = (child.before or b"").decode().splitlines()
    assert len(lines) == 2 and all(len(line) <= 100 for line in lines)  # a header and one row, uncut: wrapped
    # the script's first meaningful line (not "set -e", not the lines after it), cut to the width
    assert lines[1].startswith(job_id) and " echo xxx" in lines[1] and lines[1].endswith("\u2026")
    assert "set -e" not in lines[1] and "\u23ce" not in lines[1]
    child = cli(fresh_agent_dir, "ps", "--no-trunc", cols=100)
    assert ended(child) == 0
    whole = (child.before or b"").decode().splitlines()
    assert len(whole) == 2 and whole[1].endswith("\u23ceexec sleep 300")
    killed(fresh_agent_dir, job_id)


def test_logs_tail_counts_lines_by_name(fresh_agent_dir: Path) -> None:
    sb = f"local://?dir={fresh_agent_dir}"
    r = run_cli("-s", sb, "run", "--name", "seq", "--", "sh", "-c", "seq 1 50000 | sed 's/$/ some padding/'")
    assert r.returncode == 0
    tail = run_cli("-s", sb, "logs", "-n", "3", "seq")
    assert tail.stdout == "".join(f"{i} some padding\n" for i in (49998, 49999, 50000))
    assert run_cli("-s", sb, "logs", "-n", "0", "seq").stdout == ""
    short = run_cli("-s", sb, "run", "--name", "short", "--", "printf", "a\\nb")  # no last newline
    assert short.returncode == 0
    assert run_cli("-s", sb, "logs", "-n", "1", "short").stdout == "b"
    assert run_cli("-s", sb, "logs", "-n", "5", "short").stdout == "a\nb"


def test_logs_since_a_time_and_follow_from_there(fresh_agent_dir: Path, tmp_path: Path) -> None:
    sb = f"local://?dir={fresh_agent_dir}"
    go = tmp_path / "go"
    script = f"echo early; while [ ! -e {go} ]; do sleep 0.05; done; echo late; while :; do sleep 1; done"
    started(fresh_agent_dir, "sh", "-c", script, name="phases")
    wait_for(lambda: run_cli("-s", sb, "logs", "phases").stdout == "early\n")  # read: the agent noted when
    since = time.time()
    go.touch()  # everything written from here on is written after `since`
    wait_for(lambda: run_cli("-s", sb, "logs", "phases").stdout == "early\nlate\n")
    assert run_cli("-s", sb, "logs", "--since", f"{since:.3f}", "phases").stdout == "late\n"
    assert run_cli("-s", sb, "logs", "--since", "1h", "phases").stdout == "early\nlate\n"
    bad = run_cli("-s", sb, "logs", "--since", "yesterday", "phases")
    assert bad.returncode != 0 and len(bad.stderr.splitlines()) == 1 and "--since" in bad.stderr
    # -f from the time on: what it had written since, then pushed output until its end
    argv = [sys.executable, "-m", "remote_exec.cli", "-s", sb, "logs", "-f", "--since", f"{since:.3f}", "phases"]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as follow:
        assert follow.stdout is not None and follow.stdout.readline() == "late\n"
        assert run_cli("-s", sb, "kill", "phases", "--grace", "0").returncode == 0
        out, err = follow.communicate(timeout=TIMEOUT)
    assert (follow.returncode, out) == (0, "") and "killed, exit -15" in err


def test_kill_wait_by_name_say_what_happened(fresh_agent_dir: Path) -> None:
    sb = f"local://?dir={fresh_agent_dir}"
    job_id = started(fresh_agent_dir, "sleep", "300", name="train")
    kill = run_cli("-s", sb, "kill", "train", "--grace", "0")
    assert (kill.returncode, kill.stdout) == (0, f"killed {job_id} (SIGTERM)\n")
    again = run_cli("-s", sb, "kill", job_id)
    assert (again.returncode, again.stdout) == (0, f"{job_id} had already ended (exit -15)\n")
    three = started(fresh_agent_dir, "sh", "-c", "exit 3", label="three")
    assert run_cli("-s", sb, "wait", "three").returncode == 3
    assert run_cli("-s", sb, "kill", "three").stdout == f"{three} had already ended (exit 3)\n"


def test_a_shared_name_is_ambiguous_and_lists_the_candidates(fresh_agent_dir: Path) -> None:
    sb = f"local://?dir={fresh_agent_dir}"
    ids = [started(fresh_agent_dir, "sleep", "300", name="twin") for _ in range(2)]
    for command in ("attach", "kill", "logs", "wait"):
        r = run_cli("-s", sb, command, "twin")
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
        assert "names 2 jobs" in r.stderr and all(i in r.stderr for i in ids)
    assert [j["state"] for j in jobs(fresh_agent_dir)] == ["running", "running"]  # neither was killed
    killed(fresh_agent_dir, ids[0])
    one = run_cli("-s", sb, "kill", "twin", "--grace", "0")  # the one still running, now
    assert one.stdout == f"killed {ids[1]} (SIGTERM)\n"


def test_top_redraws_in_place_and_quits_on_q(fresh_agent_dir: Path) -> None:
    sb = f"local://?dir={fresh_agent_dir}"
    job_id = started(fresh_agent_dir, "sleep", "300", name="busy", label="lbl")
    child = cli(fresh_agent_dir, "top", "--interval", "0.2", cols=120)
    for _ in range(2):  # two screens, each drawn over the last
        child.expect_exact("\x1b[H\x1b[2J")
        child.expect(re.escape(job_id).encode() + rb"[^\r\n]* busy +\[lbl\] sleep 300")
        screen = (child.before or b"").decode()  # the sandbox's line and the header
        assert all(len(line) <= 120 for line in screen.splitlines())  # cut to the width, never wrapped
    assert not termios.tcgetattr(child.child_fd)[3] & termios.ECHO  # `q` is read, not echoed
    child.send("q")
    assert ended(child) == 0
    plain = run_cli("-s", sb, "top", "--interval", "0.1", "--count", "2")  # not a tty: tables one after another
    assert plain.returncode == 0 and "\x1b" not in plain.stdout and plain.stdout.count("JOB ID") == 2
    killed(fresh_agent_dir, job_id)


def test_shell_is_a_terminal(fresh_agent_dir: Path) -> None:
    child = cli(fresh_agent_dir, "shell", cols=100)
    child.sendline("[ -t 0 ] && echo is-a-tty; tput cols; exit 5")  # split: the echo of the line is not the answer
    child.expect_exact("is-a-tty\r\n")
    child.expect_exact("100\r\n")
    assert ended(child) == 5


def test_an_unreachable_sandbox_is_one_line(tmp_path: Path) -> None:
    r = run_cli("-s", "ssh://nobody@127.0.0.1:1", "ps")
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.splitlines()) <= 3 and "Traceback" not in r.stderr
    assert "ssh://nobody@127.0.0.1:1" in r.stderr
    debug = run_cli("--debug", "-s", "ssh://nobody@127.0.0.1:1", "ps")
    assert debug.returncode == 2 and "Traceback" in debug.stderr  # the chain, when asked
