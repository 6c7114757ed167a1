"""``python -m remote_exec.agent``: same as ``remote-exec-agent``."""

import sys

from .cli import main

sys.exit(main())
