"""``local://`` is scoped per project and its agent starts from an allowlisted environment (#16).

Each test gets its own ``$XDG_RUNTIME_DIR`` (short: the project state dirs hold Unix sockets),
so the per-user and per-project agents here are this test's own, never the machine's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import remote_exec as rx
from remote_exec.sandboxes.local import LocalTransport
from remote_exec.sandboxes.localscope import project_root, scope_dir

from ..conftest import stop_agent

pytestmark = pytest.mark.anyio


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private ``$XDG_RUNTIME_DIR``; every agent started under it is stopped afterwards."""
    d = Path(tempfile.mkdtemp(prefix="rxs", dir="/tmp"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", os.fspath(d))
    monkeypatch.delenv("REMOTE_EXEC_AGENT_DIR", raising=False)
    yield d
    for state in [d / "remote-exec", *(d / "remote-exec-projects").glob("*")]:
        stop_agent(state)
    shutil.rmtree(d, ignore_errors=True)


def projects(root: Path) -> tuple[Path, Path]:
    """Two projects: ``a`` a git work tree (a notebook folder in it), ``b`` a plain directory."""
    (root / "a" / ".git").mkdir(parents=True)
    (root / "a" / "notebooks").mkdir()
    (root / "b").mkdir()
    return root / "a", root / "b"


def cli(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``remote-exec ARGS`` as a separate client process started in ``cwd``."""
    return subprocess.run(
        [sys.executable, "-m", "remote_exec.cli", *args],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


def real(path: str | Path) -> str:
    return os.path.realpath(path)


def cwd_of(pid: int) -> str:
    """The working directory of process ``pid`` (the local agent shares our PIDs)."""
    return os.readlink(f"/proc/{pid}/cwd")


def test_scope_dirs(runtime: Path, tmp_path: Path) -> None:
    a, b = projects(tmp_path)
    assert project_root(a / "notebooks") == a.resolve()
    assert project_root(b) == b.resolve()
    dir_a, scoped = scope_dir("project", a / "notebooks")
    assert scoped and dir_a == scope_dir("project", a)[0] != scope_dir("project", b)[0]
    assert dir_a.parent == runtime / "remote-exec-projects" and dir_a.name.startswith("a-")
    assert scope_dir("user", a) == (runtime / "remote-exec", False)
    with pytest.raises(rx.SandboxError, match="not both"):
        LocalTransport.from_url("local://?scope=user&dir=/x")
    with pytest.raises(rx.SandboxError, match="scope must be"):
        LocalTransport.from_url("local://?scope=kernel")


async def test_two_projects_two_agents_and_reattach(
    runtime: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = projects(tmp_path)
    monkeypatch.chdir(a / "notebooks")
    async with rx.open_sandbox("local://") as sa:
        job = sa.exec_remote(["sh", "-c", "echo from-a; read x; echo got $x"], stdin_open=True)
        assert await anext(aiter(job)) == rx.StdoutChunk("from-a\n")
        pid_a = (await sa.server_info()).pid
        job_id = job.detach()
        assert job_id is not None
    monkeypatch.chdir(b)
    async with rx.open_sandbox("local://") as sb:
        assert (await sb.server_info()).pid != pid_a
        assert job_id not in [j.job_id for j in await sb.jobs()]
    # The CLI from the project's root sees the notebook's agent and its job; from b it does not.
    assert job_id in cli(a, "ps").stdout
    assert job_id not in cli(b, "ps").stdout
    # A restarted client (a kernel restart) in the same folder finds the same agent: reattach works.
    monkeypatch.chdir(a / "notebooks")
    async with rx.open_sandbox("local://") as again:
        assert (await again.server_info()).pid == pid_a
        proc = await again.attach(job_id)
        await proc.write_stdin("yes\n")
        assert (await proc.wait()).stdout == "from-a\ngot yes\n"


async def test_user_scope_is_shared(runtime: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = projects(tmp_path)
    monkeypatch.chdir(a)
    async with rx.open_sandbox("local://?scope=user") as sa:
        assert sa.url == "local://?scope=user"
        pid = (await sa.server_info()).pid
        job_id = (await sa.run(["true"])).job_id
    monkeypatch.chdir(b)
    async with rx.open_sandbox("local://?scope=user") as sb:
        assert (await sb.server_info()).pid == pid
        assert job_id in [j.job_id for j in await sb.jobs()]
    assert job_id in cli(b, "--sandbox", "local://?scope=user", "ps", "-a").stdout  # an ended job: -a


async def test_jobs_and_shells_run_in_the_clients_working_directory(
    runtime: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#23, point 4: the shared agent was started by a client in ``b``; a client in ``a`` (a
    notebook's kernel in its folder) runs its jobs and shells in ``a``, not in the agent's
    directory; an explicit ``cwd`` still wins."""
    a, b = projects(tmp_path)
    c = tmp_path / "elsewhere"
    c.mkdir()
    url = "local://?scope=user"
    assert cli(b, "--sandbox", url, "run", "--", "true").returncode == 0  # the agent starts from b
    pwd = ["sh", "-c", "pwd -P"]
    ran = cli(a, "--sandbox", url, "run", "--", *pwd)
    assert ran.stdout == f"{real(a)}\n", ran.stderr
    ran = cli(a, "--sandbox", url, "run", "--cwd", os.fspath(c), "--", *pwd)
    assert ran.stdout == f"{real(c)}\n", ran.stderr
    # The API alike, from this process: its working directory at each start.
    notebooks = a / "notebooks"
    monkeypatch.chdir(notebooks)
    async with rx.open_sandbox(url) as sb:
        agent = (await sb.server_info()).pid
        assert cwd_of(agent) == real(b)  # the agent's own
        assert (await sb.run(pwd)).stdout == f"{real(notebooks)}\n"
        assert (await sb.run(pwd, cwd=os.fspath(c))).stdout == f"{real(c)}\n"
        monkeypatch.chdir(a)
        assert (await sb.exec_remote(pwd).wait()).stdout == f"{real(a)}\n"
        shell = await sb.shell()
        try:
            assert real(shell.info.cwd or "") == real(a)
        finally:
            await shell.close()


@pytest.mark.parametrize("channel", ["socket", "stdio"])
def test_first_client_environment_does_not_leak(runtime: Path, tmp_path: Path, channel: str) -> None:
    """The issue's case: the client that starts the agent holds a secret; the next one must not see it."""
    a, _ = projects(tmp_path)
    url = f"local://?channel={channel}"
    secrets = {"FIRST_SECRET": "abc", "MPLBACKEND": "agg", "JPY_SESSION_NAME": "n"}
    first = cli(a, "--sandbox", url, "run", "--", "true", env=secrets)
    assert first.returncode == 0, first.stderr
    probe = 'echo "[$FIRST_SECRET][$MPLBACKEND][$JPY_SESSION_NAME][$HOME]"'
    second = cli(a, "--sandbox", url, "run", "--", "sh", "-c", probe)
    assert second.stdout == f"[][][][{os.environ['HOME']}]\n", second.stderr
    # Nor is it in the agent's own environment, which the same user's jobs could read in /proc.
    with rx.connect(f"local://?dir={scope_dir('project', a)[0]}") as sb:
        environ = Path(f"/proc/{sb.info.pid}/environ").read_bytes().split(b"\0")
        assert not [v for v in environ if v.startswith((b"FIRST_SECRET=", b"MPLBACKEND=", b"JPY_SESSION_NAME="))]


@pytest.mark.parametrize("plant", ["foreign", "symlink"])
async def test_foreign_projects_dir_is_refused(
    runtime: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plant: str
) -> None:
    """Another user made the "-projects" parent first (or a symlink there): refused, nothing sent."""
    a, _ = projects(tmp_path)
    parent = runtime / "remote-exec-projects"
    if plant == "foreign":
        if os.geteuid() != 0:
            pytest.skip("making a directory another user's takes root")
        parent.mkdir(mode=0o777)
        os.chown(parent, 65534, 65534)
    else:
        (tmp_path / "elsewhere").mkdir()
        parent.symlink_to(tmp_path / "elsewhere")
    monkeypatch.chdir(a)
    with pytest.raises(rx.UntrustedAgentError):
        async with rx.open_sandbox("local://"):
            pass
    assert not list((tmp_path / "elsewhere").glob("*")) if plant == "symlink" else not list(parent.iterdir())
