"""The other local user of the takeover tests: listens where the victim's agent should be and
records every connection and byte it gets (run as uid 65534 through ``setpriv``).

    python takeover_attacker.py LOG DIR            listen on DIR/agent.sock and DIR/agent.stream,
                                                   made 0666 in a 0777 DIR (created if missing)
    python takeover_attacker.py LOG --fds FD...    listen() on sockets bound for us by another
                                                   process (SO_PEERCRED then names us, not it)

Each event is one JSON line in LOG: ``{"sock": name, "event": "connect"}`` or ``"data"`` with
``"bytes"`` (hex). Prints ``ready`` once it listens; runs until killed.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading

_lock = threading.Lock()


def _log(path: str, record: dict[str, str]) -> None:
    with _lock, open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def _serve(listener: socket.socket, name: str, log: str) -> None:
    while True:
        conn, _ = listener.accept()
        _log(log, {"sock": name, "event": "connect"})
        threading.Thread(target=_drain, args=(conn, name, log), daemon=True).start()


def _drain(conn: socket.socket, name: str, log: str) -> None:
    with conn:
        while data := conn.recv(65536):
            _log(log, {"sock": name, "event": "data", "bytes": data.hex()})


def main(argv: list[str]) -> None:
    log = argv[0]
    listeners: list[tuple[socket.socket, str]] = []
    if argv[1] == "--fds":
        for fd in argv[2:]:
            s = socket.socket(fileno=int(fd))
            listeners.append((s, os.fsdecode(s.getsockname())))
    else:
        state = argv[1]
        os.makedirs(state, exist_ok=True)
        os.chmod(state, 0o777)
        for name in ("agent.sock", "agent.stream"):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(os.path.join(state, name))
            os.chmod(os.path.join(state, name), 0o666)
            listeners.append((s, name))
    for s, name in listeners:
        s.listen(64)
        threading.Thread(target=_serve, args=(s, os.path.basename(name), log), daemon=True).start()
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1:])
