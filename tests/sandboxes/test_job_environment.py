"""Every transport: live Python output by default, and a clean environment per job (#16).

For the opt-out, the Python job prints ``time.monotonic()`` with each line; the sandboxes here
share this machine's kernel (no time namespace), so the client compares it with its own
``monotonic()`` on arrival: how late the line came, in one clock.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import anyio
import pytest

import remote_exec as rx

pytestmark = pytest.mark.anyio

PROBE = 'echo "[$FIRST_SECRET][$JOB_SECRET][$SHELL_SECRET][$EXPORTED][$PYTHONUNBUFFERED]"'
CLEAN = "[][][][][1]\n"


def ticker(lines: int, every: float) -> list[str]:
    """A Python job printing ``i monotonic`` once per ``every`` seconds, never flushing itself."""
    body = f"import time\nfor i in range({lines}):\n    print(i, time.monotonic())\n    time.sleep({every})\n"
    return ["python3", "-c", body]


async def lateness(sb: rx.AsyncSandbox, argv: list[str], env: dict[str, str] | None = None) -> list[float]:
    """Seconds between each line's print in the sandbox and its arrival here."""
    late: list[float] = []
    pending = ""
    async for event in sb.exec_remote(argv, env=env):
        if isinstance(event, rx.StdoutChunk):
            now = time.monotonic()
            pending += str(event.data)
            *lines, pending = pending.split("\n")
            late += [now - float(line.split()[1]) for line in lines]
        elif isinstance(event, rx.Completed):
            assert event.exit_code == 0, event.stderr
    return late


async def require_python(sb: rx.AsyncSandbox) -> None:
    if (await sb.run(["sh", "-c", "command -v python3"])).returncode != 0:
        pytest.skip("no python3 in this sandbox's image")


# Prints a line, then waits for one on stdin (readline, unlike input(), flushes nothing).
GATED = "import sys\nfor i in range(5):\n    print(i)\n    sys.stdin.readline()\n"


async def test_python_output_is_live(sandbox_url: str) -> None:
    """Each print arrives while its job waits on stdin for the line this test sends only once
    the print has come: block buffering would hold the first print to the end, and the two would
    wait for each other until fail_after."""
    async with rx.open_sandbox(sandbox_url) as sb:
        await require_python(sb)
        proc = sb.exec_remote(["python3", "-c", GATED], stdin_open=True)
        got, sent = "", 0
        with anyio.fail_after(60):
            async for event in proc:
                if isinstance(event, rx.StdoutChunk):
                    got += str(event.data)
                    for _ in range(got.count("\n") - sent):
                        await proc.write_stdin("next\n")
                        sent += 1
                elif isinstance(event, rx.Completed):
                    assert event.exit_code == 0, event.stderr
    assert got == "0\n1\n2\n3\n4\n"


async def test_python_buffering_opt_out(sandbox_url: str) -> None:
    """``env={"PYTHONUNBUFFERED": ""}`` gives Python's own buffering back: the lines come at the end."""
    async with rx.open_sandbox(sandbox_url) as sb:
        await require_python(sb)
        late = await lateness(sb, ticker(3, 0.4), env={"PYTHONUNBUFFERED": ""})
    assert len(late) == 3 and late[0] >= 0.7, late


def cli(url: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``remote-exec --sandbox URL ARGS`` as a client process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "remote_exec.cli", "--sandbox", url, *args],
        capture_output=True,
        text=True,
        timeout=90,
        env={**os.environ, **(env or {})},
    )


async def test_environment_isolated_between_clients(sandbox_url: str) -> None:
    """What one client has (its own environment, a job's ``env=``, a shell's env and exports)
    reaches no job or shell of another client. The first client is a process of its own (the
    CLI), so that its environment is a client's; the others are connections of this one."""
    first = cli(sandbox_url, "run", "--", "true", env={"FIRST_SECRET": "abc"})
    assert first.returncode == 0, first.stderr
    async with rx.open_sandbox(sandbox_url) as one:
        assert (await one.run(["sh", "-c", "echo $JOB_SECRET"], env={"JOB_SECRET": "j"})).stdout == "j\n"
        async with await one.shell(env={"SHELL_SECRET": "s"}) as sh:
            await sh.run("export EXPORTED=e")  # (busybox's banner goes with this first run)
            assert (await sh.run(PROBE)).stdout == "[][][s][e][1]\n"  # the base, its env, its exports
            async with rx.open_sandbox(sandbox_url) as two:
                assert (await two.run(["sh", "-c", PROBE])).stdout == CLEAN
                async with await two.shell() as other:
                    await other.run(":")  # busybox's banner
                    assert (await other.run(PROBE)).stdout == CLEAN
    async with rx.open_sandbox(sandbox_url) as later:  # a client after them all: none of theirs stayed
        assert (await later.run(["sh", "-c", PROBE])).stdout == CLEAN


async def test_no_trace_of_the_agents_own_start(sandbox_url: str) -> None:
    """An injected PyInstaller agent's bootloader variables, and its LD_LIBRARY_PATH to the
    bundle's private libraries, are the agent's: no job sees them."""
    async with rx.open_sandbox(sandbox_url) as sb:
        env = str((await sb.run(["env"])).stdout)
    assert not [line for line in env.splitlines() if line.startswith(("_PYI_", "_MEIPASS", "LD_LIBRARY_PATH="))]


async def test_shell_run_reads_what_is_sent(sandbox_url: str) -> None:
    """A shell run's open stdin on every transport: ``read`` waits for the line sent, and what
    it leaves unread never runs as a command."""
    async with rx.open_sandbox(sandbox_url) as sb, await sb.shell() as sh:
        await sh.run(":")  # busybox's banner goes with the first run
        proc = sh.start('echo ready; read -r x; echo "got [$x]"', stdin_open=True)
        async for event in proc:
            assert event == rx.StdoutChunk("ready\n")  # read is waiting now
            break
        await proc.write_stdin("an answer\necho LEAKED\n")
        assert (await proc.wait()).stdout == "ready\ngot [an answer]\n"
        assert (await sh.run("echo next")).stdout == "next\n"
