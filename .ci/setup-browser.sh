#!/usr/bin/env bash
# The notebook face's browser test: Debian's Chromium, driven by Playwright's Python package
# (never `playwright install`: no browser download is possible), and fonts to render text.
set -euo pipefail
if ! [ -x /usr/bin/chromium ]; then
  apt-get install -y --no-install-recommends chromium
fi
if ! fc-list 2>/dev/null | grep -qi dejavu; then
  apt-get install -y --no-install-recommends fonts-dejavu-core fontconfig
fi
