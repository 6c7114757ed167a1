"""Backends for the sandbox contract suite: each yields a sandbox URL, or skips with a reason.

A backend is a generator function ``provide(tmp_path_factory) -> Iterator[str]`` registered in
:data:`BACKENDS`; it sets up what it needs (a daemon, an image, a key) and tears it down.
With ``REMOTE_EXEC_REQUIRE_BACKENDS=1`` (CI), a backend that cannot be set up FAILS instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

Provider = Callable[[pytest.TempPathFactory], Iterator[str]]
BACKENDS: dict[str, Provider] = {}


def backend(name: str) -> Callable[[Provider], Provider]:
    """Register a backend provider under ``name``."""

    def register(fn: Provider) -> Provider:
        BACKENDS[name] = fn
        return fn

    return register


def unavailable(reason: str) -> None:
    """Skip (or, when backends are required, fail) because a backend cannot run here."""
    if os.environ.get("REMOTE_EXEC_REQUIRE_BACKENDS") == "1":
        pytest.fail(f"backend required but unavailable: {reason}")
    pytest.skip(reason)


@backend("local-stdio")
def _local_stdio(tmp: pytest.TempPathFactory) -> Iterator[str]:
    """The local agent through the stdio relay: the same channel remote sandboxes use."""
    from ..conftest import stop_agent

    state = tmp.mktemp("local-stdio") / "state"
    yield f"local://?dir={state}&channel=stdio"
    stop_agent(state)


def _load_backend_modules() -> None:
    # Each tests/sandboxes/backend_*.py registers itself on import.
    import importlib

    for path in sorted(Path(__file__).parent.glob("backend_*.py")):
        importlib.import_module(f"{__package__}.{path.stem}")


_load_backend_modules()


@pytest.fixture(scope="session", params=sorted(BACKENDS))
def sandbox_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A URL per registered backend, set up once per session."""
    yield from BACKENDS[request.param](tmp_path_factory)
