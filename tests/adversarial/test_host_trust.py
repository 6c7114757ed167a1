"""A hostile agent against the host client: huge listings, cursor lies, silence, a frozen agent.

Each case records what was tried with the ``adversary`` fixture. The bounds asserted here are the
ones docs/troubleshooting.md states (open: 10 s; a poll: its wait plus three margins).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import remote_exec as rx

from .conftest import Adversary
from .hostile_agent import Handler, HostileAgent, Pushes, Silence

MAX_PAGE_ITEMS = 1000  # remote_exec.protocol.MAX_PAGE_ITEMS, written out: the test also runs on older clients

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
HUGE = 1_000_000


def _vm_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/self/status")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS


@contextlib.contextmanager
def _agent_in_child(tmp_path: Path, handlers_src: str) -> Iterator[str]:
    """A HostileAgent in a child process, so its own copy of a huge answer is not counted in
    this (the host's) RSS. ``handlers_src`` defines ``handlers``; yields the sandbox URL."""
    serve = textwrap.dedent(
        f"""
        async def main():
            async with HostileAgent(Path({str(tmp_path)!r}), handlers) as agent:
                print(agent.url, flush=True)
                await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        asyncio.run(main())
        """
    )
    script = "import asyncio, json, sys\nfrom pathlib import Path\n"
    script += "from tests.adversarial.hostile_agent import HostileAgent\n"
    script += handlers_src + serve
    with subprocess.Popen(
        [sys.executable, "-c", script], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as child:
        try:
            assert child.stdout is not None
            url = child.stdout.readline().strip()  # printed once it serves
            assert url.startswith("local://"), url
            yield url
        finally:
            child.kill()


HUGE_HANDLERS = f"""
entry = {{"path": "/w/f", "name": "f", "type": "file", "size": 0, "mode": 420, "mtime_ns": 0}}
job = {{"job_id": "x-1", "pid": 1, "command": "true", "label": None, "state": "completed", "exit_code": 0,
       "started_at": 0.0, "ended_at": 0.0, "stdout_bytes": 0, "stderr_bytes": 0, "stdin_open": False,
       "stdin_bytes": 0, "encoding": "utf-8"}}
from tests.adversarial.hostile_agent import Encoded
def many(head, key, item, n):
    # what json.dumps gives for {{**head, key: [item] * n}}, as one item's JSON repeated (8 times faster)
    opening = json.dumps({{**head, key: []}}).encode()[:-2]
    return Encoded(opening + b", ".join([json.dumps(item).encode()] * n) + b"]}}")
answers = {{
    "file entries": ("file_list", lambda: many({{"path": "/w"}}, "entries", entry, {HUGE})),
    "jobs": ("exec_remote_list", lambda: many({{}}, "jobs", job, 700_000)),
    "a 10 MB stat": ("file_stat", lambda: Encoded(json.dumps({{**entry, "name": "n" * 10_000_000}}).encode())),
}}
method, build = answers[WHAT]
answer = build()  # only the answer this case asks for, before the agent serves (see Encoded)
handlers = {{method: lambda p, _: answer}}
"""


@pytest.mark.parametrize("what", ["file entries", "jobs", "a 10 MB stat"])
async def test_a_huge_listing_is_refused_with_bounded_memory(tmp_path: Path, adversary: Adversary, what: str) -> None:
    # About 90 MiB of file entries, 150 MiB of jobs: both under the old 160 MiB response cap,
    # so an unbounded client parses them (GBs of objects).
    with _agent_in_child(tmp_path, f"WHAT = {what!r}\n" + HUGE_HANDLERS) as url:
        # No liveness bound: the hostile agent sends its 150 MiB answer (encoded before it
        # serves: see Encoded) without a heartbeat, and its silence is not what is tested here.
        async with rx.open_sandbox(url, liveness=0) as sb:
            _reset_peak()
            before = _vm_kib("VmRSS")
            t0 = time.monotonic()
            with anyio.fail_after(60), pytest.raises(rx.ProtocolError) as err:
                if what == "jobs":
                    await sb.jobs()
                elif what == "a 10 MB stat":  # under the channel's cap: refused by the method's bound
                    await sb.stat("/w/f")
                else:
                    await sb.list_dir("/w")
            elapsed = time.monotonic() - t0
            grown = (_vm_kib("VmHWM") - before) // 1024
    print(f"\nhuge listing of {what}: refused in {elapsed:.2f} s, host peak RSS +{grown} MiB ({err.value})")
    refused = grown < 100  # and within the fail_after above: refused, not parsed for minutes
    adversary.tried("host: response size", f"one answer with {what}", refused=refused)
    assert refused, (grown, elapsed)


def _paged(items: list[dict[str, Any]], key: str, cursor: str, params: dict[str, Any]) -> dict[str, Any]:
    after = params.get("after")
    start = 0 if after is None else next(i for i, x in enumerate(items) if x[cursor] == after) + 1
    page = items[start : start + params.get("limit", MAX_PAGE_ITEMS)]
    more = start + len(page) < len(items)
    return {key: page, "next": page[-1][cursor] if more else None}


async def test_a_paged_agent_with_many_entries_works(tmp_path: Path, adversary: Adversary) -> None:
    entries = [
        {"path": f"/w/{i:05}", "name": f"{i:05}", "type": "file", "size": i, "mode": 0o644, "mtime_ns": 0}
        for i in range(5_500)
    ]
    jobs = [
        {"job_id": f"x-{i}", "pid": i + 2, "command": ["sleep", "1"], "label": None, "state": "running",
         "exit_code": None, "started_at": 0.0, "ended_at": None, "stdout_bytes": 0, "stderr_bytes": 0,
         "stdin_open": False, "stdin_bytes": 0, "encoding": "utf-8"}
        for i in range(2_345)
    ]  # fmt: skip
    handlers = {
        "file_list": lambda p, _: {"path": "/w", **_paged(entries, "entries", "name", p)},
        "exec_remote_list": lambda p, _: _paged(jobs, "jobs", "job_id", p),
    }
    async with HostileAgent(tmp_path, handlers) as agent, rx.open_sandbox(agent.url) as sb:
        listed = await sb.list_dir("/w")
        assert [e.name for e in listed] == [e["name"] for e in entries]
        assert [j.job_id for j in await sb.jobs()] == [j["job_id"] for j in jobs]
        with pytest.raises(rx.FileError, match="more than 5000"):
            await sb.list_dir("/w", max_entries=5000)
    assert agent.calls.count("file_list") == 6 + 6  # pages of 1000; the capped one ends with a page of 1
    adversary.tried("host: listings", "5500 entries and 2345 jobs in pages", refused=True)


async def test_a_page_that_loops_is_refused(tmp_path: Path, adversary: Adversary) -> None:
    entry = {"path": "/w/a", "name": "a", "type": "file", "size": 0, "mode": 0o644, "mtime_ns": 0}
    handlers = {"file_list": lambda p, _: {"path": "/w", "entries": [entry], "next": "zz"}}
    async with HostileAgent(tmp_path, handlers) as agent, rx.open_sandbox(agent.url) as sb:
        with anyio.fail_after(10), pytest.raises(rx.ProtocolError, match="cursor"):
            await sb.list_dir("/w")
    adversary.tried("host: listings", "a page whose cursor is not its last entry", refused=True)


def _job_handlers(poll: Any) -> dict[str, Any]:
    return {"exec_remote_start": lambda p, _: {"job_id": p["job_id"], "pid": 4242}, "exec_remote_poll": poll}


@pytest.mark.parametrize(
    ("case", "result", "payload"),
    [
        ("cursor jump, no bytes, completed", {"stdout_offset": 10**9, "stderr_offset": 0}, b""),
        ("cursor past the bytes sent", {"stdout_offset": 100, "stderr_offset": 0, "payload_sizes": [5, 0]}, b"hello"),
        ("bytes sent, cursor still", {"stdout_offset": 0, "stderr_offset": 0, "payload_sizes": [5, 0]}, b"hello"),
        ("text instead of the payload", {"stdout": "x" * 10, "stdout_offset": 10, "stderr_offset": 0}, None),
    ],
)  # fmt: skip
@pytest.mark.parametrize("way", ["push", "poll"])
async def test_a_poll_cursor_lie_is_a_protocol_error(
    tmp_path: Path, adversary: Adversary, case: str, result: dict[str, Any], payload: bytes | None, way: str
) -> None:
    """The same lie as a poll's answer (a channel that cannot push) and as a push."""
    answer = {"state": "completed", "exit_code": 0, "stdout": "", "stderr": "", "payload_sizes": [0, 0], **result}
    async with (
        HostileAgent(tmp_path, _job_handlers(lambda p, _: (answer, payload))) as agent,
        rx.open_sandbox(agent.url) as sb,
    ):
        if way == "poll":
            sb._core.rpc.channel.pushes = False
        proc = sb.exec_remote(["true"])
        with anyio.fail_after(10), pytest.raises(rx.ProtocolError, match=r"cursor|payload"):
            await proc.wait()
        assert f"exec_remote_{'follow' if way == 'push' else 'poll'}" in agent.calls
    adversary.tried(f"host: {way} cursors", case, refused=True)


_RUNNING = {"state": "running", "stdout": "", "stderr": "", "stdout_offset": 5, "stderr_offset": 0}
_ENDED = {**_RUNNING, "state": "completed", "exit_code": 0, "stdout_offset": 0, "payload_sizes": [0, 0]}


@pytest.mark.parametrize(
    ("case", "pushes", "ended", "match"),
    [
        ("a push for another job", [({**_RUNNING, "payload_sizes": [5, 0], "job_id": "other-1"}, b"hello")],
         False, "another job"),
        ("a payload over twice the chunk asked", [({**_RUNNING, "stdout_offset": 3 << 20,
         "payload_sizes": [3 << 20, 0]}, b"x" * (3 << 20))], False, "chunks of"),
        ("the call says the job ended, no push said so", [], True, "sent no end"),
        ("a push that is not a poll's answer", [({"state": "running", "surprise": 1}, None)], False, "malformed push"),
        ("a push over the message bound", [({**_RUNNING, "reason": "x" * (2 << 20)}, None)], False, "bound"),
    ],
)  # fmt: skip
async def test_a_lying_push_is_a_protocol_error(
    tmp_path: Path, adversary: Adversary, case: str, pushes: list[Any], ended: bool, match: str
) -> None:
    def follow(p: dict[str, Any], _: bytes | None) -> Pushes:
        return Pushes(pushes, {"pushes": len(pushes), "ended": ended})

    handlers: dict[str, Handler] = {
        "exec_remote_start": lambda p, _: {"job_id": p["job_id"], "pid": 4242},
        "exec_remote_follow": follow,
    }
    async with HostileAgent(tmp_path, handlers) as agent, rx.open_sandbox(agent.url) as sb:
        proc = sb.exec_remote(["true"], kill_grace=0)
        with anyio.fail_after(10), pytest.raises(rx.ProtocolError, match=match):
            await proc.wait()
    adversary.tried("host: pushes", case, refused=True)


async def test_pushes_after_the_end_are_not_read(tmp_path: Path, adversary: Adversary) -> None:
    """The end is the end: the follow is dropped once it is read, so what comes after it (more
    output, another exit code) is never applied."""
    late = {**_RUNNING, "state": "failed", "exit_code": 9, "stdout_offset": 5, "payload_sizes": [5, 0]}

    def follow(p: dict[str, Any], _: bytes | None) -> Pushes:
        return Pushes([(_ENDED, None), (late, b"later")], {"pushes": 2, "ended": True})

    handlers: dict[str, Handler] = {
        "exec_remote_start": lambda p, _: {"job_id": p["job_id"], "pid": 4242},
        "exec_remote_follow": follow,
    }
    async with HostileAgent(tmp_path, handlers) as agent, rx.open_sandbox(agent.url) as sb:
        with anyio.fail_after(10):
            result = await sb.exec_remote(["true"]).wait()
    assert (result.returncode, result.stdout, result.state) == (0, "", "completed")
    adversary.tried("host: pushes", "more output and another end after the end", refused=True)


async def test_a_silent_server_info_fails_the_open_within_its_bound(tmp_path: Path, adversary: Adversary) -> None:
    def silent(p: dict[str, Any], _: bytes | None) -> None:
        raise Silence

    # An injected open_timeout (the default, 10 s, is the same code path): a hang would be cut
    # by fail_after as a TimeoutError, not the AgentUnavailableError the bound raises.
    async with HostileAgent(tmp_path, {"server_info": silent}) as agent:
        t0 = time.monotonic()
        with anyio.fail_after(60), pytest.raises(rx.AgentUnavailableError, match="server_info") as err:
            async with rx.open_sandbox(agent.url, open_timeout=1.5):
                pass
        elapsed = time.monotonic() - t0
    print(f"\nsilent server_info: open failed after {elapsed:.1f} s: {err.value}")
    assert agent.url in str(err.value) and "open_timeout=1.5 s" in str(err.value)
    adversary.tried("host: deadlines", f"silent server_info (failed after {elapsed:.1f} s)", refused=True)
    assert elapsed >= 1.5  # it waited for the answer as long as it was told, no less


async def test_polls_that_stop_being_answered_fail_within_the_bound(tmp_path: Path, adversary: Adversary) -> None:
    def poll(p: dict[str, Any], _: bytes | None) -> Any:
        if p["stdout_offset"] > 0:
            raise Silence  # answered once, then never again
        return {"state": "running", "stdout": "", "stderr": "", "stdout_offset": 3, "stderr_offset": 0,
                "payload_sizes": [3, 0]}, b"up\n"  # fmt: skip

    async with (
        HostileAgent(tmp_path, _job_handlers(poll)) as agent,
        rx.open_sandbox(agent.url, response_margin=1.0) as sb,
    ):
        proc = sb.exec_remote(["x"], poll_interval=1.0, kill_grace=0)
        assert await anext(aiter(proc)) == rx.StdoutChunk("up\n")
        t0 = time.monotonic()
        with anyio.fail_after(30), pytest.raises(rx.TransportError, match=r"exec_remote_(poll|follow)") as err:
            await proc.wait()
        elapsed = time.monotonic() - t0
    bound = 1.0 + 3 * 1.0  # the poll's wait plus three margins
    print(f"\nsilent polls: failed after {elapsed:.1f} s (bound {bound} s): {err.value}")
    assert agent.url in str(err.value)
    # Unbounded, the wait would hang until fail_after's TimeoutError: the TransportError is the bound.
    adversary.tried("host: deadlines", f"polls unanswered (failed after {elapsed:.1f} s)", refused=True)


def _agents_serving(state_dir: Path) -> dict[int, int]:
    """Processes (pid -> ppid) running the agent or its keeper for ``state_dir``."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError):
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if b"remote_exec.agent" in argv and os.fsencode(state_dir) in argv:
                stat = (proc / "stat").read_bytes()
                found[int(proc.name)] = int(stat[stat.rfind(b")") + 2 :].split()[1])
    return found


def _unix_sockets(state_dir: Path) -> list[tuple[str, str]]:
    """(state, path) of every Unix socket bound to an agent socket of ``state_dir``: a listener is
    ``01``, and each accepted connection shows the listener's path with state ``03``."""
    names = {os.fspath(state_dir / "agent.sock"), os.fspath(state_dir / "agent.stream")}
    found = []
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[7] in names:
            found.append((fields[5], fields[7]))
    return found


async def test_a_frozen_agent_fails_the_stream_and_nothing_restarts_it_after_close(
    fresh_agent_dir: Path, adversary: Adversary
) -> None:
    """After ``close()`` the *client* neither reconnects nor starts anything. The agent's keeper
    does restart an agent that died by accident (that is #14's design: jobs outlive the agent),
    so the test tells the two apart: every agent process left is the keeper's own child, the
    keeper is the one the sandbox had before close, and nobody is connected to the new agent."""
    url = f"local://?dir={fresh_agent_dir}"
    async with rx.open_sandbox(url, response_margin=1.0) as sb:
        agent_pid = sb.info.pid
        keeper_pid = sb.info.keeper_pid
        assert keeper_pid is not None
        agent_fd = os.pidfd_open(agent_pid)  # readable once the agent has exited
        proc = sb.exec_remote(["sh", "-c", "while :; do echo tick; sleep 0.05; done"], poll_interval=1.0, kill_grace=0)
        try:
            assert isinstance(await anext(aiter(proc)), rx.StdoutChunk)
            os.kill(agent_pid, signal.SIGSTOP)
            t0 = time.monotonic()
            with anyio.fail_after(30), pytest.raises(rx.TransportError, match=r"exec_remote_(poll|follow)") as err:
                await proc.wait()
            elapsed = time.monotonic() - t0
            with anyio.fail_after(30):
                await sb.aclose()  # tries to kill the job, which cannot answer; must end all the same
            closed_after = time.monotonic() - t0
            kill_task = proc._kill_task
        finally:
            os.kill(agent_pid, signal.SIGKILL)  # the frozen agent goes for good
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid or 0, signal.SIGKILL)
    # The kill that close() started outlived it; now it sees the dead agent's socket. It must
    # neither reconnect nor start an agent again.
    if kill_task is not None:
        with anyio.fail_after(10), contextlib.suppress(rx.RemoteExecError):
            await kill_task
    try:
        assert await anyio.to_thread.run_sync(select.select, [agent_fd], [], [], 10.0) != ([], [], [])
    finally:
        os.close(agent_fd)
    # The keeper restarts the killed agent at once; wait until that agent listens on both sockets.
    with anyio.fail_after(30):
        while len([s for s in _unix_sockets(fresh_agent_dir) if s[0] == "01"]) < 2:  # noqa: ASYNC110
            await anyio.sleep(0.05)
    serving = _agents_serving(fresh_agent_dir)
    foreign = {pid: ppid for pid, ppid in serving.items() if pid != keeper_pid and ppid != keeper_pid}
    connections = [s for s in _unix_sockets(fresh_agent_dir) if s[0] != "01"]
    print(f"\nfrozen agent: stream failed after {elapsed:.1f} s, closed after {closed_after:.1f} s; "
          f"after close: keeper {keeper_pid}, its agents {sorted(set(serving) - {keeper_pid})}, "
          f"others {foreign}, connections {connections} ({err.value})")  # fmt: skip
    assert url in str(err.value)
    refused = not foreign and not connections  # the stream failed, and close() ended, in fail_after
    adversary.tried("host: deadlines", f"SIGSTOPped agent mid-stream (failed after {elapsed:.1f} s)", refused=refused)
    adversary.tried("host: deadlines", "no reconnect or start by the client after close()", refused=refused)
    assert keeper_pid in serving and agent_pid not in serving
    assert foreign == {}  # no second keeper, no agent the client started
    assert connections == []  # the closed client did not reconnect to the keeper's new agent
