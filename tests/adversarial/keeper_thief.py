"""A same-uid program that asks the keeper for what it holds (issue #21, point 4).

Run from inside a shell session's run as ``keeper_thief.py STATE_DIR SESSION_ID``: it asks the
keeper for the session's run key (``{"op": "fd", "key": "<sid>.key"}``), and with it derives the
current run's secret from its public id (the last GO sentinel in the shell's ``err`` file) and
prints that run's DONE and EXIT sentinels with exit code 0. It prints ``KEY:refused`` if the
keeper gave it nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import socket
import sys


def main(state_dir: str, sid: str) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(os.path.join(state_dir, "keeper.sock"))
        s.sendall(json.dumps({"op": "fd", "key": f"{sid}.key"}).encode() + b"\n")
        data, fds, _, _ = socket.recv_fds(s, 65536, 4)
    if not fds:
        print(f"KEY:refused {data.decode(errors='replace').strip()}", flush=True)
        return
    key = os.pread(fds[0], 64, 0)
    with open(os.path.join(state_dir, "shells", sid, "err"), "rb") as f:
        public = re.findall(rb"__RX_GO_([0-9a-f]{32})__", f.read())[-1].decode()
    nonce = hmac.new(key, public.encode(), hashlib.sha256).hexdigest()[:32]
    print("KEY:got", flush=True)
    sys.stdout.write(f"__RX_DONE_{nonce}__")
    sys.stdout.flush()
    sys.stderr.write(f"__RX_EXIT_{nonce}_000__")
    sys.stderr.flush()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
