"""Jobs outlive the agent (#14): re-adoption after kill -9, stdin, the disk cap, whole trees,
upgrade in place, and agent memory that does not grow with output. Real agent and keeper."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.lowlevel
import pytest

import remote_exec as rx
from tests.agent.rawhttp import rpc
from tests.conftest import job_dir

pytestmark = pytest.mark.anyio

T = TypeVar("T")
TICKS = "for i in $(seq 1 60); do echo tick $i | tee -a {out}; sleep 0.02; done; exit 5"


def procs_with(tag: str) -> list[int]:
    """PIDs of live processes whose command line contains ``tag`` (the process table, read directly)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ")
            state = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if tag.encode() in cmd and state != b"Z":
            found.append(int(name))
    return found


def procs_running(*argv: str) -> list[int]:
    """PIDs of live processes whose command line is exactly ``argv`` (not a shell whose script
    merely names it, nor a forked copy of that shell)."""
    want = b"".join(a.encode() + b"\0" for a in argv)
    return [pid for pid in procs_with(" ".join(argv)) if _cmdline(pid) == want]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


async def wait_until(what: str, check: Callable[[], T], timeout: float = 20.0) -> T:
    """Poll ``check()`` (a state of the process table or the agent) until it is true, bounded;
    return that true value.

    Once true, done: never asked again, and what it saw is returned for the caller to use (a
    second look, in a process's ``exec``, read its command line empty: a true state failed a
    test, or left it nothing to check).
    """
    try:
        with anyio.fail_after(timeout):
            # The process table has no change events: poll it, bounded by the deadline.
            while not (seen := check()):  # noqa: ASYNC110
                await anyio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"{what}: not within {timeout:g} s") from None
    return seen


def reaped_unrecorded(dirs: list[Path], pids: list[int]) -> list[str]:
    """Job dirs whose leader is reaped (no ``/proc/PID``; pid 0: take it as reaped) while their
    job.json has no end yet."""
    return [
        d.name
        for d, pid in zip(dirs, pids, strict=True)
        if not (pid and os.path.exists(f"/proc/{pid}")) and b'"end"' not in (d / "job.json").read_bytes()
    ]


def stat_state(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return b""


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def parent(pid: int) -> int:
    """The parent pid of ``pid`` (0 once it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])
    except OSError:
        return 0


def agent_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def test_kill_9_agent_jobs_live_on_and_are_readopted(fresh_agent_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "ticks.txt"
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}", response_margin=1.0) as sb:
        old = sb.info
        assert old.keeper_pid is not None
        ticks = sb.exec_remote(["sh", "-c", TICKS.format(out=out)])
        sleeper = sb.exec_remote(["sleep", "3011"])
        # Ends as soon as the agent is gone: its exit is recorded by the keeper, not the agent.
        gone = sb.exec_remote(["sh", "-c", f"while kill -0 {old.pid} 2>/dev/null; do sleep 0.01; done; exit 7"])
        await sleeper.started()
        await gone.started()
        received = b""
        async for ev in ticks:
            if isinstance(ev, rx.StdoutChunk):
                received += ev.data.encode() if isinstance(ev.data, str) else ev.data
                if received.count(b"\n") == 5:
                    os.kill(old.pid, signal.SIGKILL)  # the agent, not the keeper
            elif isinstance(ev, rx.Completed):
                assert ev.exit_code == 5
        assert hashlib.sha256(received).hexdigest() == hashlib.sha256(out.read_bytes()).hexdigest()
        assert received.count(b"\n") == 60
        new = await sb.server_info()
        assert new.pid != old.pid and new.keeper_pid == old.keeper_pid
        states = {j.job_id: j.state for j in await sb.jobs()}
        assert states[sleeper.job_id or ""] == "running"
        assert (await gone.wait()).returncode == 7  # ended while no agent ran, or just after
        await sleeper.kill()  # a re-adopted job: its agent did not start it
        assert procs_with("sleep 3011") == []


async def test_exit_codes_survive_an_agent_killed_as_jobs_exit(fresh_agent_dir: Path, tmp_path: Path) -> None:
    """Jobs exit in one burst while the agent is frozen again and again: no job is ever reaped
    before its end is on disk (the agent writes it down first; a zombie it did not reap is reaped
    and recorded by the keeper), so the agent SIGKILLed after that loses no exit code."""
    n = 40
    gate = tmp_path / "gate"
    gate.touch()
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}", response_margin=1.0) as sb:
        old = sb.info.pid
        with gate.open("rb") as held:
            fcntl.flock(held, fcntl.LOCK_EX)  # the jobs wait on it: released, they all end at once
            jobs = [
                sb.exec_remote(["sh", "-c", f"flock -s {gate} true; touch {tmp_path}/done.{i}; exit {i + 3}"])
                for i in range(n)
            ]
            for job in jobs:
                await job.started()
            # While they exit, freeze the agent again and again: at no instant may a job be reaped
            # (its pid gone) without its end in its job.json, or an agent killed then loses it.
            dirs = [job_dir(fresh_agent_dir, job.job_id or "") for job in jobs]
            pids = [job.pid or 0 for job in jobs]
        violations: list[str] = []
        with anyio.fail_after(30):
            while len(reaped_unrecorded(dirs, [0] * n)) > 0:  # pid 0: "reaped", so "not ended yet"
                os.kill(old, signal.SIGSTOP)
                await wait_until("the agent is stopped", lambda: stat_state(old) == b"T")
                violations += reaped_unrecorded(dirs, pids)
                os.kill(old, signal.SIGCONT)
                await anyio.lowlevel.checkpoint()
        assert violations == []
        os.kill(old, signal.SIGKILL)  # every job ended: the next agent reads their ends
        codes = [(await job.wait()).returncode for job in jobs]
        assert codes == [i + 3 for i in range(n)]
        assert (await sb.server_info()).pid != old


async def test_job_ids_are_never_reused_after_a_restart(fresh_agent_dir: Path) -> None:
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}", response_margin=1.0) as sb:
        first = await sb.exec_remote(["true"]).wait()
        first_dir = job_dir(fresh_agent_dir, first.job_id).name  # the agent's own name: <state id>-<n>
        await sb.forget(first.job_id)  # no job dir left to count from
        old = sb.info.pid
        os.kill(old, signal.SIGKILL)
        second = await sb.exec_remote(["true"]).wait()  # reconnects to the keeper's next agent
        assert (await sb.server_info()).pid != old
    prefix, _, n = first_dir.rpartition("-")
    assert job_dir(fresh_agent_dir, second.job_id).name == f"{prefix}-{int(n) + 1}"


async def test_a_shell_that_cannot_be_readopted_says_so(fresh_agent_dir: Path) -> None:
    """Shell sessions outlive the agent (see test_durable_shell.py), but one whose record is gone
    cannot be re-adopted: the next agent ends it, and the run in progress and the session each
    raise an error naming them and saying why, at once."""
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}", response_margin=1.0) as sb:
        sh = await sb.shell()
        proc = sh.start("echo running; sleep 300")
        assert await anext(aiter(proc)) == rx.StdoutChunk("running\n")
        bash = sh.pid
        # This run's own sleep, by its parent: "sleep 300" alone also names other tests' jobs
        # (a session-wide agent's, or another suite's on a shared machine), which made this
        # test fail under load while it passed alone.
        # ("running" comes before bash has started the sleep: wait for the sleep itself)
        await wait_until("the run's sleep", lambda: [pid for pid in procs_with("sleep 300") if parent(pid) == bash])
        sleeps = [pid for pid in procs_with("sleep 300") if parent(pid) == bash]
        assert len(sleeps) == 1, sleeps
        for slot in ("session.0.json", "session.1.json"):
            (fresh_agent_dir / "shells" / sh.session_id / slot).unlink()
        os.kill(sb.info.pid, signal.SIGKILL)
        with anyio.fail_after(30):
            with pytest.raises(
                rx.AgentLostError, match=f"was a run of shell {sh.session_id}, which an earlier"
            ) as lost:
                await proc.wait()
            assert lost.value.data["session_id"] == sh.session_id
            with pytest.raises(rx.AgentLostError, match=f"shell {sh.session_id} was not re-adopted"):
                await sh.run("pwd")
        await wait_until("the shell and its run are gone", lambda: not alive(bash) and not alive(sleeps[0]))
        assert not (fresh_agent_dir / "shells" / sh.session_id).exists()


async def test_stdin_survives_the_agent(fresh_agent_dir: Path) -> None:
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}", response_margin=1.0) as sb:
        cat = sb.exec_remote(["cat"], stdin_open=True)
        await cat.write_stdin("before\n")
        assert await anext(aiter(cat)) == rx.StdoutChunk("before\n")
        os.kill(sb.info.pid, signal.SIGKILL)
        await cat.write_stdin("after\n")  # reconnects; the new agent writes to the kept pipe
        assert await anext(aiter(cat)) == rx.StdoutChunk("after\n")
        await cat.close_stdin()
        with anyio.fail_after(20):
            res = await cat.wait()
    assert res.stdout == "before\nafter\n" and res.returncode == 0


def test_disk_cap_drops_the_head_with_an_exact_count(fresh_agent_dir: Path) -> None:
    with rx.connect(f"local://?dir={fresh_agent_dir}"):
        pass
    sock = fresh_agent_dir / "agent.sock"
    line = "x" * 99 + "\n"  # 100-byte lines: the byte at offset n is known
    script = f"import sys\nfor i in range(50000): sys.stdout.write('{line[:-1]}\\n')"
    cap = 256 * 1024
    job = rpc(sock, "exec_remote_start", {"command": [sys.executable, "-c", script], "output_cap": cap})
    job_id = job["result"]["job_id"]
    offset = 0
    for _ in range(1000):  # follow to the end (long polls), skipping what the cap drops meanwhile
        r = rpc(sock, "exec_remote_poll", {"job_id": job_id, "stdout_offset": offset, "wait": 5})["result"]
        offset = r["stdout_offset"]
        if r["state"] != "running":
            break
    size = 50000 * 100
    first = rpc(sock, "exec_remote_poll", {"job_id": job_id, "max_bytes": 4096})["result"]
    dropped = first["stdout_dropped"]
    assert size - cap - 4096 < dropped <= size - cap  # the head went, in 4 KiB blocks
    assert first["stdout_offset"] == dropped + len(first["stdout"])
    assert first["stdout"] == (line * 50)[dropped % 100 :][: len(first["stdout"])]
    later = rpc(sock, "exec_remote_poll", {"job_id": job_id, "stdout_offset": size - 250, "max_bytes": 4096})
    assert later["result"]["stdout"] == (line * 3)[50:] and later["result"]["stdout_dropped"] == 0
    files = job_dir(fresh_agent_dir, job_id)
    assert os.stat(files / "stdout").st_blocks * 512 <= cap + 64 * 1024  # the blocks were freed
    assert oct(os.stat(files).st_mode & 0o777) == "0o700" and oct(os.stat(files / "stdout").st_mode & 0o777) == "0o600"


TREE = (
    "trap 'sleep {t}3 &' TERM; setsid sleep {t}1 & "
    + sys.executable
    + ' -c \'import subprocess; subprocess.Popen(["sleep", "{t}2"], start_new_session=True)\'; '
    "echo ready; while true; do sleep 0.05; done"
)


async def test_kill_ends_the_whole_tree(agent_dir: Path) -> None:
    async with rx.open_sandbox(f"local://?dir={agent_dir}") as sb:
        proc = sb.exec_remote(["bash", "-c", TREE.format(t=4100)], kill_grace=0.5)
        assert await anext(aiter(proc)) == rx.StdoutChunk("ready\n")
        await wait_until("both escaped", lambda: procs_with("sleep 41001") and procs_with("sleep 41002"))
        await proc.kill()
        assert procs_with("sleep 4100") == []  # own-session ones and the one the TERM trap started


async def test_timeout_ends_the_whole_tree(agent_dir: Path) -> None:
    async with rx.open_sandbox(f"local://?dir={agent_dir}") as sb:
        proc = sb.exec_remote(["bash", "-c", TREE.format(t=4200)], timeout=1.5, kill_grace=0.3)
        with pytest.raises(rx.ExecTimeoutError):
            await proc.wait()
        assert procs_with("sleep 4200") == []


async def test_leftovers_are_listed_and_killable(agent_dir: Path) -> None:
    async with rx.open_sandbox(f"local://?dir={agent_dir}") as sb:
        proc = sb.exec_remote(["sh", "-c", "sleep 4301 & echo started"])
        res = await proc.wait()
        assert res.stdout == "started\n" and res.returncode == 0
        [info] = [j for j in await sb.jobs() if j.job_id == proc.job_id]
        assert info.state == "completed" and info.leftovers == procs_with("sleep 4301") != []
        await proc.kill()
        assert procs_with("sleep 4301") == []


async def test_shutdown_ends_everything(fresh_agent_dir: Path) -> None:
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}") as sb:
        proc = sb.exec_remote(["bash", "-c", TREE.format(t=4400)])
        assert await anext(aiter(proc)) == rx.StdoutChunk("ready\n")
        left = sb.exec_remote(["sh", "-c", "sleep 44004 & echo started"])
        await left.wait()
        keeper = sb.info.keeper_pid
        os.kill(sb.info.pid, signal.SIGTERM)  # an explicit shutdown
    await wait_until("keeper gone", lambda: not alive(keeper or 0))
    assert procs_with("sleep 4400") == []


async def test_upgrade_hands_jobs_over(fresh_agent_dir: Path, tmp_path: Path) -> None:
    agent = [sys.executable, "-m", "remote_exec.agent"]
    old = await anyio.run_process([*agent, "ensure", "--dir", str(fresh_agent_dir), "--report-version", "0.0.1-old"])
    assert json.loads(old.stdout)["result"]["version"] == "0.0.1-old"
    out = tmp_path / "ticks.txt"
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}", response_margin=1.0) as sb:
        old_pid = sb.info.pid
        ticks = sb.exec_remote(["sh", "-c", TICKS.format(out=out)])
        received = b""
        async for ev in ticks:
            if isinstance(ev, rx.StdoutChunk):
                received += ev.data.encode() if isinstance(ev.data, str) else ev.data
                if received.count(b"\n") == 3:
                    new = await anyio.run_process([*agent, "ensure", "--dir", str(fresh_agent_dir)])
                    info = json.loads(new.stdout)["result"]
                    assert info["version"] == rx.__version__ and info["pid"] != old_pid
            elif isinstance(ev, rx.Completed):
                assert ev.exit_code == 5
        assert received == out.read_bytes()


async def test_agent_rss_does_not_grow_with_unwatched_output(fresh_agent_dir: Path) -> None:
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}") as sb:
        await sb.run(["true"])
        before = agent_rss(sb.info.pid)
        proc = sb.exec_remote(["sh", "-c", "head -c 50000000 /dev/zero; echo"])
        job_id = proc.detach() or (await proc.started()).job_id
        assert job_id is not None

        async def done() -> bool:
            return any(j.job_id == job_id and j.state == "completed" for j in await sb.jobs())

        with anyio.fail_after(60):
            while not await done():  # noqa: ASYNC110  (a state of the agent, asked for)
                await anyio.sleep(0.05)
        grown = agent_rss(sb.info.pid) - before
        assert grown < 4 * 1024 * 1024, f"agent RSS grew by {grown} bytes"
        assert (job_dir(fresh_agent_dir, job_id) / "stdout").stat().st_size == 50_000_001


async def test_the_next_jobs_dir_is_made_ahead(fresh_agent_dir: Path) -> None:
    """A start renames a ready, private, empty dir into place (no mkdir or create on its path;
    nor on the path of its first output, which notes a time index, and its end, which writes a
    record through a temporary file: made ahead too); the next one is made after it, and a
    killed agent's spare is replaced, not used."""
    spare = fresh_agent_dir / "jobs.spare"
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}", response_margin=1.0) as sb:
        await wait_until("a spare is ready", spare.exists)
        # Made in a thread while the agent binds its sockets: 0700 (a umask lowered around the
        # bind once made it 0600 some of the time).
        assert oct(os.stat(spare).st_mode & 0o777) == "0o700"
        ino = os.stat(spare).st_ino
        ahead = {name: os.stat(spare / name).st_ino for name in ("stdout.times", "job.json.tmp")}
        proc = sb.exec_remote(["echo", "hi"])
        await proc.wait()
        done = job_dir(fresh_agent_dir, proc.job_id or "")
        assert os.stat(done).st_ino == ino  # the spare became the job's dir
        assert os.stat(done / "stdout.times").st_ino == ahead["stdout.times"]  # noted into, not created
        assert os.stat(done / "job.json").st_ino == ahead["job.json.tmp"]  # the end's record, renamed into place
        await wait_until("the next spare", lambda: spare.exists() and os.stat(spare).st_ino != ino)
        assert oct(os.stat(spare).st_mode & 0o777) == "0o700"
        for name in ("stdout", "stderr", "job.json", "stdout.times", "stderr.times", "job.json.tmp"):
            assert oct(os.stat(spare / name).st_mode & 0o777) == "0o600" and (spare / name).stat().st_size == 0
        (spare / "stale").write_bytes(b"")
        os.kill(sb.info.pid, signal.SIGKILL)
        with anyio.fail_after(30):
            await sb.server_info()  # reconnects to the keeper's next agent
        await wait_until("a fresh spare", lambda: spare.exists() and not (spare / "stale").exists())
        made = ["job.json", "job.json.tmp", "stderr", "stderr.times", "stdout", "stdout.times"]
        assert sorted(p.name for p in spare.iterdir()) == made
        assert not spare.with_name("jobs.spare.new").exists()  # made aside, renamed into place whole
        meta = json.loads((job_dir(fresh_agent_dir, proc.job_id or "") / "job.json").read_bytes())
        assert meta["client_id"] == proc.job_id and meta["end"]["exit_code"] == 0  # first record, then the end


async def test_the_keeper_applies_the_cap_while_no_agent_runs(fresh_agent_dir: Path, tmp_path: Path) -> None:
    """During a handover (no agent until the next one is started) a job writes 4 MiB past its
    256 KiB cap: the keeper punches the head out; the next agent reports exactly what went."""
    from remote_exec.agent.keeperlink import keeper_call

    from ..conftest import wait_exit

    go, wrote = tmp_path / "go", tmp_path / "wrote"
    cap, size = 256 * 1024, 4 * 1024 * 1024
    script = (
        f"while [ ! -e {go} ]; do sleep 0.02; done; head -c {size} /dev/zero | tr '\\0' a; touch {wrote}; sleep 300"
    )
    url = f"local://?dir={fresh_agent_dir}"
    async with rx.open_sandbox(url) as sb:
        proc = await sb.exec_remote(["sh", "-c", script], output_cap=cap).started()
        proc.detach()  # it runs on after this client closes
        agent = sb.info.pid
    rpc(fresh_agent_dir / "agent.sock", "server_handover")
    assert wait_exit(agent, 30)
    go.touch()
    await wait_until("the job wrote", wrote.exists, 30)
    stdout = job_dir(fresh_agent_dir, proc.job_id or "") / "stdout"
    await wait_until("the keeper punched", lambda: stdout.stat().st_blocks * 512 <= cap + 64 * 1024, 30)
    hello = keeper_call(fresh_agent_dir, {"op": "hello"}, 10.0)
    assert hello is not None and hello["agent_pid"] == 0  # it was the keeper: no agent ran
    async with rx.open_sandbox(url) as sb:  # the next agent, started by this connect
        head = await sb.read_output(proc.job_id or "", max_bytes=4096)
        assert size - cap - 4096 < head.dropped <= size - cap and head.offset == head.dropped
        assert head.data == b"a" * len(head.data) and len(head.data) > 0
        await (await sb.attach(proc.job_id or "")).kill()


async def test_a_job_that_ends_while_agent_and_keeper_are_gone_is_lost_not_completed(
    fresh_agent_dir: Path, tmp_path: Path
) -> None:
    """Nothing can record the exit of a job that ends while neither the agent nor its keeper
    runs (both SIGKILLed): the next agent says so, ``lost`` with the reason, never ``completed``
    with no exit code (which the views showed as a plain failure)."""
    from ..conftest import wait_exit

    go = tmp_path / "go"
    url = f"local://?dir={fresh_agent_dir}"
    async with rx.open_sandbox(url) as sb:
        proc = await sb.exec_remote(["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done; exit 7"]).started()
        proc.detach()
        agent, keeper, job_pid = sb.info.pid, sb.info.keeper_pid, proc.pid or 0
    assert keeper is not None
    os.kill(keeper, signal.SIGKILL)
    os.kill(agent, signal.SIGKILL)
    assert wait_exit(keeper, 30) and wait_exit(agent, 30)
    go.touch()
    await wait_until("the job ended", lambda: not alive(job_pid), 30)
    async with rx.open_sandbox(url) as sb:  # a new keeper and agent, which find the job's record
        [info] = [j for j in await sb.jobs() if j.job_id == proc.job_id]
        assert (info.state, info.exit_code) == ("lost", None)
        assert info.reason is not None and "neither the agent nor its keeper ran" in info.reason
        result = await (await sb.attach(proc.job_id or "")).wait()
    assert (result.state, result.returncode, result.success, result.reason) == ("lost", -1, False, info.reason)
