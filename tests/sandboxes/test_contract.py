"""The contract every sandbox passes: the same behaviour through every transport."""

from __future__ import annotations

import anyio
import pytest

import remote_exec as rx
from remote_exec.client.channel import StdioChannel

from ..client.test_faults import EXPECTED_ERR, EXPECTED_OUT, SLOW_LINES, drop_poll_responses

pytestmark = pytest.mark.anyio

# Lists live (non-zombie) members of process group $1 from /proc, with nothing but sh builtins,
# so it works in any sandbox (PIDs are the sandbox's own).
GROUP_ALIVE = r"""
for s in /proc/[0-9]*/stat; do
  read -r l < "$s" 2>/dev/null || continue
  set -- ${l##*") "}
  [ "$1" != Z ] && [ "$3" = "$PGID" ] && echo "${s#/proc/}"
done; true
"""


async def group_alive(sb: rx.AsyncSandbox, pgid: int) -> str:
    return str((await sb.run(["sh", "-c", GROUP_ALIVE], env={"PGID": str(pgid)})).stdout)


async def test_streams_and_exit_codes(sandbox_url: str) -> None:
    async with rx.open_sandbox(sandbox_url) as sb:
        events = [ev async for ev in sb.exec_remote(["sh", "-c", "echo out; echo err >&2; exit 5"])]
        assert set(events[:-1]) == {rx.StdoutChunk("out\n"), rx.StderrChunk("err\n")}
        assert events[-1] == rx.Completed(5, "out\n", "err\n")
        res = await sb.run(["sh", "-c", "cd /tmp && pwd; echo $V"], env={"V": "v"})
        assert (res.stdout, res.returncode) == ("/tmp\nv\n", 0)


async def test_stdin(sandbox_url: str) -> None:
    async with rx.open_sandbox(sandbox_url) as sb:
        assert (await sb.run(["cat"], input="fed\n")).stdout == "fed\n"
        proc = sb.exec_remote(["sh", "-c", "read a; echo got $a; read b; echo got $b"], stdin_open=True)
        await proc.write_stdin("1\n")
        assert await anext(aiter(proc)) == rx.StdoutChunk("got 1\n")
        await proc.write_stdin("2\n")
        assert (await proc.wait()).stdout == "got 1\ngot 2\n"


async def test_timeout(sandbox_url: str) -> None:
    async with rx.open_sandbox(sandbox_url) as sb:
        with pytest.raises(rx.ExecTimeoutError) as info:
            await sb.run(["sh", "-c", "echo begun; sleep 60"], timeout=0.5, kill_grace=0.2)
        assert info.value.result.stdout == "begun\n"


async def test_kill_term_ignoring_tree(sandbox_url: str) -> None:
    async with rx.open_sandbox(sandbox_url) as sb:
        proc = sb.exec_remote(["sh", "-c", "trap '' TERM; sleep 300 & echo up; wait"], kill_grace=0.3)
        assert await anext(aiter(proc)) == rx.StdoutChunk("up\n")
        pgid = proc.pid or 0
        assert len((await group_alive(sb, pgid)).split()) == 2
        await proc.kill()
        assert await group_alive(sb, pgid) == ""


async def test_attach_sees_same_bytes(sandbox_url: str) -> None:
    async with rx.open_sandbox(sandbox_url) as a, rx.open_sandbox(sandbox_url) as b:
        proc = await a.exec_remote(["sh", "-c", "for i in 1 2 3; do echo $i; sleep 0.05; done"]).started()
        other = await b.attach(proc.job_id or "")
        assert (await proc.wait()).stdout == (await other.wait()).stdout == "1\n2\n3\n"


async def test_cursor_replay_after_dropped_response(sandbox_url: str) -> None:
    async with rx.open_sandbox(sandbox_url, response_margin=1.0) as sb:  # a re-ask gets ~1 s even on a loaded machine
        # (A channel that pushes loses the follow call that carries the first data push.)
        which = {1} if sb._core.rpc.channel.pushes else {1, 2}
        seen = drop_poll_responses(sb, which)
        with anyio.fail_after(60):
            res = await sb.exec_remote(["sh", "-c", SLOW_LINES], poll_interval=0.1).wait()
    assert which <= set(seen)
    assert (res.stdout, res.stderr, res.returncode) == (EXPECTED_OUT, EXPECTED_ERR, 4)


async def test_killed_channel_process_resumes_without_loss(sandbox_url: str) -> None:
    async with rx.open_sandbox(sandbox_url) as sb:
        channel = sb._core.rpc.channel
        if not isinstance(channel, StdioChannel):
            pytest.skip("this sandbox talks to the agent socket directly: no channel process")
        proc = sb.exec_remote(["sh", "-c", "echo first; sleep 0.3; " + SLOW_LINES])
        first = await anext(aiter(proc))  # under load it may already hold more than the first line
        assert isinstance(first, rx.StdoutChunk) and isinstance(first.data, str) and first.data.startswith("first\n")
        assert channel.process is not None
        channel.process.kill()  # kill -9 of `docker exec` / `nsenter` / the ssh channel
        with anyio.fail_after(60):
            res = await proc.wait()
    assert (res.stdout, res.stderr, res.returncode) == ("first\n" + EXPECTED_OUT, EXPECTED_ERR, 4)


async def test_timeout_enforced_in_sandbox_with_host_gone(sandbox_url: str) -> None:
    async with rx.open_sandbox(sandbox_url) as sb:
        proc = await sb.exec_remote(["sh", "-c", "echo hi; sleep 60"], timeout=0.5, kill_grace=0.1).started()
        job_id, pid = proc.detach(), proc.pid
    async with rx.open_sandbox(sandbox_url) as sb:  # a new client; nobody watched in between
        await sb.run(["sh", "-c", f"while kill -0 {pid} 2>/dev/null; do sleep 0.05; done"], timeout=30)
        # The end is told once the whole tree is gone, a moment after its leader.
        with anyio.fail_after(30):
            while (state := {j.job_id: j.state for j in await sb.jobs()}[job_id or ""]) == "running":  # noqa: ASYNC110
                await anyio.sleep(0.05)
        assert state == "timed_out"


async def test_shell_sessions(sandbox_url: str) -> None:
    async with rx.open_sandbox(sandbox_url) as sb:
        sh = await sb.shell()
        try:
            assert (await sh.run("cd /tmp && export A=1 && f() { echo fn $1; }")).returncode == 0
            res = await sh.run("pwd; echo $A; f x; echo oops >&2; false")
            assert (res.stdout, res.stderr, res.returncode) == ("/tmp\n1\nfn x\n", "oops\n", 1)
            async with rx.open_sandbox(sandbox_url) as other:  # a second client sees the same shell
                again = await other.reattach_shell(sh.session_id)
                assert (await again.run("echo $A; pwd")).stdout == "1\n/tmp\n"
            assert (await sh.run("exit 7")).returncode == 7
            with pytest.raises(rx.ShellClosedError):
                await sh.run("true")
        finally:
            await sh.close()
