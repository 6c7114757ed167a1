from __future__ import annotations

from pathlib import Path

import pytest

import remote_exec as rx


@pytest.fixture
def agent_sock(agent_dir: Path) -> Path:
    """The shared agent's socket, started if needed."""
    with rx.connect(f"local://?dir={agent_dir}"):
        pass
    return agent_dir / "agent.sock"
