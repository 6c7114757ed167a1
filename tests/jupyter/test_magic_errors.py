"""A sandbox the magics cannot reach is one line, as IPython shows a ``UsageError`` (#25): no
chained traceback through asyncssh and asyncio; the chain only when asked (REMOTE_EXEC_DEBUG)."""

from __future__ import annotations

import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

UNREACHABLE = "ssh://nobody@127.0.0.1:1"


def test_an_unreachable_ssh_sandbox_is_one_line(ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REMOTE_EXEC_DEBUG", raising=False)
    with capture_output() as cap:
        ip.run_cell(f"%%exec_remote --sandbox {UNREACHABLE}\ntrue\n")
    shown = (cap.stdout + cap.stderr).strip().splitlines()
    assert 1 <= len(shown) <= 3 and "Traceback" not in cap.stdout + cap.stderr, shown
    assert shown[0].startswith("UsageError:") and UNREACHABLE in shown[0]


def test_the_chain_when_asked(ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REMOTE_EXEC_DEBUG", "1")
    with capture_output() as cap:
        ip.run_cell(f"%%exec_remote --sandbox {UNREACHABLE}\ntrue\n")
    out = cap.stdout + cap.stderr
    assert "ConnectionRefusedError" in out and "AgentUnavailableError" in out  # the whole chain
