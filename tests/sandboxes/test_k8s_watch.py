"""A pod that goes away mid-stream: every waiter learns why within seconds (the pod watch).

Against the real tier (a real kube-apiserver and a kwok node, tests/k8sreal.py): kwok runs the
agent as a local process, so deleting the pod leaves the agent and its job running on and the
exec streams open. Without the watch nothing would ever fail; with it, the pod's deletion (or
its status turning OOMKilled or restarted, as a kubelet reports them) closes the sandbox's exec
sockets and each waiter gets :class:`SandboxLostError` naming the reason. The elapsed time is
printed for the record (the bound is the issue's 5 s; a hang fails at the guard's 20 s).
"""

from __future__ import annotations

import contextlib
import itertools
import urllib.error
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

import remote_exec as rx

from ..conftest import stop_agent
from ..k8sreal import RealCluster, bed_bin, shared_real_cluster
from .podloss import lost_waiters, our_sockets_to

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(bed_bin() is None, reason="the real tier is not built here (make k8s-bed)"),
]


@pytest.fixture
def cluster() -> RealCluster:
    c = shared_real_cluster()
    assert c is not None
    return c


@pytest.fixture
async def pod(cluster: RealCluster, tmp_path: Path) -> AsyncIterator[tuple[rx.AsyncSandbox, str]]:
    name = f"rx-watch-{next(_names)}"
    cluster.pod(name)
    url = f"k8s://default/{name}?kubeconfig={cluster.kubeconfig}&dir={tmp_path / 'agent'}"
    try:
        async with rx.open_sandbox(url) as sb:
            yield sb, name
        with contextlib.suppress(urllib.error.HTTPError):
            cluster.request("DELETE", f"/api/v1/namespaces/default/pods/{name}")
    finally:
        # The pod's processes are this machine's (kwok runs them): a pod reported failed or
        # deleted leaves its agent and its jobs running (a test's ticking job went on for two
        # minutes).
        await anyio.to_thread.run_sync(stop_agent, tmp_path / "agent")


_names = itertools.count()


def _status(cluster: RealCluster, name: str, container_status: dict[str, object], phase: str = "Running") -> None:
    """What a kubelet would report of the pod (a merge patch of its status)."""
    cluster.request(
        "PATCH",
        f"/api/v1/namespaces/default/pods/{name}/status",
        {
            "status": {
                "phase": phase,
                "containerStatuses": [
                    {"name": "main", "image": "fake", "imageID": "", "ready": False, **container_status}
                ],
            }
        },
        content_type="application/strategic-merge-patch+json",
    )


async def test_a_deleted_pod_fails_every_waiter_with_the_reason(
    cluster: RealCluster, pod: tuple[rx.AsyncSandbox, str]
) -> None:
    sb, name = pod
    errors = await lost_waiters(
        sb, lambda: cluster.request("DELETE", f"/api/v1/namespaces/default/pods/{name}"), "pod deleted"
    )
    assert all(f"pod default/{name}" in e and "delet" in e for e in errors), errors


async def test_an_oom_killed_container_fails_every_waiter_with_the_reason(
    cluster: RealCluster, pod: tuple[rx.AsyncSandbox, str]
) -> None:
    sb, name = pod
    killed = {"restartCount": 0, "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}
    errors = await lost_waiters(sb, lambda: _status(cluster, name, killed, phase="Failed"), "OOMKilled")
    assert all("has failed (container main: OOMKilled, exit code 137)" in e for e in errors), errors


async def test_a_restarted_container_fails_every_waiter_with_the_reason(
    cluster: RealCluster, pod: tuple[rx.AsyncSandbox, str]
) -> None:
    sb, name = pod
    restarted = {
        "restartCount": 1,
        "state": {"running": {"startedAt": "2026-11-29T00:00:00Z"}},
        "lastState": {"terminated": {"reason": "Error", "exitCode": 2}},
    }
    errors = await lost_waiters(sb, lambda: _status(cluster, name, restarted), "restarted")
    assert all("restarted (Error, exit code 2)" in e for e in errors), errors


async def test_a_closed_sandbox_has_closed_its_sockets(cluster: RealCluster, tmp_path: Path) -> None:
    """Once the sandbox is closed no socket of it to the API server is open, not even one still
    saying goodbye: aiohttp ends a TLS connection by waiting for the server's close_notify, which
    the API server does not send, so a loop that ended meanwhile left an exec's socket open (a
    ResourceWarning in whichever later test the collector ran: a CI failure)."""
    name = f"rx-watch-{next(_names)}"
    cluster.pod(name)
    port = int(cluster.server.rsplit(":", 1)[1])
    before = our_sockets_to(port)
    async with rx.open_sandbox(f"k8s://default/{name}?kubeconfig={cluster.kubeconfig}&dir={tmp_path}") as sb:
        assert (await sb.run(["echo", "hi"])).stdout == "hi\n"
        assert our_sockets_to(port) > before  # (its exec's and its watch's)
    assert our_sockets_to(port) == before
    cluster.request("DELETE", f"/api/v1/namespaces/default/pods/{name}")


async def test_a_restart_that_keeps_the_agents_state_resumes_every_stream(cluster: RealCluster, tmp_path: Path) -> None:
    """The agent's state dir on a volume of the pod (an ``emptyDir`` outlives a container's
    restart): the container dies (its processes killed) and the kubelet starts it again. No
    verdict: each stream resumes from its cursor, the job that ran through the restart ends
    ``lost`` with its output up to then intact, a job that had ended keeps its output, and the
    sandbox runs commands again. Without it every waiter failed with SandboxLostError."""
    name = f"rx-watch-{next(_names)}"
    volume = tmp_path / "volume"
    cluster.pod(name, volume=str(volume))
    url = f"k8s://default/{name}?kubeconfig={cluster.kubeconfig}&dir={volume / 'agent'}"
    try:
        async with rx.open_sandbox(url) as sb:
            before = await sb.run(["sh", "-c", "echo before"])
            proc = sb.exec_remote(["sh", "-c", "echo one; exec sleep 60"])
            seen = ""
            async for ev in proc:
                if isinstance(ev, rx.StdoutChunk):
                    seen += str(ev.data)
                    if "one\n" in seen:
                        break
            # As a kubelet says it: the container died and waits to be started again, then runs.
            last = {"terminated": {"reason": "Error", "exitCode": 137}}
            waiting = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s"}}
            _status(cluster, name, {"restartCount": 1, "state": waiting, "lastState": last})
            assert cluster.kill_exec_processes() >= 3  # the channel's relay, the agent, its keeper, the job
            running = {"running": {"startedAt": "2026-11-29T00:00:00Z"}}
            _status(cluster, name, {"restartCount": 1, "state": running, "lastState": last})
            with anyio.fail_after(60):
                result = await proc.wait()
            assert (result.state, result.returncode, result.stdout) == ("lost", -1, "one\n"), result
            assert result.reason and "exit status was lost" in result.reason
            again = await sb.attach(before.job_id)
            assert (await again.wait()).stdout == "before\n"
            assert (await sb.run(["echo", "after"])).stdout == "after\n"
    finally:
        with contextlib.suppress(urllib.error.HTTPError):
            cluster.request("DELETE", f"/api/v1/namespaces/default/pods/{name}")
