"""The fast tier's node: the Docker CLI against the test engine, from asyncio.

Every container operation is a ``docker`` subprocess (``run``, ``inspect``, ``rm``, ``exec``,
``events``), so the server needs nothing but the CLI and ``DOCKER_HOST``, like the rest of the
suite. One exception: killing an exec whose client went away. Killing ``docker exec`` itself
leaves the command running in the container, where containerd's CRI kills it (SIGKILL to the
exec's process). The CLI cannot name that process, so each exec carries a marker in its
environment (:data:`EXEC_MARKER`) and :func:`kill_exec` finds it in ``/proc`` (the engine runs
on this host; we are root): the marked process whose parent is the container's shim, as the
exec's own process is, and not its children or a daemon it started (they live on, as in a
cluster).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass

from .objects import JSON

__all__ = ["EXEC_MARKER", "Docker", "Done", "kill_exec", "reap"]

EXEC_MARKER = "RX_K8SAPI_EXEC"
"""The environment variable each exec's process carries (its value: the exec's id)."""


@dataclass(frozen=True)
class Done:
    """A finished ``docker`` command."""

    returncode: int
    stdout: bytes
    stderr: bytes

    def error(self) -> str:
        return self.stderr.decode(errors="replace").strip()


class Docker:
    """The ``docker`` CLI with ``DOCKER_HOST`` set."""

    def __init__(self, host: str) -> None:
        self.env = {**os.environ, "DOCKER_HOST": host}

    async def run(self, *args: str) -> Done:
        """``docker ARGS`` to completion (no stdin)."""
        proc = await asyncio.create_subprocess_exec(
            "docker",
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
        )
        out, err = await proc.communicate()
        assert proc.returncode is not None
        return Done(proc.returncode, out, err)

    async def inspect(self, names: Sequence[str]) -> dict[str, JSON]:
        """``docker inspect`` of the containers that exist among ``names``, by name."""
        if not names:
            return {}
        done = await self.run("inspect", "--type", "container", *names)
        try:
            found = json.loads(done.stdout or b"[]")
        except ValueError:
            return {}
        return {str(c.get("Name", "")).lstrip("/"): c for c in found if isinstance(c, dict)}

    async def remove(self, names: Sequence[str]) -> None:
        """``docker rm -f -v`` (volumes too: a pod's emptyDirs die with it); missing ones are fine."""
        if names:
            await self.run("rm", "-f", "-v", *names)

    async def events(self, since: float, label: str) -> asyncio.subprocess.Process:
        """``docker events`` of containers labelled ``label``, one JSON object a line, from ``since``
        (a Unix time, so the events between the server's start and the stream's are not lost)."""
        return await asyncio.create_subprocess_exec(
            "docker",
            "events",
            "--since",
            f"{since:.6f}",
            "--filter",
            "type=container",
            "--filter",
            f"label={label}",
            "--format",
            "{{json .}}",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            env=self.env,
        )

    async def exec(
        self, container: str, argv: Sequence[str], marker: str, stdin: bool, stdout: bool, stderr: bool
    ) -> asyncio.subprocess.Process:
        """``docker exec [-i] -e MARKER=marker CONTAINER ARGV...`` with pipes for the streams asked for."""
        pipe, null = asyncio.subprocess.PIPE, asyncio.subprocess.DEVNULL
        return await asyncio.create_subprocess_exec(
            "docker",
            "exec",
            *(["-i"] if stdin else []),
            "-e",
            f"{EXEC_MARKER}={marker}",
            container,
            *argv,
            stdin=pipe if stdin else null,
            stdout=pipe if stdout else null,
            stderr=pipe if stderr else null,
            env=self.env,
            limit=2**16,
        )


async def reap(proc: asyncio.subprocess.Process) -> int:
    """Wait for a child whose output pipes may not have been read to the end: read them to
    EOF first. A reader stopped mid-stream leaves its pipe paused (full), so it never sees EOF,
    and asyncio's ``wait()`` waits for every pipe to close: it would wait forever."""
    if proc.stdin is not None:
        proc.stdin.close()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            while await stream.read(2**16):
                pass
    return await proc.wait()


def _ppid(pid: str) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return int(stat[stat.rindex(b")") + 2 :].split()[1])  # the field after the state


def _exec_pids(shim: int, marker: str) -> list[int]:
    """The processes whose parent is ``shim`` and whose environment holds the marker."""
    needle = f"\0{EXEC_MARKER}={marker}\0".encode()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if _ppid(pid) != shim:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in b"\0" + f.read() + b"\0":
                    found.append(int(pid))
        except (OSError, ValueError, IndexError):  # gone meanwhile, or not ours to read
            continue
    return found


async def kill_exec(docker: Docker, container: str, marker: str) -> list[int]:
    """SIGKILL the process of exec ``marker`` in ``container`` (as containerd does when the
    client goes away); the pids killed. The container's shim is its PID 1's parent."""
    done = await docker.run("inspect", "--type", "container", "--format", "{{.State.Pid}}", container)
    if done.returncode != 0 or not done.stdout.strip().isdigit() or int(done.stdout) == 0:
        return []
    try:
        shim = await asyncio.to_thread(_ppid, done.stdout.decode().strip())
    except (OSError, ValueError, IndexError):
        return []
    pids = await asyncio.to_thread(_exec_pids, shim, marker)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids
