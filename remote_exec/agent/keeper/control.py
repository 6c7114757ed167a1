"""The keeper's control socket: connections, their request lines, and the ops they ask.

Newline-delimited JSON on ``keeper.sock`` (0600, the peer's uid checked), one answer per
request; fds travel with ``SCM_RIGHTS``. What the keeper holds goes only to the agent it spawned
(:data:`~.auth.AGENT_OPS`, see :mod:`.auth`). Ops are only ever added (an upgrade replaces the
agent, not the keeper): ``hello``, ``start``, ``exit``, ``exits``, ``cpu``, ``hold``, ``fd``,
``drop``, and since protocol 2 ``lead`` and ``leads``.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import socket
import sys
import time
from typing import Any

from .auth import AGENT_OPS, Leaders, peer_of
from .protocol import KEEPER_PROTOCOL, MAX_LINE
from .reaper import Reaper
from .supervisor import Supervisor

__all__ = ["Conn", "Control", "send"]


class Conn:
    """One client connection: its partial line, the fds that came with it, whose it is."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.fds: list[int] = []
        self.agent_gen = -1  # the agent generation that made this connection (-1: not an agent)
        self.told_refused = False


def send(conn: Conn, answer: dict[str, Any], fds: list[int] | None = None) -> None:
    """One answer line (with ``fds``); a client that does not read it within 5 s loses it."""
    data = json.dumps(answer).encode() + b"\n"
    with contextlib.suppress(OSError):
        conn.sock.setblocking(True)
        conn.sock.settimeout(5.0)
        if fds:
            socket.send_fds(conn.sock, [data], fds)
        else:
            conn.sock.sendall(data)


class Control:
    """Serves the control socket from the keeper's select loop.

    :ivar held: key (a job or run id) -> a stdin write end the keeper keeps open for it.
    """

    def __init__(self, sel: selectors.BaseSelector, agent: Supervisor, reaper: Reaper) -> None:
        self._sel = sel
        self._agent = agent
        self._reaper = reaper
        self.leaders = Leaders()  # the job leaders our agents started (see .auth)
        self.held: dict[str, int] = {}
        self.started_at = time.time()

    # -- connections -------------------------------------------------------------------------

    def accept(self, listener: socket.socket) -> None:
        try:
            sock, _ = listener.accept()
        except OSError:
            return
        pid, uid = peer_of(sock)
        if uid not in (os.geteuid(), 0):
            sock.close()  # another user's process: the socket is 0600, so this is paranoia
            return
        sock.setblocking(False)
        conn = Conn(sock)
        if self._agent.pid and pid == self._agent.pid:
            conn.agent_gen = self._agent.generation  # our unreaped child: its pid cannot be a recycled one
        self._sel.register(sock, selectors.EVENT_READ, conn)

    def readable(self, conn: Conn) -> None:
        """Read what came on ``conn`` and answer each whole line."""
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

    def _drop(self, conn: Conn) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn.sock)
        for fd in conn.fds:
            os.close(fd)
        if conn in self._agent.waiting:
            self._agent.waiting.remove(conn)
        conn.sock.close()

    # -- ops ---------------------------------------------------------------------------------

    def handle(self, conn: Conn, req: dict[str, Any], fds: list[int]) -> None:
        op = req.get("op")
        if op in AGENT_OPS and not self._from_agent(conn):
            self._refuse(conn, str(op))
        elif op == "leads":
            send(conn, {"leads": self.leaders.answer()})
        elif op == "lead":
            why = self.leaders.add(str(req.get("key")), req.get("pid"), self._agent.pid)
            send(conn, {"ok": why is None} if why is None else {"ok": False, "error": why})
        elif op == "hello":
            send(conn, self._hello())
        elif op == "start":
            self._reaper.reap()  # an agent that died since the last SIGCHLD is not "ready"
            self._agent.start(conn, req.get("argv"))
        elif op == "leaving":
            self._agent.leaving()
            send(conn, {"ok": True})
        elif op == "exit":
            send(conn, {"exit": self._reaper.exit_of(req.get("pid"), req.get("start"))})
        elif op == "cpu":
            self._reaper.reap()
            send(conn, {"cpu": self._reaper.orphan_cpu.answer(req.get("keys"))})
        elif op == "exits":
            self._reaper.reap()
            send(conn, {"exits": self._reaper.exits})
        elif op == "hold":
            self._hold(str(req.get("key")), fds)
            send(conn, {"ok": True})
        elif op == "fd":
            fd = self.held.get(str(req.get("key")))
            send(conn, {"ok": fd is not None}, [fd] if fd is not None else None)
        elif op == "drop":
            fd = self.held.pop(str(req.get("key")), None)
            if fd is not None:
                os.close(fd)
            self.leaders.forget(str(req.get("key")))
            send(conn, {"ok": True})
        else:
            send(conn, {"error": f"unknown op {op!r}", "keeper": KEEPER_PROTOCOL})
        for fd in fds:  # any the op did not keep
            os.close(fd)

    def _hold(self, key: str, fds: list[int]) -> None:
        if fds:
            old = self.held.pop(key, None)
            if old is not None:
                os.close(old)
            self.held[key] = fds.pop(0)

    def _from_agent(self, conn: Conn) -> bool:
        """The connection was made by the agent that runs now (its generation, still unreaped)."""
        return bool(self._agent.pid) and conn.agent_gen == self._agent.generation

    def _refuse(self, conn: Conn, op: str) -> None:
        if not conn.told_refused:  # one line per connection: a loop of refusals cannot fill the log
            conn.told_refused = True
            pid, _ = peer_of(conn.sock)
            print(f"keeper: refused {op!r} from pid {pid}: not the agent", file=sys.stderr, flush=True)
        send(conn, {"error": f"{op!r} is only for the agent", "refused": True})

    def _hello(self) -> dict[str, Any]:
        return {
            "keeper": KEEPER_PROTOCOL,
            "pid": os.getpid(),
            "agent_pid": self._agent.pid,
            "agent_argv": self._agent.argv,
            "held": len(self.held),
            "started_at": self.started_at,
        }
