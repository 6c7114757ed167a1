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

The agent's exit code says what it wants: 0 is an explicit shutdown or an idle exit (the agent
killed its jobs; the keeper kills whatever is left of its children and exits; so does a death by
SIGTERM or SIGINT), :data:`HANDOVER_EXIT` a handover
(jobs stay; the keeper waits for a ``start`` with the next agent's argv), anything else an
accident (restarted at once, then with a back-off if it keeps dying young).

The control protocol is newline-delimited JSON on ``keeper.sock`` (0600, peer uid checked; what
the keeper holds goes only to the agent it spawned, see :mod:`.auth`), one answer per
request, versioned by :data:`KEEPER_PROTOCOL` in ``hello``; newer agents must keep working
with an older keeper (an upgrade replaces the agent, not the keeper), so ops are only ever added
(protocol 2: ``lead`` and ``leads``). This module imports the standard library only: the keeper stays small (~10 MB RSS)
and runs from the PyInstaller bundle as well as from the package.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import selectors
import signal
import socket
import sys
import time
from collections import OrderedDict
from typing import Any

from ..orphancpu import OrphanCpu
from ..procfacts import proc_starttime, reset_signals
from ..statefile import open_own_file
from .auth import AGENT_OPS, Leaders, peer_of
from .caps import CapSweeper, disk_cap_of

__all__ = ["HANDOVER_EXIT", "KEEPER_PROTOCOL", "KEEPER_SOCKET", "main", "run_cli"]

KEEPER_PROTOCOL = 2
KEEPER_SOCKET = "keeper.sock"
HANDOVER_EXIT = 75  # EX_TEMPFAIL: "I left on purpose, my jobs stay"
PR_SET_CHILD_SUBREAPER = 36
MAX_EXITS = 65536  # exit records kept (a daemonising job may churn through many orphans)
MAX_LINE = 1 << 20
READY_TIMEOUT = 30.0
QUICK_DEATH = 2.0  # an agent dying this soon after its start counts towards the back-off
MAX_QUICK_DEATHS = 5  # then stop restarting until someone asks (``start``)
LINGER = 60.0  # with no agent and no child left, exit after this long without a ``start``
CAP_SWEEP = 1.0  # seconds between applications of the disk caps while no agent runs


def _set_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


class _Conn:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.fds: list[int] = []
        self.agent_gen = -1  # the agent generation that made this connection (-1: not an agent)
        self.told_refused = False


class Keeper:
    """The keeper's state and its select loop (single-threaded: no locks)."""

    def __init__(self, state_dir: str, agent_argv: list[str], ready_fd: int | None) -> None:
        self.state_dir = state_dir
        self.agent_argv = agent_argv
        self.ready_fd = ready_fd  # the first ``ensure``'s: told once the first agent is ready
        self.sel = selectors.DefaultSelector()
        self.agent_pid = 0
        self.agent_gen = 0  # one more per agent spawned: a connection serves only its own
        self.leaders = Leaders()  # the job leaders our agents started (see .auth)
        self.agent_started = 0.0
        self.agent_ready = False
        self.ready_pipe: int | None = None
        self.quick_deaths = 0
        self.stopping = False  # an explicit shutdown: no restart, end the children, exit
        self.caps = CapSweeper(os.path.join(state_dir, "jobs"))
        self.cap_due = 0.0  # when the caps are next applied (only while no agent runs)
        self.waiting_start: list[_Conn] = []  # ``start`` requests answered once the agent is ready
        self.exits: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.held: dict[str, int] = {}  # key (a job id) -> a stdin write end
        self.orphan_cpu = OrphanCpu()  # the CPU time of the jobs' orphans reaped here
        self.restart_at: float | None = None
        self.idle_since: float | None = None
        self.started_at = time.time()

    # -- the agent -------------------------------------------------------------------------

    def spawn_agent(self) -> None:
        read_fd, write_fd = os.pipe()
        os.set_inheritable(write_fd, True)
        try:  # a FIFO a job put there blocked this open, and the keeper with it, for good
            log = open_own_file(os.path.join(self.state_dir, "agent.log"), os.O_WRONLY | os.O_APPEND)
        except (OSError, ValueError):
            log = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        try:
            argv = [*self.agent_argv, "--ready-fd", str(write_fd)]
            actions = [
                (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, log, 1),
                (os.POSIX_SPAWN_DUP2, log, 2),
            ]
            self.agent_pid = os.posix_spawnp(argv[0], argv, dict(os.environ), file_actions=actions)
        except OSError as exc:
            os.close(read_fd)
            os.write(log, f"keeper: cannot start the agent {self.agent_argv}: {exc}\n".encode())
            self.agent_pid = 0
            self._answer_start({"ok": False, "error": f"cannot start the agent: {exc}"})
            return
        finally:
            os.close(write_fd)
            os.close(log)
        self.agent_gen += 1
        self.agent_started = time.monotonic()
        self.agent_ready = False
        self.ready_pipe = read_fd
        self.sel.register(read_fd, selectors.EVENT_READ, "ready")

    def _on_ready_pipe(self) -> None:
        assert self.ready_pipe is not None
        try:
            data = os.read(self.ready_pipe, 64)
        except OSError:
            data = b""
        if data.startswith(b"ready"):
            self.agent_ready = True
            self._answer_start({"ok": True, "agent_pid": self.agent_pid})
        self.sel.unregister(self.ready_pipe)
        os.close(self.ready_pipe)
        self.ready_pipe = None
        if not data.startswith(b"ready"):
            self._answer_start({"ok": False, "error": "the agent exited before it was ready (see agent.log)"})

    def _answer_start(self, answer: dict[str, Any]) -> None:
        if self.ready_fd is not None:
            with contextlib.suppress(OSError):
                os.write(self.ready_fd, b"ready\n" if answer["ok"] else b"failed\n")
                os.close(self.ready_fd)
            self.ready_fd = None
        waiting, self.waiting_start = self.waiting_start, []
        for conn in waiting:
            self._send(conn, answer)

    def _agent_exited(self, how: dict[str, Any]) -> None:
        self.agent_pid = 0
        self.cap_due = time.monotonic() + CAP_SWEEP  # a gap shorter than this needs no sweep
        if self.ready_pipe is not None:
            self._on_ready_pipe()  # its EOF: answers the waiters with the failure
        code = how.get("code")
        if code in (0, -signal.SIGTERM, -signal.SIGINT):
            # An explicit shutdown (or idle exit): everything ends, nothing is restarted. A
            # SIGTERM that arrived before the agent installed its handler killed it outright:
            # still a request to stop, not a crash to recover from.
            self.stopping = True
        elif code == HANDOVER_EXIT:
            self.quick_deaths = 0  # someone will ``start`` the next agent
        else:
            young = time.monotonic() - self.agent_started < QUICK_DEATH
            self.quick_deaths = self.quick_deaths + 1 if young else 0
            if self.quick_deaths < MAX_QUICK_DEATHS:
                delay = 0.0 if self.quick_deaths <= 1 else min(0.1 * 2**self.quick_deaths, 5.0)
                self.restart_at = time.monotonic() + delay

    # -- reaping ---------------------------------------------------------------------------

    def reap(self) -> None:
        """Reap every child that has exited, recording each one's exit."""
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or info.si_pid == 0:
                return
            pid = info.si_pid
            start = proc_starttime(pid)  # still readable: the zombie is not reaped yet
            job = self.orphan_cpu.job_of(pid) if pid != self.agent_pid else None
            usage = None
            with contextlib.suppress(ChildProcessError):
                usage = os.wait4(pid, 0)[2]
            self.orphan_cpu.add(job, usage)  # its CPU stays its job's (see .orphancpu)
            killed = info.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
            how: dict[str, Any] = {"code": -info.si_status if killed else info.si_status, "at": time.time()}
            if pid == self.agent_pid:
                self._agent_exited(how)
                continue
            self.exits[f"{pid}:{start}"] = how
            while len(self.exits) > MAX_EXITS:
                self.exits.popitem(last=False)

    def children(self) -> list[int]:
        me = str(os.getpid()).encode()
        found = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                with contextlib.suppress(OSError):
                    with open(f"/proc/{name}/stat", "rb") as f:
                        fields = f.read().rsplit(b")", 1)[1].split()
                    if fields[1] == me and fields[0] != b"Z":
                        found.append(int(name))
        return found

    def end_children(self) -> bool:
        """SIGKILL every child (the orphans of the agent's jobs); True once none is left."""
        self.reap()
        kids = self.children()
        for pid in kids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        return not kids

    # -- requests --------------------------------------------------------------------------

    def _send(self, conn: _Conn, answer: dict[str, Any], fds: list[int] | None = None) -> None:
        data = json.dumps(answer).encode() + b"\n"
        with contextlib.suppress(OSError):
            conn.sock.setblocking(True)
            conn.sock.settimeout(5.0)
            if fds:
                socket.send_fds(conn.sock, [data], fds)
            else:
                conn.sock.sendall(data)

    def handle(self, conn: _Conn, req: dict[str, Any], fds: list[int]) -> None:
        op = req.get("op")
        if op in AGENT_OPS and not self._from_agent(conn):
            self._refuse(conn, str(op))
        elif op in ("lead", "leads"):
            self._on_ledger(conn, req)
        elif op == "hello":
            self._send(conn, self._hello())
        elif op == "start":
            argv = req.get("argv")
            if not self.agent_pid and isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv):
                self.agent_argv = argv  # not while one runs: its restart after a crash is its own argv
            if self.agent_pid and self.agent_ready:
                self._send(conn, {"ok": True, "agent_pid": self.agent_pid, "already": True})
                return
            self.waiting_start.append(conn)
            self.stopping = False
            self.quick_deaths = 0
            if not self.agent_pid:
                self.restart_at = None
                self.spawn_agent()
        elif op == "exit":
            self.reap()
            self._send(conn, {"exit": self.exits.get(f"{req.get('pid')}:{req.get('start')}")})
        elif op == "cpu":
            self.reap()
            self._send(conn, {"cpu": self.orphan_cpu.answer(req.get("keys"))})
        elif op == "exits":
            self.reap()
            self._send(conn, {"exits": self.exits})
        elif op == "hold":
            key = str(req.get("key"))
            if fds:
                old = self.held.pop(key, None)
                if old is not None:
                    os.close(old)
                self.held[key] = fds.pop(0)
            self._send(conn, {"ok": True})
        elif op == "fd":
            fd = self.held.get(str(req.get("key")))
            self._send(conn, {"ok": fd is not None}, [fd] if fd is not None else None)
        elif op == "drop":
            fd = self.held.pop(str(req.get("key")), None)
            if fd is not None:
                os.close(fd)
            self.leaders.forget(str(req.get("key")))
            self._send(conn, {"ok": True})
        else:
            self._send(conn, {"error": f"unknown op {op!r}", "keeper": KEEPER_PROTOCOL})
        for fd in fds:  # any the op did not keep
            os.close(fd)

    # -- who is served (see .auth) ---------------------------------------------------

    def _from_agent(self, conn: _Conn) -> bool:
        """The connection was made by the agent that runs now (its generation, still unreaped)."""
        return bool(self.agent_pid) and conn.agent_gen == self.agent_gen

    def _refuse(self, conn: _Conn, op: str) -> None:
        if not conn.told_refused:  # one line per connection: a loop of refusals cannot fill the log
            conn.told_refused = True
            pid, _ = peer_of(conn.sock)
            print(f"keeper: refused {op!r} from pid {pid}: not the agent", file=sys.stderr, flush=True)
        self._send(conn, {"error": f"{op!r} is only for the agent", "refused": True})

    def _on_ledger(self, conn: _Conn, req: dict[str, Any]) -> None:
        if req.get("op") == "leads":
            self._send(conn, {"leads": self.leaders.answer()})
            return
        why = self.leaders.add(str(req.get("key")), req.get("pid"), self.agent_pid)
        self._send(conn, {"ok": why is None} if why is None else {"ok": False, "error": why})

    def _hello(self) -> dict[str, Any]:
        return {
            "keeper": KEEPER_PROTOCOL,
            "pid": os.getpid(),
            "agent_pid": self.agent_pid,
            "agent_argv": self.agent_argv,
            "held": len(self.held),
            "started_at": self.started_at,
        }

    def _on_conn(self, conn: _Conn) -> None:
        try:
            data, fds, _, _ = socket.recv_fds(conn.sock, 65536, 16, socket.MSG_CMSG_CLOEXEC)
        except OSError:
            data, fds = b"", []
        if not data:
            for fd in fds:
                os.close(fd)
            self._drop(conn)
            return
        for fd in fds:  # MSG_CMSG_CLOEXEC is not honoured by every Python: make sure
            os.set_inheritable(fd, False)
        conn.buf += data
        conn.fds += fds
        if len(conn.buf) > MAX_LINE:
            self._drop(conn)
            return
        while b"\n" in conn.buf:
            line, conn.buf = conn.buf.split(b"\n", 1)
            fds, conn.fds = conn.fds, []
            try:
                req = json.loads(line)
            except ValueError:
                req = {}
            self.handle(conn, req if isinstance(req, dict) else {}, fds)
            conn.sock.setblocking(False)

    def _drop(self, conn: _Conn) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(conn.sock)
        for fd in conn.fds:
            os.close(fd)
        if conn in self.waiting_start:
            self.waiting_start.remove(conn)
        conn.sock.close()

    def _accept(self, listener: socket.socket) -> None:
        try:
            sock, _ = listener.accept()
        except OSError:
            return
        pid, uid = peer_of(sock)
        if uid not in (os.geteuid(), 0):
            sock.close()  # another user's process: the socket is 0600, so this is paranoia
            return
        sock.setblocking(False)
        conn = _Conn(sock)
        if self.agent_pid and pid == self.agent_pid:
            conn.agent_gen = self.agent_gen  # our unreaped child: its pid cannot be a recycled one
        self.sel.register(sock, selectors.EVENT_READ, conn)

    # -- the loop --------------------------------------------------------------------------

    def run(self, listener: socket.socket) -> None:
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        # A SIGTERM for the keeper is a shutdown of everything: passed on to the agent, which
        # ends its jobs and exits 0; the keeper then ends what is left and exits.
        signal.signal(signal.SIGTERM, lambda *_: self._terminate())
        signal.signal(signal.SIGINT, lambda *_: self._terminate())
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a closed terminal is no reason to end jobs
        self.sel.register(wake_r, selectors.EVENT_READ, "wake")
        self.sel.register(listener, selectors.EVENT_READ, "listen")
        self.spawn_agent()
        while True:
            self.reap()
            now = time.monotonic()
            if not self.agent_pid and self.restart_at is None and now >= self.cap_due:
                # No agent, none about to start: nobody else applies the disk caps (see .caps).
                self.cap_due = now + CAP_SWEEP
                self.caps.sweep(disk_cap_of(self.agent_argv))
            if self.restart_at is not None and now >= self.restart_at and not self.stopping:
                self.restart_at = None
                self.spawn_agent()
            if self.stopping and not self.agent_pid:
                if self.end_children():
                    return
                timeout: float | None = 0.05  # killed children are reaped on SIGCHLD; re-scan soon
            elif not self.agent_pid and self.restart_at is None:
                # No agent (a handover, or it kept dying): wait for a ``start``, not forever.
                self.idle_since = self.idle_since or now
                if now - self.idle_since > LINGER and not self.children():
                    return
                timeout = min(LINGER / 4, CAP_SWEEP)
            else:
                self.idle_since = None
                timeout = None if self.restart_at is None else max(0.0, self.restart_at - now)
            for key, _ in self.sel.select(timeout):
                if key.data == "wake":
                    with contextlib.suppress(OSError):
                        while os.read(wake_r, 512):
                            pass
                elif key.data == "listen":
                    self._accept(listener)
                elif key.data == "ready":
                    self._on_ready_pipe()
                else:
                    self._on_conn(key.data)

    def _terminate(self) -> None:
        if self.agent_pid:
            with contextlib.suppress(OSError):
                os.kill(self.agent_pid, signal.SIGTERM)
        else:
            self.stopping = True


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
