#!/usr/bin/env bash
# Backend "jail": bubblewrap for the box; nsenter and setpriv (util-linux) enter it.
set -euo pipefail
if ! command -v bwrap >/dev/null; then
  apt-get install -y --no-install-recommends bubblewrap
fi
for tool in nsenter setpriv; do
  command -v "$tool" >/dev/null || apt-get install -y --no-install-recommends util-linux
done
