"""The keeper serves only its agent (issue #21, point 4).

A same-uid process (a job, or this test) connects to ``keeper.sock`` and asks for what the keeper
holds or keeps: a shell session's run key, a job's stdin, the exit and CPU records, the ledger of
job leaders; it tries to replace or drop what is held, and to change the agent's argv while one
runs. Every such op is refused, and nothing held changes. The attack from the issue (a run takes
its session's key from the keeper and forges its own end) ends with the run's true code. A real
``local://`` agent and its keeper throughout; the agent's own use of these ops is covered by
tests/client/test_durable*.py (restarts and handovers).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

import remote_exec as rx
from remote_exec.agent.keeperlink import keeper_call

from .conftest import Adversary

pytestmark = pytest.mark.anyio

THIEF = Path(__file__).with_name("keeper_thief.py")


def ask(state_dir: Path, req: dict[str, Any], fd: int | None = None) -> tuple[dict[str, Any], list[int]]:
    """One request to the keeper as a stranger; the answer and any fds it carried (closed here)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(os.fspath(state_dir / "keeper.sock"))
        line = json.dumps(req).encode() + b"\n"
        if fd is None:
            s.sendall(line)
        else:
            socket.send_fds(s, [line], [fd])
        data, fds = b"", []
        while b"\n" not in data:
            chunk, got, _, _ = socket.recv_fds(s, 1 << 20, 4)
            fds += got
            if not chunk:
                break
            data += chunk
    for got_fd in fds:
        os.close(got_fd)
    return json.loads(data.split(b"\n", 1)[0]), fds


def hello(state_dir: Path) -> dict[str, Any]:
    answer = keeper_call(state_dir, {"op": "hello"}, 30.0)
    assert answer is not None
    return answer


async def test_a_stranger_gets_nothing_from_the_keeper(fresh_agent_dir: Path, adversary: Adversary) -> None:
    d = fresh_agent_dir
    async with rx.open_sandbox(f"local://?dir={d}") as sb, await sb.shell() as sh:
        proc = await sb.exec_remote(["cat"], stdin_open=True).started()
        job = proc.job_id or ""
        before = await anyio.to_thread.run_sync(hello, d)
        assert before["held"] >= 2  # the job's stdin and the session's key
        r, w = os.pipe()
        try:
            cases: list[tuple[str, dict[str, Any], int | None]] = [
                ("fd: a shell session's run key", {"op": "fd", "key": f"{sh.session_id}.key"}, None),
                ("fd: a job's stdin", {"op": "fd", "key": job}, None),
                ("hold: replace a job's stdin", {"op": "hold", "key": job}, w),
                ("drop: a job's stdin", {"op": "drop", "key": job}, None),
                ("drop: a session's key", {"op": "drop", "key": f"{sh.session_id}.key"}, None),
                ("exit: a process's exit record", {"op": "exit", "pid": proc.pid, "start": 0}, None),
                ("exits: every exit record", {"op": "exits"}, None),
                ("cpu: the orphans' CPU ledger", {"op": "cpu", "keys": []}, None),
                ("leads: the ledger of job leaders", {"op": "leads"}, None),
                ("lead: plant a leader in the ledger", {"op": "lead", "key": "x-1", "pid": os.getpid()}, None),
                ("leaving: hold every start until the agent exits", {"op": "leaving"}, None),
            ]
            for case, req, fd in cases:
                answer, fds = await anyio.to_thread.run_sync(ask, d, req, fd)
                refused = answer.get("refused") is True and not fds and set(answer) == {"error", "refused"}
                adversary.tried("keeper", case, refused=refused)
                assert refused, (case, answer, fds)
        finally:
            os.close(r)
            os.close(w)
        answer, _ = await anyio.to_thread.run_sync(ask, d, {"op": "start", "argv": ["/bin/false"]})
        after = await anyio.to_thread.run_sync(hello, d)
        kept = after["agent_argv"] == before["agent_argv"] and answer.get("already") is True
        adversary.tried("keeper", "start: change the agent's argv while it runs", refused=kept)
        assert kept, (answer, after)
        assert after["held"] == before["held"]  # nothing held was dropped or replaced
        # What the keeper holds still works for the agent: the job's stdin, the session's runs.
        await proc.write_stdin(b"still mine\n")
        await proc.close_stdin()
        assert (await proc.wait()).stdout == "still mine\n"
        assert (await sh.run("echo ok; (exit 3)")).returncode == 3


async def test_a_run_cannot_take_its_key_from_the_keeper(fresh_agent_dir: Path, adversary: Adversary) -> None:
    """The issue's attack: a run asks the keeper for its session's key, derives its secret from
    the public id in the shell's own output and prints its end with code 0, then goes on."""
    d = fresh_agent_dir
    async with rx.open_sandbox(f"local://?dir={d}") as sb, await sb.shell() as sh:
        attack = f"{sys.executable} {THIEF} {d} {sh.session_id}; echo TRUE-END; (exit 7)"
        r = await sh.run(attack, timeout=60)
        after = await sh.run("echo next; (exit 3)", timeout=60)
    held = r.returncode == 7 and str(r.stdout).endswith("TRUE-END\n") and "KEY:refused" in str(r.stdout)
    adversary.tried("keeper", "a shell run takes its session key and forges its end", refused=held)
    assert held, r
    assert (after.returncode, after.stdout) == (3, "next\n")
