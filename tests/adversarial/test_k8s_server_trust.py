"""A hostile Kubernetes API server: what it answers is bounded and parsed as untrusted.

The exec Status on the error channel, a pod's JSON (from a read or the watch) and the exec
stream's bytes all come from the API server (or whoever sits in its place). A server that lies
gets a precise error, never a crash, a hang, unbounded memory or a terminal escape in a message.
The server here is a few aiohttp handlers written to attack; the client is the real transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from remote_exec.errors import SandboxError
from remote_exec.sandboxes.k8s import K8sTransport
from remote_exec.sandboxes.k8swatch import PodWatch, pod_verdict, restart_reason, running_restarts, state_survives
from remote_exec.sandboxes.k8sws import exit_status

from .conftest import Adversary

pytestmark = pytest.mark.anyio

TOKEN = web.AppKey("token", list[str])  # [the one the server accepts] (tests rotate it)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_pod_json_gets_a_verdict_or_none_never_a_crash(pod: Any) -> None:
    verdict = pod_verdict(pod, "main", 0)
    assert verdict is None or (isinstance(verdict, str) and verdict.isprintable() and len(verdict) < 1200)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_pod_json_is_judged_for_a_restart_without_a_crash(pod: Any) -> None:
    assert state_survives(pod, "main", "/vol/agent") in (True, False)
    assert running_restarts(pod, "main") is None or isinstance(running_restarts(pod, "main"), int)
    reason = restart_reason(pod, "main")
    assert reason.isprintable() and len(reason) < 200
    verdict = pod_verdict(pod, "main", 0, resumes=True)
    assert verdict is None or (verdict.isprintable() and len(verdict) < 1200)


def test_only_a_writable_volume_holding_the_state_dir_keeps_it_over_a_restart() -> None:
    """Who decides that a restart resumes instead of losing the sandbox: the pod restarts its
    container, and the agent's state dir is on one of that container's writable volumes."""

    def survives(mount: object, state_dir: str | None = "/vol/agent", policy: str = "Always", **extra: object) -> bool:
        container = {"name": "main", "volumeMounts": [{"name": "v", "mountPath": mount, **extra}]}
        pod = {"spec": {"restartPolicy": policy, "containers": [{"name": "side"}, container]}}
        return state_survives(pod, "main", state_dir)

    assert survives("/vol") and survives("/vol/") and survives("/x/../vol") and survives("/vol/agent")
    assert survives("/")
    assert not survives("/vol", policy="OnFailure")  # a container that exits 0 is not started again
    assert not survives("/vo")  # a prefix of the name, not a parent dir
    assert not survives("/vol/agent/jobs")  # only part of the state
    assert not survives("/vol", policy="Never")  # a restart never comes: the container's end is final
    assert not survives("/vol", readOnly=True)
    assert not survives("vol") and not survives(None) and not survives(["/vol"])
    assert not survives("/vol", state_dir=None)  # the default dir is the container's own /tmp or runtime dir


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_status_is_a_code_from_0_to_255(status: Any) -> None:
    code, message = exit_status(json.dumps(status).encode())
    assert 0 <= code <= 255 and len(message) <= 500


def test_hostile_statuses(adversary: Adversary) -> None:
    cases = {
        "a code over 255": (b'{"status":"Failure","details":{"causes":[{"reason":"ExitCode","message":"999"}]}}', 126),
        "a negative code": (b'{"status":"Failure","details":{"causes":[{"reason":"ExitCode","message":"-1"}]}}', 126),
        "not JSON": (b"\x1b]0;owned\x07", 126),
        "a 10 MB message": (b'{"status":"Failure","message":"' + b"x" * 10_000_000 + b'"}', 126),
        "a real exit 3": (b'{"status":"Failure","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}', 3),
        "a superscript digit": (
            b'{"status":"Failure","details":{"causes":[{"reason":"ExitCode","message":"\xc2\xb2"}]}}',
            126,
        ),
        "5000 digits": (
            b'{"status":"Failure","details":{"causes":[{"reason":"ExitCode","message":"' + b"9" * 5000 + b'"}]}}',
            126,
        ),
        "JSON nested 100000 deep": (b"[" * 100_000, 126),
        "escapes in the message": (rb'{"status":"Failure","message":"\u001b]0;owned\u0007 \u001b[2J"}', 126),
    }
    for case, (raw, want) in cases.items():
        code, message = exit_status(raw)
        held = code == want and len(message) <= 500 and "\x1b" not in message
        adversary.tried("k8s API server", f"exec status: {case}", refused=held)
        assert held, (case, code, message[:100])


def test_a_pod_named_with_terminal_escapes_is_printed_harmless(adversary: Adversary) -> None:
    pod = {"metadata": {"name": "p\x1b[2J\x1b]0;x\x07", "namespace": "n", "deletionTimestamp": "now"}}
    verdict = pod_verdict(pod, None, None)
    adversary.tried(
        "k8s API server", "terminal escapes in a pod's name", refused=verdict is not None and "\x1b" not in verdict
    )
    assert verdict is not None and "\x1b" not in verdict and "\x07" not in verdict


# -- a hostile server, over the real transport -------------------------------------------------


async def _exec_flood_line(request: web.Request) -> web.WebSocketResponse:
    """stdout that is one endless line: the reader's bound must stop it."""
    ws = web.WebSocketResponse(protocols=("v5.channel.k8s.io",))
    await ws.prepare(request)
    chunk = b"\x01" + b"x" * 65536
    try:
        for _ in range(10_000):  # 640 MB if nothing stops it
            await ws.send_bytes(chunk)
    except (ConnectionError, RuntimeError):
        pass
    return ws


async def _exec_no_status(request: web.Request) -> web.WebSocketResponse:
    """Output, then a close without any Status: the command's end is unknown, not a success."""
    ws = web.WebSocketResponse(protocols=("v5.channel.k8s.io",))
    await ws.prepare(request)
    await ws.send_bytes(b"\x01hello\n")
    await ws.close()
    return ws


async def _exec_no_protocol(request: web.Request) -> web.WebSocketResponse:
    ws = web.WebSocketResponse()  # no channel protocol negotiated at all
    await ws.prepare(request)
    await ws.close()
    return ws


async def _pod(request: web.Request) -> web.Response:
    name = request.match_info["pod"]
    if request.headers.get("Authorization") != f"Bearer {request.app[TOKEN][0]}":
        return web.json_response({"kind": "Status", "reason": "Unauthorized", "code": 401}, status=401)
    if name == "listy":
        return web.json_response([1, 2, 3])  # not an object
    return web.json_response(
        {
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"containers": [{"name": "main"}, {"name": "../../x"}, "junk"]},
            "status": {"phase": "Running", "containerStatuses": [{"name": "main", "state": {"running": {}}}]},
        }
    )


@contextlib.asynccontextmanager
async def hostile_server(tmp_path: Path) -> AsyncIterator[Path]:
    """A plain-HTTP hostile API server on loopback and a kubeconfig naming it."""
    app = web.Application()
    app[TOKEN] = ["t"]
    app.router.add_get("/api/v1/namespaces/{ns}/pods/{pod}", _pod)
    app.router.add_get("/api/v1/namespaces/{ns}/pods/flood/exec", _exec_flood_line)
    app.router.add_get("/api/v1/namespaces/{ns}/pods/nostatus/exec", _exec_no_status)
    app.router.add_get("/api/v1/namespaces/{ns}/pods/noproto/exec", _exec_no_protocol)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    config = tmp_path / "kubeconfig"
    config.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "h", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "h", "context": {"cluster": "h", "user": "u"}}],
                "current-context": "h",
            }
        )
    )
    hostile_apps.append(app)
    yield config
    await runner.cleanup()


hostile_apps: list[web.Application] = []


async def _run(config: Path, pod: str, argv: list[str]) -> tuple[int, bytes]:
    transport = K8sTransport("ns", pod, "main", kubeconfig=str(config))
    try:
        return await asyncio.wait_for(transport.exec_capture(argv), 60)
    finally:
        await transport.aclose()


async def test_an_endless_stdout_is_cut_at_the_capture_bound(
    tmp_path: Path, adversary: Adversary, monkeypatch: pytest.MonkeyPatch
) -> None:
    from remote_exec.errors import ProtocolError
    from remote_exec.sandboxes import base

    monkeypatch.setattr(base, "MAX_CAPTURE", 4 << 20)  # the same code path, at a size a test can afford
    async with hostile_server(tmp_path) as hostile:
        with pytest.raises(ProtocolError, match="answered more than"):
            await _run(hostile, "flood", ["cat"])
    adversary.tried("k8s API server", "an endless stdout through an exec", refused=True)


async def test_a_close_without_status_is_no_success(tmp_path: Path, adversary: Adversary) -> None:
    async with hostile_server(tmp_path) as hostile:
        code, out = await _run(hostile, "nostatus", ["true"])
    adversary.tried("k8s API server", "an exec closed without a Status reads as exit 0", refused=code != 0)
    assert (code, out) == (-9, b"hello\n")


async def test_an_exec_without_a_channel_protocol_is_refused(tmp_path: Path, adversary: Adversary) -> None:
    async with hostile_server(tmp_path) as hostile:
        with pytest.raises(SandboxError, match="no channel protocol we speak"):
            await _run(hostile, "noproto", ["true"])
    adversary.tried("k8s API server", "an exec WebSocket with no channel protocol", refused=True)


async def test_a_pod_read_that_is_no_object_or_names_bad_containers(tmp_path: Path, adversary: Adversary) -> None:
    async with hostile_server(tmp_path) as hostile:
        for pod, container, error in (("listy", None, "no object"), ("mixed", "x", "has no container x")):
            transport = K8sTransport("ns", pod, container, kubeconfig=str(hostile))
            try:  # "../../x" in the pod's list is no container name we would use
                with pytest.raises(SandboxError, match=error):
                    await transport.check_reachable()
            finally:
                await transport.aclose()
    adversary.tried("k8s API server", "a pod read that is a list / names a path as a container", refused=True)


async def test_an_expired_token_is_reloaded_once_and_the_request_asked_again(tmp_path: Path) -> None:
    """The server starts refusing the token it accepted (an exec plugin's token expired); the
    kubeconfig now gives a new one: one reload, the request asked once more, no error."""
    async with hostile_server(tmp_path) as hostile:
        transport = K8sTransport("ns", "mixed", "main", kubeconfig=str(hostile))
        try:
            await transport.check_reachable()  # token "t" accepted
            hostile_apps[-1][TOKEN][0] = "t2"  # rotated on the server...
            hostile.write_text(hostile.read_text().replace('"token": "t"', '"token": "t2"'))  # ...and in the kubeconfig
            pod = await transport.read_pod()
            assert pod["metadata"]["name"] == "mixed"
        finally:
            await transport.aclose()


async def test_a_pod_made_again_under_its_name_is_a_verdict_not_the_same_pod() -> None:
    """Deleted and made again while the watch was down, a pod of the same name (a relist shows
    only the new one) is not ours: our agent and jobs died with the old one, and its restart
    count (0 again) said nothing. Its ``metadata.uid`` tells them apart."""
    never = asyncio.Event()

    class SilentServer:  # the API server, as far as a watch whose stream never comes sees it
        async def stream(self, path: str, **query: str) -> Any:
            await never.wait()

    watch = PodWatch(SilentServer(), "ns")
    told: list[str] = []
    sub = watch.subscribe("p", "main", told.append)
    try:
        pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u-1"}, "status": {"phase": "Running"}}
        watch.update(pod)
        watch.update(pod)  # the same pod again: nothing to say
        assert told == [] and sub.verdict is None
        watch.update({**pod, "metadata": {**pod["metadata"], "uid": "u-2"}})
        assert told == [sub.verdict] and "ns/p was replaced by another of its name" in told[0], told
    finally:
        await watch.aclose()
