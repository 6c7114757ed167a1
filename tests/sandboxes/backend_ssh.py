"""Backend "ssh": the contract suite over ssh:// to a private sshd on 127.0.0.1 (no fakes)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from .conftest import backend, unavailable
from .sshd import SSHServerUnavailable, running_sshd


@backend("ssh")
def _ssh(tmp: pytest.TempPathFactory) -> Iterator[str]:
    """One sshd for the session; every sandbox is one SSH connection to it as the current user."""
    try:
        import asyncssh  # noqa: F401
    except ImportError:
        unavailable("asyncssh is not installed: pip install -e '.[test]'")
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(running_sshd(tmp.mktemp("sshd")))
        except SSHServerUnavailable as exc:
            unavailable(str(exc))
        yield server.url()
