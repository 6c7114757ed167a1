"""Job policies where the client reaches the agent through a relay (``docker exec -i``): the
client process SIGKILLed closes the relay, so the agent sees its connection go; and the watch
rules and the whole tree's CPU count work in the bundled agent (the ``regex`` module frozen into
it)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator

import anyio
import pytest

import remote_exec as rx
from remote_exec.agent.jobs.policy import TICK

from ..conftest import sigkilled_client
from .backend_docker import docker_or_skip, image_or_skip
from .dockerd import Dockerd

pytestmark = pytest.mark.anyio


@pytest.fixture
def container() -> Iterator[str]:
    engine: Dockerd = docker_or_skip()
    name = engine.run(f"rx-policy-{secrets.token_hex(4)}", image_or_skip(engine, "usr"), "-v", "/usr:/usr:ro")
    yield f"docker://{name}"
    engine.docker("rm", "-f", name, check=False)


async def _ended(sb: rx.AsyncSandbox, job_id: str) -> rx.JobInfo:
    with anyio.fail_after(60):
        while True:  # re-read the record until the agent acted; the deadline bounds it
            info = next(j for j in await sb.jobs() if j.job_id == job_id)
            if info.state != "running":
                return info
            await anyio.sleep(0.05)


async def test_docker_client_sigkilled_kill_job_dies_keep_job_lives(container: str) -> None:
    keep_id, kill_id, t0 = await sigkilled_client(container)  # its docker exec loses its stdin, the relay its input
    async with rx.open_sandbox(container) as sb:
        info = await _ended(sb, kill_id)
        elapsed = time.monotonic() - t0
        print(f"\ndocker, on_disconnect=kill: ended {elapsed:.2f} s after the client was SIGKILLed (grace 2 s)")
        assert info.state == "killed" and info.reason == "killed: no client attached for 2 s"
        assert elapsed >= 2.0 - TICK  # the grace was waited out (the job sleeps 300 s: _ended bounds the rest)
        kept = next(j for j in await sb.jobs() if j.job_id == keep_id)
        assert kept.state == "running"
        await (await sb.attach(keep_id)).kill()


async def test_docker_watch_rule_and_cpu_time_in_the_bundled_agent(container: str) -> None:
    """The watch rules (the ``regex`` module frozen into the agent), then ``cpu_time`` of a job
    burning CPU in 200 short-lived children its shell waits for (as in tests/agent/test_policy.py):
    their CPU counts once they ended, in the stats and against the limit. One sandbox for both
    (an injected agent costs seconds)."""
    rules = [rx.WatchRule(pattern=r"(a|aa)+$"), rx.WatchRule(pattern=r"^nan$", action="kill")]
    children = "for n in $(seq 200); do sh -c 'i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done'; done"
    async with rx.open_sandbox(f"{container}?inject=always") as sb:  # the frozen agent, surely
        proc = sb.exec_remote(f"echo {'a' * 60}b; echo nan; exec sleep 300", policy=rx.JobPolicy(on_output=rules))
        with anyio.fail_after(60):
            result = await proc.wait()
        assert proc.job_id is not None
        info = next(j for j in await sb.jobs() if j.job_id == proc.job_id)
        assert result.state == "killed" and (result.reason or "").startswith("killed: watch rule 1 matched '^nan$'")
        assert info.rules_disabled == [0]

        busy = sb.exec_remote(children, policy=rx.JobPolicy(cpu_time=0.5))
        st = await busy.stats(window=0.5)
        print(f"\ndocker, short-lived children: {st.cpu_percent:.1f}% CPU over {st.interval:.2f} s")
        assert st.cpu_percent >= 5.0  # 0 % when only live processes count (13 % seen at a load of 10)
        with anyio.fail_after(60):
            ended = await busy.wait()
    assert ended.state == "killed", ended
    assert (ended.reason or "").startswith("killed: CPU time limit 0.5 s exceeded"), ended.reason
