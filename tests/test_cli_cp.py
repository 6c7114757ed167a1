"""`remote-exec cp` as a user runs it: both directions, files and trees, stdin/stdout, errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .conftest import run_cli


def test_cp_files_both_ways(agent_dir: Path, tmp_path: Path) -> None:
    sb = f"local://?dir={agent_dir}"
    local = tmp_path / "a.bin"
    local.write_bytes(bytes(range(256)))
    remote = tmp_path / "remote"
    remote.mkdir()
    r = run_cli("-s", sb, "cp", "--no-progress", str(local), f"sandbox:{remote}")  # into an existing directory
    assert r.returncode == 0, r.stderr
    assert (remote / "a.bin").read_bytes() == bytes(range(256))
    r = run_cli("-s", sb, "cp", f"sandbox:{remote}/a.bin", str(tmp_path / "back.bin"))
    assert r.returncode == 0 and (tmp_path / "back.bin").read_bytes() == bytes(range(256))
    out = subprocess.run(
        [sys.executable, "-m", "remote_exec.cli", "-s", sb, "cp", f"sandbox:{remote}/a.bin", "-"],
        capture_output=True,
        timeout=60,
    )
    assert out.returncode == 0 and out.stdout == bytes(range(256))
    r = run_cli("-s", sb, "cp", "-", f"sandbox:{remote}/from-stdin.txt", input="piped\n")
    assert r.returncode == 0 and (remote / "from-stdin.txt").read_text() == "piped\n"


def test_cp_trees_and_errors(agent_dir: Path, tmp_path: Path) -> None:
    sb = f"local://?dir={agent_dir}"
    src = tmp_path / "proj"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "m.py").write_text("M = 1\n")
    (src / ".env").write_text("SECRET=1\n")
    dest = tmp_path / "dest"
    r = run_cli("-s", sb, "cp", "--no-progress", str(src), f"sandbox:{dest}")
    assert r.returncode == 0, r.stderr
    assert "uploaded 1 file (" in r.stderr and "1 ignored" in r.stderr
    assert (dest / "pkg" / "m.py").read_text() == "M = 1\n" and not (dest / ".env").exists()
    r = run_cli("-s", sb, "cp", "--no-progress", str(src), f"sandbox:{dest}")  # dest exists: copied into it
    assert r.returncode == 0 and (dest / "proj" / "pkg" / "m.py").exists()
    back = tmp_path / "back"
    r = run_cli("-s", sb, "cp", "--no-progress", f"sandbox:{dest}", str(back))
    assert r.returncode == 0 and (back / "pkg" / "m.py").read_text() == "M = 1\n"
    assert "downloaded 2 files" in r.stderr

    parent = tmp_path / "parent"  # an existing directory: the tree goes into it, as with docker cp
    parent.mkdir()
    assert run_cli("-s", sb, "cp", "--no-progress", str(src), f"sandbox:{parent}").returncode == 0
    (parent / "proj" / "stale.txt").write_text("gone from the source")
    r = run_cli("-s", sb, "cp", "--no-progress", "--delete", str(src), f"sandbox:{parent}")
    assert r.returncode == 0 and "1 deleted" in r.stderr and not (parent / "proj" / "stale.txt").exists()

    r = run_cli("-s", sb, "cp", f"sandbox:{tmp_path}/missing", str(tmp_path / "x"))
    assert r.returncode == 2 and "RemoteFileNotFoundError" in r.stderr
    r = run_cli("-s", sb, "cp", "--root", str(dest), str(src / "pkg" / "m.py"), "sandbox:../escape.py")
    assert r.returncode == 2 and "PathEscapeError" in r.stderr and not (tmp_path / "escape.py").exists()
    r = run_cli("-s", sb, "cp", "--max-files", "1", "--no-progress", str(dest), "sandbox:/tmp/never")
    assert r.returncode == 2 and "TransferLimitError" in r.stderr
    r = run_cli("-s", sb, "cp", str(tmp_path / "nope"), f"sandbox:{dest}")
    assert r.returncode == 1 and "no such local file" in r.stderr
    r = run_cli("-s", sb, "cp", "a", "b")
    assert r.returncode == 1 and "exactly one" in r.stderr
