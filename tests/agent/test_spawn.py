"""The trampoline a job's leader starts through (a ``vfork``, not a fork of the whole agent):
it joins the job's cgroups, then runs the argv untouched; a command that cannot run fails the
start as ``Popen`` would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from remote_exec.agent.jobs.spawn import check_command, trampoline


def test_the_trampoline_joins_then_runs_the_argv_untouched(tmp_path: Path) -> None:
    procs = [tmp_path / "a b", tmp_path / "it's $(touch pwned)"]
    for path in procs:
        path.write_text("")
    args = ["a b", "$HOME", "x'y", "\n", "*", ""]
    argv = [sys.executable, "-c", "import sys; print(sys.argv[1:])", *args]
    missing = tmp_path / "gone" / "cgroup.procs"  # a join that fails is skipped, silently
    joins = [*map(str, procs), str(missing)]
    run = subprocess.run(trampoline(argv, joins), capture_output=True, text=True, cwd=tmp_path)
    assert (run.returncode, run.stdout, run.stderr) == (0, f"{args!r}\n", "")
    assert [path.read_text() for path in procs] == ["0\n", "0\n"]  # "me", to each cgroup
    assert not (tmp_path / "pwned").exists()  # the paths are quoted, never run


def test_a_command_that_cannot_run_fails_as_popen_would(tmp_path: Path) -> None:
    env = {"PATH": f"{tmp_path}/bin:/usr/bin:/bin"}
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "notes").write_text("not a program")  # on PATH, not executable
    (tmp_path / "bin" / "adir").mkdir()
    check_command("sh", None, env)  # found on PATH
    for argv0, cwd in (("no-such-command-xyz", None), ("./missing", str(tmp_path)), ("notes", None), ("adir", None)):
        with pytest.raises(OSError) as ours:
            check_command(argv0, cwd, env)
        with pytest.raises(OSError) as popen:
            subprocess.Popen([argv0], cwd=cwd, env=env)
        assert (type(ours.value), str(ours.value)) == (type(popen.value), str(popen.value)), argv0
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\necho ok\n")
    os.chmod(script, 0o755)
    check_command("./run.sh", str(tmp_path), env)  # relative to the job's cwd, not the agent's
