"""The widgets' control route without a browser: the kernel's control socket and the server's
handler, driven for real (an aiohttp client on the socket; a real jupyter_server for the route).

What a page sends is hostile: a request without the kernel's token, naming an unknown widget,
too large, or to a socket name with path characters is refused, and the socket is private.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.cookiejar
import json
import os
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import remote_exec as rx
from remote_exec.jupyter import JobView
from remote_exec.jupyter.controls import (
    MAX_BODY,
    SOCKET_DIR,
    SWEEP_MIN_AGE,
    TOKEN_HEADER,
    ControlServer,
    private_dir,
    server_for,
    socket_address,
    sweep_stale,
)
from remote_exec.jupyter.follow import loop_of
from remote_exec.jupyter.headless import HeadlessFrontEnd

from .conftest import gone, wait_for
from .lab_page import serving_jupyter


@pytest.fixture(scope="module")
def runtime() -> Iterator[Path]:
    """A runtime dir so deep that a socket's path in it is longer than ``sun_path`` (107 bytes),
    as a test's temp dir under pytest-xdist or a deep home is: the kernel binds and the route
    connects through the directory's fd (``socket_address``)."""
    top = Path(tempfile.mkdtemp(prefix="rx-rt-"))
    path = top / ("deep-" * 16) / "runtime"
    path.mkdir(parents=True)
    assert len(os.fsencode(path / f"{SOCKET_DIR}-host" / ("k-" + "0" * 32 + ".sock"))) > 107
    yield path
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture(autouse=True)
def runtime_env(runtime: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(runtime))


@pytest.fixture(autouse=True)
def no_lost_task(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """No task of a widget failed unseen (a control trait sent before the view was built did)."""
    yield
    lost = [r.getMessage() for r in caplog.records if "Task exception was never retrieved" in r.getMessage()]
    assert not lost, lost


def _view(sb: rx.Sandbox) -> tuple[JobView, int]:
    proc = sb.exec_remote(["bash", "-c", "echo started; exec sleep 300"])
    view = JobView(proc, command="sleep")
    wait_for(lambda: view.controls and view.text("stdout") == "started\n", what="the view's controls")
    assert proc.pid is not None
    return view, proc.pid


def _post(sock: Path, body: bytes, token: str) -> tuple[int, Any]:
    async def go(address: str) -> tuple[int, Any]:
        async with (
            aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=address)) as http,
            http.post("http://kernel/control", data=body, headers={TOKEN_HEADER: token}) as r,
        ):
            return r.status, await r.json(content_type=None)

    with socket_address(sock) as address:
        return asyncio.run(go(address))


def _socket_of(sb: rx.Sandbox) -> Path:
    path = server_for(loop_of(sb).loop).path
    assert path is not None
    return path


def test_kill_by_the_control_socket(sb: rx.Sandbox, front: HeadlessFrontEnd) -> None:
    view, pid = _view(sb)
    controls = view.controls
    body = json.dumps({"widget": controls["widget"], "type": "kill"}).encode()
    assert _post(_socket_of(sb), body, controls["token"]) == (200, {"ok": True, "reason": "ok"})
    assert gone(pid)
    outcome = view.wait(30)
    assert outcome is not None and outcome.state == "killed"


def test_fetch_by_the_control_socket_answers_by_the_comm(sb: rx.Sandbox, front: HeadlessFrontEnd) -> None:
    view, _ = _view(sb)
    body = json.dumps({"widget": view.controls["widget"], "type": "fetch", "stream": "stdout", "purpose": "copy"})
    assert _post(_socket_of(sb), body.encode(), view.controls["token"])[0] == 200
    wait_for(lambda: any(m["kind"] == "full" for m in front.custom(view)), what="the fetched text")
    (full,) = [m for m in front.custom(view) if m["kind"] == "full"]
    assert full["data"]["text"] == "started\n"
    view.kill()


def test_stdin_lines_by_the_control_socket_keep_their_order(sb: rx.Sandbox, front: HeadlessFrontEnd) -> None:
    proc = sb.exec_remote(["bash", "-c", "echo ready; head -n 3"], stdin_open=True)
    view = JobView(proc, command="head")
    wait_for(lambda: view.controls and view.text("stdout") == "ready\n", what="the view's controls")
    sock, token, widget = _socket_of(sb), view.controls["token"], view.controls["widget"]
    for n in (1, 2, 0):  # numbered by the view; they may arrive out of order (concurrent requests)
        body = {"widget": widget, "type": "stdin", "data": f"line {n}\n", "view": "v1", "n": n}
        assert _post(sock, json.dumps(body).encode(), token)[0] == 200
    outcome = view.wait(30)
    assert outcome is not None and outcome.state == "completed"
    assert view.text("stdout") == "ready\nline 0\nline 1\nline 2\n"


def test_refusals_leave_the_job_running(sb: rx.Sandbox, front: HeadlessFrontEnd) -> None:
    view, pid = _view(sb)
    sock, token, widget = _socket_of(sb), view.controls["token"], view.controls["widget"]
    kill = json.dumps({"widget": widget, "type": "kill"}).encode()
    assert _post(sock, kill, "")[0] == 403
    assert _post(sock, kill, token[:-1] + ("a" if token[-1] != "a" else "b"))[0] == 403
    assert _post(sock, kill, secrets.token_urlsafe(32))[0] == 403  # another kernel's, or a guess
    assert _post(sock, json.dumps({"widget": "nope", "type": "kill"}).encode(), token)[0] == 404
    assert _post(sock, json.dumps({"widget": widget * 3, "type": "kill"}).encode(), token)[0] == 400
    assert _post(sock, json.dumps({"type": "kill"}).encode(), token)[0] == 400
    assert _post(sock, b"[1]", token)[0] == 400
    assert _post(sock, b"{", token)[0] == 400
    big = json.dumps({"widget": widget, "type": "kill", "pad": "x" * MAX_BODY}).encode()
    assert _post(sock, big, token)[0] == 413
    # every answer is in: had any of them acted, the kill would be under way
    assert not gone(pid, timeout=0)
    view.kill()
    assert gone(pid)


def test_the_socket_is_private(sb: rx.Sandbox, runtime: Path) -> None:
    _view(sb)[0].kill()
    sock = _socket_of(sb)
    assert sock.parent.parent == runtime and sock.parent.name.startswith(f"{SOCKET_DIR}-")  # this host's
    st_dir, st_sock = os.lstat(sock.parent), os.lstat(sock)
    assert stat.S_IMODE(st_dir.st_mode) == 0o700 and st_dir.st_uid == os.geteuid()
    assert stat.S_ISSOCK(st_sock.st_mode) and stat.S_IMODE(st_sock.st_mode) == 0o600


def test_a_private_dir_is_made_private_or_refused(tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    os.chmod(loose, 0o755)
    assert stat.S_IMODE(os.lstat(private_dir(loose)).st_mode) == 0o700  # ours, from an old umask
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "link"
    link.symlink_to(elsewhere)
    with pytest.raises(PermissionError):
        private_dir(link)
    plain = tmp_path / "file"
    plain.write_text("")
    with pytest.raises(PermissionError):
        private_dir(plain)


SERVE_AND_WAIT = """
import asyncio, sys
from pathlib import Path
from remote_exec.jupyter.controls import ControlServer
async def main():
    server = ControlServer(Path(sys.argv[1]))
    await server.start()
    print(server.name, flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


def test_a_killed_kernels_socket_is_removed_by_the_next_one(tmp_path: Path) -> None:
    """A kernel killed with SIGKILL never runs its exit handler: its socket file stays. The next
    kernel to start a server removes it (nobody listens: connect is refused), and leaves a live
    kernel's socket and anything not a control socket of ours."""
    directory = private_dir(tmp_path / SOCKET_DIR)
    procs = [
        subprocess.Popen([sys.executable, "-c", SERVE_AND_WAIT, str(directory)], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        killed, alive = (p.stdout.readline().strip() if p.stdout else "" for p in procs)
        procs[0].kill()
        procs[0].wait()
        (directory / "notes.txt").write_text("not a socket")
        young = directory / ("k-" + "1" * 32 + ".sock")  # bound, not yet listening: a kernel starting
        with socket.socket(socket.AF_UNIX) as s, socket_address(young) as address:
            s.bind(address)
        old = time.time() - SWEEP_MIN_AGE - 1
        for name in (killed, alive):
            os.utime(directory / name, (old, old))
        assert {killed, alive} <= {e.name for e in directory.iterdir()}

        async def start() -> ControlServer:
            server = ControlServer(directory)
            await server.start()
            await server.close()
            return server

        asyncio.run(start())
        left = {e.name for e in directory.iterdir()}
        assert killed not in left and alive in left and "notes.txt" in left and young.name in left
        assert sweep_stale(directory) == []  # the live one answers: kept
    finally:
        for p in procs:
            p.kill()
            p.communicate()  # reaped, its pipe closed


# -- the server's route, in a real jupyter_server ---------------------------------------------------


@pytest.fixture(scope="module")
def server(runtime: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A Jupyter Server with the route enabled, on the runtime dir the kernel side uses."""
    root = tmp_path_factory.mktemp("server")
    token = secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(runtime), "JUPYTER_CONFIG_DIR": str(root / "config")}
    log = (root / "server.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter_server",
            "--no-browser",
            "--allow-root",
            "--ServerApp.ip=127.0.0.1",
            "--ServerApp.port=0",  # its own pick (see serving_jupyter)
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root}",
            "--ServerApp.jpserver_extensions={'remote_exec.jupyter.control_route': True}",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        base = serving_jupyter(proc, runtime, token, root / "server.log") + "/"
        yield base, token
    finally:
        proc.terminate()
        proc.wait(15)
        log.close()


def _route(base: str, name: str, body: bytes, *, auth: str | None, kernel_token: str) -> int:
    headers = {TOKEN_HEADER: kernel_token, "Content-Type": "application/json"}
    if auth is not None:
        headers["Authorization"] = f"token {auth}"
    request = urllib.request.Request(f"{base}remote-exec/controls/{name}", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_the_route_forwards_to_the_kernel_and_refuses_the_rest(
    sb: rx.Sandbox, front: HeadlessFrontEnd, server: tuple[str, str], runtime: Path, agent_dir: Path
) -> None:
    base, auth = server
    view, pid = _view(sb)
    name, token, widget = view.controls["socket"], view.controls["token"], view.controls["widget"]
    kill = json.dumps({"widget": widget, "type": "kill"}).encode()
    assert _route(base, name, kill, auth=None, kernel_token=token) == 403  # not logged in to Jupyter
    # A name that climbs out of the dir to another socket of ours (the agent's: it runs commands).
    agent_sock = agent_dir / "agent.sock"  # (not found by a walk: the running agent renames dirs under it)
    assert agent_sock.is_socket()
    climb = os.path.relpath(agent_sock, _socket_of(sb).parent).replace("/", "%2F")
    for bad in (climb, "..", "..%2F..%2Fx", "k-..%2Fx.sock", "x" * 100, name[:-5] + "%00.sock", name + "x"):
        assert _route(base, bad, kill, auth=auth, kernel_token=token) == 400, bad  # refused by its name
    absent = "k-" + "0" * 32 + ".sock"
    assert _route(base, absent, kill, auth=auth, kernel_token=token) == 404
    assert _route(base, name, kill, auth=auth, kernel_token="") == 403
    assert _route(base, name, kill, auth=auth, kernel_token=secrets.token_urlsafe(32)) == 403
    assert _route(base, name, b"x" * (MAX_BODY + 1), auth=auth, kernel_token=token) == 413
    other = json.dumps({"widget": "nope", "type": "kill"}).encode()
    assert _route(base, name, other, auth=auth, kernel_token=token) == 404
    assert not gone(pid, timeout=0)  # every refusal answered, the job untouched
    assert _route(base, name, kill, auth=auth, kernel_token=token) == 200
    assert gone(pid)


def test_the_route_checks_xsrf_for_a_cookie_login(
    sb: rx.Sandbox, front: HeadlessFrontEnd, server: tuple[str, str]
) -> None:
    """Logged in by cookie (as a browser is), a POST needs the ``_xsrf`` cookie's value in
    ``X-XSRFToken``: a page of another origin cannot read that cookie, so it cannot post."""
    base, auth = server
    view, pid = _view(sb)
    name, token, widget = view.controls["socket"], view.controls["token"], view.controls["widget"]
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    with opener.open(f"{base}api/status?token={auth}", timeout=30):
        pass  # the server sets its login cookie
    with contextlib.suppress(urllib.error.HTTPError), opener.open(f"{base}login", timeout=30):
        pass  # a page sets the _xsrf cookie
    xsrf = next((c.value for c in jar if c.name == "_xsrf"), None)
    assert xsrf and any(c.name.startswith("username-") for c in jar), [c.name for c in jar]

    def post(headers: dict[str, str]) -> int:
        body = json.dumps({"widget": widget, "type": "kill"}).encode()
        request = urllib.request.Request(
            f"{base}remote-exec/controls/{name}",
            data=body,
            headers={TOKEN_HEADER: token, "Content-Type": "application/json", **headers},
            method="POST",
        )
        try:
            with opener.open(request, timeout=30) as r:
                return int(r.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    assert post({}) == 403  # the cookie alone
    assert post({"X-XSRFToken": "not-the-cookie"}) == 403
    assert not gone(pid, timeout=0)
    assert post({"X-XSRFToken": xsrf}) == 200
    assert gone(pid)
