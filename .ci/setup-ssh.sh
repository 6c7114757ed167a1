#!/usr/bin/env bash
# Backend "ssh": OpenSSH's server for the loopback sshd the tests start themselves
# (tests/sandboxes/sshd.py); asyncssh, the client, comes with the `test` extra.
set -euo pipefail
if ! [ -x /usr/sbin/sshd ]; then
  apt-get install -y --no-install-recommends openssh-server
fi
mkdir -p /run/sshd
