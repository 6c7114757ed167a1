"""`make demo` runs the terminal demo; it must keep working."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_demo_runs(agent_dir: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "remote_exec.demo", f"local://?dir={agent_dir}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    for marker in ["stderr 'warning 3\\n'", "exit code 3", "ExecTimeoutError", "partial stdout: 'working...\\n'",
                   "state=killed, exit code -9", "'tick 1\\ntick 2\\ntick 3\\ntick 4\\n', exit 0"]:  # fmt: skip
        assert marker in r.stdout, r.stdout
