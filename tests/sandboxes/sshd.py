"""A private OpenSSH server on 127.0.0.1 for the ssh:// tests and the ssh benchmark (no pytest here).

It logs in as the current user with a fresh client key, serves from a fresh host key, and
writes a known_hosts file naming that key, so the client's host key check is exercised for real.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

__all__ = ["SSHServer", "SSHServerUnavailable", "make_key", "running_sshd"]

SSHD = "/usr/sbin/sshd"


class SSHServerUnavailable(Exception):
    """sshd is not installed or cannot run here."""


@dataclass(frozen=True)
class SSHServer:
    """A running sshd and the files a client needs to reach it."""

    port: int
    user: str
    client_key: Path
    known_hosts: Path
    log: Path
    agent_dir: Path
    host: str = "127.0.0.1"

    def url(self, **query: str) -> str:
        """An ssh:// URL for it; the defaults (key, known_hosts, this venv's agent) can be overridden."""
        opts = {
            "known_hosts": str(self.known_hosts),
            "key": str(self.client_key),
            "python": sys.executable,
            "dir": str(self.agent_dir),
        }
        opts.update(query)
        opts = {k: v for k, v in opts.items() if v != ""}  # "": leave the option out
        return f"ssh://{self.user}@{self.host}:{self.port}?{urlencode(opts)}"

    def accepted(self) -> int:
        """How many connections sshd has authenticated so far (one log line each)."""
        return len(re.findall(r"^Accepted publickey for ", self.log.read_text(), re.M))

    def established(self) -> int:
        """How many client-side TCP connections to the server are open right now (/proc/net/tcp)."""
        count = 0
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            remote, state = fields[2], fields[3]
            if state == "01" and int(remote.split(":")[1], 16) == self.port:
                count += 1
        return count


def make_key(path: Path) -> str:
    """Write a fresh ed25519 private key to ``path`` (``path.pub`` too); return the public line."""
    import asyncssh

    key = asyncssh.generate_private_key("ssh-ed25519")
    key.write_private_key(path)
    key.write_public_key(path.with_name(path.name + ".pub"))
    path.chmod(0o600)
    return key.export_public_key().decode().strip()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
        return s.recv(4).startswith(b"SSH-")  # the banner: sshd is serving, not just bound
    return False


@contextlib.contextmanager
def running_sshd(root: Path, *, max_sessions: int = 100) -> Iterator[SSHServer]:
    """Start sshd with files under ``root``; stop it on exit.

    :raises SSHServerUnavailable: openssh-server is missing or sshd does not come up.
    """
    if not os.access(SSHD, os.X_OK):
        raise SSHServerUnavailable(f"{SSHD} not found: install openssh-server (.ci/setup-ssh.sh)")
    try:
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # its privilege-separation directory
    except OSError as exc:
        raise SSHServerUnavailable(f"cannot create /run/sshd: {exc}") from exc
    root.mkdir(parents=True, exist_ok=True)
    host_pub = make_key(root / "host_key")
    (root / "authorized_keys").write_text(make_key(root / "client_key") + "\n")
    log = root / "sshd.log"
    for _ in range(3):  # the free port may be taken between probing and binding: try another
        port = _free_port()
        config = root / "sshd_config"
        config.write_text(
            f"Port {port}\nListenAddress 127.0.0.1\nHostKey {root / 'host_key'}\nPidFile {root / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {root / 'authorized_keys'}\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nUsePAM no\nStrictModes no\n"
            f"MaxSessions {max_sessions}\n"
            # Root's ~/.bashrc on these machines runs `pyenv init` (+150-300 ms per command); bash
            # sources it for an ssh command only at shell level 1, and SHLVL=1 makes the shell level 2.
            "SetEnv SHLVL=1\n"
        )
        log.write_text("")
        proc = subprocess.Popen([SSHD, "-D", "-f", str(config), "-E", str(log)], stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while proc.poll() is None and time.monotonic() < deadline and not _accepts(port):
            time.sleep(0.05)
        if proc.poll() is None and _accepts(port):
            break
        proc.kill()
        proc.wait()
    else:
        raise SSHServerUnavailable(f"sshd did not start: {log.read_text()[-2000:]}")
    known_hosts = root / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{port} {host_pub}\n")
    try:
        yield SSHServer(port, getpass.getuser(), root / "client_key", known_hosts, log, root / "agent-state")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        _stop_agent(root / "agent-state")


def _stop_agent(state_dir: Path) -> None:
    """End the keeper and agent the ssh sessions started (detached: sshd's exit leaves them running)."""
    from ..conftest import stop_agent

    stop_agent(state_dir)
