"""``pytest --nbval notebooks``: each notebook runs in the environment ``make notebooks`` stored
its outputs in (see tools/run_notebooks.py): plain text, and a local agent of its own."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from run_notebooks import notebook_env, scratch_dir, stop_agents

_scratch: Path | None = None
_saved: dict[str, str] = {}
_prepared: set[str] = set()


def pytest_configure(config: pytest.Config) -> None:
    global _scratch
    _scratch = scratch_dir()
    _saved.update(os.environ)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # Before the first cell of a notebook, i.e. before nbval starts that notebook's kernel
    # (the kernel inherits this process's environment when it starts).
    notebook = item.parent
    if notebook is None or not str(notebook.path).endswith(".ipynb") or str(notebook.path) in _prepared:
        return
    assert _scratch is not None
    _prepared.add(str(notebook.path))
    os.environ.update(notebook_env(_scratch, notebook.path.stem))


def pytest_unconfigure(config: pytest.Config) -> None:
    if _scratch is not None:
        stop_agents(_scratch)
        shutil.rmtree(_scratch, ignore_errors=True)
    os.environ.clear()
    os.environ.update(_saved)
