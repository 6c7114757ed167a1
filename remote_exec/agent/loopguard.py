"""The test suite's guard against blocking calls on the event loop, in an agent process.

With ``REMOTE_EXEC_BLOCKBUSTER=1`` in its environment (the test suite sets it: tests/conftest.py)
and `blockbuster <https://pypi.org/project/blockbuster/>`_ installed (the ``test`` extra), the
agent makes every blocking call of its own code on its event loop (file or socket I/O, a sleep,
a lock wait) raise ``BlockingError``: one such call stalls every client of the agent. Without
either, nothing happens; the bundled agent never has blockbuster. :data:`DELIBERATE` lists the
places that block on purpose, each with its reason; the tests' host-side guard uses it too.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

__all__ = ["DELIBERATE", "ENV", "allow_deliberate", "guard_from_env"]

ENV = "REMOTE_EXEC_BLOCKBUSTER"

# (file, function): where our code (the agent's, and the host's in tests) blocks the loop on
# purpose, and why.
DELIBERATE: dict[tuple[str, str], str] = {
    ("remote_exec/agent/files/sessions.py", "aclose"): (
        "shutdown removes write sessions' temporary files without a worker thread: the pool may be "
        "stuck on a hung mount, and shutdown must not be"
    ),
    ("remote_exec/agent/jobs/spare.py", "close"): (
        "shutdown and handover remove the ready job dir (six empty files) on the loop: the worker "
        "pool may be stuck on a hung mount; it never waits for a fill in progress, which removes its own"
    ),
    ("remote_exec/sandboxes/k8sapi.py", "_load_in_thread"): (
        "k8s:// loads a kubeconfig with kubernetes_asyncio (file reads, embedded certificates written "
        "to temporary files, an exec plugin) on a loop of its own in a worker thread: no other task waits on it"
    ),
    ("remote_exec/sandboxes/jailbox.py", "launch"): (
        "jail:// forks bubblewrap from the event loop's thread on purpose: its --die-with-parent fires "
        "when the forking thread exits, and a worker thread may exit long before the box"
    ),
    ("remote_exec/sandboxes/local.py", "default_cwd"): (
        "a local:// start reads the client's working directory (os.getcwd) on the loop: the kernel "
        "answers from its dentry cache without I/O, and a thread hop per start would cost more"
    ),
    ("remote_exec/agent/jobs/spare.py", "take"): (
        "a start renames the ready job dir into place: one metadata operation instead of the three "
        "a dir and its two files cost, and a start waits on it before it can exec"
    ),
}


def allow_deliberate(bb: Any) -> None:
    """Let ``bb`` (a ``blockbuster.BlockBuster``, not active yet) pass the :data:`DELIBERATE` calls."""
    for fn in bb.functions.values():
        for file, function in DELIBERATE:
            fn.can_block_in(file, function)


def guard_from_env() -> None:
    """Activate blockbuster for this process's ``remote_exec`` code if :data:`ENV` is ``1`` and it
    is installed; otherwise do nothing. Takes :data:`ENV` out of the environment either way."""
    if os.environ.pop(ENV, None) != "1":  # (out of the environment its jobs start from)
        return
    try:  # by name: PyInstaller must not bundle a test tool into the agent
        module = importlib.import_module("blockbuster")
    except ImportError:
        return
    bb = module.BlockBuster("remote_exec")
    allow_deliberate(bb)
    bb.activate()
