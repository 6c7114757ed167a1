"""``remote-exec run``'s policy options: the agent acts, the CLI says why."""

from __future__ import annotations

from pathlib import Path

from .conftest import run_cli


def test_run_kill_on_a_matching_line_says_why(agent_dir: Path) -> None:
    sb = f"local://?dir={agent_dir}"
    r = run_cli(
        "-s",
        sb,
        "run",
        "--kill-on",
        "loss nan",
        "--kill-grace",
        "0.5",
        "--",
        "sh",
        "-c",
        "echo 'loss nan'; exec sleep 300",
    )
    assert r.stdout == "loss nan\n"
    assert r.returncode == 128 + 15, r.stderr  # SIGTERM ended it, as a shell would report
    assert "remote-exec: killed: watch rule 0 matched 'loss nan' on stdout at byte 0" in r.stderr


def test_run_refuses_a_bad_policy_before_connecting(agent_dir: Path) -> None:
    sb = f"local://?dir={agent_dir}"
    r = run_cli("-s", sb, "run", "--memory-limit", "lots", "--", "true")
    assert r.returncode != 0 and "not a size: 'lots'" in r.stderr
    r = run_cli("-s", sb, "run", "--nice", "40", "--", "true")
    assert r.returncode != 0 and "--nice: Input should be less than or equal to 19" in r.stderr
