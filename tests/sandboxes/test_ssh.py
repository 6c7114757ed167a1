"""ssh:// beyond the contract suite: host key and auth refusals, one connection for many jobs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import anyio
import pytest

import remote_exec as rx
from remote_exec.sandboxes.ssh import SSHTransport

from .conftest import unavailable
from .sshd import SSHServer, SSHServerUnavailable, make_key, running_sshd

pytestmark = pytest.mark.anyio


def require_asyncssh() -> None:
    try:
        import asyncssh  # noqa: F401
    except ImportError:
        unavailable("asyncssh is not installed: pip install -e '.[test]'")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHServer]:
    """A private sshd with OpenSSH's default MaxSessions (10): more parallel channels would fail."""
    require_asyncssh()
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(running_sshd(tmp_path_factory.mktemp("sshd"), max_sessions=10))
        except SSHServerUnavailable as exc:
            unavailable(str(exc))
        yield server


async def wait_accepted(server: SSHServer, n: int) -> None:
    """sshd logs from its per-connection child: give the line a moment to land."""
    for _ in range(100):  # a log file has no event to wait on: poll it, 2 s at most
        if server.accepted() >= n:
            return
        await asyncio.sleep(0.02)


async def test_changed_host_key_is_refused_before_anything_runs(server: SSHServer, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{server.port} {make_key(tmp_path / 'impostor')}\n")
    before, ended = server.accepted(), _preauth_lines(server)
    with pytest.raises(rx.SandboxError, match="does NOT match") as info:
        async with rx.open_sandbox(server.url(known_hosts=str(known))):
            pass
    assert "man-in-the-middle" in str(info.value)
    with anyio.fail_after(30):  # sshd's own record of the connection's end (a log file: polled)
        while _preauth_lines(server) == ended:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    assert server.accepted() == before  # refused before authenticating: no session, no command


def _preauth_lines(server: SSHServer) -> int:
    """sshd's log lines about connections that ended before authentication."""
    return server.log.read_text().count("[preauth]")


async def test_unknown_host_is_refused_unless_the_check_is_waived(
    server: SSHServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ssh/known_hosts, no ~/.ssh/config
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    for url in (server.url(known_hosts=str(empty)), server.url(known_hosts="")):
        with pytest.raises(rx.SandboxError, match=r"is unknown.*host_key_check=no"):
            async with rx.open_sandbox(url):
                pass
    async with rx.open_sandbox(server.url(known_hosts="", host_key_check="no")) as sb:
        assert (await sb.run(["echo", "trusted on request"])).stdout == "trusted on request\n"


async def test_auth_failure_is_clear(server: SSHServer, tmp_path: Path) -> None:
    make_key(tmp_path / "stranger")
    with pytest.raises(rx.SandboxError, match=r"authentication failed for .*key"):
        async with rx.open_sandbox(server.url(key=str(tmp_path / "stranger"))):
            pass
    with pytest.raises(rx.SandboxError, match="cannot load private key"):
        async with rx.open_sandbox(server.url(key=str(tmp_path / "missing"))):
            pass


async def test_unreachable_host_and_missing_agent(server: SSHServer, tmp_path: Path) -> None:
    with pytest.raises(rx.AgentUnavailableError, match="cannot connect"):
        async with rx.open_sandbox(server.url().replace(f":{server.port}?", ":1?")):
            pass
    with pytest.raises(rx.AgentUnavailableError, match="does not work"):
        async with rx.open_sandbox(server.url(python="", agent="/nonexistent/remote-exec-agent")):
            pass


async def test_many_streaming_jobs_share_one_connection(server: SSHServer) -> None:
    before = server.accepted()
    script = "for i in 1 2 3 4 5; do echo $JOB.$i; sleep 0.1; done"
    outputs: dict[int, list[str]] = {}
    streaming: set[int] = set()
    all_streaming = anyio.Event()

    async def stream(sb: rx.AsyncSandbox, n: int) -> None:
        chunks: list[str] = []
        async for ev in sb.exec_remote(["sh", "-c", script], env={"JOB": str(n)}):
            if isinstance(ev, rx.StdoutChunk):
                assert isinstance(ev.data, str)
                chunks.append(ev.data)
                streaming.add(n)
                if len(streaming) == 24:
                    all_streaming.set()
        outputs[n] = chunks

    async with rx.open_sandbox(server.url()) as sb:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for n in range(24):  # > MaxSessions 10: only the multiplexed channel makes this work
                    tg.start_soon(stream, sb, n)
                await all_streaming.wait()
                assert server.established() == 1
    assert {n: "".join(c) for n, c in outputs.items()} == {
        n: "".join(f"{n}.{i}\n" for i in range(1, 6)) for n in range(24)
    }
    await wait_accepted(server, before + 1)
    assert server.accepted() == before + 1


async def test_dropped_connection_reconnects_without_loss(server: SSHServer) -> None:
    before = server.accepted()
    async with rx.open_sandbox(server.url()) as sb:
        assert isinstance(sb.transport, SSHTransport)
        proc = sb.exec_remote(["sh", "-c", "echo first; sleep 0.5; for i in 1 2 3; do echo $i; sleep 0.1; done"])
        assert await anext(aiter(proc)) == rx.StdoutChunk("first\n")
        (await sb.transport.connection()).abort()  # the TCP connection dies, not just the channel
        with anyio.fail_after(60):
            res = await proc.wait()
        assert res.stdout == "first\n1\n2\n3\n"
    await wait_accepted(server, before + 2)
    assert server.accepted() == before + 2


async def test_response_lines_beyond_the_ssh_window(server: SSHServer) -> None:
    # One poll response carries megabytes on one line: more than asyncssh's 2 MiB receive window.
    async with rx.open_sandbox(server.url()) as sb:
        res = await sb.run(["sh", "-c", "head -c 6000000 /dev/zero | tr '\\0' x"])
    assert res.stdout == "x" * 6_000_000


def test_bad_ssh_urls() -> None:
    require_asyncssh()
    for url, match in [
        ("ssh://", "needs a host"),
        ("ssh://u:secret@h", "no password"),
        ("ssh://h:99999", "bad port"),
        ("ssh://h/path", "no path"),
        ("ssh://h?colour=1", "unknown option.*ssh://"),
        ("ssh://h?agent=a&python=p", "not both"),
        ("ssh://h?agent=", "need a command"),
        ("ssh://h?host_key_check=maybe", "yes or no"),
        ("ssh://h?host_key_check=no&known_hosts=/k", "contradict"),
        ("ssh://h?connect_timeout=soon", "number"),
    ]:
        with pytest.raises(rx.SandboxError, match=match):
            rx.open_sandbox(url)
    query = urlencode({"agent": "'/opt/my venv/bin/python' -m remote_exec.agent", "dir": "/s"})
    transport = SSHTransport.from_url(f"ssh://me@h:2222?{query}")
    assert (transport.host, transport.port, transport.username) == ("h", 2222, "me")
    assert transport.agent_argv == ["/opt/my venv/bin/python", "-m", "remote_exec.agent"]
    assert transport.agent_state_dir == "/s"
