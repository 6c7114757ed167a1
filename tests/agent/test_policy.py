"""Job policies enforced by a real agent: a dead client, silence, limits and watch rules.

Each test starts the job through the public API and checks what the agent did by itself: the
job's state and exit, the ``reason`` in the result and in ``jobs()``, the recorded watch hits.
"""

from __future__ import annotations

import functools
import os
import sys
import textwrap
import time
from pathlib import Path

import anyio
import pytest

import remote_exec as rx
from remote_exec.agent.jobs.policy import TICK
from remote_exec.protocol import MAX_WAIT

from ..conftest import agent_killed, sigkilled_client
from .rawhttp import rpc

pytestmark = pytest.mark.anyio

# The job waits for a file the test creates (an event, not a sleep) before printing.
WAIT_GO = 'while [ ! -e "$GO" ]; do sleep 0.05; done; '


async def _info(sb: rx.AsyncSandbox, job_id: str) -> rx.JobInfo:
    return next(j for j in await sb.jobs() if j.job_id == job_id)


async def _until(sb: rx.AsyncSandbox, job_id: str, what: str, ok: object, timeout: float = 60) -> rx.JobInfo:
    """The job's record once ``ok(info)`` holds (the agent acts within a tick: a bounded wait)."""
    assert callable(ok)
    with anyio.fail_after(timeout):
        while True:
            info = await _info(sb, job_id)
            if ok(info):
                return info
            await anyio.sleep(0.05)  # re-read the record; the deadline above bounds the wait


async def _ready(proc: rx.ExecRemoteProcess) -> None:
    with anyio.fail_after(60):
        async for ev in proc:
            assert isinstance(ev, rx.StdoutChunk) and isinstance(ev.data, str) and ev.data.startswith("ready")
            return


async def test_watch_rule_kills_with_no_client_attached(agent_dir: Path, tmp_path: Path) -> None:
    go = tmp_path / "go"
    rule = rx.WatchRule(pattern=r"loss (nan|inf)", action="kill", stream="stdout")
    cmd = WAIT_GO + "echo 'loss 0.5'; echo 'loss nan'; exec sleep 300"
    async with rx.open_sandbox(f"local://?dir={agent_dir}") as sb:
        proc = await sb.exec_remote(cmd, env={"GO": str(go)}, policy=rx.JobPolicy(on_output=[rule])).started()
        job_id = proc.detach()
        assert job_id is not None
    go.touch()  # the job prints only now: no client is connected
    async with rx.open_sandbox(f"local://?dir={agent_dir}") as sb:
        info = await _until(sb, job_id, "killed", lambda i: i.state != "running")
        result = await (await sb.attach(job_id)).wait()
    assert info.state == "killed" and result.state == "killed"
    assert result.reason == info.reason and info.reason is not None
    assert info.reason.startswith("killed: watch rule 0 matched") and "on stdout at byte 9" in info.reason
    (hit,) = info.hits
    assert (hit.rule, hit.action, hit.stream, hit.offset, hit.line) == (0, "kill", "stdout", 9, "loss nan")
    assert info.hits_total == 1 and result.stdout == "loss 0.5\nloss nan\n"


async def test_notify_rule_records_hits_and_the_job_runs_on(agent_dir: Path) -> None:
    rules = [rx.WatchRule(pattern="Traceback"), rx.WatchRule(pattern="^error:", stream="stderr", once=True)]
    code = "echo ready; echo 'Traceback (most recent call last):'; echo 'error: one' >&2; echo 'error: two' >&2; cat"
    async with rx.open_sandbox(f"local://?dir={agent_dir}") as sb:
        proc = sb.exec_remote(code, stdin_open=True, policy=rx.JobPolicy(on_output=rules))
        await _ready(proc)
        assert proc.job_id is not None
        info = await _until(sb, proc.job_id, "hits", lambda i: i.hits_total >= 2)
        assert [(h.rule, h.stream, h.offset, h.action) for h in info.hits] == [
            (0, "stdout", 6, "notify"),
            (1, "stderr", 0, "notify"),  # once: "error: two" is not a hit
        ]
        assert info.state == "running" and info.reason is None
        await proc.close_stdin()
        result = await proc.wait()
        assert result.success and result.reason is None and proc.hits == 2


@pytest.mark.parametrize("last", ["echo nan", "printf nan"], ids=["line", "no-newline"])
async def test_a_hit_on_the_last_line_is_in_the_final_result(agent_dir: Path, last: str) -> None:
    """A job whose last line matches and which exits at once: its end is reported only after
    the rules saw all its output, so the final poll, ``proc.hits`` and ``jobs()`` have the hit.
    The kill rule cannot act (the job is over) but its hit is recorded, and the rules go on to
    the other stream."""
    rules = [
        rx.WatchRule(pattern="^nan$"),
        rx.WatchRule(pattern="nan", action="kill"),
        rx.WatchRule(pattern="^boom$", stream="stderr"),
    ]
    async with rx.open_sandbox(f"local://?dir={agent_dir}") as sb:
        proc = sb.exec_remote(f"echo boom >&2; echo ok; {last}", policy=rx.JobPolicy(on_output=rules))
        result = await proc.wait()
        assert result.success and result.reason is None and result.stdout in ("ok\nnan\n", "ok\nnan")
        assert proc.hits == 3
        assert proc.job_id is not None
        info = await _info(sb, proc.job_id)
    assert info.state == "completed" and info.reason is None and info.hits_total == 3
    assert [(h.rule, h.action, h.stream, h.offset, h.line) for h in info.hits] == [
        (0, "notify", "stdout", 3, "nan"),
        (1, "kill", "stdout", 3, "nan"),
        (2, "notify", "stderr", 0, "boom"),
    ]


async def test_a_new_hit_answers_a_long_poll(agent_sock: Path) -> None:
    """A rule that fires on a quiet job's last line wakes the client's long poll at once: a
    poll that knows ``hits`` answers when there are more, output or not."""
    start = {"command": "echo nan; exec sleep 300", "policy": {"on_output": [{"pattern": "^nan$"}]}}
    job_id = (await anyio.to_thread.run_sync(rpc, agent_sock, "exec_remote_start", start))["result"]["job_id"]
    try:
        offset, hits = 0, 0
        while hits == 0:
            # The output answers at once, the hit within a policy tick: never the full wait, 30 s
            # (the cap), which the generous 20 s bound tells apart from the news on a loaded machine.
            params = {"job_id": job_id, "stdout_offset": offset, "wait": MAX_WAIT, "hits": hits}
            with anyio.fail_after(20):
                call = functools.partial(rpc, agent_sock, "exec_remote_poll", params)
                res = (await anyio.to_thread.run_sync(call, abandon_on_cancel=True))["result"]
            offset, hits = res["stdout_offset"], res["hits"]
        assert offset == 4 and hits == 1 and res["state"] == "running"
    finally:
        await anyio.to_thread.run_sync(rpc, agent_sock, "exec_remote_kill", {"job_id": job_id, "grace": 0})


async def test_catastrophic_pattern_is_cut_off_and_the_agent_keeps_serving(agent_dir: Path) -> None:
    """``(a|aa)+$`` on 60 a's and a b takes years with backtracking: the search's time limit
    disables that rule, the other rule still fires, the agent answers meanwhile."""
    rules = [rx.WatchRule(pattern=r"(a|aa)+$"), rx.WatchRule(pattern=r"^done$", action="kill")]
    async with rx.open_sandbox(f"local://?dir={agent_dir}") as sb:
        proc = sb.exec_remote(
            f"echo ready; echo {'a' * 60}b; echo done; exec sleep 300", policy=rx.JobPolicy(on_output=rules)
        )
        await _ready(proc)
        t0 = time.monotonic()
        result = await proc.wait()
        print(f"\ncatastrophic pattern: job killed by the next rule {time.monotonic() - t0:.2f} s after its output")
        assert proc.job_id is not None
        info = await _info(sb, proc.job_id)
        assert info.rules_disabled == [0] and [h.rule for h in info.hits] == [1]
        assert result.state == "killed" and (result.reason or "").startswith("killed: watch rule 1")
        with anyio.fail_after(5):
            await sb.server_info()


async def test_bad_pattern_refuses_the_start(agent_dir: Path) -> None:
    async with rx.open_sandbox(f"local://?dir={agent_dir}") as sb:
        with pytest.raises(rx.InvalidParamsError, match="bad watch rule: rule 0"):
            await sb.exec_remote("true", policy=rx.JobPolicy(on_output=[rx.WatchRule(pattern="(")])).started()


@pytest.mark.parametrize("action", ["interrupt", "kill"])
async def test_idle_job_is_interrupted_or_killed(agent_dir: Path, action: str) -> None:
    code = textwrap.dedent("""
        import time
        print("ready", flush=True)
        try:
            time.sleep(300)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            raise SystemExit(3)
    """)
    policy = rx.JobPolicy(idle_timeout=1.0, idle_action=action)  # type: ignore[arg-type]
    async with rx.open_sandbox(f"local://?dir={agent_dir}") as sb:
        proc = sb.exec_remote([sys.executable, "-c", code], policy=policy, kill_grace=0.5)
        await _ready(proc)
        t0 = time.monotonic()
        with anyio.fail_after(60):
            result = await proc.wait()
        print(f"\nidle {action}: ended {time.monotonic() - t0:.2f} s after its last output (timeout 1 s)")
    if action == "interrupt":  # SIGINT: the job chose its exit
        assert (result.state, result.returncode, result.stdout) == ("completed", 3, "ready\ninterrupted\n")
        assert result.reason == "interrupted: no output for 1 s"
    else:
        assert result.state == "killed" and result.reason == "killed: no output for 1 s"


async def test_memory_limit_kills_the_tree_with_the_reason(agent_dir: Path) -> None:
    # A child of the shell allocates: the whole tree's RSS counts, not only the leader's.
    code = "b = bytearray(160 << 20); b[::4096] = b'x' * len(b[::4096]); print('ready', flush=True); input()"
    policy = rx.JobPolicy(memory_limit=64 << 20)
    async with rx.open_sandbox(f"local://?dir={agent_dir}") as sb:
        proc = sb.exec_remote(
            ["sh", "-c", f'"{sys.executable}" -c "{code}"; echo after'], policy=policy, stdin_open=True
        )
        with anyio.fail_after(60):
            result = await proc.wait()
    assert result.state == "killed" and "after" not in str(result.stdout)
    assert (result.reason or "").startswith("killed: memory limit 64.0 MiB exceeded ("), result.reason
    print(f"\nmemory limit: {result.reason}")


async def test_cpu_time_limit_kills_a_busy_loop(agent_dir: Path) -> None:
    policy = rx.JobPolicy(cpu_time=1.0)
    async with rx.open_sandbox(f"local://?dir={agent_dir}") as sb:
        proc = sb.exec_remote([sys.executable, "-c", "print('ready', flush=True)\nwhile True: pass"], policy=policy)
        await _ready(proc)
        st = await proc.stats(window=0.1)
        assert st.running
        with anyio.fail_after(60):
            result = await proc.wait()
    assert result.state == "killed"
    assert (result.reason or "").startswith("killed: CPU time limit 1 s exceeded"), result.reason


# 200 short-lived children, each a ~20 ms busy loop, waited for by the job's shell: their CPU
# (about 4 s in all) is in the shell's cutime once each ends, never in a live process for long.
SHORT_CHILDREN = "for n in $(seq 200); do sh -c 'i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done'; done"


async def test_cpu_time_counts_children_that_already_exited(agent_dir: Path) -> None:
    policy = rx.JobPolicy(cpu_time=0.5)
    async with rx.open_sandbox(f"local://?dir={agent_dir}") as sb:
        proc = sb.exec_remote(SHORT_CHILDREN, policy=policy)
        st = await proc.stats(window=0.5)
        print(f"\nshort-lived children: {st.cpu_percent:.1f}% CPU over {st.interval:.2f} s")
        # Busy (0 % when only live processes count: no child lives across the window); 5 %
        # leaves room for a loaded pair of cores (13 % seen at a load of 10 on 2 cores).
        assert st.cpu_percent >= 5.0
        with anyio.fail_after(60):
            result = await proc.wait()
    assert result.state == "killed", result
    assert (result.reason or "").startswith("killed: CPU time limit 0.5 s exceeded"), result.reason


async def test_cpu_time_counts_orphans_the_keeper_reaped(agent_dir: Path) -> None:
    """Each busy child is orphaned at once (its parent, a subshell, exits): the keeper reaps it
    and counts its CPU for the job. A fifo runs them one at a time."""
    busy = r"i=0; while [ \$i -lt 20000 ]; do i=\$((i+1)); done; echo > $f"  # $f: the outer shell's
    orphans = f'f=$(mktemp -u); mkfifo $f; for n in $(seq 200); do (sh -c "{busy}" &); read x < $f; done'
    async with rx.open_sandbox(f"local://?dir={agent_dir}") as sb:
        with anyio.fail_after(60):
            result = await sb.run(orphans, policy=rx.JobPolicy(cpu_time=0.8))
    assert result.state == "killed", result
    assert (result.reason or "").startswith("killed: CPU time limit 0.8 s exceeded"), result.reason


async def test_nice_lowers_the_priority(agent_dir: Path) -> None:
    async with rx.open_sandbox(f"local://?dir={agent_dir}") as sb:
        result = await sb.run(
            [sys.executable, "-c", "import os; print(os.getpriority(os.PRIO_PROCESS, 0))"],
            policy=rx.JobPolicy(nice=7),
        )
    assert result.stdout == f"{max(7, os.getpriority(os.PRIO_PROCESS, 0))}\n"


async def test_kill_on_disconnect_after_the_client_process_is_sigkilled(agent_dir: Path) -> None:
    url = f"local://?dir={agent_dir}"
    keep_id, kill_id, t0 = await sigkilled_client(url)
    async with rx.open_sandbox(url) as sb:
        info = await _until(sb, kill_id, "ended", lambda i: i.state != "running")
        elapsed = time.monotonic() - t0
        print(f"\non_disconnect=kill: job ended {elapsed:.2f} s after its client was SIGKILLed (grace 2 s)")
        assert info.state == "killed" and info.reason == "killed: no client attached for 2 s"
        assert elapsed >= 2.0 - TICK  # the grace was waited out (the end itself: _until's bound)
        kept = await _info(sb, keep_id)
        assert kept.state == "running" and kept.reason is None  # the "keep" job lives
        await (await sb.attach(keep_id)).kill()


async def test_a_restarted_agent_enforces_the_policy(fresh_agent_dir: Path, tmp_path: Path) -> None:
    """The policy is in job.json: kill -9 of the agent, and the next one (the keeper starts it)
    re-adopts the job and runs its rule over the output written after."""
    go = tmp_path / "go"
    policy = rx.JobPolicy(on_output=[rx.WatchRule(pattern="^nan$", action="kill")])
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}", response_margin=1.0) as sb:
        proc = sb.exec_remote(
            "echo nan-ish; " + WAIT_GO + "echo nan; exec sleep 300", env={"GO": str(go)}, policy=policy
        )
        await proc.started()
        assert proc.job_id is not None
        await agent_killed(sb)
        go.touch()
        info = await _until(sb, proc.job_id, "killed", lambda i: i.state != "running")
    assert info.state == "killed" and info.policy == policy
    assert (info.reason or "").startswith("killed: watch rule 0 matched '^nan$' on stdout at byte 8")


async def test_watch_hits_outlive_a_sigkilled_agent(fresh_agent_dir: Path, tmp_path: Path) -> None:
    """The hits are in job.json: after kill -9 of the agent the next one lists the earlier hits,
    and a client polling across the restart is told of each hit once (3 hits: 1, 2, then 3)."""
    go = tmp_path / "go"
    policy = rx.JobPolicy(on_output=[rx.WatchRule(pattern="^hit")])
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}", response_margin=1.0) as sb:
        proc = sb.exec_remote("echo hit 1; echo hit 2; " + WAIT_GO + "echo hit 3", env={"GO": str(go)}, policy=policy)
        told: list[int] = []
        two = anyio.Event()

        def tell(n: int) -> None:
            told.append(n)
            if n >= 2:
                two.set()

        proc.on_hit(tell)
        results: list[rx.ExecResult] = []

        async def wait() -> None:
            results.append(await proc.wait())

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            with anyio.fail_after(60):
                await two.wait()  # the waiting poll brings them
            assert proc.job_id is not None
            await agent_killed(sb)
            before = await _info(sb, proc.job_id)
            assert [h.line for h in before.hits] == ["hit 1", "hit 2"] and before.hits_total == 2
            go.touch()
        info = await _info(sb, before.job_id)
    assert results[0].state == "completed" and proc.hits == 3
    assert told[-1] == 3 and told == sorted(set(told))  # each count told once, none twice
    assert [h.line for h in info.hits] == ["hit 1", "hit 2", "hit 3"] and info.hits_total == 3
    assert [h.offset for h in info.hits] == [0, 6, 12]


async def test_a_client_without_a_stream_is_attached_while_it_polls(agent_dir: Path) -> None:
    """``channel=call`` (one process, one connection per request): each poll counts as the
    client seen; a job polled more often than its grace lives to its end."""
    # Each poll is a process of its own (channel=call): on a loaded machine one took over 3 s
    # (soak), so the grace leaves room for that; the job outlives it, so a lapse would kill it.
    policy = rx.JobPolicy(on_disconnect="kill", disconnect_grace=8)
    async with rx.open_sandbox(f"local://?dir={agent_dir}&channel=call") as sb:
        with anyio.fail_after(60):
            result = await sb.run("sleep 12; echo done", policy=policy, poll_interval=1.0)
    assert (result.state, result.stdout, result.reason) == ("completed", "done\n", None)
