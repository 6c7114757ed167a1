"""Run the notebooks top to bottom and store their real outputs in place (``make notebooks``).

Each notebook runs in the environment its test gives it (``notebooks/conftest.py`` uses
:func:`notebook_env` and :func:`stop_agents` from here, so the stored outputs are what
``pytest --nbval`` compares against):

- ``REMOTE_EXEC_NONINTERACTIVE=1``: magics and widgets print plain text (a headless kernel
  gets it anyway; the switch makes sure, whatever front-end variables the kernel inherits);
- a ``local://`` agent of its own (``REMOTE_EXEC_AGENT_DIR`` in a fresh scratch directory), so
  no notebook sees another's jobs, or a user's; ``TMPDIR`` is in that scratch directory too;
- the ``python3`` kernel of this interpreter's environment (the venv's).

The agents are stopped afterwards. Usage: ``python tools/run_notebooks.py [NOTEBOOK...]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["NOTEBOOKS", "main", "notebook_env", "scratch_dir", "stop_agents"]

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
BUDGET = 60.0  # seconds a notebook may take, kernel start included


def scratch_dir() -> Path:
    """A fresh directory for the notebooks' agents and temp files, removed by the caller.

    Under ``/tmp`` wherever ``$TMPDIR`` points: agent socket paths must stay short, and
    ``notebooks/sanitize.cfg`` recognises temporary paths by that prefix.
    """
    return Path(tempfile.mkdtemp(prefix="rx-nb-", dir="/tmp"))


def notebook_env(scratch: Path, notebook: str) -> dict[str, str]:
    """The variables a notebook's kernel gets: its own agent and temp dir under ``scratch``."""
    home = scratch / notebook[:2]  # short: the agent's socket path must stay under ~100 bytes
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    return {
        "REMOTE_EXEC_NONINTERACTIVE": "1",
        "REMOTE_EXEC_AGENT_DIR": str(home / "agent"),
        "TMPDIR": str(home / "tmp"),
        "SHELL": str(Path(__file__).resolve().parent / "plain-bash"),  # %remote_shell's, not the machine's rc
    }


def _agents_under(scratch: Path) -> Iterator[int]:
    needle = str(scratch).encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile
        if b"remote_exec.agent" in argv and any(needle in arg for arg in argv):
            yield int(proc.name)


def stop_agents(scratch: Path, timeout: float = 10.0) -> None:
    """SIGTERM every local agent whose state directory is under ``scratch``; wait for them."""
    pids = set(_agents_under(scratch))
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pids and time.monotonic() < deadline:
        pids = {pid for pid in pids if Path(f"/proc/{pid}").exists()}
        time.sleep(0.05)


def run(path: Path, scratch: Path) -> float:
    """Execute ``path`` in place; returns the seconds it took. Raises on an unexpected error."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    saved = dict(os.environ)
    os.environ.update(notebook_env(scratch, path.stem))  # the kernel inherits this environment
    start = time.monotonic()
    try:
        client = NotebookClient(
            nb,
            kernel_name="python3",  # jupyter_client runs it with this interpreter (sys.executable)
            timeout=BUDGET,
            record_timing=False,  # no timestamps in the stored notebook: diffs show only outputs
            store_widget_state=False,
            coalesce_streams=True,  # one stdout and one stderr output per cell, as nbval compares them
            resources={"metadata": {"path": str(path.parent)}},  # the kernel's cwd, as under nbval
        )
        client.execute()  # a cell without the raises-exception tag must not raise
    finally:
        os.environ.clear()
        os.environ.update(saved)
    elapsed = time.monotonic() - start
    nbformat.write(nb, path)
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebooks/*.ipynb")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted(NOTEBOOKS.glob("*.ipynb"))
    scratch = scratch_dir()
    slow = []
    try:
        for path in paths:
            elapsed = run(path, scratch)
            print(f"{path.name}: {elapsed:.1f} s", flush=True)
            if elapsed > BUDGET:
                slow.append(path.name)
    finally:
        stop_agents(scratch)
        shutil.rmtree(scratch, ignore_errors=True)
    if slow:
        print(f"over the {BUDGET:g} s budget: {', '.join(slow)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
