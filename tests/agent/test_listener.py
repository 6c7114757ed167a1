"""The agent's sockets are private from their first moment, with no change to the umask (which
is the whole process's: a thread making a dir meanwhile got it 0600)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from remote_exec.agent.listener import private_listener


def test_a_listener_is_0600_accepting_and_leaves_the_umask_alone(tmp_path: Path) -> None:
    path = tmp_path / "agent.sock"
    path.write_bytes(b"stale")  # a file left there is replaced
    old = os.umask(0)  # the most open umask: the mode must not come from it
    try:
        listener = private_listener(path, backlog=8)
        assert os.umask(0) == 0  # nothing changed it meanwhile
    finally:
        os.umask(old)
    with listener, socket.socket(socket.AF_UNIX) as client:
        assert oct(os.stat(path).st_mode & 0o777) == "0o600"
        client.connect(os.fspath(path))


def test_the_agent_server_does_not_set_the_umask() -> None:
    import remote_exec.agent.server as server

    assert "umask" not in Path(server.__file__).read_text()
