"""``remote-exec run -t`` / ``attach -t`` driven through a real pseudo-terminal (pexpect), as a
user at a terminal drives them: raw mode, size and SIGWINCH, keystrokes, Ctrl-C, Ctrl-], and
the terminal's settings restored on the way out."""

from __future__ import annotations

import re
import signal
import sys
import termios
from pathlib import Path

import pexpect

TIMEOUT = 60  # generous: the machine is shared; an event that comes costs nothing


def cli(agent_dir: Path, *args: str, rows: int = 30, cols: int = 100) -> pexpect.spawn[bytes]:
    argv = ["-m", "remote_exec.cli", "-s", f"local://?dir={agent_dir}", *args]
    return pexpect.spawn(sys.executable, argv, dimensions=(rows, cols), timeout=TIMEOUT)


def lflag(child: pexpect.spawn[bytes]) -> int:
    """The local-mode flags of the child's terminal (TCGETS on the master reads the slave's)."""
    return int(termios.tcgetattr(child.child_fd)[3])


def test_run_t_is_a_terminal_that_follows_this_one(agent_dir: Path) -> None:
    script = "[ -t 0 ] && [ -t 1 ] && echo is-a-tty; stty size; read x; echo got $x; stty size; exit 3"
    child = cli(agent_dir, "run", "-t", "--", "sh", "-c", script)
    cooked = lflag(child)
    assert cooked & termios.ICANON and cooked & termios.ECHO
    child.expect_exact("is-a-tty\r\n")
    child.expect_exact("30 100\r\n")  # the size of the terminal it was started from
    raw = lflag(child)
    assert not raw & termios.ICANON and not raw & termios.ECHO  # every key goes to the job
    child.setwinsize(40, 120)  # SIGWINCH to the CLI -> resize
    child.send("hi\r")
    child.expect_exact("got hi\r\n")
    child.expect_exact("40 120\r\n")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 3


def test_ctrl_c_goes_to_the_job(agent_dir: Path) -> None:
    """Ctrl-C is the remote terminal's: the job's trap runs (a local SIGINT would end the CLI
    with 130 instead of the job's 7)."""
    script = "trap 'echo caught; exit 7' INT; echo ready; while :; do sleep 1; done"
    child = cli(agent_dir, "run", "-t", "--", "sh", "-c", script)
    child.expect_exact("ready")
    child.send("\x03")
    child.expect_exact("caught")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 7


def test_terminal_restored_when_the_cli_is_terminated(agent_dir: Path) -> None:
    child = cli(agent_dir, "run", "-t", "--", "sh", "-c", "echo ready; exec sleep 100")
    before = termios.tcgetattr(child.child_fd)
    child.expect_exact("ready")
    assert termios.tcgetattr(child.child_fd) != before  # raw now
    child.kill(signal.SIGTERM)
    child.expect(pexpect.EOF)
    after = termios.tcgetattr(child.child_fd)
    child.close()
    assert after == before
    assert child.exitstatus == 128 + signal.SIGTERM


def test_leave_with_ctrl_bracket_then_attach_t(agent_dir: Path) -> None:
    child = cli(agent_dir, "run", "-t", "--", "sh", "-c", "printf 'name? '; read x; echo got $x; exit 4")
    child.expect_exact("name? ")
    child.send("\x1d")  # Ctrl-]: leave, the job runs on
    child.expect(r"left job (\S+) running")
    assert isinstance(child.match, re.Match)
    job_id = child.match.group(1).decode()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    viewer = cli(agent_dir, "attach", "-t", job_id)
    viewer.expect_exact("name? ")  # the replay
    viewer.send("ada\r")
    viewer.expect_exact("got ada\r\n")
    viewer.expect(pexpect.EOF)
    viewer.close()
    assert viewer.exitstatus == 4


def test_attach_t_needs_a_tty_job(agent_dir: Path) -> None:
    child = cli(agent_dir, "run", "--detach", "--", "sleep", "30")
    child.expect(pexpect.EOF)
    job_id = (child.before or b"").decode().strip()
    child.close()
    viewer = cli(agent_dir, "attach", "-t", job_id)
    viewer.expect_exact("has no terminal")
    viewer.expect(pexpect.EOF)
    viewer.close()
    assert viewer.exitstatus == 1
    cli(agent_dir, "kill", job_id).expect(pexpect.EOF)


def test_shell_prompt_types_into_the_running_command(agent_dir: Path) -> None:
    """At ``remote-exec shell``'s prompt, what is typed while a command runs is that command's
    stdin (the terminal echoes and edits it, as for a local command); Ctrl-D ends that stdin,
    not the prompt; Ctrl-C still interrupts the command and keeps the shell."""
    child = cli(agent_dir, "shell", "--lines")
    child.expect_exact("$ ")
    child.send("printf 'name? '; read name; echo \"hi $name\"\r")
    child.expect_exact("name? ")
    child.send("ada\r")
    child.expect_exact("hi ada\r\n")
    child.expect_exact("$ ")
    child.send("cat; echo cat-ended\r")
    child.send("line1\r")  # the same terminal echoes it, then cat writes it back
    child.expect_exact("line1\r\nline1\r\n")
    child.sendeof()  # Ctrl-D: cat's end of input; the prompt stays
    child.expect_exact("cat-ended\r\n")
    child.expect_exact("$ ")
    child.send("echo go; sleep 300\r")
    child.expect_exact("go\r\n")
    child.sendintr()
    child.expect_exact("^C")
    child.expect_exact("$ ")
    child.sendeof()  # at the prompt: leave
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 130  # the last command's status: the interrupted sleep
