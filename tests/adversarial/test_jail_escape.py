"""Escapes from ``jail://`` (issue #12, points 2 and 4), tried from inside a real bubblewrap box.

Point 2: a job must not reach a host Unix socket it was not given (a root daemon's, a root
``local://`` agent's), nor run with any host uid that owns something, nor see the host's
``/sys``. Point 4: ``jail://PID`` must attach only to a box we started, never to a look-alike
another user (or root, by hand) made.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import remote_exec as rx
from remote_exec.sandboxes.jail import JailTransport

from ..conftest import stop_agent
from ..sandboxes.backend_jail import require_jail
from .conftest import Adversary

pytestmark = [pytest.mark.anyio, pytest.mark.backend]  # bubblewrap

AREA = "jail escape"
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]

# From inside the box: connect to a Unix socket and say what happened.
CONNECT_UNIX = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError as exc:
    print(type(exc).__name__)
else:
    print("connected")
"""
# From inside the box: drive a host local:// agent to write a file on the host.
DRIVE_AGENT = """
import asyncio, socket, sys
import remote_exec as rx

async def main(state, target):
    socket.socket(socket.AF_UNIX).connect(state + "/agent.stream")  # never start an agent of our own
    async with rx.open_sandbox("local://?dir=" + state) as sb:
        await sb.run(["touch", target])
    print("escaped")

asyncio.run(main(*sys.argv[1:]))
"""


@pytest.fixture(scope="module", autouse=True)
def _needs_bwrap(tmp_path_factory: pytest.TempPathFactory) -> None:
    if os.geteuid() != 0:
        pytest.skip("these attacks need a root host side (root's sockets, other uids)")
    require_jail(tmp_path_factory.mktemp("jail-probe"))


@pytest.fixture
def var_tmp() -> Iterator[Path]:
    """A root-only dir under the host's /var/tmp (outside /run, /tmp and /dev, where the box
    used to see everything read-only)."""
    path = Path(tempfile.mkdtemp(prefix="jail-escape-", dir="/var/tmp"))
    try:
        yield path
    finally:
        stop_agent(path / "agent")  # a test's host agent (and its keeper): its dir goes next
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def root_socket(var_tmp: Path) -> Iterator[tuple[Path, list[bytes]]]:
    """A root-owned 0600 Unix socket server (a root daemon); yields its path and what it accepted."""
    path = var_tmp / "daemon.sock"
    accepted: list[bytes] = []
    server = socket.socket(socket.AF_UNIX)
    server.bind(os.fspath(path))
    path.chmod(0o600)
    server.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepted.append(b"conn")
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield path, accepted
    finally:
        server.shutdown(socket.SHUT_RDWR)
        server.close()
        thread.join(5)


async def test_root_socket_outside_run_is_out_of_reach(
    root_socket: tuple[Path, list[bytes]], adversary: Adversary
) -> None:
    path, accepted = root_socket
    async with rx.open_sandbox("jail://") as sb:
        hidden = await sb.run([sys.executable, "-c", CONNECT_UNIX, os.fspath(path)])
    adversary.tried(AREA, "connect to a root 0600 socket in /var/tmp", refused=hidden.stdout != "connected\n")
    assert hidden.stdout == "FileNotFoundError\n" and accepted == []  # /var is not in the box


async def test_root_socket_bound_on_request_is_still_refused(
    root_socket: tuple[Path, list[bytes]], adversary: Adversary
) -> None:
    path, accepted = root_socket
    async with rx.open_sandbox(f"jail://?ro={path.parent}") as sb:  # asked for: visible, not usable
        bound = await sb.run([sys.executable, "-c", CONNECT_UNIX, os.fspath(path)])
    adversary.tried(AREA, "connect to a root 0600 socket bound with ?ro=", refused=bound.stdout != "connected\n")
    assert bound.stdout == "PermissionError\n" and accepted == []  # the job is not root


async def test_root_local_agent_cannot_be_driven(var_tmp: Path, adversary: Adversary) -> None:
    state = var_tmp / "agent"
    target = var_tmp / f"escaped-{uuid.uuid4().hex}"
    async with rx.open_sandbox(f"local://?dir={state}") as host_agent:
        assert (await host_agent.run(["true"])).returncode == 0  # it serves the host
        for url in ("jail://", f"jail://?ro={var_tmp}"):
            async with rx.open_sandbox(url) as sb:
                res = await sb.run([sys.executable, "-c", DRIVE_AGENT, os.fspath(state), os.fspath(target)])
            adversary.tried(AREA, f"drive a root local:// agent in /var/tmp from {url}", refused=not target.exists())
            assert "escaped" not in res.stdout and res.returncode != 0 and not target.exists()
    assert not target.exists()


def host_uid_of(marker: str) -> str:
    """The host-side real uid of the process whose argv holds ``marker`` (waits for it)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0"):
                    return _status_uid(Path(f"/proc/{entry}/status").read_text())
            except OSError:
                continue
        time.sleep(0.01)
    raise AssertionError(f"no process with {marker} in its argv")


def _status_uid(status: str) -> str:
    return next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:"))


async def test_jobs_run_as_an_unprivileged_uid(adversary: Adversary) -> None:
    marker = f"jail-uid-probe-{uuid.uuid4().hex}"
    async with rx.open_sandbox("jail://") as sb:
        inside = await sb.run(["sh", "-c", "id -u; id -G; grep CapEff /proc/self/status"])
        job = await sb.exec_remote(["sh", "-c", "sleep 300; :", marker]).started()
        host_uid = host_uid_of(marker)
        agent_uid = _status_uid(str((await sb.run(["cat", f"/proc/{sb.info.pid}/status"])).stdout))
        await job.kill()
    uid, groups, cap = inside.stdout.splitlines()
    adversary.tried(AREA, "job runs as host root", refused=host_uid != "0" and uid != "0")
    assert uid == groups == host_uid == agent_uid == "65533"
    assert cap.split() == ["CapEff:", "0000000000000000"]


async def test_box_does_not_see_the_hosts_sys(adversary: Adversary) -> None:
    async with rx.open_sandbox("jail://") as sb:
        res = await sb.run(["sh", "-c", "ls /sys/class/net || ls -A /sys /sys/fs"])
    host_links = set(os.listdir("/sys/class/net")) - {"lo"}
    adversary.tried(AREA, "list host network interfaces in /sys", refused=not host_links & set(res.stdout.split()))
    # No /sys at all, or (as root) only the box's own cgroup dirs at /sys/fs/cgroup.
    assert res.stdout == "" or res.stdout.split() == ["/sys:", "fs", "/sys/fs:", "cgroup"], res.stdout


def _wait(predicate: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + 10
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@pytest.fixture
def look_alikes(tmp_path: Path) -> Iterator[dict[str, int]]:
    """Boxes we did not start: an unprivileged ``unshare -Urpm`` (both of its processes) and
    bwraps started by hand, by root and by another uid."""
    procs: list[subprocess.Popen[bytes]] = []
    found: dict[str, int] = {}
    inits: list[int] = []  # pidfds of the boxes' inits (not our children: no pid of theirs is reused meanwhile)

    def start(argv: list[str]) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, pass_fds=(w,))
        procs.append(proc)
        return proc

    r, w = os.pipe()
    try:
        unshare = start([*NOBODY, "unshare", "-Urpm", "--fork", "sleep", "1000"])
        _wait(lambda: children(unshare.pid), "unshare's child")
        found["unshare -Urpm by uid 65534"] = unshare.pid
        found["unshare -Urpm --fork child by uid 65534"] = children(unshare.pid)[0]
        inits.append(os.pidfd_open(found["unshare -Urpm --fork child by uid 65534"]))
        bwrap = ["bwrap", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/run"]
        marked = ["--dir", "/run/remote-exec-jail", "--unshare-all"]
        like_ours = ["--unshare-pid", "--unshare-net"]  # root, no user namespace: as we start it
        with os.fdopen(r, "rb", buffering=0) as status:
            for case, argv in (
                ("bwrap by hand by root (with our marker dir)", [*bwrap, *marked]),
                ("bwrap by hand by uid 65534 (with our marker dir)", [*NOBODY, *bwrap, *marked]),
                ("bwrap by hand by root, namespaces like ours, no marker", [*bwrap, *like_ours]),
            ):
                start([*argv, "--json-status-fd", str(w), "--", "sleep", "1000"])
                found[case] = json.loads(status.readline())["child-pid"]
                inits.append(os.pidfd_open(found[case]))
            os.close(w)
            yield found
    finally:
        # Each box's init first: killing bwrap or unshare leaves the box it started running (its
        # init is in a pid namespace of its own), and every run of this test left three boxes
        # and four sleeps behind.
        for fd in inits:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            os.close(fd)
        for proc in procs:
            proc.kill()
            proc.wait()


async def test_attach_refuses_boxes_we_did_not_start(look_alikes: dict[str, int], adversary: Adversary) -> None:
    expected = {
        "unshare -Urpm by uid 65534": "not the init of a bubblewrap box",
        "unshare -Urpm --fork child by uid 65534": "not the init of a bubblewrap box",
        "bwrap by hand by root (with our marker dir)": "user namespace we do not make",
        "bwrap by hand by uid 65534 (with our marker dir)": "box of another user",
        "bwrap by hand by root, namespaces like ours, no marker": "remote_exec did not start",
    }
    for case, pid in look_alikes.items():
        with pytest.raises(rx.SandboxError) as caught:
            async with rx.open_sandbox(f"jail://{pid}"):
                pass
        adversary.tried(AREA, f"jail://PID on {case}", refused=True)
        assert expected[case] in str(caught.value), (case, caught.value)


async def test_attach_accepts_our_own_box() -> None:
    async with rx.open_sandbox("jail://") as owner:
        assert isinstance(owner.transport, JailTransport)
        async with rx.open_sandbox(f"jail://{owner.transport.pid}") as guest:
            assert (await guest.run(["id", "-u"])).stdout == "65533\n"
