"""Liveness faults on real backends: a paused or killed container, a frozen agent in a jail,
a dropped or silent SSH link. Each ends in the precise error within the bound (printed, for the
CI log), or resumes from its cursors; never a hang, never a normal-looking end."""

from __future__ import annotations

import hashlib
import os
import secrets
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

import remote_exec as rx
from remote_exec.client.channel import DEFAULT_LIVENESS

from ..client.test_liveness import EXPECTED, JOB, SHORT_LIVENESS, as_bytes, frozen_then_thawed
from .backend_docker import docker_or_skip, image_or_skip
from .dockerd import Dockerd
from .sshd import SSHServer, SSHServerUnavailable, running_sshd

pytestmark = pytest.mark.anyio
# The freezes are noticed by the heartbeat within SHORT_LIVENESS's bound, the sandboxes opened
# with it as a user would (tests/client/test_liveness.py waits out the default on local://).
BOUND = SHORT_LIVENESS.bound


@pytest.fixture
def usr_container() -> Iterator[tuple[Dockerd, str]]:
    engine = docker_or_skip()
    name = engine.run(f"rx-live-{secrets.token_hex(4)}", image_or_skip(engine, "usr"), "-v", "/usr:/usr:ro")
    yield engine, name
    engine.docker("unpause", name, check=False)
    engine.docker("rm", "-f", name, check=False)


async def _first_chunk(proc: rx.ExecRemoteProcess, got: bytearray) -> None:
    async for ev in proc:
        assert isinstance(ev, rx.StdoutChunk)
        got += as_bytes(ev.data)
        return


async def _rest(proc: rx.ExecRemoteProcess, got: bytearray) -> None:
    with anyio.fail_after(60):
        async for ev in proc:
            if isinstance(ev, rx.StdoutChunk):
                got += as_bytes(ev.data)
            elif isinstance(ev, rx.Completed):
                assert ev.exit_code == 0


async def test_docker_pause_is_unresponsive_then_unpause_resumes(usr_container: tuple[Dockerd, str]) -> None:
    engine, name = usr_container
    async with rx.open_sandbox(f"docker://{name}", liveness=SHORT_LIVENESS) as sb:
        proc = sb.exec_remote(["sh", "-c", JOB])
        got = bytearray()
        await _first_chunk(proc, got)
        engine.docker("pause", name)
        t0 = time.monotonic()
        try:
            with anyio.fail_after(BOUND + 15), pytest.raises(rx.AgentUnresponsiveError, match="is paused") as caught:
                async for ev in proc:
                    if isinstance(ev, rx.StdoutChunk):
                        got += as_bytes(ev.data)
            elapsed = time.monotonic() - t0
            kind = type(caught.value).__name__
            print(f"\ndocker pause: {kind} after {elapsed:.2f} s (bound {BOUND:g} s): {caught.value}")
            assert name in str(caught.value)
            assert sb.link.state == "lost"  # what the views show: "agent not answering"
        finally:
            engine.docker("unpause", name)
        await _rest(proc, got)
        assert sb.link.status.state == "connected"  # (a fresh read: mypy narrowed .state above)
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(EXPECTED).hexdigest()


async def test_killed_container_is_sandbox_lost(usr_container: tuple[Dockerd, str]) -> None:
    engine, name = usr_container
    async with rx.open_sandbox(f"docker://{name}") as sb:
        proc = sb.exec_remote(["sh", "-c", "echo up; sleep 300"])
        assert await anext(aiter(proc)) == rx.StdoutChunk("up\n")
        engine.docker("kill", name)
        t0 = time.monotonic()
        bound = DEFAULT_LIVENESS.bound  # (opened with the default)
        with anyio.fail_after(bound + 15), pytest.raises(rx.SandboxLostError, match=name) as caught:
            await anext(aiter(proc))
        elapsed = time.monotonic() - t0
        print(f"\ndocker kill: {type(caught.value).__name__} after {elapsed:.2f} s (bound {bound:g} s): {caught.value}")
        assert sb.link.state == "gone" and name in sb.link.status.reason  # the views: "sandbox gone"


async def test_sigstopped_agent_in_a_jail(tmp_path: Path) -> None:
    from .backend_jail import jail_unavailable_reason
    from .conftest import unavailable

    (tmp_path / "probe").mkdir()
    why = jail_unavailable_reason(tmp_path / "probe")
    if why:
        unavailable(why)
    async with rx.open_sandbox("jail://", liveness=SHORT_LIVENESS) as sb:
        await frozen_then_thawed(sb, [_host_pid_of_agent(sb)], "jail: SIGSTOP agent")


def _host_pid_of_agent(sb: rx.AsyncSandbox) -> int:
    """The agent's PID as the host sees it (the box has its own PID namespace)."""
    start = sb.info.started_at
    box_pid = sb.transport.pid  # type: ignore[attr-defined]
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            status = Path(f"/proc/{name}/status").read_text()
        except OSError:
            continue
        nspid = [line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")]
        if nspid and len(nspid[0]) > 1 and int(nspid[0][-1]) == sb.info.pid and _in_box(int(name), box_pid):
            return int(name)
    raise AssertionError(f"no host process for the agent (pid {sb.info.pid} in the box, started {start})")


def _in_box(pid: int, box_pid: int) -> bool:
    return os.readlink(f"/proc/{pid}/ns/pid") == os.readlink(f"/proc/{box_pid}/ns/pid")


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[SSHServer]:
    try:
        import asyncssh  # noqa: F401
    except ImportError:
        pytest.skip("asyncssh is not installed")
    try:
        with running_sshd(tmp_path / "sshd") as server:
            yield server
    except SSHServerUnavailable as exc:
        pytest.skip(str(exc))


def _connection_processes(listener: int) -> list[int]:
    """sshd's per-connection processes: the listener's children (and theirs, sshd's only)."""
    found: list[int] = []
    parents = {listener}
    for _ in range(3):
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) in found:
                continue
            try:
                stat = Path(f"/proc/{name}/stat").read_bytes()
                comm = Path(f"/proc/{name}/comm").read_text().strip()
            except OSError:
                continue
            ppid = int(stat[stat.rfind(b")") + 2 :].split()[1])
            if ppid in parents and comm == "sshd":
                found.append(int(name))
                parents.add(int(name))
    return found


async def test_killed_ssh_session_process_reconnects_without_loss(sshd: SSHServer, tmp_path: Path) -> None:
    """A dropped link (sshd's per-connection process killed) with sshd still listening: the
    channel reconnects over a new connection and the stream resumes whole, no error at all."""
    listener = int((tmp_path / "sshd" / "sshd.pid").read_text())
    async with rx.open_sandbox(sshd.url()) as sb:
        proc = sb.exec_remote(["sh", "-c", JOB])
        got = bytearray()
        await _first_chunk(proc, got)
        victims = _connection_processes(listener)
        assert victims
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        await _rest(proc, got)
        print(f"\nssh session process killed: stream resumed and ended {time.monotonic() - t0:.2f} s later")
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(EXPECTED).hexdigest()


async def test_silent_ssh_link_is_unresponsive_then_resumes(sshd: SSHServer, tmp_path: Path) -> None:
    """A link that goes silent without closing (sshd's per-connection processes stopped): the
    precise error within the bound; the next read resumes over a new connection."""
    listener = int((tmp_path / "sshd" / "sshd.pid").read_text())
    # A shorter bound, which the first connection takes too (its agent probe's request comes
    # before the sandbox sets it: that connection kept the default once).
    async with rx.open_sandbox(sshd.url(), liveness=SHORT_LIVENESS) as sb:
        await frozen_then_thawed(sb, _connection_processes(listener), "ssh: silent link (sshd SIGSTOP)")


def _host_pid(engine: Dockerd, container: str, pid_inside: int) -> int:
    """The host's pid of process ``pid_inside`` of ``container`` (same pid namespace as its init,
    and ``pid_inside`` last in its ``NSpid``)."""
    init = int(engine.docker("inspect", "-f", "{{.State.Pid}}", container).stdout)
    ns = os.readlink(f"/proc/{init}/ns/pid")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/pid") != ns:
                continue
            nspid = next(ln for ln in Path(f"/proc/{entry}/status").read_text().splitlines() if ln.startswith("NSpid"))
        except (OSError, StopIteration):
            continue
        if int(nspid.split()[-1]) == pid_inside:
            return int(entry)
    raise AssertionError(f"no process {pid_inside} in container {container}")


async def test_sigstopped_agent_in_a_container(usr_container: tuple[Dockerd, str]) -> None:
    """The agent alone frozen (the container runs on): the precise error within the bound,
    then SIGCONT and the stream resumes from its cursors, every byte there."""
    engine, name = usr_container
    async with rx.open_sandbox(f"docker://{name}", liveness=SHORT_LIVENESS) as sb:
        await frozen_then_thawed(sb, [_host_pid(engine, name, sb.info.pid)], "docker: SIGSTOP agent")
