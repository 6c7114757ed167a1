"""``python -m remote_exec.demo`` (``make demo``): the demo of :mod:`remote_exec.cli.demo`."""

import sys

from .cli.demo import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
