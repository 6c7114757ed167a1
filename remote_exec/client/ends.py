"""How a job ended, in words: what every view, record and CLI line says instead of a bare
"failed · exit -2" (issue #23 point 7).

The agent reports a state (``completed``, ``killed``, ``timed_out``...) and an exit code, which
is the negated signal number for a job a signal ended (as :mod:`subprocess` has it).
"""

from __future__ import annotations

import signal
from typing import Literal

__all__ = ["JobState", "end_words", "job_state"]

JobState = Literal["running", "completed", "failed", "killed", "timed out", "lost", "error"]
"""What a job is, as every face shows it (views, records, the dashboard, the ``--bg`` handle):
``failed`` is a non-zero exit, ``lost`` an end whose exit status nothing could record (the
agent's word), ``error`` a broken connection or spawn (the job's own fate then unknown)."""


def job_state(state: str, exit_code: int | None) -> JobState:
    """The agent's record of a job (``completed``, ``timed_out``...) in the words every face
    shows: the one place "failed" is derived."""
    if state == "running":
        return "running"
    if state == "killed":
        return "killed"
    if state == "timed_out":
        return "timed out"
    if state == "lost":
        return "lost"
    if state == "completed":
        return "completed" if exit_code == 0 else "failed"
    return "error"


_SIGNAL_VERBS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated", signal.SIGKILL: "killed"}


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def end_words(state: str, exit_code: int | None, timeout: float | None = None) -> str:
    """``"exit 3"``, ``"interrupted (SIGINT)"``, ``"killed (SIGTERM)"``, ``"timed out after 1.5 s"``;
    ``""`` while it runs (or for a state with no end to tell).

    :param state: the agent's (``timed_out``) or a view's (``timed out``) word for the state.
    :param timeout: the job's timeout, when known, for "timed out after".
    """
    if state in ("timed_out", "timed out"):
        return f"timed out after {timeout:g} s" if timeout is not None else "timed out"
    if state == "lost":
        return "exit status lost"
    if exit_code is None:
        return "killed" if state == "killed" else ""
    if exit_code >= 0:
        return f"exit {exit_code}"
    sig = -exit_code
    name = _signal_name(sig)
    if state == "killed":  # the user's Kill: the signal that ended it says how hard it had to be
        return f"killed ({name})"
    verb = _SIGNAL_VERBS.get(sig)  # type: ignore[call-overload]
    return f"{verb} ({name})" if verb else f"ended by {name}"
