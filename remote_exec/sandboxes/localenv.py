"""The environment a ``local://`` agent starts with: a small allowlist, never the whole client's.

The agent outlives the process that started it and serves every later client of its scope, and
its jobs start from its environment. Started with the first client's whole environment, every
later job would see that client's ``JPY_SESSION_NAME``, ``MPLBACKEND``, ``PWD`` and any secret
it held (``FIRST_SECRET=abc remote-exec run -- true``), and a job running as the same user could
read it from ``/proc/<agent>/environ`` besides. So the agent gets only what makes a login-like
environment: :data:`ALLOWED` and the ``LC_*`` locale variables, taken from the client that
starts it. A job's own ``env=`` travels with that job only.

``PYTHONPATH`` is not passed on as it is: when the client has one, the agent gets only the
directory that holds the ``remote_exec`` package it runs (the agent must import it), and so do
its jobs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["ALLOWED", "TO_AGENT_ONLY", "agent_environment"]

ALLOWED = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "XDG_RUNTIME_DIR"})
# The test suite's switch for the agent's guard against blocking its event loop
# (remote_exec.agent.loopguard), which takes it out of the agent's environment: no job sees it.
TO_AGENT_ONLY = frozenset({"REMOTE_EXEC_BLOCKBUSTER"})


# Resolved once, here: agent_environment runs on the event loop (ensure_agent), where a
# resolve() (lstat of each component) would block it.
_PACKAGE_PARENT = os.fspath(Path(__file__).resolve().parents[2])


def agent_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment to start the ``local://`` agent (and its relay processes) with."""
    env = {k: v for k, v in environ.items() if k in ALLOWED or k in TO_AGENT_ONLY or k.startswith("LC_")}
    if environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = _PACKAGE_PARENT
    return env
