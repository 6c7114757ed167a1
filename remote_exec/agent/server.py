"""The agent server: JSON-RPC on two private Unix sockets (never a TCP port): the frame stream
(:mod:`.stream`, the host's channels) and HTTP (:mod:`.httpserve`, the stateless CLI's calls).

aiohttp, which serves the HTTP socket, is imported only when a first request arrives there
(:mod:`.lazyhttp`): its import was a third of an agent's start-up CPU, and most agents are only
ever reached through the frame stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import secrets
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from .._version import __version__
from ..errors import RemoteExecError
from ..protocol import HEARTBEAT, HEARTBEAT_ANSWER, PROTOCOL_VERSION, Empty, Method, ServerInfo, frames
from .budget import MemoryBudget, default_budget
from .files.controller import FileController
from .files.methods import file_methods
from .files.sessions import FileLimits
from .holepunch import DEFAULT_CAP
from .intake import LINE_PIECE, Intake
from .jobs.cgroup import CgroupHome
from .jobs.controller import JobController, JobLimits
from .jobs.home import JobHome
from .jobs.logbudget import LogBudget, default_log_budget
from .jobs.logfile import Inotify
from .jobs.methods import job_methods
from .jobs.policy import PolicyWatcher
from .jobs.proctable import prestart
from .keeperlink import KeeperLink
from .lazyhttp import LazyHttp
from .listener import private_listener
from .metrics import MetricsController, metrics_methods
from .ports.controller import PortController, PortLimits
from .ports.methods import port_methods
from .procfacts import reset_signals
from .rpc import Dispatcher
from .shell.controller import ShellController, ShellLimits
from .shell.methods import shell_methods
from .shell.process import ShellHome
from .statedir import secure_dir
from .statefile import claim_state_dir, open_own_file, planted, read_state_file
from .stream import STREAM_SOCKET, Peers, serve_frames
from .trash import Trash

__all__ = ["AgentApp", "ServerConfig", "build_app", "serve"]

log = logging.getLogger("remote_exec.agent")
MAX_REQUEST = 96 * 1024 * 1024  # a 64 MiB stdin write, base64'd, plus the envelope
SHUTDOWN_TIMEOUT = 2.0
KEEPER_TELL_TIMEOUT = 2.0  # for telling the keeper we leave (it may be frozen: we leave anyway)
WRITE_JOURNAL = "writes"  # in the state dir: one entry per open write (see files/journal.py)
CAPABILITIES = ["exec_remote", "long_poll", "base64", "stdin_offset", "idempotent_start", "shell", "payload", "ports"]
CAPABILITIES += ["files", "ping", "stats", "durable_jobs", "tty", "job_policy", "job_stats_many"]


@dataclass
class ServerConfig:
    """How ``serve`` runs: where, with which limits, and when to exit by itself.

    :ivar idle_timeout: seconds with no running job, no open shell session and no request
        before the server exits; 0 means never.
    :ivar shell_limits: shell session bounds, the idle TTL of a session among them.
    :ivar port_limits: forwarded-connection bounds, and whether non-loopback targets are allowed.
    :ivar file_limits: write-session bounds (how long an abandoned one lives, how many at once).
    :ivar memory_budget: bytes the agent holds for others at most (requests arriving, stdin
        queued, output retained); see :mod:`remote_exec.agent.budget`.
    :ivar disk_cap: bytes of each job output stream kept on disk by default.
    :ivar log_budget: bytes of all jobs' logs kept on disk at most; None: derived from the
        state dir's file system (see :func:`~remote_exec.agent.jobs.logbudget.default_log_budget`).
    :ivar report_version: the version ``server_info`` reports (tests fake an older agent with it).
    :ivar cgroups: make a cgroup per job where one can be made (see :mod:`.jobs.cgroup`).
    """

    state_dir: Path
    idle_timeout: float = 900.0
    limits: JobLimits = field(default_factory=JobLimits)
    shell_limits: ShellLimits = field(default_factory=ShellLimits)
    port_limits: PortLimits = field(default_factory=PortLimits)
    file_limits: FileLimits = field(default_factory=FileLimits)
    memory_budget: int = field(default_factory=default_budget)
    disk_cap: int = DEFAULT_CAP
    log_budget: int | None = None
    report_version: str = __version__
    cgroups: bool = True


class _Activity:
    def __init__(self) -> None:
        self.in_flight = 0
        self.last = time.monotonic()


@dataclass(eq=False)
class AgentApp:
    """One agent's parts, made by :func:`build_app`; ``cleanup`` ends them (see :func:`serve`)."""

    jobs: JobController
    shells: ShellController
    ports: PortController
    files: FileController
    activity: _Activity
    budget: MemoryBudget
    intake: Intake
    handle_frame: Callable[[frames.Frame], Awaitable[bytes | None]]
    """Answers one frame of the frame stream (or None: no answer)."""
    handle_body: Callable[[bytes], Awaitable[bytes | None]]
    """Answers one HTTP request's body, counted as activity."""
    peers: Peers
    instance_id: str
    keeper: KeeperLink
    inotify: Inotify
    cleanup: Callable[[], Awaitable[None]]
    handover: bool = False
    stop: asyncio.Event = field(default_factory=asyncio.Event)


def build_app(config: ServerConfig) -> AgentApp:
    """The agent's parts: controllers are built here, never at import time."""
    instance_id = secrets.token_hex(4)
    budget = MemoryBudget(config.memory_budget)
    intake = Intake(budget)
    jobs_root = secure_dir(_claimed(config.state_dir / "jobs"))
    keeper = KeeperLink(config.state_dir)
    inotify = Inotify()
    logs = LogBudget(config.log_budget or default_log_budget(jobs_root))
    trash = Trash(config.state_dir / "trash")  # checked at each use (see .trash)
    trash.empty()  # what an earlier agent left there
    home = JobHome(jobs_root, keeper, inotify if inotify.available else None, config.disk_cap, logs, trash)
    state_id = _state_id(jobs_root)
    home.cgroups = CgroupHome.discover(state_id) if config.cgroups else None
    jobs = JobController(instance_id, config.limits, budget, home=home, prefix=state_id)
    peers = Peers()
    policies = PolicyWatcher(peers, keeper)
    jobs.watcher = policies
    started_at = time.time()
    dispatcher = Dispatcher()
    dispatcher.register(job_methods(jobs))
    shell_home = ShellHome(config.state_dir / "shells", keeper, home.inotify, home)
    shells = ShellController(jobs, config.shell_limits, home=shell_home)
    dispatcher.register(shell_methods(shells))
    ports = PortController(instance_id, config.port_limits)
    dispatcher.register(port_methods(ports))
    files = FileController(config.file_limits, journal=config.state_dir / WRITE_JOURNAL)
    dispatcher.register(file_methods(files))

    async def server_info(_: Empty) -> ServerInfo:
        return ServerInfo(
            version=config.report_version,
            protocol_version=PROTOCOL_VERSION,
            pid=os.getpid(),
            started_at=started_at,
            instance_id=instance_id,
            capabilities=CAPABILITIES,
            keeper_pid=keeper.hello.get("pid") if keeper.present else None,
        )

    dispatcher.register(metrics_methods(MetricsController(jobs, config.state_dir)))

    async def ping(_: Empty) -> Empty:
        return Empty()  # the frame arriving is the news: serve_frames stamped its Peer

    async def server_handover(_: Empty) -> ServerInfo:
        # Answer first, then leave: the jobs stay with the keeper for the next agent.
        info = await server_info(Empty())
        if not keeper.present:
            raise RemoteExecError("this agent has no keeper: its jobs would die with it, so it does not hand over")
        app.handover = True
        asyncio.get_running_loop().call_soon(app.stop.set)
        return info

    dispatcher.register({Method.SERVER_INFO: server_info, Method.PING: ping, Method.SERVER_HANDOVER: server_handover})
    activity = _Activity()

    async def tracked(answer: Awaitable[bytes | None]) -> bytes | None:
        activity.in_flight += 1
        try:
            return await answer
        finally:
            activity.in_flight -= 1
            activity.last = time.monotonic()

    async def handle_frame(frame: frames.Frame) -> bytes | None:
        if frame.message == HEARTBEAT and frame.payload is None:
            # Answered at once, unparsed, and not activity: an idle client's heartbeats must not
            # keep an agent with nothing to do from its idle exit.
            return HEARTBEAT_ANSWER
        return await tracked(dispatcher.handle_frame(frame))

    async def handle_body(body: bytes) -> bytes | None:
        return await tracked(dispatcher.handle(body))

    async def cleanup() -> None:
        # Kills first: they need no worker thread, and nothing after them may hold them up.
        # A handover kills no job: the keeper holds them for the next agent.
        await policies.aclose()
        if app.handover:
            jobs.detach()
        else:
            await jobs.aclose()
        await shells.aclose(handover=app.handover)
        await ports.aclose()
        await files.aclose()

    app = AgentApp(
        jobs=jobs,
        shells=shells,
        ports=ports,
        files=files,
        activity=activity,
        budget=budget,
        intake=intake,
        handle_frame=handle_frame,
        handle_body=handle_body,
        peers=peers,
        instance_id=instance_id,
        keeper=keeper,
        inotify=inotify,
        cleanup=cleanup,
    )
    return app


def _claimed(path: Path) -> Path:
    """``path``, a dir again if a job put a symlink or file there (logged): in the agent's own
    0700 state dir only its user (a job) can have, and refusing it stopped every next agent."""
    with contextlib.suppress(OSError):  # none can be made (no state dir yet, read-only): secure_dir says
        os.close(claim_state_dir(path))
    return path


def _state_id(jobs_root: Path) -> str:
    """The state dir's id (made once, kept in ``jobs/ID``): the prefix of every job id, so ids
    stay valid across agents but never match another state dir's."""
    path = jobs_root / "ID"
    try:
        text = read_state_file(path, 64).decode("ascii").strip()
        if text.isascii() and text.isalnum() and 0 < len(text) <= 32:  # the safe id form (names.py)
            return text
    except (OSError, ValueError) as exc:
        if planted(exc):  # a job's symlink or FIFO: never written through, never opened
            log.warning("skipped %s: %s; the state dir gets a new id", path, exc)
            os.unlink(path)
    text = secrets.token_hex(4)
    fd = open_own_file(path, os.O_WRONLY | os.O_TRUNC)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    return text


def _raise_fd_limit() -> None:
    # Each job holds 3-4 fds; the default soft limit (1024) would cap us near 250 jobs.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def serve(config: ServerConfig, ready_fd: int | None = None) -> bool:
    """Serve until SIGTERM/SIGINT or until idle (every job's tree is then killed), or until a
    ``server_handover`` (jobs left running for the keeper); True after a handover."""
    reset_signals()  # jobs must not inherit an ignored SIGINT/SIGHUP from whoever started us
    prestart()  # the kill path's threads, made while threads can be made (see .jobs.proctree)
    _raise_fd_limit()
    if sys.version_info < (3, 12):
        # 3.11's default watcher runs a thread per child; pidfds scale to thousands of jobs.
        asyncio.get_running_loop()  # the watcher attaches to the running loop
        watcher = asyncio.PidfdChildWatcher()
        asyncio.set_child_watcher(watcher)
        watcher.attach_loop(asyncio.get_running_loop())
    state_dir = secure_dir(config.state_dir)
    sock = state_dir / "agent.sock"
    stream_sock = state_dir / STREAM_SOCKET
    app = build_app(config)
    app.files.recover()  # temporary files of write sessions a killed agent left behind
    if await app.keeper.connect():
        restored = await app.jobs.restore()
        shells = await app.shells.restore()
        await app.jobs.end_dead_shells(app.shells.adopted_marks)
        log.info(
            "keeper %s holds this state dir; %d job(s), %d shell(s) re-adopted",
            app.keeper.hello.get("pid"),
            restored,
            shells,
        )
    home = app.jobs.home
    cgroups = home.cgroups if home is not None else None
    if cgroups is not None:  # a dead agent's jobs' cgroups, once empty
        cgroups.sweep(app.jobs.is_running)
    if app.inotify.available:
        asyncio.get_running_loop().add_reader(app.inotify.fd, app.inotify.on_readable)
    app.jobs.start_sweeper()
    for stale in (sock, stream_sock):  # ensure_server holds the lock and found nobody accepting
        if stale.exists():
            stale.unlink()
    # The frame stream first: the HTTP socket is what clients wait for, so once it accepts
    # both do. A deep backlog: a burst of connections (1000 clients starting jobs at once)
    # must queue, not fail with EAGAIN, which asyncio does not retry for Unix sockets.
    streams = await asyncio.start_unix_server(
        lambda r, w: serve_frames(r, w, app.handle_frame, MAX_REQUEST, app.intake, app.peers),
        sock=private_listener(stream_sock, backlog=4096),
        limit=LINE_PIECE,  # longer lines are read (and charged to the budget) piece by piece
    )
    http = LazyHttp(private_listener(sock, backlog=4096), app.handle_body, app.intake, MAX_REQUEST, SHUTDOWN_TIMEOUT)
    await http.start()
    stop = app.stop
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if ready_fd is not None:
        os.write(ready_fd, b"ready\n")
        os.close(ready_fd)
    log.info("agent %s serving on %s", app.instance_id, sock)
    idle = asyncio.create_task(_idle_watch(app, config.idle_timeout, stop))
    try:
        await stop.wait()
    finally:
        idle.cancel()
        # The keeper first: a ``start`` it gets from now on waits for our successor instead of
        # being told that we are ready while our sockets go away.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(KEEPER_TELL_TIMEOUT):
                await app.keeper.request({"op": "leaving"})
        streams.close()
        for path in (sock, stream_sock):
            with contextlib.suppress(OSError):
                path.unlink()
        try:
            await http.aclose()
        finally:
            await app.cleanup()
        if cgroups is not None and not app.handover:
            cgroups.sweep(app.jobs.is_running)
            cgroups.close()
    return app.handover


async def _idle_watch(app: AgentApp, idle_timeout: float, stop: asyncio.Event) -> None:
    if idle_timeout <= 0:
        return
    jobs, shells, activity = app.jobs, app.shells, app.activity
    held_by_shells = False  # told once per stretch: why an idle agent stays up
    while True:
        # A timer, not synchronisation: nothing signals "time passed with nothing happening".
        await asyncio.sleep(min(idle_timeout / 4, 5.0))
        quiet = time.monotonic() - activity.last
        idle = not jobs.running_count and activity.in_flight == 0 and quiet >= idle_timeout
        # An open shell keeps the agent up: its state would die with it (the shell TTL bounds it).
        if idle and shells.open_count:
            if not held_by_shells:
                log.info("idle for %.0f s, but %d shell session(s) open: staying up", quiet, shells.open_count)
            held_by_shells = True
        elif idle:
            log.info("idle for %.0f s with no jobs: exiting", quiet)
            stop.set()
            return
        else:
            held_by_shells = False
