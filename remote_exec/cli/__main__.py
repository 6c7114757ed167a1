"""``python -m remote_exec.cli``: the ``remote-exec`` command."""

import sys

from .app import main

sys.exit(main())
