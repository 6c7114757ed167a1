"""`make labextension`: build the JupyterLab extension in labextension/ into labextension/built/.

The build is committed (like the widget bundles of `make widgets`), so a pip install needs no
npm: the wheel ships labextension/built/ as share/jupyter/labextensions/remote-exec/. npm ci
installs the locked @jupyterlab/builder and core-meta (the shared package versions of the
JupyterLab the build targets); jupyter-builder runs them. Then labextension/built.sha256 names a
hash of every input, which tests/jupyter/test_assets.py recomputes: a build older than its
inputs fails `make check`.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "labextension"
INPUTS = ["package.json", "package-lock.json", "install.json", "src/index.js", "style/index.css"]
STAMP = SRC / "built.sha256"


def inputs_digest(src: Path = SRC) -> str:
    """The sha256 over :data:`INPUTS` (name, NUL, bytes, NUL each)."""
    digest = hashlib.sha256()
    for name in INPUTS:
        digest.update(f"{name}\0".encode())
        digest.update((src / name).read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def main() -> None:
    subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=SRC, check=True)
    shutil.rmtree(SRC / "built", ignore_errors=True)  # no stale chunk left beside the new ones
    builder = Path(sys.executable).with_name("jupyter-builder")
    subprocess.run([str(builder), "build", "."], cwd=SRC, check=True)
    STAMP.write_text(inputs_digest() + "\n")
    print(f"labextension/built/ built, inputs sha256:{inputs_digest()}")


if __name__ == "__main__":
    main()
