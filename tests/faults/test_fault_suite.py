"""The fault suite (#14): 200 streaming jobs (20 of them in a pseudo-terminal, #16), the agent
SIGKILLed 20 times at seeded moments (or handed over to other versions), on ``local://``,
``jail://`` (real bubblewrap) and ``docker://`` (a real dockerd, the injected PyInstaller
bundle). Every byte of every stream arrives exactly once (sha256), every exit code is right, no
job is lost, no process leaks.

The seed is random per run and printed (in the summary and in any failure);
``REMOTE_EXEC_FAULT_SEED=N`` replays one.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from remote_exec.sandboxes.jailbox import JailBox, JailConfig, exec_argv

from ..conftest import stop_agent
from ..sandboxes.backend_docker import docker_or_skip, image_or_skip
from ..sandboxes.backend_jail import require_jail
from .conftest import SUMMARIES
from .suite import RunIn, Target, run_suite

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

UPGRADES = 4  # handovers to another agent version, shuffled among the 20 kills


def _runner(prefix: list[str], env: dict[str, str] | None = None) -> RunIn:
    async def run_in(argv: list[str]) -> tuple[int, bytes, bytes]:
        done = await anyio.run_process([*prefix, *argv], env=env, check=False)
        return done.returncode, done.stdout, done.stderr

    return run_in


@pytest.fixture(params=["local", "jail", "docker"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    if request.param == "local":
        state = tmp_path / "state"
        yield Target(
            "local", f"local://?dir={state}", _runner([]), lambda args: str(state) in args or "rxfault" in args
        )
        stop_agent(state)  # the keeper and the agent: ended, and waited for
    elif request.param == "jail":
        work = tmp_path / "work"
        work.mkdir()
        require_jail(work)
        box = JailBox.start(JailConfig(work))  # from pytest's main thread: --die-with-parent follows it
        try:
            yield Target("jail", box.url, _exec_in_box(box.pid), lambda args: True)
        finally:
            box.kill()
    else:
        d = docker_or_skip()
        name = d.run("rx-faults", image_or_skip(d, "usr"), "-v", "/usr:/usr:ro")
        try:
            yield Target(
                "docker",
                f"docker://{name}",
                _runner(["docker", "exec", name], {**os.environ, "DOCKER_HOST": d.host}),
                lambda args: True,
            )
        finally:
            d.docker("rm", "-f", name, check=False)


def _exec_in_box(pid: int) -> RunIn:
    async def run_in(argv: list[str]) -> tuple[int, bytes, bytes]:
        return await _runner([])(exec_argv(pid, argv))

    return run_in


def _seed() -> int:
    return int(os.environ.get("REMOTE_EXEC_FAULT_SEED") or random.SystemRandom().randrange(1 << 32))


async def test_fault_suite(target: Target) -> None:
    seed = _seed()
    print(f"fault suite seed={seed} ({target.name}); replay with REMOTE_EXEC_FAULT_SEED={seed}")
    outcome = await run_suite(target, seed, kills=20, upgrades=UPGRADES, log=print)
    SUMMARIES.append(outcome.summary(target.name, seed))
    assert len(outcome.versions) == UPGRADES  # each handover went to another version
