"""``k8s+image://`` at scale on the real tier: a hundred pods for one fleet run, a pool's leases.

Against a real kube-apiserver with a kwok node (tests/k8sreal.py): each sandbox creates its pod
(``node=`` places it: no scheduler runs here), waits for it through the namespace's one watch,
runs the command through its own exec WebSocket, and deletes the pod on close. kwok runs exec
as a local process, so the hundred sandboxes share one agent here (one ``dir=``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import remote_exec as rx

from ..k8sreal import NODE, RealCluster, bed_bin, shared_real_cluster

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(bed_bin() is None, reason="the real tier is not built here (make k8s-bed)"),
]


def _managed(cluster: RealCluster) -> list[str]:
    listing = cluster.request(
        "GET", "/api/v1/namespaces/default/pods?labelSelector=app.kubernetes.io/managed-by%3Dremote-exec"
    )
    assert isinstance(listing, dict)
    return [p["metadata"]["name"] for p in listing["items"] if not p["metadata"].get("deletionTimestamp")]


@pytest.fixture
def cluster() -> RealCluster:
    c = shared_real_cluster()
    assert c is not None
    return c


async def test_a_hundred_pods_for_one_fleet_run(cluster: RealCluster, tmp_path: Path) -> None:
    """Sixteen opening at a time: here every pod's agent relay is a process on these 2 cores
    (kwok's exec), and a hundred starting at once starve each other past the open timeout."""
    url = f"k8s+image://busybox?node={NODE}&kubeconfig={cluster.kubeconfig}&dir={tmp_path / 'agent'}"
    async with rx.Fleet([url] * 100, limit=16) as fleet:
        results = await fleet.run(["sh", "-c", "echo ok; exit 7"])
    assert [(r.returncode, r.stdout) for r in results if isinstance(r, rx.ExecResult)] == [(7, "ok\n")] * 100, [
        r for r in results if not isinstance(r, rx.ExecResult)
    ][:3]
    assert _managed(cluster) == []  # every pod deleted on close


async def test_a_pool_lease_keeps_its_pod_and_the_pool_deletes_it(cluster: RealCluster, tmp_path: Path) -> None:
    url = f"k8s+image://busybox?node={NODE}&kubeconfig={cluster.kubeconfig}&dir={tmp_path / 'agent'}"
    async with rx.SandboxPool(url, max_size=2) as pool:
        async with pool.lease("alice") as sb:
            first = await sb.run(["sh", "-c", "echo $$ > /tmp/rx-pool-mark; echo one"])
            pods = _managed(cluster)
        async with pool.lease("alice") as again:
            assert again is sb  # the same sandbox for the same key: its pod still there
            assert _managed(cluster) == pods and len(pods) == 1
            assert (await again.run(["echo", "two"])).stdout == "two\n"
    assert first.stdout == "one\n"
    assert _managed(cluster) == []
