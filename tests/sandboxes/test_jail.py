"""``jail://`` isolation, in real bubblewrap boxes: network, filesystem, PIDs, capabilities, env."""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

import remote_exec as rx
from remote_exec.sandboxes.jail import JailTransport
from remote_exec.sandboxes.jailbox import JAIL_UID

from .backend_jail import require_jail

pytestmark = pytest.mark.anyio

CONNECT = "import socket, sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=5); print('connected')"
# PID, state and argv of every process the sandbox can see, with sh builtins and cat only.
LIST_PROCS = r"""
for d in /proc/[0-9]*; do
  read -r stat < "$d/stat" 2>/dev/null || continue
  set -- ${stat##*") "}
  printf '%s %s %s\n' "${d#/proc/}" "$1" "$(tr '\0\n' '  ' < "$d/cmdline" 2>/dev/null)"
done
"""


@pytest.fixture(scope="module", autouse=True)
def _needs_bwrap(tmp_path_factory: pytest.TempPathFactory) -> None:
    require_jail(tmp_path_factory.mktemp("jail-probe"))


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A TCP listener on the host's 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        s.settimeout(10)
        yield s


def status_fields(text: str) -> dict[str, str]:
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def transport(sb: rx.AsyncSandbox) -> JailTransport:
    assert isinstance(sb.transport, JailTransport)
    return sb.transport


async def test_cannot_reach_a_host_port(listener: socket.socket, tmp_path: Path) -> None:
    port = listener.getsockname()[1]
    async with rx.open_sandbox(f"jail://?work={tmp_path / 'work'}") as sb:
        res = await sb.run([sys.executable, "-c", CONNECT, str(port)])
        links = str((await sb.run(["cat", "/proc/net/dev"])).stdout)
    assert res.returncode != 0 and "connected" not in res.stdout
    assert "ConnectionRefusedError" in res.stderr  # the box's own loopback: nobody listens there
    assert [line.split(":")[0].strip() for line in links.splitlines()[2:]] == ["lo"]


async def test_net_host_reaches_a_host_port(listener: socket.socket, tmp_path: Path) -> None:
    port = listener.getsockname()[1]
    async with rx.open_sandbox(f"jail://?work={tmp_path / 'work'}&net=host") as sb:
        res = await sb.run([sys.executable, "-c", CONNECT, str(port)])
        conn, _ = await anyio.to_thread.run_sync(listener.accept)
        conn.close()
    assert (res.returncode, res.stdout) == (0, "connected\n")


async def test_writes_only_in_workspace_and_private_tmp(tmp_path: Path) -> None:
    probe = f"jail-probe-{uuid.uuid4().hex}"
    script = f"""
    for d in / /etc /usr /root /var {tmp_path}; do
      (echo x > "$d/{probe}") 2>/dev/null && echo "wrote $d"
    done
    echo in-box > /workspace/out.txt && echo tmp > /tmp/{probe} && cat /tmp/{probe}
    """
    async with rx.open_sandbox(f"jail://?work={tmp_path / 'work'}") as sb:
        res = await sb.run(["sh", "-c", script])
    assert (res.stdout, res.returncode) == ("tmp\n", 0)
    assert (tmp_path / "work" / "out.txt").read_text() == "in-box\n"
    assert not (Path("/tmp") / probe).exists()  # the box's /tmp is its own
    assert (tmp_path / "work").is_dir()  # a given work dir is kept


async def test_sees_only_its_own_processes() -> None:
    async with rx.open_sandbox("jail://") as sb:
        listing = str((await sb.run(["sh", "-c", LIST_PROCS])).stdout)
        agent_pid = sb.info.pid
    procs = {int(pid): argv for pid, _, argv in (line.split(" ", 2) for line in listing.splitlines())}
    assert agent_pid < 20 and procs[1].startswith("bwrap ")  # PID 1 is the box's init
    assert len(procs) < 20 and max(procs) < 100
    assert all("pytest" not in argv for argv in procs.values())  # this very process is invisible


async def test_no_capabilities_and_clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REMOTE_EXEC_HOST_SECRET", "leaked")
    async with rx.open_sandbox("jail://") as sb:
        job = await sb.run(["cat", "/proc/self/status"])
        agent = await sb.run(["cat", f"/proc/{sb.info.pid}/status"])
        env = str((await sb.run(["env"])).stdout)
        code, direct = await transport(sb).exec_capture(["cat", "/proc/self/status"])  # an exec, no agent
    assert code == 0
    for text in (str(job.stdout), str(agent.stdout), direct.decode()):
        fields = status_fields(text)
        for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
            assert int(fields[cap], 16) == 0, (cap, fields[cap])
        assert fields["NoNewPrivs"] == "1"
    assert "REMOTE_EXEC_HOST_SECRET" not in env and "HOME=/tmp\n" in env


async def test_close_kills_the_box_and_removes_its_temp_work_dir() -> None:
    async with rx.open_sandbox("jail://") as sb:
        await sb.exec_remote(["sleep", "300"]).started()
        proc = sb.exec_remote(["sleep", "300"])
        await proc.started()
        proc.detach()  # the agent would keep it; the box's end takes it anyway
        t = transport(sb)
        assert t.pid is not None and t.work is not None
        pid_ns = os.readlink(f"/proc/{t.pid}/ns/pid")
        work = t.work
        assert work.is_dir()
    in_ns = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and os.readlink(f"/proc/{entry}/ns/pid") == pid_ns:
                in_ns.append(entry)
        except OSError:
            continue  # exited meanwhile
    assert in_ns == [] and not work.exists()


async def test_killing_nsenter_kills_the_process_it_started() -> None:
    async with rx.open_sandbox("jail://") as sb:
        spawned = await transport(sb).spawn(["sh", "-c", "echo $$; exec sleep 300"])
        assert spawned.stdout is not None
        pid = int(await spawned.stdout.readline())
        assert (await sb.run(["kill", "-0", str(pid)])).returncode == 0
        spawned.kill()
        await spawned.wait()
        gone = f"for i in $(seq 100); do [ -e /proc/{pid} ] || exit 0; sleep 0.05; done; exit 1"
        assert (await sb.run(["sh", "-c", gone])).returncode == 0


async def test_work_dir_must_be_usable_by_the_jails_uid(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir(mode=0o700)  # root's, and no one else's
    with pytest.raises(rx.SandboxError, match=f"the jail's uid {JAIL_UID} can enter"):
        async with rx.open_sandbox(f"jail://?work={tmp_path / 'mine'}"):
            pass
    os.chown(tmp_path / "mine", JAIL_UID, JAIL_UID)
    for work in (tmp_path / "mine", tmp_path / "made" / "here"):  # a dir jail:// creates is given to the uid
        async with rx.open_sandbox(f"jail://?work={work}") as sb:
            assert (await sb.run(["touch", "ok"])).returncode == 0
        assert (work / "ok").stat().st_uid == JAIL_UID


async def test_extra_binds(tmp_path: Path) -> None:
    ro, rw = tmp_path / "ro", tmp_path / "rw"
    ro.mkdir()
    rw.mkdir()
    os.chown(rw, JAIL_UID, JAIL_UID)  # a ?rw= dir is for the jail's uid to write
    (ro / "in.txt").write_text("given\n")
    url = f"jail://?ro={ro}:/data&rw={rw}:/out&ro={ro}"
    async with rx.open_sandbox(url) as sb:
        res = await sb.run(["sh", "-c", f"cat /data/in.txt {ro}/in.txt; echo made > /out/new.txt; echo x > /data/no"])
    assert res.stdout == "given\ngiven\n" and "Read-only" in res.stderr
    assert (rw / "new.txt").read_text() == "made\n" and not (ro / "no").exists()


async def test_attach_by_pid_shares_the_box_and_refuses_non_boxes() -> None:
    async with rx.open_sandbox("jail://") as owner:
        pid = transport(owner).pid
        async with rx.open_sandbox(f"jail://{pid}") as guest:
            assert guest.info.instance_id == owner.info.instance_id
        assert (await owner.run(["true"])).returncode == 0  # closing the guest left the box up
    for not_a_box in (os.getpid(), 1):
        with pytest.raises(rx.SandboxError, match=r"not the init of a bubblewrap box|no jail box|another user"):
            async with rx.open_sandbox(f"jail://{not_a_box}"):
                pass


def bwrap_children() -> set[int]:
    """PIDs of the bwrap processes this test process started (its boxes)."""
    found = set()
    for entry in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text() if entry.isdigit() else ""
        except OSError:
            continue
        if stat.startswith(f"{entry} (bwrap) ") and int(stat.rsplit(") ", 1)[1].split()[1]) == os.getpid():
            found.add(int(entry))
    return found


def temp_work_dirs() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("remote-exec-jail-*"))


async def test_agent_failure_is_reported_and_leaves_nothing_behind(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A temp dir of this test's own: the system one also holds the work dirs of boxes other
    # workers open meanwhile (one appeared during this test in a soak run).
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path_factory.mktemp("jail-temp")))
    temp_works = temp_work_dirs()
    boxes = bwrap_children()
    with pytest.raises(rx.AgentUnavailableError, match="does not start"):
        async with rx.open_sandbox(f"jail://?ro={tmp_path}:{sys.prefix}"):  # hides the agent's interpreter
            pass
    assert bwrap_children() <= boxes
    assert temp_work_dirs() <= temp_works


def test_bad_urls() -> None:
    for url, match in [
        ("jail://?colour=1", "unknown jail"),
        ("jail://?net=bridge", "net must be"),
        ("jail://123?net=host", "takes no options"),
        ("jail://box", "takes no options"),
        ("jail:///path", "no path"),
        ("jail://?work=rel", "absolute"),
        ("jail://?ro=rel/path", "absolute"),
    ]:
        with pytest.raises(rx.SandboxError, match=match):
            rx.open_sandbox(url)
