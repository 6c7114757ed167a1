"""The Binder set-up (binder/) works: a simulated mybinder.org build, then the quickstart notebook.

mybinder.org builds an image from the repository with ``pip install -r binder/requirements.txt``
(run from the repository root), runs ``binder/postBuild`` as the unprivileged notebook user, and
opens JupyterLab on ``notebooks/01-quickstart.ipynb``; there is no Docker and no root, so the
notebook runs on ``local://``. This test does the same on this machine, from scratch: a copy of
the tree as it would be committed, a fresh venv (installed with uv: ``tests/venvs.py``),
``postBuild`` with ``$HOME`` in a temporary directory, then the notebook executed by nbclient in
the "python3" kernel that ``postBuild`` registered.
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

from .venvs import install, make_venv

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = "notebooks/01-quickstart.ipynb"
EXECUTE = """
import sys

import nbclient
import nbformat

notebook, cwd, out = sys.argv[1:]
nb = nbformat.read(notebook, as_version=4)
nb.cells.append(nbformat.v4.new_code_cell("import sys; print('KERNEL', sys.prefix)"))  # which Python ran it
resources = {"metadata": {"path": cwd}}
# Raises CellExecutionError on an error, except in cells tagged raises-exception.
nbclient.NotebookClient(nb, timeout=120, kernel_name="python3", resources=resources).execute()
nbformat.write(nb, out)
for cell in nb.cells:
    for output in cell.get("outputs", []):
        print(output.get("text", "").rstrip())
"""


def _committed_tree(dest: Path) -> None:
    """Copy what ``git add -A && git commit`` would commit (tracked and new files, not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        src = ROOT / os.fsdecode(name)
        if src.is_file():  # a file deleted but not yet staged is still listed
            (dest / os.fsdecode(name)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / os.fsdecode(name))


def _clean_env(**extra: str) -> dict[str, str]:
    """This environment without anything tying it to our venv, Jupyter set-up or front end."""
    drop = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "JPY_SESSION_NAME", "REMOTE_EXEC_NONINTERACTIVE")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(("JUPYTER", "REMOTE_EXEC"))}
    return {**env, **extra}


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A short directory under /tmp (the agent's socket path must stay under ~100 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="rx-binder-", dir="/tmp"))
    yield path
    _stop_agents(path)
    shutil.rmtree(path, ignore_errors=True)


def _stop_agents(scratch: Path) -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from run_notebooks import stop_agents
    finally:
        sys.path.remove(str(ROOT / "tools"))
    stop_agents(scratch)


def test_readme_badge_opens_the_quickstart_in_jupyterlab() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "https://mybinder.org/v2/gh/" in readme and f"?urlpath=lab/tree/{NOTEBOOK})" in readme
    assert os.access(ROOT / "binder" / "postBuild", os.X_OK), "binder/postBuild must be executable"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_binder_build_runs_the_quickstart_notebook(scratch: Path) -> None:
    repo, home, env_dir = scratch / "repo", scratch / "home", scratch / "env"
    repo.mkdir()
    home.mkdir()
    _committed_tree(repo)
    assert (repo / NOTEBOOK).is_file(), f"{NOTEBOOK} is not in the tree Binder would see"
    post_build = repo / "binder" / "postBuild"
    assert os.access(post_build, os.X_OK), "binder/postBuild must be executable (Binder runs it directly)"

    bindir = make_venv(env_dir).parent
    path = f"{bindir}{os.pathsep}{os.environ['PATH']}"
    # as repo2docker does, from the repository root: `.` in the requirements is the repository
    pip = install(bindir / "python", "-r", "binder/requirements.txt", cwd=repo, env=_clean_env(PATH=path))
    assert pip.returncode == 0, pip.stdout + pip.stderr

    # From here on, as the notebook user of the image: its own $HOME, nothing of ours.
    user_env = _clean_env(
        PATH=path,
        VIRTUAL_ENV=str(env_dir),
        HOME=str(home),
        TMPDIR=str(scratch),
        REMOTE_EXEC_AGENT_DIR=str(scratch / "agent"),
    )
    built = subprocess.run([post_build], cwd=repo, env=user_env, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    assert "postBuild: the local:// agent" in built.stdout
    assert (home / ".local" / "share" / "jupyter" / "kernels" / "python3" / "kernel.json").is_file()

    executed = scratch / "executed.ipynb"
    run = subprocess.run(
        [bindir / "python", "-c", EXECUTE, NOTEBOOK, str(repo / "notebooks"), str(executed)],
        cwd=repo,
        env=user_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    kernel_prefix = next(line.split(" ", 1)[1] for line in run.stdout.splitlines() if line.startswith("KERNEL "))
    assert kernel_prefix == str(env_dir), f"the notebook ran in {kernel_prefix}, not in the Binder env"
    assert "counting on Linux" in run.stdout and "exit code: 0" in run.stdout, run.stdout
