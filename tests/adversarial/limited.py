"""A test-made cgroup with a pids and a memory limit, and an agent started inside it: fork bombs
and memory floods run only there (this machine is shared), with the limit set before anything
joins. Removed, with everything in it killed, at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

import remote_exec as rx

from ..client.test_durable import procs_running, wait_until
from ..conftest import wait_exit
from .agentproc import AGENT, stop_agent

__all__ = ["ESCAPED", "LimitedCgroup", "agent_in", "limited_cgroup", "live", "orphan_left_after", "starts"]

MOUNT = Path("/sys/fs/cgroup")


def _own(controller: str) -> Path | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        if controller in ctrls.split(","):
            return MOUNT / controller / path.lstrip("/")
    return None


@dataclass
class LimitedCgroup:
    """One cgroup per v1 controller (``pids``, ``memory``), below this process's own."""

    dirs: dict[str, Path]

    def procs(self) -> set[int]:
        """Every process in the cgroups and below (the agent's jobs' own cgroups included)."""
        found: set[int] = set()
        for d in self.dirs.values():
            for procs in d.rglob("cgroup.procs"):
                with contextlib.suppress(OSError):
                    found.update(int(p) for p in procs.read_text().split())
        return found

    def pids_current(self) -> int:
        return int((self.dirs["pids"] / "pids.current").read_text())

    def set_pids_max(self, n: int) -> None:
        (self.dirs["pids"] / "pids.max").write_text(str(n))


@contextlib.contextmanager
def limited_cgroup(pids_max: int, memory_max: int) -> Iterator[LimitedCgroup]:
    """The cgroups, limits set before anyone joins; skip where they cannot be made."""
    name = f"rxtest-{uuid.uuid4().hex[:8]}"
    dirs: dict[str, Path] = {}
    try:
        for ctrl in ("pids", "memory"):
            own = _own(ctrl)
            if own is None or os.geteuid() != 0:
                pytest.skip("needs root and the v1 pids and memory controllers")
            d = own / name
            try:
                d.mkdir()
            except OSError as exc:
                pytest.skip(f"cannot make a cgroup here: {exc}")
            dirs[ctrl] = d
        (dirs["pids"] / "pids.max").write_text(str(pids_max))
        (dirs["memory"] / "memory.limit_in_bytes").write_text(str(memory_max))
        with contextlib.suppress(OSError):  # no swap accounting on some kernels
            (dirs["memory"] / "memory.memsw.limit_in_bytes").write_text(str(memory_max))
        yield LimitedCgroup(dirs)
    finally:
        group = LimitedCgroup(dirs)
        for _ in range(200):  # whatever is left (a failed test): SIGKILL until empty
            left = group.procs()
            if not left:
                break
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            for pid in left:
                wait_exit(pid, 1)
        for d in dirs.values():
            for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError):
                    sub.rmdir()
            with contextlib.suppress(OSError):
                d.rmdir()


@contextlib.contextmanager
def agent_in(group: LimitedCgroup, state_dir: Path, *args: str) -> Iterator[int]:
    """An agent (and its keeper) started inside ``group``; its pid. SIGTERMed at the end."""
    join = " && ".join(f"echo $$ > {d / 'cgroup.procs'}" for d in group.dirs.values())
    argv = ["sh", "-c", f'{join} && exec "$@"', "sh", *AGENT, "ensure", "--dir", str(state_dir), *args]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
    pid = int(json.loads(out)["result"]["pid"])
    try:
        yield pid
    finally:
        stop_agent(pid)


def live(pid: int, start: int) -> bool:
    """Whether process ``pid`` with that ``/proc`` start time is alive (not a zombie)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != b"Z" and int(fields[19]) == start


def starts(pids: list[int]) -> dict[int, int]:
    """``{pid: /proc start time}`` of those of ``pids`` still alive."""
    out = {}
    for pid in pids:
        try:
            out[pid] = int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[19])
        except OSError:
            continue
    return out


# A grandchild that clears its environment, leaves the session and is orphaned at once (its
# parent exits): no marker, no session, no parent links it to the job.
ESCAPED = "env -i setsid sh -c '(sleep {t} &); exit' & echo ready; while :; do sleep 0.05; done"


async def orphan_left_after(sb: rx.AsyncSandbox, t: int, how: str) -> list[int]:
    """Run :data:`ESCAPED` (its orphan ``sleep t``), end the job by ``how`` (``kill`` or a 3 s
    ``timeout``), and return the orphan's pids still alive once the end is told."""
    proc = sb.exec_remote(["sh", "-c", ESCAPED.format(t=t)], kill_grace=0.5, timeout=3.0 if how == "timeout" else None)
    assert await anext(aiter(proc)) == rx.StdoutChunk("ready\n")
    escaped = starts(await wait_until("the orphan is up", lambda: procs_running("sleep", str(t))))
    with anyio.fail_after(60):
        if how == "kill":
            await proc.kill()
        else:
            with pytest.raises(rx.ExecTimeoutError):
                await proc.wait()
    return [pid for pid, start in escaped.items() if live(pid, start)]
