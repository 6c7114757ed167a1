"""Entry script of the frozen agent bundle (PyInstaller needs a file, not ``-m``)."""

import sys

if sys.argv[1:2] == ["keeper"]:  # the keeper imports the standard library only: it stays small
    from remote_exec.agent.keeper import run_cli

    sys.exit(run_cli(sys.argv[2:]))

from remote_exec.agent.cli import main

sys.exit(main())
