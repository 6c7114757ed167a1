"""A durable shell run's output on disk (#14): capped as a job's, the head dropped and counted;
the session's own files bounded however much a run or a background job prints; earlier runs'
output and exit codes outliving a SIGKILLed agent; a run re-read from its checkpoint after a
kill with every byte once. Real agent and keeper on ``local://``."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

import remote_exec as rx

from ..conftest import stop_agent

pytestmark = pytest.mark.anyio

SEQ = b"".join(b"%d\n" % i for i in range(1, 300001))
MIB = 1 << 20


def _held(path: Path) -> int:
    """Bytes of ``path`` on disk (a punched head holds none)."""
    return path.stat().st_blocks * 512


async def _wait_for(sb: rx.AsyncSandbox, path: Path) -> None:
    """Wait, inside the sandbox, for the file ``path`` to exist (what the command makes last)."""
    await sb.run(["sh", "-c", f"while [ ! -e {path} ]; do sleep 0.01; done"], timeout=60)


async def test_a_shell_runs_output_past_its_cap_is_dropped_and_counted(agent_dir: Path, tmp_path: Path) -> None:
    cap = 64 * 1024
    done = tmp_path / "done"
    async with rx.open_sandbox(f"local://?dir={agent_dir}") as sb, await sb.shell() as sh:
        # Nobody polls the run while it prints: the cap is applied as the agent copies it.
        run = await sh.start(f"seq 1 300000; touch {done}", output_cap=cap).started()
        await _wait_for(sb, done)
        res = await (await sb.attach(run.job_id or "")).wait()
        head = await sb.read_output(run.job_id or "", offset=0, max_bytes=16)
    dropped = res.stdout_truncated
    assert dropped % 4096 == 0 and len(SEQ) - cap - 4096 < dropped <= len(SEQ) - cap
    assert res.stdout == SEQ[dropped:].decode() and res.returncode == 0
    assert head.dropped == dropped and head.offset == dropped and head.data == SEQ[dropped : dropped + 16]


async def test_a_sessions_files_stay_bounded(agent_dir: Path, tmp_path: Path) -> None:
    """8 MiB from a run, then 8 MiB from a background job between runs: the session's ``out``
    keeps a few MiB at most (what the next agent would re-read), the run's log keeps it all."""
    done = tmp_path / "done"
    async with rx.open_sandbox(f"local://?dir={agent_dir}") as sb, await sb.shell() as sh:
        out = agent_dir / "shells" / sh.session_id / "out"
        res = await sh.run("head -c 8388608 /dev/zero | tr '\\0' a; echo")
        assert res.stdout == "a" * 8 * MIB + "\n"
        assert _held(out) < 3 * MIB
        assert (await sb.read_output(res.job_id or "", offset=0, max_bytes=4)).data == b"aaaa"
        # The same between runs, by a background job writing into the shell's stdout.
        await sh.run(f"(head -c 8388608 /dev/zero | tr '\\0' b; touch {done}) &")
        await _wait_for(sb, done)
        with anyio.fail_after(30):  # until the agent has read it all (a file's state, asked for)
            while _held(out) >= 3 * MIB:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        assert str((await sh.run("echo next")).stdout).endswith("next\n")


async def _kill_agent(sb: rx.AsyncSandbox) -> None:
    """SIGKILL the agent (not its keeper), then wait for the next one to answer."""
    gone = (await sb.server_info()).pid
    await sb.run(["kill", "-9", str(gone)])
    with anyio.fail_after(60):
        while (await sb.server_info()).pid == gone:  # noqa: ASYNC110 (a state, asked for)
            await anyio.sleep(0.05)


async def test_earlier_runs_outlive_a_killed_agent(fresh_agent_dir: Path) -> None:
    """Runs that ended before the agent was SIGKILLed are still listed, attachable and
    readable with their output and exit codes; the session goes on."""
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}", response_margin=1.0) as sb:
        sh = await sb.shell()
        first = await sh.start("echo one; echo e1 >&2; (exit 5)").started()
        assert (await first.wait()).returncode == 5
        second = await sh.start("seq 1 300000").started()
        assert (await second.wait()).stdout == SEQ.decode()
        await _kill_agent(sb)
        listed = {j.job_id: j for j in await sb.jobs()}
        assert listed[first.job_id or ""].exit_code == 5
        one = await (await sb.attach(first.job_id or "")).wait()
        assert (one.returncode, one.stdout, one.stderr) == (5, "one\n", "e1\n")
        two = await (await sb.attach(second.job_id or "")).wait()
        assert (two.returncode, two.stdout) == (0, SEQ.decode())
        assert (await sh.run("echo next")).stdout == "next\n"
    stop_agent(fresh_agent_dir)


async def test_a_long_run_read_on_from_its_checkpoint(fresh_agent_dir: Path, tmp_path: Path) -> None:
    """3 MiB, a SIGKILL, 3 MiB more: the next agent reads on from the run's last checkpoint
    (the session's file before it is punched out) and every byte arrives once."""
    go = tmp_path / "go"
    big = 3 * MIB
    command = (
        f"head -c {big} /dev/zero | tr '\\0' a; while [ ! -e {go} ]; do sleep 0.02; done; "
        f"head -c {big} /dev/zero | tr '\\0' b; (exit 3)"
    )
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}", response_margin=1.0) as sb:
        sh = await sb.shell()
        out = fresh_agent_dir / "shells" / sh.session_id / "out"
        proc = sh.start(command)
        got: list[str] = []
        size = 0
        code = None
        killed = False
        with anyio.fail_after(90):
            async for ev in proc:
                if isinstance(ev, rx.StdoutChunk):
                    got.append(str(ev.data))
                    size += len(str(ev.data))
                    if not killed and size >= big:
                        killed = True
                        assert _held(out) < 2 * MIB  # its checkpoints punched the session's file
                        await _kill_agent(sb)
                        go.touch()
                elif isinstance(ev, rx.Completed):
                    code = ev.exit_code
        assert killed and code == 3
        text = "".join(got)
        assert len(text) == 2 * big and text == "a" * big + "b" * big
        assert (await sh.run("echo next")).stdout == "next\n"


async def test_a_forged_record_takes_no_other_job(fresh_agent_dir: Path) -> None:
    """The session record is a file the shell's user may write: one naming another job as its
    run in progress gets the session ended by the next agent, and the job keeps its entry."""
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}", response_margin=1.0) as sb:
        job = await sb.exec_remote(["sleep", "300"]).started()
        sh = await sb.shell()
        run = await sh.start("sleep 300").started()
        home = fresh_agent_dir / "shells" / sh.session_id
        slots = [json.loads(p.read_text()) for p in sorted(home.glob("session.*.json")) if p.stat().st_size]
        record = max(slots, key=lambda r: int(r["seq"]))
        assert record["run"]["job_id"] == run.job_id
        record["run"]["job_id"] = job.job_id
        record["seq"] += 10
        (home / "session.0.json").write_text(json.dumps(record))
        await _kill_agent(sb)
        listed = {j.job_id: j for j in await sb.jobs()}
        assert listed[job.job_id or ""].command == ["sleep", "300"] and listed[job.job_id or ""].state == "running"
        with pytest.raises(rx.AgentLostError):
            await sh.run("true")
        await job.kill()
