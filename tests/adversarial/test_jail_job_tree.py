"""Issue #21 point 5 in ``jail://``: the box gets a delegated cgroup, so the agent inside makes a
cgroup per job and an env-cleared ``setsid`` orphan ends with its job.

Without it the box had no cgroupfs and the agent's attribution alone could not name a child that
cleared its environment, left the session and was orphaned before the agent's first look.
Real bubblewrap as root; absences read from the host's process table by pid and start time.
"""

from __future__ import annotations

import os

import pytest

import remote_exec as rx
from remote_exec.sandboxes.jail import JailTransport

from ..sandboxes.backend_jail import require_jail
from .conftest import Adversary
from .limited import orphan_left_after

pytestmark = [pytest.mark.anyio, pytest.mark.backend]  # bubblewrap

AREA = "job tree"


@pytest.fixture(scope="module", autouse=True)
def _needs_rooted_jail(tmp_path_factory: pytest.TempPathFactory) -> None:
    require_jail(tmp_path_factory.mktemp("jail-probe"))
    if os.geteuid() != 0 or not os.access("/sys/fs/cgroup/pids", os.W_OK):
        pytest.skip("a box's cgroup is delegated only by a root host side with a writable cgroupfs")


def _any_dir(paths: list[str]) -> bool:
    return any(os.path.isdir(p) for p in paths)  # cgroupfs: instant


@pytest.mark.parametrize("how", ["kill", "timeout"])
async def test_an_env_cleared_orphan_in_a_jail_ends_with_its_job(adversary: Adversary, how: str) -> None:
    t = 47150 if how == "kill" else 47151
    async with rx.open_sandbox("jail://") as sb:
        # Read while the box still runs: its end would kill the orphan anyway.
        left = await orphan_left_after(sb, t, how)
    adversary.tried(AREA, f"env-cleared setsid orphan in jail:// outlives {how}", refused=not left)
    assert not left


async def test_the_boxs_cgroup_is_delegated_and_removed_on_close(adversary: Adversary) -> None:
    async with rx.open_sandbox("jail://") as sb:
        transport = sb.transport
        assert isinstance(transport, JailTransport) and transport.box is not None
        assert transport.box.cgroup is not None
        dirs = list(transport.box.cgroup.dirs.values())
        assert dirs and all(os.stat(d).st_uid == 65533 for d in dirs)
        result = await sb.exec_remote(["cat", "/proc/self/cgroup"]).wait()
        # The job's cgroup is the agent's per-job one, seen from the box's cgroup namespace.
        assert "pids:/remote-exec-" in result.stdout, result.stdout
        await sb.exec_remote(["sleep", "300"]).started()  # a member left at close
    gone = not _any_dir(dirs)
    adversary.tried(AREA, "jail:// box cgroup dirs left after close", refused=gone)
    assert gone
