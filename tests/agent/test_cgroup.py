"""The job cgroup's kill, each way it can go: v2's ``cgroup.kill``, the v1 freezer (freeze,
SIGKILL, thaw: nothing forks in between), and plain SIGKILLs to each member; and a parent made
and removed by :class:`CgroupHome`. Real cgroups (test-made, below this process's own, with a
pids limit set first) and real processes that keep forking and leaving their session."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from remote_exec.agent.jobs import cgroup
from remote_exec.agent.jobs.cgroup import CgroupHome, JobCgroup
from remote_exec.agent.jobs.spawn import trampoline
from remote_exec.sandboxes.jailcgroup import BoxCgroup
from remote_exec.sandboxes.jailcgroup import joined as jail_joined

pytestmark = pytest.mark.anyio

MOUNT = Path("/sys/fs/cgroup")
# Forks a new own-session sleeper every 10 ms, for ever (bounded by the pids limit).
SPAWNER = "while :; do setsid sleep 300 & sleep 0.01; done"


def _own(hierarchy: str) -> Path | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        num, ctrls, path = line.split(":", 2)
        if (hierarchy == "unified" and num == "0") or hierarchy in ctrls.split(","):
            mount = MOUNT / hierarchy
            if hierarchy == "unified" and (MOUNT / "cgroup.controllers").is_file():
                mount = MOUNT
            return mount / path.lstrip("/")
    return None


@contextlib.contextmanager
def job_cgroup(*hierarchies: str) -> Iterator[JobCgroup]:
    """A job cgroup in ``hierarchies`` (plus ``pids``, limited to 64, first), removed at the end."""
    name = f"rxtest-{uuid.uuid4().hex[:8]}"
    dirs: dict[str, str] = {}
    try:
        for h in ("pids", *hierarchies):
            own = _own(h)
            if own is None or os.geteuid() != 0 or not (own / "cgroup.procs").is_file():
                pytest.skip(f"needs root and the {h} cgroup hierarchy")
            (own / name).mkdir()
            dirs[h] = str(own / name)
            if h == "pids":
                (own / name / "pids.max").write_text("64")
        yield JobCgroup(dict(dirs))  # a test may narrow its copy
    finally:
        cg = JobCgroup(dirs)
        for _ in range(100):
            if not cg.members():
                break
            cg.kill()
        for d in dirs.values():
            with contextlib.suppress(OSError):
                os.rmdir(d)


@contextlib.contextmanager
def _started_in(cg: JobCgroup) -> Iterator[subprocess.Popen[bytes]]:
    """The spawner, in ``cg``; killed and reaped at the end, whatever the test found (an
    unreaped one would fail a later test with a ResourceWarning)."""
    join = " && ".join(f"echo $$ > {d}/cgroup.procs" for d in cg.dirs.values())
    proc = subprocess.Popen(["sh", "-c", f"{join} && exec sh -c '{SPAWNER}'"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(30)


async def _emptied(cg: JobCgroup, proc: subprocess.Popen[bytes]) -> bool:
    with anyio.fail_after(30):
        while len(cg.members()) < 10:  # noqa: ASYNC110  # a cgroup's membership has no change event here
            await anyio.sleep(0.02)
    with anyio.fail_after(30):
        while cg.members():
            await cg.kill_async()
            await anyio.sleep(0.02)
    proc.wait(10)
    return not cg.members()


@pytest.mark.parametrize("hierarchy", ["unified", "freezer"])
async def test_a_kill_through_the_cgroup_ends_a_forking_tree_in_one_pass(hierarchy: str) -> None:
    with job_cgroup(hierarchy) as cg:
        if hierarchy == "freezer":
            del cg.dirs["pids"]  # membership and kill through the freezer alone
        with _started_in(cg) as proc:
            with anyio.fail_after(30):
                while len(cg.members()) < 10:  # noqa: ASYNC110
                    await anyio.sleep(0.02)
            assert await cg.kill_async() is True  # cgroup.kill, or freeze + SIGKILL + thaw
            with anyio.fail_after(30):
                while cg.members():  # noqa: ASYNC110  # the killed leave as they die
                    await anyio.sleep(0.02)
            proc.wait(10)


async def test_plain_sigkills_end_a_forking_tree_when_repeated() -> None:
    with job_cgroup() as cg, _started_in(cg) as proc:  # pids only: no kill file, no freezer
        assert await _emptied(cg, proc)


def test_the_home_makes_and_removes_its_parent_and_a_dead_jobs_cgroup() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    state_id = f"rxtest{uuid.uuid4().hex[:8]}"
    home = CgroupHome.discover(state_id)
    if home is None:
        pytest.skip("no writable cgroup hierarchy here")
    cg = home.make(f"{state_id}-1")
    assert cg is not None and all(os.path.isdir(d) for d in cg.dirs.values())
    assert home.sweep(lambda job_id: False) >= 1  # empty and not running: a dead agent's
    assert not any(os.path.isdir(d) for d in cg.dirs.values())
    home.close()
    assert not any(os.path.isdir(p) for p in home.parents.values())


def test_a_dead_agents_empty_parent_goes_and_a_swept_one_comes_back() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    dead, live = f"rxtest{uuid.uuid4().hex[:8]}", f"rxtest{uuid.uuid4().hex[:8]}"
    first = CgroupHome.discover(dead)  # an agent that dies without closing its home
    if first is None:
        pytest.skip("no writable cgroup hierarchy here")
    home = CgroupHome.discover(live)  # the next agent's start sweeps the dead one's
    assert home is not None and not any(os.path.isdir(p) for p in first.parents.values())
    CgroupHome.discover(dead).close()  # type: ignore[union-attr]  # a third start sweeps the live one's too (empty)
    cg = home.make(f"{live}-1")  # made again for its next job
    assert cg is not None and all(os.path.isdir(d) for d in cg.dirs.values())
    assert cg.remove()
    home.close()


@pytest.mark.parametrize("hierarchy", ["pids", "unified"])
def test_a_dead_agents_job_cgroups_go_once_stale_and_never_with_a_member(
    hierarchy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent killed with jobs, its state dir then deleted: nobody re-adopts its jobs, and its
    jobs' cgroups and parent stayed for good. The next agent's start (:func:`cgroup._sweep_parents`,
    which :meth:`CgroupHome.discover` runs) removes them once empty and older than a start can
    be (:data:`cgroup.STALE_CGROUP`); one with a member never. In a base of the test's own: with
    every cgroup counted old, a sweep of the shared one would take live starts' from other tests."""
    own = _own(hierarchy)
    if own is None or os.geteuid() != 0 or not (own / "cgroup.procs").is_file():
        pytest.skip(f"needs root and the {hierarchy} cgroup hierarchy")
    base = own / f"rxtest-{uuid.uuid4().hex[:8]}"
    parent = base / f"remote-exec-{uuid.uuid4().hex[:8]}"  # what the dead agent left
    ended, running = parent / "a1b2c3d4-1", parent / "a1b2c3d4-2"
    proc = None
    try:
        for d in (base, parent, ended, running):
            d.mkdir()
        proc = subprocess.Popen(["sh", "-c", f"echo $$ > {running}/cgroup.procs && exec sleep 300"])
        deadline = time.monotonic() + 30
        while not (running / "cgroup.procs").read_text().split():
            assert proc.poll() is None and time.monotonic() < deadline, "the member never joined"
            time.sleep(0.01)
        cgroup._sweep_parents(str(base))
        assert ended.is_dir() and running.is_dir()  # just made: maybe a live start's
        monkeypatch.setattr(cgroup, "STALE_CGROUP", -1.0)  # every one is old enough now
        cgroup._sweep_parents(str(base))
        assert not ended.exists()
        assert running.is_dir()  # a member: left alone, and so is its parent
    finally:
        if proc is not None:
            proc.kill()
            proc.wait(30)
        deadline = time.monotonic() + 30
        while running.is_dir() and (running / "cgroup.procs").read_text().split() and time.monotonic() < deadline:
            time.sleep(0.01)  # the killed member leaves its cgroup
        cgroup._sweep_parents(str(base))
        gone = not parent.exists()
        for d in (running, ended, parent, base):
            with contextlib.suppress(OSError):
                d.rmdir()
    assert gone, "the emptied parent stayed"


@contextlib.contextmanager
def jail_box() -> Iterator[BoxCgroup]:
    """A ``jail://`` box's cgroup (as the host side makes it), removed at the end."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    box = BoxCgroup.make(os.getuid())
    if box is None:
        pytest.skip("no writable cgroup hierarchy here")
    try:
        yield box
    finally:
        assert box.remove()


def test_an_agents_sweep_leaves_a_jail_box_being_set_up_alone() -> None:
    """A ``jail://`` box's cgroup is made beside the agents' parents and is empty until bwrap
    joins it: a local agent starting in that moment swept it, and the jail failed to start."""
    with jail_box() as box:
        home = CgroupHome.discover(f"rxtest{uuid.uuid4().hex[:8]}")  # sweeps the empty parents
        assert home is not None
        home.close()
        assert all(os.path.isdir(d) for d in box.dirs.values()), box.dirs


def _cgroups_in(text: str) -> dict[str, str]:
    """A ``/proc/PID/cgroup``'s path per hierarchy (co-mounted controllers each by name)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        num, ctrls, path = line.split(":", 2)
        for name in ctrls.split(",") if ctrls else ["unified"] if num == "0" else []:
            found[name] = path
    return found


def test_a_leader_joins_v1_by_moving_itself_not_its_thread_group() -> None:
    """The leader writes ``0`` to v1's ``tasks`` (no global lock: a job started after a pause
    waited 14-25 ms for it through ``cgroup.procs``) and lands in every job cgroup; on a hybrid
    host the v2 tree is left out (it has only ``cgroup.procs``), the v1 freezer kills."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    home = CgroupHome.discover(f"rxtest{uuid.uuid4().hex[:8]}")
    if home is None:
        pytest.skip("no writable cgroup hierarchy here")
    cg = home.make("job-1")
    assert cg is not None
    try:
        for name, path in zip(cg.dirs, cg.join_files(), strict=True):
            assert os.path.basename(path) == ("cgroup.procs" if name == "unified" else "tasks")
        if {"pids", "freezer", "cpuacct"} <= cg.dirs.keys():
            # v2 and v1's memory left out (a job's memory cgroup lingered, dying, after its rmdir)
            assert not {"unified", "memory"} & cg.dirs.keys()
        proc = subprocess.Popen(trampoline(["sleep", "30"], cg.join_files()))
        try:
            # The trampoline execs sleep only after its last join: wait for that, not for the first.
            deadline = time.monotonic() + 30
            while Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")[0] != b"sleep":
                assert time.monotonic() < deadline, "the trampoline never exec'd its command"
                time.sleep(0.01)
            joined_to = _cgroups_in(Path(f"/proc/{proc.pid}/cgroup").read_text())
            for name, d in cg.dirs.items():
                assert d.endswith(joined_to[name]), (name, d, joined_to)
        finally:
            proc.kill()
            proc.wait()
    finally:
        cg.remove()
        home.close()


def test_a_jail_box_is_joined_by_moving_oneself() -> None:
    with jail_box() as box:
        for hier, path in zip(box.dirs, box.procs(), strict=True):
            assert os.path.basename(path) == ("cgroup.procs" if hier == "unified" else "tasks")
        out = subprocess.run(jail_joined(box.procs(), ["cat", "/proc/self/cgroup"]), capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        joined_to = _cgroups_in(out.stdout)
        for hier, d in box.dirs.items():
            assert d.endswith(joined_to[hier]), (hier, d, out.stdout)
