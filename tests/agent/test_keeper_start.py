"""The keeper's ``start`` while its agent is leaving (a handover, an idle exit): the caller is
answered by the successor once it is ready, never "already ready" by the agent whose sockets
are going away (CI: ``ensure`` was told ready, found no socket, and failed)."""

from __future__ import annotations

import os
import selectors
import signal
import sys
from pathlib import Path
from typing import Any

from remote_exec.agent.keeper.protocol import HANDOVER_EXIT
from remote_exec.agent.keeper.supervisor import Supervisor

# A stand-in for the agent's process: says "ready" on the fd it is given, then waits for a signal.
AGENT = "import os, signal, sys; os.write(int(sys.argv[sys.argv.index('--ready-fd') + 1]), b'ready\\n'); signal.pause()"


def _ready(sup: Supervisor, sel: selectors.BaseSelector) -> None:
    """Wait (on the selector, as the keeper does) for the agent's ready line."""
    while sup.ready_pipe is not None:
        for key, _ in sel.select(timeout=60):
            if key.data == "ready":
                sup.on_ready_pipe()


def _reap(pid: int) -> dict[str, Any]:
    _, status = os.waitpid(pid, 0)
    return {"code": os.waitstatus_to_exitcode(status)}


def test_a_start_while_the_agent_leaves_is_answered_by_its_successor(tmp_path: Path) -> None:
    answers: list[tuple[str, dict[str, Any]]] = []
    sel = selectors.DefaultSelector()
    sup = Supervisor(os.fspath(tmp_path), [sys.executable, "-c", AGENT], None, sel, lambda c, a: answers.append((c, a)))
    try:
        sup.spawn()
        _ready(sup, sel)
        first = sup.pid
        sup.start("early", None)
        assert answers == [("early", {"ok": True, "agent_pid": first, "already": True})]
        sup.leaving()  # it tells the keeper, then closes its sockets
        sup.start("during", None)
        assert answers[1:] == []  # not "already": that agent is going away
        os.kill(first, signal.SIGTERM)
        sup.exited({**_reap(first), "code": HANDOVER_EXIT})
        assert sup.pid not in (0, first)  # its successor, for the one who asked
        _ready(sup, sel)
        assert answers[1:] == [("during", {"ok": True, "agent_pid": sup.pid})]
    finally:
        if sup.pid:
            os.kill(sup.pid, signal.SIGKILL)
            _reap(sup.pid)
        sel.close()


def test_a_keeper_told_to_end_starts_no_successor(tmp_path: Path) -> None:
    answers: list[tuple[str, dict[str, Any]]] = []
    sel = selectors.DefaultSelector()
    sup = Supervisor(os.fspath(tmp_path), [sys.executable, "-c", AGENT], None, sel, lambda c, a: answers.append((c, a)))
    sup.spawn()
    _ready(sup, sel)
    first = sup.pid
    sup.leaving()
    sup.start("during", None)
    sup.terminate()  # SIGTERM to the keeper: passed on to the agent
    sup.exited(_reap(first))
    assert (sup.pid, sup.stopping) == (0, True) and answers == []
    sel.close()
