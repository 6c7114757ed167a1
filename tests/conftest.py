"""Shared fixtures: a real agent per test session, reached over every kind of channel."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from blockbuster import BlockBuster

import remote_exec as rx
from remote_exec.agent.loopguard import allow_deliberate
from remote_exec.client.channel import PipeProcess
from remote_exec.client.follower import Follower
from remote_exec.client.process import ExecRemoteProcess

if TYPE_CHECKING:
    from .faults.suite import RunIn, Target

# The run's closing summaries (adversarial and fault suites), merged across xdist workers.
pytest_plugins = ["tests.runreport"]

CHANNELS = ["socket", "stdio"]

# The login shell our local agents' jobs find in $SHELL (see tools/plain-bash: not the machine's rc).
os.environ["SHELL"] = str(Path(__file__).resolve().parent.parent / "tools" / "plain-bash")

# Ctrl-C as a terminal gives it, whoever started the suite: a command started in the background
# of a non-interactive shell (`make soak &`, some CI runners) inherits SIGINT *ignored*, and so
# does every process it starts; a Python started that way has no KeyboardInterrupt, and the tests
# of Ctrl-C (scripts that SIGINT themselves, the CLI under a pseudo-terminal) wait for one
# forever (soak: test_keyboard_interrupt_kills_the_job timed out). A handler here is reset to the
# default at each exec, so every child starts with Ctrl-C working.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def relay_pid(process: PipeProcess) -> int:
    """The pid of a ``local://`` stdio channel's relay (an asyncio subprocess there)."""
    return cast(asyncio.subprocess.Process, process).pid


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the client is built on aiohttp, which is asyncio-only


@pytest.fixture(autouse=True)
def no_blocking_on_the_loop() -> Iterator[None]:
    """Fail a blocking call (file or socket I/O, a sleep, a lock wait) made by our code on a
    running event loop: it stalls every other task of that loop (issue #22). Blockbuster checks
    only calls from ``remote_exec`` (the tests' own set-up may block), on any loop: an async
    test's, the blocking face's portal thread.
    An agent process of its own does the same with ``REMOTE_EXEC_BLOCKBUSTER=1`` in the tests'
    environment (``remote_exec.agent.loopguard``): not on by default yet, as the agent's start-up
    still does file I/O on its loop (CONTRIBUTING.md). What may block, and why: :func:`allow_blocking`."""
    # The agent's code run in-process is left to its own guard (REMOTE_EXEC_BLOCKBUSTER, opt-in:
    # its shells' start still stats PATH and makes dirs on the loop, see loopguard.py).
    bb = BlockBuster("remote_exec", excluded_modules=["remote_exec.agent"])
    allow_blocking(bb)  # (before activate(): that is when each check takes its exceptions)
    bb.activate()
    try:
        yield
    finally:
        bb.deactivate()


def allow_blocking(bb: BlockBuster) -> None:
    """The blocking calls our code makes on the loop on purpose (``loopguard.DELIBERATE``), and
    the ones a test makes itself through a plain function of ours (a /proc scan it checks)."""
    for fn in bb.functions.values():
        fn.can_block_predicate = _or_called_by_a_test(fn.can_block_predicate)
    allow_deliberate(bb)  # the agent's own list, with the reasons


_ASYNC_CODE = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE
_TESTS_DIR = os.path.dirname(__file__)
_PACKAGE_DIR = os.path.dirname(rx.__file__)


def _or_called_by_a_test(allowed: Callable[..., bool]) -> Callable[..., bool]:
    """``allowed``, or the call comes from a test through plain (not async) functions of ours:
    a test that reads the process table with ``group_members`` blocks its own loop, as any of
    its other checks do. One of our coroutines on the way (awaited by a test or not) is ours."""

    def predicate(*args: Any, **kwargs: Any) -> bool:
        if allowed(*args, **kwargs):
            return True
        frame = sys._getframe(1)
        while frame is not None:
            name = frame.f_code.co_filename
            if name.startswith(_TESTS_DIR):
                return True
            if name.startswith(_PACKAGE_DIR) and frame.f_code.co_flags & _ASYNC_CODE:
                return False
            frame = frame.f_back  # type: ignore[assignment]
        return False

    return predicate


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Iterator[None]:
    """Groups for pytest-xdist's ``--dist loadgroup`` (``make test XDIST=...``): tests that share
    a daemon run in one worker, so it starts once there. Without xdist the marks do nothing.
    And the ``backend`` mark, which ``make check`` leaves out (see :func:`_needs_a_backend`).

    A wrapper: the marks are set before any other plugin's hook looks (xdist's reads the group
    marks, ``-m`` the backend mark), and the group is checked in each test's id after them all
    (:func:`_group_in_node_id`)."""
    for item in items:
        group = _xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        if _needs_a_backend(item):
            item.add_marker(pytest.mark.backend)
    result = yield
    if getattr(config.option, "loadgroup", False):  # an xdist worker under --dist loadgroup
        for item in items:
            _group_in_node_id(item)
    return result


# The real Kubernetes tier (tests/k8sreal.py): every test on one API server, etcd and kwok, in
# one worker (a cluster a worker costs ~5 s of CPU to start and a few % of a core while it
# idles), stopped once that worker is past the group (see pytest_runtest_teardown).
REAL_TIER_GROUP = "backend-k8s-real"
REAL_TIER_MODULES = {"test_k8s_watch", "test_k8s_fleet", "test_k8s_notebook"}


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the real tier's cluster after the last test of its group (under ``--dist
    loadgroup`` a group's tests run one after another in one worker; elsewhere it runs to the
    end). After the fixtures' teardown for ``nextitem``: theirs may still talk to it."""
    if not getattr(item.config.option, "loadgroup", False) or _xdist_group(item) != REAL_TIER_GROUP:
        return
    if nextitem is None or _xdist_group(nextitem) != REAL_TIER_GROUP:
        from .k8sreal import stop_shared_real_cluster

        stop_shared_real_cluster()


def _group_in_node_id(item: pytest.Item) -> None:
    """Put the test's ``xdist_group`` in its id as pytest-xdist does (``<id>@<group>``): the
    ``@`` suffix is all its scheduler groups by. xdist 3.8 writes it to ``item._nodeid``, which
    pytest 9.2 no longer reads (its ids are structured: pytest-dev/pytest-xdist#1386), so every
    group was silently spread over all the workers: a browser module's tests each started a
    JupyterLab of their own in three workers, a backend's session fixture was set up in each.
    Where xdist's own write took (older pytest), this does nothing."""
    names = sorted(
        {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
    )
    suffix = "@" + "_".join(names)
    if names and not item.nodeid.endswith(suffix):
        from _pytest.nodeid import NodeId  # pytest >= 9.2, the only one where xdist's write is lost

        item._id = NodeId.parse(item.nodeid + suffix)


# What needs more than a local agent: a container engine, sshd or bubblewrap (the backend dirs),
# a browser with JupyterLab (its fixtures), a kernel or a fresh venv (those modules). Others
# mark themselves (``pytest.mark.backend``): a jail or a container inside an agent test.
BACKEND_DIRS = {"sandboxes", "faults"}
BACKEND_FIXTURES = {"lab", "browser", "page", "sandbox_url", "target"}
BACKEND_MODULES = {"test_kernel", "test_packaging", "test_binder"}


def _needs_a_backend(item: pytest.Item) -> bool:
    if item.path.parent.name in BACKEND_DIRS or item.path.stem in BACKEND_MODULES:
        return True
    params = getattr(getattr(item, "callspec", None), "params", {})
    if params.get("target") == "local":  # the fault targets' local://: no backend
        return False
    return not BACKEND_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))


def _xdist_group(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "sandbox_url" in callspec.params:
        return f"backend-{callspec.params['sandbox_url']}"  # the matrix: its session-wide backend
    if item.path.stem in REAL_TIER_MODULES:
        return REAL_TIER_GROUP
    if item.path.parent.name == "sandboxes":
        return f"module-{item.path.stem}"  # module-scoped containers, sshd, boxes
    stem = item.path.stem
    if item.path.parent.name == "jupyter" and (stem.startswith("test_browser") or stem == "test_kernel"):
        # What a module's tests share and a worker builds once: a browser module's Chromium and
        # notebooks; test_kernel's ipykernel 6.29 venv. JupyterLab itself is per worker (a session
        # fixture: tests/jupyter/labserver.py), so the browser modules spread over the workers.
        return f"module-{stem}"
    return None


# Jupyter modules whose tests share something costly that a worker builds once: a browser
# module's Chromium and notebook set-up; test_kernel's ipykernel 6.29 venv. JupyterLab itself is
# per worker (a session fixture), so browser modules spread over the workers.
SHARED_PER_MODULE = {
    "test_kernel",
    "test_browser",
    "test_browser_dashboard",
    "test_browser_health",
    "test_browser_reopen",
    "test_browser_terminal",
    "test_browser_untrusted",
}


def agent_pid(state_dir: Path) -> int | None:
    """PID of the agent serving in ``state_dir`` (found by its socket), or None."""
    sock = state_dir / "agent.sock"
    if not sock.exists():
        return None
    with rx.connect(f"local://?dir={state_dir}") as sb:
        return sb.info.pid


def wait_exit(pid: int, timeout: float) -> bool:
    """Wait (on a pidfd, not a sleep loop) for process ``pid`` to exit; True if it did."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def stop_agent(state_dir: Path, timeout: float = 30.0) -> None:
    """End the keeper and agent of ``state_dir`` (if any) and wait until both are gone.

    SIGTERM goes to the keeper: it passes it on to the agent, which ends its jobs and exits 0;
    the keeper then ends what is left and exits. SIGTERM to the agent alone is not enough in
    every case (a crash-restart could be under way), and would leave the keeper lingering.
    Starts nothing: no connect, only the keeper's control socket.
    """
    from remote_exec.agent.keeperlink import keeper_call

    hello = None
    if (state_dir / "keeper.sock").exists():
        with contextlib.suppress(OSError, ValueError):
            hello = keeper_call(state_dir, {"op": "hello"}, 10.0)
    info = hello or {}
    pids = [int(p) for p in (info.get("pid"), info.get("agent_pid")) if p]
    if not pids and (state_dir / "agent.sock").exists():  # an agent without a keeper
        with contextlib.suppress(rx.RemoteExecError, OSError):
            pid = agent_pid(state_dir)
            pids = [pid] if pid else []
    if not pids:
        return
    fds = []
    for pid in pids:
        with contextlib.suppress(OSError):
            fds.append(os.pidfd_open(pid))
    try:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pids[0], signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for fd in fds:  # a pidfd turns readable when its process exits
            if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise AssertionError(f"the agent of {state_dir} (pids {pids}) did not exit within {timeout} s")
    finally:
        for fd in fds:
            os.close(fd)


@pytest.fixture(scope="session")
def agent_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A state dir whose agent is shared by the session's tests and stopped at the end."""
    d = tmp_path_factory.mktemp("agent") / "state"
    yield d
    stop_agent(d)


@pytest.fixture
def fresh_agent_dir(tmp_path: Path) -> Iterator[Path]:
    """A state dir for one test's own agent (for tests that kill or reconfigure it)."""
    d = tmp_path / "state"
    yield d
    with contextlib.suppress(rx.RemoteExecError):
        stop_agent(d)


@pytest.fixture(params=CHANNELS)
def url(request: pytest.FixtureRequest, agent_dir: Path) -> str:
    """The shared agent's URL, once per channel kind."""
    return f"local://?dir={agent_dir}&channel={request.param}"


def job_dir(state: Path, job_id: str) -> Path:
    """The dir of job ``job_id`` in the state dir ``state``: named by the agent's own name for
    the job (``<state dir id>-<n>``), whose ``job.json`` names the id the client chose."""
    jobs = state / "jobs"
    for d in jobs.iterdir():
        try:
            meta = json.loads((d / "job.json").read_bytes())
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict) and job_id in (meta.get("job_id"), meta.get("client_id")):
            return d
    return jobs / job_id


@pytest.fixture
def pollers(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[int]:
    """Polls and follow calls sent to the agent, by the handle (or its follower) that sent them
    (one handle: one read per chunk)."""
    sent: collections.Counter[int] = collections.Counter()
    real_poll, real_follow = ExecRemoteProcess._poll_once, Follower._follow

    async def polled(self: ExecRemoteProcess) -> None:
        sent[id(self)] += 1
        await real_poll(self)

    async def followed(self: Follower) -> None:
        sent[id(self)] += 1
        await real_follow(self)

    monkeypatch.setattr(ExecRemoteProcess, "_poll_once", polled)
    monkeypatch.setattr(Follower, "_follow", followed)
    return sent


def wait_for(predicate: Callable[[], object], timeout: float = 20.0, what: str = "condition") -> None:
    """Wait (a deadline loop, 20 ms a look) until ``predicate()`` is true."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def run_cli(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "remote_exec.cli", *args], capture_output=True, text=True, timeout=60, **kwargs
    )


# A client process: one job of each ``on_disconnect`` policy, their ids printed, then it blocks.
_TWO_POLICY_CLIENT = textwrap.dedent("""
    import sys, remote_exec as rx
    with rx.connect(sys.argv[1]) as sb:
        keep = sb.exec_remote(["sleep", "300"], policy=rx.JobPolicy(on_disconnect="keep"))
        kill = sb.exec_remote(["sleep", "300"], policy=rx.JobPolicy(on_disconnect="kill", disconnect_grace=2))
        for proc in (keep, kill):
            sb.portal.call(proc.async_process.started)
        print(keep.job_id, kill.job_id, flush=True)
        sys.stdin.read()
""")


async def sigkilled_client(url: str) -> tuple[str, str, float]:
    """Run a client process on ``url`` that starts a ``keep`` job and a ``kill`` job (grace 2 s),
    then SIGKILL it (no goodbye: its connection, or its relay, just closes). Returns the two job
    ids and when it died (``time.monotonic()``)."""
    async with await anyio.open_process([sys.executable, "-c", _TWO_POLICY_CLIENT, url]) as client:
        assert client.stdout is not None
        with anyio.fail_after(90):
            line = (await BufferedByteReceiveStream(client.stdout).receive_until(b"\n", 4096)).decode()
        keep_id, kill_id = line.split()
        client.kill()  # SIGKILL
        await client.wait()
        return keep_id, kill_id, time.monotonic()


def runner(prefix: list[str], env: dict[str, str] | None = None) -> RunIn:
    """Runs an argv after ``prefix`` (``docker exec NAME``, or nothing for ``local://``): a
    :class:`~tests.faults.suite.Target`'s way into its sandbox."""

    async def run_in(argv: list[str]) -> tuple[int, bytes, bytes]:
        done = await anyio.run_process([*prefix, *argv], env=env, check=False)
        return done.returncode, done.stdout, done.stderr

    return run_in


@pytest.fixture(params=["local", "jail", "docker"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    """A sandbox of each kind whose agent a test kills or hands over (the fault suite, durable
    shells): ``local://`` with its own state dir, a real bubblewrap jail, a container of a real
    dockerd (named after the test module). ``ours`` picks the state dir's processes and the fault
    workload's (its commands say ``rxfault``)."""
    from remote_exec.sandboxes.jailbox import JailBox, JailConfig, exec_argv

    from .faults.suite import Target
    from .sandboxes.backend_docker import docker_or_skip, image_or_skip
    from .sandboxes.backend_jail import require_jail

    if request.param == "local":
        state = tmp_path / "state"
        yield Target("local", f"local://?dir={state}", runner([]), lambda args: str(state) in args or "rxfault" in args)
        stop_agent(state)  # the keeper and the agent: ended, and waited for
    elif request.param == "jail":
        work = tmp_path / "work"
        work.mkdir()
        require_jail(work)
        box = JailBox.start(JailConfig(work))  # from pytest's main thread: --die-with-parent follows it
        try:

            async def run_in(argv: list[str]) -> tuple[int, bytes, bytes]:
                return await runner([])(exec_argv(box.pid, argv))

            yield Target("jail", box.url, run_in, lambda args: True)
        finally:
            box.kill()
    else:
        d = docker_or_skip()
        name = d.run(f"rx-{request.module.__name__.rsplit('.', 1)[-1]}", image_or_skip(d, "usr"), "-v", "/usr:/usr:ro")
        try:
            env = {**os.environ, "DOCKER_HOST": d.host}
            yield Target("docker", f"docker://{name}", runner(["docker", "exec", name], env), lambda args: True)
        finally:
            d.docker("rm", "-f", name, check=False)


async def agent_killed(sb: rx.AsyncSandbox) -> None:
    """SIGKILL ``sb``'s agent (not its keeper) and wait, up to 30 s, for the keeper's next one to
    answer: the call reconnects to it."""
    old = sb.info.pid
    os.kill(old, signal.SIGKILL)
    with anyio.fail_after(30):
        assert (await sb.server_info()).pid != old
