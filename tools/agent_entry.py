"""Entry script of the frozen agent bundle (PyInstaller needs a file, not ``-m``)."""

import sys

from remote_exec.agent.cli import main

sys.exit(main())
