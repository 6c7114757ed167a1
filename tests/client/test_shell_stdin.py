"""Stdin for shell-session runs (#16): a run that reads stdin gets what the user sends.

Against the real agent over every channel kind; the same checks run on every transport in
``tests/sandboxes/test_shell_stdin_contract.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import remote_exec as rx

pytestmark = pytest.mark.anyio


async def first_line(proc: rx.ExecRemoteProcess) -> str:
    """The run's first stdout line: proof that it got as far as its first ``echo``."""
    line = ""
    async for event in proc:
        if isinstance(event, rx.StdoutChunk):
            line += str(event.data)
            if "\n" in line:
                return line
    raise AssertionError(f"the run ended before printing a line ({line!r})")


async def test_read_waits_for_what_is_sent(url: str) -> None:
    async with rx.open_sandbox(url) as sb, await sb.shell() as sh:
        proc = sh.start('echo ready; read -r -t 30 x; echo "got [$x] $?"', stdin_open=True)
        assert await first_line(proc) == "ready\n"  # read is now waiting: /dev/null would have ended it
        await proc.write_stdin("hello world\n")
        assert (await proc.wait()).stdout == "ready\ngot [hello world] 0\n"


async def test_python_input_is_answered(url: str) -> None:
    async with rx.open_sandbox(url) as sb, await sb.shell() as sh:
        proc = sh.start("python3 -c 'print(input(\"name? \")[::-1])'", stdin_open=True)
        await proc.write_stdin("remote\n")
        r = await proc.wait()
        assert (r.returncode, r.stdout) == (0, "name? etomer\n"), r.stderr


async def test_unread_input_never_runs_as_a_command(url: str, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    async with rx.open_sandbox(url) as sb, await sb.shell() as sh:
        proc = sh.start('read -r x; echo "first [$x]"', stdin_open=True)
        await proc.write_stdin(f"one\ntouch {marker}\necho LEAKED\n")
        assert (await proc.wait()).stdout == "first [one]\n"
        after = await sh.run("echo next")
        assert (after.stdout, after.returncode) == ("next\n", 0)
        assert not marker.exists()  # its stdin was still open, two lines in it, when it ended


async def test_eof_and_input_first(url: str) -> None:
    async with rx.open_sandbox(url) as sb, await sb.shell() as sh:
        for i in range(5):  # written and closed at once, likely before the shell opened the FIFO
            proc = sh.start("cat; echo end", input=f"pre{i} ", stdin_open=True)
            await proc.write_stdin("x")
            await proc.close_stdin()
            assert (await proc.wait()).stdout == f"pre{i} xend\n"
        # A plain job too: writes after input= continue after it.
        proc = sb.exec_remote(["cat"], input="pre ", stdin_open=True)
        await proc.write_stdin("x")
        await proc.close_stdin()
        assert (await proc.wait()).stdout == "pre x"


async def test_default_stdin_is_closed(url: str) -> None:
    """Without ``stdin_open`` a run reads /dev/null (EOF at once) and takes no writes."""
    async with rx.open_sandbox(url) as sb, await sb.shell() as sh:
        assert (await sh.run('read -r x; echo "rc $?"')).stdout == "rc 1\n"
        proc = sh.start("sleep 30")
        await proc.started()
        with pytest.raises(rx.JobNotRunningError, match="stdin_open"):
            await proc.write_stdin("x\n")
        await proc.kill()


def test_blocking_twin(agent_dir: Path) -> None:
    with rx.connect(f"local://?dir={agent_dir}") as sb, sb.shell() as sh:
        proc = sh.start("read -r a; read -r b; echo $b $a", stdin_open=True)
        proc.write_stdin("1\n2\n")
        proc.close_stdin()
        assert proc.wait().stdout == "2 1\n"
