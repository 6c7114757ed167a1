"""Backend "jail": the contract suite in a real bubblewrap box, entered with nsenter (no fakes).

The box lives for the session and the sandboxes attach to it by PID (``jail://PID``), because the
contract reopens the same URL and expects the same agent and jobs; ``jail://`` itself (a box
per sandbox, killed on close) is covered by test_jail.py.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from remote_exec.errors import SandboxError
from remote_exec.sandboxes.jailbox import JailBox, JailConfig, exec_argv, prepare_work

from .conftest import backend, unavailable

TOOLS = ("bwrap", "nsenter", "setpriv")


def jail_unavailable_reason(work: Path) -> str | None:
    """Why no box can run here (missing tools, no namespaces), or None when one can."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install bubblewrap util-linux)"
    try:
        prepare_work(work, created=True)  # the jobs' uid must own it
        box = JailBox.start(JailConfig(work), timeout=30)
    except SandboxError as exc:
        return f"bubblewrap cannot create a jail here: {exc}"
    try:
        done = subprocess.run(exec_argv(box.pid, ["true"]), capture_output=True, timeout=30)
    finally:
        box.kill()
    if done.returncode != 0:
        return f"nsenter into a jail fails: {done.stderr.decode(errors='replace').strip()}"
    return None


def require_jail(work: Path) -> None:
    """Skip (or fail, when backends are required) unless a box can run here."""
    reason = jail_unavailable_reason(work)
    if reason is not None:
        unavailable(reason)


@backend("jail")
def _jail(tmp: pytest.TempPathFactory) -> Iterator[str]:
    """One box for the session, started from pytest's main thread (bwrap's --die-with-parent
    follows the thread that started it)."""
    work = tmp.mktemp("jail-work")
    require_jail(work)
    box = JailBox.start(JailConfig(work))
    try:
        yield box.url
    finally:
        box.kill()
