"""Fresh venvs for the tests that install this package as a user would (the wheel by its name,
Binder's requirements, an older ipykernel), made with uv: a pip install of the Jupyter stack
took 40-60 s of CPU each; uv takes a few seconds from its cache. uv installs a requirements
file or a direct reference by the same rules as pip (PEP 440/508, `.` is the working
directory); how pip itself behaves is not what these tests check.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from uv import find_uv_bin

__all__ = ["install", "make_venv"]


def make_venv(env_dir: Path) -> Path:
    """A venv of this Python at ``env_dir`` (no pip in it); returns its ``python``."""
    subprocess.run([find_uv_bin(), "venv", "-q", "--python", sys.executable, str(env_dir)], check=True)
    return env_dir / "bin" / "python"


def install(
    python: Path, *requirements: str, cwd: Path | None = None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``uv pip install`` into the venv of ``python`` (``-r FILE`` works as with pip)."""
    argv = [find_uv_bin(), "pip", "install", "-q", "--python", str(python), *requirements]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
