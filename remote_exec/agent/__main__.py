"""``python -m remote_exec.agent``: same as ``remote-exec-agent``."""

import sys

if sys.argv[1:2] == ["keeper"]:  # the keeper imports the standard library only: it stays small
    from .keeper import run_cli

    sys.exit(run_cli(sys.argv[2:]))

from .cli import main

sys.exit(main())
