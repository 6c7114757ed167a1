"""Files a job can write in the state dir are hostile input (issue #21, points 7 and 8).

Jobs run as the agent's user, so every file the agent keeps for them can be replaced. With a real
``local://`` agent and its keeper: the agent hands over (jobs stay, no agent runs), the state dir
is poisoned as a job could (``jobs/counter`` and an ended job's ``stdin_bytes`` as symlinks to
``/dev/zero``, a ``job.json`` replaced by a FIFO, ``trash`` as a symlink to an outside dir, a
forged ``job.json`` naming an outside process), and the next agent must serve the good jobs (one
finished, one running), leave the outside dir and process alone, and name each skipped path in
``agent.log``. Then a job's sparse 256 MiB stdout must not make the log budget punch out other
finished jobs' output.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

import remote_exec as rx
from remote_exec.agent.procfacts import proc_starttime
from tests.agent.rawhttp import rpc

from ..conftest import job_dir, wait_exit
from .conftest import Adversary

pytestmark = pytest.mark.anyio


def poison(path: Path, how: str) -> None:
    """Replace ``path`` as a job could: by a symlink to ``how`` or, for ``"fifo"``, a FIFO."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    if how == "fifo":
        os.mkfifo(path, 0o600)
    else:
        path.symlink_to(how)


@pytest.fixture
def victim() -> Iterator[subprocess.Popen[bytes]]:
    """An outside process group: nothing of the agent's (the forged job.json names it)."""
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


async def test_a_poisoned_state_dir_is_served(
    fresh_agent_dir: Path, tmp_path: Path, victim: subprocess.Popen[bytes], adversary: Adversary
) -> None:
    d, url = fresh_agent_dir, f"local://?dir={fresh_agent_dir}"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "canary").write_text("keep me")
    async with rx.open_sandbox(url) as sb:
        done = await sb.exec_remote(["sh", "-c", "echo finished"]).started()
        assert (await done.wait()).stdout == "finished\n"
        fed = await sb.exec_remote(["cat"], stdin_open=True).started()
        await fed.write_stdin("fed\n")
        await fed.close_stdin()
        assert (await fed.wait()).stdout == "fed\n"
        fifo = await sb.exec_remote(["sh", "-c", "echo fifo"]).started()
        await fifo.wait()
        running = await sb.exec_remote(["sh", "-c", "echo running; exec sleep 300"]).started()
        running.detach()
        agent = sb.info.pid
    jobs = d / "jobs"
    ids = {"done": done.job_id or "", "fed": fed.job_id or "", "fifo": fifo.job_id or ""}
    dirs = {k: job_dir(d, v) for k, v in ids.items()}  # named by the agent, not the client's id
    running_id = running.job_id or ""
    running_dir = job_dir(d, running_id)
    await anyio.to_thread.run_sync(rpc, d / "agent.sock", "server_handover")
    assert await anyio.to_thread.run_sync(wait_exit, agent, 30.0)

    poison(jobs / "counter", "/dev/zero")
    poison(dirs["fed"] / "stdin_bytes", "/dev/zero")
    poison(dirs["fifo"] / "job.json", "fifo")
    poison(d / "trash", os.fspath(outside))
    forged = jobs / f"{running_dir.name.rsplit('-', 1)[0]}-99999"
    forged.mkdir(mode=0o700)
    start = proc_starttime(victim.pid)
    meta = {"job_id": forged.name, "command": "sleep 300", "pid": victim.pid, "starttime": start}
    (forged / "job.json").write_text(json.dumps({**meta, "started_at": time.time() - 100, "timeout": 0.1}))
    # The same, ended, with a start time before the victim's: its leftovers' end at the timeout
    # once took every process of the session the record names (the victim's).
    ended = jobs / f"{running_dir.name.rsplit('-', 1)[0]}-99998"
    ended.mkdir(mode=0o700)
    meta2 = {**meta, "job_id": ended.name, "starttime": 1, "started_at": time.time() - 100, "timeout": 0.1}
    (ended / "job.json").write_text(json.dumps(meta2))

    with anyio.fail_after(60):  # the FIFO blocked the next agent for good; /dev/zero filled its memory
        async with rx.open_sandbox(url) as sb:
            listed = {j.job_id: j for j in await sb.jobs()}
            checks = {
                "done listed": listed[ids["done"]].exit_code == 0,
                "done read": (await sb.read_output(ids["done"])).data == b"finished\n",
                "fed read": (await sb.read_output(ids["fed"])).data == b"fed\n",
                "running listed": listed[running_id].state == "running",
                "running read": (await sb.read_output(running_id)).data == b"running\n",
            }
            served = all(checks.values())
            forged_state = listed[forged.name].state if forged.name in listed else None
            await (await sb.attach(running_id)).kill()
            fresh = await sb.exec_remote(["true"]).started()  # the counter is written afresh
            await fresh.wait()
            assert fresh.job_id not in ids.values() and fresh.job_id not in (running_id, forged.name)
    # The forged job is listed as ended (never re-adopted): the victim was never signalled.
    victim_alive = victim.poll() is None and forged_state != "running"
    log = (d / "agent.log").read_text(errors="replace")
    cases = [
        ("jobs/counter -> /dev/zero", f"skipped {jobs / 'counter'}: a symlink" in log),
        ("an ended job's stdin_bytes -> /dev/zero", f"skipped {dirs['fed']}/stdin_bytes: a symlink" in log),
        ("job.json replaced by a FIFO", f"{dirs['fifo'] / 'job.json'}: not a regular file" in log),
        (
            "trash -> an outside dir",
            f"skipped {d / 'trash'}: a symlink" in log and os.listdir(outside) == ["canary"],
        ),
        (
            "a forged job.json names an outside process",
            victim_alive and f"skipped {forged / 'job.json'}: pid {victim.pid} is not a process" in log,
        ),
        ("an ended forged job.json names an outside session", victim_alive),
    ]
    for case, refused in cases:
        adversary.tried("state files", case, refused=refused and served)
    assert served, (checks, log)
    assert all(refused for _, refused in cases), (cases, log[-3000:])
    assert not (d / "trash").is_symlink() and (jobs / "counter").is_file()  # replaced, written afresh


async def test_a_sparse_log_does_not_evict_other_jobs(fresh_agent_dir: Path, adversary: Adversary) -> None:
    """A job makes its stdout 256 MiB long with 40 KiB on disk; the log budget (1 MiB here) counts
    the blocks, so the three finished jobs before it keep their output. (256 times the budget
    proves the point as well as 20 GB did, and the client streams 80 times fewer zeros.)"""
    url = f"local://?dir={fresh_agent_dir}&log_budget={1 << 20}"
    async with rx.open_sandbox(url) as sb:
        before = []
        for i in range(3):
            proc = await sb.exec_remote(["sh", "-c", f"head -c 65536 /dev/zero | tr '\\0' {i}"]).started()
            await proc.wait()
            before.append(proc.job_id or "")
        sparse = await sb.exec_remote(
            ["sh", "-c", "head -c 40960 /dev/zero | tr '\\0' s; truncate -s 256M /dev/stdout"]
        ).started()
        await sparse.wait()  # its end reads its final size and applies the budget
        size = (job_dir(fresh_agent_dir, sparse.job_id or "") / "stdout").stat().st_size
        assert size == 256 << 20
        kept = []
        for i, job_id in enumerate(before):
            got = await sb.read_output(job_id, max_bytes=1 << 20)
            kept.append(got.dropped == 0 and got.data == str(i).encode() * 65536)
    adversary.tried("log budget", "a sparse 256 MiB stdout evicts other jobs' output", refused=all(kept))
    assert all(kept), kept


async def test_a_job_cannot_point_the_running_agents_trash_outside(
    fresh_agent_dir: Path, tmp_path: Path, adversary: Adversary
) -> None:
    """A job replaces ``trash`` by a symlink to an outside dir while the agent runs; then a job
    is forgotten (its dir goes to the trash, and the trash is emptied)."""
    d = fresh_agent_dir
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "canary").write_text("keep me")
    async with rx.open_sandbox(f"local://?dir={d}") as sb:
        old = await sb.run(["echo", "old"])
        await sb.run(["sh", "-c", f"rm -rf {d}/trash && ln -s {outside} {d}/trash"])
        old_dir = job_dir(d, old.job_id or "")
        assert old_dir.is_dir()
        await sb.forget(old.job_id or "")
        assert not old_dir.exists()

        def anywhere() -> list[str]:
            """Where the forgotten dir still is (renamed ``<id>.<pid>.<n>``), inside or outside."""
            places = [p for p in (d / "trash", outside) if p.is_dir()]
            return [n for p in places for n in os.listdir(p) if n.startswith(f"{old_dir.name}.")]

        with anyio.fail_after(30):
            while anywhere():  # noqa: ASYNC110 (a thread of the agent deletes it: no event reaches us)
                await anyio.sleep(0.02)
    log = (d / "agent.log").read_text(errors="replace")
    refused = os.listdir(outside) == ["canary"] and f"skipped {d / 'trash'}: a symlink" in log
    adversary.tried("state files", "trash -> an outside dir, swapped while the agent runs", refused=refused)
    assert refused, (os.listdir(outside), log[-2000:])


async def test_a_forged_session_record_names_no_outside_process(
    fresh_agent_dir: Path, victim: subprocess.Popen[bytes], adversary: Adversary
) -> None:
    """A shell session's record names an outside process (pid and its true start time) as its
    shell: the next agent neither re-adopts the session with it nor signals it."""
    from remote_exec.agent.shell.record import SLOTS, read_record

    d, url = fresh_agent_dir, f"local://?dir={fresh_agent_dir}"
    async with rx.open_sandbox(url) as sb:
        sh = await sb.shell()
        assert (await sh.run("echo hi")).stdout == "hi\n"
        agent = sb.info.pid
    await anyio.to_thread.run_sync(rpc, d / "agent.sock", "server_handover")
    assert await anyio.to_thread.run_sync(wait_exit, agent, 30.0)
    path = d / "shells" / sh.session_id
    record = read_record(path)
    record.update(pid=victim.pid, starttime=proc_starttime(victim.pid), seq=int(record["seq"]) + 1)
    for slot in SLOTS:
        (path / slot).write_text(json.dumps(record))
    async with rx.open_sandbox(url) as sb:
        adopted = [s.session_id for s in await sb.shells()]
    log = (d / "agent.log").read_text(errors="replace")
    refused = (
        sh.session_id not in adopted
        and victim.poll() is None
        and f"skipped {path} (shell {sh.session_id}): pid {victim.pid} is not a process the keeper started" in log
    )
    adversary.tried("state files", "a forged session record names an outside process", refused=refused)
    assert refused, (adopted, log[-2000:])


async def test_a_session_output_swapped_for_a_fifo(fresh_agent_dir: Path, adversary: Adversary) -> None:
    """A shell's ``out`` file replaced by a FIFO: the next agent ends that session and serves."""
    d, url = fresh_agent_dir, f"local://?dir={fresh_agent_dir}"
    async with rx.open_sandbox(url) as sb:
        sh = await sb.shell()
        assert (await sh.run("echo hi")).stdout == "hi\n"
        kept = await sb.run(["echo", "kept"])
        agent = sb.info.pid
    await anyio.to_thread.run_sync(rpc, d / "agent.sock", "server_handover")
    assert await anyio.to_thread.run_sync(wait_exit, agent, 30.0)
    out = d / "shells" / sh.session_id / "out"
    poison(out, "fifo")
    with anyio.fail_after(60):  # open() of the FIFO blocked the next agent for good
        async with rx.open_sandbox(url) as sb:
            adopted = [s.session_id for s in await sb.shells()]
            served = (await sb.read_output(kept.job_id or "")).data == b"kept\n"
    log = (d / "agent.log").read_text(errors="replace")
    refused = served and sh.session_id not in adopted and f"{out} is not a regular file" in log
    adversary.tried("state files", "a shell's out file replaced by a FIFO", refused=refused)
    assert refused, (adopted, log[-2000:])


async def test_files_the_running_agent_writes_for_a_job_cannot_block_it(
    fresh_agent_dir: Path, adversary: Adversary
) -> None:
    """What the agent writes while a job runs (``stdin_bytes`` at each write, ``job.json`` through
    ``job.json.tmp``, ``jobs/counter`` at each start) replaced as the job could, by a FIFO (an
    ``open`` for writing waited for a reader: one job froze the agent for every client) or a
    FIFO the job holds open, or a hard link to another file (``O_TRUNC`` emptied it): the agent
    answers, the job's stdin and record stay right, and the other file is untouched."""
    d, url = fresh_agent_dir, f"local://?dir={fresh_agent_dir}"
    other = d.parent / "not-the-agents"
    other.write_text("keep me")
    async with rx.open_sandbox(url) as sb:
        cat = await sb.exec_remote(["cat"], stdin_open=True).started()
        await cat.write_stdin("one\n")
        where = job_dir(d, cat.job_id or "")
        poison(where / "stdin_bytes", "fifo")
        poison(where / "job.json.tmp", "fifo")
        poison(d / "jobs" / "counter", "fifo")
        held = os.open(where / "job.json.tmp", os.O_RDWR | os.O_NONBLOCK)  # a reader: opens succeed
        try:
            with anyio.fail_after(30):  # (each blocked the agent for good)
                await cat.write_stdin("two\n")
                started = await sb.exec_remote(["echo", "started"]).started()
                started_ok = (await started.wait()).stdout == "started\n"
                (where / "stdin_bytes").unlink()
                os.link(other, where / "stdin_bytes")  # a hard link: the cursor is written elsewhere
                await cat.write_stdin("three\n")
                await cat.close_stdin()
                result = await cat.wait()  # its end is written through job.json.tmp
        finally:
            os.close(held)
        listed = {j.job_id: j for j in await sb.jobs()}
    record = json.loads((where / "job.json").read_text())
    log = (d / "agent.log").read_text(errors="replace")
    tmp = where / "job.json.tmp"
    cases = [
        ("stdin_bytes replaced by a FIFO", f"skipped {where / 'stdin_bytes'}: not a regular file" in log),
        ("job.json.tmp replaced by a FIFO the job holds open", f"skipped {tmp}: not a private" in log),
        ("jobs/counter replaced by a FIFO", started_ok and (d / "jobs" / "counter").is_file()),
        ("stdin_bytes hard-linked to another file", other.read_text() == "keep me"),
    ]
    served = result.stdout == "one\ntwo\nthree\n" and listed[cat.job_id or ""].state == "completed"
    served = served and record.get("end", {}).get("state") == "completed"
    for case, refused in cases:
        adversary.tried("state files", case, refused=refused and served)
    assert served, (result, record, log[-2000:])
    assert all(refused for _, refused in cases), (cases, log[-3000:])


async def test_a_shell_runs_stdin_cursor_swapped_for_a_fifo(fresh_agent_dir: Path, adversary: Adversary) -> None:
    """A shell run's ``stdin_bytes`` (written at each write) replaced by a FIFO: the agent answers."""
    d, url = fresh_agent_dir, f"local://?dir={fresh_agent_dir}"
    async with rx.open_sandbox(url) as sb, await sb.shell() as sh:
        run = sh.start("cat", stdin_open=True)
        await run.write_stdin("one\n")
        where = job_dir(d, run.job_id or "")
        poison(where / "stdin_bytes", "fifo")
        with anyio.fail_after(30):  # (it blocked the agent for good)
            await run.write_stdin("two\n")
            await run.close_stdin()
            result = await run.wait()
    log = (d / "agent.log").read_text(errors="replace")
    refused = result.stdout == "one\ntwo\n" and f"skipped {where / 'stdin_bytes'}: not a regular file" in log
    adversary.tried("state files", "a shell run's stdin_bytes replaced by a FIFO", refused=refused)
    assert refused, (result, log[-2000:])
