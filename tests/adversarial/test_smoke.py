"""The fake agent itself answers like an agent, so each attack test starts from a working sandbox."""

from __future__ import annotations

from pathlib import Path

import pytest

import remote_exec as rx

from .conftest import Adversary
from .hostile_agent import HostileAgent, Silence

pytestmark = pytest.mark.anyio


async def test_fake_agent_opens_a_sandbox(tmp_path: Path, adversary: Adversary) -> None:
    async with (
        HostileAgent(tmp_path, {"exec_remote_list": lambda p, _: {"jobs": []}}) as agent,
        rx.open_sandbox(agent.url) as sb,
    ):
        assert await sb.jobs() == []
        assert sb.info.instance_id == agent.instance_id
    assert agent.calls[:1] == ["server_info"]
    assert Silence  # re-exported for attack tests
