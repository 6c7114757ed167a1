"""Shell sessions outlive the agent (#14): SIGKILLed while idle and while a run prints, and
handed over to another agent version, a session is listed again with its cwd and exported
variables, the run in progress delivers every byte exactly once with its exit code, and the next
run works. Real agent and keeper on ``local://``, real bubblewrap, a real dockerd."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import pytest

import remote_exec as rx
from remote_exec.agent.keeperlink import keeper_call

from ..agent.rawhttp import rpc
from ..conftest import runner, wait_exit
from ..faults.suite import Target

pytestmark = pytest.mark.anyio

LINES = 30
# Prints over about three seconds, on both streams, and ends with a status of its own.
PRINTER = f"for i in $(seq 1 {LINES}); do echo line $i; echo err $i >&2; sleep 0.1; done; (exit 3)"
WHERE = 'echo "$PWD $RX_KEPT"'


async def _kill_agent(target: Target, sb: rx.AsyncSandbox) -> None:
    """SIGKILL the agent (not its keeper), then wait for the next one to answer."""
    gone = (await sb.server_info()).pid
    code, out, err = await target.run_in(["kill", "-9", str(gone)])
    assert code == 0, (out, err)
    with anyio.fail_after(60):
        # The old agent may answer before it dies: ask again (a state, asked for).
        while (await sb.server_info()).pid == gone:  # noqa: ASYNC110
            await anyio.sleep(0.05)


async def _run_through_a_kill(target: Target, sb: rx.AsyncSandbox, sh: rx.ShellSession) -> None:
    """A run printing lines; the agent killed after the fifth: all of it arrives once, and its code."""
    proc = sh.start(PRINTER)
    out = err = ""
    code = None
    killed = False
    with anyio.fail_after(90):
        async for ev in proc:
            if isinstance(ev, rx.StdoutChunk):
                out += str(ev.data)
                if not killed and out.count("\n") >= 5:
                    killed = True
                    await _kill_agent(target, sb)
            elif isinstance(ev, rx.StderrChunk):
                err += str(ev.data)
            elif isinstance(ev, rx.Completed):
                code = ev.exit_code
    assert killed
    assert out == "".join(f"line {i}\n" for i in range(1, LINES + 1))
    assert err == "".join(f"err {i}\n" for i in range(1, LINES + 1))
    assert code == 3


async def test_a_shell_survives_its_agent_killed(target: Target) -> None:
    async with rx.open_sandbox(target.url, response_margin=1.0) as sb:
        sh = await sb.shell()
        await sh.run("mkdir -p /tmp/rx-kept && cd /tmp/rx-kept && export RX_KEPT=kept-42")
        shell_pid = sh.pid

        await _kill_agent(target, sb)  # (a) idle
        listed = {s.session_id: s for s in await sb.shells()}
        assert listed[sh.session_id].state == "open" and listed[sh.session_id].pid == shell_pid
        assert listed[sh.session_id].cwd == "/tmp/rx-kept"
        assert (await sh.run(WHERE)).stdout == "/tmp/rx-kept kept-42\n"

        await _run_through_a_kill(target, sb, sh)  # (b) a run in progress
        assert (await sh.run(WHERE)).stdout == "/tmp/rx-kept kept-42\n"  # the next run works
        listed = {s.session_id: s for s in await sb.shells()}
        assert listed[sh.session_id].pid == shell_pid and not listed[sh.session_id].busy
        await sh.close()
        with pytest.raises(rx.ShellClosedError):
            await sh.run("true")


async def _upgrade(state: Path, version: str) -> int:
    """What a host of another version does: ``ensure`` hands the agent's state over
    (``server_handover``) to an agent of its own; return that agent's pid."""
    agent = [sys.executable, "-m", "remote_exec.agent", "ensure", "--dir", str(state), "--report-version", version]
    done = await anyio.run_process(agent, check=False)
    assert done.returncode == 0, f"ensure exited {done.returncode}: {done.stdout!r} {done.stderr!r}"
    return int(json.loads(done.stdout)["result"]["pid"])


async def test_a_shell_survives_an_agent_upgrade(fresh_agent_dir: Path) -> None:
    """An upgrade in place: the open session, idle and then with a run in progress, goes on
    under an agent of another version, and back."""
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}", response_margin=1.0) as sb:
        sh = await sb.shell()
        await sh.run("cd / && export RX_KEPT=upgraded")
        old = sb.info.pid
        assert await _upgrade(fresh_agent_dir, "0.0.1-other") != old
        assert (await sh.run(WHERE)).stdout == "/ upgraded\n"  # (and handed back to ours)
        proc = sh.start(PRINTER)
        assert await anext(aiter(proc)) == rx.StdoutChunk("line 1\n")
        old = (await sb.server_info()).pid
        assert await _upgrade(fresh_agent_dir, "0.0.2-other") != old
        result = await proc.wait()
        assert result.returncode == 3
        assert result.stdout == "".join(f"line {i}\n" for i in range(1, LINES + 1))
        assert (await sh.run(WHERE)).stdout == "/ upgraded\n"


FORGE = """
import re, sys
text = "".join(open(path).read() for path in sys.argv[1:])
found = sorted(set(re.findall("[0-9a-f]{32}", text)))
for hexes in found:
    print("__RX_DONE_%s__" % hexes, flush=True)
    print("__RX_EXIT_%s_000__" % hexes, file=sys.stderr, flush=True)
print("forged", len(found), flush=True)
"""


async def test_the_session_record_holds_no_secret(fresh_agent_dir: Path, tmp_path: Path) -> None:
    """The record is private (0600 in a 0700 dir) but readable by a command of the agent's own
    uid: every hex string in it printed as a run-end sentinel ends nothing, neither for this
    agent nor for the next one, which re-reads the run from the files after a SIGKILL."""
    forge = tmp_path / "forge.py"
    forge.write_text(FORGE)
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}", response_margin=1.0) as sb:
        sh = await sb.shell()
        home = fresh_agent_dir / "shells" / sh.session_id
        assert home.stat().st_mode & 0o777 == 0o700
        files = ("out", "err", "session.0.json", "session.1.json")
        assert {(home / n).stat().st_mode & 0o777 for n in files} == {0o600}
        record = f"{home}/session.0.json {home}/session.1.json"
        proc = sh.start(
            f"{sys.executable} {forge} {record}; "
            f"while [ ! -s {tmp_path}/go ]; do sleep 0.05; done; echo after; (exit 7)"
        )
        out = ""
        killed = False
        with anyio.fail_after(60):
            async for ev in proc:
                if isinstance(ev, rx.StdoutChunk):
                    out += str(ev.data)
                    if not killed and "forged" in out:
                        killed = True
                        await _kill_agent(_local, sb)  # the next agent re-reads the forgeries too
                        (tmp_path / "go").write_text("go\n")
                elif isinstance(ev, rx.Completed):
                    assert ev.exit_code == 7
        assert out.count("__RX_DONE_") >= 1 and out.endswith("after\n")
        assert (await sh.run("echo next")).stdout == "next\n"


_local = Target("local", "", runner([]), lambda args: True)


async def test_a_run_that_ended_while_no_agent_ran(fresh_agent_dir: Path, tmp_path: Path) -> None:
    """The agent hands over and no agent runs (the keeper waits for the next connect) while the
    run goes on and ends: the next agent finds its end in the files, and the waiting client
    gets all of its output once and its exit code; the session goes on."""
    go, done = tmp_path / "go", tmp_path / "done"
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}", response_margin=1.0) as sb:
        sh = await sb.shell()
        await sh.run("export RX_KEPT=alone")
        proc = sh.start(f"echo a; while [ ! -e {go} ]; do sleep 0.02; done; echo b; echo c >&2; touch {done}; (exit 4)")
        assert await anext(aiter(proc)) == rx.StdoutChunk("a\n")
        agent = sb.info.pid
        await anyio.to_thread.run_sync(rpc, fresh_agent_dir / "agent.sock", "server_handover")
        assert await anyio.to_thread.run_sync(wait_exit, agent, 30.0)
        go.touch()
        with anyio.fail_after(30):
            while not done.exists():  # noqa: ASYNC110 (a file in the sandbox: no event reaches us)
                await anyio.sleep(0.02)
        hello = await anyio.to_thread.run_sync(keeper_call, fresh_agent_dir, {"op": "hello"}, 10.0)
        assert hello is not None and hello["agent_pid"] == 0  # it ended while no agent ran
        result = await proc.wait()  # reconnects: the keeper starts the next agent
        assert (result.returncode, result.stdout, result.stderr) == (4, "a\nb\n", "c\n")
        assert (await sb.server_info()).pid != agent
        assert (await sh.run("echo $RX_KEPT")).stdout == "alone\n"


async def test_a_runs_open_stdin_outlives_a_killed_agent(fresh_agent_dir: Path) -> None:
    """The keeper holds the write end of a run's stdin FIFO: a SIGKILLed agent is no EOF, and
    the next line goes through the next agent, at the cursor the run's dir kept."""
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}", response_margin=1.0) as sb:
        sh = await sb.shell()
        proc = await sh.start('read a; read b; echo "$a$b"', stdin_open=True).started()
        await proc.write_stdin("x\n")
        await _kill_agent(_local, sb)
        await proc.write_stdin("y\n")
        result = await proc.wait()
        assert (result.returncode, result.stdout) == (0, "xy\n")
        assert (await sh.run("echo next")).stdout == "next\n"
