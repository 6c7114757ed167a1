"""Security defaults: private state dir, private socket, no TCP listener."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

import remote_exec as rx


def listening_inodes() -> set[int]:
    inodes: set[int] = set()
    for table in ("tcp", "tcp6", "udp", "udp6"):
        try:
            with open(f"/proc/net/{table}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        inodes.update(int(r.split()[9]) for r in rows)
    return inodes


def socket_inodes(pid: int) -> set[int]:
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(int(target[8:-1]))
    return out


def test_state_dir_and_socket_modes_and_no_network(fresh_agent_dir: Path) -> None:
    with rx.connect(f"local://?dir={fresh_agent_dir}") as sb:
        pid = sb.info.pid
        assert stat.S_IMODE(os.stat(fresh_agent_dir).st_mode) == 0o700
        for name in ("agent.sock", "agent.stream"):  # HTTP, and the frame stream
            sock = fresh_agent_dir / name
            assert stat.S_ISSOCK(os.stat(sock).st_mode) and stat.S_IMODE(os.stat(sock).st_mode) == 0o600
        assert socket_inodes(pid)  # it has sockets (the Unix one)...
        assert not socket_inodes(pid) & listening_inodes()  # ...none of them TCP or UDP


def test_too_open_own_dir_is_tightened(tmp_path: Path) -> None:
    d = tmp_path / "open"
    d.mkdir(mode=0o777)
    os.chmod(d, 0o777)
    with rx.connect(f"local://?dir={d}") as sb:
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
        os.kill(sb.info.pid, 15)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a directory owned by another user")
def test_foreign_dir_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "foreign"
    d.mkdir(mode=0o700)
    os.chown(d, 12345, 12345)
    with pytest.raises(rx.AgentUnavailableError, match="belongs to uid 12345"):
        rx.connect(f"local://?dir={d}")
