"""The keeper: a tiny parent of the agent that outlives it, so that jobs outlive the agent.

One keeper runs per state dir (``remote-exec-agent keeper``, started by ``ensure``). It

- sets ``PR_SET_CHILD_SUBREAPER``: when the agent dies, its jobs (and anything they daemonised)
  are reparented to the keeper, never to init, so they stay reapable and killable as one tree;
- starts the agent server as its child and restarts it when it dies by accident (a crash,
  ``kill -9``, the OOM killer); a new agent re-adopts the jobs from the state dir;
- reaps every orphan and records its exit (code or signal, time) keyed by ``(pid, starttime)``
  (``/proc/PID/stat`` field 22, read while the process is still a zombie), so a recycled pid
  is never taken for the job that had it;
- counts the CPU time of each orphan it reaps for the job it belonged to (:mod:`..orphancpu`);
- holds a duplicate of each job's stdin write end (passed with ``SCM_RIGHTS``), so the job
  does not read EOF when the agent that held the other end dies.

Its parts, each with one job: :mod:`.supervisor` (the agent process: started, told ready,
restarted after an accident, its exit code read as what it wants), :mod:`.reaper` (children
reaped, exits recorded), :mod:`.control` (the control socket and its ops), :mod:`.auth` (who is
served, the leaders' ledger), :mod:`.caps` (the disk caps while no agent runs); this module is
the select loop that joins them. The control protocol is versioned by
:data:`~.protocol.KEEPER_PROTOCOL` in ``hello``; newer agents must keep working with an older
keeper (an upgrade replaces the agent, not the keeper), so ops are only ever added. The package
imports the standard library only: the keeper stays small (~10 MB RSS) and runs from the
PyInstaller bundle as well as from the package.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import selectors
import signal
import socket
import sys
import time

from ..procfacts import reset_signals
from .caps import CapSweeper, disk_cap_of
from .control import Control, send
from .protocol import HANDOVER_EXIT, KEEPER_PROTOCOL, KEEPER_SOCKET
from .reaper import Reaper
from .supervisor import Supervisor

__all__ = ["HANDOVER_EXIT", "KEEPER_PROTOCOL", "KEEPER_SOCKET", "Keeper", "main", "run_cli"]

PR_SET_CHILD_SUBREAPER = 36
LINGER = 60.0  # with no agent and no child left, exit after this long without a ``start``
CAP_SWEEP = 1.0  # seconds between applications of the disk caps while no agent runs


def _set_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


class Keeper:
    """The keeper's parts and its select loop (single-threaded: no locks)."""

    def __init__(self, state_dir: str, agent_argv: list[str], ready_fd: int | None) -> None:
        self.sel = selectors.DefaultSelector()
        self.agent = Supervisor(state_dir, agent_argv, ready_fd, self.sel, send)
        self.reaper = Reaper(lambda: self.agent.pid, self._agent_exited)
        self.control = Control(self.sel, self.agent, self.reaper)
        self.caps = CapSweeper(os.path.join(state_dir, "jobs"))
        self.cap_due = 0.0  # when the caps are next applied (only while no agent runs)
        self.idle_since: float | None = None

    def _agent_exited(self, how: dict[str, object]) -> None:
        self.cap_due = time.monotonic() + CAP_SWEEP  # a gap shorter than this needs no sweep
        self.agent.exited(how)

    def run(self, listener: socket.socket) -> None:
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        # A SIGTERM for the keeper is a shutdown of everything: passed on to the agent, which
        # ends its jobs and exits 0; the keeper then ends what is left and exits.
        signal.signal(signal.SIGTERM, lambda *_: self.agent.terminate())
        signal.signal(signal.SIGINT, lambda *_: self.agent.terminate())
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a closed terminal is no reason to end jobs
        self.sel.register(wake_r, selectors.EVENT_READ, "wake")
        self.sel.register(listener, selectors.EVENT_READ, "listen")
        agent = self.agent
        agent.spawn()
        while True:
            self.reaper.reap()
            now = time.monotonic()
            if not agent.pid and agent.restart_at is None and now >= self.cap_due:
                # No agent, none about to start: nobody else applies the disk caps (see .caps).
                self.cap_due = now + CAP_SWEEP
                self.caps.sweep(disk_cap_of(agent.argv))
            agent.restart_if_due(now)
            if agent.stopping and not agent.pid:
                if self.reaper.end_children():
                    return
                timeout: float | None = 0.05  # killed children are reaped on SIGCHLD; re-scan soon
            elif not agent.pid and agent.restart_at is None:
                # No agent (a handover, or it kept dying): wait for a ``start``, not forever.
                self.idle_since = self.idle_since or now
                if now - self.idle_since > LINGER and not self.reaper.children():
                    return
                timeout = min(LINGER / 4, CAP_SWEEP)
            else:
                self.idle_since = None
                timeout = None if agent.restart_at is None else max(0.0, agent.restart_at - now)
            for key, _ in self.sel.select(timeout):
                if key.data == "wake":
                    with contextlib.suppress(OSError):
                        while os.read(wake_r, 512):
                            pass
                elif key.data == "listen":
                    self.control.accept(listener)
                elif key.data == "ready":
                    agent.on_ready_pipe()
                else:
                    self.control.readable(key.data)


def main(state_dir: str, agent_argv: list[str], ready_fd: int | None) -> int:
    """Run the keeper of ``state_dir`` until an explicit shutdown; the agent runs ``agent_argv``."""
    reset_signals()
    if ready_fd is not None:
        os.set_inheritable(ready_fd, False)  # the ``ensure`` caller's, not the agent's
    if not _set_subreaper():
        print("keeper: PR_SET_CHILD_SUBREAPER unavailable: orphans go to init", file=sys.stderr)
    path = os.path.join(state_dir, KEEPER_SOCKET)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # our caller holds agent.lock and found no keeper answering
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # born 0600: no window where another user can connect
    try:
        listener.bind(path)
    except OSError as exc:
        if exc.errno in (errno.EADDRINUSE, errno.ENAMETOOLONG):
            print(f"keeper: cannot bind {path}: {exc}", file=sys.stderr)
            return 3
        raise
    finally:
        os.umask(old)
    listener.listen(64)
    listener.setblocking(False)
    try:
        Keeper(state_dir, agent_argv, ready_fd).run(listener)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return 0


def run_cli(args: list[str]) -> int:
    """``keeper --dir DIR [--ready-fd N] -- AGENT_ARGV...`` (argparse-free: it imports little)."""
    try:
        split = args.index("--")
        opts, agent_argv = args[:split], args[split + 1 :]
        state_dir = opts[opts.index("--dir") + 1]
        ready_fd = int(opts[opts.index("--ready-fd") + 1]) if "--ready-fd" in opts else None
    except (ValueError, IndexError):
        print("usage: remote-exec-agent keeper --dir DIR [--ready-fd N] -- AGENT_ARGV...", file=sys.stderr)
        return 2
    if not agent_argv:
        print("keeper: no agent argv", file=sys.stderr)
        return 2
    return main(state_dir, agent_argv, ready_fd)
