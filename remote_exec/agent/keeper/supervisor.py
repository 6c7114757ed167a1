"""The agent as the keeper's child: started, told ready, restarted after an accident.

The agent's exit code says what it wants: 0 is an explicit shutdown or an idle exit (so is a
death by SIGTERM or SIGINT: everything ends), :data:`~.protocol.HANDOVER_EXIT` a handover (jobs
stay; the next agent comes with a ``start``), anything else an accident (restarted at once, then
with a back-off if it keeps dying young, and not at all after :data:`MAX_QUICK_DEATHS`).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import time
from collections.abc import Callable
from typing import Any

from ..statefile import open_own_file
from .protocol import HANDOVER_EXIT

__all__ = ["MAX_QUICK_DEATHS", "QUICK_DEATH", "Supervisor"]

QUICK_DEATH = 2.0  # an agent dying this soon after its start counts towards the back-off
MAX_QUICK_DEATHS = 5  # then stop restarting until someone asks (``start``)

Answer = Callable[[Any, dict[str, Any]], None]
"""Sends one answer on a connection (``start``'s, once the agent is ready or failed)."""


class Supervisor:
    """The agent process of one keeper.

    :param ready_fd: the first ``ensure``'s pipe: told once the first agent is ready.
    :ivar pid: the agent's (0: none runs). :ivar generation: one more per agent spawned (a
        connection serves only its own, see :mod:`.auth`). :ivar stopping: an explicit shutdown:
        no restart. :ivar restart_at: when a crashed agent is started again (None: not due).
    """

    def __init__(
        self, state_dir: str, argv: list[str], ready_fd: int | None, sel: selectors.BaseSelector, answer: Answer
    ) -> None:
        self.state_dir = state_dir
        self.argv = argv
        self.ready_fd = ready_fd
        self.pid = 0
        self.generation = 0
        self.started = 0.0
        self.ready = False
        self.ready_pipe: int | None = None
        self.quick_deaths = 0
        self.stopping = False
        self.terminating = False  # the keeper was told to end (SIGTERM): no successor, whoever asks
        self.restart_at: float | None = None
        self.waiting: list[Any] = []  # ``start`` requests answered once the agent is ready
        self._sel = sel
        self._answer = answer

    def spawn(self) -> None:
        """Start the agent with its output in ``agent.log``; ``start`` waiters are answered once
        it writes "ready" on its ready pipe, or fails to."""
        read_fd, write_fd = os.pipe()
        os.set_inheritable(write_fd, True)
        try:  # a FIFO a job put there blocked this open, and the keeper with it, for good
            log = open_own_file(os.path.join(self.state_dir, "agent.log"), os.O_WRONLY | os.O_APPEND)
        except (OSError, ValueError):
            log = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        try:
            argv = [*self.argv, "--ready-fd", str(write_fd)]
            actions = [
                (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, log, 1),
                (os.POSIX_SPAWN_DUP2, log, 2),
            ]
            self.pid = os.posix_spawnp(argv[0], argv, dict(os.environ), file_actions=actions)
        except OSError as exc:
            os.close(read_fd)
            os.write(log, f"keeper: cannot start the agent {self.argv}: {exc}\n".encode())
            self.pid = 0
            self._answer_start({"ok": False, "error": f"cannot start the agent: {exc}"})
            return
        finally:
            os.close(write_fd)
            os.close(log)
        self.generation += 1
        self.started = time.monotonic()
        self.ready = False
        self.ready_pipe = read_fd
        self._sel.register(read_fd, selectors.EVENT_READ, "ready")

    def leaving(self) -> None:
        """The agent stops serving (a handover, a shutdown): from now on a ``start`` waits for
        its exit and then a new agent, instead of being told "ready" by one whose sockets are
        going away (the ``ensure`` that asked then found no socket to connect to)."""
        self.ready = False

    def start(self, conn: Any, argv: object) -> None:
        """A ``start`` request: answered now if an agent is ready, else once the one it starts
        is (or, while one is leaving, the one started after its exit)."""
        if not self.pid and isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv):
            self.argv = argv  # not while one runs: its restart after a crash is its own argv
        if self.pid and self.ready:
            self._answer(conn, {"ok": True, "agent_pid": self.pid, "already": True})
            return
        self.waiting.append(conn)
        self.stopping = False
        self.quick_deaths = 0
        if not self.pid:
            self.restart_at = None
            self.spawn()

    def on_ready_pipe(self) -> None:
        """The agent wrote on its ready pipe, or closed it (it died first)."""
        assert self.ready_pipe is not None
        try:
            data = os.read(self.ready_pipe, 64)
        except OSError:
            data = b""
        if data.startswith(b"ready"):
            self.ready = True
            self._answer_start({"ok": True, "agent_pid": self.pid})
        self._sel.unregister(self.ready_pipe)
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
        waiting, self.waiting = self.waiting, []
        for conn in waiting:
            self._answer(conn, answer)

    def exited(self, how: dict[str, Any]) -> None:
        """The agent was reaped: decide between an end, a wait for ``start`` and a restart."""
        self.pid = 0
        if self.ready_pipe is not None:
            self.on_ready_pipe()  # its EOF: answers the waiters with the failure
        code = how.get("code")
        if self.waiting and not self.terminating:
            # ``start`` came while it was leaving (a handover, an idle exit): whatever it left
            # for, its successor is wanted now.
            self.stopping = False
            self.restart_at = None
            self.quick_deaths = 0
            self.spawn()
        elif code in (0, -signal.SIGTERM, -signal.SIGINT):
            # An explicit shutdown (or idle exit): everything ends, nothing is restarted. A
            # SIGTERM that arrived before the agent installed its handler killed it outright:
            # still a request to stop, not a crash to recover from.
            self.stopping = True
        elif code == HANDOVER_EXIT:
            self.quick_deaths = 0  # someone will ``start`` the next agent
        else:
            young = time.monotonic() - self.started < QUICK_DEATH
            self.quick_deaths = self.quick_deaths + 1 if young else 0
            if self.quick_deaths < MAX_QUICK_DEATHS:
                delay = 0.0 if self.quick_deaths <= 1 else min(0.1 * 2**self.quick_deaths, 5.0)
                self.restart_at = time.monotonic() + delay

    def restart_if_due(self, now: float) -> None:
        if self.restart_at is not None and now >= self.restart_at and not self.stopping:
            self.restart_at = None
            self.spawn()

    def terminate(self) -> None:
        """A SIGTERM for the keeper: passed on to the agent (which ends its jobs and exits 0),
        or, with no agent, the shutdown itself."""
        self.terminating = True
        if self.pid:
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGTERM)
        else:
            self.stopping = True
