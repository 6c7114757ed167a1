"""``k8s://`` and ``k8s+image://`` on the fast tier, in every CI run: pods are containers of the
test engine behind a loopback API server of ours (tests/k8sapi), validated against the real
kubectl and the official clients (test_k8sapi_clients.py).

What the real tier (test_k8s_watch.py, test_k8s_fleet.py) shows where it is built, shown here
with real containers: a pod removed mid-stream reaches every waiter with the reason (an OOM
kill's status is shown by test_k8sapi_clients and, through the transport, on the real tier);
``k8s+image://`` makes, runs and deletes its pod, and a bad image fails at once in the kubelet's
words; ``?via=kubectl`` runs the real kubectl.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest

import remote_exec as rx

from ..k8sapi.fixture import FastApiServer
from .backend_docker import KUBECTL, docker_or_skip, fast_api_or_skip, image_or_skip
from .dockerd import Dockerd
from .podloss import lost_waiters, our_sockets_to

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def engine() -> Dockerd:
    return docker_or_skip()


@pytest.fixture(scope="module")
def nopy(engine: Dockerd) -> str:
    return image_or_skip(engine, "nopy")


@pytest.fixture(scope="module")
def api(engine: Dockerd, tmp_path_factory: pytest.TempPathFactory) -> FastApiServer:
    return fast_api_or_skip(tmp_path_factory.mktemp("fast-api"))


async def test_a_pod_removed_mid_stream_fails_every_waiter(api: FastApiServer, engine: Dockerd, nopy: str) -> None:
    api.create_pod("rxfast", "gone", nopy, ["sleep", "infinity"])
    async with rx.open_sandbox(f"k8s://rxfast/gone?kubeconfig={api.kubeconfig}") as sb:
        errors = await lost_waiters(
            sb, lambda: engine.docker("rm", "-f", "k8s_rxfast_gone_main"), "container removed behind the API's back"
        )
    # The engine kills the container, then removes it: the watch may see either first.
    assert all("pod rxfast/gone" in e and ("deleted" in e or "exit code 137" in e) for e in errors), errors


async def test_k8s_image_makes_runs_and_deletes_its_pod(api: FastApiServer, nopy: str) -> None:
    url = f"k8s+image://{nopy}?namespace=rxfast&name=img1&kubeconfig={api.kubeconfig}"
    async with rx.open_sandbox(url) as sb:
        res = await sb.run(["sh", "-c", "touch /tmp/ok && echo $(id -u) && exit 5"])
        assert (res.returncode, res.stdout) == (5, "0\n")
        pod = api.get_pod("rxfast", "img1")
        assert pod is not None and pod["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "remote-exec"
    assert api.get_pod("rxfast", "img1") is None  # deleted on close


async def test_k8s_image_with_an_image_that_cannot_be_pulled_fails_at_once(api: FastApiServer) -> None:
    url = f"k8s+image://rx-test/absent:1?namespace=rxfast&name=img2&timeout=60&kubeconfig={api.kubeconfig}"
    with pytest.raises(rx.SandboxError, match=r"cannot start rx-test/absent:1: (ErrImagePull|ErrImageNeverPull)"):
        await rx.open_sandbox(url)
    assert api.get_pod("rxfast", "img2") is None  # a failed open deletes what it made


async def test_via_kubectl_runs_the_real_kubectl(api: FastApiServer, nopy: str) -> None:
    api.create_pod("rxfast", "kc", nopy, ["sleep", "infinity"])
    url = f"k8s://rxfast/kc?kubeconfig={api.kubeconfig}&via=kubectl&kubectl={KUBECTL}"
    async with rx.open_sandbox(url) as sb:
        res = await sb.run(["sh", "-c", "echo via kubectl; exit 4"])
    assert (res.returncode, res.stdout) == (4, "via kubectl\n")
    assert any(e.get("protocol") == "v5.channel.k8s.io" for e in api.execs().get("execs", []))


def _with_server_name(api: FastApiServer, path: Path, name: str) -> Path:
    """A copy of the server's kubeconfig (JSON, which YAML reads too) whose clusters say
    ``tls-server-name: name``."""
    config = json.loads(api.kubeconfig.read_text())
    for cluster in config["clusters"]:
        cluster["cluster"]["tls-server-name"] = name
    path.write_text(json.dumps(config))
    return path


async def test_the_kubeconfigs_tls_server_name_is_the_name_checked(
    api: FastApiServer, nopy: str, tmp_path: Path
) -> None:
    """The server's certificate names ``localhost`` and 127.0.0.1; the URL is 127.0.0.1. With
    ``tls-server-name`` the certificate is checked against that name instead: ``localhost``
    passes, another name is refused (it passed before: the field was not applied)."""
    api.create_pod("rxfast", "sni", nopy, ["sleep", "infinity"])
    good = _with_server_name(api, tmp_path / "good", "localhost")
    async with rx.open_sandbox(f"k8s://rxfast/sni?kubeconfig={good}") as sb:
        assert (await sb.run(["echo", "named"])).stdout == "named\n"
    bad = _with_server_name(api, tmp_path / "bad", "elsewhere.invalid")
    with pytest.raises(rx.SandboxError, match=r"elsewhere\.invalid|certificate|hostname"):
        await rx.open_sandbox(f"k8s://rxfast/sni?kubeconfig={bad}")


async def test_k8s_image_reattaches_its_named_pod_only_from_the_same_image(
    api: FastApiServer, engine: Dockerd, nopy: str
) -> None:
    kept = f"k8s+image://{nopy}?namespace=rxfast&name=img3&keep=1&kubeconfig={api.kubeconfig}"
    try:
        async with rx.open_sandbox(kept) as sb:
            await sb.run(["sh", "-c", "echo first > /tmp/mark"])
        async with rx.open_sandbox(kept) as again:  # the same pod, kept: the mark is there
            assert (await again.run(["cat", "/tmp/mark"])).stdout == "first\n"
        other = image_or_skip(engine, "usr")
        with pytest.raises(
            rx.SandboxError, match=re.escape(f"img3 exists, made by remote_exec from {nopy}, not {other}")
        ):
            await rx.open_sandbox(kept.replace(nopy, other, 1))
        assert api.get_pod("rxfast", "img3") is not None  # refused, and left as it was
    finally:
        api.delete_pod("rxfast", "img3")


async def test_the_last_release_leaves_no_socket_open(api: FastApiServer) -> None:
    """A connection cut short on its own (here a watch's response closed) is closed by aiohttp
    with a TLS goodbye that waits for the server's; a server slow to answer (here stopped; in CI,
    loaded) left the socket open past the loop's end. The API's last release aborts it."""
    from remote_exec.sandboxes.k8sapi import KubeApi

    before = our_sockets_to(api.port)
    kube = await KubeApi.acquire(str(api.kubeconfig), None)
    resp = await kube.stream("/api/v1/namespaces/rxfast/pods", watch="1")
    os.kill(api.pid, signal.SIGSTOP)
    try:
        resp.close()
        await kube.release()
        assert our_sockets_to(api.port) == before
    finally:
        os.kill(api.pid, signal.SIGCONT)
