"""Another local user takes over ``local://`` (issue #12, point 3).

Without ``XDG_RUNTIME_DIR`` the state dir is ``/tmp/remote-exec-<uid>``: a name anyone can
create first. The attacker is uid 65534 (``setpriv``); the victim is this test process (root,
so no permission denial can be what saves it). Each attack must be refused before a byte is
sent, with an error that names the cause; the attacker's listener records what it got.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import remote_exec as rx
from remote_exec.client.callchannel import CallChannel
from remote_exec.client.channel import MAX_RESPONSE, Channel, StdioChannel
from remote_exec.client.sandbox import AsyncSandbox
from remote_exec.client.transport import SandboxTransport
from remote_exec.protocol import default_agent_dir

from .conftest import Adversary

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"),
]

ATTACKER = 65534
AS_ATTACKER = ["setpriv", f"--reuid={ATTACKER}", f"--regid={ATTACKER}", "--clear-groups"]
SCRIPT = Path(__file__).with_name("takeover_attacker.py")
# The attacker cannot run this test's interpreter (it lives under root's 0700 home): the
# recorder needs only the standard library, the attacker's real agent is the frozen bundle.
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or "python3"
BUNDLE = Path(__file__).parents[2] / "dist" / "agent" / f"remote-exec-agent-{os.uname().machine}.tar.gz"
AREA = "local:// takeover"


@pytest.fixture
def world() -> Iterator[Path]:
    """A directory both users can reach (pytest's tmp_path is root's alone)."""
    d = Path(tempfile.mkdtemp(prefix="takeover-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def open_world(world: Path) -> Path:
    """``world``, writable by everyone like ``/tmp`` (without its sticky bit: the attacker may
    also rename what is in it)."""
    world.chmod(0o777)
    return world


@pytest.fixture
def default_dir(world: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The victim's default state dir, as when ``XDG_RUNTIME_DIR`` is unset (in ``world``, not
    the machine's real ``/tmp/remote-exec-0``)."""
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("REMOTE_EXEC_AGENT_DIR", os.fspath(world / f"remote-exec-{os.geteuid()}"))
    return default_agent_dir()


def _wait_line(proc: subprocess.Popen[bytes], deadline: float = 30.0) -> bytes:
    assert proc.stdout is not None
    end = time.monotonic() + deadline
    line = b""
    while not line.endswith(b"\n"):
        left = end - time.monotonic()
        assert left > 0 and select.select([proc.stdout], [], [], left)[0], f"no line from {proc.args!r}"
        chunk = os.read(proc.stdout.fileno(), 1)
        assert chunk, f"{proc.args!r} exited: {proc.wait()}"
        line += chunk
    return line


class Recorder:
    """The attacker's listener (``takeover_attacker.py``), run as uid 65534."""

    def __init__(self, world: Path, target: Path | None, fds: tuple[int, ...] = ()) -> None:
        self.log = world / "attacker.log"
        self.log.touch()
        os.chown(self.log, ATTACKER, ATTACKER)
        if fds:
            where = ["--fds", *map(str, fds)]
        else:
            assert target is not None
            where = [os.fspath(target)]
        self.proc = subprocess.Popen(
            [*AS_ATTACKER, SYSTEM_PYTHON, os.fspath(SCRIPT), os.fspath(self.log), *where],
            stdout=subprocess.PIPE,
            pass_fds=fds,
            cwd="/",
        )
        assert _wait_line(self.proc) == b"ready\n"

    def events(self) -> list[dict[str, str]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@contextlib.contextmanager
def recorder(world: Path, target: Path | None, fds: tuple[int, ...] = ()) -> Iterator[Recorder]:
    rec = Recorder(world, target, fds)
    try:
        yield rec
    finally:
        rec.stop()


@pytest.fixture(scope="module")
def bundle_agent() -> Iterator[Path]:
    """The frozen agent, unpacked where uid 65534 can run it."""
    if not BUNDLE.exists():
        pytest.skip(f"no agent bundle at {BUNDLE}: run `make agent`")
    d = Path(tempfile.mkdtemp(prefix="takeover-agent-", dir="/tmp"))
    d.chmod(0o755)
    with tarfile.open(BUNDLE) as tar:
        tar.extractall(d, filter="fully_trusted")  # our own build
    yield d / "remote-exec-agent" / "remote-exec-agent"
    shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def attacker_agent(agent: Path, state: Path) -> Iterator[int]:
    """A real agent started by uid 65534 in ``state``, then opened up: 0777 dir, 0666 sockets."""
    state.parent.chmod(0o777)  # the attacker may create the dir there, as in /tmp
    out = subprocess.run(
        [*AS_ATTACKER, os.fspath(agent), "ensure", "--dir", os.fspath(state)],
        capture_output=True,
        timeout=60,
        cwd="/",
        check=True,
    )
    pid = json.loads(out.stdout)["result"]["pid"]
    try:
        state.chmod(0o777)
        for name in ("agent.sock", "agent.stream"):
            (state / name).chmod(0o666)
        assert os.stat(state).st_uid == ATTACKER
        yield pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 15)
        state.parent.chmod(0o755)


async def victim_opens(url: str) -> rx.UntrustedAgentError:
    """Open ``url`` and run a command; the refusal it must end in."""
    with pytest.raises(rx.UntrustedAgentError) as info:
        with anyio.fail_after(30):  # today's main sends and then waits on a listener that never answers
            async with rx.open_sandbox(url) as sb:
                result = await sb.run(["id", "-u"])
                pytest.fail(f"the victim's command ran, as uid {result.stdout.strip()!r}")
    return info.value


class RelayTransport(SandboxTransport):
    """The agent CLI's ``stdio``/``call`` relay on this machine, as ssh:// and docker:// run it
    in theirs (``local://`` checks on the host first, so it would never reach the relay)."""

    def __init__(self, state: Path, kind: str) -> None:
        self.state, self.kind, self.url = state, kind, f"relay+{kind}://"

    async def _spawn(self) -> Any:
        argv = [sys.executable, "-m", "remote_exec.agent", self.kind, "--dir", os.fspath(self.state)]
        pipe = asyncio.subprocess.PIPE
        return await asyncio.create_subprocess_exec(
            *argv, stdin=pipe, stdout=pipe, stderr=asyncio.subprocess.DEVNULL, limit=MAX_RESPONSE
        )

    async def open_channel(self) -> Channel:
        return StdioChannel(self._spawn) if self.kind == "stdio" else CallChannel(self._spawn)


async def relay_opens(state: Path, kind: str) -> rx.UntrustedAgentError:
    with pytest.raises(rx.UntrustedAgentError) as info:
        with anyio.fail_after(30):
            async with AsyncSandbox(RelayTransport(state, kind)):
                pytest.fail("the relay served the victim from the attacker's agent")
    return info.value


def assert_names_owner(exc: Exception, path: Path) -> None:
    msg = str(exc)
    assert os.fspath(path) in msg and f"uid {ATTACKER} (nobody)" in msg, msg
    assert "nothing was sent" in msg, msg


@pytest.mark.parametrize("channel", ["socket", "stdio", "call"])
async def test_foreign_default_dir_with_a_real_agent(
    bundle_agent: Path, default_dir: Path, channel: str, adversary: Adversary
) -> None:
    with attacker_agent(bundle_agent, default_dir):
        exc = await victim_opens(f"local://?channel={channel}")
    assert_names_owner(exc, default_dir)
    assert "XDG_RUNTIME_DIR" in str(exc)  # what to do
    adversary.tried(AREA, f"foreign 0777 default dir, real agent, 0666 sockets ({channel})", refused=True)


async def test_foreign_default_dir_receives_nothing(open_world: Path, default_dir: Path, adversary: Adversary) -> None:
    with recorder(open_world, default_dir) as rec:
        exc = await victim_opens("local://")
        assert rec.events() == []  # not even a connect
    assert_names_owner(exc, default_dir)
    adversary.tried(AREA, "foreign default dir: nothing sent, no connect", refused=True)


@pytest.mark.parametrize("kind", ["stdio", "call"])
async def test_relay_names_the_foreign_dir(
    bundle_agent: Path, default_dir: Path, kind: str, adversary: Adversary
) -> None:
    with attacker_agent(bundle_agent, default_dir):
        exc = await relay_opens(default_dir, kind)
    assert_names_owner(exc, default_dir)
    assert "channel closed" not in str(exc)
    adversary.tried(AREA, f"foreign dir behind the agent CLI relay ({kind}): reason reaches the host", refused=True)


@pytest.mark.parametrize("channel", ["socket", "stdio"])
async def test_foreign_socket_in_own_dir(open_world: Path, tmp_path: Path, channel: str, adversary: Adversary) -> None:
    mine = tmp_path / "state"
    os.mkdir(mine, 0o700)
    with recorder(open_world, open_world / "planted") as rec:
        for name in ("agent.sock", "agent.stream"):  # moved in while the dir was open, say
            os.rename(open_world / "planted" / name, mine / name)
        exc = await victim_opens(f"local://?dir={mine}&channel={channel}")
        assert rec.events() == []
    assert_names_owner(exc, mine / "agent.sock")
    adversary.tried(AREA, f"attacker's socket in the victim's own dir ({channel})", refused=True)


async def test_symlinked_state_dir(open_world: Path, default_dir: Path, adversary: Adversary) -> None:
    with recorder(open_world, open_world / "elsewhere") as rec:
        os.symlink(open_world / "elsewhere", default_dir)
        os.lchown(default_dir, ATTACKER, ATTACKER)
        exc = await victim_opens("local://")
        assert rec.events() == []
    assert "is a symlink" in str(exc) and os.fspath(default_dir) in str(exc), str(exc)
    adversary.tried(AREA, "symlink planted at the default state dir", refused=True)


def _bound(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        s.bind(os.fspath(path))
    finally:
        os.umask(old)
    return s


@contextlib.contextmanager
def our_socket_their_listener(world: Path, state: Path) -> Iterator[Recorder]:
    """Socket files of ours (root, 0600, in our 0700 dir) on which uid 65534 calls ``listen()``."""
    state.mkdir(mode=0o700)
    socks = [_bound(state / name) for name in ("agent.sock", "agent.stream")]
    try:
        with recorder(world, None, fds=tuple(s.fileno() for s in socks)) as rec:
            for name in ("agent.sock", "agent.stream"):
                assert os.lstat(state / name).st_uid == os.geteuid()
            yield rec
    finally:
        for s in socks:
            s.close()


@pytest.mark.parametrize("channel", ["socket", "stdio"])
async def test_peer_credentials(world: Path, tmp_path: Path, channel: str, adversary: Adversary) -> None:
    state = tmp_path / "state"
    with our_socket_their_listener(world, state) as rec:
        exc = await victim_opens(f"local://?dir={state}&channel={channel}")
        assert [e for e in rec.events() if e["event"] == "data"] == []  # connected, told nothing
    assert f"running as uid {ATTACKER} (nobody)" in str(exc) and "nothing was sent" in str(exc), str(exc)
    adversary.tried(AREA, f"our socket file, another uid's listener: SO_PEERCRED ({channel})", refused=True)


@pytest.mark.parametrize("kind", ["stdio", "call"])
async def test_relay_checks_peer_credentials(world: Path, tmp_path: Path, kind: str, adversary: Adversary) -> None:
    state = tmp_path / "state"
    with our_socket_their_listener(world, state) as rec:
        exc = await relay_opens(state, kind)
        assert [e for e in rec.events() if e["event"] == "data"] == []
    assert f"running as uid {ATTACKER} (nobody)" in str(exc), str(exc)
    adversary.tried(AREA, f"another uid's listener behind the agent CLI relay ({kind})", refused=True)


@pytest.fixture
def planted_log(world: Path, tmp_path: Path) -> tuple[Path, Path]:
    """Our own state dir, left 0777, where the attacker made ``agent.log`` a symlink to a file of ours."""
    mine = world / "mine"
    mine.mkdir()
    mine.chmod(0o777)
    precious = tmp_path / "precious"
    precious.write_bytes(b"keep\n")
    subprocess.run([*AS_ATTACKER, "ln", "-s", os.fspath(precious), os.fspath(mine / "agent.log")], check=True)
    return mine, precious


async def test_planted_log_symlink_in_own_open_dir(planted_log: tuple[Path, Path], adversary: Adversary) -> None:
    """The agent would append its log to the symlink's target (as root: to any file)."""
    mine, precious = planted_log
    with pytest.raises(rx.UntrustedAgentError, match=r"agent\.log"):
        async with rx.open_sandbox(f"local://?dir={mine}"):
            pass
    assert await anyio.Path(precious).read_bytes() == b"keep\n"
    adversary.tried(AREA, "agent.log symlink planted in the victim's open dir", refused=True)


def test_foreign_xdg_runtime_dir_is_not_used(
    world: Path, monkeypatch: pytest.MonkeyPatch, adversary: Adversary
) -> None:
    """``su`` keeps the first user's ``XDG_RUNTIME_DIR``: an agent dir there is theirs to replace."""
    theirs = world / "run-user-65534"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, ATTACKER, ATTACKER)
    monkeypatch.delenv("REMOTE_EXEC_AGENT_DIR", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", os.fspath(theirs))
    assert default_agent_dir() == Path(f"/tmp/remote-exec-{os.geteuid()}")
    mine = world / "run-user-0"
    mine.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", os.fspath(mine))
    assert default_agent_dir() == mine / "remote-exec"
    adversary.tried(AREA, "another user's XDG_RUNTIME_DIR (su)", refused=True)
