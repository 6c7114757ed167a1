"""The spawn of a job's leader from inside its v1 cgroups (:func:`remote_exec.agent.jobs.spawn.inside`):
the agent's thread moves itself in, spawns, and moves back. When it is taken (and when the
trampoline instead), where a real agent's job lands, and what keeps the agent's thread from
being caught by a job: frozen cgroups made ahead, a way back that fails, the job's own kill.
Real cgroups (test-made, below this process's own) and real agents; what could catch a thread
runs in a child process."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import remote_exec as rx
from remote_exec.agent.jobs import cgroup, spawn
from remote_exec.agent.jobs.cgroup import CgroupHome, JobCgroup

from .test_cgroup import _cgroups_in, _own, job_cgroup

pytestmark = pytest.mark.anyio


def test_the_way_back_is_known_only_where_this_thread_can_move_there() -> None:
    assert cgroup._way_back({"pids": "/nonexistent/cgroup"}) is None  # not ours to write
    assert cgroup._way_back({"unified": "/sys/fs/cgroup/unified"}) is None  # v2: threads share one cgroup


def test_where_v1_serves_no_memory_parent_is_made_and_an_earlier_ones_job_is_still_found() -> None:
    """v1's pids, freezer and cpuacct serve: the memory hierarchy gets no parent of this agent
    (a job's memory cgroup lingered, dying, after its rmdir), but a job an earlier agent put in
    one is found there (re-adoption), and removed with it."""
    memory, pids = _own("memory"), _own("pids")
    if os.geteuid() != 0 or memory is None or pids is None or _own("freezer") is None or _own("cpuacct") is None:
        pytest.skip("needs root and the v1 pids, freezer, cpuacct and memory hierarchies")
    state_id = f"rxtest{os.getpid()}"
    earlier = memory / f"remote-exec-{state_id}"
    job = earlier / f"{state_id}-1"
    job.mkdir(parents=True)  # an earlier agent's running job's, made before memory was left out
    member = subprocess.Popen(["sh", "-c", f"echo 0 > {job}/cgroup.procs && exec sleep 60"])
    home = None
    try:
        deadline = time.monotonic() + 30  # its join has no event: poll the process table, bounded
        while not str(job).endswith(_cgroups_in(Path(f"/proc/{member.pid}/cgroup").read_text()).get("memory", "?")):
            assert time.monotonic() < deadline, "the member never joined"
            time.sleep(0.005)
        home = CgroupHome.discover(state_id)
        assert home is not None and "memory" not in home.parents and home.retired["memory"] == str(earlier)
        found = home.find(job.name)
        assert found is not None and found.dirs["memory"] == str(job)
        assert found.members() == {member.pid}
        member.kill()
        member.wait()
        assert found.remove() and not job.exists()
        home.close()
        second = CgroupHome.discover(state_id)  # the next start removes the emptied one, makes none
        assert second is not None
        second.close()
        assert not earlier.exists()
    finally:
        member.kill()
        member.wait()
        for d in (job, earlier):
            with contextlib.suppress(OSError):
                d.rmdir()
        if home is not None:
            home.close()


def test_on_v1_the_spawning_thread_joins_and_no_trampoline_runs() -> None:
    """Where every job cgroup is v1's, made by this start, and the way back is known, the leader
    is spawned by the agent's own thread from inside the job's cgroups (no ``/bin/sh`` first);
    else the trampoline: a v2 dir (a process's threads share one cgroup), a dir that was there
    already (a job could have set it up, frozen), no way back; a ``preexec_fn`` joins by itself."""
    argv = ["echo", "hi"]
    v1 = {"pids": "/sys/fs/cgroup/pids/x/j", "cpuacct": "/sys/fs/cgroup/cpuacct/x/j"}  # no freezer to read
    home = CgroupHome(
        {"pids": "/sys/fs/cgroup/pids/x", "cpuacct": "/sys/fs/cgroup/cpuacct/x"},
        {"pids": "/sys/fs/cgroup/pids/tasks", "cpuacct": "/sys/fs/cgroup/cpuacct/tasks"},
    )
    spawn_argv, fds, within = spawn.joined(JobCgroup(v1, fresh=True), home, argv, {}, {}, None)
    assert (spawn_argv, fds, type(within).__name__) == (argv, [], "_GeneratorContextManager")
    both = {"pids": "/sys/fs/cgroup/pids/x/j", "unified": "/sys/fs/cgroup/unified/x/j"}
    for dirs, fresh, way_back in ((both, True, home.way_back), (v1, False, home.way_back), (v1, True, None)):
        spawn_argv, fds, within = spawn.joined(
            JobCgroup(dirs, fresh), CgroupHome(home.parents, way_back), argv, {}, dict(os.environ), None
        )
        assert spawn_argv[:2] == [spawn.SH, "-c"] and spawn_argv[-2:] == argv
        assert isinstance(within, contextlib.nullcontext)
    spawn_argv, _, within = spawn.joined(JobCgroup(v1, True), home, argv, {"preexec_fn": print}, {}, None)
    assert spawn_argv == argv and isinstance(within, contextlib.nullcontext)


def test_a_thread_steps_only_into_a_thawed_freezer_cgroup_this_start_made() -> None:
    with job_cgroup("freezer") as cg:
        assert JobCgroup(cg.dirs, fresh=True).can_enter() and not JobCgroup(cg.dirs, fresh=False).can_enter()
        Path(cg.dirs["freezer"], "freezer.state").write_text("FROZEN")
        try:
            assert not JobCgroup(cg.dirs, fresh=True).can_enter()  # frozen (by a job, ahead): the trampoline
        finally:
            Path(cg.dirs["freezer"], "freezer.state").write_text("THAWED")


# A process with a thread inside a job's freezer cgroup (as the agent's, while it spawns): the
# job's kill must neither freeze that thread for good nor SIGKILL the process.
INSIDE_AT_KILL = """
import os, sys, threading
from remote_exec.agent.jobs.cgroup import JobCgroup, move_self
job, back = sys.argv[1], sys.argv[2]
entered, leave = threading.Event(), threading.Event()
def visit():
    move_self(job + "/tasks")
    entered.set()
    leave.wait()
    move_self(back)
t = threading.Thread(target=visit)
t.start()
entered.wait()
cg = JobCgroup({"freezer": job})
print("agent a member:", os.getpid() in cg.members(), flush=True)
print("killed through the freezer:", cg.kill(), flush=True)
leave.set()
t.join()
print("back:", open(job + "/tasks").read().split() == [], flush=True)
"""

# A spawn from inside whose way back fails: the thread goes to the jobs' parent, and the home
# stops moving threads (the trampoline from then on).
WAY_BACK_GONE = """
import sys
from remote_exec.agent.jobs import spawn
from remote_exec.agent.jobs.cgroup import CgroupHome, JobCgroup, move_self
parent, job, back = sys.argv[1], sys.argv[2], sys.argv[3]
home = CgroupHome({"pids": parent}, {"pids": parent + "/gone/tasks"})
with spawn.inside(JobCgroup({"pids": job}, fresh=True), home):
    print("inside:", open("/proc/thread-self/cgroup").read().count(job.rsplit("/", 1)[1]) == 1, flush=True)
here = [line for line in open("/proc/thread-self/cgroup").read().splitlines() if ":pids:" in line][0]
print("in the parent:", here.endswith(parent.rsplit("/", 1)[1]), "way back:", home.way_back, flush=True)
move_self(back)
"""


def test_a_thread_inside_a_jobs_cgroup_is_never_frozen_or_killed_with_it() -> None:
    with job_cgroup("freezer") as cg:
        own = _own("freezer")
        assert own is not None
        freezer = cg.dirs["freezer"]
        proc = subprocess.Popen(
            [sys.executable, "-c", INSIDE_AT_KILL, freezer, str(own / "tasks")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # (without the defence) its thread frozen holds it: thaw, then end it
            Path(freezer, "freezer.state").write_text("THAWED")
            proc.kill()
            out, err = proc.communicate(timeout=30)
    assert (proc.returncode, out) == (0, "agent a member: False\nkilled through the freezer: False\nback: True\n"), err


def test_a_failed_way_back_leaves_the_thread_in_the_parent_and_stops_the_moves() -> None:
    with job_cgroup() as parent_cg:
        parent = parent_cg.dirs["pids"]
        job = os.path.join(parent, "job")
        os.mkdir(job)
        own = _own("pids")
        assert own is not None
        try:
            run = subprocess.run(
                [sys.executable, "-c", WAY_BACK_GONE, parent, job, str(own / "tasks")],
                capture_output=True,
                text=True,
                timeout=60,
            )
        finally:
            os.rmdir(job)
    assert (run.returncode, run.stdout) == (0, "inside: True\nin the parent: True way back: None\n"), run.stderr


async def test_a_leader_is_born_in_its_cgroups_and_the_agents_threads_stay_in_their_own(fresh_agent_dir: Path) -> None:
    """A real agent: its job reads its own cgroups from inside them, and after starts that worked
    and one that failed (the spawn raised inside), every thread of the agent is back where the
    agent is (a thread left in a job's cgroup would be frozen and SIGKILLed by the job's kill)."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}") as sb:
        agent = sb.info.pid
        own = _cgroups_in(Path(f"/proc/{agent}/cgroup").read_text())  # noqa: ASYNC240  # procfs: never blocks
        for _ in range(3):
            res = await sb.run(["cat", "/proc/self/cgroup"])
            assert res.returncode == 0, res
            assert isinstance(res.stdout, str)
            inside = _cgroups_in(res.stdout)
            joined_some = [h for h in ("pids", "freezer", "cpuacct") if inside.get(h) != own.get(h)]
            if not joined_some:
                pytest.skip("no writable v1 hierarchy here")
            for h in joined_some:
                parent, _, mark = inside[h].rpartition("/")  # .../remote-exec-<state id>/<job's mark>
                assert parent.startswith(own[h].rstrip("/") + "/remote-exec-") and mark, (h, inside)
            with pytest.raises(rx.SpawnError, match="no-such-program"):
                await sb.run(["no-such-program-xyz"])
            for task in os.listdir(f"/proc/{agent}/task"):
                with open(f"/proc/{agent}/task/{task}/cgroup") as f:  # noqa: ASYNC230  # procfs: never blocks
                    assert _cgroups_in(f.read()) == own, task


async def test_a_file_without_a_shebang_fails_to_start_where_no_shell_joins_first(
    fresh_agent_dir: Path, tmp_path: Path
) -> None:
    """Spawned from inside its v1 cgroups, a file without ``#!`` fails as ``Popen`` says (as it
    does where the agent has no cgroups); the trampoline's ``sh`` used to run it as a script."""
    if os.geteuid() != 0 or not all(_own(h) for h in ("pids", "freezer", "cpuacct")):
        pytest.skip("needs root and the v1 pids, freezer and cpuacct hierarchies")
    script = tmp_path / "no-shebang"
    script.write_text("echo ran\n")
    script.chmod(0o755)
    async with rx.open_sandbox(f"local://?dir={fresh_agent_dir}") as sb:
        with pytest.raises(rx.SpawnError, match="Exec format error"):
            await sb.run([str(script)])
