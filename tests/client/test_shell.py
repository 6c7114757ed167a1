"""Stateful shell sessions, against the real agent, over every channel kind."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import anyio
import pytest

import remote_exec as rx
from remote_exec.agent.jobs.proctable import session_members

from ..conftest import run_cli

pytestmark = pytest.mark.anyio


def others(sh: rx.ShellSession) -> list[int]:
    """Processes left in the shell's session, besides the shell itself."""
    return [pid for pid in session_members(sh.pid) if pid != sh.pid]


async def ignoring_sigint(pid: int) -> None:
    """Wait until ``pid`` ignores SIGINT. A shell without job control sets that up in a
    background job's child after the fork, and ``$!`` is known before: a Ctrl-C sent in between
    reaches the job, as it would at a terminal (seen once on a loaded machine)."""
    mask = 1 << (signal.SIGINT - 1)
    with anyio.fail_after(20):
        while not int(_status_field(pid, "SigIgn"), 16) & mask:  # noqa: ASYNC110 (no event: /proc)
            await anyio.sleep(0.02)


def _status_field(pid: int, name: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{name}:"):
            return line.split()[1]
    raise AssertionError(f"no {name} in /proc/{pid}/status")


async def test_state_persists_and_each_run_has_its_exit_code(url: str) -> None:
    async with rx.open_sandbox(url) as sb, await sb.shell() as sh:
        r = await sh.run("cd /tmp && export A=1 && B=two && greet() { echo \"hi $1\"; } && alias ll='echo LL'")
        assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
        r = await sh.run("pwd; echo $A $B; greet you; ll")
        assert (r.returncode, r.stdout) == (0, "/tmp\n1 two\nhi you\nLL\n")
        r = await sh.run("echo out; echo err >&2; (exit 3)")
        assert (r.success, r.returncode, r.stdout, r.stderr) == (False, 3, "out\n", "err\n")
        r = await sh.run("printf 'no newline'")  # output not ending in a newline is kept exactly
        assert (r.returncode, r.stdout) == (0, "no newline")
        r = await sh.run("echo '__RX_DONE_ __RX_EXIT_x_000__ __RX_GO_'")  # sentinel look-alikes pass
        assert r.stdout == "__RX_DONE_ __RX_EXIT_x_000__ __RX_GO_\n"
        assert (await sh.run("-x")).returncode == 127  # a leading dash is a command, not an option
        assert (await sh.run("cd /no/such/dir")).returncode == 1
        assert (await sh.run("pwd")).stdout == "/tmp\n"


async def test_cwd_and_env_at_open(url: str, tmp_path: object) -> None:
    async with rx.open_sandbox(url) as sb, await sb.shell(cwd=str(tmp_path), env={"GREETING": "hey"}) as sh:
        r = await sh.run("pwd; echo $GREETING")
        assert r.stdout == f"{tmp_path}\n" + "hey\n"
        assert sh.info.cwd == str(tmp_path)
        with pytest.raises(rx.SpawnError):
            await sb.shell(cwd="/no/such/dir")


async def test_trailing_stdout_never_lost(url: str) -> None:
    # A big stdout (past the pipe's capacity) then an immediate non-zero exit: the EXIT sentinel
    # on stderr arrives long before the stdout is drained. Sizes vary so every boundary moves.
    async with rx.open_sandbox(url) as sb, await sb.shell() as sh:
        for i in range(500):
            size = 1 + (i * 7919) % 100_000
            r = await sh.run(f"printf '%{size}s' e; false")
            assert r.returncode == 1 and r.stdout == " " * (size - 1) + "e", i


async def test_busy_then_closed(url: str) -> None:
    async with rx.open_sandbox(url) as sb:
        sh = await sb.shell()
        proc = sh.start("echo running; sleep 30")
        assert await anext(aiter(proc)) == rx.StdoutChunk("running\n")
        with pytest.raises(rx.ShellBusyError) as busy:
            await sh.run("true")
        assert busy.value.session_id == sh.session_id and busy.value.data["run_id"] == proc.job_id
        info = {s.session_id: s for s in await sb.shells()}[sh.session_id]
        assert info.busy and info.run_id == proc.job_id and info.run_command == "echo running; sleep 30"
        await sh.close()
        assert (await proc.wait()).returncode == -9  # closing killed the shell under the run
        assert sh.closed
        with pytest.raises(rx.ShellClosedError):
            await sh.run("true")
        await sh.close()  # idempotent
        with pytest.raises(rx.ShellNotFoundError):
            await sb.reattach_shell(sh.session_id.rpartition("-sh")[0] + "-sh999999")  # never opened
        with pytest.raises(rx.AgentLostError):
            await sb.reattach_shell("deadbeef-sh1")


async def test_exit_closes_the_shell_but_a_subshell_does_not(url: str) -> None:
    async with rx.open_sandbox(url) as sb:
        sh = await sb.shell()
        assert (await sh.run("( exit 7 )")).returncode == 7
        assert (await sh.run("echo alive")).stdout == "alive\n"
        bg = int((await sh.run("sleep 300 & echo $!")).stdout)
        r = await sh.run("echo bye; echo err >&2; exit 42")
        assert (r.returncode, r.stdout, r.stderr) == (42, "bye\n", "err\n")  # bash's "exit" echo is not output
        info = await sh.refresh()
        assert (info.state, info.exit_code, info.cwd) == ("closed", 42, None)
        with pytest.raises(rx.ShellClosedError) as closed:
            await sh.run("true")
        assert closed.value.data["exit_code"] == 42
        with pytest.raises(rx.ShellClosedError):
            await sb.reattach_shell(sh.session_id)
        assert bg not in session_members(info.pid)  # a closed tab takes its background jobs with it


async def test_a_closed_shell_is_closed_once_its_leftovers_are_gone(url: str, tmp_path: Path) -> None:
    """What the shell left running dies with it, and the session says "closed" only once it is
    gone: a process with 1 GiB of memory takes a while to exit after its SIGKILL (its pages are
    freed first), longer than the agent takes to notice that its shell exited."""
    heavy = "import time; m = b'x' * 2**30; print(1, flush=True); time.sleep(300)"
    async with rx.open_sandbox(url) as sb:
        sh = await sb.shell(cwd=str(tmp_path))
        # The run returns once the process holds its memory (it says so through the FIFO).
        started = f'mkfifo up; {sys.executable} -c "{heavy}" > up & read _ < up; echo $!'
        big = int((await sh.run(started)).stdout)
        assert (await sh.run("exit 3")).returncode == 3
        assert big not in session_members(sh.pid)  # gone, not dying


async def test_reattach_from_a_second_client_sees_the_state(url: str) -> None:
    async with rx.open_sandbox(url) as a:
        sh = await a.shell()
        await sh.run("cd /usr && export SHARED=yes && f() { echo from-f; }")
        async with rx.open_sandbox(url) as b:
            sh2 = await b.reattach_shell(sh.session_id)
            assert sh2.session_id == sh.session_id and sh2.pid == sh.pid and sh2.info.cwd == "/usr"
            r = await sh2.run("pwd; echo $SHARED; f; cd /")
            assert r.stdout == "/usr\nyes\nfrom-f\n"
        assert (await sh.run("pwd")).stdout == "/\n"  # and changes flow back
        # A run is a job: another client can attach to it and sees every byte.
        proc = sh.start("for i in $(seq 1 300); do echo line $i; done; sleep 0.2; echo tail")
        await proc.started()
        async with rx.open_sandbox(url) as c:
            watcher = await c.attach(proc.job_id or "")
            first, second = await proc.wait(), await watcher.wait()
            row = {j.job_id: j for j in await c.jobs()}[proc.job_id or ""]
        assert first.stdout == second.stdout and str(first.stdout).endswith("line 300\ntail\n")
        assert row.label == f"shell {sh.session_id}" and row.state == "completed" and row.pid == sh.pid
        await sh.close()


async def test_a_session_reattaches_its_sibling_without_the_sandbox(url: str) -> None:
    # what a widget holding only a session does to switch sessions (ShellView's reattach)
    async with rx.open_sandbox(url) as sb:
        mine, theirs = await sb.shell(), await sb.shell()
        await theirs.run("export WHO=them")
        assert mine.url == sb.url
        other = await mine.reattach_shell(theirs.session_id)
        assert (other.session_id, (await other.run("echo $WHO")).stdout) == (theirs.session_id, "them\n")
        await mine.close()
        await theirs.close()
        await sb.aclose()
        with pytest.raises(RuntimeError, match="closed"):
            await mine.reattach_shell(theirs.session_id)


async def test_interrupt_stops_the_command_not_the_shell(url: str) -> None:
    async with rx.open_sandbox(url) as sb, await sb.shell() as sh:
        await sh.run("export KEEP=1")
        bg = int((await sh.run("sleep 300 & echo $!")).stdout)
        await ignoring_sigint(bg)
        proc = sh.start("echo ready; sleep 300; echo never")
        assert await anext(aiter(proc)) == rx.StdoutChunk("ready\n")
        await sh.interrupt()
        r = await proc.wait()
        assert (r.returncode, r.state, r.stdout) == (130, "completed", "ready\n")
        assert others(sh) == [bg]  # the foreground sleep is gone; the background job ignores Ctrl-C
        # A loop of builtins is aborted as a whole, as Ctrl-C does at a terminal.
        proc = sh.start("echo spin; while :; do :; done; echo never")
        assert await anext(aiter(proc)) == rx.StdoutChunk("spin\n")
        await sh.interrupt()
        assert (await proc.wait()).returncode == 130
        # A command in a process group of its own is reached too, as Ctrl-C reaches a terminal's job.
        proc = sh.start("echo own-group; timeout 100 sleep 300")
        assert await anext(aiter(proc)) == rx.StdoutChunk("own-group\n")
        await sh.interrupt()
        assert (await proc.wait()).returncode == 130
        # An interrupt sent the moment a run starts is held until the shell runs it, not lost.
        proc = sh.start("sleep 300")
        await proc.started()
        await sh.interrupt()
        assert (await proc.wait()).returncode == 130
        assert (await sh.run("echo $KEEP")).stdout == "1\n"
        await sh.interrupt()  # idle: nothing to interrupt, nothing happens
        assert (await sh.run("echo still")).stdout == "still\n"


async def test_timeout_interrupts_and_keeps_the_shell(url: str) -> None:
    async with rx.open_sandbox(url) as sb, await sb.shell() as sh:
        await sh.run("cd /tmp")
        with pytest.raises(rx.ExecTimeoutError) as info:
            await sh.run("echo partial; sleep 300", timeout=0.3)
        assert info.value.result.stdout == "partial\n" and info.value.result.state == "timed_out"
        # A command that ignores SIGINT is killed after kill_grace; the shell still lives.
        with pytest.raises(rx.ExecTimeoutError):
            await sh.run("bash -c 'trap \"\" INT; echo stubborn; sleep 300'", timeout=0.3, kill_grace=0.2)
        assert others(sh) == []
        assert (await sh.run("pwd")).stdout == "/tmp\n"
        # Cancelling the caller kills the run the same way.
        with anyio.move_on_after(0.3):
            await sh.run("sleep 300")
        assert others(sh) == [] and (await sh.run("echo ok")).stdout == "ok\n"


async def test_a_shell_that_cannot_be_interrupted_is_closed_not_wedged(url: str) -> None:
    async with rx.open_sandbox(url) as sb:
        sh = await sb.shell()
        with pytest.raises(rx.ExecTimeoutError):  # the shell itself ignores SIGINT, in a builtin loop
            await sh.run("trap '' INT; while :; do :; done", timeout=0.2, kill_grace=0.1)
        info = await sh.refresh()
        assert info.state == "closed" and "could not be stopped" in (info.closed_reason or "")
        with pytest.raises(rx.ShellClosedError):
            await sh.run("true")


async def test_unmatched_quotes_are_errors_not_a_stuck_prompt(url: str) -> None:
    async with rx.open_sandbox(url) as sb, await sb.shell() as sh:
        for broken in ['echo "unclosed', "echo 'unclosed", "echo `unclosed", "if true; then", "echo $("]:
            r = await sh.run(broken, timeout=10)
            assert r.returncode in (1, 2) and "unexpected" in str(r.stderr), broken
        assert (await sh.run("echo 'fine'")).stdout == "fine\n"


async def test_stdin_is_dev_null_unless_input_is_given(url: str) -> None:
    async with rx.open_sandbox(url) as sb, await sb.shell() as sh:
        r = await sh.run('cat; read x; echo "x=$x"', timeout=10)  # EOF at once, nothing eaten
        assert (r.returncode, r.stdout) == (0, "x=\n")
        assert (await sh.run("echo next")).stdout == "next\n"  # the next run's text arrived intact
        r = await sh.run('read first; cat; echo "[$first]"', input="line one\nline two\n")
        assert r.stdout == "line two\n[line one]\n"
        assert str((await sh.run("wc -c", input=b"\xc3\xa9t\xc3\xa9")).stdout).strip() == "5"
        assert (await sh.run("cat")).stdout == ""  # the input was for that run only


async def test_streaming_start_gives_exec_remote_events(url: str) -> None:
    """The run's events stream: "a" arrives while the command still waits (for the line this test
    sends only once it has "a"), before "c" is written. Between stdout and stderr no order is
    promised (two files: soak, "b" came first once)."""
    async with rx.open_sandbox(url) as sb, await sb.shell() as sh:
        proc = sh.start("echo a; echo b >&2; read -r x; echo c; (exit 4)", stdin_open=True)
        events = []
        with anyio.fail_after(60):
            async for ev in proc:
                events.append(ev)
                if ev == rx.StdoutChunk("a\n"):
                    await proc.write_stdin("go\n")  # only now is "c" written
        assert isinstance(events[-1], rx.Completed) and events[-1].exit_code == 4
        assert [e for e in events if isinstance(e, rx.StdoutChunk)] == [rx.StdoutChunk("a\n"), rx.StdoutChunk("c\n")]
        assert [e for e in events if isinstance(e, rx.StderrChunk)] == [rx.StderrChunk("b\n")]


async def test_shells_lists_sessions(url: str) -> None:
    async with rx.open_sandbox(url) as sb:
        sh = await sb.shell()
        await sh.run("cd /var")
        row = {s.session_id: s for s in await sb.shells()}[sh.session_id]
        assert (row.state, row.cwd, row.busy, row.run_id, row.pid) == ("open", "/var", False, None, sh.pid)
        assert row.program.endswith("bash") and row.created_at <= row.last_used_at
        await sh.close()
        row = {s.session_id: s for s in await sb.shells()}[sh.session_id]
        assert row.state == "closed" and row.closed_reason == "closed on request"


def test_blocking_twin(url: str) -> None:
    with rx.connect(url) as sb:
        with sb.shell(cwd="/tmp") as sh:
            assert sh.run("export Z=9; pwd").stdout == "/tmp\n"
            proc = sh.start("echo $Z; sleep 300")
            assert next(iter(proc)) == rx.StdoutChunk("9\n")
            sh.interrupt()
            assert proc.wait().returncode == 130
            again = sb.reattach_shell(sh.session_id)
            assert again.run("echo $Z").stdout == "9\n"
            assert sh.url == sb.url and sh.reattach_shell(again.session_id).run("echo $Z").stdout == "9\n"
            assert sh.session_id in {s.session_id for s in sb.shells()}
        assert sh.refresh().state == "closed" and sh.closed


def test_cli_shell_through_a_pipe(agent_dir: object) -> None:
    sb = f"local://?dir={agent_dir}"
    r = run_cli("-s", sb, "shell", input="cd /tmp\nexport N=3\n\npwd; echo $N\necho oops >&2; false\necho last\n")
    assert r.returncode == 0 and r.stdout == "/tmp\n3\nlast\n"
    assert "oops\n[exit 1]\n" in r.stderr and "shell session" in r.stderr
    session_id = r.stderr.split("shell session ")[1].split()[0]
    with rx.connect(sb) as box:
        assert {s.session_id: s for s in box.shells()}[session_id].state == "closed"  # it made it: it closed it
        # Step into a session a notebook is using: the CLI sees its state and leaves it open.
        with box.shell() as sh:
            sh.run("cd /usr; export FROM=notebook")
            r = run_cli("-s", sb, "shell", "--session", sh.session_id, input="pwd; echo $FROM\nexit 5\n")
            assert (r.returncode, r.stdout) == (5, "/usr\nnotebook\n")
            assert "exited" in r.stderr
    r = run_cli("-s", sb, "shell", "--session", session_id, input="true\n")
    assert r.returncode == 2 and "ShellClosedError" in r.stderr


def test_ctrl_c_in_the_cli_stops_the_command_not_the_shell(agent_dir: object) -> None:
    import subprocess
    import sys

    sb = f"local://?dir={agent_dir}"
    argv = [sys.executable, "-m", "remote_exec.cli", "-s", sb, "shell", "--keep"]
    with subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as cli:
        assert cli.stdin is not None and cli.stdout is not None and cli.stderr is not None
        session_id = cli.stderr.readline().split("shell session ")[1].split()[0]
        cli.stdin.write("export KEPT=1; echo started; sleep 300\n")
        cli.stdin.flush()
        assert cli.stdout.readline() == "started\n"
        cli.send_signal(signal.SIGINT)
        cli.stdin.write("echo $KEPT\n")
        cli.stdin.close()
        assert cli.stdout.readline() == "1\n"
        assert cli.wait(timeout=30) == 0
    with rx.connect(sb) as box:
        sh = box.reattach_shell(session_id)  # --keep left it open
        assert sh.run("echo $KEPT").stdout == "1\n"
        sh.close()
