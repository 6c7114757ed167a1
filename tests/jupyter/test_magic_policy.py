"""``%%exec_remote``'s policy options (the same table as ``remote-exec run``'s)."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

import remote_exec as rx


def test_idle_interrupt_and_watch_from_the_magic(ip: InteractiveShell) -> None:
    body = "echo 'Traceback (most recent call last):'; exec sleep 300"
    with capture_output():
        ip.run_cell_magic(
            "exec_remote",
            "--no-widget --no-raise-error --name r --idle-timeout 1 --idle-action kill --watch Traceback",
            body,
        )
    r = ip.user_ns["r"]
    assert isinstance(r, rx.ExecResult) and r.state == "killed"
    assert r.reason == "killed: no output for 1 s"


def test_policy_usage_errors(ip: InteractiveShell) -> None:
    with pytest.raises(UsageError, match="--memory-limit: Input should be greater than or equal to 1048576"):
        ip.run_cell_magic("exec_remote", "--no-widget --memory-limit 10", "true")
    with pytest.raises(UsageError, match="not to a run in a shell session"):
        ip.run_cell_magic("exec_remote", "--no-widget --shell new --kill-on x", "true")
