"""The environment a job or shell session starts with: the sandbox's base, live Python, the client's own.

The base is the agent's environment as the transport started it: the image's for docker and
podman, the login environment for ssh, a fixed one for ``jail://``, and for ``local://`` an
allowlist of the starting client's variables (the host side cleans it before the agent starts,
:mod:`remote_exec.sandboxes.localenv`). Nothing a client sends is kept in the agent: a job's
``env=`` reaches that job only, never the base of the next one.

What the agent's own start adds is taken out again: a PyInstaller bundle's bootloader variables
(``_PYI_*``, ``_MEIPASS2``) and its ``LD_LIBRARY_PATH``, which points programs at the bundle's
private libraries (its saved original, ``LD_LIBRARY_PATH_ORIG``, is put back).

Python's stdout on a pipe is block-buffered, so a remote ``python train.py`` printing once a
second would show nothing for minutes. ``PYTHONUNBUFFERED=1`` is therefore in every job's
environment unless the client (or the image) sets it itself; ``env={"PYTHONUNBUFFERED": ""}`` turns it off (an
empty value is "unset" to Python).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

__all__ = ["LIVE_PYTHON", "job_environment"]

LIVE_PYTHON = {"PYTHONUNBUFFERED": "1"}
_BUNDLE_PREFIXES = ("_PYI_", "_MEIPASS")


def _base() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_BUNDLE_PREFIXES)}
    if getattr(sys, "frozen", False):  # the bundle's bootloader set LD_LIBRARY_PATH for itself
        original = env.pop("LD_LIBRARY_PATH_ORIG", None)
        env.pop("LD_LIBRARY_PATH", None)
        if original:
            env["LD_LIBRARY_PATH"] = original
    return env


def job_environment(overrides: Mapping[str, str] | None) -> dict[str, str]:
    """The environment of a new job or shell: the base, ``PYTHONUNBUFFERED=1``, then ``overrides``."""
    env = _base()
    for name, value in LIVE_PYTHON.items():
        env.setdefault(name, value)  # an image that sets it has chosen
    env.update(overrides or {})
    return env
