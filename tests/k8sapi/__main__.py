"""``python -m tests.k8sapi --dir D``: the fast-tier API server (see :mod:`tests.k8sapi`).

Writes its credentials and ``D/kubeconfig``, prints ``ready https://127.0.0.1:PORT`` once it
serves, logs to stderr, and stops cleanly on SIGTERM (its pods' containers removed).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from .server import serve

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.k8sapi", description=__doc__)
    parser.add_argument("--dir", required=True, type=Path, help="where the certificates and kubeconfig go")
    parser.add_argument("--docker-host", default=os.environ.get("DOCKER_HOST", ""), help="default: $DOCKER_HOST")
    parser.add_argument(
        "--stop-on-stdin-eof", action="store_true", help="stop when stdin closes (the parent holding it died)"
    )
    args = parser.parse_args(argv)
    if not args.docker_host:
        parser.error("no --docker-host and no DOCKER_HOST: the fast tier needs the test engine")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    return asyncio.run(serve(args.dir.resolve(), args.docker_host, args.stop_on_stdin_eof))


if __name__ == "__main__":
    sys.exit(main())
